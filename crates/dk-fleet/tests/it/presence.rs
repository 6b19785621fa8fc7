//! Presence: who holds which device, a goodbye forgotten at once, a member
//! that stops beating forgotten after the expiry.

use std::time::{Duration, Instant};

use crate::harness::{Nats, eventually, member, nats_or_skip, options};

#[tokio::test]
async fn holders_are_seen_and_forgotten() {
    let Some(binary) = nats_or_skip("holders_are_seen_and_forgotten") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let a = member(&nats, "a").await;
    // b forgets a silent member after 2 s, so a goodbye seen well before
    // is told apart from expiry even on a busy machine.
    let b = dk_fleet::Fleet::connect(
        options(&nats, "b").presence(Duration::from_millis(100), Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let c = member(&nats, "c").await;
    a.announce(["lamp", "lock"]).unwrap();
    c.announce(["fan"]).unwrap();
    assert_eq!(a.holder_of("lamp"), Some(a.member().clone()));
    let second = Duration::from_secs(1);
    eventually(second, "b sees a's lamp", || {
        b.holder_of("lamp").as_ref() == Some(a.member())
    })
    .await;
    eventually(second, "b sees c's fan", || {
        b.holder_of("fan").as_ref() == Some(c.member())
    })
    .await;
    assert_eq!(b.holder_of("door"), None);
    assert_eq!(b.members(), vec![a.member().clone(), c.member().clone()]);

    // A change is announced at once, not at the next beat.
    a.announce(["lamp"]).unwrap();
    eventually(second, "b sees the lock gone", || {
        b.holder_of("lock").is_none()
    })
    .await;

    // A clean stop says goodbye: forgotten well before the expiry.
    let closed = Instant::now();
    a.close().await.unwrap();
    eventually(Duration::from_secs(1), "b forgets a", || {
        b.holder_of("lamp").is_none()
    })
    .await;
    let forgotten_after = closed.elapsed();

    // A member that vanishes without a word expires.
    let dropped = Instant::now();
    drop(c);
    eventually(Duration::from_secs(5), "b forgets c", || {
        b.holder_of("fan").is_none()
    })
    .await;
    let expired_after = dropped.elapsed();
    assert!(
        expired_after >= Duration::from_millis(300),
        "{expired_after:?}"
    );
    eprintln!("goodbye seen after {forgotten_after:?}, silence expired after {expired_after:?}");
    assert!(b.members().is_empty());
    b.close().await.unwrap();
}
