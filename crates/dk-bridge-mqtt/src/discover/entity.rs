//! One discovery config read as an entity, and the capabilities its
//! component gives: a light's or switch's turning on and off (and a JSON
//! light's dimming), a lock's locking and unlocking, a cover's opening and
//! closing, a climate's target temperature, and the sensors reading their
//! states. Text from a config is cleaned, and a topic the bridge may not
//! name refuses the config.

use dk_proto::is_unsafe_char;
use serde_json::{Value, json};

use crate::config::{plain_topic, shown};

/// One discovery config, parsed.
pub(super) struct Entity {
    /// The config's topic.
    pub(super) topic: String,
    pub(super) component: String,
    pub(super) object: String,
    pub(super) config: Value,
}
/// The entity a config on `topic` describes; why not, when it describes none.
pub(super) fn parse_entity(topic: &str, payload: &[u8]) -> Result<Entity, String> {
    let parts: Vec<&str> = topic.split('/').collect();
    let (component, object) = match parts.as_slice() {
        ["homeassistant", component, object, "config"]
        | ["homeassistant", component, _, object, "config"] => (*component, *object),
        _ => return Err("not a discovery topic".to_owned()),
    };
    let config = serde_json::from_slice::<Value>(payload).map_err(|_| "not JSON".to_owned())?;
    if !config.is_object() {
        return Err("not a JSON object".to_owned());
    }
    for key in TOPIC_KEYS {
        topic_checked(&config, key)?;
    }
    Ok(Entity {
        topic: topic.to_owned(),
        component: component.to_owned(),
        object: object.to_owned(),
        config,
    })
}

fn topic_checked(config: &Value, key: &str) -> Result<(), String> {
    topic(config, key).map(|_| ())
}

/// Text from a config, cleaned: unsafe characters dropped, cut to `most`
/// characters, trimmed; `fallback` when nothing is left.
pub(super) fn clean(text: &str, most: usize, fallback: &str) -> String {
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

/// `{{ value_json.a.b }}` as the path `a.b`.
fn template_path(template: Option<&Value>) -> Option<String> {
    let inner = template?
        .as_str()?
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

/// The text (or number, as text) under `key`.
pub(super) fn text_of(config: &Value, key: &str) -> Option<String> {
    config.get(key).and_then(|v| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

/// The topics of a config the bridge would use.
const TOPIC_KEYS: [&str; 4] = [
    "state_topic",
    "command_topic",
    "current_temperature_topic",
    "temperature_command_topic",
];

/// The topic under `key`: `None` when absent, an error when it is not one
/// the bridge may name (a wildcard, a hidden character, too long).
fn topic(config: &Value, key: &str) -> Result<Option<String>, String> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(topic)) => plain_topic(topic)
            .map(|()| Some(topic.clone()))
            .map_err(|why| format!("its `{key}`: {why}")),
        Some(_) => Err(format!("its `{key}` is not text")),
    }
}

/// What the state must show, at `path` (`state` by default).
fn at_path(path: Option<&str>, value: Value) -> Value {
    let mut expect = value;
    for key in path.unwrap_or("state").rsplit('.') {
        expect = json!({ key: expect });
    }
    expect
}

/// A command payload named by a config (`payload_on`, `payload_lock`):
/// a JSON object it spells is sent as that object, a word as its text;
/// anything else the bridge cannot send as the config means.
fn command_payload(text: &str, key: &str) -> Result<Value, String> {
    if let Ok(object @ Value::Object(_)) = serde_json::from_str::<Value>(text) {
        return Ok(object);
    }
    let word = (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if word {
        Ok(json!(text))
    } else {
        Err(format!(
            "its `{key}` `{}` is neither a JSON object nor one word",
            shown(text)
        ))
    }
}

/// Where one capability being proposed goes, and what it sends.
pub(super) struct Command {
    pub(super) base: &'static str,
    pub(super) verb: String,
    pub(super) topic: String,
    pub(super) payload: Value,
    pub(super) expect: Option<Value>,
    pub(super) params: Option<Value>,
    pub(super) confirm: bool,
}

impl Command {
    /// A capability named from `base`, described by `verb`, publishing
    /// `payload` to `topic`, confirmed by nothing and asking no one.
    fn new(base: &'static str, verb: String, topic: &str, payload: Value) -> Self {
        Command {
            base,
            verb,
            topic: topic.to_owned(),
            payload,
            expect: None,
            params: None,
            confirm: false,
        }
    }

    /// The same, confirmed when the state shows `expect`.
    fn expecting(self, expect: Value) -> Self {
        Command {
            expect: Some(expect),
            ..self
        }
    }

    /// The same, taking `params`.
    fn taking(self, params: Value) -> Self {
        Command {
            params: Some(params),
            ..self
        }
    }

    /// The same, asking the person every time.
    fn confirmed(self) -> Self {
        Command {
            confirm: true,
            ..self
        }
    }
}

/// A sensor being proposed: its description and path.
pub(super) type Reading = (String, Option<String>);

/// The capabilities one entity gives, or why it gives none.
pub(super) fn capabilities(entity: &Entity) -> Result<(Vec<Reading>, Vec<Command>), String> {
    let parts = Parts::of(entity)?;
    let (sensors, commands) = match entity.component.as_str() {
        "sensor" | "binary_sensor" => (parts.reading(parts.path.clone()), Vec::new()),
        "light" | "switch" => (parts.state_reading(), parts.commands(Parts::switch)?),
        "lock" => (parts.state_reading(), parts.commands(Parts::lock)?),
        "cover" => (parts.state_reading(), parts.commands(Parts::cover)?),
        "climate" => (parts.temperature_reading()?, parts.thermostat()?),
        other => return Err(format!("`{}` is not a component dk maps", shown(other))),
    };
    if sensors.is_empty() && commands.is_empty() {
        return Err("it names no state or command topic dk can use".to_owned());
    }
    Ok((sensors, commands))
}

/// What an entity's capabilities are made of: its config, the name they
/// call it by, and its state and command topics.
struct Parts<'e> {
    config: &'e Value,
    /// The entity's name in capabilities' descriptions.
    name: String,
    state: Option<String>,
    command: Option<String>,
    /// Where its value is in its state (`value_template`).
    path: Option<String>,
}

impl<'e> Parts<'e> {
    /// The parts of `entity`; an error when a topic it names is not one
    /// the bridge may use.
    fn of(entity: &'e Entity) -> Result<Self, String> {
        let config = &entity.config;
        let device = config.pointer("/device/name").and_then(Value::as_str);
        let name = match (text_of(config, "name"), device) {
            (Some(own), Some(device)) if !own.starts_with(device) => format!("{device} {own}"),
            (Some(own), _) => own,
            (None, Some(device)) => device.to_owned(),
            (None, None) => entity.object.clone(),
        };
        Ok(Parts {
            config,
            name: clean(&name, 60, &entity.object),
            state: topic(config, "state_topic")?,
            command: topic(config, "command_topic")?,
            path: template_path(config.get("value_template")),
        })
    }

    /// A sensor reading the state at `path`, when there is a state topic.
    fn reading(&self, path: Option<String>) -> Vec<Reading> {
        match self.state {
            Some(_) => vec![(format!("Read {}.", self.name), path)],
            None => Vec::new(),
        }
    }

    /// A sensor reading the state, at `state` unless the config says where.
    fn state_reading(&self) -> Vec<Reading> {
        self.reading(self.path.clone().or_else(|| Some("state".to_owned())))
    }

    /// What `make` proposes for the command topic, when there is one.
    fn commands(
        &self,
        make: impl FnOnce(&Self, &str) -> Result<Vec<Command>, String>,
    ) -> Result<Vec<Command>, String> {
        match &self.command {
            Some(command) => make(self, command),
            None => Ok(Vec::new()),
        }
    }

    /// A light's or switch's turning on and off, and a JSON light's
    /// dimming when it has brightness.
    fn switch(&self, command: &str) -> Result<Vec<Command>, String> {
        let json_schema = self.config.get("schema").and_then(Value::as_str) == Some("json");
        let [on, off] = if json_schema {
            json_turns()
        } else {
            self.payload_turns()?
        };
        let name = &self.name;
        let mut commands = vec![
            Command::new("turn_on", format!("Turn {name} on."), command, on.payload)
                .expecting(on.expect),
            Command::new(
                "turn_off",
                format!("Turn {name} off."),
                command,
                off.payload,
            )
            .expecting(off.expect),
        ];
        if json_schema && self.config.get("brightness") == Some(&Value::Bool(true)) {
            commands.push(self.dimming(command));
        }
        Ok(commands)
    }

    /// Turning on and off with the payloads the config names (`ON` and
    /// `OFF` unless it says), confirmed by the state it names for each.
    fn payload_turns(&self) -> Result<[Turn; 2], String> {
        let config = self.config;
        let on_text = text_of(config, "payload_on").unwrap_or_else(|| "ON".to_owned());
        let off_text = text_of(config, "payload_off").unwrap_or_else(|| "OFF".to_owned());
        let on = command_payload(&on_text, "payload_on")?;
        let off = command_payload(&off_text, "payload_off")?;
        let shown_on = text_of(config, "state_on").unwrap_or(on_text);
        let shown_off = text_of(config, "state_off").unwrap_or(off_text);
        let path = self.path.as_deref();
        Ok([
            Turn {
                payload: on,
                expect: at_path(path, json!(shown_on)),
            },
            Turn {
                payload: off,
                expect: at_path(path, json!(shown_off)),
            },
        ])
    }

    /// A JSON light's brightness, from 0 to its scale (255 unless it says).
    fn dimming(&self, command: &str) -> Command {
        let scale = self
            .config
            .get("brightness_scale")
            .and_then(Value::as_u64)
            .unwrap_or(255);
        Command::new(
            "set_brightness",
            format!("Set {}'s brightness.", self.name),
            command,
            json!({"state": "ON", "brightness": "{brightness}"}),
        )
        .taking(json!({"brightness": {"type": "number",
            "required": true, "description": format!("0 to {scale}")}}))
    }

    /// A lock's locking, and its unlocking, which asks every time.
    fn lock(&self, command: &str) -> Result<Vec<Command>, String> {
        let lock = text_of(self.config, "payload_lock").unwrap_or_else(|| "LOCK".to_owned());
        let unlock = text_of(self.config, "payload_unlock").unwrap_or_else(|| "UNLOCK".to_owned());
        let name = &self.name;
        Ok(vec![
            Command::new(
                "lock",
                format!("Lock {name}."),
                command,
                json!({"state": clean(&lock, 32, "LOCK")}),
            ),
            Command::new(
                "unlock",
                format!("Unlock {name}."),
                command,
                json!({"state": clean(&unlock, 32, "UNLOCK")}),
            )
            .confirmed(),
        ])
    }

    /// A cover's opening, which asks every time, and its closing.
    fn cover(&self, command: &str) -> Result<Vec<Command>, String> {
        let open = text_of(self.config, "payload_open").unwrap_or_else(|| "OPEN".to_owned());
        let close = text_of(self.config, "payload_close").unwrap_or_else(|| "CLOSE".to_owned());
        let (open, close) = (clean(&open, 32, "OPEN"), clean(&close, 32, "CLOSE"));
        let path = self.path.as_deref();
        let name = &self.name;
        Ok(vec![
            Command::new("open", format!("Open {name}."), command, json!(open))
                .expecting(at_path(path, json!(open)))
                .confirmed(),
            Command::new("close", format!("Close {name}."), command, json!(close))
                .expecting(at_path(path, json!(close))),
        ])
    }

    /// A climate's current temperature, when it has a topic for it.
    fn temperature_reading(&self) -> Result<Vec<Reading>, String> {
        if topic(self.config, "current_temperature_topic")?.is_none() {
            return Ok(Vec::new());
        }
        Ok(vec![(
            format!("Read {}'s temperature.", self.name),
            template_path(self.config.get("current_temperature_template")),
        )])
    }

    /// A climate's setting of its target temperature, when it has a
    /// topic for it, confirmed by the target as the state reports it.
    fn thermostat(&self) -> Result<Vec<Command>, String> {
        let Some(command) = topic(self.config, "temperature_command_topic")? else {
            return Ok(Vec::new());
        };
        let target = template_path(self.config.get("temperature_state_template"));
        Ok(vec![
            Command::new(
                "set_temperature",
                format!("Set {}'s target temperature.", self.name),
                &command,
                json!("{celsius}"),
            )
            .taking(json!({"celsius": {"type": "number", "required": true,
                "description": "the target temperature"}}))
            .expecting(at_path(
                Some(target.as_deref().unwrap_or("current_heating_setpoint")),
                json!("{celsius}"),
            )),
        ])
    }
}

/// What turning a light or switch one way sends, and what its state
/// shows after.
struct Turn {
    payload: Value,
    expect: Value,
}

/// A JSON-schema light's turning on and off: `{"state": "ON"}` and
/// `{"state": "OFF"}`, confirmed by the same.
fn json_turns() -> [Turn; 2] {
    ["ON", "OFF"].map(|state| Turn {
        payload: json!({ "state": state }),
        expect: json!({ "state": state }),
    })
}

/// The topic a device's states come from: the entity's state topic (a
/// climate's current temperature topic).
pub(super) fn state_topic_of(entity: &Entity) -> Option<String> {
    let key = if entity.component == "climate" {
        "current_temperature_topic"
    } else {
        "state_topic"
    };
    topic(&entity.config, key).ok().flatten()
}
