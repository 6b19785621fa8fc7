//! Tests of the sample devices.

use serde_json::{Map, Value, json};

use super::{Lamp, LampState, Lock, LockState, Thermostat, ThermostatState, js_number};
use crate::Device;

fn input(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("test input must be an object, got {other}"),
    }
}

/// Invokes `capability` and checks the answer.
#[track_caller]
fn check(device: &Device, capability: &str, given: Value, expected: Result<Value, &str>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = runtime
        .block_on(device.invoke(capability, input(given.clone())))
        .map_err(|e| e.to_string());
    assert_eq!(
        answer,
        expected.map_err(str::to_owned),
        "{capability} {given}"
    );
}

/// The fixture a sample's manifest comes from, validated.
#[track_caller]
fn fixture(name: &str) -> (dk_proto::Manifest, String) {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/manifests/valid/"
    );
    let text = std::fs::read_to_string(format!("{dir}{name}.json")).unwrap();
    let digest = std::fs::read_to_string(format!("{dir}{name}.digest")).unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    (
        dk_proto::validate_manifest(&value).unwrap(),
        digest.trim().to_owned(),
    )
}

#[test]
fn samples_carry_the_fixture_manifests() {
    for (device, name) in [
        (super::lamp(), "desk-lamp"),
        (super::lock(), "front-door"),
        (super::thermostat(), "hall-thermostat"),
    ] {
        let (manifest, digest) = fixture(name);
        assert_eq!(device.manifest(), &manifest, "{name}");
        assert_eq!(device.manifest().digest(), digest, "{name}");
    }
}

#[test]
fn lamp_is_the_8dk_reference_lamp() {
    let lamp = Lamp::new();
    let device = lamp.device();
    assert_eq!(
        lamp.state(),
        LampState {
            on: false,
            brightness: 0.0
        }
    );
    let steps = [
        (
            "read_light",
            json!({}),
            Ok(json!({"on": false, "brightness": 0})),
        ),
        (
            "set_light",
            json!({"on": true}),
            Ok(json!({"on": true, "brightness": 0})),
        ),
        (
            "set_light",
            json!({"on": true, "brightness": 75}),
            Ok(json!({"on": true, "brightness": 75})),
        ),
        // Only a number changes the brightness.
        (
            "set_light",
            json!({"on": false, "brightness": "dim"}),
            Ok(json!({"on": false, "brightness": 75})),
        ),
        (
            "set_light",
            json!({"on": true, "brightness": 12.5}),
            Ok(json!({"on": true, "brightness": 12.5})),
        ),
        (
            "read_light",
            json!({}),
            Ok(json!({"on": true, "brightness": 12.5})),
        ),
        ("strobe", json!({}), Ok(json!({"strobed": true}))),
        // Input the vessel would have refused still gets an answer.
        ("set_light", json!({}), Err("\"on\" must be boolean")),
        (
            "set_light",
            json!({"on": "yes"}),
            Err("\"on\" must be boolean"),
        ),
        ("dim", json!({}), Err("unknown capability \"dim\"")),
    ];
    for (capability, given, expected) in &steps {
        check(&device, capability, given.clone(), expected.clone());
    }
    assert_eq!(
        lamp.state(),
        LampState {
            on: true,
            brightness: 12.5
        }
    );
    let logged: Vec<(String, Value)> = lamp
        .calls()
        .into_iter()
        .map(|(capability, input)| (capability, Value::Object(input)))
        .collect();
    let expected: Vec<(String, Value)> = steps
        .iter()
        .filter(|(capability, ..)| *capability != "dim")
        .map(|(capability, given, _)| ((*capability).to_owned(), given.clone()))
        .collect();
    assert_eq!(logged, expected);
}

#[test]
fn lock_starts_locked_and_follows_lock_and_unlock() {
    let lock = Lock::new();
    let device = lock.device();
    assert_eq!(lock.state(), LockState { locked: true });
    check(&device, "read_lock", json!({}), Ok(json!({"locked": true})));
    check(&device, "unlock", json!({}), Ok(json!({"locked": false})));
    assert_eq!(lock.state(), LockState { locked: false });
    check(
        &device,
        "read_lock",
        json!({}),
        Ok(json!({"locked": false})),
    );
    check(&device, "lock", json!({}), Ok(json!({"locked": true})));
    check(&device, "lock", json!({}), Ok(json!({"locked": true})));
    assert_eq!(lock.state(), LockState { locked: true });
    let names: Vec<String> = lock.calls().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["read_lock", "unlock", "read_lock", "lock", "lock"]);
}

#[test]
fn thermostat_sets_targets_within_range() {
    let thermostat = Thermostat::new();
    let device = thermostat.device();
    let cases = [
        (
            "read_temperature",
            json!({}),
            Ok(json!({"current": 20, "target": 20, "mode": "auto"})),
        ),
        (
            "set_target",
            json!({"celsius": 22}),
            Ok(json!({"current": 20, "target": 22, "mode": "auto"})),
        ),
        (
            "set_target",
            json!({"celsius": 18.5, "mode": "cool"}),
            Ok(json!({"current": 20, "target": 18.5, "mode": "cool"})),
        ),
        (
            "set_target",
            json!({"celsius": 4.9}),
            Err("\"celsius\" must be between 5 and 30"),
        ),
        (
            "set_target",
            json!({"celsius": 31}),
            Err("\"celsius\" must be between 5 and 30"),
        ),
        (
            "set_target",
            json!({"celsius": 21, "mode": "warm"}),
            Err("\"mode\" must be heat, cool or auto"),
        ),
        (
            "set_target",
            json!({}),
            Err("invalid input for \"set_target\": missing field `celsius`"),
        ),
        (
            "set_target",
            json!({"celsius": "hot"}),
            Err("invalid input for \"set_target\": invalid type: string \"hot\", expected f64"),
        ),
        (
            "read_temperature",
            json!({}),
            Ok(json!({"current": 20, "target": 18.5, "mode": "cool"})),
        ),
    ];
    for (capability, given, expected) in cases {
        check(&device, capability, given, expected);
    }
    assert_eq!(thermostat.calls().len(), 9);
}

#[test]
fn thermostat_drifts_toward_its_target() {
    let thermostat = Thermostat::new();
    assert_eq!(thermostat.tick(), None, "already at the target");
    check(
        &thermostat.device(),
        "set_target",
        json!({"celsius": 21.2, "mode": "heat"}),
        Ok(json!({"current": 20, "target": 21.2, "mode": "heat"})),
    );
    let mut seen = Vec::new();
    while let Some((capability, data)) = thermostat.tick() {
        assert_eq!(capability, "read_temperature");
        seen.push(data.get("current").cloned().unwrap());
    }
    assert_eq!(seen, [json!(20.5), json!(21), json!(21.2)]);
    assert_eq!(
        thermostat.state(),
        ThermostatState {
            current: 21.2,
            target: 21.2,
            mode: "heat".into()
        }
    );
    check(
        &thermostat.device(),
        "set_target",
        json!({"celsius": 20}),
        Ok(json!({"current": 21.2, "target": 20, "mode": "heat"})),
    );
    assert_eq!(
        thermostat.tick().map(|(_, data)| data),
        Some(json!({"current": 20.7, "target": 20, "mode": "heat"}))
    );
}

#[track_caller]
fn check_number(n: f64, expected: &str) {
    assert_eq!(js_number(n).to_string(), expected, "{n:?}");
}

#[test]
fn numbers_are_written_as_javascript_writes_them() {
    check_number(0.0, "0");
    check_number(-0.0, "0");
    check_number(50.0, "50");
    check_number(-3.0, "-3");
    check_number(12.5, "12.5");
    check_number(9_007_199_254_740_992.0, "9007199254740992");
    check_number(1e300, "1e+300");
    check_number(f64::NAN, "null");
    check_number(f64::INFINITY, "null");
}

#[tokio::test(start_paused = true)]
async fn drift_queues_readings_until_the_queue_closes() {
    let thermostat = Thermostat::new();
    let device = thermostat.device();
    device
        .invoke("set_target", input(json!({"celsius": 21})))
        .await
        .unwrap();
    let (events, mut receiver) = device.events(1);
    let drift = thermostat.drift(&events, std::time::Duration::from_secs(5));
    tokio::pin!(drift);
    let mut readings = Vec::new();
    while readings.len() < 2 {
        tokio::select! {
            () = &mut drift => panic!("drift ended while the queue was open"),
            frame = receiver.recv() => readings.push(frame.unwrap()),
        }
    }
    let current: Vec<Value> = readings
        .iter()
        .map(|frame| serde_json::from_str::<Value>(frame).unwrap()["data"]["current"].clone())
        .collect();
    assert_eq!(current, [json!(20.5), json!(21)]);
    drop(receiver);
    drift.await;
    assert_eq!(thermostat.state().current, 21.0);
}

#[test]
fn the_voice_satellite_answers_and_makes_pcm_frames() {
    let voice = super::Voice::new();
    let device = voice.device();
    assert_eq!(device.manifest().kind(), "voice");
    check(
        &device,
        "read_status",
        json!({}),
        Ok(json!({"muted": false, "volume": 50})),
    );
    check(
        &device,
        "set_volume",
        json!({"volume": 70}),
        Ok(json!({"volume": 70})),
    );
    check(
        &device,
        "set_volume",
        json!({"volume": 170}),
        Err("volume must be 0-100"),
    );
    check(
        &device,
        "speak",
        json!({"text": "héllo"}),
        Ok(json!({"spoken": 5})),
    );
    let frame = voice.frame(3);
    assert_eq!(frame.len(), super::VOICE_FRAME_BYTES);
    assert_eq!(frame.len(), 640);
    assert!(frame.iter().any(|&b| b != 0));
    // Frames continue one another: sample 320 of frame 0 is sample 0 of frame 1.
    assert_ne!(voice.frame(0), voice.frame(1));
    check(
        &device,
        "mute",
        json!({"muted": true}),
        Ok(json!({"muted": true})),
    );
    assert!(voice.frame(4).iter().all(|&b| b == 0));
    assert_eq!(voice.state().volume, 70.0);
}

#[test]
fn the_desktop_bridge_answers_and_makes_screenshots() {
    let desktop = super::Desktop::new(64, 32);
    let device = desktop.device();
    assert_eq!(device.manifest().kind(), "desktop-control");
    assert!(device.manifest().capability("click").unwrap().confirm());
    assert!(device.manifest().capability("type_text").unwrap().confirm());
    check(
        &device,
        "move_pointer",
        json!({"x": 10, "y": 5}),
        Ok(json!({"x": 10, "y": 5})),
    );
    check(
        &device,
        "move_pointer",
        json!({"x": 64, "y": 5}),
        Err("the point is off the screen"),
    );
    check(&device, "click", json!({}), Ok(json!({"clicked": "left"})));
    check(
        &device,
        "type_text",
        json!({"text": "ok"}),
        Ok(json!({"typed": 2})),
    );
    check(
        &device,
        "read_screen",
        json!({}),
        Ok(json!({"width": 64, "height": 32, "pointer": {"x": 10, "y": 5}})),
    );
    let shot = desktop.screenshot(1);
    assert_eq!(shot.len(), 64 * 32 * 4);
    assert_ne!(shot, desktop.screenshot(2));
    assert_eq!(desktop.state().clicks, 1);
    assert_eq!(desktop.state().typed, "ok");
}
