//! Wire types for dk, compatible with 8DK v1: device manifests and their
//! digest, tool names, input checks, the JSON frames a device and a vessel
//! exchange, the close codes that end their connection, why a vessel refused
//! an agent's call and why a call to a device failed, and the admin API's
//! bodies ([`admin`]) and the media a result carries ([`media`]).
//!
//! Everything here is pure: no IO, no async runtime. Every function that takes
//! bytes or JSON from a device or an agent returns a typed error for bad input;
//! no input can make this crate panic (the fuzz targets and property tests in
//! the repository hold it to that).
//!
//! The default feature `std` links the standard library; without it the
//! crate is `no_std` with `alloc`, for a device's firmware, and offers the
//! same types and functions.

#![cfg_attr(not(feature = "std"), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod admin;
mod close;
mod frame;
mod input;
mod invoke;
mod manifest;
pub mod media;
mod refusal;
mod text;
mod tool_name;
mod why;

pub use close::{
    AdmissionCode, CloseCode, CloseFrame, MAX_CLOSE_REASON_BYTES, PairingLimit,
    UnknownAdmissionCode,
};
pub use frame::{
    Channel, DeviceFrame, FrameError, FrameLimits, MAX_FRAME_BYTES, MAX_FRAME_DEPTH,
    MAX_STREAM_NAME_BYTES, MAX_STREAM_OVERHEAD, RawInvoke, STREAM_CHUNK_KIND, STREAM_DROPPED_FRAME,
    STREAM_HEADER_BYTES, STREAM_MAGIC, STREAMING_FRAME, StreamChunk, StreamDroppedFrame,
    StreamFrameError, StreamingFrame, VesselFrame, VesselRead, is_hex32, nests_deeper_than,
};
pub use input::{InputError, MAX_DEPTH, check_event, check_input};
pub use invoke::{InvokeError, LinkClosed, SendError};
pub use manifest::validate::{validate_manifest, validate_manifest_json};
pub use manifest::{
    Annotations, Bounds, Capability, CapabilityKind, EventSpec, Manifest, ManifestError, Param,
    ParamType, limits,
};
pub use refusal::{MAX_RUN_ID, RUN_LIMITS_META_KEY, RUN_META_KEY, Refusal};
pub use text::{is_js_whitespace, is_unsafe_char, utf16_len};
pub use tool_name::{TOOL_PREFIX, ToolName, parse_tool_name, tool_name};
pub use why::{AskReason, CloseWhy, DeviceFailure, Malformed, ToolDescription};

/// Fuzzing entry points: each takes arbitrary bytes and must never panic.
#[doc(hidden)]
pub mod fuzz {
    /// Parses arbitrary bytes as a device frame and as a vessel frame, on
    /// both channels (v1 and dk/2).
    pub fn frame(data: &[u8]) {
        let limits = crate::FrameLimits::default();
        for channel in [crate::Channel::V1, crate::Channel::Dk2] {
            let _ = crate::DeviceFrame::parse_on(data, limits, channel);
            let _ = crate::VesselFrame::parse_on(data, limits, channel);
        }
    }

    /// Parses arbitrary bytes as a binary stream chunk.
    pub fn stream_chunk(data: &[u8]) {
        let _ = crate::StreamChunk::parse(data);
    }

    /// Validates arbitrary bytes as a manifest (when they are JSON) and digests it.
    pub fn manifest(data: &[u8]) {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data)
            && let Ok(manifest) = crate::validate_manifest(&value)
        {
            let _ = manifest.digest();
        }
    }

    /// Checks arbitrary bytes as the input of every capability of the reference lamp.
    pub fn input(data: &[u8]) {
        let Ok(input) = serde_json::from_slice::<serde_json::Value>(data) else {
            return;
        };
        let lamp = serde_json::json!({"id":"desk-lamp","name":"Desk lamp","kind":"lamp","version":"0.1.0",
            "capabilities":[{"name":"set_light","kind":"actuator","description":"Set the lamp.",
              "params":{"on":{"type":"boolean","required":true},"brightness":{"type":"number"},"label":{"type":"string"}}}]});
        if let Ok(manifest) = crate::validate_manifest(&lamp) {
            for capability in manifest.capabilities() {
                let _ = crate::check_input(capability, &input);
            }
        }
    }
}
