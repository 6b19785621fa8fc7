//! A hostile device next to a well-behaved one: oversize frames, invalid
//! UTF-8, invalid JSON, deep nesting, unknown and vessel-side frame types,
//! results for unknown calls, a flood, a silent connection, and 500
//! unauthenticated connections at once. Through all of it the well-behaved
//! lamp keeps answering, and the vessel keeps running.

use std::time::Duration;

use dk_device::ClientOptions;
use dk_device::samples::Lamp;
use dk_vessel::Limits;
use futures::SinkExt;
use serde_json::json;
use std::sync::atomic::Ordering;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::net::{
    DeviceRun, Running, closed, manifest, next, pair_raw, raw, send, start, temp_dir,
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

    // A silent connection: closed at the handshake deadline.
    let mut silent = raw(&running.device_url).await.unwrap();
    assert_eq!(closed(&mut silent).await.map(|c| c.0), Some(4000));

    // 500 unauthenticated connections at once: most are refused at the door,
    // the rest closed at the deadline; the lamp answers all along.
    let started = std::time::Instant::now();
    let attempts = futures::future::join_all((0..500).map(|_| raw(&running.device_url))).await;
    let admitted: Vec<_> = attempts.into_iter().filter_map(Result::ok).collect();
    // At most 32 wait at any moment; admitted ones are closed at the 500 ms
    // deadline, freeing their places, so a slow machine admits 32 per window.
    let windows = 1 + usize::try_from(started.elapsed().as_millis() / 500).unwrap();
    let bound = Limits::default().max_unauthenticated_per_address * windows;
    assert!(
        admitted.len() <= bound,
        "{} admitted, bound {bound}",
        admitted.len()
    );
    let refused = running
        .vessel
        .stats()
        .refused_connections
        .load(Ordering::Relaxed);
    assert!(
        refused as usize >= 500 - bound.min(500),
        "{refused} refused, bound {bound}"
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
        ClientOptions::new(&running.device_url).token_file(dir.path().join("lamp.token")),
    );
    let prompt = loop {
        let pending = running.admin.get("/v1/pending").await.unwrap().body;
        if let Some(p) = pending
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["request"]["deviceId"] == "desk-lamp")
        {
            break p.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
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
    for _ in 0..500 {
        if running.vessel.person().pending().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(running.vessel.person().pending().is_empty());
    good.stop().await.unwrap();
    running.stop().await;
}
