//! Home Assistant MQTT discovery: `dk bridge mqtt discover` reads the
//! retained configs under `homeassistant/<component>/[<node>/]<object>/config`
//! and proposes a mapping (the bridge's TOML) for lights, switches, locks,
//! climates, covers, sensors and binary sensors. A proposal is only
//! printed: nothing is bridged until the person keeps it in a file and
//! starts the bridge with it, and then pairs and grants each device.
//!
//! Configs are untrusted:
//! - what is kept while listening is bounded: at most [`MAX_CONFIG_BYTES`]
//!   a config, [`MAX_DISCOVERY_BYTES`] and [`MAX_CONFIGS`] in all;
//! - text is cut and cleaned of characters a manifest may not hold, and a
//!   topic holding a control or hidden character spoils its own config
//!   only (it is skipped, never written into the proposal);
//! - a device id is the identifier's slug when it fits dk's 24 characters,
//!   else the device name's slug and a hash of the identifier (stable from
//!   run to run);
//! - lights and switches are turned on and off with the payloads their
//!   config names, never with a free string; locks' `unlock` and covers'
//!   `open` ask the person every time, and so does any capability of
//!   another config that publishes to the same command topic (the
//!   proposal says so beside it);
//! - every config skipped is listed with its reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use dk_proto::is_unsafe_char;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::bridge::broker_address;
use crate::config::{ActuatorMap, DeviceMap, SensorMap, plain_topic, shown};
use crate::{BridgeConfig, BridgeError, Credentials};

/// Most capabilities one proposed device gets.
pub const MAX_CAPABILITIES: usize = 32;
/// Most devices one discovery proposes.
pub const MAX_PROPOSED: usize = 500;
/// Largest config kept (64 KiB; Zigbee2MQTT's are about 2 KiB).
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// Most bytes of configs kept while listening, in all (8 MiB).
pub const MAX_DISCOVERY_BYTES: usize = 8 * 1024 * 1024;
/// Most configs kept while listening.
pub const MAX_CONFIGS: usize = 10 * MAX_PROPOSED;
/// Most skipped configs listed one by one; past it they are only counted.
pub const MAX_LISTED_SKIPS: usize = 1000;
/// dk's longest device id.
const MAX_ID: usize = dk_proto::limits::ID;
/// dk's longest capability name.
const MAX_NAME: usize = dk_proto::limits::CAPABILITY_NAME;

/// A config discovery did not turn into capabilities, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its topic, with hidden characters shown as `\u{..}`.
    pub topic: String,
    /// Why it was skipped.
    pub reason: String,
}

/// What discovery found.
#[derive(Debug, Default)]
pub struct Discovered {
    /// The proposed devices, by id.
    pub devices: Vec<DeviceMap>,
    /// What the person should know of a device before keeping it, by
    /// device id (capabilities that ask every time because they share a
    /// command topic with another config's).
    pub notes: BTreeMap<String, Vec<String>>,
    /// The configs skipped, with their reasons (the first
    /// [`MAX_LISTED_SKIPS`]).
    pub skipped: Vec<Skipped>,
    /// Configs skipped past the listed ones.
    pub unlisted: u64,
}

impl Discovered {
    /// How many configs were skipped in all.
    pub fn skipped_count(&self) -> u64 {
        self.skipped.len() as u64 + self.unlisted
    }

    fn skip(&mut self, topic: &str, reason: impl Into<String>) {
        if self.skipped.len() < MAX_LISTED_SKIPS {
            self.skipped.push(Skipped {
                topic: shown(topic),
                reason: reason.into(),
            });
        } else {
            self.unlisted += 1;
        }
    }
}

/// The configs heard while listening, within the byte budget.
#[derive(Debug, Default)]
struct Heard {
    configs: BTreeMap<String, Vec<u8>>,
    bytes: usize,
    found: Discovered,
}

impl Heard {
    /// Keeps `payload` of `topic` if the budget allows; a later config on
    /// a topic replaces the earlier one.
    fn offer(&mut self, topic: &str, payload: &[u8]) {
        if payload.len() > MAX_CONFIG_BYTES {
            self.found.skip(
                topic,
                format!(
                    "{} bytes, over the {MAX_CONFIG_BYTES} a config may have",
                    payload.len()
                ),
            );
            return;
        }
        let before = self.configs.get(topic).map(|kept| topic.len() + kept.len());
        let cost = topic.len() + payload.len();
        if before.is_none() && self.configs.len() >= MAX_CONFIGS {
            self.found.skip(
                topic,
                format!("past the {MAX_CONFIGS} configs discovery keeps"),
            );
            return;
        }
        let before = before.unwrap_or(0);
        if self.bytes - before + cost > MAX_DISCOVERY_BYTES {
            self.found.skip(
                topic,
                format!("past the {MAX_DISCOVERY_BYTES} bytes of configs discovery keeps"),
            );
            return;
        }
        self.bytes = self.bytes - before + cost;
        self.configs.insert(topic.to_owned(), payload.to_vec());
    }
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

/// Words of `[a-z0-9]` from `text`, joined by `sep`, at most `most`
/// characters, never ending in `sep`; empty when nothing is left.
fn words(text: &str, sep: char, most: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if out.len() >= most {
            break;
        }
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with(sep) && !out.is_empty() {
            out.push(sep);
        }
    }
    out.trim_end_matches(sep).to_owned()
}

/// The first `n` hex digits of SHA-256 of `text`.
fn short_hash(text: &str, n: usize) -> String {
    let mut hex = dk_files::hex::encode(&Sha256::digest(text.as_bytes()));
    hex.truncate(n);
    hex
}

/// A dk device id for `identifier`: its slug when that fits, else the
/// slug of `name` (cut) and `digits` hex digits of the identifier's hash.
fn device_id(identifier: &str, name: &str, digits: usize) -> String {
    let whole = words(identifier, '-', usize::MAX);
    if digits == 0 && !whole.is_empty() && whole.len() <= MAX_ID {
        return whole;
    }
    let digits = digits.max(6);
    let mut stem = words(name, '-', MAX_ID - 1 - digits);
    if stem.is_empty() {
        stem = "device".to_owned();
    }
    format!("{stem}-{}", short_hash(identifier, digits))
}

/// A capability name of `[a-z0-9_]` starting with a letter: `base`, or
/// when `base` is taken `base_<suffix>` for the first of `suffixes` (the
/// entity's object id, its own name) that says something `base` does not
/// (`lock_front_door`, never `lock_lock`), or a numbered one.
fn unique_name(taken: &BTreeSet<String>, base: &str, suffixes: &[&str]) -> String {
    if !taken.contains(base) {
        return base.to_owned();
    }
    for suffix in suffixes {
        let suffix = words(suffix, '_', MAX_NAME);
        if suffix.is_empty() || base.split('_').any(|word| word == suffix) {
            continue;
        }
        let with = format!("{base}_{suffix}");
        let with: String = with.chars().take(MAX_NAME).collect();
        let with = with.trim_end_matches('_').to_owned();
        if !taken.contains(&with) {
            return with;
        }
    }
    (2..)
        .map(|n| {
            let suffix = format!("_{n}");
            let stem: String = base.chars().take(MAX_NAME - suffix.len()).collect();
            format!("{}{suffix}", stem.trim_end_matches('_'))
        })
        .find(|name| !taken.contains(name))
        .unwrap_or_else(|| base.to_owned())
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

fn text_of(config: &Value, key: &str) -> Option<String> {
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

/// One discovery config, parsed.
struct Entity {
    /// The config's topic.
    topic: String,
    component: String,
    object: String,
    config: Value,
}

/// A command topic that a lock's unlock or a cover's open publishes to,
/// and what that config sends there when it asks the person.
struct Guard {
    /// The guarded topic.
    topic: String,
    /// The guarding config's topic.
    config: String,
    payload: Value,
}

/// The topics `topic` lies under (`a/b` and `a` for `a/b/set`).
fn ancestors(topic: &str) -> impl Iterator<Item = &str> {
    topic
        .char_indices()
        .filter(|(_, c)| *c == '/')
        .filter_map(|(at, _)| topic.get(..at))
}

/// Every guarded command topic heard. A topic is guarded when a guard is
/// on it, on a topic it lies under, or on one under it: Zigbee2MQTT takes
/// `<device>/set/state` as it takes `<device>/set`, so a config must not
/// escape a lock's confirm by naming a neighbour of its topic.
#[derive(Default)]
struct Guards {
    all: Vec<Guard>,
    /// By the guarded topic.
    on: HashMap<String, Vec<usize>>,
    /// By each topic a guarded topic lies under.
    above: HashMap<String, Vec<usize>>,
}

impl Guards {
    fn add(&mut self, guard: Guard) {
        let at = self.all.len();
        self.on.entry(guard.topic.clone()).or_default().push(at);
        for ancestor in ancestors(&guard.topic) {
            self.above.entry(ancestor.to_owned()).or_default().push(at);
        }
        self.all.push(guard);
    }

    /// The guards of `topic`.
    fn of<'g>(&'g self, topic: &'g str) -> impl Iterator<Item = &'g Guard> + 'g {
        std::iter::once(topic)
            .chain(ancestors(topic))
            .filter_map(|t| self.on.get(t))
            .chain(self.above.get(topic))
            .flatten()
            .filter_map(|at| self.all.get(*at))
    }
}

/// Where one capability being proposed goes, and what it sends.
struct Command {
    base: &'static str,
    verb: String,
    topic: String,
    payload: Value,
    expect: Option<Value>,
    params: Option<Value>,
    confirm: bool,
}

/// A sensor being proposed: its description and path.
type Reading = (String, Option<String>);

/// The capabilities one entity gives, or why it gives none.
fn capabilities(entity: &Entity) -> Result<(Vec<Reading>, Vec<Command>), String> {
    let config = &entity.config;
    let device = config.pointer("/device/name").and_then(Value::as_str);
    let name = match (text_of(config, "name"), device) {
        (Some(own), Some(device)) if !own.starts_with(device) => format!("{device} {own}"),
        (Some(own), _) => own,
        (None, Some(device)) => device.to_owned(),
        (None, None) => entity.object.clone(),
    };
    let name = clean(&name, 60, &entity.object);
    let state = topic(config, "state_topic")?;
    let command = topic(config, "command_topic")?;
    let path = template_path(config.get("value_template"));
    let mut sensors = Vec::new();
    let mut commands = Vec::new();
    let command_of = |base: &'static str, verb: String, topic: &str, payload: Value| Command {
        base,
        verb,
        topic: topic.to_owned(),
        payload,
        expect: None,
        params: None,
        confirm: false,
    };
    match entity.component.as_str() {
        "sensor" | "binary_sensor" => {
            if state.is_some() {
                sensors.push((format!("Read {name}."), path));
            }
        }
        "light" | "switch" => {
            if state.is_some() {
                let path = path.clone().or_else(|| Some("state".to_owned()));
                sensors.push((format!("Read {name}."), path));
            }
            if let Some(command) = command {
                let json_schema = config.get("schema").and_then(Value::as_str) == Some("json");
                let (on, off, state_on, state_off) = if json_schema {
                    let (on, off) = (json!({"state": "ON"}), json!({"state": "OFF"}));
                    (on.clone(), off.clone(), on, off)
                } else {
                    let on_text = text_of(config, "payload_on").unwrap_or_else(|| "ON".to_owned());
                    let off_text =
                        text_of(config, "payload_off").unwrap_or_else(|| "OFF".to_owned());
                    let on = command_payload(&on_text, "payload_on")?;
                    let off = command_payload(&off_text, "payload_off")?;
                    let shown_on = text_of(config, "state_on").unwrap_or(on_text);
                    let shown_off = text_of(config, "state_off").unwrap_or(off_text);
                    let p = path.as_deref();
                    (
                        on,
                        off,
                        at_path(p, json!(shown_on)),
                        at_path(p, json!(shown_off)),
                    )
                };
                let mut turning_on =
                    command_of("turn_on", format!("Turn {name} on."), &command, on);
                turning_on.expect = Some(state_on);
                let mut turning_off =
                    command_of("turn_off", format!("Turn {name} off."), &command, off);
                turning_off.expect = Some(state_off);
                commands.push(turning_on);
                commands.push(turning_off);
                if json_schema && config.get("brightness") == Some(&Value::Bool(true)) {
                    let scale = config
                        .get("brightness_scale")
                        .and_then(Value::as_u64)
                        .unwrap_or(255);
                    let mut dimming = command_of(
                        "set_brightness",
                        format!("Set {name}'s brightness."),
                        &command,
                        json!({"state": "ON", "brightness": "{brightness}"}),
                    );
                    dimming.params = Some(json!({"brightness": {"type": "number",
                        "required": true, "description": format!("0 to {scale}")}}));
                    commands.push(dimming);
                }
            }
        }
        "lock" => {
            if state.is_some() {
                let path = path.clone().or_else(|| Some("state".to_owned()));
                sensors.push((format!("Read {name}."), path));
            }
            if let Some(command) = command {
                let lock = text_of(config, "payload_lock").unwrap_or_else(|| "LOCK".to_owned());
                let unlock =
                    text_of(config, "payload_unlock").unwrap_or_else(|| "UNLOCK".to_owned());
                commands.push(command_of(
                    "lock",
                    format!("Lock {name}."),
                    &command,
                    json!({"state": clean(&lock, 32, "LOCK")}),
                ));
                let mut unlocking = command_of(
                    "unlock",
                    format!("Unlock {name}."),
                    &command,
                    json!({"state": clean(&unlock, 32, "UNLOCK")}),
                );
                unlocking.confirm = true;
                commands.push(unlocking);
            }
        }
        "cover" => {
            if state.is_some() {
                let path = path.clone().or_else(|| Some("state".to_owned()));
                sensors.push((format!("Read {name}."), path));
            }
            if let Some(command) = command {
                let open = text_of(config, "payload_open").unwrap_or_else(|| "OPEN".to_owned());
                let close = text_of(config, "payload_close").unwrap_or_else(|| "CLOSE".to_owned());
                let (open, close) = (clean(&open, 32, "OPEN"), clean(&close, 32, "CLOSE"));
                let mut opening =
                    command_of("open", format!("Open {name}."), &command, json!(open));
                opening.expect = Some(at_path(path.as_deref(), json!(open)));
                opening.confirm = true;
                let mut closing =
                    command_of("close", format!("Close {name}."), &command, json!(close));
                closing.expect = Some(at_path(path.as_deref(), json!(close)));
                commands.push(opening);
                commands.push(closing);
            }
        }
        "climate" => {
            if topic(config, "current_temperature_topic")?.is_some() {
                sensors.push((
                    format!("Read {name}'s temperature."),
                    template_path(config.get("current_temperature_template")),
                ));
            }
            if let Some(command) = topic(config, "temperature_command_topic")? {
                let mut setting = command_of(
                    "set_temperature",
                    format!("Set {name}'s target temperature."),
                    &command,
                    json!("{celsius}"),
                );
                setting.params = Some(json!({"celsius": {"type": "number", "required": true,
                    "description": "the target temperature"}}));
                // Confirmed by the target as the state reports it.
                let target = template_path(config.get("temperature_state_template"));
                setting.expect = Some(at_path(
                    Some(target.as_deref().unwrap_or("current_heating_setpoint")),
                    json!("{celsius}"),
                ));
                commands.push(setting);
            }
        }
        other => return Err(format!("`{}` is not a component dk maps", shown(other))),
    }
    if sensors.is_empty() && commands.is_empty() {
        return Err("it names no state or command topic dk can use".to_owned());
    }
    Ok((sensors, commands))
}

/// The topic a device's states come from: the entity's state topic (a
/// climate's current temperature topic).
fn state_topic_of(entity: &Entity) -> Option<String> {
    let key = if entity.component == "climate" {
        "current_temperature_topic"
    } else {
        "state_topic"
    };
    topic(&entity.config, key).ok().flatten()
}

/// A device being proposed, and the configs that made it.
struct Building {
    map: DeviceMap,
    configs: Vec<String>,
    notes: Vec<String>,
}

/// Proposes mappings from discovery configs, as `(topic, payload)`; the
/// same configs in any order give the same proposal.
pub fn propose(configs: &[(String, Vec<u8>)]) -> Discovered {
    let mut heard = Heard::default();
    for (topic, payload) in configs {
        heard.offer(topic, payload);
    }
    propose_heard(heard)
}

fn parse_entity(topic: &str, payload: &[u8]) -> Result<Entity, String> {
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

fn propose_heard(heard: Heard) -> Discovered {
    let Heard {
        configs, mut found, ..
    } = heard;
    let mut entities = Vec::new();
    for (topic, payload) in &configs {
        match parse_entity(topic, payload) {
            Ok(entity) => entities.push(entity),
            Err(why) => found.skip(topic, why),
        }
    }
    // The command topics a lock's unlock or a cover's open publishes to,
    // from every config heard (skipped or not).
    let mut guards = Guards::default();
    for entity in &entities {
        if let Ok((_, commands)) = capabilities(entity) {
            for command in commands.into_iter().filter(|c| c.confirm) {
                guards.add(Guard {
                    topic: command.topic,
                    config: entity.topic.clone(),
                    payload: command.payload,
                });
            }
        }
    }

    let mut devices: BTreeMap<String, Building> = BTreeMap::new();
    let mut by_identifier: HashMap<String, String> = HashMap::new();
    for entity in &entities {
        let (sensors, commands) = match capabilities(entity) {
            Ok(found) => found,
            Err(why) => {
                found.skip(&entity.topic, why);
                continue;
            }
        };
        let config = &entity.config;
        let device_name = config
            .pointer("/device/name")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| text_of(config, "name"))
            .unwrap_or_else(|| entity.object.clone());
        let identifier = ["/device/identifiers/0", "/device/identifiers"]
            .iter()
            .find_map(|at| match config.pointer(at) {
                Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                Some(Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
            .unwrap_or_else(|| device_name.clone());
        let id = match by_identifier.get(&identifier) {
            Some(id) => id.clone(),
            None => {
                // Another identifier with the same id: more of its hash.
                let Some(id) = [0, 6, 10, 14]
                    .into_iter()
                    .map(|digits| device_id(&identifier, &device_name, digits))
                    .find(|id| !devices.contains_key(id))
                else {
                    found.skip(&entity.topic, "its device id is another device's");
                    continue;
                };
                if devices.len() >= MAX_PROPOSED {
                    found.skip(
                        &entity.topic,
                        format!("past the {MAX_PROPOSED} devices one discovery proposes"),
                    );
                    continue;
                }
                by_identifier.insert(identifier.clone(), id.clone());
                id
            }
        };
        let state_topic = state_topic_of(entity);
        let building = devices.entry(id.clone()).or_insert_with(|| Building {
            map: DeviceMap {
                id: id.clone(),
                name: clean(&device_name, 60, &id),
                kind: entity.component.clone(),
                state_topic: state_topic.clone().unwrap_or_default(),
                key_file: None,
                sensor: Vec::new(),
                actuator: Vec::new(),
            },
            configs: Vec::new(),
            notes: Vec::new(),
        });
        let device = &mut building.map;
        if device.state_topic.is_empty() {
            device.state_topic = state_topic.clone().unwrap_or_default();
        }
        if let Some(state_topic) = &state_topic
            && *state_topic != device.state_topic
        {
            found.skip(
                &entity.topic,
                format!(
                    "its state topic `{}` is not its device's `{}`",
                    shown(state_topic),
                    shown(&device.state_topic)
                ),
            );
            continue;
        }
        let count = device.sensor.len() + device.actuator.len();
        if count + sensors.len() + commands.len() > MAX_CAPABILITIES {
            found.skip(
                &entity.topic,
                format!("its device already has {count} of the {MAX_CAPABILITIES} capabilities a device may have"),
            );
            continue;
        }
        let mut taken: BTreeSet<String> = device
            .sensor
            .iter()
            .map(|s| s.name.clone())
            .chain(device.actuator.iter().map(|a| a.name.clone()))
            .collect();
        let own_name = text_of(config, "name").unwrap_or_default();
        // An object id that only repeats the component (`lock` of a lock)
        // tells nothing apart.
        let object = if entity.object == entity.component {
            ""
        } else {
            entity.object.as_str()
        };
        let suffixes = [object, own_name.as_str()];
        for (description, path) in sensors {
            let base = format!("read_{}", words(&entity.object, '_', MAX_NAME - 5));
            let base = if base == "read_" || base.ends_with('_') {
                "read".to_owned()
            } else {
                base
            };
            let name = unique_name(&taken, &base, &suffixes);
            taken.insert(name.clone());
            device.sensor.push(SensorMap {
                name,
                description: clean(&description, 200, "Read it."),
                path,
            });
        }
        for command in commands {
            let name = unique_name(&taken, command.base, &suffixes);
            taken.insert(name.clone());
            let mut confirm = command.confirm;
            if !confirm {
                for guard in guards.of(&command.topic) {
                    let other = guard.config != entity.topic;
                    if other || guard.payload == command.payload {
                        confirm = true;
                        let next_to = if guard.topic == command.topic {
                            String::new()
                        } else {
                            format!(", next to `{}`", shown(&guard.topic))
                        };
                        building.notes.push(format!(
                            "`{name}` asks every time: it publishes to `{}`{next_to}, where `{}` asks every time",
                            shown(&command.topic),
                            shown(&guard.config)
                        ));
                        break;
                    }
                }
            }
            building.map.actuator.push(ActuatorMap {
                name,
                description: clean(&command.verb, 200, "Act."),
                command_topic: command.topic,
                payload: command.payload,
                expect: command.expect,
                params: command.params,
                confirm,
            });
        }
        building.configs.push(entity.topic.clone());
    }
    for (_, building) in devices {
        let Building {
            map,
            configs,
            notes,
        } = building;
        if map.sensor.is_empty() && map.actuator.is_empty() {
            continue;
        }
        let refused = if map.state_topic.is_empty() {
            Some("its device has no state topic: nothing could read or confirm it".to_owned())
        } else if let Err(why) = map.manifest() {
            Some(format!("its device's manifest is refused: {why}"))
        } else if let Err(why) = BridgeConfig::parse(&map.to_toml()) {
            Some(format!("its device's mapping does not read back: {why}"))
        } else {
            None
        };
        if let Some(why) = refused {
            for topic in &configs {
                found.skip(topic, why.clone());
            }
            continue;
        }
        if !notes.is_empty() {
            found.notes.insert(map.id.clone(), notes);
        }
        found.devices.push(map);
    }
    found
}

/// Reads retained discovery configs from `broker_url` for `wait`, then
/// proposes mappings. What is kept while listening is bounded by
/// [`MAX_CONFIG_BYTES`], [`MAX_DISCOVERY_BYTES`] and [`MAX_CONFIGS`].
pub async fn discover(
    broker_url: &str,
    credentials: Option<Credentials>,
    wait: Duration,
) -> Result<Discovered, BridgeError> {
    let address = broker_address(broker_url)?;
    if let Some(credentials) = &credentials {
        credentials.check(&address)?;
    }
    let mut options = MqttOptions::new("dk-bridge-discover", address.host, address.port);
    if address.tls {
        let tls = crate::bridge::tls_config(None)?;
        options.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
            std::sync::Arc::new(tls),
        )));
    }
    options.set_max_packet_size(crate::MAX_PACKET_BYTES, 64 * 1024);
    if let Some(credentials) = credentials {
        credentials.apply(&mut options);
    }
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let mut heard = Heard::default();
    let collect = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    for filter in ["homeassistant/+/+/config", "homeassistant/+/+/+/config"] {
                        let _ = client.subscribe(filter, QoS::AtMostOnce).await;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    heard.offer(&publish.topic, &publish.payload);
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
    Ok(propose_heard(heard))
}

/// The proposal as the bridge's TOML, to review and keep: each device with
/// its notes above it, and the skipped configs with their reasons at the
/// end, as comments.
pub fn to_toml(found: &Discovered) -> String {
    let mut out = String::from(
        "# Proposed by `dk bridge mqtt discover`. Review every device: delete what\n\
         # the agent must not reach, then keep this file and start\n\
         # `dk bridge mqtt --config FILE`. Each device still has to be paired and\n\
         # granted by you.\n",
    );
    for device in &found.devices {
        if let Some(notes) = found.notes.get(&device.id) {
            out.push('\n');
            for note in notes {
                out.push_str(&format!("# {}: {note}\n", device.id));
            }
        }
        out.push_str(&device.to_toml());
    }
    if found.skipped_count() > 0 {
        out.push_str(&format!("\n# {} configs skipped:\n", found.skipped_count()));
        for skipped in &found.skipped {
            out.push_str(&format!(
                "# - `{}`: {}\n",
                skipped.topic,
                shown(&skipped.reason)
            ));
        }
        if found.unlisted > 0 {
            out.push_str(&format!("# - and {} more\n", found.unlisted));
        }
    }
    out
}

#[cfg(test)]
mod tests;
