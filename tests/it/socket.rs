//! The vessel over real loopback sockets: pairing with the consent answered
//! through the admin API, reconnecting, refusals, calls, timeouts, device
//! errors, a disconnect in the middle of a call, a revoke while an approval
//! is open, and the admin API's guard.

use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_device::samples::Lamp;
use dk_device::{ClientError, ClientOptions, Device, HandlerError};
use dk_vessel::{CallContext, ConsentDecision, Limits};
use serde_json::{Value, json};

use crate::net::{DeviceRun, closed, next, pair_raw, start, temp_dir};

/// Waits until the client has stored its token.
async fn wait_file(path: &std::path::Path) {
    dk_testkit::eventually(&format!("{} written", path.display()), || path.exists()).await;
}

fn options(url: &str, token: &std::path::Path) -> ClientOptions {
    ClientOptions::new(url)
        .v1()
        .token_file(token)
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pair_by_code_through_the_admin_api_then_reconnect_with_the_token() {
    let running = start(Limits::default()).await;
    let dir = temp_dir();
    let token_file = dir.path().join("lamp.token");
    let shown = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&shown);
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(
        lamp.device(),
        options(&running.device_url, &token_file)
            .on_code(move |code| seen.lock().unwrap().push(code.to_owned())),
    );
    let prompt = running.approve_next(&["set_light", "read_light"]).await;
    assert_eq!(prompt["request"]["deviceId"], "desk-lamp");
    running.wait_connected("desk-lamp").await;
    wait_file(&token_file).await;
    // The code the person saw is the code the device showed.
    assert_eq!(
        shown.lock().unwrap().as_slice(),
        [prompt["request"]["code"].as_str().unwrap()]
    );
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert_eq!(token.trim().len(), 64);
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let outcome = running
        .call(
            "device__desk_lamp__set_light",
            json!({"on": true, "brightness": 30}),
            5000,
        )
        .await;
    assert_eq!(
        outcome,
        json!({"ok": true, "result": {"on": true, "brightness": 30}})
    );
    run.stop().await.unwrap();
    running.wait_disconnected("desk-lamp").await;

    // Reconnecting needs no person: the token and the same manifest suffice.
    let again = DeviceRun::spawn(lamp.device(), options(&running.device_url, &token_file));
    running.wait_connected("desk-lamp").await;
    assert_eq!(
        running.admin.get("/v1/pending").await.unwrap().body,
        json!([])
    );
    let outcome = running
        .call("device__desk_lamp__read_light", json!({}), 5000)
        .await;
    assert_eq!(outcome["result"], json!({"on": true, "brightness": 30}));
    again.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_and_a_changed_manifest_are_refused() {
    let running = start(Limits::default()).await;
    let dir = temp_dir();
    let token_file = dir.path().join("lamp.token");
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(lamp.device(), options(&running.device_url, &token_file));
    running.approve_next(&["read_light"]).await;
    running.wait_connected("desk-lamp").await;
    wait_file(&token_file).await;
    run.stop().await.unwrap();
    running.wait_disconnected("desk-lamp").await;

    // The same id with a changed manifest: pair again.
    let mut changed: Value = serde_json::from_str(&lamp.device().manifest().to_json()).unwrap();
    changed["capabilities"][0]["description"] = json!("Read the lamp, and more.");
    let impostor = Device::define(&changed)
        .handler("read_light", |_| async {
            Ok::<Value, HandlerError>(json!({}))
        })
        .handler("set_light", |_| async {
            Ok::<Value, HandlerError>(json!({}))
        })
        .handler("strobe", |_| async { Ok::<Value, HandlerError>(json!({})) })
        .build()
        .unwrap();
    let ended = DeviceRun::spawn(impostor, options(&running.device_url, &token_file))
        .ended()
        .await;
    assert!(
        matches!(ended, Err(ClientError::ManifestChanged)),
        "{ended:?}"
    );

    // A wrong token: refused, and the stale token file is removed.
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "ab".repeat(32)).unwrap();
    let ended = DeviceRun::spawn(lamp.device(), options(&running.device_url, &wrong))
        .ended()
        .await;
    assert!(matches!(ended, Err(ClientError::AuthFailed)), "{ended:?}");
    assert!(!wrong.exists());
    assert!(!running.vessel.links().is_connected("desk-lamp"));
    running.stop().await;
}

/// A device whose `set_light` fails, whose `read_light` never answers, and
/// whose `strobe` asks every time.
fn awkward_lamp() -> Device {
    Device::define(&dk_testkit::lamp())
        .handler("set_light", |_| async {
            Err::<Value, _>(HandlerError::from("bulb is broken"))
        })
        .handler("read_light", |_| std::future::pending())
        .handler("strobe", |_| async {
            Ok::<Value, HandlerError>(json!({"strobed": true}))
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_timeouts_device_errors_and_a_revoke_during_an_approval() {
    let running = start(Limits::default()).await;
    let dir = temp_dir();
    let run = DeviceRun::spawn(
        awkward_lamp(),
        options(&running.device_url, &dir.path().join("t")),
    );
    running
        .approve_next(&["set_light", "read_light", "strobe"])
        .await;
    running.wait_connected("desk-lamp").await;

    let failed = running
        .call("device__desk_lamp__set_light", json!({"on": true}), 5000)
        .await;
    assert_eq!(
        failed,
        json!({"ok": false, "reason": "device error: bulb is broken"})
    );
    let timed_out = running
        .call("device__desk_lamp__read_light", json!({}), 200)
        .await;
    assert_eq!(
        timed_out,
        json!({"ok": false, "reason": "device error: device did not answer within 200ms"})
    );

    // A revoke while the person is being asked: the call is refused after the yes.
    let admin = running.admin.clone();
    let call = tokio::spawn(async move {
        admin
            .post(
                "/v1/tools/call",
                &json!({"tool": "device__desk_lamp__strobe", "input": {}}),
            )
            .await
            .unwrap()
            .body
    });
    let approval = running.next_approval().await;
    assert_eq!(
        approval["request"]["reason"],
        "\"strobe\" on Desk lamp asks every time"
    );
    assert_eq!(
        running
            .admin
            .delete("/v1/devices/desk-lamp/grants/strobe")
            .await
            .unwrap()
            .status,
        204
    );
    let id = approval["id"].as_u64().unwrap();
    assert_eq!(
        running
            .admin
            .post(
                &format!("/v1/pending/{id}/approval"),
                &json!({"approved": true})
            )
            .await
            .unwrap()
            .status,
        204
    );
    assert_eq!(
        call.await.unwrap(),
        json!({"ok": false, "reason": "[8dk-deny] capability \"strobe\" on \"desk-lamp\" was revoked before the call"})
    );
    run.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_fails_the_call_at_once_not_at_its_timeout() {
    let running = start(Limits::default()).await;
    let mut socket = pair_raw(
        &running,
        crate::net::manifest("quiet-lamp"),
        &["read_light"],
    )
    .await;
    running.wait_connected("quiet-lamp").await;
    let admin = running.admin.clone();
    let call = tokio::spawn(async move {
        admin
            .post("/v1/tools/call", &json!({"tool": "device__quiet_lamp__read_light", "input": {}, "timeoutMs": 600_000}))
            .await
            .unwrap()
            .body
    });
    // The device receives the call, then its connection drops.
    let invoke = next(&mut socket).await.unwrap().unwrap();
    assert_eq!(invoke["type"], "device:invoke");
    drop(socket);
    // Bounded only so a regression fails instead of hanging for ten minutes.
    let outcome = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the call failed at once")
        .unwrap();
    assert_eq!(
        outcome,
        json!({"ok": false, "reason": "device error: device disconnected"})
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_a_missing_or_wrong_token_and_a_foreign_origin() {
    let running = start(Limits::default()).await;
    let admin = &running.admin;
    for (headers, status) in [
        (vec![("authorization", "")], 401),
        (vec![("authorization", "Bearer 0000")], 401),
        (vec![("origin", "http://attacker.example")], 403),
    ] {
        let answer = admin
            .send("GET", "/v1/pending", None, &headers)
            .await
            .unwrap();
        assert_eq!(answer.status, status, "{headers:?}");
    }
    assert_eq!(admin.get("/v1/pending").await.unwrap().status, 200);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vessel_tells_a_device_it_was_unpaired() {
    let running = start(Limits::default()).await;
    let mut socket = pair_raw(&running, crate::net::manifest("gone-lamp"), &["read_light"]).await;
    running.wait_connected("gone-lamp").await;
    assert_eq!(
        running
            .admin
            .delete("/v1/devices/gone-lamp")
            .await
            .unwrap()
            .status,
        204
    );
    assert_eq!(
        next(&mut socket).await.unwrap().unwrap(),
        json!({"type": "device:revoked"})
    );
    assert_eq!(
        closed(&mut socket).await,
        Some((4007, "unpaired by the person".to_owned()))
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_with_a_long_reason_stops_the_client() {
    let running = start(Limits::default()).await;
    let dir = tempfile::TempDir::new().unwrap();
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(
        lamp.device(),
        options(&running.device_url, &dir.path().join("lamp.token")),
    );
    // A grant naming capabilities the lamp does not declare: the vessel
    // refuses the pairing (4001) with a reason too long for a close frame.
    let unknown: Vec<String> = (0..10).map(|i| format!("not_declared_{i}")).collect();
    running
        .answer_next_directly(ConsentDecision::approve(unknown.iter().cloned()))
        .await;
    // The client stops; were the close lost, it would try to pair again.
    let asked_again = async {
        loop {
            if !running.vessel.person().pending().is_empty() {
                return;
            }
            // Looks every 5 ms while the client runs (the select below
            // ends with it).
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let ended = tokio::select! {
        ended = run.ended() => ended,
        () = asked_again => panic!("the client paired again instead of stopping"),
    };
    let Err(ClientError::PairingRefused(reason)) = ended else {
        panic!("{ended:?}")
    };
    let full = format!("grant names unknown capability: {}", unknown.join(", "));
    let kept = reason.strip_suffix('…').unwrap();
    assert!(full.starts_with(kept) && reason.len() <= 123, "{reason:?}");
    assert!(!running.vessel.registry().is_paired("desk-lamp"));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sequential_calls_at_full_speed_all_succeed() {
    let running = start(Limits::default()).await;
    let dir = tempfile::TempDir::new().unwrap();
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(
        lamp.device(),
        options(&running.device_url, &dir.path().join("lamp.token")),
    );
    running.approve_next(&["set_light"]).await;
    running.wait_connected("desk-lamp").await;
    // Far faster than the frame rate (200 a second, bursts of 400): the
    // lamp's answers are results to the vessel's own calls, never a flood.
    // No agent session, so no run budget applies.
    for i in 0..10_000 {
        let outcome = running
            .vessel
            .adapter()
            .execute(
                "device__desk_lamp__set_light",
                json!({"on": true, "brightness": i % 101}),
                CallContext::default(),
            )
            .await;
        assert!(outcome.is_ok(), "call {i}: {outcome:?}");
    }
    assert!(running.vessel.links().is_connected("desk-lamp"));
    assert_eq!(lamp.calls().len(), 10_000);
    run.stop().await.unwrap();
    running.stop().await;
}
