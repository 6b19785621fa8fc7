//! Tests of the device client against a small vessel written here, speaking
//! the vessel side of the protocol over real sockets on 127.0.0.1.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::backoff::full_jitter;
use super::connection::printable;
use super::token_file::{read_token, write_token};
use super::*;
use crate::samples::{Lamp, LampState, Thermostat};
use crate::{Notice, ServeOptions};
use futures::future;

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const OTHER_TOKEN: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

/// A safety net so a broken test fails instead of hanging; never an
/// assertion on how long something takes.
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not happen"),
    }
}

/// Runs the client and the vessel's script together, within the safety net.
async fn both<A, B>(client: impl Future<Output = A>, script: impl Future<Output = B>) -> (A, B) {
    within("the client and the vessel", async {
        tokio::join!(client, script)
    })
    .await
}

// ---------------------------------------------------------------- the test vessel

/// A vessel listening on 127.0.0.1 on a port of its own.
struct TestVessel {
    listener: TcpListener,
    url: String,
    accepted: u32,
}

impl TestVessel {
    async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/device", listener.local_addr().unwrap());
        TestVessel {
            listener,
            url,
            accepted: 0,
        }
    }

    /// The next device connection, upgraded.
    async fn accept(&mut self) -> Peer {
        let (tcp, _) = within("a connection", self.listener.accept())
            .await
            .unwrap();
        self.accepted += 1;
        Peer {
            ws: tokio_tungstenite::accept_async(tcp).await.unwrap(),
        }
    }
}

/// One device connection, seen from the vessel.
struct Peer {
    ws: WebSocketStream<TcpStream>,
}

impl Peer {
    /// The next text frame, as JSON.
    async fn recv(&mut self) -> Value {
        loop {
            match within("a frame from the device", self.ws.next()).await {
                Some(Ok(Message::Text(text))) => return serde_json::from_str(&text).unwrap(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    }

    async fn send(&mut self, frame: Value) {
        self.send_raw(Message::text(frame.to_string())).await;
    }

    async fn send_raw(&mut self, message: Message) {
        self.ws.send(message).await.unwrap();
    }

    async fn invoke(&mut self, call_id: &str, capability: &str, input: Value) {
        self.send(json!({"type": "device:invoke", "callId": call_id,
                         "capability": capability, "input": input}))
            .await;
    }

    /// Closes with `code` and reads until the device has answered the close.
    async fn close(mut self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason.into(),
        };
        self.send_raw(Message::Close(Some(frame))).await;
        while let Some(Ok(_)) = within("the device's close", self.ws.next()).await {}
    }

    /// Reads until the device closes; its close frame (code, reason).
    async fn closed_by_device(mut self) -> Option<(u16, String)> {
        loop {
            match within("the device's close", self.ws.next()).await {
                Some(Ok(Message::Close(frame))) => {
                    return frame.map(|f| (u16::from(f.code), f.reason.as_str().to_owned()));
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return None,
            }
        }
    }
}

// ---------------------------------------------------------------- helpers

/// A directory of its own under the system temp dir, removed on drop.
struct TempDir(tempfile::TempDir);

impl TempDir {
    fn new() -> Self {
        TempDir(tempfile::tempdir().unwrap())
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Options for tests: tiny backoff, codes recorded.
fn options(url: &str, codes: &Arc<Mutex<Vec<String>>>) -> ClientOptions {
    let codes = Arc::clone(codes);
    ClientOptions::new(url)
        .v1()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .on_code(move |code| codes.lock().unwrap().push(code.to_owned()))
}

fn no_codes() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

/// A shutdown signal for the client.
fn shutdown() -> (oneshot::Sender<()>, impl Future<Output = ()>) {
    let (tx, rx) = oneshot::channel::<()>();
    (tx, async move {
        let _ = rx.await;
    })
}

fn lamp_manifest() -> Value {
    serde_json::from_str(&Lamp::new().device().manifest().to_json()).unwrap()
}

#[track_caller]
fn check_result(frame: &Value, call_id: &str, result: Value) {
    assert_eq!(
        frame,
        &json!({"type": "device:result", "callId": call_id, "ok": true, "result": result})
    );
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

// ---------------------------------------------------------------- pairing

#[tokio::test]
async fn pairing_shows_the_code_keeps_the_token_private_and_serves_on() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("not-yet/desk-lamp.token");
    let codes = no_codes();
    let lamp = Lamp::new();
    let device = lamp.device();
    let (stop, stopped) = shutdown();
    let options = options(&vessel.url, &codes).token_file(&token_file);

    let script = async {
        let mut peer = vessel.accept().await;
        assert_eq!(
            peer.recv().await,
            json!({"type": "device:hello", "manifest": lamp_manifest()})
        );
        peer.send(json!({"type": "device:pairing", "code": "042137"}))
            .await;
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        peer.invoke("c1", "set_light", json!({"on": true, "brightness": 40}))
            .await;
        check_result(
            &peer.recv().await,
            "c1",
            json!({"on": true, "brightness": 40}),
        );
        // The token was on disk before the first call was answered.
        assert_eq!(
            std::fs::read_to_string(&token_file).unwrap(),
            format!("{TOKEN}\n")
        );
        stop.send(()).unwrap();
        assert_eq!(
            peer.closed_by_device().await,
            Some((1000, "device shutting down".to_owned()))
        );
    };
    let (result, ()) = both(run_client(&device, options, stopped), script).await;
    result.unwrap();

    assert_eq!(*codes.lock().unwrap(), ["042137"]);
    #[cfg(unix)]
    assert_eq!(mode(&token_file), 0o600);
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("not-yet"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["desk-lamp.token"], "no temporary file is left");
    assert_eq!(
        lamp.state(),
        LampState {
            on: true,
            brightness: 40.0
        }
    );
}

#[tokio::test]
async fn a_code_that_is_not_six_digits_is_never_shown() {
    let mut vessel = TestVessel::bind().await;
    let codes = no_codes();
    let device = Lamp::new().device();
    let (stop, stopped) = shutdown();
    let mut options = options(&vessel.url, &codes);

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        for code in ["12345", "1234567", "12a456", "\u{1b}[2J12", "123456"] {
            peer.send(json!({"type": "device:pairing", "code": code}))
                .await;
        }
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        peer.invoke("c1", "read_light", json!({})).await;
        peer.recv().await;
        stop.send(()).unwrap();
        peer.closed_by_device().await;
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
    assert_eq!(*codes.lock().unwrap(), ["123456"]);
}

#[tokio::test]
async fn a_refused_pairing_stops_with_the_vessels_reason() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    let device = Lamp::new().device();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:pairing", "code": "000001"}))
            .await;
        peer.close(4001, "the person did not approve pairing").await;
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    match result {
        Err(ClientError::PairingRefused(reason)) => {
            assert_eq!(reason, "the person did not approve pairing");
        }
        other => panic!("expected PairingRefused, got {other:?}"),
    }
    assert!(!token_file.exists());
    assert_eq!(vessel.accepted, 1, "a refusal is not retried");
}

/// A device whose `slow` calls wait for `gate` and whose `hang` calls
/// never end, holding `alive`; each says when it starts.
fn waiting_device(
    gate: &Arc<tokio::sync::Semaphore>,
    alive: &Arc<()>,
    started: tokio::sync::mpsc::UnboundedSender<()>,
) -> Device {
    let capabilities: Vec<Value> = ["slow", "hang"]
        .iter()
        .map(|name| json!({"name": name, "kind": "actuator", "description": "Waits."}))
        .collect();
    let manifest = json!({"id": "waiter", "name": "Waiter", "kind": "probe", "version": "1",
                          "capabilities": capabilities});
    let (gate, alive) = (Arc::clone(gate), Arc::clone(alive));
    let slow_started = started.clone();
    Device::define(&manifest)
        .handler("slow", move |_input| {
            let gate = Arc::clone(&gate);
            let _ = slow_started.send(());
            async move {
                gate.acquire().await.unwrap().forget();
                Ok(json!({"slow": true}))
            }
        })
        .handler("hang", move |_input| {
            let alive = Arc::clone(&alive);
            let _ = started.send(());
            async move {
                let _held = alive;
                future::pending::<()>().await;
                Ok(json!({}))
            }
        })
        .build()
        .unwrap()
}

/// Pairs the connecting device over v1 and returns its connection.
async fn paired_peer(vessel: &mut TestVessel) -> Peer {
    let mut peer = vessel.accept().await;
    peer.recv().await;
    peer.send(json!({"type": "device:pairing", "code": "123456"}))
        .await;
    peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
        .await;
    peer
}

/// A shutdown signal, and word once the client has seen it (it acts on it
/// in the same step).
fn watched_shutdown() -> (
    oneshot::Sender<()>,
    oneshot::Receiver<()>,
    impl Future<Output = ()>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let (seen_tx, seen) = oneshot::channel::<()>();
    (tx, seen, async move {
        let _ = rx.await;
        let _ = seen_tx.send(());
    })
}

#[tokio::test]
async fn a_shutdown_lets_a_running_call_answer_refuses_new_ones_then_closes() {
    let mut vessel = TestVessel::bind().await;
    let (gate, alive) = (Arc::new(tokio::sync::Semaphore::new(0)), Arc::new(()));
    let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
    let device = waiting_device(&gate, &alive, started);
    let (stop, seen, stopped) = watched_shutdown();
    let mut options =
        options(&vessel.url, &no_codes()).serve(ServeOptions::new().grace(Duration::from_secs(60)));

    let script = async {
        let mut peer = paired_peer(&mut vessel).await;
        peer.invoke("c1", "slow", json!({})).await;
        running.recv().await.unwrap();
        stop.send(()).unwrap();
        seen.await.unwrap();
        peer.invoke("c2", "slow", json!({})).await;
        assert_eq!(
            peer.recv().await,
            json!({"type": "device:result", "callId": "c2", "ok": false,
                   "error": "device is shutting down"})
        );
        gate.add_permits(1);
        check_result(&peer.recv().await, "c1", json!({"slow": true}));
        assert_eq!(
            peer.closed_by_device().await,
            Some((1000, "device shutting down".to_owned()))
        );
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
}

#[tokio::test]
async fn a_call_outliving_the_shutdowns_grace_is_stopped_by_the_close() {
    let mut vessel = TestVessel::bind().await;
    let (gate, alive) = (Arc::new(tokio::sync::Semaphore::new(0)), Arc::new(()));
    let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
    let device = waiting_device(&gate, &alive, started);
    let (stop, seen, stopped) = watched_shutdown();
    let mut options = options(&vessel.url, &no_codes())
        .serve(ServeOptions::new().grace(Duration::from_millis(100)));

    let script = async {
        let mut peer = paired_peer(&mut vessel).await;
        peer.invoke("c1", "hang", json!({})).await;
        running.recv().await.unwrap();
        stop.send(()).unwrap();
        seen.await.unwrap();
        // Nothing answers c1: the grace ends with the close.
        assert_eq!(
            peer.closed_by_device().await,
            Some((1000, "device shutting down".to_owned()))
        );
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
    assert_eq!(Arc::strong_count(&alive), 2, "no handler left running");
}

#[tokio::test]
async fn shutdown_while_the_person_decides_closes_cleanly() {
    let mut vessel = TestVessel::bind().await;
    let codes = no_codes();
    let device = Lamp::new().device();
    let (stop, stopped) = shutdown();
    let options = options(&vessel.url, &codes);

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:pairing", "code": "654321"}))
            .await;
        // Wait until the code is shown, then stop.
        while codes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        stop.send(()).unwrap();
        assert_eq!(peer.closed_by_device().await.map(|c| c.0), Some(1000));
    };
    let (result, ()) = both(run_client(&device, options, stopped), script).await;
    result.unwrap();
}

// ---------------------------------------------------------------- auth and reconnect

#[tokio::test]
async fn reconnects_authenticate_with_the_token_and_the_manifest() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    write_file(&token_file, &format!("{TOKEN}\n"));
    let lamp = Lamp::new();
    let device = lamp.device();
    let (stop, stopped) = shutdown();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);
    let auth = json!({"type": "device:auth", "deviceId": "desk-lamp", "token": TOKEN,
                      "manifest": lamp_manifest()});

    let script = async {
        let mut first = vessel.accept().await;
        assert_eq!(first.recv().await, auth);
        first.invoke("c1", "read_light", json!({})).await;
        check_result(
            &first.recv().await,
            "c1",
            json!({"on": false, "brightness": 0}),
        );
        drop(first); // the connection drops without a close

        let mut second = vessel.accept().await;
        assert_eq!(second.recv().await, auth);
        second.close(1012, "vessel restarting").await;

        let mut third = vessel.accept().await;
        assert_eq!(third.recv().await, auth);
        third.invoke("c2", "set_light", json!({"on": true})).await;
        check_result(
            &third.recv().await,
            "c2",
            json!({"on": true, "brightness": 0}),
        );
        stop.send(()).unwrap();
        third.closed_by_device().await;
    };
    let (result, ()) = both(run_client(&device, options, stopped), script).await;
    result.unwrap();
    assert_eq!(vessel.accepted, 3);
    let calls: Vec<String> = lamp.calls().into_iter().map(|(name, _)| name).collect();
    assert_eq!(calls, ["read_light", "set_light"], "nothing was run twice");
}

#[tokio::test]
async fn a_call_replayed_after_a_reconnect_is_refused_not_run() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    write_file(&token_file, &format!("{TOKEN}\n"));
    let lamp = Lamp::new();
    let device = lamp.device();
    let (stop, stopped) = shutdown();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);

    let script = async {
        let mut first = vessel.accept().await;
        assert_eq!(first.recv().await["type"], "device:auth");
        first.invoke("c1", "set_light", json!({"on": true})).await;
        check_result(
            &first.recv().await,
            "c1",
            json!({"on": true, "brightness": 0}),
        );
        drop(first);

        // A vessel that (wrongly, or a relay that) sends the same call again.
        let mut second = vessel.accept().await;
        assert_eq!(second.recv().await["type"], "device:auth");
        second.invoke("c1", "set_light", json!({"on": true})).await;
        assert_eq!(
            second.recv().await,
            json!({"type": "device:result", "callId": "c1", "ok": false,
                   "error": "call \"c1\" was already received: not run again"})
        );
        stop.send(()).unwrap();
        second.closed_by_device().await;
    };
    let (result, ()) = both(run_client(&device, options, stopped), script).await;
    result.unwrap();
    assert_eq!(lamp.calls().len(), 1, "the handler ran once");
}

#[tokio::test]
async fn without_a_token_file_the_token_is_kept_for_the_run() {
    let mut vessel = TestVessel::bind().await;
    let device = Lamp::new().device();
    let (stop, stopped) = shutdown();
    let options = options(&vessel.url, &no_codes());

    let script = async {
        let mut first = vessel.accept().await;
        assert_eq!(first.recv().await["type"], "device:hello");
        first
            .send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        first.close(4009, "no answer to pings").await;
        let mut second = vessel.accept().await;
        let auth = second.recv().await;
        assert_eq!(auth["type"], "device:auth");
        assert_eq!(auth["token"], TOKEN);
        stop.send(()).unwrap();
        second.closed_by_device().await;
    };
    let (result, ()) = both(run_client(&device, options, stopped), script).await;
    result.unwrap();
}

#[tokio::test]
async fn connections_that_keep_dropping_are_retried_then_given_up() {
    let mut vessel = TestVessel::bind().await;
    let device = Lamp::new().device();
    let options = options(&vessel.url, &no_codes()).max_attempts(3);

    let script = async {
        for _ in 0..3 {
            let mut peer = vessel.accept().await;
            assert_eq!(peer.recv().await["type"], "device:hello");
            drop(peer);
        }
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    match result {
        Err(ClientError::GaveUp { attempts, last }) => {
            assert_eq!(attempts, 3);
            assert_eq!(last, "connection lost");
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
    assert_eq!(vessel.accepted, 3);
}

#[tokio::test]
async fn a_vessel_that_is_not_there_is_retried_then_given_up() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    drop(listener);
    let device = Lamp::new().device();
    let options = options(&url, &no_codes()).max_attempts(2);
    match within(
        "the client",
        run_client(&device, options, future::pending()),
    )
    .await
    {
        Err(ClientError::GaveUp { attempts, .. }) => assert_eq!(attempts, 2),
        other => panic!("expected GaveUp, got {other:?}"),
    }
}

/// A vessel at its connection cap: every upgrade answered 503 with
/// `Retry-After: 1`.
async fn busy_vessel(listener: TcpListener) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request).await;
        let _ = stream
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
    }
}

#[tokio::test]
async fn a_busy_vessel_is_tried_again_within_its_retry_after_without_growing_the_backoff() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let vessel = tokio::spawn(busy_vessel(listener));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let heard = Arc::clone(&waits);
    // A backoff of an hour: a 503 taken as a vessel that is down would wait
    // up to that long, and the safety net would fail the test.
    let options = ClientOptions::new(url)
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .max_attempts(4)
        .on_connection(move |event| {
            if let ConnectionEvent::Disconnected { why, retry_in } = event {
                heard.lock().unwrap().push((why.clone(), *retry_in));
            }
        });
    let device = Lamp::new().device();
    match within(
        "the client",
        run_client(&device, options, future::pending()),
    )
    .await
    {
        Err(ClientError::GaveUp { attempts, last }) => {
            assert_eq!(attempts, 4);
            assert!(last.contains("busy (HTTP 503)"), "{last}");
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
    vessel.abort();
    let waits = waits.lock().unwrap().clone();
    assert_eq!(waits.len(), 3, "{waits:?}");
    for (why, retry_in) in waits {
        assert!(why.contains("busy"), "{why}");
        assert!(retry_in <= Duration::from_secs(1), "{retry_in:?}");
    }
}

#[test]
fn retry_after_is_whole_seconds_from_one_to_sixty() {
    use tokio_tungstenite::tungstenite::http::{HeaderMap, HeaderValue, header::RETRY_AFTER};
    let of = |value: Option<&'static str>| {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(value));
        }
        super::connection::retry_after(&headers)
    };
    assert_eq!(of(None), Duration::from_secs(1));
    assert_eq!(of(Some("3")), Duration::from_secs(3));
    assert_eq!(of(Some("0")), Duration::from_secs(1));
    assert_eq!(of(Some("86400")), Duration::from_secs(60));
    assert_eq!(
        of(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
        Duration::from_secs(1)
    );
    assert_eq!(of(Some("-5")), Duration::from_secs(1));
}

#[tokio::test]
async fn shutdown_during_the_backoff_returns_ok() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    drop(listener);
    let device = Lamp::new().device();
    let options = ClientOptions::new(url)
        .v1()
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600));
    let (stop, stopped) = shutdown();
    let run = run_client(&device, options, stopped);
    tokio::pin!(run);
    // Let the first attempt fail; the client then waits an hour.
    for _ in 0..100 {
        tokio::select! {
            biased;
            result = &mut run => panic!("the client stopped on its own: {result:?}"),
            () = tokio::task::yield_now() => {}
        }
    }
    stop.send(()).unwrap();
    within("the client to stop", run).await.unwrap();
}

#[tokio::test]
async fn a_url_that_cannot_be_used_is_not_retried() {
    let device = Lamp::new().device();
    for url in [
        "not a url",
        "http://127.0.0.1:1/device",
        "ftp://127.0.0.1:1/device",
    ] {
        let options = ClientOptions::new(url).v1();
        match within(
            "the client",
            run_client(&device, options, future::pending()),
        )
        .await
        {
            Err(ClientError::InvalidUrl { url: shown, .. }) => assert_eq!(shown, url),
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------- closes that stop the client

#[tokio::test]
async fn auth_failed_removes_the_token_file_and_stops() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    write_file(&token_file, TOKEN);
    let device = Lamp::new().device();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);

    let script = async {
        let mut peer = vessel.accept().await;
        assert_eq!(peer.recv().await["token"], TOKEN);
        peer.close(4002, "authentication failed").await;
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    let error = result.unwrap_err();
    assert!(matches!(error, ClientError::AuthFailed), "{error:?}");
    assert!(
        error.to_string().contains("pair the device again"),
        "{error}"
    );
    assert!(!token_file.exists());
    assert_eq!(vessel.accepted, 1);
}

#[tokio::test]
async fn auth_failed_keeps_a_token_file_that_now_holds_another_token() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    write_file(&token_file, TOKEN);
    let device = Lamp::new().device();
    let mut options = options(&vessel.url, &no_codes()).token_file(&token_file);

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        // Another run paired meanwhile and wrote its token.
        write_file(&token_file, OTHER_TOKEN);
        peer.close(4002, "authentication failed").await;
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    assert!(matches!(end, Err(ClientError::AuthFailed)), "{end:?}");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), OTHER_TOKEN);
}

#[tokio::test]
async fn manifest_changed_stops_and_says_pair_again() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    write_file(&token_file, TOKEN);
    let device = Lamp::new().device();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);

    let script = async {
        let mut peer = vessel.accept().await;
        assert_eq!(peer.recv().await["manifest"], lamp_manifest());
        peer.close(4003, "manifest changed since pairing: pair again")
            .await;
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    let error = result.unwrap_err();
    assert!(matches!(error, ClientError::ManifestChanged), "{error:?}");
    assert!(error.to_string().contains("pair again"), "{error}");
    assert!(
        token_file.exists(),
        "the token still fits the approved manifest"
    );
    assert_eq!(vessel.accepted, 1);
}

#[tokio::test]
async fn unpairing_removes_the_token_and_stops() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    let device = Lamp::new().device();
    let revoked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&revoked);
    let serve = ServeOptions::new().on_notice(move |notice| {
        if let Notice::Revoked { capability } = notice {
            seen.lock().unwrap().push(capability);
        }
    });
    let options = options(&vessel.url, &no_codes())
        .token_file(&token_file)
        .serve(serve);

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        peer.send(json!({"type": "device:revoked", "capability": "strobe"}))
            .await;
        peer.send(json!({"type": "device:revoked"})).await;
        peer.close(4007, "unpaired by the person").await;
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    let error = result.unwrap_err();
    assert!(matches!(error, ClientError::Unpaired), "{error:?}");
    assert!(error.to_string().contains("unpaired"), "{error}");
    assert!(!token_file.exists());
    assert_eq!(*revoked.lock().unwrap(), [Some("strobe".to_owned()), None]);
}

#[tokio::test]
async fn a_token_file_holding_something_else_is_neither_sent_nor_removed() {
    let vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("profile");
    let text = "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n";
    write_file(&token_file, text);
    let device = Lamp::new().device();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);
    match within(
        "the client",
        run_client(&device, options, future::pending()),
    )
    .await
    {
        Err(ClientError::TokenFile { path, source }) => {
            assert_eq!(path, token_file);
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidData);
        }
        other => panic!("expected TokenFile, got {other:?}"),
    }
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), text);
}

#[tokio::test]
async fn a_token_the_vessel_sends_that_cannot_be_kept_stops_the_client() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    let device = Lamp::new().device();
    let options = options(&vessel.url, &no_codes()).token_file(&token_file);

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:paired", "deviceToken": "two\nlines"}))
            .await;
        assert_eq!(peer.closed_by_device().await.map(|c| c.0), Some(1011));
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    assert!(
        matches!(result, Err(ClientError::Protocol(_))),
        "{result:?}"
    );
    assert!(!token_file.exists());
}

// ---------------------------------------------------------------- serving

#[tokio::test]
async fn strange_vessel_frames_are_ignored_and_the_next_call_is_answered() {
    let mut vessel = TestVessel::bind().await;
    let dir = TempDir::new();
    let token_file = dir.join("desk-lamp.token");
    write_file(&token_file, TOKEN);
    let device = Lamp::new().device();
    let mut options = options(&vessel.url, &no_codes()).token_file(&token_file);
    let (stop, stopped) = shutdown();

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let strange = [
            Message::text("not json"),
            Message::text(deep),
            Message::text(r#"{"type":"device:launch","missiles":true}"#),
            Message::text(r#"{"type":"device:invoke","callId":7}"#),
            Message::text(r#"{"type":"device:error","error":"frames are JSON text \u001b[31m"}"#),
            Message::text(r#"{"type":"device:hello","manifest":{}}"#),
            Message::text("[]"),
            Message::binary(vec![0xff, 0x00, 0x7b]),
            Message::Ping(b"are you there".to_vec().into()),
            Message::Pong(Vec::new().into()),
        ];
        for message in strange {
            peer.send_raw(message).await;
        }
        peer.invoke("c1", "read_light", json!({})).await;
        check_result(
            &peer.recv().await,
            "c1",
            json!({"on": false, "brightness": 0}),
        );
        stop.send(()).unwrap();
        peer.closed_by_device().await;
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
}

#[tokio::test]
async fn pings_are_answered_while_serving() {
    let mut vessel = TestVessel::bind().await;
    let device = Lamp::new().device();
    let mut options = options(&vessel.url, &no_codes());
    let (stop, stopped) = shutdown();

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        peer.send_raw(Message::Ping(b"p1".to_vec().into())).await;
        let pong = loop {
            match within("a pong", peer.ws.next()).await {
                Some(Ok(Message::Pong(data))) => break data,
                Some(Ok(_)) => {}
                other => panic!("expected a pong, got {other:?}"),
            }
        };
        assert_eq!(&pong[..], b"p1");
        stop.send(()).unwrap();
        peer.closed_by_device().await;
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
}

#[tokio::test]
async fn calls_run_concurrently_and_each_is_reported() {
    let mut vessel = TestVessel::bind().await;
    let device = Lamp::new().device();
    let invoked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&invoked);
    let serve = ServeOptions::new().on_notice(move |notice| {
        if let Notice::Invoked { capability, .. } = notice {
            seen.lock().unwrap().push(capability);
        }
    });
    let mut options = options(&vessel.url, &no_codes()).serve(serve);
    let (stop, stopped) = shutdown();

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        peer.invoke("a", "strobe", json!({})).await;
        peer.invoke("b", "nope", json!({})).await;
        peer.invoke("c", "read_light", json!({})).await;
        let mut answers = Vec::new();
        for _ in 0..3 {
            let frame = peer.recv().await;
            answers.push((
                frame["callId"].as_str().unwrap().to_owned(),
                frame["ok"].clone(),
            ));
        }
        answers.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            answers,
            [
                ("a".to_owned(), json!(true)),
                ("b".to_owned(), json!(false)),
                ("c".to_owned(), json!(true)),
            ]
        );
        stop.send(()).unwrap();
        peer.closed_by_device().await;
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
    let mut invoked = invoked.lock().unwrap().clone();
    invoked.sort();
    assert_eq!(invoked, ["read_light", "strobe"]);
}

#[tokio::test]
async fn events_go_out_on_every_connection() {
    let mut vessel = TestVessel::bind().await;
    let thermostat = Thermostat::new();
    let device = thermostat.device();
    let (events, receiver) = device.events(8);
    let mut options = options(&vessel.url, &no_codes()).serve(ServeOptions::new().events(receiver));

    // First connection: an event goes out, then the vessel closes.
    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        events
            .emit("read_temperature", json!({"current": 20}))
            .await
            .unwrap();
        assert_eq!(
            peer.recv().await,
            json!({"type": "device:event", "capability": "read_temperature",
                   "data": {"current": 20}})
        );
        peer.close(1001, "going away").await;
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    assert_eq!(
        end.unwrap(),
        SessionEnd::Closed {
            code: 1001,
            reason: "going away".to_owned()
        }
    );

    // An event queued between connections goes out on the next one.
    events
        .emit("read_temperature", json!({"current": 21}))
        .await
        .unwrap();
    let (stop, stopped) = shutdown();
    let script = async {
        let mut peer = vessel.accept().await;
        assert_eq!(peer.recv().await["type"], "device:auth");
        assert_eq!(peer.recv().await["data"], json!({"current": 21}));
        stop.send(()).unwrap();
        peer.closed_by_device().await;
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
}

#[tokio::test]
async fn a_dropped_connection_is_lost_and_a_close_without_code_is_1005() {
    let mut vessel = TestVessel::bind().await;
    let device = Lamp::new().device();
    let mut options = options(&vessel.url, &no_codes());

    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        peer.invoke("c1", "read_light", json!({})).await;
        peer.recv().await;
        drop(peer);
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    assert_eq!(end.unwrap(), SessionEnd::Lost);

    let script = async {
        let mut peer = vessel.accept().await;
        assert_eq!(peer.recv().await["type"], "device:auth");
        peer.send_raw(Message::Close(None)).await;
        while let Some(Ok(_)) = within("the device's close", peer.ws.next()).await {}
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    assert_eq!(
        end.unwrap(),
        SessionEnd::Closed {
            code: 1005,
            reason: String::new()
        }
    );
}

#[tokio::test]
async fn a_close_reason_is_made_printable() {
    let mut vessel = TestVessel::bind().await;
    let device = Lamp::new().device();
    let mut options = options(&vessel.url, &no_codes());
    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.close(4001, "no\u{1b}[2J \u{202e}way").await;
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    match end {
        Err(ClientError::PairingRefused(reason)) => {
            assert_eq!(reason, "no\\u{1b}[2J \\u{202e}way");
        }
        other => panic!("expected PairingRefused, got {other:?}"),
    }
}

#[test]
fn outside_a_runtime_it_is_an_error_not_a_panic() {
    let device = Lamp::new().device();
    let mut options = ClientOptions::new("ws://127.0.0.1:1/device");
    let end = futures::executor::block_on(connect_once(&device, &mut options, future::pending()));
    assert!(matches!(end, Err(ClientError::NoRuntime)), "{end:?}");
}

// ---------------------------------------------------------------- pieces

#[test]
fn full_jitter_stays_under_a_doubling_capped_ceiling() {
    let initial = Duration::from_millis(500);
    let max = Duration::from_secs(30);
    for (doublings, ceiling) in [(0, 500), (1, 1000), (3, 4000), (6, 30_000), (40, 30_000)] {
        for _ in 0..50 {
            let delay = full_jitter(initial, max, doublings);
            assert!(
                delay <= Duration::from_millis(ceiling),
                "{doublings}: {delay:?}"
            );
        }
    }
    assert_eq!(full_jitter(Duration::ZERO, max, 5), Duration::ZERO);
}

#[test]
fn options_show_no_token() {
    let mut options = ClientOptions::new("ws://127.0.0.1:7777/device")
        .v1()
        .max_attempts(0);
    options.remembered = Some(TOKEN.to_owned());
    let shown = format!("{options:?}");
    assert!(!shown.contains(TOKEN), "{shown}");
    assert_eq!(options.max_attempts, Some(1), "at least one attempt");
    assert_eq!(options.url(), "ws://127.0.0.1:7777/device");
}

#[test]
fn token_files_are_read_strictly() {
    let dir = TempDir::new();
    let path = dir.join("t");
    assert_eq!(read_token(&path).unwrap(), None, "missing");
    for (text, expected) in [
        ("", None),
        ("  \n", None),
        (TOKEN, Some(TOKEN)),
        (&format!("{TOKEN}\n") as &str, Some(TOKEN)),
        (&format!("{TOKEN}\r\n") as &str, Some(TOKEN)),
    ] {
        write_file(&path, text);
        assert_eq!(read_token(&path).unwrap().as_deref(), expected, "{text:?}");
    }
    for text in ["two words", "a\nb", "caf\u{e9}", &"a".repeat(2000)] {
        write_file(&path, text);
        let error = read_token(&path).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData, "{text:?}");
    }
    std::fs::write(&path, [0xff, 0xfe]).unwrap();
    assert!(read_token(&path).is_err());
}

#[test]
fn writing_a_token_replaces_the_file_whole() {
    let dir = TempDir::new();
    let path = dir.join("a/b/device.token");
    write_token(&path, TOKEN).unwrap();
    write_token(&path, OTHER_TOKEN).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{OTHER_TOKEN}\n")
    );
    #[cfg(unix)]
    {
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.join("a/b")), 0o700);
    }
    let error = write_token(Path::new("/"), TOKEN).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn printable_escapes_and_cuts() {
    assert_eq!(printable("plain text"), "plain text");
    assert_eq!(printable("a\u{1b}b\u{200b}"), "a\\u{1b}b\\u{200b}");
    let long = printable(&"x".repeat(500));
    assert_eq!(long.chars().count(), 201);
    assert!(long.ends_with('…'));
}

/// The message of a `device:error` frame, made printable, as the client
/// logs it.
fn vessel_error(text: &str) -> Option<String> {
    match dk_proto::VesselFrame::parse(text.as_bytes()) {
        Ok(dk_proto::VesselFrame::Error { error }) => Some(printable(&error)),
        _ => None,
    }
}

#[test]
fn vessel_error_frames_are_recognised() {
    assert_eq!(
        vessel_error(r#"{"type":"device:error","error":"frames are JSON text"}"#).as_deref(),
        Some("frames are JSON text")
    );
    assert_eq!(
        vessel_error(r#"{"type":"device:error"}"#).as_deref(),
        Some("")
    );
    assert_eq!(
        vessel_error(r#"{"type":"device:invoke","note":"device:error"}"#),
        None
    );
    assert_eq!(vessel_error("device:error"), None);
    assert_eq!(
        vessel_error(r#"{"type":"device:pairing","code":"123456"}"#),
        None
    );
}

// ---------------------------------------------------------------- streams

impl Peer {
    /// The next message that is not a ping or pong.
    async fn recv_any(&mut self) -> Message {
        loop {
            match within("a message from the device", self.ws.next()).await {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(message)) => return message,
                other => panic!("expected a message, got {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn chunks_go_out_only_once_admitted_and_within_the_cap() {
    let mut vessel = TestVessel::bind().await;
    let voice = crate::samples::Voice::new();
    let device = voice.device();
    let (chunks, outbox) = crate::stream_channel(8);
    let mut options = options(&vessel.url, &no_codes()).streams(outbox);
    // Queued before the connection, as a microphone would.
    chunks.try_send("microphone", vec![1; 3]).unwrap();
    chunks.try_send("microphone", vec![2; 5]).unwrap();
    chunks.try_send("microphone", vec![3; 4]).unwrap();
    let (stop, stopped) = shutdown();
    let script = async {
        let mut peer = vessel.accept().await;
        assert_eq!(peer.recv().await["type"], "device:hello");
        peer.send(json!({"type": "device:paired", "deviceToken": TOKEN}))
            .await;
        // Not admitted yet: the answer to a call comes, no chunk before it.
        peer.invoke("c1", "read_status", json!({})).await;
        let Message::Text(text) = peer.recv_any().await else {
            panic!("a chunk was sent before the vessel admitted the device")
        };
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap()["callId"],
            "c1"
        );
        let admitted = dk_proto::StreamingFrame {
            kind: "voice".to_owned(),
            max_chunk_bytes: 4,
            max_concurrent_sessions: 1,
        };
        peer.send_raw(Message::text(admitted.to_json())).await;
        // seq 0 (3 bytes) and seq 2 (4 bytes, the cap); seq 1 is over it.
        for (seq, payload) in [(0u64, vec![1u8; 3]), (2, vec![3; 4])] {
            let Message::Binary(bytes) = peer.recv_any().await else {
                panic!("expected a chunk")
            };
            let chunk = dk_proto::StreamChunk::parse(&bytes).unwrap();
            assert_eq!(chunk.stream, "microphone");
            assert_eq!(chunk.seq, seq);
            assert_eq!(chunk.payload, payload.as_slice());
        }
        // A drop report from the vessel is logged, not handed to the serve loop.
        let report = dk_proto::StreamDroppedFrame {
            stream: "microphone".to_owned(),
            seq: 9,
            accepted: false,
            bytes: 9,
            marker: "dropped_oversize".to_owned(),
        };
        peer.send_raw(Message::text(report.to_json())).await;
        chunks.try_send("microphone", vec![4; 1]).unwrap();
        let Message::Binary(bytes) = peer.recv_any().await else {
            panic!("expected a chunk")
        };
        assert_eq!(dk_proto::StreamChunk::parse(&bytes).unwrap().seq, 3);
        stop.send(()).unwrap();
        peer.closed_by_device().await;
    };
    let (end, ()) = both(connect_once(&device, &mut options, stopped), script).await;
    assert_eq!(end.unwrap(), SessionEnd::Shutdown);
    assert_eq!(chunks.dropped(), 1);
}

#[tokio::test]
async fn an_admission_refusal_stops_the_client_unless_it_is_the_session_cap() {
    let mut vessel = TestVessel::bind().await;
    let device = crate::samples::Voice::new().device();
    let mut options = options(&vessel.url, &no_codes());
    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.close(
            4011,
            "ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1",
        )
        .await;
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    assert_eq!(
        end.unwrap(),
        SessionEnd::Closed {
            code: 4011,
            reason: "ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1".to_owned()
        }
    );
    let script = async {
        let mut peer = vessel.accept().await;
        peer.recv().await;
        peer.close(
            4011,
            "ERR_PRISM_DEVICE_DISABLED: voice device is disabled by default",
        )
        .await;
    };
    let (end, ()) = both(
        connect_once(&device, &mut options, future::pending()),
        script,
    )
    .await;
    match end {
        Err(ClientError::AdmissionRefused(reason)) => {
            assert_eq!(
                reason,
                "ERR_PRISM_DEVICE_DISABLED: voice device is disabled by default"
            );
        }
        other => panic!("expected AdmissionRefused, got {other:?}"),
    }
}

// ---------------------------------------------------------- several addresses

/// A first address where nothing listens: the client moves on to the next
/// at once (a backoff of an hour would otherwise hold it), and when that
/// connection is lost, on again to the first, which is up by then.
#[tokio::test]
async fn a_failed_address_moves_the_client_on_to_the_next_at_once() {
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone_addr = gone.local_addr().unwrap();
    drop(gone);
    let mut second = TestVessel::bind().await;
    let moves = Arc::new(Mutex::new(Vec::new()));
    let heard = Arc::clone(&moves);
    let options = ClientOptions::new(format!("ws://{gone_addr}/device"))
        .v1()
        .also_at(second.url.clone())
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .max_attempts(3)
        .on_connection(move |event| {
            if let ConnectionEvent::Disconnected { retry_in, .. } = event {
                heard.lock().unwrap().push(*retry_in);
            }
        });
    assert_eq!(options.addresses(), 2);
    let device = Lamp::new().device();
    let script = async {
        let mut peer = second.accept().await;
        assert_eq!(peer.recv().await["type"], "device:hello");
        drop(peer);
        // The first address comes back: the client, moved on from the
        // second, finds it there.
        let mut first = TestVessel {
            listener: TcpListener::bind(gone_addr).await.unwrap(),
            url: String::new(),
            accepted: 0,
        };
        let mut peer = first.accept().await;
        assert_eq!(peer.recv().await["type"], "device:hello");
        drop(peer);
    };
    let (result, ()) = both(run_client(&device, options, future::pending()), script).await;
    // Three attempts, none waiting its hour-long backoff: each lost
    // connection moved the client on at once.
    match result {
        Err(ClientError::GaveUp { attempts, .. }) => assert_eq!(attempts, 3),
        other => panic!("expected GaveUp, got {other:?}"),
    }
    let moves = moves.lock().unwrap().clone();
    assert!(
        moves.iter().all(|wait| *wait == Duration::ZERO),
        "{moves:?}"
    );
}

#[tokio::test]
async fn an_address_that_cannot_be_used_is_refused_before_any_connection() {
    let vessel = TestVessel::bind().await;
    let options = options(&vessel.url, &no_codes()).also_at("ftp://example.invalid/device");
    let device = Lamp::new().device();
    let result = within(
        "the client",
        run_client(&device, options, future::pending()),
    )
    .await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(vessel.accepted, 0);
}

/// Every address failing in a row: the client waits its backoff before
/// the next round (here an hour: it stops on shutdown with no further
/// attempt).
#[tokio::test]
async fn when_every_address_failed_in_a_row_the_client_waits_its_backoff() {
    let mut dead = Vec::new();
    for _ in 0..3 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        dead.push(format!("ws://{}/device", listener.local_addr().unwrap()));
    }
    // Each wait the client announces, as they come.
    let (heard, mut waits) = tokio::sync::watch::channel(Vec::new());
    let [first, second, third] = <[String; 3]>::try_from(dead).unwrap();
    let options = ClientOptions::new(first)
        .v1()
        .also_at(second)
        .also_at(third)
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .on_connection(move |event| {
            if let ConnectionEvent::Disconnected { retry_in, .. } = event {
                heard.send_modify(|waits| waits.push(*retry_in));
            }
        });
    let device = Lamp::new().device();
    let (stop, stopped) = shutdown();
    let client = tokio::spawn(async move { run_client(&device, options, stopped).await });
    // The listeners are closed already: each address refuses at once.
    within("three refusals", waits.wait_for(|w| w.len() >= 3))
        .await
        .unwrap();
    // A fourth attempt, which the back-off must hold off, is given 100 ms
    // to come (the count below says it did not).
    let _ =
        tokio::time::timeout(Duration::from_millis(100), waits.wait_for(|w| w.len() >= 4)).await;
    let _ = stop.send(());
    assert!(within("the client", client).await.unwrap().is_ok());
    let waits = waits.borrow().clone();
    assert_eq!(waits.len(), 3, "{waits:?}");
    assert_eq!(&waits[..2], [Duration::ZERO, Duration::ZERO]);
    assert!(waits[2] > Duration::ZERO, "{waits:?}");
}
