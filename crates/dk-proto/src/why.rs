//! The vessel's own words on the wire that are not a refusal: why a
//! connection is closed ([`CloseWhy`]), why a device's frame was set aside
//! ([`Malformed`], sent in `device:error`), why the person is asked
//! ([`AskReason`]), a device's failure as an agent reads it
//! ([`DeviceFailure`]) and a device tool's description
//! ([`ToolDescription`]). Each `Display` is the text, so no crate spells
//! one by hand.

use alloc::string::String;
use core::fmt;

use crate::invoke::InvokeError;

/// Why the vessel closes a connection, for the reasons that carry a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloseWhy {
    /// A text frame over the connection's limit (1009).
    #[error("frames are at most {0} bytes")]
    FrameTooLarge(usize),
    /// A binary stream message over twice its session's cap (1009).
    #[error("stream messages are at most {0} bytes")]
    StreamMessageTooLarge(usize),
    /// More frames in a second than the vessel takes (4008).
    #[error("more than {0} frames per second")]
    OverRate(u32),
    /// More dk/2 records in a second than the vessel takes (4008).
    #[error("more than {0} records per second")]
    OverRecordRate(u32),
    /// A pairing ended by a frame out of order (4001).
    #[error("pairing did not happen: {0}")]
    PairingDidNotHappen(String),
}

/// Why a device's frame was set aside, for the reasons that name what the
/// frame said (the fixed ones are in the connection's code as they are).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// An event for a capability the device did not declare.
    #[error("event for undeclared capability {0:?}")]
    UndeclaredEvent(String),
    /// A declared event (the dk extension) whose data does not keep its
    /// params: dropped.
    #[error("event {event:?} data: {why}")]
    EventData {
        /// The event.
        event: String,
        /// What its params say of the data.
        why: String,
    },
    /// A stream chunk naming a stream that is not one of the device's sensors.
    #[error("stream {0:?} is not a sensor capability of the device")]
    NotASensorStream(String),
}

/// Why the person is asked about a call when no rule gave a reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AskReason<'a> {
    /// The capability is declared `confirm`: every call is asked.
    Confirm {
        /// The capability called.
        capability: &'a str,
        /// The device's name, as its manifest gives it.
        device_name: &'a str,
    },
    /// A streaming device's reconnect, when its class policy asks.
    StreamReconnect {
        /// The device class (`voice`, `desktop-control`).
        class: &'a str,
        /// The device's name, as its manifest gives it.
        device_name: &'a str,
    },
}

impl fmt::Display for AskReason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AskReason::Confirm {
                capability,
                device_name,
            } => write!(f, "\"{capability}\" on {device_name} asks every time"),
            AskReason::StreamReconnect { class, device_name } => write!(
                f,
                "{class} device side effect requires approval: {device_name:?} reconnects to stream"
            ),
        }
    }
}

impl AskReason<'_> {
    /// The tool an approval of a streaming reconnect is asked under:
    /// `stream:<class>` (never a device tool's name).
    pub fn stream_tool(class: &str) -> String {
        let mut tool = String::with_capacity(7 + class.len());
        tool.push_str("stream:");
        tool.push_str(class);
        tool
    }
}

/// A device's failure as the agent reads it: `device error: <what>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFailure<'a>(pub &'a InvokeError);

impl fmt::Display for DeviceFailure<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device error: {}", self.0)
    }
}

/// A device tool's description, 8DK's:
/// `[DEVICE <name> (<kind>) <sensor|actuator>] <description>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolDescription<'a> {
    /// The device's name.
    pub device_name: &'a str,
    /// The device's kind, as its manifest gives it.
    pub device_kind: &'a str,
    /// `sensor` or `actuator`.
    pub capability_kind: &'a str,
    /// The capability's own description.
    pub description: &'a str,
}

impl fmt::Display for ToolDescription<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[DEVICE {} ({}) {}] {}",
            self.device_name, self.device_kind, self.capability_kind, self.description
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_text_reads_as_the_vessel_has_always_written_it() {
        assert_eq!(
            CloseWhy::FrameTooLarge(1_048_576).to_string(),
            "frames are at most 1048576 bytes"
        );
        assert_eq!(
            CloseWhy::StreamMessageTooLarge(131_072).to_string(),
            "stream messages are at most 131072 bytes"
        );
        assert_eq!(
            CloseWhy::OverRate(50).to_string(),
            "more than 50 frames per second"
        );
        assert_eq!(
            CloseWhy::OverRecordRate(800).to_string(),
            "more than 800 records per second"
        );
        assert_eq!(
            CloseWhy::PairingDidNotHappen("the code was wrong".into()).to_string(),
            "pairing did not happen: the code was wrong"
        );
        assert_eq!(
            Malformed::UndeclaredEvent("mo\"tion".into()).to_string(),
            "event for undeclared capability \"mo\\\"tion\""
        );
        assert_eq!(
            Malformed::NotASensorStream("mic".into()).to_string(),
            "stream \"mic\" is not a sensor capability of the device"
        );
        assert_eq!(
            AskReason::Confirm {
                capability: "unlock",
                device_name: "Front Door"
            }
            .to_string(),
            "\"unlock\" on Front Door asks every time"
        );
        assert_eq!(
            AskReason::StreamReconnect {
                class: "voice",
                device_name: "Kitchen"
            }
            .to_string(),
            "voice device side effect requires approval: \"Kitchen\" reconnects to stream"
        );
        assert_eq!(AskReason::stream_tool("voice"), "stream:voice");
        assert_eq!(
            DeviceFailure(&InvokeError::Device("jammed".into())).to_string(),
            "device error: jammed"
        );
        assert_eq!(
            ToolDescription {
                device_name: "Desk Lamp",
                device_kind: "light",
                capability_kind: "actuator",
                description: "Set the light"
            }
            .to_string(),
            "[DEVICE Desk Lamp (light) actuator] Set the light"
        );
    }
}
