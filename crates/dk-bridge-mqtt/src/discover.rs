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

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::bridge::broker_address;
use crate::config::{ActuatorMap, DeviceMap, SensorMap, shown};
use crate::{BridgeConfig, BridgeError, Credentials};

mod entity;

use entity::{
    Command, Entity, Reading, capabilities, clean, parse_entity, state_topic_of, text_of,
};

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

/// Proposes a mapping from the configs heard: each config parsed, the
/// command topics that ask every time gathered from all of them, then
/// each entity added to its device, and each device checked.
fn propose_heard(heard: Heard) -> Discovered {
    let Heard {
        configs, mut found, ..
    } = heard;
    let entities = parse_entities(&configs, &mut found);
    let guards = Guards::of_entities(&entities);
    let mut proposal = Proposal::default();
    for entity in &entities {
        if let Err(why) = proposal.add(entity, &guards) {
            found.skip(&entity.topic, why);
        }
    }
    proposal.check_into(&mut found);
    found
}

/// The entities of `configs`, each config that is none skipped in `found` with why.
fn parse_entities(configs: &BTreeMap<String, Vec<u8>>, found: &mut Discovered) -> Vec<Entity> {
    let mut entities = Vec::new();
    for (topic, payload) in configs {
        match parse_entity(topic, payload) {
            Ok(entity) => entities.push(entity),
            Err(why) => found.skip(topic, why),
        }
    }
    entities
}

impl Guards {
    /// The command topics a lock's unlock or a cover's open publishes to,
    /// from every config heard (skipped or not).
    fn of_entities(entities: &[Entity]) -> Self {
        let mut guards = Guards::default();
        for entity in entities {
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
        guards
    }

    /// The guard that makes `command` of the config `config` ask every
    /// time: another config's on its topic or a neighbour, or its own
    /// config's sending the same payload there.
    fn over<'g>(&'g self, command: &'g Command, config: &str) -> Option<&'g Guard> {
        self.of(&command.topic)
            .find(|guard| guard.config != config || guard.payload == command.payload)
    }
}

impl Guard {
    /// The note beside the capability `name`, which publishes to
    /// `topic` and asks every time because of this guard.
    fn note(&self, name: &str, topic: &str) -> String {
        let next_to = if self.topic == topic {
            String::new()
        } else {
            format!(", next to `{}`", shown(&self.topic))
        };
        format!(
            "`{name}` asks every time: it publishes to `{}`{next_to}, where `{}` asks every time",
            shown(topic),
            shown(&self.config)
        )
    }
}

/// The devices being proposed, by id, and the id given to each identifier.
#[derive(Default)]
struct Proposal {
    devices: BTreeMap<String, Building>,
    by_identifier: HashMap<String, String>,
}

impl Proposal {
    /// Adds `entity`'s capabilities to its device; why not, when it cannot.
    fn add(&mut self, entity: &Entity, guards: &Guards) -> Result<(), String> {
        let (sensors, commands) = capabilities(entity)?;
        let device_name = device_name(entity);
        let identifier = identifier(&entity.config, &device_name);
        let id = self.id_for(&identifier, &device_name)?;
        let state_topic = state_topic_of(entity);
        let building = self
            .devices
            .entry(id.clone())
            .or_insert_with(|| Building::new(id, &device_name, entity));
        building.take_state_topic(state_topic.as_deref())?;
        building.make_room(sensors.len() + commands.len())?;
        let mut names = Names::new(&building.map, entity);
        building.add_sensors(&mut names, &entity.object, sensors);
        building.add_actuators(&mut names, entity, commands, guards);
        building.configs.push(entity.topic.clone());
        Ok(())
    }

    /// The id of the device `identifier` names: the one it has, else a
    /// new one no other device has (more of its hash when another
    /// identifier would have the same), while there is room for one more.
    fn id_for(&mut self, identifier: &str, device_name: &str) -> Result<String, String> {
        if let Some(id) = self.by_identifier.get(identifier) {
            return Ok(id.clone());
        }
        let Some(id) = [0, 6, 10, 14]
            .into_iter()
            .map(|digits| device_id(identifier, device_name, digits))
            .find(|id| !self.devices.contains_key(id))
        else {
            return Err("its device id is another device's".to_owned());
        };
        if self.devices.len() >= MAX_PROPOSED {
            return Err(format!(
                "past the {MAX_PROPOSED} devices one discovery proposes"
            ));
        }
        self.by_identifier.insert(identifier.to_owned(), id.clone());
        Ok(id)
    }

    /// Puts each device that has capabilities and passes its checks in
    /// `found`, with its notes; skips the configs of one that fails.
    fn check_into(self, found: &mut Discovered) {
        for (_, building) in self.devices {
            let Building {
                map,
                configs,
                notes,
            } = building;
            if map.sensor.is_empty() && map.actuator.is_empty() {
                continue;
            }
            if let Some(why) = refusal(&map) {
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
    }
}

/// The name of `entity`'s device: the config's device name, else its own
/// name, else its object id.
fn device_name(entity: &Entity) -> String {
    let config = &entity.config;
    config
        .pointer("/device/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| text_of(config, "name"))
        .unwrap_or_else(|| entity.object.clone())
}

/// What tells a config's device apart: its first identifier, else
/// `device_name`.
fn identifier(config: &Value, device_name: &str) -> String {
    ["/device/identifiers/0", "/device/identifiers"]
        .iter()
        .find_map(|at| match config.pointer(at) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| device_name.to_owned())
}

/// Why a device's mapping cannot be proposed, if it cannot.
fn refusal(map: &DeviceMap) -> Option<String> {
    if map.state_topic.is_empty() {
        Some("its device has no state topic: nothing could read or confirm it".to_owned())
    } else if let Err(why) = map.manifest() {
        Some(format!("its device's manifest is refused: {why}"))
    } else if let Err(why) = BridgeConfig::parse(&map.to_toml()) {
        Some(format!("its device's mapping does not read back: {why}"))
    } else {
        None
    }
}

/// Names for one entity's capabilities: none its device already has, told
/// apart by the entity's object id or its own name.
struct Names<'e> {
    taken: BTreeSet<String>,
    /// The entity's object id, unless it only repeats the component
    /// (`lock` of a lock), which tells nothing apart.
    object: &'e str,
    own_name: String,
}

impl<'e> Names<'e> {
    /// Names for `entity`'s capabilities on `device`.
    fn new(device: &DeviceMap, entity: &'e Entity) -> Self {
        Names {
            taken: device
                .sensor
                .iter()
                .map(|s| s.name.clone())
                .chain(device.actuator.iter().map(|a| a.name.clone()))
                .collect(),
            object: if entity.object == entity.component {
                ""
            } else {
                entity.object.as_str()
            },
            own_name: text_of(&entity.config, "name").unwrap_or_default(),
        }
    }

    /// A name from `base` not taken yet, and now taken.
    fn take(&mut self, base: &str) -> String {
        let name = unique_name(&self.taken, base, &[self.object, self.own_name.as_str()]);
        self.taken.insert(name.clone());
        name
    }
}

impl Building {
    /// A device `id` named `device_name`, with nothing in it yet, of
    /// `entity`'s kind and state topic.
    fn new(id: String, device_name: &str, entity: &Entity) -> Self {
        Building {
            map: DeviceMap {
                name: clean(device_name, 60, &id),
                id,
                kind: entity.component.clone(),
                state_topic: state_topic_of(entity).unwrap_or_default(),
                key_file: None,
                sensor: Vec::new(),
                actuator: Vec::new(),
            },
            configs: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Takes `state_topic` as the device's when it has none; an error
    /// when it has another.
    fn take_state_topic(&mut self, state_topic: Option<&str>) -> Result<(), String> {
        let device = &mut self.map;
        if device.state_topic.is_empty() {
            device.state_topic = state_topic.unwrap_or_default().to_owned();
        }
        match state_topic {
            Some(state_topic) if state_topic != device.state_topic => Err(format!(
                "its state topic `{}` is not its device's `{}`",
                shown(state_topic),
                shown(&device.state_topic)
            )),
            _ => Ok(()),
        }
    }

    /// An error unless the device has room for `more` capabilities.
    fn make_room(&self, more: usize) -> Result<(), String> {
        let count = self.map.sensor.len() + self.map.actuator.len();
        if count + more > MAX_CAPABILITIES {
            return Err(format!(
                "its device already has {count} of the {MAX_CAPABILITIES} capabilities a device may have"
            ));
        }
        Ok(())
    }

    /// Adds the sensors of the entity `object`, each named `read_<object>`.
    fn add_sensors(&mut self, names: &mut Names<'_>, object: &str, sensors: Vec<Reading>) {
        for (description, path) in sensors {
            let base = format!("read_{}", words(object, '_', MAX_NAME - 5));
            let base = if base == "read_" || base.ends_with('_') {
                "read".to_owned()
            } else {
                base
            };
            self.map.sensor.push(SensorMap {
                name: names.take(&base),
                description: clean(&description, 200, "Read it."),
                path,
            });
        }
    }

    /// Adds `entity`'s actuators; one that publishes where a guard is
    /// asks every time, and the device's notes say why.
    fn add_actuators(
        &mut self,
        names: &mut Names<'_>,
        entity: &Entity,
        commands: Vec<Command>,
        guards: &Guards,
    ) {
        for command in commands {
            let name = names.take(command.base);
            let mut confirm = command.confirm;
            if !confirm && let Some(guard) = guards.over(&command, &entity.topic) {
                confirm = true;
                self.notes.push(guard.note(&name, &command.topic));
            }
            self.map.actuator.push(ActuatorMap {
                name,
                description: clean(&command.verb, 200, "Act."),
                command_topic: command.topic,
                payload: command.payload,
                expect: command.expect,
                params: command.params,
                confirm,
            });
        }
    }
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
