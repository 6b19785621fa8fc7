//! The bridge against a real broker (Debian's mosquitto on a free loopback
//! port) and a real vessel: a light that publishes its state as
//! Zigbee2MQTT does (JSON, retained), paired and granted by the person,
//! switched by a call whose confirmation comes from the state topic;
//! hostile state payloads; the broker stopped mid-way and started again.

#![cfg(test)]

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dk_bridge_mqtt::{BridgeConfig, BrokerState, run_bridge};
use dk_core::adapter::CallContext;
use dk_core::person::Prompt;
use dk_core::registry::ConsentDecision;
use dk_http::serve_devices;
use dk_policy::PolicySet;
use dk_testkit::{PATIENCE, eventually, eventually_blocking};
use dk_vessel::{Limits, Vessel};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

/// A mosquitto on `port`, killed on drop.
struct Mosquitto {
    child: Child,
    /// Its loopback port.
    port: u16,
}

fn mosquitto_path() -> PathBuf {
    ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("mosquitto: `cargo xtask peers` installs Debian's package")
}

impl Mosquitto {
    fn start(dir: &std::path::Path) -> Mosquitto {
        Mosquitto::start_with(dir, "")
    }

    /// With more lines for its listener (TLS files), on a free port: one
    /// taken by another process between its choice and the broker's start
    /// makes the broker exit, and it starts again on another.
    fn start_with(dir: &std::path::Path, extra: &str) -> Mosquitto {
        for _ in 0..5 {
            let port = dk_testkit::free_port();
            let conf = dir.join("mosquitto.conf");
            std::fs::write(
                &conf,
                format!(
                    "listener {port} 127.0.0.1\n{extra}allow_anonymous true\npersistence false\n"
                ),
            )
            .unwrap();
            let mut child = Command::new(mosquitto_path())
                .arg("-c")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut exited = false;
            eventually_blocking("mosquitto listening or gone", || {
                exited = child.try_wait().unwrap().is_some();
                exited || TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).is_ok()
            });
            if !exited && child.try_wait().unwrap().is_none() {
                return Mosquitto { child, port };
            }
        }
        panic!("mosquitto found no free port in 5 attempts")
    }

    /// Started again in `dir` on `port`, the one it had.
    fn again(dir: &std::path::Path, port: u16) -> Mosquitto {
        let child = Command::new(mosquitto_path())
            .arg("-c")
            .arg(dir.join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        eventually_blocking("mosquitto listening again", || {
            TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).is_ok()
        });
        Mosquitto { child, port }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Zigbee2MQTT-style light: takes `{state, brightness}` on its `set`
/// topic and publishes its whole state, retained.
fn fake_light(port: u16) {
    fake_device(port, "lamp", json!({"state": "OFF", "brightness": 0}));
}

/// A Zigbee2MQTT-style device `zigbee2mqtt/<name>`: merges what comes on
/// its `set` topic into its state and publishes the whole state, retained.
fn fake_device(port: u16, name: &'static str, initial: Value) {
    let mut options = MqttOptions::new(format!("fake-{name}"), "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    fake_device_on(options, name, initial);
}

/// [`fake_device`] connected with `options`.
fn fake_device_on(options: MqttOptions, name: &'static str, initial: Value) {
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let state = Arc::new(Mutex::new(initial));
    let (state_topic, set_topic) = (
        format!("zigbee2mqtt/{name}"),
        format!("zigbee2mqtt/{name}/set"),
    );
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.subscribe(set_topic.clone(), QoS::AtLeastOnce).await;
                    let now = state.lock().unwrap().to_string();
                    let _ = client
                        .publish(state_topic.clone(), QoS::AtLeastOnce, true, now)
                        .await;
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    let Ok(Value::Object(change)) = serde_json::from_slice(&publish.payload) else {
                        continue;
                    };
                    let now = {
                        let mut state = state.lock().unwrap();
                        for (k, v) in change {
                            state[k] = v;
                        }
                        state.to_string()
                    };
                    let _ = client
                        .publish(state_topic.clone(), QoS::AtLeastOnce, true, now)
                        .await;
                }
                Ok(_) => {}
                // The broker is gone: the client's reconnects paced.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
}

/// Publishes `payload` once on `topic`.
async fn publish_once(port: u16, topic: &str, payload: Vec<u8>) {
    let mut options = MqttOptions::new("hostile", "127.0.0.1", port);
    options.set_max_packet_size(1024 * 1024, 1024 * 1024);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    client
        .publish(topic, QoS::AtLeastOnce, false, payload)
        .await
        .unwrap();
    let acked = async {
        while !matches!(
            eventloop.poll().await,
            Ok(Event::Incoming(Packet::PubAck(_)))
        ) {}
    };
    tokio::time::timeout(PATIENCE, acked)
        .await
        .expect("the broker acknowledged the message");
}

/// The light's mapping, shared with the crate's unit tests.
const CONFIG: &str = include_str!("../../../fixtures/bridge/zigbee2mqtt-light.toml");

async fn call(vessel: &Vessel, tool: &str, input: Value) -> Value {
    let ctx = CallContext {
        approver: Some(vessel.person().as_ref()),
        ..CallContext::default()
    };
    let outcome = vessel.adapter().execute(tool, input, ctx).await;
    serde_json::to_value(outcome).unwrap()
}

/// A vessel with `rules`, serving devices on loopback: it and its URL.
async fn vessel_with(rules: &str) -> (Arc<Vessel>, String) {
    let vessel = Vessel::new(PolicySet::from_yaml_str(rules).unwrap(), Limits::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    tokio::spawn(serve_devices(
        listener,
        Arc::clone(&vessel),
        std::future::pending(),
    ));
    (vessel, url)
}

/// Answers the next pairing, granting everything its device declares.
async fn pair_all(vessel: &Vessel) -> String {
    eventually("a pairing request", || {
        vessel
            .person()
            .pending()
            .iter()
            .any(|p| matches!(p.prompt, Prompt::Consent(_)))
    })
    .await;
    let prompt = vessel
        .person()
        .pending()
        .into_iter()
        .find(|p| matches!(p.prompt, Prompt::Consent(_)))
        .unwrap();
    let Prompt::Consent(request) = prompt.prompt else {
        unreachable!()
    };
    let all: Vec<String> = request
        .capabilities
        .iter()
        .map(|c| c.name.clone())
        .collect();
    vessel
        .person()
        .answer_consent(prompt.id, ConsentDecision::approve(all))
        .unwrap();
    eventually("connected", || {
        vessel.links().is_connected(&request.device_id)
    })
    .await;
    request.device_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_light_is_paired_switched_confirmed_and_survives_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    fake_light(port);

    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let device_url = format!("ws://{}/device", listener.local_addr().unwrap());
    tokio::spawn(serve_devices(
        listener,
        Arc::clone(&vessel),
        std::future::pending(),
    ));

    let mut config = BridgeConfig::parse(CONFIG).unwrap();
    config.device[0].key_file = Some(dir.path().join("light.key"));
    let codes = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let seen = Arc::clone(&codes);
    let state = Arc::new(BrokerState::default());
    let bridge = tokio::spawn(run_bridge(
        config,
        format!("mqtt://127.0.0.1:{port}"),
        None,
        device_url,
        Arc::new(move |id: &str, code: &str| {
            seen.lock().unwrap().push((id.to_owned(), code.to_owned()))
        }),
        Arc::clone(&state),
        std::future::pending(),
    ));

    // Nothing is exposed until the person pairs and grants.
    eventually("a pairing request", || {
        !vessel.person().pending().is_empty()
    })
    .await;
    let prompt = vessel.person().pending().remove(0);
    let Prompt::Consent(request) = prompt.prompt else {
        panic!("not a pairing")
    };
    assert_eq!(request.device_id, "living-room-light");
    // The bridge shows the code it computed, beside the vessel's prompt.
    eventually("the bridge shows a code", || {
        !codes.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(
        codes.lock().unwrap()[0].1,
        request.code,
        "the bridge shows the code"
    );
    assert!(vessel.adapter().tool_definitions().is_empty());
    vessel
        .person()
        .answer_consent(
            prompt.id,
            ConsentDecision::approve(["read_light", "set_light"]),
        )
        .unwrap();
    eventually("connected", || {
        vessel.links().is_connected("living-room-light")
    })
    .await;
    eventually("the retained state", || {
        state.state("zigbee2mqtt/lamp").is_some()
    })
    .await;

    let read = call(&vessel, "device__living_room_light__read_light", json!({})).await;
    assert_eq!(read, json!({"ok": true, "result": {"value": "OFF"}}));
    let set = call(
        &vessel,
        "device__living_room_light__set_light",
        json!({"state": "ON", "brightness": 200}),
    )
    .await;
    assert_eq!(set["ok"], json!(true), "{set}");
    assert_eq!(
        set["result"]["state"],
        json!("ON"),
        "confirmed by the state"
    );
    assert_eq!(set["result"]["brightness"], json!(200));

    // Hostile state payloads: not JSON, too large. Dropped and counted.
    publish_once(port, "zigbee2mqtt/lamp", b"{not json".to_vec()).await;
    publish_once(port, "zigbee2mqtt/lamp", vec![b' '; 300 * 1024]).await;
    eventually("two dropped", || {
        state.dropped.load(std::sync::atomic::Ordering::Relaxed) >= 2
    })
    .await;
    let read = call(&vessel, "device__living_room_light__read_light", json!({})).await;
    assert_eq!(read, json!({"ok": true, "result": {"value": "ON"}}));

    // The broker stops: a call fails at once, saying why.
    drop(broker);
    eventually("the bridge sees the broker go", || !state.is_connected()).await;
    let down = call(
        &vessel,
        "device__living_room_light__set_light",
        json!({"state": "OFF"}),
    )
    .await;
    assert_eq!(down["ok"], json!(false));
    let reason = down["reason"].as_str().unwrap();
    assert!(
        reason.contains("the MQTT broker is not reachable"),
        "{reason}"
    );

    // It comes back: the bridge reconnects, resubscribes, and works.
    let _broker = Mosquitto::again(dir.path(), port);
    eventually("reconnected", || state.is_connected()).await;
    let again = call(
        &vessel,
        "device__living_room_light__set_light",
        json!({"state": "OFF"}),
    )
    .await;
    assert_eq!(again["ok"], json!(true), "{again}");
    bridge.abort();
}

const LOCK_AND_THERMOSTAT: &str = r#"
[broker]
confirmTimeoutMs = 3000

[[device]]
id = "front-door"
name = "Front door"
kind = "lock"
stateTopic = "zigbee2mqtt/door"

[[device.sensor]]
name = "read_lock"
description = "Whether the door is locked."
path = "state"

[[device.actuator]]
name = "unlock"
description = "Unlock the front door."
commandTopic = "zigbee2mqtt/door/set"
payload = { state = "UNLOCK" }
confirm = true

[[device]]
id = "thermostat"
name = "Hall thermostat"
kind = "climate"
stateTopic = "zigbee2mqtt/thermostat"

[[device.actuator]]
name = "set_target"
description = "Set the target temperature."
commandTopic = "zigbee2mqtt/thermostat/set"
payload = { current_heating_setpoint = "{target}" }
params = { target = { type = "number", required = true } }
"#;

const THERMOSTAT_RULE: &str = r#"
version: 1
policies:
  - name: thermostat-range
    action: device_use
    condition: "deviceId equals thermostat and capability equals set_target and input.target > 25"
    decision: block
    message: "Keep the thermostat at 25 or below"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_unlock_waits_for_the_person_a_rule_holds_the_thermostat_and_a_flood_passes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    fake_device(port, "door", json!({"state": "LOCK"}));
    fake_device(
        port,
        "thermostat",
        json!({"current_heating_setpoint": 20, "local_temperature": 19.5}),
    );
    let (vessel, device_url) = vessel_with(THERMOSTAT_RULE).await;
    let mut config = BridgeConfig::parse(LOCK_AND_THERMOSTAT).unwrap();
    for device in &mut config.device {
        device.key_file = Some(dir.path().join(format!("{}.key", device.id)));
    }
    let state = Arc::new(BrokerState::default());
    let bridge = tokio::spawn(run_bridge(
        config,
        format!("mqtt://127.0.0.1:{port}"),
        None,
        device_url,
        Arc::new(|_: &str, _: &str| {}),
        Arc::clone(&state),
        std::future::pending(),
    ));
    let mut paired = vec![pair_all(&vessel).await, pair_all(&vessel).await];
    paired.sort();
    assert_eq!(paired, ["front-door", "thermostat"]);
    eventually("the retained states", || {
        state.state("zigbee2mqtt/door").is_some() && state.state("zigbee2mqtt/thermostat").is_some()
    })
    .await;

    // Unlock asks the person; nothing is published before the yes.
    let unlocking = {
        let vessel = Arc::clone(&vessel);
        tokio::spawn(async move { call(&vessel, "device__front_door__unlock", json!({})).await })
    };
    eventually("the person is asked", || {
        vessel
            .person()
            .pending()
            .iter()
            .any(|p| matches!(p.prompt, Prompt::Approval(_)))
    })
    .await;
    assert_eq!(
        state.state("zigbee2mqtt/door"),
        Some(json!({"state": "LOCK"})),
        "still locked while the person decides"
    );
    let id = vessel.person().pending()[0].id;
    vessel.person().answer_approval(id, true).unwrap();
    let unlocked = unlocking.await.unwrap();
    assert_eq!(unlocked["ok"], json!(true), "{unlocked}");
    assert_eq!(unlocked["result"]["state"], json!("UNLOCK"));

    // The rule refuses 26 before the bridge hears of it; 22 goes through.
    let refused = call(
        &vessel,
        "device__thermostat__set_target",
        json!({"target": 26}),
    )
    .await;
    assert_eq!(refused["ok"], json!(false));
    assert!(
        refused["reason"]
            .as_str()
            .unwrap()
            .contains("Keep the thermostat at 25 or below"),
        "{refused}"
    );
    assert_eq!(
        state.state("zigbee2mqtt/thermostat").unwrap()["current_heating_setpoint"],
        json!(20)
    );
    let set = call(
        &vessel,
        "device__thermostat__set_target",
        json!({"target": 22}),
    )
    .await;
    assert_eq!(set["ok"], json!(true), "{set}");

    // 10,000 state messages at full speed: the bridge keeps answering.
    let mut options = MqttOptions::new("flood", "127.0.0.1", port);
    options.set_inflight(1000);
    let (client, mut eventloop) = AsyncClient::new(options, 1000);
    let flood = tokio::spawn(async move {
        for n in 0..10_000 {
            let state = json!({"state": if n % 2 == 0 { "LOCK" } else { "UNLOCK" }, "n": n});
            client
                .publish(
                    "zigbee2mqtt/door",
                    QoS::AtMostOnce,
                    false,
                    state.to_string(),
                )
                .await
                .unwrap();
        }
        client.disconnect().await.unwrap();
    });
    let started = Instant::now();
    while eventloop.poll().await.is_ok() {}
    flood.await.unwrap();
    let sent_in = started.elapsed();
    let before = state.received.load(std::sync::atomic::Ordering::Relaxed);
    eventually("the flood is read", || {
        state.received.load(std::sync::atomic::Ordering::Relaxed) >= before
            && state
                .state("zigbee2mqtt/door")
                .and_then(|s| s.get("n").cloned())
                == Some(json!(9999))
    })
    .await;
    eprintln!("flood: 10,000 state messages sent in {sent_in:?}");
    let read = call(&vessel, "device__front_door__read_lock", json!({})).await;
    assert_eq!(read["ok"], json!(true), "{read}");
    let set = call(
        &vessel,
        "device__thermostat__set_target",
        json!({"target": 21}),
    )
    .await;
    assert_eq!(set["ok"], json!(true), "{set}");
    bridge.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_reads_retained_configs_from_the_broker_and_bridges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    let device = json!({"identifiers": ["zigbee2mqtt_0xa1"], "name": "Front door"});
    let configs = [
        (
            "homeassistant/lock/0xa1/lock/config",
            json!({"name": "Front door", "state_topic": "zigbee2mqtt/front_door",
                   "command_topic": "zigbee2mqtt/front_door/set", "device": device})
            .to_string()
            .into_bytes(),
        ),
        (
            "homeassistant/light/0xa2/light/config",
            json!({"name": "Hall\u{1b}[31m light\u{202e}", "state_topic": "zigbee2mqtt/hall",
                   "command_topic": "zigbee2mqtt/hall/set", "schema": "json"})
            .to_string()
            .into_bytes(),
        ),
        ("homeassistant/switch/0xa3/switch/config", b"{oops".to_vec()),
    ];
    let options = MqttOptions::new("publisher", "127.0.0.1", port);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    for (topic, payload) in configs {
        client
            .publish(topic, QoS::AtLeastOnce, true, payload)
            .await
            .unwrap();
    }
    let mut acked = 0;
    while acked < 3 {
        if let Ok(Event::Incoming(Packet::PubAck(_))) = eventloop.poll().await {
            acked += 1;
        }
    }
    let found = dk_bridge_mqtt::discover::discover(
        &format!("mqtt://127.0.0.1:{port}"),
        None,
        Duration::from_millis(1500),
    )
    .await
    .unwrap();
    assert_eq!(found.devices.len(), 2);
    assert_eq!(found.skipped.len(), 1, "{:?}", found.skipped);
    let hall = found.devices.iter().find(|d| d.kind == "light").unwrap();
    assert_eq!(hall.name, "Hall[31m light");
    let lock = found.devices.iter().find(|d| d.kind == "lock").unwrap();
    assert!(
        lock.actuator
            .iter()
            .any(|a| a.name == "unlock" && a.confirm)
    );
    let proposal = dk_bridge_mqtt::discover::to_toml(&found);
    assert_eq!(BridgeConfig::parse(&proposal).unwrap().device.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mqtts_the_broker_is_checked_against_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_file, key_file) = (dir.path().join("broker.pem"), dir.path().join("broker.key"));
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
    let broker = Mosquitto::start_with(
        dir.path(),
        &format!(
            "certfile {}\nkeyfile {}\n",
            cert_file.display(),
            key_file.display()
        ),
    );
    let port = broker.port;
    let (vessel, device_url) = vessel_with("version: 1\npolicies: []\n").await;
    let run = |ca_file: Option<PathBuf>, key: &str| {
        let mut config = BridgeConfig::parse(CONFIG).unwrap();
        config.broker.ca_file = ca_file;
        config.device[0].key_file = Some(dir.path().join(key));
        let state = Arc::new(BrokerState::default());
        let task = tokio::spawn(run_bridge(
            config,
            format!("mqtts://localhost:{port}"),
            None,
            device_url.clone(),
            Arc::new(|_: &str, _: &str| {}),
            Arc::clone(&state),
            std::future::pending(),
        ));
        (state, task)
    };
    // Without the broker's CA the platform's roots do not know it: never
    // connected, and its device pairs but cannot act.
    let (state, task) = run(None, "unknown.key");
    // The first attempt's end is what would follow a connection: once it
    // failed, the bridge was refused, not merely slow.
    eventually("the first attempt over TLS ended", || {
        state.last_error().is_some()
    })
    .await;
    assert!(!state.is_connected(), "an unknown certificate is refused");
    task.abort();
    // With it: connected over TLS, and the light works.
    let (state, task) = run(Some(cert_file.clone()), "light.key");
    eventually("connected over TLS", || state.is_connected()).await;
    fake_light_tls(port, &cert_file);
    pair_all(&vessel).await;
    eventually("the state over TLS", || {
        state.state("zigbee2mqtt/lamp").is_some()
    })
    .await;
    let set = call(
        &vessel,
        "device__living_room_light__set_light",
        json!({"state": "ON"}),
    )
    .await;
    assert_eq!(set["ok"], json!(true), "{set}");
    task.abort();
}

/// The fake light, over TLS.
fn fake_light_tls(port: u16, ca: &std::path::Path) {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut options = MqttOptions::new("fake-light-tls", "localhost", port);
    options.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        Arc::new(tls),
    )));
    fake_device_on(options, "lamp", json!({"state": "OFF"}));
}

/// One JSON-RPC request to `/mcp` over a real socket, as an MCP client
/// sends it: the answer's JSON (from a JSON body or the SSE `data:` line)
/// and the session id the server gave, if any.
async fn mcp(
    addr: SocketAddr,
    credential: &str,
    session: Option<&str>,
    body: Value,
) -> (Option<Value>, Option<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nauthorization: Bearer {credential}\r\n\
         mcp-protocol-version: 2025-06-18\r\nconnection: close\r\ncontent-length: {}\r\n",
        addr.port(),
        body.len()
    );
    if let Some(session) = session {
        request.push_str(&format!("mcp-session-id: {session}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let session = answer.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("mcp-session-id: ")
            .map(|_| l[16..].trim().to_owned())
    });
    let json = answer
        .lines()
        .filter_map(|l| {
            l.strip_prefix("data: ")
                .or_else(|| l.starts_with('{').then_some(l))
        })
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("id").is_some());
    (json, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_over_mcp_turns_the_bridged_light_on_and_the_state_confirms() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    fake_light(port);
    let (vessel, device_url) = vessel_with("version: 1\npolicies: []\n").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mcp_addr = listener.local_addr().unwrap();
    tokio::spawn(dk_mcp::serve_mcp(
        listener,
        Arc::clone(&vessel),
        Arc::clone(vessel.agents()),
        std::future::pending(),
    ));
    let mut config = BridgeConfig::parse(CONFIG).unwrap();
    config.device[0].key_file = Some(dir.path().join("light.key"));
    let state = Arc::new(BrokerState::default());
    tokio::spawn(run_bridge(
        config,
        format!("mqtt://127.0.0.1:{port}"),
        None,
        device_url,
        Arc::new(|_: &str, _: &str| {}),
        Arc::clone(&state),
        std::future::pending(),
    ));
    pair_all(&vessel).await;
    eventually("the retained state", || {
        state.state("zigbee2mqtt/lamp").is_some()
    })
    .await;
    let scope = dk_core::agents::AgentScope::from_items(["living-room-light"]).unwrap();
    let (_, credential) = vessel
        .add_agent("kitchen", scope, dk_core::agents::AgentRole::User)
        .unwrap();
    let credential = credential.expose().to_owned();

    let (init, session) = mcp(
        mcp_addr,
        &credential,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bridge-test", "version": "1"}}}),
    )
    .await;
    assert!(init.unwrap().get("result").is_some());
    let session = session.expect("a session");
    let _ = mcp(
        mcp_addr,
        &credential,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (called, _) = mcp(
        mcp_addr,
        &credential,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "device__living_room_light__set_light", "arguments": {"state": "ON"}}}),
    )
    .await;
    let called = called.unwrap();
    let result = &called["result"];
    assert_eq!(result["isError"], json!(false), "{called}");
    assert_eq!(
        result["structuredContent"]["state"],
        json!("ON"),
        "{called}"
    );
    assert_eq!(
        state.state("zigbee2mqtt/lamp").unwrap()["state"],
        json!("ON")
    );
}

const PLUG_AND_SILENT: &str = r#"
[broker]
confirmTimeoutMs = 1500

[[device]]
id = "plug"
name = "Coffee plug"
kind = "switch"
stateTopic = "stat/plug/RESULT"

[[device.actuator]]
name = "set_power"
description = "Switch the plug."
commandTopic = "cmnd/plug/POWER"
payload = "{state}"
expect = { POWER = "{state}" }
params = { state = { type = "string", required = true } }

[[device]]
id = "silent"
name = "Silent switch"
kind = "switch"
stateTopic = "silent/state"

[[device.actuator]]
name = "set"
description = "Never answers."
commandTopic = "silent/set"
payload = { state = "{state}" }
params = { state = { type = "string", required = true } }
"#;

/// A Tasmota plug: takes `ON`/`OFF` as text on `cmnd/plug/POWER` and
/// answers `{"POWER": ...}` on `stat/plug/RESULT`; it records what came.
/// The payloads the plug received.
type Received = Arc<Mutex<Vec<Vec<u8>>>>;

/// The second value holds once the broker acknowledged its subscription.
fn fake_tasmota(port: u16) -> (Received, Arc<AtomicBool>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    let subscribed = Arc::new(AtomicBool::new(false));
    let acked = Arc::clone(&subscribed);
    let (client, mut eventloop) =
        AsyncClient::new(MqttOptions::new("fake-tasmota", "127.0.0.1", port), 64);
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.subscribe("cmnd/plug/POWER", QoS::AtLeastOnce).await;
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => acked.store(true, Ordering::SeqCst),
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    keep.lock().unwrap().push(publish.payload.to_vec());
                    let power = String::from_utf8_lossy(&publish.payload).to_string();
                    let _ = client
                        .publish(
                            "stat/plug/RESULT",
                            QoS::AtLeastOnce,
                            false,
                            json!({ "POWER": power }).to_string(),
                        )
                        .await;
                }
                Ok(_) => {}
                // The broker is gone: the client's reconnects paced.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    (seen, subscribed)
}

/// A client of the broker at `port` subscribed to `topic`: it counts the
/// messages that come on it, and can publish.
struct Watcher {
    client: AsyncClient,
    subscribed: Arc<AtomicBool>,
    seen: Arc<AtomicUsize>,
}

fn watch(port: u16, topic: &str) -> Watcher {
    let (client, mut eventloop) =
        AsyncClient::new(MqttOptions::new("watcher", "127.0.0.1", port), 64);
    let subscribed = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicUsize::new(0));
    let (acked, count, subscriber, topic) = (
        Arc::clone(&subscribed),
        Arc::clone(&seen),
        client.clone(),
        topic.to_owned(),
    );
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = subscriber.subscribe(topic.as_str(), QoS::AtLeastOnce).await;
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => acked.store(true, Ordering::SeqCst),
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                Ok(_) => {}
                // The broker is gone: the client's reconnects paced.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    Watcher {
        client,
        subscribed,
        seen,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasmota_plug_takes_text_and_a_call_caught_by_the_broker_going_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    let (seen, tasmota_subscribed) = fake_tasmota(port);
    let watcher = watch(port, "silent/set");
    let (vessel, device_url) = vessel_with("version: 1\npolicies: []\n").await;
    let mut config = BridgeConfig::parse(PLUG_AND_SILENT).unwrap();
    for device in &mut config.device {
        device.key_file = Some(dir.path().join(format!("{}.key", device.id)));
    }
    let state = Arc::new(BrokerState::default());
    tokio::spawn(run_bridge(
        config,
        format!("mqtt://127.0.0.1:{port}"),
        None,
        device_url,
        Arc::new(|_: &str, _: &str| {}),
        Arc::clone(&state),
        std::future::pending(),
    ));
    pair_all(&vessel).await;
    pair_all(&vessel).await;
    eventually("connected to the broker", || state.is_connected()).await;
    // The plug and the bridge listen before the first call: the plug's
    // subscription acknowledged, and a probe on the plug's state topic
    // seen by the bridge (it shows no `POWER`, so it confirms nothing).
    eventually("the plug subscribed", || {
        tasmota_subscribed.load(Ordering::SeqCst)
    })
    .await;
    dk_testkit::eventually_async("the bridge seeing the probe", || async {
        if state.state("stat/plug/RESULT").is_some() {
            return Some(());
        }
        watcher
            .client
            .publish(
                "stat/plug/RESULT",
                QoS::AtMostOnce,
                false,
                r#"{"probe":true}"#,
            )
            .await
            .unwrap();
        None
    })
    .await;
    eventually("the watcher subscribed", || {
        watcher.subscribed.load(Ordering::SeqCst)
    })
    .await;

    // The payload is one string: sent as its text, confirmed by the JSON
    // result.
    let on = call(&vessel, "device__plug__set_power", json!({"state": "ON"})).await;
    assert_eq!(on["ok"], json!(true), "{on}");
    assert_eq!(on["result"], json!({"POWER": "ON"}));
    assert_eq!(seen.lock().unwrap().last().unwrap(), b"ON");
    // The whole payload would be the input: only a word goes that way.
    let odd = "ON\", \"Backlog\": \"Power OFF";
    let refused = call(&vessel, "device__plug__set_power", json!({"state": odd})).await;
    assert_eq!(refused["ok"], json!(false), "{refused}");
    assert!(refused["reason"].as_str().unwrap().contains("one word"));
    assert_eq!(seen.lock().unwrap().len(), 1, "nothing more was sent");

    // A call waiting for its confirmation when the broker goes away fails
    // when its time is over, saying the broker went.
    let waiting = {
        let vessel = Arc::clone(&vessel);
        tokio::spawn(
            async move { call(&vessel, "device__silent__set", json!({"state": "ON"})).await },
        )
    };
    // The broker goes once the call's command went through it.
    eventually("the silent switch's command at the broker", || {
        watcher.seen.load(Ordering::SeqCst) == 1
    })
    .await;
    drop(broker);
    let failed = waiting.await.unwrap();
    assert_eq!(failed["ok"], json!(false));
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.contains("did not confirm it within 1500 ms")
            && reason.contains("the broker went away"),
        "{reason}"
    );
}

/// Publishes each `(topic, payload)` retained, and waits until the broker
/// has them all.
async fn retain(port: u16, configs: &[(&str, Vec<u8>)]) {
    let mut options = MqttOptions::new("retainer", "127.0.0.1", port);
    options.set_max_packet_size(1024 * 1024, 1024 * 1024);
    options.set_inflight(1000);
    let (client, mut eventloop) = AsyncClient::new(options, 1000);
    let sending = {
        let client = client.clone();
        let configs: Vec<(String, Vec<u8>)> = configs
            .iter()
            .map(|(t, p)| ((*t).to_owned(), p.clone()))
            .collect();
        tokio::spawn(async move {
            for (topic, payload) in configs {
                client
                    .publish(topic, QoS::AtLeastOnce, true, payload)
                    .await
                    .unwrap();
            }
        })
    };
    let mut acked = 0;
    let kept = async {
        while acked < configs.len() {
            if let Ok(Event::Incoming(Packet::PubAck(_))) = eventloop.poll().await {
                acked += 1;
            }
        }
    };
    let kept = tokio::time::timeout(PATIENCE, kept).await;
    assert!(kept.is_ok(), "the broker kept {acked} configs");
    sending.await.unwrap();
    let _ = client.disconnect().await;
}

async fn discover_on(port: u16) -> dk_bridge_mqtt::discover::Discovered {
    dk_bridge_mqtt::discover::discover(
        &format!("mqtt://127.0.0.1:{port}"),
        None,
        Duration::from_millis(1500),
    )
    .await
    .unwrap()
}

/// Zigbee2MQTT's discovery configs for a lock with a battery, as it
/// publishes them (identifiers of 30 characters).
fn zigbee2mqtt_lock(ieee: &str, name: &str, topic: &str) -> Vec<(String, Vec<u8>)> {
    let device = json!({"identifiers": [format!("zigbee2mqtt_{ieee}")], "name": name,
                        "manufacturer": "Danalock", "model": "V3"});
    vec![
        (
            format!("homeassistant/lock/{ieee}/lock/config"),
            json!({"name": null, "object_id": format!("{topic}_lock"),
                   "unique_id": format!("{ieee}_lock_zigbee2mqtt"),
                   "state_topic": format!("zigbee2mqtt/{topic}"),
                   "command_topic": format!("zigbee2mqtt/{topic}/set"),
                   "value_template": "{{ value_json.state }}",
                   "payload_lock": "LOCK", "payload_unlock": "UNLOCK",
                   "state_locked": "LOCK", "state_unlocked": "UNLOCK", "device": device})
            .to_string()
            .into_bytes(),
        ),
        (
            format!("homeassistant/sensor/{ieee}/battery/config"),
            json!({"name": "Battery", "object_id": format!("{topic}_battery"),
                   "unique_id": format!("{ieee}_battery_zigbee2mqtt"),
                   "state_topic": format!("zigbee2mqtt/{topic}"),
                   "value_template": "{{ value_json.battery }}",
                   "unit_of_measurement": "%", "device_class": "battery", "device": device})
            .to_string()
            .into_bytes(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zigbee2mqtt_identifiers_become_stable_readable_ids() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    let mut configs = zigbee2mqtt_lock("0x00158d0001a2b3c4", "Front door", "front_door");
    configs.extend(zigbee2mqtt_lock(
        "0x00158d0001a2b3c5",
        "Back door of the garden shed",
        "shed",
    ));
    let refs: Vec<(&str, Vec<u8>)> = configs
        .iter()
        .map(|(t, p)| (t.as_str(), p.clone()))
        .collect();
    retain(port, &refs).await;
    let found = discover_on(port).await;
    let mut ids: Vec<&str> = found.devices.iter().map(|d| d.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids.len(), 2, "both locks are proposed: {ids:?}");
    for id in &ids {
        assert!(id.len() <= 24, "`{id}` fits dk's ids");
    }
    assert!(ids[0].starts_with("back-door-of-the-"), "{ids:?}");
    assert!(ids[1].starts_with("front-door-"), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    // The same configs give the same ids, run after run.
    let again = discover_on(port).await;
    let mut second: Vec<&str> = again.devices.iter().map(|d| d.id.as_str()).collect();
    second.sort();
    assert_eq!(ids, second);
    let proposal = dk_bridge_mqtt::discover::to_toml(&found);
    assert_eq!(BridgeConfig::parse(&proposal).unwrap().device.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_reusing_a_locks_command_topic_never_publishes_to_it_unasked() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    let device = json!({"identifiers": ["door_1"], "name": "Front door"});
    let lock = json!({"name": "Front door", "state_topic": "zigbee2mqtt/door",
                      "command_topic": "zigbee2mqtt/door/set",
                      "value_template": "{{ value_json.state }}", "device": device});
    // A switch planted on the lock's device and command topic: today its
    // `state` is a free string, so `UNLOCK` goes out unasked.
    let led = json!({"name": "Status LED", "state_topic": "zigbee2mqtt/door",
                     "command_topic": "zigbee2mqtt/door/set",
                     "value_template": "{{ value_json.state }}", "device": device});
    // A second lock whose `lock` sends what unlocks.
    let second = json!({"name": "Door helper", "state_topic": "zigbee2mqtt/door",
                        "command_topic": "zigbee2mqtt/door/set",
                        "payload_lock": "UNLOCK", "payload_unlock": "LOCK",
                        "value_template": "{{ value_json.state }}", "device": device});
    retain(
        port,
        &[
            (
                "homeassistant/lock/door_1/lock/config",
                lock.to_string().into_bytes(),
            ),
            (
                "homeassistant/switch/door_1/led/config",
                led.to_string().into_bytes(),
            ),
            (
                "homeassistant/lock/door_1/helper/config",
                second.to_string().into_bytes(),
            ),
        ],
    )
    .await;
    let found = discover_on(port).await;
    let mut publishing = 0;
    for device in &found.devices {
        for actuator in &device.actuator {
            if actuator.command_topic == "zigbee2mqtt/door/set" {
                publishing += 1;
                let free = actuator
                    .params
                    .as_ref()
                    .is_some_and(|p| p.get("state").is_some());
                assert!(!free, "`{}` takes no free state", actuator.name);
                let unlocks = actuator.payload.to_string().contains("UNLOCK");
                assert!(
                    actuator.confirm || !unlocks,
                    "`{}` sends {} to the lock without asking",
                    actuator.name,
                    actuator.payload
                );
            }
        }
    }
    assert!(publishing >= 2, "the lock itself is proposed");
    let proposal = dk_bridge_mqtt::discover::to_toml(&found);
    let back = BridgeConfig::parse(&proposal).unwrap();
    for device in &back.device {
        for actuator in &device.actuator {
            if actuator.command_topic == "zigbee2mqtt/door/set"
                && actuator.payload.to_string().contains("UNLOCK")
            {
                assert!(actuator.confirm, "{proposal}");
            }
        }
    }
    assert!(
        proposal.contains("asks every time: it publishes to `zigbee2mqtt/door/set`, where"),
        "the proposal says why: {proposal}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_characters_in_a_topic_spoil_only_their_own_config() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    let config = |name: &str, id: &str, command: &str| {
        json!({"name": name, "state_topic": format!("zigbee2mqtt/{id}"),
               "command_topic": command, "schema": "json",
               "device": {"identifiers": [id], "name": name}})
        .to_string()
        .into_bytes()
    };
    retain(
        port,
        &[
            (
                "homeassistant/light/good/light/config",
                config("Hall", "good", "zigbee2mqtt/good/set"),
            ),
            (
                "homeassistant/light/bidi/light/config",
                config("Porch", "bidi", "zigbee2mqtt/\u{202e}tes/kcol"),
            ),
            (
                "homeassistant/light/c1/light/config",
                config("Attic", "c1", "zigbee2mqtt/attic\u{9b}2J/set"),
            ),
            (
                "homeassistant/light/del/light/config",
                config("Cellar", "del", "zigbee2mqtt/cellar\u{7f}/set"),
            ),
        ],
    )
    .await;
    let found = discover_on(port).await;
    let proposal = dk_bridge_mqtt::discover::to_toml(&found);
    let back = BridgeConfig::parse(&proposal).unwrap();
    let ids: Vec<&str> = back.device.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["good"], "{proposal}");
    assert!(
        !proposal.contains(['\u{202e}', '\u{9b}', '\u{7f}']),
        "{proposal:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_nested_past_the_frame_depth_is_dropped_and_the_device_stays() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    fake_light(port);
    let (vessel, device_url) = vessel_with("version: 1\npolicies: []\n").await;
    let mut config = BridgeConfig::parse(CONFIG).unwrap();
    config.device[0].key_file = Some(dir.path().join("light.key"));
    let state = Arc::new(BrokerState::default());
    let bridge = tokio::spawn(run_bridge(
        config,
        format!("mqtt://127.0.0.1:{port}"),
        None,
        device_url,
        Arc::new(|_: &str, _: &str| {}),
        Arc::clone(&state),
        std::future::pending(),
    ));
    pair_all(&vessel).await;
    eventually("the retained state", || {
        state.state("zigbee2mqtt/lamp").is_some()
    })
    .await;
    // 1 KiB at most, nested 70 deep under the sensor's path.
    let deep = format!("{{\"state\":{}1{}}}", "[".repeat(69), "]".repeat(69));
    assert!(deep.len() < 1024);
    for _ in 0..4 {
        publish_once(port, "zigbee2mqtt/lamp", deep.clone().into_bytes()).await;
    }
    eventually("the deep states are dropped", || {
        state.too_deep.load(std::sync::atomic::Ordering::Relaxed) >= 4
    })
    .await;
    for _ in 0..4 {
        let read = call(&vessel, "device__living_room_light__read_light", json!({})).await;
        assert_eq!(read, json!({"ok": true, "result": {"value": "OFF"}}));
    }
    assert!(vessel.links().is_connected("living-room-light"));
    let set = call(
        &vessel,
        "device__living_room_light__set_light",
        json!({"state": "ON"}),
    )
    .await;
    assert_eq!(set["ok"], json!(true), "{set}");
    bridge.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_keeps_a_bounded_amount_of_a_large_retained_flood() {
    use dk_bridge_mqtt::discover::{MAX_CONFIG_BYTES, MAX_DISCOVERY_BYTES};
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start(dir.path());
    let port = broker.port;
    // 160 configs of 60 KiB (9.4 MiB), and one over the size of a config.
    let pad = "x".repeat(60 * 1024);
    let mut configs: Vec<(String, Vec<u8>)> = (0..160)
        .map(|n| {
            (
                format!("homeassistant/sensor/s{n:03}/config"),
                json!({"name": format!("Sensor {n}"), "state_topic": format!("s/{n}"),
                       "pad": pad})
                .to_string()
                .into_bytes(),
            )
        })
        .collect();
    configs.push((
        "homeassistant/sensor/huge/config".to_owned(),
        vec![b' '; MAX_CONFIG_BYTES + 1],
    ));
    let refs: Vec<(&str, Vec<u8>)> = configs
        .iter()
        .map(|(t, p)| (t.as_str(), p.clone()))
        .collect();
    retain(port, &refs).await;
    let found = discover_on(port).await;
    let over_budget = found
        .skipped
        .iter()
        .filter(|s| s.reason.contains("bytes of configs discovery keeps"))
        .count();
    let kept = found.devices.len();
    assert!(over_budget > 0, "{:?}", found.skipped.len());
    assert_eq!(kept + over_budget, 160);
    assert!(kept * 60 * 1024 <= MAX_DISCOVERY_BYTES);
    assert!(
        found
            .skipped
            .iter()
            .any(|s| s.topic == "homeassistant/sensor/huge/config" && s.reason.contains("over"))
    );
}
