//! The JSON frames a device and a vessel exchange, and the parser for
//! untrusted frames.
//!
//! Parsing checks the size before anything else, then the nesting depth with
//! a single pass over the bytes, then reads the object with payloads borrowed
//! as raw JSON: the vessel forwards results, it never builds a tree of them.
//!
//! The frames, their limits and errors and the channel are defined here;
//! its parts: [`depth`] (the nesting depth in one pass), [`raw`] (size,
//! depth and the known keys read), [`fields`] (the type and each field
//! checked), [`device`] and [`vessel`] (each side's frames read and
//! written) and [`stream`] (binary stream chunks and the streaming
//! frames).

mod depth;
mod device;
mod fields;
mod raw;
mod stream;
mod vessel;

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::String;
use core::fmt;

use serde::de::{self, Deserialize, Deserializer};
use serde::ser::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

pub use depth::nests_deeper_than;
pub use stream::{
    MAX_STREAM_NAME_BYTES, MAX_STREAM_OVERHEAD, STREAM_CHUNK_KIND, STREAM_DROPPED_FRAME,
    STREAM_HEADER_BYTES, STREAM_MAGIC, STREAMING_FRAME, StreamChunk, StreamDroppedFrame,
    StreamFrameError, StreamingFrame,
};

/// Largest frame accepted by default, in bytes (1 MiB).
pub const MAX_FRAME_BYTES: usize = 1 << 20;
/// Deepest nesting of arrays and objects accepted by default (the frame
/// object itself is level 1). Checked by one pass over the bytes before the
/// JSON parser runs (the parser does not bound nesting inside the payloads it
/// keeps as raw text).
pub const MAX_FRAME_DEPTH: usize = 64;

/// Limits applied before a frame is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest frame in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of arrays and objects.
    pub max_depth: usize,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_bytes: MAX_FRAME_BYTES,
            max_depth: MAX_FRAME_DEPTH,
        }
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Larger than the size limit; nothing was parsed.
    #[error("frame of {len} bytes is larger than the limit of {max}")]
    TooLarge {
        /// The frame's size in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not UTF-8 text.
    #[error("frame is not UTF-8 text")]
    NotUtf8,
    /// Arrays and objects nested deeper than the limit.
    #[error("frame nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// Not JSON.
    #[error("frame is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object.
    #[error("frame is not a JSON object")]
    NotAnObject,
    /// No `type`, or a `type` that is not a string.
    #[error("frame has no type")]
    MissingType,
    /// A `type` that no frame has.
    #[error("unknown frame type {0:?}")]
    UnknownType(String),
    /// A frame only the other side sends.
    #[error("frame type \"{0}\" is not sent by this side")]
    WrongSide(&'static str),
    /// A required field is absent.
    #[error("{frame} frame is missing \"{field}\"")]
    MissingField {
        /// The frame type.
        frame: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A field has the wrong type.
    #[error("{frame} frame field \"{field}\" must be {expected}")]
    WrongType {
        /// The frame type.
        frame: &'static str,
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
}

const HELLO: &str = "device:hello";
const AUTH: &str = "device:auth";
const RESULT: &str = "device:result";
const EVENT: &str = "device:event";
const PAIRING: &str = "device:pairing";
const PAIRED: &str = "device:paired";
const INVOKE: &str = "device:invoke";
const REVOKED: &str = "device:revoked";
const PAIR_COMMIT: &str = "device:pair-commit";
const PAIR_NONCE: &str = "device:pair-nonce";
const PAIR_REVEAL: &str = "device:pair-reveal";
const CLOSING: &str = "device:closing";
const ERROR: &str = "device:error";

/// Which channel a device connection speaks: the frames a side accepts
/// depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Channel {
    /// 8DK v1: frames in clear, a bearer token, the code sent to the device.
    #[default]
    V1,
    /// dk/2: frames inside a Noise channel, the device's key as its
    /// credential, the code computed on both sides.
    Dk2,
}

impl Channel {
    /// The name listings, prompts and audit entries carry: `v1` or `dk/2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::V1 => "v1",
            Channel::Dk2 => "dk/2",
        }
    }

    /// Whether frames travel encrypted.
    pub fn is_encrypted(self) -> bool {
        self == Channel::Dk2
    }

    /// Reads a channel's name back (`v1` or `dk/2`).
    pub fn from_name(name: &str) -> Option<Channel> {
        match name {
            "v1" => Some(Channel::V1),
            "dk/2" => Some(Channel::Dk2),
            _ => None,
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Channel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Channel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = Cow::<str>::deserialize(deserializer)?;
        Channel::from_name(&name)
            .ok_or_else(|| de::Error::custom(format!("unknown channel {name:?}")))
    }
}

/// Whether `text` is exactly 64 lower-case hex digits, the form of a dk/2
/// commitment or nonce on the wire.
pub fn is_hex32(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A frame a device sends to the vessel. Strings and payloads borrow from the
/// text they were parsed from where they can.
#[derive(Debug, Clone)]
pub enum DeviceFrame<'a> {
    /// `device:hello {manifest}`: asks to pair. The manifest is an object
    /// (or an array, which 8DK also lets through here and validation refuses).
    Hello {
        /// The untrusted manifest, as sent.
        manifest: Cow<'a, RawValue>,
    },
    /// `device:auth {deviceId, token}`: a reconnect. dk's device client also
    /// sends its current `manifest`, a field a v1 vessel ignores.
    Auth {
        /// The device id, non-empty.
        device_id: Cow<'a, str>,
        /// The device token, non-empty.
        token: Cow<'a, str>,
        /// The current manifest, when the device sent one (any JSON).
        manifest: Option<Cow<'a, RawValue>>,
    },
    /// `device:result {callId, ok, result?, error?}`: the answer to an invoke.
    Result {
        /// The call answered, non-empty.
        call_id: Cow<'a, str>,
        /// Whether the call succeeded.
        ok: bool,
        /// The result, whenever the key was present (even `null`).
        result: Option<Cow<'a, RawValue>>,
        /// The error text, only when it was a string.
        error: Option<Cow<'a, str>>,
    },
    /// `device:event {capability, data}`: something the device noticed.
    Event {
        /// The capability the event belongs to, non-empty.
        capability: Cow<'a, str>,
        /// The event's data, when present.
        data: Option<Cow<'a, RawValue>>,
    },
    /// dk/2 only: `device:auth {deviceId, manifest}`, a reconnect whose
    /// credential is the key the channel was made with. A `token` sent with
    /// it is ignored.
    KeyAuth {
        /// The device id, non-empty.
        device_id: Cow<'a, str>,
        /// The current manifest (any JSON; validation judges it).
        manifest: Cow<'a, RawValue>,
    },
    /// dk/2 only: `device:pair-nonce {nonce}`, the device's pairing nonce,
    /// 64 lower-case hex digits.
    PairNonce {
        /// The nonce, checked to be 64 lower-case hex digits.
        nonce: Cow<'a, str>,
    },
}

/// A frame the vessel sends to a device.
#[derive(Debug, Clone, PartialEq)]
pub enum VesselFrame<'a> {
    /// `device:pairing {code}`: the 6-digit code for the device to show.
    Pairing {
        /// Six digits, zero-padded.
        code: Cow<'a, str>,
    },
    /// `device:paired {deviceToken}`: sent once, on a yes.
    Paired {
        /// 64 lower-case hex characters.
        device_token: Cow<'a, str>,
    },
    /// `device:invoke {callId, capability, input}`: a call.
    Invoke {
        /// A random UUID matching the result to the call.
        call_id: Cow<'a, str>,
        /// The capability called.
        capability: Cow<'a, str>,
        /// The validated input.
        input: Cow<'a, Map<String, Value>>,
    },
    /// `device:revoked {capability?}`: a grant was revoked, or (without a
    /// capability) the pairing was ended.
    Revoked {
        /// The revoked capability, absent when the whole pairing ended.
        capability: Option<Cow<'a, str>>,
    },
    /// dk/2 only: `device:pair-commit {commitment}`, the vessel's commitment
    /// to its nonce, 64 lower-case hex digits.
    PairCommit {
        /// The commitment, checked to be 64 lower-case hex digits.
        commitment: Cow<'a, str>,
    },
    /// dk/2 only: `device:pair-reveal {nonce}`, the vessel's nonce, sent once
    /// it holds the device's.
    PairReveal {
        /// The nonce, checked to be 64 lower-case hex digits.
        nonce: Cow<'a, str>,
    },
    /// dk/2 only: `device:paired` without a token: the person said yes and
    /// the device's key is pinned.
    KeyPaired,
    /// dk/2 only: `device:closing {code, reason}`, sent inside the channel
    /// before every close the vessel makes, so the device can tell a real
    /// refusal from a close forged on the path.
    Closing {
        /// The close code that follows.
        code: u16,
        /// Its reason.
        reason: Cow<'a, str>,
    },
    /// `device:error {error}`: dk's answer to a frame it refused (not
    /// JSON, too large, out of order), on either channel. 8DK v1 has no such
    /// frame; a v1 device ignores it as an unknown type. A missing `error`
    /// reads as empty.
    Error {
        /// What was wrong with the frame.
        error: Cow<'a, str>,
    },
    /// `device:streaming {kind, maxChunkBytes, maxConcurrentSessions}`:
    /// dk's admission of a streaming session, known to a device on either
    /// channel (8DK has no such frame; a v1 device ignores it as an unknown
    /// type). A `maxChunkBytes` of 0 is refused.
    Streaming(StreamingFrame),
    /// `device:stream-dropped {stream, seq, accepted, bytes, marker}`: dk's
    /// report of a chunk the vessel dropped, known to a device on either
    /// channel.
    StreamDropped(StreamDroppedFrame),
}

/// A `device:invoke` as [`VesselFrame::parse_keeping_input`] reads it:
/// its input is the JSON text it came as, borrowed from the frame.
#[derive(Debug, Clone)]
pub struct RawInvoke<'a> {
    /// A random UUID matching the result to the call.
    pub call_id: Cow<'a, str>,
    /// The capability called.
    pub capability: Cow<'a, str>,
    /// The input, a JSON object, as its text in the frame.
    pub input: &'a RawValue,
}

/// What [`VesselFrame::parse_keeping_input`] read: an invoke with its
/// input as text, or any other frame.
#[derive(Debug, Clone)]
pub enum VesselRead<'a> {
    /// A `device:invoke`.
    Invoke(RawInvoke<'a>),
    /// Any other frame, as [`VesselFrame::parse_on`] gives it.
    Frame(VesselFrame<'a>),
}

#[cfg(test)]
mod tests;
