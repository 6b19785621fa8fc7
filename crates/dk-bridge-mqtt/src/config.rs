//! The bridge's configuration: a TOML file in the style of `dk vessel
//! --config` (camelCase keys, unknown keys refused, the whole file refused
//! at the first error). Each `[[device]]` maps one MQTT device; its
//! manifest is built from the mapping and checked by dk-proto's rules like
//! any device's.
//!
//! ```toml
//! [broker]
//! confirmTimeoutMs = 5000
//!
//! [[device]]
//! id = "living-room-light"
//! name = "Living room light"
//! kind = "light"
//! stateTopic = "zigbee2mqtt/living_room_light"
//!
//! [[device.sensor]]
//! name = "read_light"
//! description = "Whether the light is on, and its brightness."
//!
//! [[device.actuator]]
//! name = "set_light"
//! description = "Turn the light on or off."
//! commandTopic = "zigbee2mqtt/living_room_light/set"
//! payload = { state = "{state}", brightness = "{brightness}" }
//! params = { state = { type = "string", required = true }, brightness = { type = "number" } }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use dk_proto::{Manifest, ManifestError, is_unsafe_char};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// How long an actuator waits for its state topic to confirm, by default.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// Most devices one bridge maps.
pub const MAX_DEVICES: usize = 1000;
/// Largest configuration file read (1 MiB).
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BridgeConfig {
    /// How the broker is reached, beyond its URL.
    #[serde(default)]
    pub broker: BrokerConfig,
    /// The mapped devices.
    #[serde(default)]
    pub device: Vec<DeviceMap>,
}

/// The broker's options (its URL and credentials come from the command
/// line and the environment, never from here in clear).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BrokerConfig {
    /// How long an actuator waits for confirmation (milliseconds).
    pub confirm_timeout_ms: Option<u64>,
    /// For `mqtts://`: a PEM file of the certificates that may sign the
    /// broker's (its CA, or its own certificate). [default: the platform's
    /// root certificates]
    pub ca_file: Option<PathBuf>,
}

/// One MQTT device, as one dk device.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceMap {
    /// The dk device id.
    pub id: String,
    /// Its name, as the person sees it.
    pub name: String,
    /// Its kind (`light`, `lock`, `climate`, ...).
    pub kind: String,
    /// Where the device publishes its state (JSON).
    pub state_topic: String,
    /// The device's dk/2 key file (default: `.dk/<id>.key`; `dk bridge
    /// mqtt` fills in `devices/<id>.key` in dk's home instead).
    pub key_file: Option<PathBuf>,
    /// Sensors: read from the last state.
    #[serde(default)]
    pub sensor: Vec<SensorMap>,
    /// Actuators: publish, then wait for the state to confirm.
    #[serde(default)]
    pub actuator: Vec<ActuatorMap>,
}

/// A sensor capability: a value of the last state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SensorMap {
    /// The capability's name.
    pub name: String,
    /// What it reads.
    pub description: String,
    /// A dot-separated path into the state's JSON (`state`,
    /// `climate.current`); none: the whole state.
    pub path: Option<String>,
}

/// An actuator capability: a payload published to a command topic.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ActuatorMap {
    /// The capability's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Where the payload goes.
    pub command_topic: String,
    /// The payload, a JSON template (`template.rs`).
    pub payload: Value,
    /// What the state must then show: a template too, compared as a
    /// subset of the state. [default: the payload]
    pub expect: Option<Value>,
    /// The manifest's params of the capability.
    #[serde(default)]
    pub params: Option<Value>,
    /// Whether the person is asked every time. Locks' unlock and covers'
    /// open should say so.
    #[serde(default)]
    pub confirm: bool,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than a configuration can be.
    #[error("`{}` is over 1 MiB", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Not TOML of this shape.
    #[error("{0}")]
    Syntax(String),
    /// A mapping is wrong.
    #[error("device `{device}`: {why}")]
    Device {
        /// The device id, as written.
        device: String,
        /// What is wrong.
        why: String,
    },
    /// More devices than one bridge maps.
    #[error("{0} devices are mapped; one bridge maps at most {MAX_DEVICES}")]
    TooMany(usize),
}

impl BridgeConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<BridgeConfig, ConfigError> {
        let read = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let size = std::fs::metadata(path).map_err(read)?.len();
        if size > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_owned(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        BridgeConfig::parse(&text)
    }

    /// Parses and checks `text`: every device's manifest must validate,
    /// ids must differ, topics must be plain (no wildcard).
    pub fn parse(text: &str) -> Result<BridgeConfig, ConfigError> {
        let config: BridgeConfig =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        if config.device.len() > MAX_DEVICES {
            return Err(ConfigError::TooMany(config.device.len()));
        }
        if config.broker.confirm_timeout_ms == Some(0) {
            return Err(ConfigError::Syntax(
                "confirmTimeoutMs must be at least 1".to_owned(),
            ));
        }
        let mut keys = std::collections::BTreeSet::new();
        let mut ids = std::collections::BTreeSet::new();
        for device in &config.device {
            let refuse = |why: String| ConfigError::Device {
                device: device.id.clone(),
                why,
            };
            if !ids.insert(device.id.clone()) {
                return Err(refuse("mapped twice".to_owned()));
            }
            if !keys.insert(device.key_file()) {
                return Err(refuse("its key file is another device's".to_owned()));
            }
            device.manifest().map_err(|e| refuse(e.to_string()))?;
            let topics = std::iter::once(&device.state_topic)
                .chain(device.actuator.iter().map(|a| &a.command_topic));
            for topic in topics {
                plain_topic(topic).map_err(refuse)?;
            }
        }
        Ok(config)
    }

    /// How long actuators wait for confirmation.
    pub fn confirm_timeout(&self) -> Duration {
        self.broker
            .confirm_timeout_ms
            .map_or(DEFAULT_CONFIRM_TIMEOUT, Duration::from_millis)
    }
}

/// `text` as a TOML basic string: `"` and `\` escaped, and every
/// control or hidden character (C0, DEL, C1, bidirectional overrides,
/// zero-width marks) written as a `\u` escape, so the file holds only
/// characters that show what they are.
pub(crate) fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || is_unsafe_char(c) => {
                let n = u32::from(c);
                if n > 0xFFFF {
                    out.push_str(&format!("\\U{n:08X}"));
                } else {
                    out.push_str(&format!("\\u{n:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `value` as TOML: strings by [`toml_string`], objects as inline tables
/// with quoted keys.
fn toml_value(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let inner: Vec<String> = fields
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{} = {}", toml_string(k), toml_value(v)))
                .collect();
            format!("{{ {} }}", inner.join(", "))
        }
        Value::Array(items) => {
            let inner: Vec<String> = items
                .iter()
                .filter(|v| !v.is_null())
                .map(toml_value)
                .collect();
            format!("[{}]", inner.join(", "))
        }
        Value::String(text) => toml_string(text),
        other => other.to_string(),
    }
}

/// `text` for a message or a comment: control and hidden characters shown
/// as `\u{..}`, cut to 160 characters.
pub(crate) fn shown(text: &str) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n >= 160 {
            out.push_str("...");
            break;
        }
        if c.is_control() || is_unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// A topic a mapping may name: 1 to 1,024 bytes, no wildcard (`+`, `#`),
/// and no control or hidden character (NUL, DEL, C1 controls,
/// bidirectional overrides, zero-width marks): what the person reviews is
/// what is published to.
pub(crate) fn plain_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic.len() > 1024 {
        return Err(format!("topic `{}` must be 1 to 1,024 bytes", shown(topic)));
    }
    if topic.contains(['+', '#']) {
        return Err(format!("topic `{}` must not hold `+` or `#`", shown(topic)));
    }
    if let Some(c) = topic.chars().find(|c| c.is_control() || is_unsafe_char(*c)) {
        return Err(format!(
            "topic `{}` holds the hidden character U+{:04X}",
            shown(topic),
            u32::from(c)
        ));
    }
    Ok(())
}

impl DeviceMap {
    /// The device's manifest, checked by dk-proto's rules.
    pub fn manifest(&self) -> Result<Manifest, ManifestError> {
        let mut capabilities = Vec::new();
        for sensor in &self.sensor {
            capabilities.push(json!({
                "name": sensor.name, "kind": "sensor", "description": sensor.description,
            }));
        }
        for actuator in &self.actuator {
            let mut capability = Map::new();
            capability.insert("name".to_owned(), json!(actuator.name));
            capability.insert("kind".to_owned(), json!("actuator"));
            capability.insert("description".to_owned(), json!(actuator.description));
            if let Some(params) = &actuator.params {
                capability.insert("params".to_owned(), params.clone());
            }
            if actuator.confirm {
                capability.insert("confirm".to_owned(), json!(true));
            }
            capabilities.push(Value::Object(capability));
        }
        let manifest = json!({
            "id": self.id, "name": self.name, "kind": self.kind, "version": "1.0.0",
            "capabilities": capabilities,
        });
        dk_proto::validate_manifest(&manifest)
    }

    /// The mapping as a `[[device]]` of the configuration file.
    pub fn to_toml(&self) -> String {
        let line = |key: &str, value: &Value| format!("{key} = {}\n", toml_value(value));
        let mut out = String::from("\n[[device]]\n");
        out.push_str(&line("id", &json!(self.id)));
        out.push_str(&line("name", &json!(self.name)));
        out.push_str(&line("kind", &json!(self.kind)));
        out.push_str(&line("stateTopic", &json!(self.state_topic)));
        for sensor in &self.sensor {
            out.push_str("\n[[device.sensor]]\n");
            out.push_str(&line("name", &json!(sensor.name)));
            out.push_str(&line("description", &json!(sensor.description)));
            if let Some(path) = &sensor.path {
                out.push_str(&line("path", &json!(path)));
            }
        }
        for actuator in &self.actuator {
            out.push_str("\n[[device.actuator]]\n");
            out.push_str(&line("name", &json!(actuator.name)));
            out.push_str(&line("description", &json!(actuator.description)));
            out.push_str(&line("commandTopic", &json!(actuator.command_topic)));
            out.push_str(&line("payload", &actuator.payload));
            if let Some(expect) = &actuator.expect {
                out.push_str(&line("expect", expect));
            }
            if let Some(params) = &actuator.params {
                out.push_str(&line("params", params));
            }
            if actuator.confirm {
                out.push_str("confirm = true\n");
            }
        }
        out
    }

    /// Where its key is kept.
    pub fn key_file(&self) -> PathBuf {
        self.key_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(".dk").join(format!("{}.key", self.id)))
    }
}

#[cfg(test)]
mod tests {
    use super::{BridgeConfig, ConfigError};

    const LIGHT: &str = include_str!("../../../fixtures/bridge/zigbee2mqtt-light.toml");

    #[test]
    fn a_mapping_makes_a_manifest_and_a_broken_one_is_refused_whole() {
        let config = BridgeConfig::parse(LIGHT).unwrap();
        assert_eq!(config.confirm_timeout().as_millis(), 3000);
        let manifest = config.device[0].manifest().unwrap();
        assert_eq!(manifest.id(), "living-room-light");
        assert_eq!(manifest.capabilities().len(), 2);
        for (broken, says) in [
            (LIGHT.replace("stateTopic", "stateTopik"), "unknown field"),
            (
                LIGHT.replace("zigbee2mqtt/lamp\"", "zigbee2mqtt/#\""),
                "`#`",
            ),
            (
                LIGHT.replace("Living room light\"", "Living\u{202e} light\""),
                "device `living-room-light`",
            ),
            (
                LIGHT.replace("zigbee2mqtt/lamp/set", "zigbee2mqtt/\\u202Etes/pmal"),
                "hidden character U+202E",
            ),
            (
                LIGHT.replace("zigbee2mqtt/lamp/set", "zigbee2mqtt/lamp\u{9b}2J/set"),
                "hidden character U+009B",
            ),
            (
                LIGHT.replace("\"zigbee2mqtt/lamp\"", "\"zigbee2mqtt/lamp\\u007F\""),
                "hidden character U+007F",
            ),
            (
                format!(
                    "{LIGHT}\n[[device]]\nid = \"living-room-light\"\nname = \"x\"\nkind = \"x\"\nstateTopic = \"x\"\n"
                ),
                "mapped twice",
            ),
        ] {
            let error = BridgeConfig::parse(&broken).unwrap_err();
            assert!(error.to_string().contains(says), "{error}");
        }
        assert!(matches!(
            BridgeConfig::parse("[[device]]\nid = 3"),
            Err(ConfigError::Syntax(_))
        ));
    }
}
