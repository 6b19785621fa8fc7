//! The shutdown's grace, decided by the core for every driver: calls that
//! run are answered within it and no new one starts; the close comes when
//! the last is answered or when the grace ends, whichever is first.

use core::time::Duration;

use super::*;

const GRACE: Duration = Duration::from_secs(2);

fn later(ms: u64) -> Instant {
    Instant::from_millis(NOW.as_millis() + ms)
}

/// A paired device running call `c1`.
fn running_one() -> (DeviceCore, Vessel) {
    let (mut core, mut vessel, _) = paired();
    let (out, _) = tell(&mut core, &mut vessel, &invoke("c1", "set_light"));
    assert_eq!(runs(&out), ["c1"]);
    (core, vessel)
}

#[test]
fn a_call_answered_within_the_grace_is_sent_and_then_the_device_closes() {
    let (mut core, mut vessel) = running_one();
    core.shutdown(NOW, GRACE);
    let out = drain(&mut core);
    assert_eq!(close_sent(&out), None, "the call has its grace: {out:?}");
    assert_eq!(core.state(), State::Serving);
    assert_eq!(core.poll_timeout(), Some(later(2_000)));

    // A call that comes meanwhile is refused, never run.
    let (out, frames) = tell(&mut core, &mut vessel, &invoke("c2", "set_light"));
    assert!(runs(&out).is_empty(), "{out:?}");
    assert_eq!(
        result_of(&frames, "c2"),
        (false, Some("device is shutting down".to_string()))
    );

    // The running call's answer goes out, and the close is due at once.
    assert!(core.answer("c1", Ok(r#"{"on":true}"#)));
    let frames = opened(&mut vessel, &drain(&mut core));
    assert_eq!(result_of(&frames, "c1"), (true, None));
    let due = core.poll_timeout().unwrap();
    assert!(due <= later(1), "{due:?}");
    core.handle_timeout(later(1));
    let out = drain(&mut core);
    assert_eq!(
        close_sent(&out),
        Some((1000, "device shutting down".to_string()))
    );
    core.receive(later(2), Received::Close(Some((1000, ""))));
    assert_eq!(ended(&drain(&mut core)), Some(&End::Shutdown));
}

#[test]
fn a_call_outliving_the_grace_is_dropped_by_the_close() {
    let (mut core, _vessel) = running_one();
    core.shutdown(NOW, GRACE);
    core.handle_timeout(later(1_999));
    assert_eq!(close_sent(&drain(&mut core)), None, "not yet");
    core.handle_timeout(later(2_000));
    let out = drain(&mut core);
    assert_eq!(
        close_sent(&out),
        Some((1000, "device shutting down".to_string()))
    );
    assert_eq!(core.running_calls(), 0);
    assert!(!core.answer("c1", Ok("{}")), "the vessel fails it itself");
    assert!(drain(&mut core).is_empty());
}

#[test]
fn with_nothing_running_or_no_grace_the_close_comes_at_once() {
    let (mut core, _vessel, _) = paired();
    core.shutdown(NOW, GRACE);
    assert!(close_sent(&drain(&mut core)).is_some(), "no call runs");

    let (mut core, _vessel) = running_one();
    core.shutdown(NOW, Duration::ZERO);
    assert!(close_sent(&drain(&mut core)).is_some(), "no grace");
    assert!(!core.answer("c1", Ok("{}")));
}

#[test]
fn a_second_shutdown_brings_the_close_nearer_never_further() {
    let (mut core, _vessel) = running_one();
    core.shutdown(NOW, GRACE);
    core.shutdown(NOW, Duration::from_secs(60));
    assert_eq!(core.poll_timeout(), Some(later(2_000)));
    core.shutdown(later(100), Duration::from_millis(400));
    assert_eq!(core.poll_timeout(), Some(later(500)));
    core.shutdown(later(200), Duration::ZERO);
    assert!(close_sent(&drain(&mut core)).is_some());
}

#[test]
fn a_device_still_pairing_closes_at_once() {
    let mut core = device(None);
    let mut vessel = Vessel::new(7);
    shake(&mut core, &mut vessel);
    assert_eq!(core.state(), State::Pairing);
    core.shutdown(NOW, GRACE);
    assert!(close_sent(&drain(&mut core)).is_some());
}
