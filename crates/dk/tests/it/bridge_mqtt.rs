//! `dk bridge mqtt` as a person runs it, against Debian's mosquitto on a
//! free port: `discover` proposes Zigbee2MQTT's devices and says why it
//! skipped a config; the broker's user and password never go in clear to
//! a broker off loopback unless `--allow-clear-credentials` says so.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::json;

use crate::process::{Killed, PATIENCE, Scratch};

/// A mosquitto listening on every IPv4 address of the machine, killed on
/// drop.
fn mosquitto(dir: &Path) -> (Killed, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 0.0.0.0\nallow_anonymous true\npersistence false\n"),
    )
    .unwrap();
    let binary = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("mosquitto: `cargo xtask peers` installs Debian's package");
    let child = Command::new(binary)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let broker = Killed(child);
    dk_testkit::eventually_blocking("mosquitto listening", || {
        TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).is_ok()
    });
    (broker, port)
}

/// An IPv4 address of this machine that is not loopback, if it has one:
/// one the kernel lists as local (`/proc/net/fib_trie`), so no packet
/// leaves the machine.
fn address_off_loopback() -> Option<IpAddr> {
    let table = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    let lines: Vec<&str> = table.lines().collect();
    lines.windows(2).find_map(|pair| {
        let [entry, kind] = pair else { return None };
        let ip: IpAddr = entry.trim().strip_prefix("|-- ")?.parse().ok()?;
        let local = kind.contains("/32 host LOCAL");
        (local && !ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
    })
}

/// Publishes each `(topic, payload)` retained and waits for the broker.
fn retain(port: u16, configs: Vec<(String, Vec<u8>)>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, mut eventloop) =
            AsyncClient::new(MqttOptions::new("retainer", "127.0.0.1", port), 64);
        let count = configs.len();
        for (topic, payload) in configs {
            client
                .publish(topic, QoS::AtLeastOnce, true, payload)
                .await
                .unwrap();
        }
        let mut acked = 0;
        let kept = async {
            while acked < count {
                if let Ok(Event::Incoming(Packet::PubAck(_))) = eventloop.poll().await {
                    acked += 1;
                }
            }
        };
        let kept = tokio::time::timeout(PATIENCE, kept).await;
        kept.unwrap_or_else(|_| panic!("the broker kept {acked} of {count}"));
    });
}

/// `dk bridge mqtt ARGS` with the broker's user and password in the
/// environment.
fn bridge(scratch: &Scratch, args: &[&str]) -> Output {
    let mut command = scratch.dk(&[&["bridge", "mqtt"], args].concat());
    command
        .env("DK_MQTT_USERNAME", "dk")
        .env("DK_MQTT_PASSWORD", "secret")
        .stdin(Stdio::null());
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn discover_proposes_zigbee2mqtt_devices_and_says_why_it_skipped_the_rest() {
    let scratch = Scratch::new("bridge-discover");
    let (_broker, port) = mosquitto(scratch.root());
    let device = json!({"identifiers": ["zigbee2mqtt_0x00158d0001a2b3c4"], "name": "Front door"});
    retain(
        port,
        vec![
            (
                "homeassistant/lock/0x00158d0001a2b3c4/lock/config".to_owned(),
                json!({"name": null, "state_topic": "zigbee2mqtt/front_door",
                       "command_topic": "zigbee2mqtt/front_door/set",
                       "value_template": "{{ value_json.state }}", "device": device})
                .to_string()
                .into_bytes(),
            ),
            (
                "homeassistant/sensor/0x00158d0001a2b3c4/battery/config".to_owned(),
                json!({"name": "Battery", "state_topic": "zigbee2mqtt/front_door",
                       "value_template": "{{ value_json.battery }}", "device": device})
                .to_string()
                .into_bytes(),
            ),
            (
                "homeassistant/switch/0xa3/switch/config".to_owned(),
                b"{oops".to_vec(),
            ),
        ],
    );
    let broker = format!("mqtt://127.0.0.1:{port}");
    let out = bridge(
        &scratch,
        &["discover", "--broker", &broker, "--wait-ms", "1500"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let proposal = dk_bridge_mqtt::BridgeConfig::parse(&stdout).unwrap();
    assert_eq!(proposal.device.len(), 1, "{stdout}");
    let door = &proposal.device[0];
    assert!(door.id.starts_with("front-door-"), "{}", door.id);
    let names: Vec<&str> = door
        .sensor
        .iter()
        .map(|s| s.name.as_str())
        .chain(door.actuator.iter().map(|a| a.name.as_str()))
        .collect();
    assert_eq!(names, ["read_lock", "read_battery", "lock", "unlock"]);
    assert!(
        stderr.contains("skipped `homeassistant/switch/0xa3/switch/config`: not JSON"),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 devices proposed, 1 configs skipped"),
        "{stderr}"
    );
    assert!(
        stdout.contains("# - `homeassistant/switch/0xa3/switch/config`: not JSON"),
        "{stdout}"
    );
}

#[test]
fn credentials_go_in_clear_off_loopback_only_when_the_person_says_so() {
    let scratch = Scratch::new("bridge-credentials");
    let (_broker, port) = mosquitto(scratch.root());
    retain(
        port,
        vec![(
            "homeassistant/sensor/t/config".to_owned(),
            json!({"name": "Hall temperature", "state_topic": "sensors/hall",
                   "value_template": "{{ value_json.temperature }}"})
            .to_string()
            .into_bytes(),
        )],
    );
    // On loopback the credentials go as they are.
    let near = format!("mqtt://127.0.0.1:{port}");
    let out = bridge(
        &scratch,
        &["discover", "--broker", &near, "--wait-ms", "800"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("hall-temperature"));

    // Off loopback they are refused before anything is sent, for discovery
    // and for the bridge itself.
    let ip = address_off_loopback();
    let far_host = ip.map_or_else(|| "broker.invalid".to_owned(), |ip| ip.to_string());
    let far = format!("mqtt://{far_host}:{port}");
    let config = scratch.root().join("bridge.toml");
    std::fs::write(
        &config,
        "[[device]]\nid = \"hall\"\nname = \"Hall\"\nkind = \"sensor\"\nstateTopic = \"sensors/hall\"\n\n[[device.sensor]]\nname = \"read_hall\"\ndescription = \"Read it.\"\n",
    )
    .unwrap();
    for args in [
        vec!["discover", "--broker", &far, "--wait-ms", "800"],
        vec![
            "--broker",
            &far,
            "--config",
            config.to_str().unwrap(),
            "--vessel",
            "ws://127.0.0.1:9/device",
        ],
    ] {
        let out = bridge(&scratch, &args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains("in clear") && stderr.contains("--allow-clear-credentials"),
            "{stderr}"
        );
    }

    // Asked for knowingly, they go: the broker off loopback answers.
    if ip.is_some() {
        let out = bridge(
            &scratch,
            &[
                "discover",
                "--broker",
                &far,
                "--wait-ms",
                "800",
                "--allow-clear-credentials",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("hall-temperature"));
    }
}

#[test]
fn bridged_devices_keep_their_keys_in_dk_s_home_not_where_the_bridge_runs() {
    let scratch = Scratch::new("bridge-keys");
    let (_broker, port) = mosquitto(scratch.root());
    let vessel = crate::process::Running::start(&scratch);
    let config = scratch.root().join("bridge.toml");
    std::fs::write(
        &config,
        "[[device]]\nid = \"hall\"\nname = \"Hall\"\nkind = \"sensor\"\nstateTopic = \"sensors/hall\"\n\n[[device.sensor]]\nname = \"read_hall\"\ndescription = \"Read it.\"\n",
    )
    .unwrap();
    let broker = format!("mqtt://127.0.0.1:{port}");
    let url = format!("ws://{}/device", vessel.devices);
    let args = [
        "bridge",
        "mqtt",
        "--broker",
        &broker,
        "--config",
        config.to_str().unwrap(),
        "--vessel",
        &url,
    ];

    // Run from the scratch directory: the key is made in the home.
    let running = Killed(
        scratch
            .dk(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let key = scratch.home().join("devices").join("hall.key");
    dk_testkit::eventually_blocking("a key file in the home", || key.is_file());
    drop(running);
    assert!(!scratch.root().join(".dk").exists(), "a key where it ran");

    // A key an older dk left in ./.dk/ is not taken silently.
    std::fs::remove_file(&key).unwrap();
    std::fs::create_dir(scratch.root().join(".dk")).unwrap();
    std::fs::write(scratch.root().join(".dk").join("hall.key"), "planted").unwrap();
    let out = scratch.dk(&args).stdin(Stdio::null()).output().unwrap();
    let said = text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("hall") && said.contains("mv "), "{said}");
    assert!(!key.exists(), "nothing made while refused");
}
