//! dk/2 against a real vessel over real sockets, with a device written here
//! from dk-channel's pieces so each test can make it misbehave: pairing by
//! computed codes, reconnects by key, a relay in the middle, a recording
//! proxy, and records that do not hold. Through the hostile ones a good
//! device keeps answering.

use std::sync::Arc;
use std::time::Duration;

use dk_channel::{
    FrameKind, Initiator, OpenedFrame, Opener, PublicKey, RecordLimits, Sealer, StaticKey,
};
use dk_testkit::eventually;
use dk_vessel::Limits;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::net::{Running, Socket, manifest, start, start_at};

/// A WebSocket connection that asked for `dk.2`; the answer's subprotocol.
pub async fn connect_offering(
    url: &str,
    offer: Option<&str>,
) -> Result<(Socket, Option<String>), String> {
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(offer) = offer {
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(offer).unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, response)) => {
            let chosen = response
                .headers()
                .get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Ok((socket, chosen))
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(format!(
            "{} {}",
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// A device's end of a dk/2 channel.
pub struct Dk2 {
    pub socket: Socket,
    pub sealer: Sealer,
    pub opener: Opener,
    pub handshake_hash: [u8; 32],
    pub vessel_key: PublicKey,
}

/// Runs the handshake as `key`'s device.
pub async fn connect(url: &str, key: &StaticKey) -> Dk2 {
    let (mut socket, chosen) = connect_offering(url, Some("dk.2")).await.unwrap();
    assert_eq!(chosen.as_deref(), Some("dk.2"));
    let mut initiator = Initiator::new(key).unwrap();
    socket
        .send(Message::binary(initiator.first_message().unwrap()))
        .await
        .unwrap();
    let second = next_binary(&mut socket).await.expect("message 2");
    let vessel_key = initiator.read_second(&second).unwrap();
    let (third, established) = initiator.third_message().unwrap();
    socket.send(Message::binary(third)).await.unwrap();
    let handshake_hash = established.handshake_hash;
    let (sealer, opener) = established.split(RecordLimits {
        max_text: 1 << 20,
        max_binary: 1 << 20,
    });
    Dk2 {
        socket,
        sealer,
        opener,
        handshake_hash,
        vessel_key,
    }
}

pub async fn next_binary(socket: &mut Socket) -> Option<Vec<u8>> {
    loop {
        match socket.next().await? {
            Ok(Message::Binary(bytes)) => return Some(bytes.to_vec()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

impl Dk2 {
    /// Sends a JSON frame as its records.
    pub async fn send(&mut self, frame: Value) {
        self.send_bytes(FrameKind::Text, frame.to_string().as_bytes())
            .await;
    }

    pub async fn send_bytes(&mut self, kind: FrameKind, bytes: &[u8]) {
        for record in self.sealer.seal(kind, bytes).unwrap() {
            if self.socket.send(Message::binary(record)).await.is_err() {
                return;
            }
        }
    }

    /// The next frame as JSON, or the close: (code, reason, the code and
    /// reason `device:closing` gave inside the channel before it, if any).
    pub async fn next(&mut self) -> Result<Value, Closed> {
        let mut closing = None;
        loop {
            match self.socket.next().await {
                Some(Ok(Message::Binary(bytes))) => match self.opener.open(&bytes) {
                    Ok(Some(OpenedFrame::Text(text))) => {
                        let frame: Value = serde_json::from_str(&text).unwrap();
                        if frame["type"] == "device:closing" {
                            closing = Some((
                                frame["code"].as_u64().unwrap() as u16,
                                frame["reason"].as_str().unwrap().to_owned(),
                            ));
                            continue;
                        }
                        return Ok(frame);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("the vessel's record did not open: {e}"),
                },
                Some(Ok(Message::Close(frame))) => {
                    return Err(Closed {
                        code: frame.as_ref().map_or(1005, |f| u16::from(f.code)),
                        reason: frame
                            .map(|f| f.reason.as_str().to_owned())
                            .unwrap_or_default(),
                        inside: closing,
                    });
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => {
                    return Err(Closed {
                        code: 1006,
                        reason: String::new(),
                        inside: closing,
                    });
                }
            }
        }
    }

    /// Reads until the close.
    pub async fn closed(&mut self) -> Closed {
        loop {
            if let Err(closed) = self.next().await {
                return closed;
            }
        }
    }
}

/// How a dk/2 connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    pub code: u16,
    pub reason: String,
    /// What `device:closing` said inside the channel first.
    pub inside: Option<(u16, String)>,
}

fn hex(bytes: &[u8; 32]) -> String {
    dk_channel::to_hex32(bytes)
}

/// The device's half of the pairing exchange; returns the code it shows.
pub async fn exchange(device: &mut Dk2, nd: [u8; 32]) -> Result<String, String> {
    let commit = device.next().await.map_err(|c| format!("{c:?}"))?;
    assert_eq!(commit["type"], "device:pair-commit", "{commit}");
    let commitment = dk_channel::from_hex32(commit["commitment"].as_str().unwrap()).unwrap();
    device
        .send(json!({"type": "device:pair-nonce", "nonce": hex(&nd)}))
        .await;
    let reveal = device.next().await.map_err(|c| format!("{c:?}"))?;
    assert_eq!(reveal["type"], "device:pair-reveal", "{reveal}");
    let nv = dk_channel::from_hex32(reveal["nonce"].as_str().unwrap()).unwrap();
    if !dk_channel::commitment_holds(&commitment, &nv, &device.handshake_hash) {
        return Err("the commitment does not hold".to_owned());
    }
    Ok(dk_channel::pairing_code(&device.handshake_hash, &nd, &nv))
}

/// Pairs `key`'s device with `manifest` over dk/2: the person approves only
/// when the prompt's code is the one the device shows.
pub async fn pair(running: &Running, key: &StaticKey, manifest: Value, grant: &[&str]) -> Dk2 {
    let mut device = connect(&running.device_url, key).await;
    device
        .send(json!({"type": "device:hello", "manifest": manifest}))
        .await;
    let code = exchange(&mut device, dk_channel::random_nonce().unwrap())
        .await
        .unwrap();
    let prompt = running.next_consent().await;
    assert_eq!(prompt["request"]["code"], code.as_str(), "{prompt}");
    assert_eq!(prompt["request"]["channel"], "dk/2", "{prompt}");
    let id = prompt["id"].as_u64().unwrap();
    let answer = running
        .admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": grant}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204);
    let paired = device.next().await.unwrap();
    assert_eq!(paired, json!({"type": "device:paired"}));
    device
}

/// Answers calls on `device` until it closes: `read_light` gives
/// `{"on": true}`.
pub fn answer_calls(mut device: Dk2) -> tokio::task::JoinHandle<Closed> {
    tokio::spawn(async move {
        loop {
            match device.next().await {
                Ok(frame) if frame["type"] == "device:invoke" => {
                    let call_id = frame["callId"].clone();
                    device
                        .send(
                            json!({"type": "device:result", "callId": call_id, "ok": true,
                                     "result": {"on": true, "input": frame["input"]}}),
                        )
                        .await;
                }
                Ok(_) => {}
                Err(closed) => return closed,
            }
        }
    })
}

/// The vessel's limits for these tests: the default handshake deadline
/// (10 s), not a short one. No test here waits for the deadline, and on a
/// loaded machine a short one closed a reconnecting device before its
/// auth arrived, which left the test waiting for a replacement that never
/// came.
fn vessel_limits() -> Limits {
    Limits::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_pairs_by_comparing_computed_codes_and_reconnects_by_its_key() {
    let running = start(vessel_limits()).await;
    let key = StaticKey::generate().unwrap();
    let device = pair(&running, &key, manifest("lamp-2"), &["read_light"]).await;
    assert_eq!(
        device.vessel_key,
        running.vessel.identity().unwrap().public(),
        "the vessel's own key"
    );
    let answering = answer_calls(device);
    running.wait_connected("lamp-2").await;
    let listed = running.admin.get("/v1/devices").await.unwrap().body;
    assert_eq!(listed[0]["channel"], "dk/2", "{listed}");
    let outcome = running
        .call("device__lamp_2__read_light", json!({}), 5000)
        .await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    assert_eq!(outcome["result"]["on"], true, "{outcome}");

    // Reconnecting: the same key and manifest, no token.
    let mut again = connect(&running.device_url, &key).await;
    again
        .send(json!({"type": "device:auth", "deviceId": "lamp-2", "manifest": manifest("lamp-2")}))
        .await;
    let replaced = tokio::time::timeout(Duration::from_secs(30), answering)
        .await
        .expect("the first connection was never replaced")
        .unwrap();
    assert_eq!(replaced.code, 4008, "{replaced:?}");
    assert_eq!(replaced.inside, Some((4008, replaced.reason.clone())));
    let answering = answer_calls(again);
    running.wait_connected("lamp-2").await;
    let outcome = running
        .call("device__lamp_2__read_light", json!({}), 5000)
        .await;
    assert_eq!(outcome["ok"], true, "{outcome}");

    // The audit log says which channel.
    let audit = running
        .vessel
        .registry()
        .store()
        .read_audit(0, 100)
        .unwrap();
    let paired = audit.iter().find(|e| e.kind == "paired").unwrap();
    let entry = &paired.entry;
    assert_eq!(entry["channel"], "dk/2", "{entry}");
    assert_eq!(entry["deviceKey"], key.public().to_hex(), "{entry}");
    running.stop().await;
    let _ = answering.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_a_v1_token_or_a_changed_manifest_cannot_reconnect_as_the_device() {
    let running = start(vessel_limits()).await;
    let key = StaticKey::generate().unwrap();
    let device = pair(&running, &key, manifest("lamp-3"), &["read_light"]).await;
    drop(device);

    // Another key, the right id and manifest.
    let thief = StaticKey::generate().unwrap();
    let mut other = connect(&running.device_url, &thief).await;
    other
        .send(
            json!({"type": "device:auth", "deviceId": "lamp-3", "manifest": manifest("lamp-3"),
                     "token": "0".repeat(64)}),
        )
        .await;
    let closed = other.closed().await;
    assert_eq!(closed.code, 4002, "{closed:?}");
    assert_eq!(
        closed.inside,
        Some((4002, "authentication failed".to_owned()))
    );

    // The right key, another manifest: pair again.
    let mut changed = manifest("lamp-3");
    changed["name"] = json!("Another name");
    let mut same = connect(&running.device_url, &key).await;
    same.send(json!({"type": "device:auth", "deviceId": "lamp-3", "manifest": changed}))
        .await;
    assert_eq!(same.closed().await.code, 4003);

    // A v1 device with any token: the pairing has none.
    let mut plain = crate::net::raw(&running.device_url).await.unwrap();
    crate::net::send(
        &mut plain,
        json!({"type": "device:auth", "deviceId": "lamp-3", "token": "a".repeat(64)}),
    )
    .await;
    assert_eq!(crate::net::closed(&mut plain).await.unwrap().0, 4002);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_frames_out_of_order_end_the_pairing() {
    let running = start(vessel_limits()).await;
    // A nonce before the hello.
    let mut early = connect(&running.device_url, &StaticKey::generate().unwrap()).await;
    early
        .send(json!({"type": "device:pair-nonce", "nonce": "ab".repeat(32)}))
        .await;
    assert_eq!(early.closed().await.code, 4001);

    // A second nonce while the person is asked.
    let mut twice = connect(&running.device_url, &StaticKey::generate().unwrap()).await;
    twice
        .send(json!({"type": "device:hello", "manifest": manifest("twice")}))
        .await;
    exchange(&mut twice, [7; 32]).await.unwrap();
    running.next_consent().await;
    twice
        .send(json!({"type": "device:pair-nonce", "nonce": "cd".repeat(32)}))
        .await;
    let closed = twice.closed().await;
    assert_eq!(closed.code, 4001, "{closed:?}");
    assert!(closed.reason.contains("second"), "{closed:?}");

    // Something else where the nonce belongs; a nonce that is not 64 hex digits.
    for wrong in [
        json!({"type": "device:event", "capability": "read_light", "data": 1}),
        json!({"type": "device:pair-nonce", "nonce": "AB".repeat(32)}),
    ] {
        let mut device = connect(&running.device_url, &StaticKey::generate().unwrap()).await;
        device
            .send(json!({"type": "device:hello", "manifest": manifest("wrong")}))
            .await;
        assert_eq!(device.next().await.unwrap()["type"], "device:pair-commit");
        device.send(wrong).await;
        assert_eq!(device.closed().await.code, 4001);
    }
    // No prompt is left waiting. The only one asked was the second
    // nonce's pairing, withdrawn when its connection closed; the others
    // closed before a prompt could be asked, so once it is gone none can
    // come.
    eventually("the second nonce's prompt withdrawn", || {
        running.vessel.person().pending().is_empty()
    })
    .await;
    assert!(running.vessel.person().pending().is_empty());
    running.stop().await;
}

/// A relay in the middle that knows the protocol: to the device it is the
/// vessel, to the vessel the device. Each side's code comes from its own
/// channel, so the person sees one code and the device another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::result_large_err)] // tungstenite's callback returns its own response type
async fn a_relay_that_speaks_dk2_on_both_sides_shows_two_different_codes() {
    // Each attempt costs the relay a prompt the person sees; the vessel's
    // own limit on pairing attempts per address is lifted to try many.
    let running = start(Limits {
        pairings_per_minute_per_address: 1000,
        ..vessel_limits()
    })
    .await;
    let attempts = 40;
    let mut matched = 0;
    for attempt in 0..attempts {
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_url = format!("ws://{}/device", relay.local_addr().unwrap());
        let vessel_url = running.device_url.clone();
        let relay_key = StaticKey::generate().unwrap();
        let device_key = StaticKey::generate().unwrap();
        // The relay: a responder towards the device, an initiator towards the
        // vessel, nonces passed on as the protocol lets it.
        let relay_task = tokio::spawn(async move {
            let (tcp, _) = relay.accept().await.unwrap();
            let mut inner = tokio_tungstenite::accept_hdr_async(
                tcp,
                |_: &tokio_tungstenite::tungstenite::handshake::server::Request,
                 mut response: tokio_tungstenite::tungstenite::handshake::server::Response| {
                    response
                        .headers_mut()
                        .insert("sec-websocket-protocol", HeaderValue::from_static("dk.2"));
                    Ok(response)
                },
            )
            .await
            .unwrap();
            let mut responder = dk_channel::Responder::new(&relay_key).unwrap();
            let first = match inner.next().await.unwrap().unwrap() {
                Message::Binary(b) => b.to_vec(),
                other => panic!("{other:?}"),
            };
            responder.read_first(&first).unwrap();
            inner
                .send(Message::binary(responder.second_message().unwrap()))
                .await
                .unwrap();
            let third = match inner.next().await.unwrap().unwrap() {
                Message::Binary(b) => b.to_vec(),
                other => panic!("{other:?}"),
            };
            let toward_device = responder.read_third(&third).unwrap();
            let h_device = toward_device.handshake_hash;
            let (mut seal_d, mut open_d) = toward_device.split(RecordLimits {
                max_text: 1 << 20,
                max_binary: 0,
            });
            let read_d = |open: &mut Opener, bytes: &[u8]| -> Value {
                match open.open(bytes).unwrap() {
                    Some(OpenedFrame::Text(t)) => serde_json::from_str(&t).unwrap(),
                    other => panic!("{other:?}"),
                }
            };
            let hello = match inner.next().await.unwrap().unwrap() {
                Message::Binary(b) => read_d(&mut open_d, &b),
                other => panic!("{other:?}"),
            };
            // Toward the vessel, as the device.
            let mut outer = connect(&vessel_url, &StaticKey::generate().unwrap()).await;
            outer.send(hello).await;
            let commit = outer.next().await.unwrap();
            // The relay must commit to the device before it can know the
            // vessel's nonce: it commits to one of its own.
            let nr = dk_channel::random_nonce().unwrap();
            let commitment = dk_channel::commitment(&nr, &h_device);
            assert_eq!(commit["type"], "device:pair-commit");
            let frame = json!({"type": "device:pair-commit", "commitment": hex(&commitment)});
            for r in seal_d
                .seal(FrameKind::Text, frame.to_string().as_bytes())
                .unwrap()
            {
                inner.send(Message::binary(r)).await.unwrap();
            }
            let nonce = match inner.next().await.unwrap().unwrap() {
                Message::Binary(b) => read_d(&mut open_d, &b),
                other => panic!("{other:?}"),
            };
            // Passes the device's nonce on (its best move: it cannot wait for
            // the vessel's reveal, which comes only after a nonce).
            outer.send(nonce).await;
            let reveal = outer.next().await.unwrap();
            assert_eq!(reveal["type"], "device:pair-reveal");
            let frame = json!({"type": "device:pair-reveal", "nonce": hex(&nr)});
            for r in seal_d
                .seal(FrameKind::Text, frame.to_string().as_bytes())
                .unwrap()
            {
                inner.send(Message::binary(r)).await.unwrap();
            }
            // Keeps both open until the person decides.
            let vessel_side = outer.next().await;
            drop(inner);
            vessel_side
        });
        let mut device = connect(&relay_url, &device_key).await;
        assert_ne!(
            device.vessel_key,
            running.vessel.identity().unwrap().public(),
            "the relay cannot show the vessel's key"
        );
        device
            .send(json!({"type": "device:hello", "manifest": manifest("relayed")}))
            .await;
        let shown = exchange(&mut device, dk_channel::random_nonce().unwrap())
            .await
            .unwrap();
        let prompt = running.next_consent().await;
        let asked = prompt["request"]["code"].as_str().unwrap().to_owned();
        let id = prompt["id"].as_u64().unwrap();
        // The person approves only when the codes match.
        let approve = asked == shown;
        if approve {
            matched += 1;
        }
        let answer = running
            .admin
            .post(
                &format!("/v1/pending/{id}/consent"),
                &json!({"approved": approve, "grant": []}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 204, "attempt {attempt}");
        let vessel_side = relay_task.await.unwrap();
        assert!(
            vessel_side.is_err(),
            "attempt {attempt}: the relay was paired: {vessel_side:?}"
        );
    }
    assert_eq!(
        matched, 0,
        "codes matched in {matched} of {attempts} attempts"
    );
    assert!(running.vessel.registry().list().is_empty());
    running.stop().await;
}

/// A relay that commits and then reveals another nonce (to steer the
/// device's code) is caught by the device's commitment check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonce_changed_after_its_commitment_does_not_hold() {
    let h = [9; 32];
    let committed = [1; 32];
    let commitment = dk_channel::commitment(&committed, &h);
    assert!(dk_channel::commitment_holds(&commitment, &committed, &h));
    for changed in 0..32 {
        let mut other = committed;
        other[changed] ^= 1;
        assert!(!dk_channel::commitment_holds(&commitment, &other, &h));
    }
    // And the same commitment under another channel's hash does not hold.
    assert!(!dk_channel::commitment_holds(
        &commitment,
        &committed,
        &[8; 32]
    ));
}

/// Everything between a device and the vessel, as a TCP proxy sees it.
pub(crate) async fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let outbound = tokio::net::TcpStream::connect(&target).await.unwrap();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let (mut ir, mut iw) = inbound.into_split();
                let (mut or, mut ow) = outbound.into_split();
                let (l1, l2) = (Arc::clone(&log), log);
                let up = async move {
                    let mut buf = vec![0; 16 * 1024];
                    loop {
                        let n = match tokio::io::AsyncReadExt::read(&mut ir, &mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        l1.lock().await.extend_from_slice(&buf[..n]);
                        if tokio::io::AsyncWriteExt::write_all(&mut ow, &buf[..n])
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0; 16 * 1024];
                    loop {
                        let n = match tokio::io::AsyncReadExt::read(&mut or, &mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        l2.lock().await.extend_from_slice(&buf[..n]);
                        if tokio::io::AsyncWriteExt::write_all(&mut iw, &buf[..n])
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                };
                tokio::join!(up, down);
            });
        }
    });
    (url, seen)
}

pub(crate) fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_proxy_sees_no_manifest_capability_or_input() {
    // Not on loopback: the proxy's Host is not the listener's.
    let running = start_at("0.0.0.0:0", vessel_limits()).await;
    let target = running.device_addr();
    let (proxy_url, seen) = recording_proxy(target).await;
    let key = StaticKey::generate().unwrap();
    let secret_manifest = json!({"id": "vault-lamp", "name": "Zanzibar lantern", "kind": "lamp",
        "version": "7.7.7", "capabilities": [
            {"name": "read_light", "kind": "sensor", "description": "Quokka sensor."},
            {"name": "set_glow", "kind": "actuator", "description": "Set the glow.",
             "params": {"level": {"type": "string", "required": true}}}]});
    let relayed = running.with_device_url(proxy_url);
    let mut device = pair(
        &relayed,
        &key,
        secret_manifest.clone(),
        &["read_light", "set_glow"],
    )
    .await;
    device
        .send(json!({"type": "device:event", "capability": "read_light", "data": {"marmalade": 1}}))
        .await;
    let answering = answer_calls(device);
    relayed.wait_connected("vault-lamp").await;
    let outcome = relayed
        .call(
            "device__vault_lamp__set_glow",
            json!({"level": "ultraviolet-pomegranate"}),
            5000,
        )
        .await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    // And a reconnect by key.
    let mut again = connect(&relayed.device_url, &key).await;
    again
        .send(json!({"type": "device:auth", "deviceId": "vault-lamp", "manifest": secret_manifest}))
        .await;
    let _ = answering.await;
    relayed.wait_connected("vault-lamp").await;
    let captured = seen.lock().await.clone();
    assert!(captured.len() > 1000, "{} bytes", captured.len());
    for secret in [
        "vault-lamp",
        "vault_lamp",
        "Zanzibar",
        "Quokka",
        "read_light",
        "set_glow",
        "7.7.7",
        "ultraviolet-pomegranate",
        "marmalade",
        "device:",
        "manifest",
        "deviceToken",
        "token",
    ] {
        assert!(
            !contains(&captured, secret),
            "{secret:?} crossed the wire in clear"
        );
    }
    // The handshake says what it is, and nothing more.
    assert!(contains(&captured, "dk.2"));
    drop(again);
    relayed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_v1_is_refused_before_the_upgrade_and_dk2_works() {
    let running = start_at("0.0.0.0:0", vessel_limits()).await;
    // A downgrade: the same device, the subprotocol stripped.
    let refused = connect_offering(&running.device_url, None)
        .await
        .unwrap_err();
    assert!(refused.starts_with("403"), "{refused}");
    assert!(refused.contains("dk/2"), "{refused}");
    let refused = connect_offering(&running.device_url, Some("dk.1, chat"))
        .await
        .unwrap_err();
    assert!(refused.starts_with("403"), "{refused}");
    // An offer that lists dk.2 among others selects it.
    let (_socket, chosen) = connect_offering(&running.device_url, Some("chat, dk.2"))
        .await
        .unwrap();
    assert_eq!(chosen.as_deref(), Some("dk.2"));
    // A no-screen device may not pair here.
    let mut no_screen = connect(&running.device_url, &StaticKey::generate().unwrap()).await;
    let mut m = manifest("blind");
    m["noScreen"] = json!(true);
    no_screen
        .send(json!({"type": "device:hello", "manifest": m}))
        .await;
    let closed = no_screen.closed().await;
    assert_eq!(closed.code, 4001, "{closed:?}");
    assert_eq!(closed.reason, "no-screen pairing is off on this listener");
    // A device that speaks dk/2 pairs.
    let device = pair(
        &running,
        &StaticKey::generate().unwrap(),
        manifest("far-lamp"),
        &[],
    )
    .await;
    drop(device);
    assert_eq!(
        running
            .vessel
            .stats()
            .plain_v1_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    running.stop().await;

    // On loopback, v1 works as before; behind a proxy header it does not.
    let running = start(vessel_limits()).await;
    let (_socket, chosen) = connect_offering(&running.device_url, None).await.unwrap();
    assert_eq!(chosen, None);
    let mut request = running.device_url.as_str().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
    assert!(tokio_tungstenite::connect_async(request).await.is_err());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repairing_with_another_key_or_over_v1_says_so_and_needs_its_own_confirmation() {
    // On loopback, where v1 is allowed.
    let running = start(Limits::default()).await;
    let first = StaticKey::generate().unwrap();
    let paired = pair(&running, &first, manifest("lamp"), &["read_light"]).await;
    drop(paired);
    running.wait_disconnected("lamp").await;

    // Another key asks to pair the same id: the prompt says the key
    // changed, and a plain yes pairs nothing.
    let other = StaticKey::generate().unwrap();
    for confirm in [false, true] {
        let mut device = connect(&running.device_url, &other).await;
        device
            .send(json!({"type": "device:hello", "manifest": manifest("lamp")}))
            .await;
        exchange(&mut device, dk_channel::random_nonce().unwrap())
            .await
            .unwrap();
        let prompt = running.next_consent().await;
        assert_eq!(
            prompt["request"]["replaces"]["credential"], "keyChanged",
            "{prompt}"
        );
        let id = prompt["id"].as_u64().unwrap();
        let answer = running
            .admin
            .post(
                &format!("/v1/pending/{id}/consent"),
                &json!({"approved": true, "grant": ["read_light"],
                        "confirmCredentialChange": confirm}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 204);
        if confirm {
            assert_eq!(
                device.next().await.unwrap(),
                json!({"type": "device:paired"})
            );
        } else {
            let closed = tokio::time::timeout(Duration::from_secs(10), device.closed())
                .await
                .expect("a plain yes paired the changed key");
            assert_eq!(closed.code, 4001, "{closed:?}");
            assert!(closed.reason.contains("key changed"), "{closed:?}");
            // Still paired with the first key, which reconnects by key.
            let mut again = connect(&running.device_url, &first).await;
            again
                .send(json!({"type": "device:auth", "deviceId": "lamp", "manifest": manifest("lamp")}))
                .await;
            running.wait_connected("lamp").await;
            drop(again);
            running.wait_disconnected("lamp").await;
        }
    }

    // Over v1, for an id paired over dk/2: the prompt says encryption
    // would be dropped.
    let mut socket = crate::net::raw(&running.device_url).await.unwrap();
    crate::net::send(
        &mut socket,
        json!({"type": "device:hello", "manifest": manifest("lamp")}),
    )
    .await;
    let prompt = running.next_consent().await;
    assert_eq!(prompt["request"]["channel"], "v1", "{prompt}");
    assert_eq!(
        prompt["request"]["replaces"]["credential"], "encryptionDropped",
        "{prompt}"
    );
    let id = prompt["id"].as_u64().unwrap();
    let answer = running
        .admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": ["read_light"]}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204);
    let closed = crate::net::closed(&mut socket).await.unwrap();
    assert_eq!(closed.0, 4001, "{closed:?}");
    running.stop().await;
}

/// Records count against a bucket of their own, before they are opened:
/// sixteen a second for each frame a second allowed, bursts of twice
/// that. A device sending one frame as more records than that is closed
/// before the frame is whole, and the close names the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_beyond_their_rate_close_the_connection_naming_the_limit() {
    // Two frames a second (bursts of four, enough for the pairing): 32
    // records a second, bursts of 64. Frames of up to 8 MiB, so that one
    // frame can be sent as more records than the burst.
    let running = start(Limits {
        max_frames_per_second: 2,
        max_frame_bytes: 8 << 20,
        ..vessel_limits()
    })
    .await;
    let key = StaticKey::generate().unwrap();
    let mut device = pair(&running, &key, manifest("flood"), &["read_light"]).await;
    // 6 MiB of text: 97 records, more than the burst and the 32 a second
    // that refill while they are sent.
    let text = " ".repeat(6 << 20);
    device.send_bytes(FrameKind::Text, text.as_bytes()).await;
    let closed = tokio::time::timeout(Duration::from_secs(20), device.closed())
        .await
        .expect("the flood of records was not closed");
    let reason = "more than 32 records per second";
    assert_eq!(closed.code, 4006, "{closed:?}");
    assert_eq!(closed.reason, reason, "{closed:?}");
    assert_eq!(closed.inside, Some((4006, reason.to_owned())), "{closed:?}");
}
