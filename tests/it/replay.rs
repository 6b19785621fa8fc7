//! Never replay: a call pending when its device drops fails at once, and once
//! the device is back nothing of it is sent again; a late result for it is
//! ignored.

use std::sync::atomic::Ordering;

use dk_vessel::Limits;
use serde_json::json;

use crate::net::{manifest, next, raw, send, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_pending_at_a_disconnect_fails_and_is_never_sent_again() {
    let running = start(Limits::default()).await;
    let lamp = manifest("replay-lamp");
    let mut socket = raw(&running.device_url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": lamp}),
    )
    .await;
    assert_eq!(
        next(&mut socket).await.unwrap().unwrap()["type"],
        "device:pairing"
    );
    running
        .answer_next_directly(dk_core::registry::ConsentDecision::approve(["read_light"]))
        .await;
    let paired = next(&mut socket).await.unwrap().unwrap();
    let token = paired["deviceToken"].as_str().unwrap().to_owned();
    running.wait_connected("replay-lamp").await;

    // A call reaches the device, then the connection drops: the call fails.
    let admin = running.admin.clone();
    let pending = tokio::spawn(async move {
        admin
            .post(
                "/v1/tools/call",
                &json!({"tool": "device__replay_lamp__read_light", "input": {}, "timeoutMs": 600_000}),
            )
            .await
            .unwrap()
            .body
    });
    let first = next(&mut socket).await.unwrap().unwrap();
    assert_eq!(first["type"], "device:invoke");
    let first_id = first["callId"].as_str().unwrap().to_owned();
    drop(socket);
    assert_eq!(
        pending.await.unwrap(),
        json!({"ok": false, "reason": "device error: device disconnected"})
    );
    running.wait_disconnected("replay-lamp").await;

    // The device comes back. The first frame it gets is the next call's, not
    // the old one again; the old call's late result is ignored.
    let mut socket = raw(&running.device_url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:auth", "deviceId": "replay-lamp", "token": token, "manifest": lamp}),
    )
    .await;
    running.wait_connected("replay-lamp").await;
    let admin = running.admin.clone();
    let second_call = tokio::spawn(async move {
        admin
            .post(
                "/v1/tools/call",
                &json!({"tool": "device__replay_lamp__read_light", "input": {}, "timeoutMs": 600_000}),
            )
            .await
            .unwrap()
            .body
    });
    let second = next(&mut socket).await.unwrap().unwrap();
    assert_eq!(second["type"], "device:invoke");
    let second_id = second["callId"].as_str().unwrap().to_owned();
    assert_ne!(second_id, first_id, "the old call was sent again");
    let unknown_before = running
        .vessel
        .stats()
        .unknown_results
        .load(Ordering::SeqCst);
    send(
        &mut socket,
        json!({"type": "device:result", "callId": first_id, "ok": true, "result": {"late": true}}),
    )
    .await;
    send(
        &mut socket,
        json!({"type": "device:result", "callId": second_id, "ok": true, "result": {"on": true}}),
    )
    .await;
    assert_eq!(
        second_call.await.unwrap(),
        json!({"ok": true, "result": {"on": true}})
    );
    // Frames of one connection are handled in order: the late result came
    // first and settled nothing.
    assert_eq!(
        running
            .vessel
            .stats()
            .unknown_results
            .load(Ordering::SeqCst),
        unknown_before + 1
    );
    running.stop().await;
}
