//! Why a capability call brought back no result: the device's own error, or
//! one of the vessel's failures to reach it. `Display` is the text an agent
//! reads after `device error: `, as 8DK words it.

use alloc::string::String;
use core::time::Duration;

use serde::{Deserialize, Serialize};

/// A call to a device that failed. As JSON (a fleet member tells another
/// why a call it carried failed): `{"kind": "timeout", "detail": ...}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "camelCase")]
pub enum InvokeError {
    /// The device answered `ok: false`: its error text, as it sent it
    /// (`device error` when it sent none).
    #[error("{0}")]
    Device(String),
    /// The device did not answer within the call's time.
    #[error("device did not answer within {}ms", .0.as_millis())]
    Timeout(Duration),
    /// The call could not be sent to the device.
    #[error("send failed: {0}")]
    Send(SendError),
    /// The call could not be sent within the call's time (the device is
    /// not reading).
    #[error("send failed: not sent within {}ms", .0.as_millis())]
    SendTimeout(Duration),
    /// The connection already carries its most calls in flight.
    #[error("too many calls in flight (at most {0})")]
    TooManyInFlight(usize),
    /// The connection is gone, or was closed, before an answer came.
    #[error("{0}")]
    Closed(LinkClosed),
    /// The call went through another vessel of the fleet, which holds the
    /// device: that vessel's failure to reach it, in the same words a call
    /// made there gets, or the fleet's failure to carry it (`fleet: ...`).
    #[error("{0}")]
    Routed(String),
}

/// Why the vessel's link to a device ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LinkClosed {
    /// The device's connection ended.
    #[error("device disconnected")]
    Disconnected,
    /// A newer connection of the same device took its place.
    #[error("replaced by a newer connection")]
    Replaced,
    /// The call's answer was dropped with the connection.
    #[error("connection closed")]
    Dropped,
}

impl InvokeError {
    /// The text a device's `ok: false` result stands for when it gives none.
    pub const NO_DEVICE_TEXT: &'static str = "device error";

    /// Whether the device itself answered with the error (as opposed to the
    /// vessel failing to reach it).
    pub fn is_device_error(&self) -> bool {
        matches!(self, InvokeError::Device(_))
    }
}

/// Why a call could not be handed to the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SendError {
    /// The connection's outgoing queue is full.
    #[error("connection is backed up")]
    BackedUp,
    /// The connection's writer is gone.
    #[error("connection closed")]
    Closed,
}

#[cfg(test)]
mod tests;
