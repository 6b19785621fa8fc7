//! A hostile device next to a well-behaved one: oversize frames, invalid
//! UTF-8, invalid JSON, deep nesting, unknown and vessel-side frame types,
//! results for unknown calls, floods of events and of such results, a
//! silent connection, and 500
//! unauthenticated connections at once. Through all of it the well-behaved
//! lamp keeps answering, and the vessel keeps running. And every close the
//! vessel sends, with the longest text a device can make it quote, reaches a
//! strict client intact.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll};
use std::time::Duration;

use dk_device::ClientOptions;
use dk_device::samples::Lamp;
use dk_vessel::{ConsentDecision, Limits};
use futures::SinkExt;
use serde_json::json;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::net::{
    DeviceRun, Running, closed, manifest, next, pair_raw, pair_raw_with_token, raw, send, start,
    temp_dir,
};

/// The well-behaved lamp still answers.
async fn lamp_answers(running: &Running, round: usize) {
    let outcome = running
        .call(
            "device__desk_lamp__set_light",
            json!({"on": round.is_multiple_of(2), "brightness": round}),
            5000,
        )
        .await;
    assert_eq!(outcome["ok"], true, "round {round}: {outcome}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_device_never_disturbs_a_good_one() {
    let limits = Limits {
        handshake_timeout: Duration::from_millis(500),
        max_frames_per_second: 100,
        max_frame_bytes: 64 * 1024,
        ..Limits::default()
    };
    let running = start(limits).await;
    let dir = temp_dir();
    let lamp = Lamp::new();
    let good = DeviceRun::spawn(
        lamp.device(),
        ClientOptions::new(&running.device_url)
            .v1()
            .token_file(dir.path().join("lamp.token"))
            .backoff(Duration::from_millis(20), Duration::from_millis(100)),
    );
    running.approve_next(&["set_light"]).await;
    running.wait_connected("desk-lamp").await;
    let mut round = 0;
    lamp_answers(&running, round).await;

    // First frames that are not a handshake.
    let handshakes = [
        ("{not json".to_owned(), 4004),
        (
            format!(
                r#"{{"type":"device:hello","manifest":{}{}}}"#,
                "[".repeat(100),
                "]".repeat(100)
            ),
            4004,
        ),
        (r#"{"type":"device:reboot"}"#.to_owned(), 4004),
        (
            r#"{"type":"device:invoke","callId":"c","capability":"x","input":{}}"#.to_owned(),
            4004,
        ),
        (
            r#"{"type":"device:paired","deviceToken":"x"}"#.to_owned(),
            4004,
        ),
        (
            r#"{"type":"device:result","callId":"c","ok":true}"#.to_owned(),
            4004,
        ),
    ];
    for (text, code) in handshakes {
        let mut socket = raw(&running.device_url).await.unwrap();
        socket.send(Message::text(text.clone())).await.unwrap();
        let close = closed(&mut socket).await;
        assert_eq!(close.map(|c| c.0), Some(code), "{text}");
        round += 1;
        lamp_answers(&running, round).await;
    }

    // An oversize first frame: refused by the frame limit or the socket layer.
    let mut socket = raw(&running.device_url).await.unwrap();
    let big = format!(
        r#"{{"type":"device:hello","manifest":{{"id":"{}"}}}}"#,
        "x".repeat(200 * 1024)
    );
    let _ = socket.send(Message::text(big)).await;
    assert!(!matches!(closed(&mut socket).await, Some((1000, _))));
    round += 1;
    lamp_answers(&running, round).await;

    // Invalid UTF-8 in a text frame: the socket layer refuses it.
    let mut socket = raw(&running.device_url).await.unwrap();
    let frame = Frame::message(vec![b'{', 0xff, 0xfe, b'}'], OpCode::Data(Data::Text), true);
    let _ = socket.send(Message::Frame(frame)).await;
    assert!(!matches!(closed(&mut socket).await, Some((1000, _))));
    round += 1;
    lamp_answers(&running, round).await;

    // A paired hostile device: unknown results, malformed frames, deep nesting.
    let mut hostile = pair_raw(&running, manifest("hostile-one"), &["read_light"]).await;
    for i in 0..3 {
        send(
            &mut hostile,
            json!({"type": "device:result", "callId": format!("nobody-{i}"), "ok": true}),
        )
        .await;
    }
    send(&mut hostile, json!({"type": "device:event", "capability": "read_light", "data": json!([[[[[[[[[[1]]]]]]]]]])})).await;
    let deep = format!(
        r#"{{"type":"device:event","capability":"read_light","data":{}{}}}"#,
        "[".repeat(80),
        "]".repeat(80)
    );
    hostile.send(Message::text(deep)).await.unwrap();
    assert_eq!(
        next(&mut hostile).await.unwrap().unwrap()["error"],
        "frame nests deeper than 64 levels"
    );
    hostile.send(Message::binary(vec![0u8; 16])).await.unwrap();
    assert_eq!(
        next(&mut hostile).await.unwrap().unwrap()["type"],
        "device:error"
    );
    round += 1;
    lamp_answers(&running, round).await;
    assert!(
        running
            .vessel
            .stats()
            .unknown_results
            .load(Ordering::Relaxed)
            >= 3
    );

    // A flood of 1,000 frames: cut off at the rate limit.
    for _ in 0..1000 {
        if hostile
            .send(Message::text(
                json!({"type": "device:event", "capability": "read_light", "data": 1}).to_string(),
            ))
            .await
            .is_err()
        {
            break;
        }
    }
    assert_eq!(closed(&mut hostile).await.map(|c| c.0), Some(4006));
    round += 1;
    lamp_answers(&running, round).await;

    // A flood of results for calls the vessel never made: unasked, so cut
    // off at the rate like any other flood.
    let mut hostile = pair_raw(&running, manifest("hostile-two"), &["read_light"]).await;
    for i in 0..1000 {
        let result = json!({"type": "device:result", "callId": format!("nobody-{i}"), "ok": true});
        if hostile
            .send(Message::text(result.to_string()))
            .await
            .is_err()
        {
            break;
        }
    }
    assert_eq!(closed(&mut hostile).await.map(|c| c.0), Some(4006));
    round += 1;
    lamp_answers(&running, round).await;

    // A silent connection: closed at the handshake deadline.
    let mut silent = raw(&running.device_url).await.unwrap();
    assert_eq!(closed(&mut silent).await.map(|c| c.0), Some(4000));

    // 500 unauthenticated connections at once: most are refused at the door,
    // the rest closed at the deadline; the lamp answers all along.
    let attempts = futures::future::join_all((0..500).map(|_| raw(&running.device_url))).await;
    let mut admitted = Vec::new();
    for attempt in attempts {
        match attempt {
            Ok(socket) => admitted.push(socket),
            // Refused at the cap: busy, come back within a second (not an
            // error to back off from as from a vessel that is down).
            Err(tokio_tungstenite::tungstenite::Error::Http(answer)) => {
                assert_eq!(answer.status().as_u16(), 503);
                let retry_after = answer.headers().get("retry-after");
                assert_eq!(retry_after.and_then(|v| v.to_str().ok()), Some("1"));
            }
            Err(other) => panic!("refused otherwise than with a 503: {other}"),
        }
    }
    // At most 32 hold a place at any moment (the vessel's own count, read
    // where it admits: an upgrade may wait for a place, and the deadline
    // counts from its connect, so how many get in over the run depends on
    // the machine's speed); every other attempt was refused and counted.
    let cap = Limits::default().max_unauthenticated_per_address;
    let stats = running.vessel.stats();
    let peak = stats.peak_unauthenticated.load(Ordering::Relaxed);
    assert!(peak as usize <= cap, "{peak} at once, cap {cap}");
    assert!(
        !admitted.is_empty() && admitted.len() < 500,
        "{}",
        admitted.len()
    );
    let refused = stats.refused_connections.load(Ordering::Relaxed);
    assert!(
        refused as usize >= 500 - admitted.len(),
        "{refused} refused, {} admitted",
        admitted.len()
    );
    round += 1;
    lamp_answers(&running, round).await;
    for mut socket in admitted {
        assert_eq!(closed(&mut socket).await.map(|c| c.0), Some(4000));
    }
    round += 1;
    lamp_answers(&running, round).await;
    assert_eq!(lamp.calls().len(), round + 1);

    good.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_pairing_requests_does_not_lock_the_person_out() {
    let running = start(Limits::default()).await;
    let flooder = std::net::Ipv4Addr::new(127, 0, 0, 2);
    // 40 hellos from another host: a few wait for the person, the rest are refused.
    let mut waiting = Vec::new();
    let mut refused = 0;
    for i in 0..40 {
        let Ok(mut socket) = crate::net::raw_from(&running.device_url, flooder).await else {
            refused += 1;
            continue;
        };
        send(
            &mut socket,
            json!({"type": "device:hello", "manifest": manifest(&format!("flood-{i}"))}),
        )
        .await;
        match next(&mut socket).await {
            Some(Ok(frame)) if frame["type"] == "device:pairing" => waiting.push(socket),
            Some(Err((code, _))) => {
                assert_eq!(code, 4010);
                refused += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        waiting.len() <= Limits::default().max_pending_pairings_per_address,
        "{}",
        waiting.len()
    );
    assert!(refused >= 30);

    // Meanwhile a legitimate device pairs from its own address.
    let dir = temp_dir();
    let lamp = Lamp::new();
    let good = DeviceRun::spawn(
        lamp.device(),
        ClientOptions::new(&running.device_url)
            .v1()
            .token_file(dir.path().join("lamp.token")),
    );
    let prompt = dk_testkit::eventually_async("the lamp's pairing request", || async {
        let pending = running.admin.get("/v1/pending").await.unwrap().body;
        pending
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["request"]["deviceId"] == "desk-lamp")
            .cloned()
    })
    .await;
    let id = prompt["id"].as_u64().unwrap();
    running
        .admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": ["set_light"]}),
        )
        .await
        .unwrap();
    running.wait_connected("desk-lamp").await;
    lamp_answers(&running, 0).await;

    // The flood stops: its requests leave the person's list.
    drop(waiting);
    dk_testkit::eventually("the flood's requests gone from the person's list", || {
        running.vessel.person().pending().is_empty()
    })
    .await;
    good.stop().await.unwrap();
    running.stop().await;
}

/// Every close the vessel sends reaches a strict client (tungstenite refuses
/// a close payload over 125 bytes) with its code, and a reason of at most
/// 123 bytes: the whole text when it fits, else the longest prefix that
/// does, cut at a character boundary and ended with `…`.
#[track_caller]
fn check_close(close: Option<(u16, String)>, code: u16, full: &str) {
    let Some((got, reason)) = close else {
        panic!("no close frame reached the client (1006) where {code} {full:?} was sent")
    };
    assert_eq!(got, code, "{reason:?}");
    assert!(reason.len() <= 123, "{} bytes: {reason:?}", reason.len());
    if full.len() <= 123 {
        assert_eq!(reason, full);
    } else {
        let kept = reason
            .strip_suffix('…')
            .unwrap_or_else(|| panic!("{reason:?}"));
        assert!(
            full.starts_with(kept),
            "{reason:?} is not a prefix of {full:?}"
        );
        // The longest prefix that fits: the next character would not.
        let next = full[kept.len()..].chars().next().unwrap();
        assert!(kept.len() + next.len_utf8() > 120, "{reason:?}");
    }
}

/// A manifest of the lamp's shape whose validation message quotes `id` or a
/// param `key` the device chose.
fn bad_manifest(id: &str, key: &str) -> serde_json::Value {
    json!({"id": id, "name": "Lamp", "kind": "lamp", "version": "1",
           "capabilities": [{"name": "c".repeat(30), "kind": "actuator", "description": "Set.",
                             "params": {key: {"type": "string"}}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_close_reaches_a_strict_client_intact() {
    let max_frame_bytes = 64 * 1024;
    let limits = Limits {
        handshake_timeout: Duration::from_secs(1),
        max_frames_per_second: 100,
        max_frame_bytes,
        pairings_per_minute_per_address: 100,
        ..Limits::default()
    };
    let running = start(limits).await;
    let url = running.device_url.clone();

    // 4001 for invalid manifests quoting the longest text a device can put
    // in them: 30 UTF-16 units of a param key (bidi controls, tag characters,
    // 2-, 3- and 4-byte characters in turn, so the cut falls inside each
    // width), and a 24-unit id of 3-byte characters.
    let rlo = "\u{202E}".repeat(30);
    let tags = "\u{E0041}".repeat(15);
    let mixed = "é\u{E0041}\u{202E}a".repeat(6);
    let shifted = format!("ab{}", "\u{E0041}".repeat(14));
    let manifests = [
        bad_manifest("desk-lamp", &rlo),
        bad_manifest("desk-lamp", &tags),
        bad_manifest("desk-lamp", &mixed),
        bad_manifest("desk-lamp", &shifted),
        bad_manifest(&"漢".repeat(24), "on"),
        json!({"id": "Bad"}),
    ];
    for manifest in manifests {
        let full = format!(
            "invalid manifest: {}",
            dk_proto::validate_manifest(&manifest).unwrap_err()
        );
        let mut socket = raw(&url).await.unwrap();
        send(
            &mut socket,
            json!({"type": "device:hello", "manifest": manifest}),
        )
        .await;
        check_close(closed(&mut socket).await, 4001, &full);
    }

    // 4001 for a grant of capabilities the device does not declare (the
    // person's text, as long as the person likes), and for a refusal.
    let unknown: Vec<String> = (0..8)
        .map(|i| format!("ünknown_{i}_{}", "ß".repeat(8)))
        .collect();
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": manifest("granted-too-much")}),
    )
    .await;
    assert_eq!(
        next(&mut socket).await.unwrap().unwrap()["type"],
        "device:pairing"
    );
    running
        .answer_next_directly(ConsentDecision::approve(unknown.iter().cloned()))
        .await;
    let full = format!("grant names unknown capability: {}", unknown.join(", "));
    assert!(full.len() > 125);
    check_close(closed(&mut socket).await, 4001, &full);
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": manifest("refused")}),
    )
    .await;
    next(&mut socket).await;
    running
        .answer_next_directly(ConsentDecision::refuse())
        .await;
    check_close(
        closed(&mut socket).await,
        4001,
        "the person did not approve pairing",
    );

    // 4000, 4004 and 1009 on the first frame.
    let mut socket = raw(&url).await.unwrap();
    check_close(
        closed(&mut socket).await,
        4000,
        "send device:hello or device:auth first",
    );
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:event", "capability": "x"}),
    )
    .await;
    check_close(
        closed(&mut socket).await,
        4004,
        "expected device:hello or device:auth",
    );
    let mut socket = raw(&url).await.unwrap();
    socket.send(Message::binary(vec![1u8])).await.unwrap();
    check_close(closed(&mut socket).await, 4004, "frames are JSON text");
    let mut socket = raw(&url).await.unwrap();
    // One byte over the limit reaches the frame parser (more is refused by
    // the socket layer).
    let frame = |fill: usize| {
        format!(
            r#"{{"type":"device:hello","manifest":"{}"}}"#,
            "x".repeat(fill)
        )
    };
    let big = frame(max_frame_bytes + 1 - frame(0).len());
    socket.send(Message::text(big)).await.unwrap();
    check_close(
        closed(&mut socket).await,
        1009,
        &format!("frames are at most {max_frame_bytes} bytes"),
    );

    // 4010: the same device again while its request waits.
    let mut waiting = raw(&url).await.unwrap();
    send(
        &mut waiting,
        json!({"type": "device:hello", "manifest": manifest("waiting")}),
    )
    .await;
    next(&mut waiting).await;
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": manifest("waiting")}),
    )
    .await;
    check_close(
        closed(&mut socket).await,
        4010,
        "a pairing request for this device is already waiting for the person",
    );
    drop(waiting);

    // 4011: a streaming kind the vessel does not enable.
    let voice: serde_json::Value = serde_json::from_str(include_str!(
        "../../fixtures/manifests/valid/kitchen-voice.json"
    ))
    .unwrap();
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": voice}),
    )
    .await;
    check_close(
        closed(&mut socket).await,
        4011,
        "ERR_PRISM_DEVICE_DISABLED: voice device is disabled by default",
    );

    // 4002, 4003, 4008, 4007 with a paired device's token.
    let (mut first, token) =
        pair_raw_with_token(&running, manifest("closer"), &["read_light"]).await;
    running.wait_connected("closer").await;
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:auth", "deviceId": "closer", "token": "ab".repeat(32)}),
    )
    .await;
    check_close(closed(&mut socket).await, 4002, "authentication failed");
    let mut socket = raw(&url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:auth", "deviceId": "closer", "token": token, "manifest": manifest("closer-two")}),
    )
    .await;
    check_close(
        closed(&mut socket).await,
        4003,
        "manifest changed since pairing: pair again",
    );
    let mut second = raw(&url).await.unwrap();
    send(
        &mut second,
        json!({"type": "device:auth", "deviceId": "closer", "token": token}),
    )
    .await;
    check_close(
        closed(&mut first).await,
        4008,
        "replaced by a newer connection",
    );
    running.wait_connected("closer").await;
    running.vessel.registry().unpair("closer").unwrap();
    check_close(closed(&mut second).await, 4007, "unpaired by the person");

    // 4005 and 4006 on a paired device.
    let mut socket = pair_raw(&running, manifest("malformed"), &[]).await;
    for _ in 0..4 {
        socket.send(Message::text("{not json")).await.unwrap();
    }
    check_close(closed(&mut socket).await, 4005, "too many malformed frames");
    let mut socket = pair_raw(&running, manifest("flooder"), &[]).await;
    for _ in 0..1000 {
        let event = json!({"type": "device:event", "capability": "read_light", "data": 1});
        if socket.send(Message::text(event.to_string())).await.is_err() {
            break;
        }
    }
    check_close(
        closed(&mut socket).await,
        4006,
        "more than 100 frames per second",
    );

    // 1001: the vessel stops with a device connected.
    let mut socket = pair_raw(&running, manifest("last"), &[]).await;
    running.wait_connected("last").await;
    let stopping = tokio::spawn(running.stop());
    check_close(closed(&mut socket).await, 1001, "vessel shutting down");
    stopping.await.unwrap();

    // 4009: a device whose answers to pings never arrive.
    let running = start(Limits {
        ping_interval: Duration::from_millis(50),
        ..Limits::default()
    })
    .await;
    let authority = running.device_url.trim_start_matches("ws://");
    let address = authority.trim_end_matches("/device");
    let mute = Arc::new(AtomicBool::new(false));
    let stream = Muted {
        stream: tokio::net::TcpStream::connect(address).await.unwrap(),
        mute: Arc::clone(&mute),
    };
    let (mut socket, _) = tokio_tungstenite::client_async(running.device_url.as_str(), stream)
        .await
        .unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": manifest("silent")}),
    )
    .await;
    next(&mut socket).await;
    running
        .answer_next_directly(ConsentDecision::approve(["read_light"]))
        .await;
    assert_eq!(
        next(&mut socket).await.unwrap().unwrap()["type"],
        "device:paired"
    );
    mute.store(true, Ordering::Relaxed);
    check_close(closed(&mut socket).await, 4009, "no answer to pings");
    running.stop().await;
}

/// A TCP stream whose writes are dropped once `mute` is set: a device that
/// still reads what the vessel sends, but whose pongs never arrive.
struct Muted {
    stream: tokio::net::TcpStream,
    mute: Arc<AtomicBool>,
}

impl AsyncRead for Muted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Muted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.mute.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.mute.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.mute.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}
