//! Events a device sends on its own initiative: `device:event {capability, data}`.

use std::fmt;

use dk_device_core::{EventRefusal, event_frame};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::Device;

/// Why an event was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// The manifest declares no capability or event of this name; nothing
    /// was sent.
    #[error("unknown capability \"{0}\"")]
    UnknownCapability(String),
    /// The data could not be written as JSON.
    #[error("event data is not JSON: {0}")]
    NotJson(String),
    /// The vessel would refuse the event's frame (over its size or nesting
    /// depth); nothing was sent.
    #[error("the vessel would refuse the event: {0}")]
    Refused(String),
    /// The queue is full ([`EventSender::try_emit`] only).
    #[error("the event queue is full")]
    Full,
    /// The [`EventReceiver`] was dropped, or the serve loop holding it ended.
    #[error("the event queue is closed")]
    Closed,
}

/// Sends `device:event` frames through a serve loop. Cheap to clone; made by
/// [`Device::events`]. Each event is checked against the manifest first: an
/// event for a capability the device lacks (and no declared event of its
/// name) is refused here and never sent, so is a declared event whose data
/// does not keep its params,
/// and so is one whose frame the vessel would refuse (over 1 MiB, or nested
/// deeper than 64 levels).
#[derive(Clone)]
pub struct EventSender {
    device: Device,
    tx: mpsc::Sender<String>,
}

impl fmt::Debug for EventSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSender")
            .field("device", &self.device.manifest().id())
            .finish_non_exhaustive()
    }
}

/// The receiving end of [`Device::events`]; give it to the serve loop with
/// [`ServeOptions::events`](crate::ServeOptions::events).
pub struct EventReceiver {
    rx: mpsc::Receiver<String>,
}

impl fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventReceiver").finish_non_exhaustive()
    }
}

impl Device {
    /// A queue of events for this device, holding up to `capacity` frames
    /// (at least one). Pass the receiver to
    /// [`ServeOptions::events`](crate::ServeOptions::events); keep the sender
    /// (it may be cloned, e.g. into handlers).
    pub fn events(&self, capacity: usize) -> (EventSender, EventReceiver) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            EventSender {
                device: self.clone(),
                tx,
            },
            EventReceiver { rx },
        )
    }
}

impl EventSender {
    /// Queues `device:event {capability, data}`, waiting while the queue is full.
    pub async fn emit(&self, capability: &str, data: Value) -> Result<(), EmitError> {
        let frame = self.frame(capability, &data)?;
        self.tx.send(frame).await.map_err(|_| EmitError::Closed)
    }

    /// Queues `device:event {capability, data}` without waiting: a full
    /// queue answers [`EmitError::Full`].
    pub fn try_emit(&self, capability: &str, data: Value) -> Result<(), EmitError> {
        let frame = self.frame(capability, &data)?;
        self.tx.try_send(frame).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => EmitError::Full,
            mpsc::error::TrySendError::Closed(_) => EmitError::Closed,
        })
    }

    /// True once the receiver is gone: nothing emitted can be sent.
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    fn frame(&self, capability: &str, data: &Value) -> Result<String, EmitError> {
        // A declared event (the dk manifest extension) goes only with data
        // that keeps its params, as the vessel checks it.
        if let Some(event) = self.device.manifest().event(capability) {
            dk_proto::check_event(event, data)
                .map_err(|why| EmitError::Refused(format!("event \"{capability}\" data: {why}")))?;
        } else if !self.device.has_capability(capability) {
            return Err(EmitError::UnknownCapability(capability.to_owned()));
        }
        let data = serde_json::to_string(data).map_err(|e| EmitError::NotJson(e.to_string()))?;
        event_frame(capability, &data).map_err(|refusal| match refusal {
            EventRefusal::NotJson(why) => EmitError::NotJson(why),
            EventRefusal::UnknownCapability(name) => EmitError::UnknownCapability(name),
            other => EmitError::Refused(match other {
                EventRefusal::Refused(why) => why,
                other => other.to_string(),
            }),
        })
    }
}

impl EventReceiver {
    /// The next event frame, or `None` once every sender is gone.
    pub(crate) async fn recv(&mut self) -> Option<String> {
        self.rx.recv().await
    }
}
