//! Discovery on configs given directly: names, ids, payloads, the
//! confirm carried to a shared command topic, hidden characters, budgets.

use serde_json::{Value, json};

use super::{
    Heard, MAX_CAPABILITIES, MAX_CONFIG_BYTES, MAX_DISCOVERY_BYTES, device_id, propose, to_toml,
};
use crate::BridgeConfig;

fn config(topic: &str, value: Value) -> (String, Vec<u8>) {
    (topic.to_owned(), value.to_string().into_bytes())
}

/// The capability names of `device`, sensors first.
fn names(device: &crate::DeviceMap) -> Vec<&str> {
    device
        .sensor
        .iter()
        .map(|s| s.name.as_str())
        .chain(device.actuator.iter().map(|a| a.name.as_str()))
        .collect()
}

#[test]
fn zigbee2mqtt_configs_become_a_proposal_that_parses_back() {
    let device = json!({"identifiers": ["zigbee2mqtt_0x01"], "name": "Front door"});
    let found = propose(&[
        config(
            "homeassistant/lock/0x01/lock/config",
            json!({"name": "Front door", "state_topic": "zigbee2mqtt/front_door",
                   "command_topic": "zigbee2mqtt/front_door/set",
                   "value_template": "{{ value_json.state }}", "device": device}),
        ),
        config(
            "homeassistant/light/0x02/light/config",
            json!({"name": "Lamp\u{202e}\u{1b}[2J", "state_topic": "zigbee2mqtt/lamp",
                   "command_topic": "zigbee2mqtt/lamp/set", "schema": "json",
                   "brightness": true, "brightness_scale": 254}),
        ),
        (
            "homeassistant/light/bad/config".to_owned(),
            b"{not json".to_vec(),
        ),
        config("homeassistant/vacuum/v/config", json!({"state_topic": "v"})),
    ]);
    assert_eq!(found.devices.len(), 2);
    let reasons: Vec<(&str, &str)> = found
        .skipped
        .iter()
        .map(|s| (s.topic.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("homeassistant/light/bad/config", "not JSON"),
            (
                "homeassistant/vacuum/v/config",
                "`vacuum` is not a component dk maps"
            ),
        ]
    );
    let lock = found.devices.iter().find(|d| d.kind == "lock").unwrap();
    assert_eq!(lock.id, "zigbee2mqtt-0x01");
    assert_eq!(names(lock), ["read_lock", "lock", "unlock"]);
    let unlock = lock.actuator.iter().find(|a| a.name == "unlock").unwrap();
    assert!(unlock.confirm, "unlock asks every time");
    assert_eq!(unlock.description, "Unlock Front door.");
    let lamp = found.devices.iter().find(|d| d.kind == "light").unwrap();
    assert_eq!(lamp.name, "Lamp[2J", "hidden characters are dropped");
    assert_eq!(
        names(lamp),
        ["read_light", "turn_on", "turn_off", "set_brightness"]
    );
    let on = &lamp.actuator[0];
    assert_eq!(on.payload, json!({"state": "ON"}));
    assert_eq!(on.params, None, "no free string");
    assert_eq!(on.description, "Turn Lamp[2J on.");
    let text = to_toml(&found);
    let back = BridgeConfig::parse(&text).unwrap();
    assert_eq!(back.device.len(), 2);
    assert!(text.contains("# - `homeassistant/light/bad/config`: not JSON"));
}

#[test]
fn a_plain_switch_takes_its_own_payloads_and_two_on_one_device_differ() {
    let device = json!({"identifiers": ["plug_2"], "name": "Double plug"});
    let switch = |n: u8| {
        config(
            &format!("homeassistant/switch/plug_2/l{n}/config"),
            json!({"name": format!("Socket {n}"), "state_topic": "tasmota/plug_2/state",
                   "command_topic": format!("cmnd/plug_2/POWER{n}"),
                   "payload_on": "1", "payload_off": "0", "state_on": "ON", "state_off": "OFF",
                   "value_template": format!("{{{{ value_json.POWER{n} }}}}"), "device": device}),
        )
    };
    let found = propose(&[switch(1), switch(2)]);
    let plug = &found.devices[0];
    assert_eq!(
        names(plug),
        [
            "read_l1",
            "read_l2",
            "turn_on",
            "turn_off",
            "turn_on_l2",
            "turn_off_l2"
        ]
    );
    let on = &plug.actuator[2];
    assert_eq!(on.command_topic, "cmnd/plug_2/POWER2");
    assert_eq!(on.payload, json!("1"), "sent as its text");
    assert_eq!(on.expect, Some(json!({"POWER2": "ON"})));
    let found = propose(&[config(
        "homeassistant/switch/x/config",
        json!({"name": "X", "state_topic": "x", "command_topic": "x/set",
               "payload_on": "ON\"; rm -rf"}),
    )]);
    assert!(found.devices.is_empty());
    assert!(
        found.skipped[0]
            .reason
            .contains("is neither a JSON object nor one word"),
        "{:?}",
        found.skipped
    );
}

#[test]
fn covers_and_climates_are_confirmed_by_what_their_state_reports() {
    let found = propose(&[
        config(
            "homeassistant/cover/0x03/cover/config",
            json!({"name": "Blind", "state_topic": "zigbee2mqtt/blind",
                   "command_topic": "zigbee2mqtt/blind/set",
                   "value_template": "{{ value_json.state }}"}),
        ),
        config(
            "homeassistant/climate/0x04/climate/config",
            json!({"name": "Hall", "current_temperature_topic": "zigbee2mqtt/hall",
                   "current_temperature_template": "{{ value_json.local_temperature }}",
                   "temperature_command_topic": "zigbee2mqtt/hall/set/current_heating_setpoint",
                   "temperature_state_template": "{{ value_json.current_heating_setpoint }}"}),
        ),
    ]);
    let blind = found.devices.iter().find(|d| d.kind == "cover").unwrap();
    let open = blind.actuator.iter().find(|a| a.name == "open").unwrap();
    assert!(open.confirm, "open asks every time");
    assert_eq!(open.expect, Some(json!({"state": "OPEN"})));
    let hall = found.devices.iter().find(|d| d.kind == "climate").unwrap();
    assert_eq!(names(hall), ["read_climate", "set_temperature"]);
    let set = &hall.actuator[0];
    assert_eq!(set.payload, json!("{celsius}"));
    assert_eq!(
        set.expect,
        Some(json!({"current_heating_setpoint": "{celsius}"}))
    );
}

#[test]
fn a_device_of_two_hundred_entities_is_cut_to_the_cap() {
    let device = json!({"identifiers": ["big"], "name": "Big"});
    let configs: Vec<_> = (0..200)
        .map(|n| {
            config(
                &format!("homeassistant/sensor/big/s{n:03}/config"),
                json!({"name": format!("S{n}"), "state_topic": "big/state",
                       "value_template": format!("{{{{ value_json.s{n} }}}}"), "device": device}),
            )
        })
        .collect();
    let found = propose(&configs);
    assert_eq!(found.devices.len(), 1);
    assert_eq!(found.devices[0].sensor.len(), MAX_CAPABILITIES);
    assert_eq!(found.skipped_count(), 200 - MAX_CAPABILITIES as u64);
    assert!(found.skipped[0].reason.contains("32 capabilities"));
}

#[test]
fn ids_fit_are_stable_and_two_identifiers_never_share_one() {
    let check = |identifier: &str, name: &str| {
        let id = device_id(identifier, name, 0);
        assert!(id.len() <= 24, "{id}");
        assert_eq!(id, device_id(identifier, name, 0), "stable");
        id
    };
    assert_eq!(check("zigbee2mqtt_0x01", "Lamp"), "zigbee2mqtt-0x01");
    let long = check("zigbee2mqtt_0x00158d0001a2b3c4", "Front door");
    assert!(long.starts_with("front-door-"), "{long}");
    assert_eq!(long.len(), "front-door-".len() + 6);
    let odd = check("\u{202e}\u{1b}", "\u{202e}");
    assert!(odd.starts_with("device-"), "{odd}");
    // Two identifiers the same long name would give one id: the second
    // gets more of its hash.
    let twin = |ieee: &str| {
        config(
            &format!("homeassistant/sensor/{ieee}/t/config"),
            json!({"name": "T", "state_topic": format!("z/{ieee}"),
                   "device": {"identifiers": [format!("zigbee2mqtt_{ieee}")],
                              "name": "Kitchen sensor"}}),
        )
    };
    let mut ids: Vec<String> = (0..50)
        .flat_map(|n| propose(&[twin(&format!("0x{n:016x}"))]).devices)
        .map(|d| d.id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 50);
    let found = propose(&[twin("0xa"), twin("0xb")]);
    assert_eq!(found.devices.len(), 2);
    assert_ne!(found.devices[0].id, found.devices[1].id);
}

#[test]
fn hidden_characters_in_topics_skip_their_config_and_toml_escapes_the_rest() {
    for (bad, shows) in [
        ("z/\u{202e}kcol", "\\u{202e}"),
        ("z/\u{9b}2J", "\\u{9b}"),
        ("z/a\u{7f}", "\\u{7f}"),
        ("z/+/set", "`+`"),
    ] {
        let found = propose(&[
            config(
                "homeassistant/switch/good/config",
                json!({"name": "Good", "state_topic": "z/good", "command_topic": "z/good/set"}),
            ),
            config(
                "homeassistant/switch/bad/config",
                json!({"name": "Bad", "state_topic": "z/bad", "command_topic": bad}),
            ),
        ]);
        assert_eq!(found.devices.len(), 1, "{bad:?}");
        assert_eq!(found.skipped.len(), 1, "{bad:?}");
        assert!(
            found.skipped[0].reason.contains(shows),
            "{:?}",
            found.skipped
        );
        let text = to_toml(&found);
        assert!(!text.contains(['\u{202e}', '\u{9b}', '\u{7f}']), "{text:?}");
        BridgeConfig::parse(&text).unwrap();
    }
    // Names and payloads with what TOML must escape read back the same.
    let found = propose(&[config(
        "homeassistant/lock/l/config",
        json!({"name": "Door \"A\" \\ B", "state_topic": "z/l", "command_topic": "z/l/set",
               "payload_lock": "LO\"CK\\"}),
    )]);
    let back = BridgeConfig::parse(&to_toml(&found)).unwrap();
    assert_eq!(back.device[0].name, "Door \"A\" \\ B");
    assert_eq!(
        back.device[0].actuator[0].payload,
        json!({"state": "LO\"CK\\"})
    );
}

#[test]
fn what_is_kept_while_listening_is_bounded() {
    let mut heard = Heard::default();
    heard.offer(
        "homeassistant/sensor/big/config",
        &vec![b' '; MAX_CONFIG_BYTES + 1],
    );
    let payload = vec![b' '; MAX_CONFIG_BYTES];
    let mut n = 0;
    while heard.found.skipped.len() < 2 {
        heard.offer(&format!("homeassistant/sensor/s{n}/config"), &payload);
        n += 1;
        assert!(n < 10_000);
    }
    assert!(heard.bytes <= MAX_DISCOVERY_BYTES);
    assert_eq!(heard.configs.len(), n - 1);
    assert!(heard.found.skipped[0].reason.contains("over the 65536"));
    assert!(heard.found.skipped[1].reason.contains("bytes of configs"));
    // A config heard again replaces the first and costs nothing more.
    let kept = heard.bytes;
    heard.offer("homeassistant/sensor/s0/config", b"{}");
    assert_eq!(heard.bytes, kept - MAX_CONFIG_BYTES + 2);
}

#[test]
fn a_neighbour_of_a_locks_command_topic_asks_too_and_unrelated_topics_do_not() {
    let lock = config(
        "homeassistant/lock/door/lock/config",
        json!({"name": "Door", "state_topic": "z/door", "command_topic": "z/door/set",
               "device": {"identifiers": ["door"], "name": "Door"}}),
    );
    let switch = |object: &str, command: &str| {
        config(
            &format!("homeassistant/switch/{object}/config"),
            json!({"name": object, "state_topic": format!("z/{object}"),
                   "command_topic": command, "payload_on": "UNLOCK",
                   "device": {"identifiers": [object], "name": object}}),
        )
    };
    let found = propose(&[
        lock,
        switch("below", "z/door/set/state"),
        switch("above", "z/door"),
        switch("lamp", "z/lamp/set"),
        switch("doorbell", "z/doorbell/set"),
    ]);
    let confirm = |id: &str| {
        let device = found.devices.iter().find(|d| d.id == id).unwrap();
        device.actuator.iter().all(|a| a.confirm)
    };
    assert!(confirm("below") && confirm("above"));
    assert!(!confirm("lamp") && !confirm("doorbell"));
    let door = found.devices.iter().find(|d| d.id == "door").unwrap();
    let lock = door.actuator.iter().find(|a| a.name == "lock").unwrap();
    assert!(!lock.confirm, "a lock's own lock does not ask");
    let text = to_toml(&found);
    assert!(
        text.contains("# below: `turn_on` asks every time: it publishes to `z/door/set/state`, next to `z/door/set`"),
        "{text}"
    );
}

#[test]
fn a_second_entity_of_a_kind_is_named_by_what_tells_it_apart() {
    let device = json!({"identifiers": ["door"], "name": "Front door"});
    let lock = |object: &str, name: Value| {
        config(
            &format!("homeassistant/lock/door/{object}/config"),
            json!({"name": name, "state_topic": "z/door", "command_topic": format!("z/{object}/set"),
                   "device": device}),
        )
    };
    let found = propose(&[lock("bolt", json!("Bolt")), lock("lock", json!("Latch"))]);
    assert_eq!(
        names(&found.devices[0]),
        [
            "read_bolt",
            "read_lock",
            "lock",
            "unlock",
            "lock_latch",
            "unlock_latch"
        ]
    );
    let found = propose(&[lock("bolt", json!(null)), lock("lock", json!(null))]);
    assert_eq!(
        names(&found.devices[0]),
        [
            "read_bolt",
            "read_lock",
            "lock",
            "unlock",
            "lock_2",
            "unlock_2"
        ]
    );
}
