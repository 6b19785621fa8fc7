//! The hostile vessels of the device core's own tests, met through the C
//! ABI as firmware meets them: a 403 forged before the channel, a frame
//! over the device's limit, frames that do not hold, a handshake that
//! stalls, and the wait between connections spread by the core's jitter.
//! dk-device's client meets the same vessels in the workspace's
//! `tests/it/dk2_client.rs`.

use super::*;

fn stops_on(device: *mut dk_device, status: u16) -> bool {
    // SAFETY: a live device.
    call(|| unsafe { dk_device_stops_on_http_status(device, status) })
}

fn free(device: *mut dk_device) {
    // SAFETY: a live device, not used again.
    call(|| unsafe { dk_device_free(device) });
}

fn closed(outs: &[Out]) -> Option<u16> {
    outs.iter().find_map(|o| match o {
        Out::Close(code, _) => Some(*code),
        _ => None,
    })
}

fn ended(outs: &[Out]) -> Option<(dk_end, String)> {
    outs.iter().find_map(|o| match o {
        Out::Ended(end, why) => Some((*end, why.clone())),
        _ => None,
    })
}

/// A lamp paired with `vessel`, made again from what it kept with
/// `max_frame_bytes` and connected again by key: serving.
fn reconnected(seed: &mut u8, vessel: &mut Vessel, max_frame_bytes: usize) -> *mut dk_device {
    let (paired, kept) = pair(seed, vessel);
    free(paired);
    let kept_platform = platform(seed);
    let mut options = options(Some(&kept));
    options.max_frame_bytes = max_frame_bytes;
    let device = made(&kept_platform, LAMP.as_bytes(), &options).unwrap();
    vessel.restart();
    let (outs, frames) = vessel.shake(device);
    assert!(outs.contains(&Out::Connected), "{outs:?}");
    assert!(frames[0].contains("device:auth"), "{frames:?}");
    // SAFETY: a live device.
    assert_eq!(
        unsafe { dk_device_state(device) },
        dk_state::DK_STATE_SERVING
    );
    device
}

#[test]
fn a_403_before_the_channel_stops_a_lamp_not_paired_and_never_one_paired_over_dk2() {
    let mut seed = 3u8;
    let fresh_platform = platform(&mut seed);
    let fresh = made(&fresh_platform, LAMP.as_bytes(), &options(None)).unwrap();
    assert!(stops_on(fresh, 403));
    assert!(!stops_on(fresh, 503) && !stops_on(fresh, 502));
    free(fresh);

    // Paired, it hears its vessel's refusals inside the channel: a 403
    // before it may be forged by anyone on the path.
    let mut vessel = Vessel::new(42);
    let (paired, kept) = pair(&mut seed, &mut vessel);
    assert!(!stops_on(paired, 403));
    free(paired);
    let platform = platform(&mut seed);
    let again = made(&platform, LAMP.as_bytes(), &options(Some(&kept))).unwrap();
    assert!(!stops_on(again, 403));
    free(again);
    assert!(!stops_on(ptr::null_mut(), 403));
}

#[test]
fn a_frame_over_the_lamps_limit_closes_4012_and_the_lamp_connects_again() {
    let mut seed = 5u8;
    let mut vessel = Vessel::new(42);
    let device = reconnected(&mut seed, &mut vessel, 4096);
    let input = "x".repeat(8192);
    let (outs, _) = vessel.tell(
        device,
        &format!(
            r#"{{"type":"device:invoke","callId":"big","capability":"read_light","input":{{"x":"{input}"}}}}"#
        ),
    );
    assert_eq!(closed(&outs), Some(4012), "{outs:?}");
    assert!(!outs.iter().any(|o| matches!(o, Out::Invoke { .. })));
    // SAFETY: a live device and a reason of that length.
    let status = call(|| unsafe { dk_device_receive_close(device, 9, 4012, ptr::null(), 0) });
    assert_eq!(status, dk_status::DK_OK);
    let outs = drain(device);
    assert_eq!(
        ended(&outs).map(|(end, _)| end),
        Some(dk_end::DK_END_RETRY),
        "{outs:?}"
    );
    free(device);
}

#[test]
fn frames_that_do_not_hold_are_set_aside_and_the_next_call_runs() {
    let mut seed = 7u8;
    let mut vessel = Vessel::new(42);
    let device = reconnected(&mut seed, &mut vessel, 0);
    let deep = format!(
        r#"{{"type":"device:invoke","callId":"d","capability":"read_light","input":{{"a":{}1{}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let hostile = [
        r#"{"type":"device:invoke","#,
        "[1,2,3]",
        r#"{"type":"device:nonsense"}"#,
        r#"{"type":"device:invoke","callId":"a","capability":"read_light","input":[1]}"#,
        r#"{"type":"device:invoke","callId":"","capability":"read_light","input":{}}"#,
        r#"{"type":"device:streaming","kind":"voice","maxChunkBytes":0,"maxConcurrentSessions":1}"#,
        r#"{"type":"device:stream-dropped","stream":"a","seq":1,"accepted":"no","bytes":2,"marker":"m"}"#,
        r#"{"type":"device:closing","code":"soon"}"#,
        &deep,
    ];
    for frame in hostile {
        let (outs, frames) = vessel.tell(device, frame);
        assert_eq!(closed(&outs), None, "{frame}: {outs:?}");
        assert!(
            !outs
                .iter()
                .any(|o| matches!(o, Out::Invoke { .. } | Out::Ended(..))),
            "{frame}: {outs:?}"
        );
        assert!(frames.is_empty(), "{frame}: {frames:?}");
    }
    let (outs, _) = vessel.tell(
        device,
        r#"{"type":"device:invoke","callId":"c1","capability":"read_light","input":{}}"#,
    );
    assert!(
        matches!(outs.as_slice(), [Out::Invoke { id, .. }] if id == "c1"),
        "{outs:?}"
    );
    free(device);
}

#[test]
fn a_handshake_that_stalls_ends_at_its_deadline_and_the_lamp_connects_again() {
    let mut seed = 9u8;
    let platform = platform(&mut seed);
    let device = made(&platform, LAMP.as_bytes(), &options(None)).unwrap();
    // SAFETY: a live device.
    assert_eq!(
        call(|| unsafe { dk_device_connect(device, 1000) }),
        dk_status::DK_OK
    );
    drain(device);
    let mut at = 0u64;
    // SAFETY: a live device and a writable u64.
    assert!(call(|| unsafe { dk_device_next_timeout(device, &mut at) }));
    assert_eq!(at, 11_000, "the default handshake timeout is 10 s");
    // SAFETY: a live device.
    call(|| unsafe { dk_device_handle_timeout(device, at - 1) });
    assert_eq!(drain(device), vec![]);
    // SAFETY: a live device.
    call(|| unsafe { dk_device_handle_timeout(device, at) });
    let outs = drain(device);
    let (end, why) = ended(&outs).unwrap();
    assert_eq!(end, dk_end::DK_END_RETRY);
    assert!(why.contains("no dk/2 handshake within 10 s"), "{why}");
    // SAFETY: a live device.
    assert_eq!(
        call(|| unsafe { dk_device_connect(device, at + 500) }),
        dk_status::DK_OK
    );
    assert!(drain(device).iter().any(|o| matches!(o, Out::Binary(_))));
    free(device);
}

#[test]
fn the_wait_between_connections_is_spread_under_a_doubling_capped_ceiling() {
    // What the C lamp waits after each failed attempt: the core's full
    // jitter over the platform's random numbers.
    let (initial, max) = (500u32, 8_000u32);
    let mut random = 0x9e37_79b9_7f4a_7c15u64;
    for attempt in 0..8u32 {
        let ceiling = (initial << attempt).min(max);
        let waits: Vec<u32> = (0..64)
            .map(|_| {
                random = random
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                dk_next_backoff_ms(initial, max, attempt, random)
            })
            .collect();
        assert!(waits.iter().all(|w| *w <= ceiling), "{attempt}: {waits:?}");
        // Spread, not one step for the whole fleet.
        let (low, high) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
        assert!(high - low > ceiling / 2, "{attempt}: {waits:?}");
    }
    assert!(dk_next_backoff_ms(initial, max, 40, u64::MAX) <= max);
}
