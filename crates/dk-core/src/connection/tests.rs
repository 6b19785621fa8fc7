//! Tests of a device connection driven through channels: handshake, pairing, limits, close codes.

use std::time::Duration;

use dk_policy::PolicySet;
use dk_testkit::lamp;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dk_proto::{CloseCode, CloseFrame};
use futures::StreamExt;
use tokio::time::Instant;

use super::serve::close;
use super::*;
use crate::adapter::{CallContext, ToolOutcome};
use crate::registry::ConsentDecision;
use crate::vessel::Limits;
use crate::vessel::Vessel;

/// The device's end of a connection served by the vessel.
struct Peer {
    to_vessel: UnboundedSender<WireMessage>,
    from_vessel: UnboundedReceiver<WireMessage>,
    task: JoinHandle<ConnectionOutcome>,
}

fn connect(vessel: &Arc<Vessel>) -> Peer {
    let (to_vessel, incoming) = unbounded();
    let (outgoing, from_vessel) = unbounded();
    let permit = vessel.admit(None).unwrap();
    let vessel = Arc::clone(vessel);
    let task =
        tokio::spawn(async move { serve_connection(&vessel, permit, incoming, outgoing).await });
    Peer {
        to_vessel,
        from_vessel,
        task,
    }
}

impl Peer {
    fn send(&self, frame: Value) {
        self.to_vessel
            .unbounded_send(WireMessage::Text(frame.to_string()))
            .unwrap();
    }

    fn send_raw(&self, message: WireMessage) {
        let _ = self.to_vessel.unbounded_send(message);
    }

    /// The next frame from the vessel, pings skipped; `None` once closed.
    async fn next(&mut self) -> Option<Result<Value, CloseFrame>> {
        loop {
            match self.from_vessel.next().await? {
                WireMessage::Text(text) => return Some(Ok(serde_json::from_str(&text).unwrap())),
                WireMessage::Close(frame) => return Some(Err(frame.unwrap())),
                _ => {}
            }
        }
    }

    async fn frame(&mut self) -> Value {
        match self.next().await {
            Some(Ok(frame)) => frame,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    async fn closed(&mut self) -> CloseFrame {
        loop {
            match self.next().await {
                Some(Ok(_)) => {}
                Some(Err(frame)) => return frame,
                None => panic!("ended without a close frame"),
            }
        }
    }
}

fn vessel(limits: Limits) -> Arc<Vessel> {
    Vessel::new(PolicySet::empty(), limits)
}

async fn answer_consent(vessel: &Vessel, code: &str, decision: ConsentDecision) {
    let prompt = loop {
        if let Some(p) = vessel.person().pending().into_iter().next() {
            break p;
        }
        tokio::task::yield_now().await;
    };
    let crate::person::Prompt::Consent(request) = &prompt.prompt else {
        panic!("not a consent")
    };
    assert_eq!(request.code, code);
    vessel.person().answer_consent(prompt.id, decision).unwrap();
}

/// Pairs the lamp over a new connection and returns the peer and the token.
async fn paired_lamp(vessel: &Arc<Vessel>, grant: &[&str]) -> (Peer, String) {
    let mut peer = connect(vessel);
    peer.send(json!({"type": "device:hello", "manifest": lamp()}));
    let pairing = peer.frame().await;
    assert_eq!(pairing["type"], json!("device:pairing"));
    let code = pairing["code"].as_str().unwrap().to_owned();
    answer_consent(
        vessel,
        &code,
        ConsentDecision::approve(grant.iter().copied()),
    )
    .await;
    let paired = peer.frame().await;
    assert_eq!(paired["type"], json!("device:paired"));
    let token = paired["deviceToken"].as_str().unwrap().to_owned();
    (peer, token)
}

async fn connected(vessel: &Vessel) {
    while !vessel.links().is_connected("desk-lamp") {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn pair_then_call_over_the_connection() {
    let vessel = vessel(Limits::default());
    let (mut peer, token) = paired_lamp(&vessel, &["set_light"]).await;
    assert_eq!(token.len(), 64);
    connected(&vessel).await;
    let call = vessel.adapter().execute(
        "device__desk_lamp__set_light",
        json!({"on": true}),
        CallContext::default(),
    );
    let device = async {
        let invoke = peer.frame().await;
        assert_eq!(invoke["type"], json!("device:invoke"));
        assert_eq!(invoke["input"], json!({"on": true}));
        peer.send(json!({"type": "device:result", "callId": invoke["callId"], "ok": true, "result": {"on": true, "brightness": 0}}));
        // A second answer for the same call is ignored and counted.
        peer.send(json!({"type": "device:result", "callId": invoke["callId"], "ok": true}));
    };
    let (outcome, ()) = tokio::join!(call, device);
    assert_eq!(
        outcome.result_value(),
        Some(json!({"on": true, "brightness": 0}))
    );
    drop(peer.to_vessel);
    let outcome = peer.task.await.unwrap();
    assert_eq!(outcome.device_id.as_deref(), Some("desk-lamp"));
    assert_eq!(outcome.closed_with, None);
    assert_eq!(vessel.stats().unknown_results.load(Ordering::Relaxed), 1);
    assert!(!vessel.links().is_connected("desk-lamp"));
}

#[tokio::test]
async fn refused_pairing_and_a_device_that_leaves_while_the_person_decides() {
    let vessel = vessel(Limits::default());
    let mut peer = connect(&vessel);
    peer.send(json!({"type": "device:hello", "manifest": lamp()}));
    let code = peer.frame().await["code"].as_str().unwrap().to_owned();
    answer_consent(&vessel, &code, ConsentDecision::refuse()).await;
    assert_eq!(
        peer.closed().await,
        close(
            CloseCode::PairingRefused,
            "the person did not approve pairing"
        )
    );

    let mut peer = connect(&vessel);
    peer.send(json!({"type": "device:hello", "manifest": {"id": "Bad"}}));
    let closed = peer.closed().await;
    assert_eq!(closed.code, CloseCode::PairingRefused.code());
    assert!(closed.reason.starts_with("invalid manifest: "), "{closed}");

    let mut peer = connect(&vessel);
    peer.send(json!({"type": "device:hello", "manifest": lamp()}));
    peer.frame().await;
    assert_eq!(vessel.person().pending().len(), 1);
    drop(peer.to_vessel);
    peer.task.await.unwrap();
    assert!(
        vessel.person().pending().is_empty(),
        "the question is withdrawn"
    );
    assert!(!vessel.registry().is_paired("desk-lamp"));
}

#[tokio::test]
async fn reconnecting_with_the_token() {
    let vessel = vessel(Limits::default());
    let (peer, token) = paired_lamp(&vessel, &["read_light"]).await;
    drop(peer);

    let again = connect(&vessel);
    again.send(
        json!({"type": "device:auth", "deviceId": "desk-lamp", "token": token, "manifest": lamp()}),
    );
    connected(&vessel).await;

    for (frame, expected) in [
        (
            json!({"type": "device:auth", "deviceId": "desk-lamp", "token": "00".repeat(32)}),
            close(CloseCode::AuthFailed, "authentication failed"),
        ),
        (
            json!({"type": "device:auth", "deviceId": "other", "token": token}),
            close(CloseCode::AuthFailed, "authentication failed"),
        ),
        (
            json!({"type": "device:auth", "deviceId": "desk-lamp", "token": token, "manifest": {"id": "desk-lamp"}}),
            close(
                CloseCode::ManifestChanged,
                "manifest changed since pairing: pair again",
            ),
        ),
        (
            json!({"type": "device:result", "callId": "c", "ok": true}),
            close(
                CloseCode::BadHandshake,
                "expected device:hello or device:auth",
            ),
        ),
        (
            json!({"type": "device:invoke"}),
            close(
                CloseCode::BadHandshake,
                "expected device:hello or device:auth",
            ),
        ),
    ] {
        let mut peer = connect(&vessel);
        peer.send(frame.clone());
        assert_eq!(peer.closed().await, expected, "{frame}");
    }
    // The first good connection is untouched by the failures.
    assert!(vessel.links().is_connected("desk-lamp"));
    drop(again.to_vessel);
    assert_eq!(
        again.task.await.unwrap().device_id.as_deref(),
        Some("desk-lamp")
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_at_the_deadline() {
    let vessel = vessel(Limits::default());
    let mut peer = connect(&vessel);
    let started = Instant::now();
    assert_eq!(peer.closed().await.code, CloseCode::HandshakeTimeout.code());
    assert!(started.elapsed() >= Duration::from_secs(10));
    assert_eq!(vessel.connection_count(), 0, "the permit is returned");
}

#[tokio::test(start_paused = true)]
async fn a_device_that_stops_answering_pings_is_closed() {
    let vessel = vessel(Limits::default());
    let (mut peer, _) = paired_lamp(&vessel, &[]).await;
    // The peer never answers anything: two ping intervals later it is gone.
    assert_eq!(
        peer.closed().await,
        close(CloseCode::Dead, "no answer to pings")
    );
    assert!(!vessel.links().is_connected("desk-lamp"));
}

#[tokio::test]
async fn malformed_frames_get_an_error_then_a_close() {
    let vessel = vessel(Limits::default());
    let (mut peer, _) = paired_lamp(&vessel, &[]).await;
    peer.send_raw(WireMessage::Text("{not json".into()));
    assert_eq!(peer.frame().await["type"], json!("device:error"));
    peer.send_raw(WireMessage::Binary(vec![1, 2, 3]));
    assert_eq!(peer.frame().await["error"], json!("frames are JSON text"));
    peer.send(json!({"type": "device:pairing", "code": "1"}));
    assert_eq!(
        peer.frame().await["error"],
        json!("frame type \"device:pairing\" is not sent by this side")
    );
    peer.send(json!({"type": "device:hello", "manifest": lamp()}));
    assert_eq!(peer.frame().await["type"], json!("device:error"));
    assert_eq!(
        peer.closed().await,
        close(CloseCode::Malformed, "too many malformed frames")
    );
    assert_eq!(peer.task.await.unwrap().malformed, 4);
}

#[tokio::test]
async fn oversize_frames_close_the_connection() {
    let limits = Limits {
        max_frame_bytes: 1024,
        ..Limits::default()
    };
    let vessel = vessel(limits);
    let (mut peer, _) = paired_lamp(&vessel, &[]).await;
    let big = format!(
        r#"{{"type":"device:event","capability":"read_light","data":"{}"}}"#,
        "x".repeat(2000)
    );
    peer.send_raw(WireMessage::Text(big));
    assert_eq!(
        peer.closed().await,
        close(CloseCode::TooLarge, "frames are at most 1024 bytes")
    );
}

fn rate_limits() -> Limits {
    Limits {
        max_frames_per_second: 50,
        ..Limits::default()
    }
}

/// A flood of `message` from a paired device is cut at the rate.
async fn check_flood_is_cut(message: WireMessage) {
    let vessel = vessel(rate_limits());
    let (mut peer, _) = paired_lamp(&vessel, &[]).await;
    for _ in 0..500 {
        peer.send_raw(message.clone());
    }
    assert_eq!(
        peer.closed().await,
        close(CloseCode::Rate, "more than 50 frames per second"),
        "{message:?}"
    );
}

#[tokio::test]
async fn a_flood_is_cut_off() {
    let text = |frame: Value| WireMessage::Text(frame.to_string());
    for message in [
        text(json!({"type": "device:event", "capability": "read_light", "data": 1})),
        // Results for calls the vessel never made are not answers.
        text(json!({"type": "device:result", "callId": "nobody", "ok": true})),
        WireMessage::Ping(b"hi".to_vec()),
    ] {
        check_flood_is_cut(message).await;
    }
}

#[tokio::test]
async fn a_flood_while_the_person_decides_is_cut_off() {
    let vessel = vessel(rate_limits());
    for message in [
        WireMessage::Text(json!({"type": "device:event", "capability": "x"}).to_string()),
        WireMessage::Ping(Vec::new()),
    ] {
        let mut peer = connect(&vessel);
        peer.send(json!({"type": "device:hello", "manifest": lamp()}));
        assert_eq!(peer.frame().await["type"], json!("device:pairing"));
        for _ in 0..500 {
            peer.send_raw(message.clone());
        }
        assert_eq!(
            peer.closed().await,
            close(CloseCode::Rate, "more than 50 frames per second"),
            "{message:?}"
        );
        peer.task.await.unwrap();
        assert!(vessel.person().pending().is_empty(), "withdrawn");
    }
}

#[tokio::test]
async fn answers_to_the_vessels_calls_are_not_charged_to_the_rate() {
    // Five frames a second (bursts of ten): charged, the answers to a
    // thousand calls would be cut after ten.
    let limits = Limits {
        max_frames_per_second: 5,
        ..Limits::default()
    };
    let vessel = vessel(limits);
    let (mut peer, _) = paired_lamp(&vessel, &["read_light"]).await;
    connected(&vessel).await;
    let calls = async {
        for i in 0..1000 {
            let outcome = vessel
                .adapter()
                .execute(
                    "device__desk_lamp__read_light",
                    json!({}),
                    CallContext::default(),
                )
                .await;
            assert_eq!(outcome.result_value(), Some(json!(i)), "call {i}");
        }
    };
    let device = async {
        for i in 0..1000 {
            let invoke = peer.frame().await;
            peer.send(json!({"type": "device:result", "callId": invoke["callId"], "ok": true, "result": i}));
        }
    };
    tokio::join!(calls, device);
    assert!(vessel.links().is_connected("desk-lamp"));
    assert_eq!(vessel.stats().unknown_results.load(Ordering::Relaxed), 0);
    // Unasked frames still are: a handful of events goes over.
    for _ in 0..20 {
        peer.send(json!({"type": "device:event", "capability": "read_light", "data": 1}));
    }
    assert_eq!(
        peer.closed().await,
        close(CloseCode::Rate, "more than 5 frames per second")
    );
}

#[tokio::test]
async fn revocations_and_unpairing_reach_the_device() {
    let vessel = vessel(Limits::default());
    let (mut peer, _) = paired_lamp(&vessel, &["read_light", "strobe"]).await;
    connected(&vessel).await;
    vessel.registry().revoke("desk-lamp", "strobe").unwrap();
    assert_eq!(
        peer.frame().await,
        json!({"type": "device:revoked", "capability": "strobe"})
    );
    vessel.registry().unpair("desk-lamp").unwrap();
    assert_eq!(peer.frame().await, json!({"type": "device:revoked"}));
    assert_eq!(
        peer.closed().await,
        close(CloseCode::Unpaired, "unpaired by the person")
    );
}

#[tokio::test]
async fn a_newer_connection_replaces_the_older() {
    let vessel = vessel(Limits::default());
    let (mut first, token) = paired_lamp(&vessel, &[]).await;
    connected(&vessel).await;
    let second = connect(&vessel);
    second.send(json!({"type": "device:auth", "deviceId": "desk-lamp", "token": token}));
    assert_eq!(
        first.closed().await,
        close(CloseCode::Replaced, "replaced by a newer connection")
    );
    // The newer one stays connected.
    tokio::task::yield_now().await;
    assert!(vessel.links().is_connected("desk-lamp"));
    drop(second);
}

#[tokio::test]
async fn a_disconnect_fails_the_call_in_flight_at_once() {
    let vessel = vessel(Limits::default());
    let (mut peer, _) = paired_lamp(&vessel, &["read_light"]).await;
    connected(&vessel).await;
    let ctx = CallContext {
        timeout: Some(Duration::from_secs(3600)),
        ..CallContext::default()
    };
    let call = vessel
        .adapter()
        .execute("device__desk_lamp__read_light", json!({}), ctx);
    let device = async {
        peer.frame().await;
        drop(peer.to_vessel);
    };
    let (outcome, ()) = tokio::join!(call, device);
    assert!(
        matches!(&outcome, ToolOutcome::Refused { reason } if reason == "device error: device disconnected"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn events_reach_subscribers() {
    let vessel = vessel(Limits::default());
    let mut events = vessel.subscribe_events();
    let (mut peer, _) = paired_lamp(&vessel, &[]).await;
    connected(&vessel).await;
    peer.send(json!({"type": "device:event", "capability": "read_light", "data": {"on": true}}));
    let event = events.recv().await.unwrap();
    assert_eq!(
        (event.device_id.as_str(), event.capability.as_str()),
        ("desk-lamp", "read_light")
    );
    assert_eq!(event.data.unwrap().get(), r#"{"on":true}"#);
    peer.send(json!({"type": "device:event", "capability": "fly", "data": 1}));
    assert_eq!(
        peer.frame().await["error"],
        json!("event for undeclared capability \"fly\"")
    );
}

#[tokio::test]
async fn admission_limits() {
    let limits = Limits {
        max_connections: 3,
        max_unauthenticated_per_address: 2,
        ..Limits::default()
    };
    let vessel = vessel(limits);
    let a = vessel.admit(None).unwrap();
    let mut b = vessel.admit(None).unwrap();
    assert_eq!(
        vessel.admit(None).unwrap_err().to_string(),
        "too many unauthenticated connections from this address"
    );
    b.authenticated();
    let c = vessel.admit(None).unwrap();
    assert_eq!(
        vessel
            .admit("10.0.0.1".parse().ok())
            .unwrap_err()
            .to_string(),
        "the vessel has too many connections"
    );
    drop((a, b, c));
    assert_eq!(vessel.connection_count(), 0);
    assert!(vessel.admit(None).is_ok());

    let limits = Limits {
        max_connections_per_address: 2,
        ..Limits::default()
    };
    let vessel = Vessel::new(PolicySet::empty(), limits);
    let mut a = vessel.admit(None).unwrap();
    let mut b = vessel.admit(None).unwrap();
    a.authenticated();
    b.authenticated();
    assert_eq!(
        vessel.admit(None).unwrap_err().to_string(),
        "too many connections from this address"
    );
    assert!(
        vessel.admit("10.0.0.2".parse().ok()).is_ok(),
        "another address is fine"
    );
    drop(a);
    assert!(vessel.admit(None).is_ok());
    vessel.shut_down();
    assert_eq!(
        vessel.admit(None).unwrap_err().to_string(),
        "the vessel is shutting down"
    );
}

fn manifest_for(id: &str) -> Value {
    let mut m = lamp();
    m["id"] = json!(id);
    m
}

#[tokio::test(start_paused = true)]
async fn pairing_limits_and_the_way_back() {
    let limits = Limits {
        max_pending_pairings: 3,
        max_pending_pairings_per_address: 2,
        pairings_per_minute_per_address: 4,
        ..Limits::default()
    };
    let vessel = vessel(limits);
    let hello = |peer: &Peer, id: &str| {
        peer.send(json!({"type": "device:hello", "manifest": manifest_for(id)}))
    };

    let mut first = connect(&vessel);
    hello(&first, "lamp-one");
    first.frame().await;
    // The same device again while its request waits.
    let mut again = connect(&vessel);
    hello(&again, "lamp-one");
    assert_eq!(
        again.closed().await,
        close(
            CloseCode::PairingLimit,
            "a pairing request for this device is already waiting for the person"
        )
    );
    let mut second = connect(&vessel);
    hello(&second, "lamp-two");
    second.frame().await;
    // Two waiting from this address is the cap.
    let mut third = connect(&vessel);
    hello(&third, "lamp-three");
    assert_eq!(
        third.closed().await,
        close(
            CloseCode::PairingLimit,
            "too many pairing requests from this address are waiting for the person"
        )
    );
    // Four attempts a minute: the fifth is refused.
    let mut fifth = connect(&vessel);
    hello(&fifth, "lamp-five");
    assert_eq!(
        fifth.closed().await,
        close(
            CloseCode::PairingLimit,
            "too many pairing attempts from this address: wait a minute"
        )
    );

    // The flood stops: the waiting requests go (their devices leave) and the
    // budget refills; a legitimate device pairs.
    drop(first.to_vessel);
    drop(second.to_vessel);
    first.task.await.unwrap();
    second.task.await.unwrap();
    assert!(vessel.person().pending().is_empty());
    tokio::time::advance(Duration::from_secs(60)).await;
    let mut legit = connect(&vessel);
    hello(&legit, "desk-lamp");
    let code = legit.frame().await["code"].as_str().unwrap().to_owned();
    answer_consent(&vessel, &code, ConsentDecision::approve(["read_light"])).await;
    assert_eq!(legit.frame().await["type"], json!("device:paired"));
}

#[tokio::test]
async fn invalid_manifests_take_no_waiting_place() {
    let limits = Limits {
        max_pending_pairings: 1,
        ..Limits::default()
    };
    let vessel = vessel(limits);
    for _ in 0..3 {
        let mut peer = connect(&vessel);
        peer.send(json!({"type": "device:hello", "manifest": {"id": "Bad"}}));
        assert_eq!(peer.closed().await.code, CloseCode::PairingRefused.code());
    }
    let (_peer, _) = paired_lamp(&vessel, &[]).await;
}

#[tokio::test]
async fn tokens_and_secrets_stay_out_of_the_audit_log() {
    let vessel = vessel(Limits::default());
    vessel.add_secret("s3cret-admin-token");
    let (_peer, token) = paired_lamp(&vessel, &["set_light"]).await;
    connected(&vessel).await;
    // A call whose input carries both (as an unknown key and value, so it is
    // refused at check 4 and still recorded).
    let input = json!({"on": true, "note": format!("token {token} and s3cret-admin-token"), token.clone(): 1,
        "glued": format!("00ff{token}beef"), "long": format!("{}{token}", "a".repeat(300))});
    let outcome = vessel
        .adapter()
        .execute(
            "device__desk_lamp__set_light",
            input,
            CallContext::default(),
        )
        .await;
    assert!(!outcome.is_ok());
    vessel.flush_audit().unwrap();
    let entries = vessel.registry().store().read_audit(0, 100).unwrap();
    let text =
        serde_json::to_string(&entries.iter().map(|e| &e.entry).collect::<Vec<_>>()).unwrap();
    assert!(entries.iter().any(|e| e.kind == "decision"), "{text}");
    assert!(!text.contains(&token), "{text}");
    assert!(!text.contains("s3cret-admin-token"), "{text}");
    assert!(text.contains("[REDACTED]"), "{text}");
}

#[tokio::test]
async fn a_request_in_a_devices_name_from_elsewhere_does_not_lock_it_out() {
    let vessel = vessel(Limits::default());
    let at = |n: u8| Some(std::net::IpAddr::from([192, 0, 2, n]));
    // Someone asks to pair in the front door's name; the door itself, from
    // its own address, can still ask, and the person tells them apart by
    // their codes.
    let impostor = vessel.begin_pairing("front-door", at(1)).unwrap();
    let door = vessel.begin_pairing("front-door", at(2)).unwrap();
    // One waiting request per device id and address.
    assert_eq!(
        vessel
            .begin_pairing("front-door", at(1))
            .unwrap_err()
            .to_string(),
        "a pairing request for this device is already waiting for the person"
    );
    // At most four per device id in all.
    let more: Vec<_> = (3..5)
        .map(|n| vessel.begin_pairing("front-door", at(n)).unwrap())
        .collect();
    assert_eq!(
        vessel
            .begin_pairing("front-door", at(9))
            .unwrap_err()
            .to_string(),
        "too many pairing requests for this device are waiting for the person"
    );
    // A request that ends gives its place back.
    drop(impostor);
    let again = vessel.begin_pairing("front-door", at(9)).unwrap();
    drop((door, more, again));
    assert!(vessel.begin_pairing("front-door", at(1)).is_ok());
}
