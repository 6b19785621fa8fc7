//! The MQTT bridge, measured from outside (`cargo xtask bench bridge`, or
//! `cargo bench -p dk --bench bridge`), against Debian's mosquitto on a
//! free loopback port and a real vessel in this process:
//!
//! - `bridge/broker_round_trip` and `bridge/call_through_bridge`: a light's
//!   `set` published and its state seen back, by a bare MQTT client and by
//!   an agent's call through the vessel, dk/2 and the bridge (the `dk
//!   bridge mqtt` process), in alternating blocks; `bridge/added` is the
//!   difference of their medians.
//! - `bridge/mcp_call_to_confirmed` and `bridge/broker_round_trip_50`: 50
//!   MCP `tools/call`s of the light by an agent (HTTP on one kept-alive
//!   connection to the vessel's MCP listener, each answered once the
//!   light's state confirms it), one by one with 50 bare publish-to-state
//!   round trips in the same run, and the median of each.
//! - `bridge/500_entities`: the resident memory of the `dk bridge mqtt`
//!   process serving 500 mapped devices (one entity each) and the light,
//!   every one paired and connected.
//!
//! Times are reported, never asserted on.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{BoxError, Killed, median};

use dk_core::adapter::CallContext;
use dk_core::person::Prompt;
use dk_core::registry::ConsentDecision;
use dk_http::serve_devices;
use dk_policy::PolicySet;
use dk_vessel::{Limits, Vessel};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

const ENTITIES: usize = 500;
const BLOCKS: usize = 20;
const BLOCK: usize = 25;
const PATIENCE: Duration = Duration::from_secs(180);
/// MCP calls measured, each beside a bare round trip.
const MCP_CALLS: usize = 50;

fn main() -> Result<(), BoxError> {
    common::main("bridge", run)
}

fn free_port() -> Result<u16, BoxError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// An MCP client of the vessel over one kept-alive HTTP/1.1 connection,
/// as an agent's host holds it.
struct Mcp {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
    credential: String,
    session: Option<String>,
    next_id: u64,
}

impl Mcp {
    async fn connect(addr: SocketAddr, credential: String) -> Result<Mcp, BoxError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut mcp = Mcp {
            sender,
            host: addr.to_string(),
            credential,
            session: None,
            next_id: 1,
        };
        mcp.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bridge-bench", "version": "1"}}),
        )
        .await?;
        mcp.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(mcp)
    }

    /// A JSON-RPC request; its answer's `result`.
    async fn request(&mut self, method: &str, params: Value) -> Result<Value, BoxError> {
        let id = self.next_id;
        self.next_id += 1;
        let answer = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?
            .ok_or("no answer")?;
        answer
            .get("result")
            .cloned()
            .ok_or_else(|| format!("an error: {answer}").into())
    }

    async fn post(&mut self, body: Value) -> Result<Option<Value>, BoxError> {
        let mut request = hyper::Request::post("/mcp")
            .header("host", &self.host)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {}", self.credential))
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        self.sender.ready().await?;
        let response = self
            .sender
            .send_request(request.body(Full::new(Bytes::from(body.to_string())))?)
            .await?;
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str()?.to_owned());
        }
        let bytes = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        Ok(text
            .lines()
            .map(|l| l.strip_prefix("data: ").unwrap_or(l))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v.get("id").is_some()))
    }
}

/// The light: merges `set` into its state and publishes it (not retained,
/// so each round trip waits for a fresh one).
fn light(port: u16) {
    let options = MqttOptions::new("bench-light", "127.0.0.1", port);
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    tokio::spawn(async move {
        let mut state = json!({"state": "OFF"});
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.subscribe("bench/lamp/set", QoS::AtMostOnce).await;
                    let _ = client
                        .publish("bench/lamp", QoS::AtMostOnce, true, state.to_string())
                        .await;
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    if let Ok(Value::Object(change)) = serde_json::from_slice(&publish.payload) {
                        if let Value::Object(fields) = &mut state {
                            fields.extend(change);
                        }
                        let _ = client
                            .publish("bench/lamp", QoS::AtMostOnce, false, state.to_string())
                            .await;
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
}

async fn run() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n"
        ),
    )?;
    let _broker = Killed(
        Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).is_err() {
        if Instant::now() > deadline {
            return Err("mosquitto did not listen".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    light(port);

    // A vessel that lets 501 devices pair from one address.
    let limits = Limits {
        max_connections: 4096,
        max_connections_per_address: 4096,
        max_unauthenticated_per_address: 1024,
        max_pending_pairings: 1024,
        max_pending_pairings_per_address: 1024,
        pairings_per_minute_per_address: 100_000,
        // Latency is measured here, not the rate limit.
        rate_limits: None,
        ..Limits::default()
    };
    let vessel = Vessel::new(PolicySet::empty(), limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let device_url = format!("ws://{}/device", listener.local_addr()?);
    tokio::spawn(serve_devices(
        listener,
        Arc::clone(&vessel),
        std::future::pending(),
    ));
    let approver = {
        let vessel = Arc::clone(&vessel);
        tokio::spawn(async move {
            loop {
                for prompt in vessel.person().pending() {
                    if let Prompt::Consent(request) = prompt.prompt {
                        let all: Vec<String> = request
                            .capabilities
                            .iter()
                            .map(|c| c.name.clone())
                            .collect();
                        let _ = vessel
                            .person()
                            .answer_consent(prompt.id, ConsentDecision::approve(all));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let mut config = String::from(
        "[broker]\nconfirmTimeoutMs = 5000\n\n[[device]]\nid = \"bench-lamp\"\nname = \"Lamp\"\nkind = \"light\"\nstateTopic = \"bench/lamp\"\n\n[[device.actuator]]\nname = \"set_light\"\ndescription = \"Switch it.\"\ncommandTopic = \"bench/lamp/set\"\npayload = { state = \"{state}\" }\nparams = { state = { type = \"string\", required = true } }\n",
    );
    for n in 0..ENTITIES {
        config.push_str(&format!(
            "\n[[device]]\nid = \"sensor-{n:03}\"\nname = \"Sensor {n}\"\nkind = \"sensor\"\nstateTopic = \"bench/sensor/{n}\"\n\n[[device.sensor]]\nname = \"read\"\ndescription = \"Read it.\"\npath = \"value\"\n"
        ));
    }
    let config_file = dir.path().join("bridge.toml");
    std::fs::write(&config_file, config)?;
    let bridge = Killed(
        Command::new(env!("CARGO_BIN_EXE_dk"))
            .args(["bridge", "mqtt", "--broker"])
            .arg(format!("mqtt://127.0.0.1:{port}"))
            .arg("--config")
            .arg(&config_file)
            .args(["--vessel", &device_url])
            .current_dir(dir.path())
            .env("DK_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let started = Instant::now();
    loop {
        let paired = vessel.registry().list();
        let connected = paired
            .iter()
            .filter(|d| vessel.links().is_connected(d.device.manifest().id()))
            .count();
        if connected == ENTITIES + 1 {
            break;
        }
        if started.elapsed() > PATIENCE {
            return Err(format!("only {connected} of {} devices connected", ENTITIES + 1).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "bridge: {} devices paired and connected in {:.1} s",
        ENTITIES + 1,
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.0.id()))?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS")?;
    println!(
        "bridge/500_entities                 rss {:.1} MiB ({} devices, one entity each, and the light)",
        rss_kib as f64 / 1024.0,
        ENTITIES
    );
    approver.abort();

    // The broker's own round trip, by a bare client.
    let options = MqttOptions::new("bench-client", "127.0.0.1", port);
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    if let Ok(value) = serde_json::from_slice::<Value>(&publish.payload) {
                        let _ = seen_tx.send(value);
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    client.subscribe("bench/lamp", QoS::AtMostOnce).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    while seen_rx.try_recv().is_ok() {}

    let mut direct = Vec::new();
    let mut bridged = Vec::new();
    let mut on = false;
    for block in 0..BLOCKS * 2 {
        for _ in 0..BLOCK {
            on = !on;
            let state = if on { "ON" } else { "OFF" };
            let begun = Instant::now();
            if block % 2 == 0 {
                client
                    .publish(
                        "bench/lamp/set",
                        QoS::AtMostOnce,
                        false,
                        json!({"state": state}).to_string(),
                    )
                    .await?;
                loop {
                    let seen = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv())
                        .await?
                        .ok_or("no state")?;
                    if seen.get("state").and_then(Value::as_str) == Some(state) {
                        break;
                    }
                }
                direct.push(begun.elapsed());
            } else {
                let outcome = vessel
                    .adapter()
                    .execute(
                        "device__bench_lamp__set_light",
                        json!({"state": state}),
                        CallContext::default(),
                    )
                    .await;
                let outcome = serde_json::to_value(outcome)?;
                if outcome.get("ok") != Some(&json!(true)) {
                    return Err(format!("the call failed: {outcome}").into());
                }
                bridged.push(begun.elapsed());
                while seen_rx.try_recv().is_ok() {}
            }
        }
    }
    let (direct, bridged) = (median(direct), median(bridged));
    println!(
        "bridge/broker_round_trip            median {:>10}",
        us(direct)
    );
    println!(
        "bridge/call_through_bridge          median {:>10}",
        us(bridged)
    );
    println!(
        "bridge/added                        median {:>10}   (budget 2 ms)",
        us(bridged.saturating_sub(direct))
    );

    // An agent over MCP: call to state confirmed, beside the broker's own
    // round trip, one of each in turn.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let mcp_addr = listener.local_addr()?;
    tokio::spawn(dk_mcp::serve_mcp(
        listener,
        Arc::clone(&vessel),
        Arc::clone(vessel.agents()),
        std::future::pending(),
    ));
    let scope = dk_core::agents::AgentScope::from_items(["bench-lamp"])?;
    let (_, credential) = vessel.add_agent("bench", scope, dk_core::agents::AgentRole::User)?;
    let mut agent = Mcp::connect(mcp_addr, credential.expose().to_owned()).await?;
    let (mut over_mcp, mut beside) = (Vec::new(), Vec::new());
    for _ in 0..MCP_CALLS {
        on = !on;
        let state = if on { "ON" } else { "OFF" };
        let begun = Instant::now();
        client
            .publish(
                "bench/lamp/set",
                QoS::AtMostOnce,
                false,
                json!({"state": state}).to_string(),
            )
            .await?;
        loop {
            let seen = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv())
                .await?
                .ok_or("no state")?;
            if seen.get("state").and_then(Value::as_str) == Some(state) {
                break;
            }
        }
        beside.push(begun.elapsed());

        on = !on;
        let state = if on { "ON" } else { "OFF" };
        let begun = Instant::now();
        let result = agent
            .request(
                "tools/call",
                json!({"name": "device__bench_lamp__set_light", "arguments": {"state": state}}),
            )
            .await?;
        over_mcp.push(begun.elapsed());
        if result.get("isError") != Some(&json!(false))
            || result.pointer("/structuredContent/state") != Some(&json!(state))
        {
            return Err(format!("the MCP call was not confirmed: {result}").into());
        }
        while seen_rx.try_recv().is_ok() {}
    }
    println!(
        "bridge/mcp_call_to_confirmed        median {:>10}   ({MCP_CALLS} MCP tools/call, each answered once the state confirms)",
        us(median(over_mcp))
    );
    println!(
        "bridge/broker_round_trip_50         median {:>10}   ({MCP_CALLS} bare publish-to-state round trips, in turn with those calls)",
        us(median(beside))
    );
    drop(bridge);
    Ok(())
}
