//! Microphones open on voice devices, so every front end can show the
//! person when one is live: a voice device (manifest kind `voice`) says so
//! with an event on its capability, `{"microphone": "live", "max_seconds":
//! N}` when it opens one and `{"microphone": "off", ...}` when it closes
//! it. The vessel keeps the open ones here (read by `GET /v1/status`, the
//! console's banner and the terminal) and counts each change, so a front
//! end can wait for the next. The person's stop
//! ([`Vessel::stop_microphone`](crate::Vessel::stop_microphone)) calls the
//! device's `stop` straight through its link: it only ever ends something,
//! so no grant or rule stands in its way.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

pub use dk_proto::admin::LiveMicrophone;
use serde::Deserialize;
use tokio::sync::watch;

use crate::link::DeviceEvent;

/// The kind of device whose microphone events are heard.
pub const VOICE_KIND: &str = "voice";

/// Whether a call of `capability` on a device with `manifest` opens a
/// microphone: a sensor that asks every time (`confirm`), on a device of
/// kind `voice` (`listen` and `listen_stream` of `dk device voice`). Such
/// a call's approval says for how long, and a yes to it is remembered only
/// where an `allow` rule names it.
pub fn opens_microphone(manifest: &dk_proto::Manifest, capability: &str) -> bool {
    manifest.kind() == VOICE_KIND
        && manifest
            .capability(capability)
            .is_some_and(|c| c.kind() == dk_proto::CapabilityKind::Sensor && c.confirm())
}

/// Most microphones kept open at once (one a device; past it, the oldest
/// news is dropped rather than memory grown).
const MAX_OPEN: usize = 4096;

/// What a voice device's event says of its microphone.
#[derive(Deserialize)]
struct Said {
    microphone: String,
    #[serde(default)]
    max_seconds: u64,
}

/// The microphones open now, by device.
#[derive(Debug)]
pub struct Microphones {
    open: Mutex<BTreeMap<String, LiveMicrophone>>,
    changes: watch::Sender<u64>,
}

impl Default for Microphones {
    fn default() -> Self {
        Microphones {
            open: Mutex::new(BTreeMap::new()),
            changes: watch::channel(0).0,
        }
    }
}

impl Microphones {
    /// Takes `event` of a device of kind `kind` into account, at `now_ms`;
    /// whether it changed what is open.
    pub(crate) fn observe(&self, event: &DeviceEvent, kind: &str, now_ms: u64) -> bool {
        if kind != VOICE_KIND {
            return false;
        }
        let Some(said) = event
            .data
            .as_deref()
            .and_then(|raw| serde_json::from_str::<Said>(raw.get()).ok())
        else {
            return false;
        };
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = match said.microphone.as_str() {
            "live" => {
                if open.len() >= MAX_OPEN && !open.contains_key(&event.device_id) {
                    return false;
                }
                open.insert(
                    event.device_id.clone(),
                    LiveMicrophone {
                        device_id: event.device_id.clone(),
                        capability: event.capability.clone(),
                        max_seconds: said.max_seconds,
                        since_ms: now_ms,
                    },
                );
                true
            }
            "off" => open.remove(&event.device_id).is_some(),
            _ => false,
        };
        drop(open);
        if changed {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        changed
    }

    /// Forgets `device_id`'s microphone (its connection ended: nothing it
    /// hears can reach the vessel now).
    pub(crate) fn forget(&self, device_id: &str) {
        let removed = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(device_id)
            .is_some();
        if removed {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The microphones open now, by device id.
    pub fn list(&self) -> Vec<LiveMicrophone> {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Whether `device_id`'s microphone is open.
    pub fn is_live(&self, device_id: &str) -> bool {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(device_id)
    }

    /// A counter of the changes, to wait for the next.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// Why the person's stop did not reach a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// No device of that id is paired.
    #[error("no paired device {0:?}")]
    NotPaired(String),
    /// The device is not a voice device.
    #[error("device {0:?} is not a voice device")]
    NotVoice(String),
    /// The device is not connected.
    #[error("device {0:?} is not connected")]
    NotConnected(String),
    /// The device did not take the stop.
    #[error("the stop did not reach device {device:?}: {why}")]
    Failed {
        /// The device.
        device: String,
        /// Why.
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn event(device: &str, data: &str) -> DeviceEvent {
        DeviceEvent {
            device_id: device.to_owned(),
            capability: "listen".to_owned(),
            data: RawValue::from_string(data.to_owned()).ok(),
        }
    }

    #[test]
    fn live_and_off_come_from_voice_devices_only() {
        let mics = Microphones::default();
        let mut changes = mics.watch();
        assert!(mics.observe(
            &event("kitchen", r#"{"microphone":"live","max_seconds":10}"#),
            VOICE_KIND,
            5
        ));
        assert!(changes.has_changed().unwrap_or(false));
        changes.mark_unchanged();
        assert_eq!(
            mics.list(),
            [LiveMicrophone {
                device_id: "kitchen".to_owned(),
                capability: "listen".to_owned(),
                max_seconds: 10,
                since_ms: 5
            }]
        );
        // Another kind, or other data, changes nothing.
        assert!(!mics.observe(&event("lamp", r#"{"microphone":"live"}"#), "light", 6));
        assert!(!mics.observe(&event("kitchen", r#"{"level":3}"#), VOICE_KIND, 6));
        assert!(!mics.observe(&event("kitchen", "7"), VOICE_KIND, 6));
        assert!(!changes.has_changed().unwrap_or(true));
        assert!(mics.is_live("kitchen"));
        assert!(mics.observe(
            &event("kitchen", r#"{"microphone":"off","ended":"silence"}"#),
            VOICE_KIND,
            7
        ));
        assert!(mics.list().is_empty());
        mics.observe(&event("kitchen", r#"{"microphone":"live"}"#), VOICE_KIND, 8);
        mics.forget("kitchen");
        assert!(!mics.is_live("kitchen"));
    }
}
