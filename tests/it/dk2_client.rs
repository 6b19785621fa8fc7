//! dk-device's own client over dk/2 against a real vessel: the code it
//! computes is the one the person sees, its key file keeps the key and the
//! vessel's pin privately, it reconnects by key, a vessel with another key
//! gets nothing from it, a vessel presenting a low-order key is closed
//! 4012, and a vessel that does not answer `dk.2` is never spoken to in v1;
//! a frame over the device's limit closes 4012 and a handshake that stalls
//! ends at the deadline set, and either way the device comes back.

use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_device::samples::Lamp;
use dk_device::{ClientError, ClientOptions, ConnectionEvent};
use dk_vessel::Limits;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

use crate::dk2::{contains, recording_proxy};
use crate::net::{DeviceRun, start_at, temp_dir};

fn options(url: &str, key_file: &std::path::Path) -> ClientOptions {
    ClientOptions::new(url)
        .key_file(key_file)
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
}

/// A lamp running against a listener of the test's own (a scripted vessel
/// on loopback, to accept when the test says), with [`options`] shaped by
/// `tune`: the listener, the key that vessel uses, the run, and the
/// temporary directory holding the lamp's key file (`lamp.key`).
async fn lamp_on_listener(
    tune: impl FnOnce(ClientOptions) -> ClientOptions,
) -> (
    TcpListener,
    dk_channel::StaticKey,
    DeviceRun,
    tempfile::TempDir,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let key = dk_channel::StaticKey::generate().unwrap();
    let dir = temp_dir();
    let options = tune(options(&url, &dir.path().join("lamp.key")));
    let run = DeviceRun::spawn(Lamp::new().device(), options);
    (listener, key, run, dir)
}

/// The device-side key file, read as JSON.
fn key_file_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Waits until the device marked itself paired in its key file: the vessel
/// counts it connected a moment before the device handled `device:paired`.
async fn wait_paired(path: &std::path::Path) {
    dk_testkit::eventually(&format!("{} to say paired", path.display()), || {
        path.exists() && key_file_json(path)["paired"] == true
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_pairs_over_dk2_by_computed_codes_pins_the_vessel_and_reconnects_by_key() {
    // Off loopback, where v1 is refused: only dk/2 can get through.
    let running = start_at("0.0.0.0:0", Limits::default()).await;
    let target = running.device_addr();
    let (proxy_url, seen) = recording_proxy(target).await;
    let running = running.with_device_url(proxy_url);
    let dir = temp_dir();
    let key_file = dir.path().join("keys").join("lamp.key");
    let shown = Arc::new(Mutex::new(Vec::<String>::new()));
    let pinned = Arc::new(Mutex::new(Vec::<String>::new()));
    let (seen_code, seen_pin) = (Arc::clone(&shown), Arc::clone(&pinned));
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(
        lamp.device(),
        options(&running.device_url, &key_file)
            .on_code(move |code| seen_code.lock().unwrap().push(code.to_owned()))
            .on_vessel_pinned(move |f| seen_pin.lock().unwrap().push(f.to_owned())),
    );
    let prompt = running.approve_next(&["set_light", "read_light"]).await;
    assert_eq!(prompt["request"]["channel"], "dk/2", "{prompt}");
    running.wait_connected("desk-lamp").await;
    // The code the person saw is the code the device computed.
    assert_eq!(
        shown.lock().unwrap().as_slice(),
        [prompt["request"]["code"].as_str().unwrap()]
    );
    // The device pinned the vessel's key, and shows its fingerprint.
    let fingerprint = running.vessel.fingerprint().unwrap();
    wait_paired(&key_file).await;
    assert_eq!(
        pinned.lock().unwrap().as_slice(),
        std::slice::from_ref(&fingerprint)
    );
    let kept = key_file_json(&key_file);
    assert_eq!(kept["format"], "dk-device-key/1");
    assert_eq!(kept["paired"], true);
    assert_eq!(kept["vessel"].as_str().unwrap().len(), 64);
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let outcome = running
        .call(
            "device__desk_lamp__set_light",
            json!({"on": true, "brightness": 37}),
            5000,
        )
        .await;
    assert_eq!(
        outcome,
        json!({"ok": true, "result": {"on": true, "brightness": 37}})
    );
    run.stop().await.unwrap();
    running.wait_disconnected("desk-lamp").await;

    // A new run with the same key file reconnects by key: no prompt.
    let again = DeviceRun::spawn(lamp.device(), options(&running.device_url, &key_file));
    running.wait_connected("desk-lamp").await;
    assert_eq!(
        running.admin.get("/v1/pending").await.unwrap().body,
        json!([])
    );
    let outcome = running
        .call("device__desk_lamp__read_light", json!({}), 5000)
        .await;
    assert_eq!(outcome["result"], json!({"on": true, "brightness": 37}));
    again.stop().await.unwrap();

    // Everything crossed the proxy sealed.
    let captured = seen.lock().await.clone();
    assert!(captured.len() > 1000, "{} bytes", captured.len());
    for secret in [
        "desk-lamp",
        "Desk lamp",
        "set_light",
        "read_light",
        "brightness",
        "device:",
        "token",
        prompt["request"]["code"].as_str().unwrap(),
    ] {
        assert!(
            !contains(&captured, secret),
            "{secret:?} crossed the wire in clear"
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_with_another_key_gets_nothing_until_the_pin_is_forgotten() {
    let first = start_at("127.0.0.1:0", Limits::default()).await;
    let dir = temp_dir();
    let key_file = dir.path().join("lamp.key");
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(lamp.device(), options(&first.device_url, &key_file));
    first.approve_next(&["read_light"]).await;
    first.wait_connected("desk-lamp").await;
    wait_paired(&key_file).await;
    run.stop().await.unwrap();
    first.stop().await;

    // Another vessel (another key) where the device looks for its own.
    let impostor = start_at("127.0.0.1:0", Limits::default()).await;
    let ended = DeviceRun::spawn(lamp.device(), options(&impostor.device_url, &key_file))
        .ended()
        .await;
    let Err(ClientError::VesselKeyChanged { pinned, presented }) = ended else {
        panic!("{ended:?}")
    };
    assert_eq!(presented, impostor.vessel.fingerprint().unwrap());
    assert_ne!(pinned, presented);
    // The impostor never saw a hello: no prompt, nothing paired.
    assert_eq!(
        impostor.admin.get("/v1/pending").await.unwrap().body,
        json!([])
    );
    assert_eq!(key_file_json(&key_file)["paired"], true);

    // Forgetting the vessel on purpose lets the device pair with this one.
    let run = DeviceRun::spawn(
        lamp.device(),
        options(&impostor.device_url, &key_file).forget_vessel(),
    );
    let prompt = impostor.approve_next(&["read_light"]).await;
    assert_eq!(prompt["request"]["channel"], "dk/2");
    impostor.wait_connected("desk-lamp").await;
    run.stop().await.unwrap();
    impostor.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_that_does_not_answer_dk2_is_never_spoken_to_in_v1() {
    // A WebSocket server that upgrades without choosing a subprotocol (an
    // 8DK vessel, or a downgrading proxy), and records what it receives.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let Ok(mut socket) = tokio_tungstenite::accept_async(tcp).await else {
            return Vec::new();
        };
        let mut got = Vec::new();
        while let Ok(Some(Ok(message))) =
            tokio::time::timeout(Duration::from_millis(500), socket.next()).await
        {
            got.push(message);
        }
        got
    });
    let dir = temp_dir();
    let ended = DeviceRun::spawn(
        Lamp::new().device(),
        options(&url, &dir.path().join("lamp.key")),
    )
    .ended()
    .await;
    assert!(matches!(ended, Err(ClientError::NotDk2)), "{ended:?}");
    let got = server.await.unwrap();
    assert!(
        !got.iter().any(|m| m.is_text() || m.is_binary()),
        "the device spoke: {got:?}"
    );
}

/// Chooses `dk.2` in the upgrade's answer.
#[allow(
    clippy::result_large_err,
    reason = "the signature tungstenite's accept callback requires"
)]
fn choose_dk2(
    _: &tokio_tungstenite::tungstenite::handshake::server::Request,
    mut response: tokio_tungstenite::tungstenite::handshake::server::Response,
) -> Result<
    tokio_tungstenite::tungstenite::handshake::server::Response,
    tokio_tungstenite::tungstenite::handshake::server::ErrorResponse,
> {
    response
        .headers_mut()
        .insert("sec-websocket-protocol", "dk.2".parse().unwrap());
    Ok(response)
}

/// A vessel's side of dk/2 with nothing behind it: one accepted
/// connection, handshaken by dk-channel's scripted vessel, which seals and
/// opens its frames.
struct FakeVessel {
    socket: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    channel: dk_channel::ScriptedVessel,
}

impl FakeVessel {
    /// Accepts one connection on `listener` choosing `dk.2` and runs the
    /// responder's handshake with `key`.
    async fn accept(listener: &TcpListener, key: &dk_channel::StaticKey) -> FakeVessel {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut socket = tokio_tungstenite::accept_hdr_async(tcp, choose_dk2)
            .await
            .unwrap();
        let limits = dk_channel::RecordLimits {
            max_text: 1 << 20,
            max_binary: 1 << 20,
        };
        let mut channel = dk_channel::ScriptedVessel::new(key, limits).unwrap();
        let first = Self::next_binary(&mut socket).await;
        let second = channel.second(&first).unwrap();
        socket.send(Message::binary(second)).await.unwrap();
        let third = Self::next_binary(&mut socket).await;
        channel.third(&third).unwrap();
        FakeVessel { socket, channel }
    }

    async fn next_binary(
        socket: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    ) -> Vec<u8> {
        loop {
            if let Message::Binary(bytes) = socket.next().await.unwrap().unwrap() {
                return bytes.to_vec();
            }
        }
    }

    /// The device's next frame, as JSON.
    async fn read(&mut self) -> Value {
        loop {
            let bytes = Self::next_binary(&mut self.socket).await;
            if let Some(text) = self.channel.open(&bytes).unwrap() {
                return serde_json::from_str(&text).unwrap();
            }
        }
    }

    /// Seals `frame` and sends its records.
    async fn send(&mut self, frame: &Value) {
        for record in self.channel.seal(&frame.to_string()).unwrap() {
            self.socket.send(Message::binary(record)).await.unwrap();
        }
    }

    /// Waits for the device to close; its close code.
    async fn device_closes(mut self) -> Option<u16> {
        while let Some(Ok(message)) = self.socket.next().await {
            if let Message::Close(frame) = message {
                return frame.map(|f| f.code.into());
            }
        }
        None
    }
}

/// A vessel's side of dk/2 with nothing behind it: accepts one connection
/// choosing `dk.2`, runs the handshake, reads the device's first frame, then
/// (when `announce`) says `device:closing` 4007 inside the channel, and
/// closes 4007.
async fn closing_vessel(listener: &TcpListener, key: &dk_channel::StaticKey, announce: bool) {
    let closing =
        json!({"type": "device:closing", "code": 4007, "reason": "unpaired by the person"});
    let frames = if announce { vec![closing] } else { Vec::new() };
    fake_vessel(listener, key, &frames, &[], false).await;
}

/// A vessel's side of dk/2 with nothing behind it: accepts one connection
/// choosing `dk.2`, runs the handshake, reads the device's `device:hello`,
/// sends `frames` inside the channel and `raw` binary messages as they are,
/// then either waits for the device to close (`device_closes`; its close
/// code is returned) or closes 4007.
async fn fake_vessel(
    listener: &TcpListener,
    key: &dk_channel::StaticKey,
    frames: &[Value],
    raw: &[Vec<u8>],
    device_closes: bool,
) -> Option<u16> {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;

    let mut vessel = FakeVessel::accept(listener, key).await;
    let first = vessel.read().await;
    assert_eq!(first["type"], "device:hello", "{first}");
    for frame in frames {
        vessel.send(frame).await;
    }
    for message in raw {
        vessel
            .socket
            .send(Message::binary(message.clone()))
            .await
            .unwrap();
    }
    if device_closes {
        return vessel.device_closes().await;
    }
    let close = CloseFrame {
        code: 4007.into(),
        reason: "unpaired by the person".into(),
    };
    let _ = vessel.socket.send(Message::Close(Some(close))).await;
    while let Some(Ok(_)) = vessel.socket.next().await {}
    None
}

/// The device connects again to `listener` after `what`; told inside the
/// channel that it was unpaired, it stops.
async fn comes_back_then_stops_unpaired(
    listener: &TcpListener,
    key: &dk_channel::StaticKey,
    run: DeviceRun,
    what: &str,
) {
    tokio::time::timeout(Duration::from_secs(10), closing_vessel(listener, key, true))
        .await
        .unwrap_or_else(|_| panic!("the device did not come back after {what}"));
    let ended = tokio::time::timeout(Duration::from_secs(10), run.ended())
        .await
        .unwrap();
    assert!(matches!(ended, Err(ClientError::Unpaired)), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_or_unexpected_pairing_frame_ends_the_pairing() {
    let key = dk_channel::StaticKey::generate().unwrap();
    let hex = "ab".repeat(32);
    for frames in [
        // A commitment that is not 64 lower-case hex digits.
        vec![json!({"type": "device:pair-commit", "commitment": "XYZ"})],
        // v1's code, which dk/2 does not have.
        vec![json!({"type": "device:pairing", "code": "123456"})],
        // A reveal before any commitment.
        vec![json!({"type": "device:pair-reveal", "nonce": hex})],
        // A second commitment.
        vec![
            json!({"type": "device:pair-commit", "commitment": hex}),
            json!({"type": "device:pair-commit", "commitment": hex}),
        ],
        // A reveal that does not match the commitment.
        vec![
            json!({"type": "device:pair-commit", "commitment": hex}),
            json!({"type": "device:pair-reveal", "nonce": hex}),
        ],
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/device", listener.local_addr().unwrap());
        let dir = temp_dir();
        let key_file = dir.path().join("lamp.key");
        let run = DeviceRun::spawn(Lamp::new().device(), options(&url, &key_file));
        let closed = tokio::time::timeout(
            Duration::from_secs(10),
            fake_vessel(&listener, &key, &frames, &[], true),
        )
        .await
        .unwrap();
        assert_eq!(closed, Some(4001), "{frames:?}");
        let ended = tokio::time::timeout(Duration::from_secs(10), run.ended())
            .await
            .unwrap();
        assert!(
            matches!(ended, Err(ClientError::PairingBroken(_))),
            "{frames:?}: {ended:?}"
        );
        assert_eq!(key_file_json(&key_file)["paired"], false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_not_announced_inside_the_channel_is_only_a_disconnect() {
    let (listener, key, run, _dir) = lamp_on_listener(|options| options).await;
    // A bare 4007, as anyone on the path could forge: the device comes back.
    closing_vessel(&listener, &key, false).await;
    // The same 4007 announced inside the channel: the device stops.
    comes_back_then_stops_unpaired(&listener, &key, run, "a bare close").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_over_dk2_crosses_a_recording_proxy_sealed() {
    // Beyond loopback: a proxy's Host is not the listener's, which a
    // loopback listener refuses (DNS rebinding).
    let running = start_at("0.0.0.0:0", Limits::default()).await;
    running.vessel.set_streaming(
        dk_vessel::config::VesselConfig::parse(
            "[streaming.voice]\nenabled = true\nrequireApproval = false\nsandbox = \"s\"\n\
             [streaming.voice.limits]\nmaxChunkBytes = 4096\n",
        )
        .unwrap()
        .streaming,
    );
    let target = running.device_addr();
    let (proxy_url, seen) = recording_proxy(target).await;
    let running = running.with_device_url(proxy_url);
    let mut audio = running.vessel.subscribe_stream("kitchen-voice");
    let voice = dk_device::samples::Voice::new();
    let (chunks, outbox) = dk_device::stream_channel(8);
    let dir = temp_dir();
    let device = DeviceRun::spawn(
        voice.device(),
        options(&running.device_url, &dir.path().join("voice.key")).streams(outbox),
    );
    running
        .approve_next(&["microphone", "read_status", "set_volume"])
        .await;
    running.wait_connected("kitchen-voice").await;
    for index in 0..3 {
        chunks.try_send("microphone", voice.frame(index)).unwrap();
    }
    for index in 0..3 {
        let event = audio.recv().await.unwrap();
        assert!(event.verdict().accepted());
        assert_eq!(event.payload(), voice.frame(index).as_slice());
    }
    device.stop().await.unwrap();
    let captured = seen.lock().await.clone();
    for secret in ["kitchen-voice", "microphone", "set_volume", "device:"] {
        assert!(
            !contains(&captured, secret),
            "{secret:?} crossed the wire in clear"
        );
    }
    // No 32-byte run of any PCM frame sent appears on the wire.
    for index in 0..3 {
        let frame = voice.frame(index);
        for piece in frame.chunks_exact(32) {
            assert!(
                !captured.windows(32).any(|w| w == piece),
                "PCM of frame {index} crossed the wire in clear"
            );
        }
    }
    running.stop().await;
}

/// A TLS proxy in front of `target` (a plain vessel): terminates TLS with
/// a self-signed certificate for `localhost` and forwards the bytes. Returns
/// its port and the certificate's PEM.
async fn tls_proxy(target: String) -> (u16, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let pem = cert.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let target = target.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut plain = tokio::net::TcpStream::connect(&target).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (port, pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_tls_proxy_wss_with_a_pinned_certificate_carries_dk2() {
    // Beyond loopback: a proxy's Host is not the listener's, which a
    // loopback listener refuses (DNS rebinding).
    let running = start_at("0.0.0.0:0", Limits::default()).await;
    let target = running.device_addr();
    let (port, pem) = tls_proxy(target).await;
    let url = format!("wss://localhost:{port}/device");
    let dir = temp_dir();

    // The platform's roots do not know the proxy's certificate.
    let unknown = DeviceRun::spawn(
        Lamp::new().device(),
        options(&url, &dir.path().join("lamp.key")).max_attempts(1),
    )
    .ended()
    .await;
    match &unknown {
        Err(ClientError::GaveUp { last, .. }) => {
            assert!(last.to_lowercase().contains("certificate"), "{last}");
        }
        // A machine without platform roots says so instead.
        Err(ClientError::TlsRoot(_)) => {}
        other => panic!("{other:?}"),
    }
    // A PEM with no certificate in it is refused before any connection.
    let empty = DeviceRun::spawn(
        Lamp::new().device(),
        options(&url, &dir.path().join("lamp.key")).tls_root("nothing here"),
    )
    .ended()
    .await;
    assert!(matches!(empty, Err(ClientError::TlsRoot(_))), "{empty:?}");

    // Pinned, the proxy is trusted, and dk/2 runs inside the TLS.
    let key_file = dir.path().join("lamp.key");
    let run = DeviceRun::spawn(
        Lamp::new().device(),
        options(&url, &key_file).tls_root(pem.clone()),
    );
    let prompt = running.approve_next(&["read_light"]).await;
    assert_eq!(prompt["request"]["channel"], "dk/2");
    running.wait_connected("desk-lamp").await;
    wait_paired(&key_file).await;
    let outcome = running
        .call("device__desk_lamp__read_light", json!({}), 5000)
        .await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    run.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_device_refused_beyond_loopback_stops_and_says_why() {
    let running = start_at("0.0.0.0:0", Limits::default()).await;
    let dir = temp_dir();
    let ended = DeviceRun::spawn(
        Lamp::new().device(),
        ClientOptions::new(&running.device_url)
            .v1()
            .token_file(dir.path().join("lamp.token")),
    )
    .ended()
    .await;
    let Err(ClientError::Refused(why)) = &ended else {
        panic!("{ended:?}")
    };
    assert!(why.contains("dk/2"), "{why}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_open_closes_4012_and_the_device_comes_back() {
    let (listener, key, run, _dir) = lamp_on_listener(|options| options).await;
    // Garbage where a record should be: the device closes with the one
    // code for any channel failure.
    let closed = tokio::time::timeout(
        Duration::from_secs(10),
        fake_vessel(&listener, &key, &[], &[vec![0x5a; 40]], true),
    )
    .await
    .unwrap();
    assert_eq!(closed, Some(4012));
    // A channel failure is not a refusal: the device connects again.
    comes_back_then_stops_unpaired(&listener, &key, run, "a channel failure").await;
}

/// A vessel's side of dk/2 that pairs the device (the person's yes taken
/// for granted), then sends a second commitment; the device's close code.
async fn vessel_that_commits_again(
    listener: &TcpListener,
    key: &dk_channel::StaticKey,
) -> Option<u16> {
    let mut vessel = FakeVessel::accept(listener, key).await;
    let hello = vessel.read().await;
    assert_eq!(hello["type"], "device:hello");
    let nv = dk_channel::random_nonce().unwrap();
    let commit = dk_channel::to_hex32(&dk_channel::commitment(
        &nv,
        &vessel.channel.handshake_hash(),
    ));
    let commit = json!({"type": "device:pair-commit", "commitment": commit});
    vessel.send(&commit).await;
    let nonce = vessel.read().await;
    assert_eq!(nonce["type"], "device:pair-nonce");
    vessel
        .send(&json!({"type": "device:pair-reveal", "nonce": dk_channel::to_hex32(&nv)}))
        .await;
    vessel.send(&json!({"type": "device:paired"})).await;
    vessel.send(&commit).await;
    vessel.device_closes().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pairing_frame_after_pairing_ends_the_connection() {
    let (listener, key, run, dir) = lamp_on_listener(|options| options).await;
    let key_file = dir.path().join("lamp.key");
    let closed = tokio::time::timeout(
        Duration::from_secs(10),
        vessel_that_commits_again(&listener, &key),
    )
    .await
    .unwrap();
    assert_eq!(closed, Some(4001));
    let ended = tokio::time::timeout(Duration::from_secs(10), run.ended())
        .await
        .unwrap();
    assert!(
        matches!(ended, Err(ClientError::PairingBroken(_))),
        "{ended:?}"
    );
    // The pairing itself went through: the key file kept the pin.
    assert_eq!(key_file_json(&key_file)["paired"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_presenting_a_low_order_key_is_closed_4012_before_the_device_says_anything() {
    let key = dk_channel::StaticKey::generate().unwrap();
    for zero in [
        dk_channel::LowOrderSlot::Static,
        dk_channel::LowOrderSlot::Ephemeral,
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/device", listener.local_addr().unwrap());
        let server = async {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut socket = tokio_tungstenite::accept_hdr_async(tcp, choose_dk2)
                .await
                .unwrap();
            let mut responder =
                dk_channel::Responder::presenting_low_order_for_tests(&key, zero).unwrap();
            let first = FakeVessel::next_binary(&mut socket).await;
            responder.read_first(&first).unwrap();
            let second = responder.second_message().unwrap();
            socket.send(Message::binary(second)).await.unwrap();
            // What the device sends next: nothing but its close.
            let mut spoke = Vec::new();
            while let Some(Ok(message)) = socket.next().await {
                if let Message::Close(frame) = message {
                    return (frame.map(|f| u16::from(f.code)), spoke);
                }
                spoke.push(message);
            }
            (None, spoke)
        };
        let dir = temp_dir();
        let mut options = options(&url, &dir.path().join("lamp.key"));
        let device = Lamp::new().device();
        let client = dk_device::connect_once(&device, &mut options, std::future::pending());
        let ((closed, spoke), ended) = tokio::time::timeout(
            Duration::from_secs(10),
            futures::future::join(server, client),
        )
        .await
        .unwrap();
        assert_eq!(closed, Some(4012), "{zero}");
        assert!(spoke.is_empty(), "{zero}: the device sent {spoke:?}");
        // Not a refusal from the vessel: the device would try again.
        let Err(ClientError::Connect(why)) = &ended else {
            panic!("{zero}: {ended:?}")
        };
        assert!(
            why.contains(&format!("{zero} key is a low-order point")),
            "{why}"
        );
    }
}

/// A front before the vessel at `target` that answers its first two
/// connections with a forged HTTP 403 and the next two with an upgrade that
/// names no subprotocol (both outside the channel, as anyone on the path
/// could), then forwards every later connection to the vessel.
async fn forging_front(target: String) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((mut inbound, _)) = listener.accept().await {
            accepted += 1;
            match accepted {
                1 | 2 => {
                    // Read the upgrade request, answer 403.
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match inbound.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = r#"{"error":"forged on the path"}"#;
                    let answer = format!(
                        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = inbound.write_all(answer.as_bytes()).await;
                }
                3 | 4 => {
                    if let Ok(mut socket) = tokio_tungstenite::accept_async(inbound).await {
                        let _ = socket.close(None).await;
                    }
                }
                _ => {
                    let target = target.clone();
                    tokio::spawn(async move {
                        let mut outbound = tokio::net::TcpStream::connect(&target).await.unwrap();
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    });
                }
            }
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paired_device_outlasts_forged_refusals_at_the_upgrade_and_stops_on_one_inside_the_channel()
 {
    // Beyond loopback, so that the front's Host is taken.
    let running = start_at("0.0.0.0:0", Limits::default()).await;
    let dir = temp_dir();
    let key_file = dir.path().join("lamp.key");
    let lamp = Lamp::new();
    let run = DeviceRun::spawn(lamp.device(), options(&running.device_url, &key_file));
    running.approve_next(&["read_light"]).await;
    running.wait_connected("desk-lamp").await;
    wait_paired(&key_file).await;
    run.stop().await.unwrap();
    running.wait_disconnected("desk-lamp").await;

    // The paired lamp again, through a path that forges two 403s and two
    // upgrades without `dk.2`: it keeps trying, says why, and gets through.
    let front = forging_front(running.device_addr()).await;
    let heard = Arc::new(Mutex::new(Vec::<ConnectionEvent>::new()));
    let hear = Arc::clone(&heard);
    let run = DeviceRun::spawn(
        lamp.device(),
        options(&front, &key_file).on_connection(move |event| {
            hear.lock().unwrap().push(event.clone());
        }),
    );
    running.wait_connected("desk-lamp").await;
    let outcome = running
        .call("device__desk_lamp__read_light", json!({}), 5000)
        .await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    let heard = heard.lock().unwrap().clone();
    let whys: Vec<&str> = heard
        .iter()
        .filter_map(|event| match event {
            ConnectionEvent::Disconnected { why, .. } => Some(why.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(whys.len(), 4, "{heard:?}");
    for why in &whys[..2] {
        assert!(why.contains("HTTP 403"), "{why}");
        assert!(why.contains("outside the channel"), "{why}");
    }
    for why in &whys[2..] {
        assert!(why.contains("dk.2"), "{why}");
        assert!(why.contains("outside the channel"), "{why}");
    }
    assert_eq!(heard.last(), Some(&ConnectionEvent::Connected), "{heard:?}");

    // A refusal inside the channel still stops it: the person unpairs.
    let answer = running.admin.delete("/v1/devices/desk-lamp").await.unwrap();
    assert!(answer.status < 300, "{answer:?}");
    let ended = tokio::time::timeout(Duration::from_secs(10), run.ended())
        .await
        .unwrap();
    assert!(matches!(ended, Err(ClientError::Unpaired)), "{ended:?}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_clients_limit_closes_4012_and_the_device_comes_back() {
    let (listener, key, run, _dir) = lamp_on_listener(|options| options).await;
    // An invoke one byte over the device's frame limit, in records that
    // each open: the limit, not the records, ends the channel.
    let over = json!({"type": "device:invoke", "callId": "big", "capability": "read_light",
                      "input": {"x": ""}})
    .to_string();
    let padding = "x".repeat(dk_proto::MAX_FRAME_BYTES + 1 - over.len());
    let big: Value =
        serde_json::from_str(&over.replace(r#""x":"""#, &format!(r#""x":"{padding}""#))).unwrap();
    assert_eq!(big.to_string().len(), dk_proto::MAX_FRAME_BYTES + 1);
    let closed = tokio::time::timeout(
        Duration::from_secs(10),
        fake_vessel(&listener, &key, &[big], &[], true),
    )
    .await
    .unwrap();
    assert_eq!(closed, Some(4012));
    comes_back_then_stops_unpaired(&listener, &key, run, "a frame over its limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_stalls_ends_at_its_deadline_and_the_device_comes_back() {
    let (listener, key, run, _dir) =
        lamp_on_listener(|options| options.handshake_timeout(Duration::from_millis(300))).await;
    // A vessel that takes the first handshake message and says nothing:
    // the device drops the connection at its deadline.
    let stalled = async {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut socket = tokio_tungstenite::accept_hdr_async(tcp, choose_dk2)
            .await
            .unwrap();
        FakeVessel::next_binary(&mut socket).await;
        while let Some(Ok(_)) = socket.next().await {}
    };
    tokio::time::timeout(Duration::from_secs(10), stalled)
        .await
        .expect("the device did not give up the stalled handshake");
    comes_back_then_stops_unpaired(&listener, &key, run, "a stalled handshake").await;
}
