//! Device events as MCP resources: one resource per paired device an agent
//! sees (`dk://devices/{deviceId}/events`), whose contents are the device's
//! most recent events, kept in a ring bounded in count and in bytes. A feed
//! task reads the vessel's device events into the rings and then tells the
//! sessions' watches, so a client told of an update reads the event that
//! caused it.
//!
//! An event's `seq` is counted per view: its number among the events of
//! that device the reading agent sees (from the device's pairing), so a gap
//! means events that left the ring, never events of a device or capability
//! outside the agent's view.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::Resource;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::options::McpOptions;
use super::tools::visible_tools;
use crate::agents::Agent;
use crate::link::DeviceEvent;
use crate::registry::RegistryEvent;
use crate::vessel::Vessel;

/// What every event resource's URI starts with.
const URI_PREFIX: &str = "dk://devices/";
/// What every event resource's URI ends with.
const URI_SUFFIX: &str = "/events";

/// How many updates may wait for a slow session's watch; past it the watch
/// hears that it missed some and treats every resource it follows as
/// updated.
const UPDATE_BUFFER: usize = 256;

/// The URI of `device_id`'s event resource.
pub(crate) fn events_uri(device_id: &str) -> String {
    format!("{URI_PREFIX}{device_id}{URI_SUFFIX}")
}

/// The device an event resource URI names, if it is one.
pub(crate) fn device_of_uri(uri: &str) -> Option<&str> {
    let id = uri.strip_prefix(URI_PREFIX)?.strip_suffix(URI_SUFFIX)?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// A new event was kept for a device.
#[derive(Debug, Clone)]
pub(crate) struct Update {
    pub(crate) device_id: Arc<str>,
    pub(crate) capability: Arc<str>,
}

/// One kept event.
/// One event as the device's resource shows it: `{seq, capability,
/// receivedAtMs}` and its `data`, or `omittedBytes` when it was too large
/// to keep.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EventView<'a> {
    seq: u64,
    capability: &'a str,
    received_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    omitted_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
}

/// A device's events resource: `{deviceId, events}`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct DeviceEvents<'a> {
    device_id: &'a str,
    events: Vec<EventView<'a>>,
}

struct Kept {
    capability: String,
    data: Option<Box<RawValue>>,
    /// The size of the data when it was too large to keep.
    omitted: Option<usize>,
    received_at_ms: u64,
}

impl Kept {
    fn bytes(&self) -> usize {
        self.capability.len() + self.data.as_ref().map_or(0, |d| d.get().len())
    }

    /// The event as a resource shows it, numbered `seq`.
    fn view(&self, seq: u64) -> EventView<'_> {
        let (omitted_bytes, data) = match (&self.data, self.omitted) {
            (_, Some(bytes)) => (Some(bytes), None),
            (Some(data), None) => (
                None,
                Some(serde_json::from_str::<Value>(data.get()).unwrap_or(Value::Null)),
            ),
            (None, None) => (None, None),
        };
        EventView {
            seq,
            capability: &self.capability,
            received_at_ms: self.received_at_ms,
            omitted_bytes,
            data,
        }
    }
}

#[derive(Default)]
struct Ring {
    events: VecDeque<Kept>,
    bytes: usize,
    /// Events recorded per capability since the device was paired, kept or
    /// not (one entry per capability of the manifest: the vessel takes no
    /// event of an undeclared one).
    recorded: HashMap<String, u64>,
}

/// The recent events of every paired device, bounded per device.
pub(crate) struct EventLog {
    per_device: usize,
    bytes_per_device: usize,
    rings: Mutex<HashMap<String, Ring>>,
    updates: broadcast::Sender<Update>,
}

impl EventLog {
    pub(crate) fn new(options: &McpOptions) -> EventLog {
        EventLog {
            per_device: options.events_per_device.max(1),
            bytes_per_device: options.event_bytes_per_device,
            rings: Mutex::new(HashMap::new()),
            updates: broadcast::channel(UPDATE_BUFFER).0,
        }
    }

    /// Updates from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Update> {
        self.updates.subscribe()
    }

    /// Keeps `event` in its device's ring (dropping the oldest past the
    /// bounds), then tells the watches.
    pub(crate) fn record(&self, event: DeviceEvent) {
        let received_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let size = event.data.as_ref().map_or(0, |d| d.get().len());
        let (data, omitted) = if event.capability.len() + size > self.bytes_per_device {
            (None, Some(size))
        } else {
            (event.data, None)
        };
        let kept = Kept {
            capability: event.capability.clone(),
            data,
            omitted,
            received_at_ms,
        };
        let mut rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        let ring = rings.entry(event.device_id.clone()).or_default();
        let recorded = ring.recorded.entry(event.capability.clone()).or_default();
        *recorded = recorded.saturating_add(1);
        ring.bytes += kept.bytes();
        ring.events.push_back(kept);
        while ring.events.len() > self.per_device || ring.bytes > self.bytes_per_device {
            let Some(old) = ring.events.pop_front() else {
                break;
            };
            ring.bytes = ring.bytes.saturating_sub(old.bytes());
        }
        // Sent before the lock is let go, so whoever reads the event has
        // its update queued already. No watch listening is not an error.
        let _ = self.updates.send(Update {
            device_id: Arc::from(event.device_id),
            capability: Arc::from(event.capability),
        });
    }

    /// Forgets the events of `device_id` (unpaired, or paired again as a
    /// new device).
    pub(crate) fn forget(&self, device_id: &str) {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(device_id);
    }

    /// The resource's contents for `agent`: the kept events of capabilities
    /// it sees, oldest first, each numbered among the device's events the
    /// agent sees.
    pub(crate) fn contents(&self, vessel: &Vessel, agent: &Agent, device_id: &str) -> Value {
        let rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        let mut events: Vec<EventView<'_>> = Vec::new();
        if let Some(ring) = rings.get(device_id) {
            let visible: HashSet<&str> = ring
                .recorded
                .keys()
                .filter(|capability| event_visible(vessel, agent, device_id, capability))
                .map(String::as_str)
                .collect();
            // The newest event the agent sees is the number of such events
            // so far; each one before it, one less.
            let mut seq: u64 = ring
                .recorded
                .iter()
                .filter(|(capability, _)| visible.contains(capability.as_str()))
                .map(|(_, count)| *count)
                .fold(0, u64::saturating_add);
            for e in ring.events.iter().rev() {
                if visible.contains(e.capability.as_str()) {
                    events.push(e.view(seq));
                    seq = seq.saturating_sub(1);
                }
            }
            events.reverse();
        }
        let view = DeviceEvents { device_id, events };
        serde_json::to_value(&view).unwrap_or(Value::Null)
    }

    /// How many events are kept for `device_id` and their bytes.
    #[cfg(test)]
    pub(crate) fn held(&self, device_id: &str) -> (usize, usize) {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(device_id)
            .map_or((0, 0), |r| (r.events.len(), r.bytes))
    }
}

/// Whether `agent` sees events of `capability` on `device_id`: the
/// capability, or the declared event of that name (the dk manifest
/// extension), is granted, and within the agent's scope and role (a
/// declared event reads the world, as a sensor does).
pub(crate) fn event_visible(
    vessel: &Vessel,
    agent: &Agent,
    device_id: &str,
    capability: &str,
) -> bool {
    let Some((device, granted)) = vessel.registry().get_with_grant(device_id, capability) else {
        return false;
    };
    let manifest = device.manifest();
    let sensor = match manifest.capability(capability) {
        Some(declared) => declared.kind() == dk_proto::CapabilityKind::Sensor,
        None if manifest.event(capability).is_some() => true,
        None => return false,
    };
    granted && agent.may_use(device_id, capability, sensor)
}

/// The devices whose event resources `agent` sees: those it sees a tool
/// of, and those with a declared event it sees, whether or not it sees a
/// tool of them.
pub(crate) fn visible_devices(vessel: &Vessel, agent: &Agent) -> BTreeSet<String> {
    let mut devices: BTreeSet<String> = visible_tools(vessel, agent)
        .into_iter()
        .map(|t| t.device_id)
        .collect();
    for snapshot in vessel.registry().list() {
        let manifest = snapshot.device.manifest();
        if manifest
            .events()
            .iter()
            .any(|e| event_visible(vessel, agent, manifest.id(), e.name()))
        {
            devices.insert(manifest.id().to_owned());
        }
    }
    devices
}

/// The event resource of `device_id` as listed.
pub(crate) fn resource(vessel: &Vessel, device_id: &str, per_device: usize) -> Resource {
    let (name, kind) = vessel
        .registry()
        .get(device_id)
        .map(|d| {
            (
                d.manifest().name().to_owned(),
                d.manifest().kind().to_owned(),
            )
        })
        .unwrap_or_else(|| (device_id.to_owned(), String::new()));
    // The events the device declares (the dk manifest extension), each its
    // name, description and data params, whether or not the agent sees a
    // tool of the device.
    let declared: Vec<String> = vessel
        .registry()
        .get(device_id)
        .map(|d| {
            d.manifest()
                .events()
                .iter()
                .map(|e| {
                    let params: Vec<String> = e
                        .params()
                        .iter()
                        .map(|p| match p.bounds().summary() {
                            Some(bounds) => format!("{}: {} ({bounds})", p.name(), p.ty()),
                            None => format!("{}: {}", p.name(), p.ty()),
                        })
                        .collect();
                    format!(
                        "{}: {} {{{}}}",
                        e.name(),
                        e.description(),
                        params.join(", ")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let declared = if declared.is_empty() {
        String::new()
    } else {
        format!(" Declared events: {}.", declared.join("; "))
    };
    Resource::new(events_uri(device_id), format!("{device_id} events"))
        .with_title(format!("{name} events"))
        .with_description(format!(
            "[DEVICE {name} ({kind})] The device's most recent events (at most {per_device}), \
             oldest first, as JSON; subscribe to hear when a new one comes.{declared}"
        ))
        .with_mime_type("application/json")
}

/// Reads the vessel's device events into `log` until `cancelled` resolves;
/// forgets a device's events when it is unpaired or paired again. The
/// receivers are taken already subscribed, so nothing sent after the route
/// was built is missed.
pub(crate) async fn feed(
    log: Arc<EventLog>,
    mut events: broadcast::Receiver<DeviceEvent>,
    mut registry: broadcast::Receiver<RegistryEvent>,
    cancelled: impl Future<Output = ()>,
) {
    tokio::pin!(cancelled);
    loop {
        // Registry changes first: a device's new pairing is always read
        // before the events it sends after it.
        tokio::select! {
            biased;
            () = &mut cancelled => return,
            change = registry.recv() => match change {
                Ok(RegistryEvent::Unpaired { device_id } | RegistryEvent::Paired { device_id }) => {
                    log.forget(&device_id);
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            event = events.recv() => match event {
                Ok(event) => log.record(event),
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "device events missed by the MCP event log");
                }
                Err(RecvError::Closed) => return,
            },
        }
    }
}
