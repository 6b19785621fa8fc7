//! Home Assistant MQTT discovery: `dk bridge mqtt discover` reads the
//! retained configs under `homeassistant/<component>/[<node>/]<object>/config`
//! and proposes a mapping (the bridge's TOML) for lights, switches, locks,
//! climates, covers, sensors and binary sensors. A proposal is only
//! printed: nothing is bridged until the person keeps it in a file and
//! starts the bridge with it, and then pairs and grants each device.
//!
//! Configs are untrusted: text is cut and cleaned of characters a manifest
//! may not hold, ids are made of `[a-z0-9-]`, a device gets at most
//! [`MAX_CAPABILITIES`] capabilities, and a config that is not JSON or
//! names no usable topic is skipped and counted. Locks' `unlock` and
//! covers' `open` ask the person every time.

use std::collections::BTreeMap;
use std::time::Duration;

use dk_proto::is_unsafe_char;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

use crate::bridge::broker_address;
use crate::config::{ActuatorMap, DeviceMap, SensorMap};
use crate::{BridgeError, MAX_STATE_BYTES};

/// Most capabilities one proposed device gets.
pub const MAX_CAPABILITIES: usize = 32;
/// Most devices one discovery proposes.
pub const MAX_PROPOSED: usize = 500;

/// What discovery found.
#[derive(Debug, Default)]
pub struct Discovered {
    /// The proposed devices, by id.
    pub devices: Vec<DeviceMap>,
    /// Configs skipped (not JSON, too large, an unknown component, no
    /// usable topic, or past the caps).
    pub skipped: u64,
}

/// Text from a config, cleaned: unsafe characters dropped, cut to `most`
/// characters, trimmed; `fallback` when nothing is left.
fn clean(text: &str, most: usize, fallback: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| !is_unsafe_char(*c))
        .take(most)
        .collect();
    let kept = kept.trim();
    if kept.is_empty() {
        fallback.to_owned()
    } else {
        kept.to_owned()
    }
}

/// An id of `[a-z0-9-]`, at most 64 characters.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
        if out.len() >= 64 {
            break;
        }
    }
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() {
        "device".to_owned()
    } else {
        out
    }
}

/// A capability name of `[a-z0-9_]`.
fn capability_name(prefix: &str, object: &str) -> String {
    let name = slug(object).replace('-', "_");
    let name = format!("{prefix}_{name}");
    name.chars().take(48).collect()
}

/// `{{ value_json.a.b }}` as the path `a.b`.
fn value_path(config: &Value) -> Option<String> {
    let template = config.get("value_template")?.as_str()?;
    let inner = template
        .trim()
        .strip_prefix("{{")?
        .strip_suffix("}}")?
        .trim()
        .strip_prefix("value_json.")?;
    inner
        .split('.')
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then(|| inner.to_owned())
}

fn topic(config: &Value, key: &str) -> Option<String> {
    let topic = config.get(key)?.as_str()?;
    (!topic.is_empty() && topic.len() <= 1024 && !topic.contains(['+', '#', '\0']))
        .then(|| topic.to_owned())
}

fn text_of(config: &Value, key: &str) -> Option<String> {
    config.get(key).and_then(|v| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

/// Adds one entity's capabilities to `device`; `false` when it gives none.
fn add_entity(device: &mut DeviceMap, component: &str, object: &str, config: &Value) -> bool {
    let name = clean(
        &text_of(config, "name").unwrap_or_else(|| object.to_owned()),
        60,
        object,
    );
    let state = topic(config, "state_topic");
    let command = topic(config, "command_topic");
    let sensor = |prefix: &str, path: Option<String>| SensorMap {
        name: capability_name(prefix, object),
        description: clean(&format!("Read {name}."), 200, "Read it."),
        path,
    };
    let act =
        |prefix: &str, topic: String, payload: Value, confirm: bool, params: Option<Value>| {
            ActuatorMap {
                name: capability_name(prefix, object),
                description: clean(&format!("{prefix} {name}."), 200, "Act."),
                command_topic: topic,
                payload,
                expect: None,
                params,
                confirm,
            }
        };
    // What a state must show, at the entity's path (`state` by default).
    let at_path = |path: Option<&str>, value: Value| {
        let mut expect = value;
        for key in path.unwrap_or("state").rsplit('.') {
            expect = json!({ key: expect });
        }
        expect
    };
    if !matches!(
        component,
        "sensor" | "binary_sensor" | "light" | "switch" | "lock" | "cover" | "climate"
    ) {
        return false;
    }
    let before = device.sensor.len() + device.actuator.len();
    if let Some(state) = &state
        && device.state_topic.is_empty()
    {
        device.state_topic.clone_from(state);
    }
    let path = value_path(config);
    match component {
        "sensor" | "binary_sensor" => {
            if state.is_some() {
                device.sensor.push(sensor("read", path));
            }
        }
        "light" | "switch" => {
            if state.is_some() {
                device
                    .sensor
                    .push(sensor("read", path.or(Some("state".to_owned()))));
            }
            if let Some(command) = command {
                let params = json!({"state": {"type": "string", "required": true,
                    "description": "ON or OFF"}});
                device.actuator.push(act(
                    "set",
                    command,
                    json!({"state": "{state}"}),
                    false,
                    Some(params),
                ));
            }
        }
        "lock" => {
            if state.is_some() {
                device
                    .sensor
                    .push(sensor("read", path.or(Some("state".to_owned()))));
            }
            if let Some(command) = command {
                let lock = text_of(config, "payload_lock").unwrap_or_else(|| "LOCK".to_owned());
                let unlock =
                    text_of(config, "payload_unlock").unwrap_or_else(|| "UNLOCK".to_owned());
                device.actuator.push(act(
                    "lock",
                    command.clone(),
                    json!({"state": clean(&lock, 32, "LOCK")}),
                    false,
                    None,
                ));
                device.actuator.push(act(
                    "unlock",
                    command,
                    json!({"state": clean(&unlock, 32, "UNLOCK")}),
                    true,
                    None,
                ));
            }
        }
        "cover" => {
            if state.is_some() {
                device
                    .sensor
                    .push(sensor("read", path.clone().or(Some("state".to_owned()))));
            }
            if let Some(command) = command {
                let open = text_of(config, "payload_open").unwrap_or_else(|| "OPEN".to_owned());
                let close = text_of(config, "payload_close").unwrap_or_else(|| "CLOSE".to_owned());
                let (open, close) = (clean(&open, 32, "OPEN"), clean(&close, 32, "CLOSE"));
                let mut opening = act("open", command.clone(), json!(open), true, None);
                opening.expect = Some(at_path(path.as_deref(), json!(open)));
                let mut closing = act("close", command, json!(close), false, None);
                closing.expect = Some(at_path(path.as_deref(), json!(close)));
                device.actuator.push(opening);
                device.actuator.push(closing);
            }
        }
        "climate" => {
            if let Some(current) = topic(config, "current_temperature_topic") {
                if device.state_topic.is_empty() {
                    device.state_topic = current;
                }
                device.sensor.push(sensor(
                    "read",
                    value_path(
                        &json!({"value_template": config.get("current_temperature_template")}),
                    ),
                ));
            }
            if let Some(command) = topic(config, "temperature_command_topic") {
                let params = json!({"celsius": {"type": "number", "required": true,
                    "description": "target temperature"}});
                let mut setting = act(
                    "set_target",
                    command,
                    json!("{celsius}"),
                    false,
                    Some(params),
                );
                // Confirmed by the target as the state reports it.
                let target = value_path(&json!({
                    "value_template": config.get("temperature_state_template")
                }));
                setting.expect = Some(at_path(
                    Some(target.as_deref().unwrap_or("current_heating_setpoint")),
                    json!("{celsius}"),
                ));
                device.actuator.push(setting);
            }
        }
        _ => return false,
    }
    // Lights, switches, locks and covers with a state are confirmed by it;
    // without a state topic nothing could confirm a command.
    device.sensor.len() + device.actuator.len() > before
}

/// Proposes mappings from discovery configs, as `(topic, payload)`.
pub fn propose(configs: &[(String, Vec<u8>)]) -> Discovered {
    let mut found = Discovered::default();
    let mut devices: BTreeMap<String, DeviceMap> = BTreeMap::new();
    for (topic, payload) in configs {
        let parts: Vec<&str> = topic.split('/').collect();
        let (component, object) = match parts.as_slice() {
            ["homeassistant", component, object, "config"]
            | ["homeassistant", component, _, object, "config"] => (*component, *object),
            _ => {
                found.skipped += 1;
                continue;
            }
        };
        let config = (payload.len() <= MAX_STATE_BYTES)
            .then(|| serde_json::from_slice::<Value>(payload).ok())
            .flatten();
        let Some(config) = config.filter(Value::is_object) else {
            found.skipped += 1;
            continue;
        };
        let device_name = config
            .pointer("/device/name")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| text_of(&config, "name"))
            .unwrap_or_else(|| object.to_owned());
        let id = config
            .pointer("/device/identifiers/0")
            .and_then(Value::as_str)
            .map(slug)
            .unwrap_or_else(|| slug(&device_name));
        if !devices.contains_key(&id) && devices.len() >= MAX_PROPOSED {
            found.skipped += 1;
            continue;
        }
        let device = devices.entry(id.clone()).or_insert_with(|| DeviceMap {
            id: id.clone(),
            name: clean(&device_name, 60, &id),
            kind: component.to_owned(),
            state_topic: String::new(),
            key_file: None,
            sensor: Vec::new(),
            actuator: Vec::new(),
        });
        if device.sensor.len() + device.actuator.len() >= MAX_CAPABILITIES
            || !add_entity(device, component, object, &config)
        {
            found.skipped += 1;
        }
    }
    for (_, mut device) in devices {
        device.sensor.truncate(MAX_CAPABILITIES);
        let room = MAX_CAPABILITIES.saturating_sub(device.sensor.len());
        device.actuator.truncate(room);
        // Names must differ within a device.
        let mut names = std::collections::BTreeSet::new();
        device.sensor.retain(|s| names.insert(s.name.clone()));
        device.actuator.retain(|a| names.insert(a.name.clone()));
        // A device whose every entity was skipped was counted with them.
        if device.sensor.is_empty() && device.actuator.is_empty() {
            continue;
        }
        if device.state_topic.is_empty() || device.manifest().is_err() {
            found.skipped += 1;
            continue;
        }
        found.devices.push(device);
    }
    found
}

/// Reads retained discovery configs from `broker_url` for `wait`, then
/// proposes mappings.
pub async fn discover(
    broker_url: &str,
    credentials: Option<(String, String)>,
    wait: Duration,
) -> Result<Discovered, BridgeError> {
    let address = broker_address(broker_url)?;
    let mut options = MqttOptions::new("dk-bridge-discover", address.host, address.port);
    if address.tls {
        let tls = crate::bridge::tls_config(None)?;
        options.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
            std::sync::Arc::new(tls),
        )));
    }
    options.set_max_packet_size(crate::MAX_PACKET_BYTES, 64 * 1024);
    if let Some((user, password)) = credentials {
        options.set_credentials(user, password);
    }
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let mut configs = Vec::new();
    let mut skipped_large = 0u64;
    let collect = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    for filter in ["homeassistant/+/+/config", "homeassistant/+/+/+/config"] {
                        let _ = client.subscribe(filter, QoS::AtMostOnce).await;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    // Large configs are not kept: at most 5,000 of 256 KiB.
                    if publish.payload.len() > MAX_STATE_BYTES {
                        skipped_large += 1;
                    } else if configs.len() < 10 * MAX_PROPOSED {
                        configs.push((publish.topic.clone(), publish.payload.to_vec()));
                    }
                }
                Ok(_) => {}
                Err(error) => return Err::<(), _>(BridgeError::Broker(error.to_string())),
            }
        }
    };
    // Listening ends when `wait` is over, or at a broker error.
    if let Ok(Err(error)) = tokio::time::timeout(wait, collect).await {
        return Err(error);
    }
    let _ = client.disconnect().await;
    let mut found = propose(&configs);
    found.skipped += skipped_large;
    Ok(found)
}

/// The proposal as the bridge's TOML, to review and keep.
pub fn to_toml(found: &Discovered) -> String {
    let mut out = String::from(
        "# Proposed by `dk bridge mqtt discover`. Review every device: delete what\n\
         # the agent must not reach, then keep this file and start\n\
         # `dk bridge mqtt --config FILE`. Each device still has to be paired and\n\
         # granted by you.\n",
    );
    for device in &found.devices {
        out.push_str(&device.to_toml());
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{MAX_CAPABILITIES, propose, to_toml};
    use crate::BridgeConfig;

    fn config(topic: &str, value: serde_json::Value) -> (String, Vec<u8>) {
        (topic.to_owned(), value.to_string().into_bytes())
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
                       "command_topic": "zigbee2mqtt/lamp/set", "schema": "json"}),
            ),
            (
                "homeassistant/light/bad/config".to_owned(),
                b"{not json".to_vec(),
            ),
            config("homeassistant/vacuum/v/config", json!({"state_topic": "v"})),
        ]);
        assert_eq!(found.devices.len(), 2);
        assert_eq!(found.skipped, 2);
        let lock = found.devices.iter().find(|d| d.kind == "lock").unwrap();
        assert_eq!(lock.id, "zigbee2mqtt-0x01");
        let unlock = lock
            .actuator
            .iter()
            .find(|a| a.name == "unlock_lock")
            .unwrap();
        assert!(unlock.confirm, "unlock asks every time");
        let lamp = found.devices.iter().find(|d| d.kind == "light").unwrap();
        assert_eq!(lamp.name, "Lamp[2J", "hidden characters are dropped");
        let text = to_toml(&found);
        let back = BridgeConfig::parse(&text).unwrap();
        assert_eq!(back.device.len(), 2);
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
        let open = blind
            .actuator
            .iter()
            .find(|a| a.name == "open_cover")
            .unwrap();
        assert!(open.confirm, "open asks every time");
        assert_eq!(open.expect, Some(json!({"state": "OPEN"})));
        let hall = found.devices.iter().find(|d| d.kind == "climate").unwrap();
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
                    &format!("homeassistant/sensor/big/s{n}/config"),
                    json!({"name": format!("S{n}"), "state_topic": "big/state",
                           "value_template": format!("{{{{ value_json.s{n} }}}}"), "device": device}),
                )
            })
            .collect();
        let found = propose(&configs);
        assert_eq!(found.devices.len(), 1);
        assert_eq!(found.devices[0].sensor.len(), MAX_CAPABILITIES);
        assert_eq!(found.skipped, 200 - MAX_CAPABILITIES as u64);
    }
}
