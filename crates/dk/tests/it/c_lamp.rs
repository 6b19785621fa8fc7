//! The C lamp (`examples/c/lamp.c` on `libdk_device.a`, built by
//! `cargo xtask firmware`) against a real `dk vessel`: the code it prints
//! is the vessel's prompt, an agent's `set_light` over MCP reaches its C
//! handler and the result comes back, restarted it reconnects by key with
//! no prompt, and pointed at another vessel it stops before saying
//! anything. The same again under valgrind, which must find no error and
//! no leak. Against a vessel that never answers the handshake it closes
//! each socket at the deadline and connects again; against a vessel killed
//! and started again it keeps trying and comes back by key. An HTTP 403 at
//! the upgrade stops it only while it is not paired: once paired over dk/2
//! it is a forgeable answer from outside the channel and the lamp connects
//! again.
//!
//! Without libwebsockets' development files or valgrind the tests say so
//! and pass, unless `DK_REQUIRE_PEERS` is set (CI sets it, after
//! `cargo xtask peers` installed them).

use std::path::{Path, PathBuf};

use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::agents::{start, start_with};
use crate::c_device::{CDevice as Lamp, VALGRIND, libwebsockets_or_skip, stats, valgrind_or_skip};
use crate::mcp_bridge::{Bridge, initialize};
use crate::process::{
    Scratch, approve_when_asked, consent_id, devices, eventually, wait_connected,
};

/// The C lamp run through `runner` (nothing, or valgrind), its standard
/// error to `stderr`.
fn start_lamp(
    runner: &[&str],
    url: &str,
    credentials: &Path,
    stats: &Path,
    stderr: PathBuf,
) -> Lamp {
    start_lamp_with(runner, url, credentials, stats, stderr, &[])
}

/// [`start_lamp`] with more arguments.
fn start_lamp_with(
    runner: &[&str],
    url: &str,
    credentials: &Path,
    stats: &Path,
    stderr: PathBuf,
    extra: &[&str],
) -> Lamp {
    Lamp::start("lamp", runner, url, credentials, stats, stderr, extra)
}

async fn connected(admin: &dk_http::AdminClient) {
    wait_connected(admin, "desk-lamp").await;
}

/// The whole story, the lamp run through `runner` (nothing, or valgrind).
async fn scenario(runner: &[&str]) {
    let scratch = Scratch::new("c-lamp");
    let (vessel, _) = start(&scratch);
    let admin = vessel.admin(&scratch);
    let credentials = scratch.root().join("desk-lamp.dk2");
    let stats_file = scratch.root().join("lamp.stats");
    let err = |n: u32| scratch.root().join(format!("lamp-{n}.err"));

    // Pairing: the code the lamp prints is the prompt's.
    let lamp = start_lamp(runner, &vessel.url(), &credentials, &stats_file, err(1));
    let code = lamp.wait_for("pairing code: ");
    let id = eventually("the lamp's pairing request", || {
        consent_id(&admin, "desk-lamp")
    })
    .await;
    let pending = admin.get("/v1/pending").await.unwrap().body;
    let prompt = pending
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap();
    assert_eq!(prompt["request"]["code"], code.as_str(), "{prompt}");
    assert_eq!(prompt["request"]["channel"], "dk/2", "{prompt}");
    approve_when_asked(&admin, "desk-lamp", &["set_light", "read_light"]).await;
    connected(&admin).await;
    assert_eq!(
        std::fs::metadata(&credentials).unwrap().len(),
        66,
        "the lamp keeps its 66 bytes of credentials"
    );

    // An agent's call over MCP reaches the C handler and comes back.
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "c-lamp", "scope": ["desk-lamp"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    let credential = added.body["credential"].as_str().unwrap().to_owned();
    let mut bridge = Bridge::over_socket(&scratch, Some(&credential));
    initialize(&mut bridge);
    let called = bridge.request(
        2,
        "tools/call",
        json!({"name": "device__desk_lamp__set_light", "arguments": {"on": true, "brightness": 37}}),
    );
    assert_ne!(called["result"]["isError"], true, "{called}");
    assert_eq!(
        called["result"]["structuredContent"],
        json!({"on": true, "brightness": 37}),
        "{called}"
    );
    assert_eq!(lamp.wait_for("light: "), "on 37");
    let read = bridge.request(
        3,
        "tools/call",
        json!({"name": "device__desk_lamp__read_light", "arguments": {}}),
    );
    assert_eq!(
        read["result"]["structuredContent"],
        json!({"on": true, "brightness": 37}),
        "{read}"
    );
    let (code, said) = lamp.terminate();
    assert_eq!(code, Some(0), "the lamp's exit on SIGTERM: {said}");
    let counted = stats(&stats_file);
    assert_eq!(counted["heap_at_exit_bytes"], 0, "{counted:?}");
    assert!(counted["pairing_peak_bytes"] > 0, "{counted:?}");

    // Restarted: by key, with no prompt.
    let lamp = start_lamp(runner, &vessel.url(), &credentials, &stats_file, err(2));
    connected(&admin).await;
    let answered = bridge.request(
        4,
        "tools/call",
        json!({"name": "device__desk_lamp__set_light", "arguments": {"on": false}}),
    );
    assert_ne!(answered["result"]["isError"], true, "{answered}");
    assert_eq!(lamp.wait_for("light: "), "off 0");
    assert_eq!(admin.get("/v1/pending").await.unwrap().body, json!([]));
    assert!(
        !lamp.printed().iter().any(|l| l.starts_with("pairing code")),
        "no pairing on a restart"
    );
    let (code, said) = lamp.terminate();
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = bridge.finish();
    assert_eq!(code, Some(0), "{said}");

    // Another vessel, another key: the lamp stops before saying anything.
    let other_scratch = Scratch::new("c-lamp-other");
    let (other, _) = start(&other_scratch);
    let other_admin = other.admin(&other_scratch);
    let lamp = start_lamp(runner, &other.url(), &credentials, &stats_file, err(3));
    let (code, said) = lamp.exit_code();
    assert_eq!(code, Some(3), "{said}");
    assert!(said.contains("the vessel's key changed"), "{said}");
    assert_eq!(
        other_admin.get("/v1/pending").await.unwrap().body,
        json!([])
    );
    assert_eq!(devices(&other_admin).await, Vec::<Value>::new());
    assert_eq!(
        std::fs::metadata(&credentials).unwrap().len(),
        66,
        "the credentials are kept"
    );
    drop(other);
    drop(vessel);
}

/// Whether the lamp can be built here; the skip is said out loud.
fn lamp_or_skip(test: &str) -> bool {
    libwebsockets_or_skip(test)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_lamp_pairs_serves_an_agent_reconnects_by_key_and_stops_at_another_vessel() {
    if !lamp_or_skip("c_lamp") {
        return;
    }
    scenario(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_lamp_under_valgrind_has_no_memory_error_and_no_leak() {
    if !lamp_or_skip("c_lamp under valgrind") {
        return;
    }
    if !valgrind_or_skip("c_lamp under valgrind") {
        return;
    }
    scenario(VALGRIND).await;
}

/// How many times the lamp said it could not reach the vessel.
fn unreachable(lamp: &Lamp) -> usize {
    lamp.complained().matches("cannot reach the vessel").count()
}

/// Takes the `dk.2` subprotocol the lamp asks for.
#[expect(
    clippy::result_large_err,
    reason = "the callback's type is tungstenite's, its error an HTTP response"
)]
fn dk2(_: &Request, mut response: Response) -> Result<Response, ErrorResponse> {
    response
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static("dk.2"));
    Ok(response)
}

/// A vessel that takes WebSocket connections with the `dk.2` subprotocol
/// and never answers the handshake: for each connection, whether the lamp
/// has closed it.
async fn silent_vessel() -> (String, Arc<Mutex<Vec<bool>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
    let held = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = Arc::clone(&held);
            tokio::spawn(async move {
                let Ok(mut socket) = tokio_tungstenite::accept_hdr_async(stream, dk2).await else {
                    return;
                };
                let at = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(false);
                    seen.len() - 1
                };
                // Message 1 comes and is never answered; then the lamp's
                // close, or the end of the stream.
                while let Some(Ok(message)) = socket.next().await {
                    if message.is_close() {
                        break;
                    }
                }
                seen.lock().unwrap()[at] = true;
            });
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_lamp_closes_a_handshake_past_its_deadline_and_connects_again() {
    if !lamp_or_skip("c_lamp and a silent vessel") {
        return;
    }
    let scratch = Scratch::new("c-lamp-silent");
    let (url, seen) = silent_vessel().await;
    let lamp = start_lamp_with(
        &[],
        &url,
        &scratch.root().join("desk-lamp.dk2"),
        &scratch.root().join("lamp.stats"),
        scratch.root().join("lamp.err"),
        &["--handshake-timeout-ms", "300"],
    );
    // Each handshake ends at its deadline with the lamp closing the socket,
    // and the lamp connects again.
    eventually(
        "three connections, the first two closed by the lamp",
        || async {
            let seen = seen.lock().unwrap();
            (seen.len() >= 3 && seen[0] && seen[1]).then_some(())
        },
    )
    .await;
    let said = lamp.complained();
    assert!(said.contains("no dk/2 handshake within 300 ms"), "{said}");
    let (code, said) = lamp.terminate();
    assert_eq!(code, Some(0), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_lamp_comes_back_to_a_vessel_killed_and_started_again() {
    if !lamp_or_skip("c_lamp and a vessel that restarts") {
        return;
    }
    let scratch = Scratch::new("c-lamp-restart");
    let (vessel, _) = start(&scratch);
    let admin = vessel.admin(&scratch);
    let credentials = scratch.root().join("desk-lamp.dk2");
    let stats_file = scratch.root().join("lamp.stats");
    let lamp = start_lamp(
        &[],
        &vessel.url(),
        &credentials,
        &stats_file,
        scratch.root().join("lamp.err"),
    );
    lamp.wait_for("pairing code: ");
    approve_when_asked(&admin, "desk-lamp", &["set_light", "read_light"]).await;
    connected(&admin).await;

    let listen = vessel.devices.to_string();
    vessel.kill();
    // The lamp keeps trying while the vessel is down...
    eventually("the lamp to try the stopped vessel twice", || async {
        (unreachable(&lamp) >= 2).then_some(())
    })
    .await;
    // ...and once it is up again on the same address, it is back by key.
    let (vessel, _) = start_with(&scratch, &["--listen", &listen]);
    let admin = vessel.admin(&scratch);
    connected(&admin).await;
    assert_eq!(admin.get("/v1/pending").await.unwrap().body, json!([]));
    let called = admin
        .post(
            "/v1/tools/call",
            &json!({"tool": "device__desk_lamp__set_light", "input": {"on": true, "brightness": 5}, "timeoutMs": 5000}),
        )
        .await
        .unwrap();
    assert_eq!(called.body["ok"], true, "{called:?}");
    assert_eq!(lamp.wait_for("light: "), "on 5");
    assert!(
        !lamp.printed().iter().any(|l| l.starts_with("pairing code")),
        "no pairing after the restart"
    );
    let (code, said) = lamp.terminate();
    assert_eq!(code, Some(0), "{said}");
    drop(vessel);
}

/// A "vessel" that answers every upgrade with HTTP 403, as anyone on the
/// path could: how many requests it refused.
async fn forbidding_vessel() -> (String, Arc<Mutex<usize>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let refused: Arc<Mutex<usize>> = Arc::default();
    let count = Arc::clone(&refused);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\nConnection: close\r\n\r\nforbidden",
                    )
                    .await;
                *count.lock().unwrap() += 1;
            });
        }
    });
    (url, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_before_the_channel_stops_an_unpaired_c_lamp_and_never_a_paired_one() {
    if !lamp_or_skip("c_lamp and a forbidding vessel") {
        return;
    }
    let scratch = Scratch::new("c-lamp-403");
    let (forbidding, refused) = forbidding_vessel().await;
    let credentials = scratch.root().join("desk-lamp.dk2");
    let stats = scratch.root().join("lamp.stats");

    // Not paired: the vessel's 403 is believed, and the lamp stops (3).
    let lamp = start_lamp(
        &[],
        &forbidding,
        &credentials,
        &stats,
        scratch.root().join("1.err"),
    );
    let (code, said) = lamp.exit_code();
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains("the vessel refused this device (HTTP 403)"),
        "{said}"
    );

    // Paired with a real vessel over dk/2, then pointed where every answer
    // is a 403: a forged refusal, which it does not believe; it keeps
    // connecting again after its backoff.
    let (vessel, _) = start(&scratch);
    let admin = vessel.admin(&scratch);
    let lamp = start_lamp(
        &[],
        &vessel.url(),
        &credentials,
        &stats,
        scratch.root().join("2.err"),
    );
    lamp.wait_for("pairing code: ");
    approve_when_asked(&admin, "desk-lamp", &["set_light"]).await;
    connected(&admin).await;
    let (code, said) = lamp.terminate();
    assert_eq!(code, Some(0), "{said}");
    let before = *refused.lock().unwrap();
    let lamp = start_lamp(
        &[],
        &forbidding,
        &credentials,
        &stats,
        scratch.root().join("3.err"),
    );
    eventually("three refusals the paired lamp did not believe", || async {
        (*refused.lock().unwrap() >= before + 3).then_some(())
    })
    .await;
    let said = lamp.complained();
    assert!(!said.contains("refused this device"), "{said}");
    let (code, said) = lamp.terminate();
    assert_eq!(code, Some(0), "{said}");
}
