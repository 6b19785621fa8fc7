//! The JSON frames a device and a vessel exchange, and the parser for
//! untrusted frames.
//!
//! Parsing checks the size before anything else, then the nesting depth with
//! a single pass over the bytes, then reads the object with payloads borrowed
//! as raw JSON: the vessel forwards results, it never builds a tree of them.

use alloc::borrow::Cow;
use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

mod stream;

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
/// serde_json's own recursion limit.
const PARSER_DEPTH_LIMIT: usize = 127;
/// How much of an unknown frame type an error quotes, in bytes.
const TYPE_QUOTE: usize = 64;

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

/// The known keys of any frame, each as raw JSON; unknown keys are skipped.
/// A repeated key keeps its last value, as `JSON.parse` does.
#[derive(Default)]
struct RawFrame<'a> {
    kind: Option<Scalar<'a>>,
    manifest: Option<&'a RawValue>,
    device_id: Option<Scalar<'a>>,
    token: Option<Scalar<'a>>,
    call_id: Option<Scalar<'a>>,
    ok: Option<Scalar<'a>>,
    result: Option<&'a RawValue>,
    error: Option<Scalar<'a>>,
    capability: Option<Scalar<'a>>,
    data: Option<&'a RawValue>,
    code: Option<Scalar<'a>>,
    device_token: Option<Scalar<'a>>,
    input: Option<&'a RawValue>,
    commitment: Option<Scalar<'a>>,
    nonce: Option<Scalar<'a>>,
    reason: Option<Scalar<'a>>,
    /// `device:streaming`'s fields (`kind` is the device's kind).
    device_kind: Option<Scalar<'a>>,
    max_chunk_bytes: Option<Scalar<'a>>,
    max_concurrent_sessions: Option<Scalar<'a>>,
    /// `device:stream-dropped`'s fields.
    stream: Option<Scalar<'a>>,
    seq: Option<Scalar<'a>>,
    accepted: Option<Scalar<'a>>,
    bytes: Option<Scalar<'a>>,
    marker: Option<Scalar<'a>>,
}

/// A field that must be a string or a boolean: read directly, without
/// keeping its raw text. Anything else is `Other`, a wrong type.
#[derive(Debug, Clone)]
enum Scalar<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    /// A whole number that fits in a u64.
    Uint(u64),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor<'a>(core::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ScalarVisitor<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Owned(v)))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Uint(v))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other)
            }
            fn visit_none<E: de::Error>(self) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar<'a>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar<'a>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        deserializer.deserialize_any(ScalarVisitor(core::marker::PhantomData))
    }
}

impl<'a> Scalar<'a> {
    fn into_str(self) -> Option<Cow<'a, str>> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }
}

enum Key {
    Type,
    Manifest,
    DeviceId,
    Token,
    CallId,
    Ok,
    Result,
    Error,
    Capability,
    Data,
    Code,
    DeviceToken,
    Input,
    Commitment,
    Nonce,
    Reason,
    DeviceKind,
    MaxChunkBytes,
    MaxConcurrentSessions,
    Stream,
    Seq,
    Accepted,
    Bytes,
    Marker,
    Other,
}

impl Key {
    fn from_name(name: &str) -> Key {
        match name {
            "type" => Key::Type,
            "manifest" => Key::Manifest,
            "deviceId" => Key::DeviceId,
            "token" => Key::Token,
            "callId" => Key::CallId,
            "ok" => Key::Ok,
            "result" => Key::Result,
            "error" => Key::Error,
            "capability" => Key::Capability,
            "data" => Key::Data,
            "code" => Key::Code,
            "deviceToken" => Key::DeviceToken,
            "input" => Key::Input,
            "commitment" => Key::Commitment,
            "nonce" => Key::Nonce,
            "reason" => Key::Reason,
            "kind" => Key::DeviceKind,
            "maxChunkBytes" => Key::MaxChunkBytes,
            "maxConcurrentSessions" => Key::MaxConcurrentSessions,
            "stream" => Key::Stream,
            "seq" => Key::Seq,
            "accepted" => Key::Accepted,
            "bytes" => Key::Bytes,
            "marker" => Key::Marker,
            _ => Key::Other,
        }
    }
}

impl<'a> RawFrame<'a> {
    /// Where the value of `key` goes: a payload kept as raw JSON, a scalar
    /// read directly, or nowhere (an unknown key).
    fn slot(&mut self, key: Key) -> Slot<'_, 'a> {
        let scalar = match key {
            Key::Manifest => return Slot::Raw(&mut self.manifest),
            Key::Result => return Slot::Raw(&mut self.result),
            Key::Data => return Slot::Raw(&mut self.data),
            Key::Input => return Slot::Raw(&mut self.input),
            Key::Other => return Slot::Skipped,
            Key::Type => &mut self.kind,
            Key::DeviceId => &mut self.device_id,
            Key::Token => &mut self.token,
            Key::CallId => &mut self.call_id,
            Key::Ok => &mut self.ok,
            Key::Error => &mut self.error,
            Key::Capability => &mut self.capability,
            Key::Code => &mut self.code,
            Key::DeviceToken => &mut self.device_token,
            Key::Commitment => &mut self.commitment,
            Key::Nonce => &mut self.nonce,
            Key::Reason => &mut self.reason,
            Key::DeviceKind => &mut self.device_kind,
            Key::MaxChunkBytes => &mut self.max_chunk_bytes,
            Key::MaxConcurrentSessions => &mut self.max_concurrent_sessions,
            Key::Stream => &mut self.stream,
            Key::Seq => &mut self.seq,
            Key::Accepted => &mut self.accepted,
            Key::Bytes => &mut self.bytes,
            Key::Marker => &mut self.marker,
        };
        Slot::Scalar(scalar)
    }
}

/// A field of [`RawFrame`] a key's value is read into.
enum Slot<'f, 'a> {
    Raw(&'f mut Option<&'a RawValue>),
    Scalar(&'f mut Option<Scalar<'a>>),
    Skipped,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key::from_name(v))
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// Reads a frame object into the [`RawFrame`] it borrows, in place: the
/// frame is some hundreds of bytes, and returning it by value through the
/// parser's layers copied it several times per frame.
struct FrameSeed<'f, 'a>(&'f mut RawFrame<'a>);

impl<'de: 'a, 'a> de::DeserializeSeed<'de> for FrameSeed<'_, 'a> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for FrameSeed<'_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a frame object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let frame = self.0;
        while let Some(key) = map.next_key::<Key>()? {
            match frame.slot(key) {
                Slot::Raw(raw) => *raw = Some(map.next_value()?),
                Slot::Scalar(scalar) => *scalar = Some(map.next_value::<Scalar<'de>>()?),
                Slot::Skipped => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A required non-empty string field.
fn required_str<'a>(
    field_value: Option<Scalar<'a>>,
    frame: &'static str,
    field: &'static str,
) -> Result<Cow<'a, str>, FrameError> {
    let value = field_value.ok_or(FrameError::MissingField { frame, field })?;
    match value.into_str() {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(FrameError::WrongType {
            frame,
            field,
            expected: "a non-empty string",
        }),
    }
}

/// A required string field, kept whole (it may be empty).
fn string(
    field_value: Option<Scalar<'_>>,
    frame: &'static str,
    field: &'static str,
) -> Result<String, FrameError> {
    match field_value.ok_or(FrameError::MissingField { frame, field })? {
        Scalar::Str(s) => Ok(s.into_owned()),
        _ => Err(FrameError::WrongType {
            frame,
            field,
            expected: "a string",
        }),
    }
}

/// A required field holding a whole number that fits in a u64.
fn whole(
    field_value: Option<Scalar<'_>>,
    frame: &'static str,
    field: &'static str,
) -> Result<u64, FrameError> {
    match field_value.ok_or(FrameError::MissingField { frame, field })? {
        Scalar::Uint(n) => Ok(n),
        _ => Err(FrameError::WrongType {
            frame,
            field,
            expected: "a whole number",
        }),
    }
}

/// A required field of 64 lower-case hex digits.
fn required_hex<'a>(
    field_value: Option<Scalar<'a>>,
    frame: &'static str,
    field: &'static str,
) -> Result<Cow<'a, str>, FrameError> {
    let value = field_value.ok_or(FrameError::MissingField { frame, field })?;
    match value.into_str() {
        Some(s) if is_hex32(&s) => Ok(s),
        _ => Err(FrameError::WrongType {
            frame,
            field,
            expected: "64 lower-case hex digits",
        }),
    }
}

fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

/// True when arrays and objects in the JSON text `bytes` nest deeper than
/// `max` (an outermost object is depth 1). One pass, skipping string
/// contents; it runs before serde so a hostile frame cannot drive the
/// parser's recursion, and serves anyone who must know, before sending,
/// whether a value fits [`MAX_FRAME_DEPTH`].
pub fn nests_deeper_than(bytes: &[u8], max: usize) -> bool {
    // Depth cannot exceed the number of opening brackets: when there are few
    // (the usual frame), this vectorised count saves the exact pass.
    // `[` is 0x5B and `{` is 0x7B: one masked compare finds both. Each chunk
    // of at most 255 bytes is counted in a byte, so the loop runs sixteen
    // bytes to a vector instead of widening every byte to a word.
    let opening: usize = bytes
        .chunks(255)
        .map(|chunk| {
            let count = chunk
                .iter()
                .fold(0u8, |n, &b| n.wrapping_add(u8::from(b | 0x20 == b'{')));
            usize::from(count)
        })
        .sum();
    if opening <= max {
        return false;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The parser's error, except that its recursion limit reads as
/// [`FrameError::TooDeep`].
fn not_json(error: &serde_json::Error, max_depth: usize) -> FrameError {
    let message = error.to_string();
    if message.starts_with("recursion limit exceeded") {
        return FrameError::TooDeep { max: max_depth };
    }
    FrameError::NotJson(message)
}

/// JSON's white space, the only white space allowed between tokens.
fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Reads the frame object `text` into `frame` when it is of the plainest
/// form, the form devices send: keys and string values without escapes,
/// string or boolean scalars, payloads of any JSON. `None` as soon as
/// anything else appears (an escape, a number or `null` where a scalar goes,
/// a syntax error...): the caller then reads the frame with the full parser,
/// which decides and words the error. Whatever this reads, the full parser
/// reads the same (a key repeated keeps its last value), so it only spares
/// the parser's generic machinery on the keys and scalars; payloads and
/// skipped values are still read, and checked, by serde_json.
fn read_plain<'a>(text: &'a str, frame: &mut RawFrame<'a>) -> Option<()> {
    let bytes = text.as_bytes();
    let mut at = skip_space(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_space(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return (skip_space(bytes, at + 1) == bytes.len()).then_some(());
    }
    loop {
        let (key, after) = plain_string(text, at)?;
        at = skip_space(bytes, after);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_space(bytes, at + 1);
        match frame.slot(Key::from_name(key)) {
            Slot::Scalar(scalar) => {
                let (value, after) = plain_scalar(text, at)?;
                *scalar = Some(value);
                at = after;
            }
            Slot::Raw(raw) => {
                let (value, after) = raw_value(text, at)?;
                *raw = Some(value);
                at = after;
            }
            Slot::Skipped => at = raw_value(text, at)?.1,
        }
        at = skip_space(bytes, at);
        match bytes.get(at) {
            Some(b',') => at = skip_space(bytes, at + 1),
            Some(b'}') => return (skip_space(bytes, at + 1) == bytes.len()).then_some(()),
            _ => return None,
        }
    }
}

/// The position of the first byte at or after `at` that is not JSON white
/// space.
fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).copied().is_some_and(is_json_space) {
        at += 1;
    }
    at
}

/// The string starting with the quote at `at`, when it has no escape and no
/// control character, and the position after its closing quote.
fn plain_string(text: &str, at: usize) -> Option<(&str, usize)> {
    let bytes = text.as_bytes();
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let end = start + string_stop(bytes.get(start..)?)?;
    if bytes.get(end) != Some(&b'"') {
        return None;
    }
    // Both ends are ASCII quotes, so the slice falls on characters.
    Some((text.get(start..end)?, end + 1))
}

/// The position of the first quote, backslash or control character in
/// `bytes`, eight bytes at a time (the bit trick serde_json's own string
/// scan uses: in each word, the lowest byte flagged is exact).
fn string_stop(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::MAX / 255;
    const HIGHS: u64 = ONES << 7;
    let mut words = bytes.chunks_exact(8);
    let mut offset = 0;
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().ok()?);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let stops = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        let stops = stops & HIGHS;
        if stops != 0 {
            return Some(offset + usize::try_from(stops.trailing_zeros() / 8).ok()?);
        }
        offset += 8;
    }
    let rest = words.remainder();
    Some(
        offset
            + rest
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?,
    )
}

/// A string without escapes, `true` or `false` at `at`, and the position
/// after it.
fn plain_scalar(text: &str, at: usize) -> Option<(Scalar<'_>, usize)> {
    let rest = text.as_bytes().get(at..)?;
    if rest.starts_with(b"true") {
        Some((Scalar::Bool(true), at + 4))
    } else if rest.starts_with(b"false") {
        Some((Scalar::Bool(false), at + 5))
    } else {
        let (value, after) = plain_string(text, at)?;
        Some((Scalar::Str(Cow::Borrowed(value)), after))
    }
}

/// One JSON value at `at`, read and checked by serde_json as the full parser
/// reads a payload, and the position after it.
fn raw_value(text: &str, at: usize) -> Option<(&RawValue, usize)> {
    let rest = text.get(at..)?;
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<&RawValue>();
    let value = values.next()?.ok()?;
    Some((value, at + values.byte_offset()))
}

/// Size, UTF-8, depth and object checks shared by both directions; the
/// frame's known keys land in `frame`.
fn read_raw<'a>(
    bytes: &'a [u8],
    limits: FrameLimits,
    frame: &mut RawFrame<'a>,
) -> Result<(), FrameError> {
    if bytes.len() > limits.max_bytes {
        return Err(FrameError::TooLarge {
            len: bytes.len(),
            max: limits.max_bytes,
        });
    }
    let text = core::str::from_utf8(bytes).map_err(|_| FrameError::NotUtf8)?;
    // The parser refuses nesting past 128 in the values it walks itself.
    let max_depth = limits.max_depth.min(PARSER_DEPTH_LIMIT);
    if nests_deeper_than(bytes, max_depth) {
        return Err(FrameError::TooDeep { max: max_depth });
    }
    if read_plain(text, frame).is_some() {
        return Ok(());
    }
    // Whatever the plain reading took is read again from the start.
    *frame = RawFrame::default();
    if !text.trim_start().starts_with('{') {
        return Err(match serde_json::from_str::<IgnoredAny>(text) {
            Ok(_) => FrameError::NotAnObject,
            Err(e) => not_json(&e, max_depth),
        });
    }
    let mut parser = serde_json::Deserializer::from_str(text);
    de::DeserializeSeed::deserialize(FrameSeed(frame), &mut parser)
        .and_then(|()| parser.end())
        .map_err(|e| not_json(&e, max_depth))
}

/// Which side parses a frame: the one it is sent to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    Vessel,
    Device,
}

/// The frame type, checked against those of the channel: v1 knows 8DK's
/// eight; dk/2 adds the pairing exchange and `device:closing`, and has no
/// `device:pairing` (its code is never sent). A device also knows dk's
/// `device:error`, `device:streaming` and `device:stream-dropped` on both (a
/// vessel reading one sent to it finds an unknown type, as 8DK's does).
fn frame_type(
    raw: Option<Scalar<'_>>,
    channel: Channel,
    reader: Reader,
) -> Result<&'static str, FrameError> {
    let name = raw
        .and_then(Scalar::into_str)
        .ok_or(FrameError::MissingType)?;
    if reader == Reader::Device
        && let Some(kind) = [ERROR, STREAMING_FRAME, STREAM_DROPPED_FRAME]
            .into_iter()
            .find(|kind| *kind == name)
    {
        return Ok(kind);
    }
    let known: &[&'static str] = match channel {
        Channel::V1 => &[HELLO, AUTH, RESULT, EVENT, PAIRING, PAIRED, INVOKE, REVOKED],
        Channel::Dk2 => &[
            HELLO,
            AUTH,
            RESULT,
            EVENT,
            PAIRED,
            INVOKE,
            REVOKED,
            PAIR_COMMIT,
            PAIR_NONCE,
            PAIR_REVEAL,
            CLOSING,
        ],
    };
    match known.iter().find(|k| **k == name) {
        Some(kind) => Ok(kind),
        None => {
            let mut cut = TYPE_QUOTE.min(name.len());
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            Err(FrameError::UnknownType(
                name.get(..cut).unwrap_or_default().to_owned(),
            ))
        }
    }
}

impl<'a> DeviceFrame<'a> {
    /// Parses an untrusted frame from a device with the default limits.
    pub fn parse(bytes: &'a [u8]) -> Result<DeviceFrame<'a>, FrameError> {
        Self::parse_with(bytes, FrameLimits::default())
    }

    /// Parses an untrusted frame from a device. Follows 8DK's rules: hello
    /// needs an object manifest; auth a non-empty string deviceId and token;
    /// result a non-empty string callId and a boolean ok (`result` kept
    /// whenever the key is present, `error` only when it is a string); event a
    /// non-empty string capability. A frame only a vessel sends is refused.
    pub fn parse_with(bytes: &'a [u8], limits: FrameLimits) -> Result<DeviceFrame<'a>, FrameError> {
        Self::parse_on(bytes, limits, Channel::V1)
    }

    /// [`DeviceFrame::parse_with`] for a connection on `channel`. On v1 it is
    /// exactly that. On dk/2 `device:auth` carries no token (one sent is
    /// ignored) and needs its `manifest` ([`DeviceFrame::KeyAuth`]), and
    /// `device:pair-nonce` is known.
    pub fn parse_on(
        bytes: &'a [u8],
        limits: FrameLimits,
        channel: Channel,
    ) -> Result<DeviceFrame<'a>, FrameError> {
        let mut raw = RawFrame::default();
        read_raw(bytes, limits, &mut raw)?;
        match frame_type(raw.kind, channel, Reader::Vessel)? {
            AUTH if channel == Channel::Dk2 => Ok(DeviceFrame::KeyAuth {
                device_id: required_str(raw.device_id, AUTH, "deviceId")?,
                manifest: Cow::Borrowed(raw.manifest.ok_or(FrameError::MissingField {
                    frame: AUTH,
                    field: "manifest",
                })?),
            }),
            PAIR_NONCE => Ok(DeviceFrame::PairNonce {
                nonce: required_hex(raw.nonce, PAIR_NONCE, "nonce")?,
            }),
            RESULT => {
                let call_id = required_str(raw.call_id, RESULT, "callId")?;
                let ok = match raw.ok {
                    Some(Scalar::Bool(ok)) => ok,
                    Some(_) => {
                        return Err(FrameError::WrongType {
                            frame: RESULT,
                            field: "ok",
                            expected: "a boolean",
                        });
                    }
                    None => {
                        return Err(FrameError::MissingField {
                            frame: RESULT,
                            field: "ok",
                        });
                    }
                };
                Ok(DeviceFrame::Result {
                    call_id,
                    ok,
                    result: raw.result.map(Cow::Borrowed),
                    error: raw.error.and_then(Scalar::into_str),
                })
            }
            HELLO => match raw.manifest {
                // `typeof x === "object"` holds for arrays too; validation refuses them.
                Some(m) if is_object(m) || m.get().starts_with('[') => Ok(DeviceFrame::Hello {
                    manifest: Cow::Borrowed(m),
                }),
                Some(_) => Err(FrameError::WrongType {
                    frame: HELLO,
                    field: "manifest",
                    expected: "an object",
                }),
                None => Err(FrameError::MissingField {
                    frame: HELLO,
                    field: "manifest",
                }),
            },
            AUTH => Ok(DeviceFrame::Auth {
                device_id: required_str(raw.device_id, AUTH, "deviceId")?,
                token: required_str(raw.token, AUTH, "token")?,
                manifest: raw.manifest.map(Cow::Borrowed),
            }),
            EVENT => Ok(DeviceFrame::Event {
                capability: required_str(raw.capability, EVENT, "capability")?,
                data: raw.data.map(Cow::Borrowed),
            }),
            other => Err(FrameError::WrongSide(other)),
        }
    }

    /// The frame's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            DeviceFrame::Hello { .. } => HELLO,
            DeviceFrame::Auth { .. } => AUTH,
            DeviceFrame::Result { .. } => RESULT,
            DeviceFrame::Event { .. } => EVENT,
            DeviceFrame::KeyAuth { .. } => AUTH,
            DeviceFrame::PairNonce { .. } => PAIR_NONCE,
        }
    }

    /// The frame as compact JSON text, as 8DK writes it.
    pub fn to_json(&self) -> String {
        // Serialising strings and raw JSON into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The same frame, owning its data.
    pub fn into_owned(self) -> DeviceFrame<'static> {
        match self {
            DeviceFrame::Hello { manifest } => DeviceFrame::Hello {
                manifest: Cow::Owned(manifest.into_owned()),
            },
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => DeviceFrame::Auth {
                device_id: Cow::Owned(device_id.into_owned()),
                token: Cow::Owned(token.into_owned()),
                manifest: manifest.map(|m| Cow::Owned(m.into_owned())),
            },
            DeviceFrame::Result {
                call_id,
                ok,
                result,
                error,
            } => DeviceFrame::Result {
                call_id: Cow::Owned(call_id.into_owned()),
                ok,
                result: result.map(|r| Cow::Owned(r.into_owned())),
                error: error.map(|e| Cow::Owned(e.into_owned())),
            },
            DeviceFrame::Event { capability, data } => DeviceFrame::Event {
                capability: Cow::Owned(capability.into_owned()),
                data: data.map(|d| Cow::Owned(d.into_owned())),
            },
            DeviceFrame::KeyAuth {
                device_id,
                manifest,
            } => DeviceFrame::KeyAuth {
                device_id: Cow::Owned(device_id.into_owned()),
                manifest: Cow::Owned(manifest.into_owned()),
            },
            DeviceFrame::PairNonce { nonce } => DeviceFrame::PairNonce {
                nonce: Cow::Owned(nonce.into_owned()),
            },
        }
    }
}

impl Serialize for DeviceFrame<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.type_name())?;
        match self {
            DeviceFrame::Hello { manifest } => map.serialize_entry("manifest", manifest)?,
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => {
                map.serialize_entry("deviceId", device_id)?;
                map.serialize_entry("token", token)?;
                if let Some(manifest) = manifest {
                    map.serialize_entry("manifest", manifest)?;
                }
            }
            DeviceFrame::Result {
                call_id,
                ok,
                result,
                error,
            } => {
                map.serialize_entry("callId", call_id)?;
                map.serialize_entry("ok", ok)?;
                if let Some(result) = result {
                    map.serialize_entry("result", result)?;
                }
                if let Some(error) = error {
                    map.serialize_entry("error", error)?;
                }
            }
            DeviceFrame::Event { capability, data } => {
                map.serialize_entry("capability", capability)?;
                if let Some(data) = data {
                    map.serialize_entry("data", data)?;
                }
            }
            DeviceFrame::KeyAuth {
                device_id,
                manifest,
            } => {
                map.serialize_entry("deviceId", device_id)?;
                map.serialize_entry("manifest", manifest)?;
            }
            DeviceFrame::PairNonce { nonce } => map.serialize_entry("nonce", nonce)?,
        }
        map.end()
    }
}

impl<'a> VesselFrame<'a> {
    /// Parses a frame from the vessel (the device side's parser), with the
    /// default limits. An invoke needs a non-empty string callId and
    /// capability and an object input; pairing a string code; paired a
    /// non-empty string deviceToken. A frame only a device sends is refused.
    pub fn parse(bytes: &'a [u8]) -> Result<VesselFrame<'a>, FrameError> {
        Self::parse_with(bytes, FrameLimits::default())
    }

    /// [`VesselFrame::parse`] with explicit limits.
    pub fn parse_with(bytes: &'a [u8], limits: FrameLimits) -> Result<VesselFrame<'a>, FrameError> {
        Self::parse_on(bytes, limits, Channel::V1)
    }

    /// [`VesselFrame::parse_with`] for a connection on `channel`. On dk/2
    /// `device:paired` carries no token ([`VesselFrame::KeyPaired`]; a
    /// token key is ignored), `device:pairing` does not exist, and the
    /// pairing exchange and `device:closing` are known.
    pub fn parse_on(
        bytes: &'a [u8],
        limits: FrameLimits,
        channel: Channel,
    ) -> Result<VesselFrame<'a>, FrameError> {
        match Self::parse_keeping_input(bytes, limits, channel)? {
            VesselRead::Frame(frame) => Ok(frame),
            VesselRead::Invoke(RawInvoke {
                call_id,
                capability,
                input,
            }) => match serde_json::from_str::<Value>(input.get()) {
                Ok(Value::Object(input)) => Ok(VesselFrame::Invoke {
                    call_id,
                    capability,
                    input: Cow::Owned(input),
                }),
                _ => Err(FrameError::WrongType {
                    frame: INVOKE,
                    field: "input",
                    expected: "an object",
                }),
            },
        }
    }

    /// [`VesselFrame::parse_on`], except that an invoke's input is left as
    /// the JSON text it came as (checked to be an object, as `parse_on`
    /// checks it), borrowed from `bytes`: a device that hands the input on
    /// as text builds nothing from it, and holds no copy of it.
    pub fn parse_keeping_input(
        bytes: &'a [u8],
        limits: FrameLimits,
        channel: Channel,
    ) -> Result<VesselRead<'a>, FrameError> {
        let mut raw = RawFrame::default();
        read_raw(bytes, limits, &mut raw)?;
        let frame = match frame_type(raw.kind, channel, Reader::Device)? {
            PAIRED if channel == Channel::Dk2 => Ok(VesselFrame::KeyPaired),
            PAIR_COMMIT => Ok(VesselFrame::PairCommit {
                commitment: required_hex(raw.commitment, PAIR_COMMIT, "commitment")?,
            }),
            PAIR_REVEAL => Ok(VesselFrame::PairReveal {
                nonce: required_hex(raw.nonce, PAIR_REVEAL, "nonce")?,
            }),
            CLOSING => {
                let code = match raw.code {
                    Some(Scalar::Uint(code)) => u16::try_from(code).ok(),
                    _ => None,
                }
                .ok_or(FrameError::WrongType {
                    frame: CLOSING,
                    field: "code",
                    expected: "a close code",
                })?;
                let reason = match raw.reason {
                    None => Cow::Borrowed(""),
                    Some(value) => value.into_str().ok_or(FrameError::WrongType {
                        frame: CLOSING,
                        field: "reason",
                        expected: "a string",
                    })?,
                };
                Ok(VesselFrame::Closing { code, reason })
            }
            ERROR => Ok(VesselFrame::Error {
                error: match raw.error {
                    None => Cow::Borrowed(""),
                    Some(value) => value.into_str().ok_or(FrameError::WrongType {
                        frame: ERROR,
                        field: "error",
                        expected: "a string",
                    })?,
                },
            }),
            INVOKE => {
                let call_id = required_str(raw.call_id, INVOKE, "callId")?;
                let capability = required_str(raw.capability, INVOKE, "capability")?;
                let input = raw.input.ok_or(FrameError::MissingField {
                    frame: INVOKE,
                    field: "input",
                })?;
                if !is_object(input) {
                    return Err(FrameError::WrongType {
                        frame: INVOKE,
                        field: "input",
                        expected: "an object",
                    });
                }
                return Ok(VesselRead::Invoke(RawInvoke {
                    call_id,
                    capability,
                    input,
                }));
            }
            PAIRING => Ok(VesselFrame::Pairing {
                code: required_str(raw.code, PAIRING, "code")?,
            }),
            PAIRED => Ok(VesselFrame::Paired {
                device_token: required_str(raw.device_token, PAIRED, "deviceToken")?,
            }),
            REVOKED => Ok(VesselFrame::Revoked {
                // A capability that is not a string must not read as "the
                // whole pairing ended": refuse the frame instead.
                capability: match raw.capability {
                    None => None,
                    Some(value) => Some(required_str(Some(value), REVOKED, "capability")?),
                },
            }),
            STREAMING_FRAME => Ok(VesselFrame::Streaming(StreamingFrame {
                kind: string(raw.device_kind, STREAMING_FRAME, "kind")?,
                max_chunk_bytes: match whole(raw.max_chunk_bytes, STREAMING_FRAME, "maxChunkBytes")?
                {
                    0 => {
                        return Err(FrameError::WrongType {
                            frame: STREAMING_FRAME,
                            field: "maxChunkBytes",
                            expected: "a positive whole number",
                        });
                    }
                    cap => cap,
                },
                max_concurrent_sessions: whole(
                    raw.max_concurrent_sessions,
                    STREAMING_FRAME,
                    "maxConcurrentSessions",
                )?,
            })),
            STREAM_DROPPED_FRAME => Ok(VesselFrame::StreamDropped(StreamDroppedFrame {
                stream: string(raw.stream, STREAM_DROPPED_FRAME, "stream")?,
                seq: whole(raw.seq, STREAM_DROPPED_FRAME, "seq")?,
                accepted: match raw.accepted {
                    Some(Scalar::Bool(accepted)) => accepted,
                    None => {
                        return Err(FrameError::MissingField {
                            frame: STREAM_DROPPED_FRAME,
                            field: "accepted",
                        });
                    }
                    Some(_) => {
                        return Err(FrameError::WrongType {
                            frame: STREAM_DROPPED_FRAME,
                            field: "accepted",
                            expected: "a boolean",
                        });
                    }
                },
                bytes: whole(raw.bytes, STREAM_DROPPED_FRAME, "bytes")?,
                marker: string(raw.marker, STREAM_DROPPED_FRAME, "marker")?,
            })),
            other => Err(FrameError::WrongSide(other)),
        };
        frame.map(VesselRead::Frame)
    }

    /// The pairing-exchange frame type a JSON text names in its `type`
    /// (`device:pair-commit`, `device:pair-reveal`, `device:pair-nonce`, or
    /// v1's `device:pairing`), whether or not the rest of the frame parses:
    /// a dk/2 device ends the pairing on such a frame that is malformed, or
    /// that comes once it is paired. `None` for any other text.
    pub fn pairing_type(text: &str) -> Option<&'static str> {
        #[derive(serde::Deserialize)]
        struct Typed<'a> {
            #[serde(rename = "type", borrow)]
            kind: Cow<'a, str>,
        }
        let typed = serde_json::from_str::<Typed<'_>>(text).ok()?;
        [PAIR_COMMIT, PAIR_REVEAL, PAIR_NONCE, PAIRING]
            .into_iter()
            .find(|kind| *kind == typed.kind)
    }

    /// The frame's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            VesselFrame::Pairing { .. } => PAIRING,
            VesselFrame::Paired { .. } => PAIRED,
            VesselFrame::Invoke { .. } => INVOKE,
            VesselFrame::Revoked { .. } => REVOKED,
            VesselFrame::PairCommit { .. } => PAIR_COMMIT,
            VesselFrame::PairReveal { .. } => PAIR_REVEAL,
            VesselFrame::KeyPaired => PAIRED,
            VesselFrame::Closing { .. } => CLOSING,
            VesselFrame::Error { .. } => ERROR,
            VesselFrame::Streaming(_) => STREAMING_FRAME,
            VesselFrame::StreamDropped(_) => STREAM_DROPPED_FRAME,
        }
    }

    /// The frame as compact JSON text, as 8DK writes it.
    pub fn to_json(&self) -> String {
        // Serialising strings and JSON values into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Serialize for VesselFrame<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // The streaming frames are written as the vessel always wrote
        // them: their keys in order, the type last.
        match self {
            VesselFrame::Streaming(frame) => return frame.serialize_with_type(serializer),
            VesselFrame::StreamDropped(frame) => return frame.serialize_with_type(serializer),
            _ => {}
        }
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.type_name())?;
        match self {
            VesselFrame::Pairing { code } => map.serialize_entry("code", code)?,
            VesselFrame::Paired { device_token } => {
                map.serialize_entry("deviceToken", device_token)?
            }
            VesselFrame::Invoke {
                call_id,
                capability,
                input,
            } => {
                map.serialize_entry("callId", call_id)?;
                map.serialize_entry("capability", capability)?;
                map.serialize_entry("input", input)?;
            }
            VesselFrame::Revoked { capability } => {
                if let Some(capability) = capability {
                    map.serialize_entry("capability", capability)?;
                }
            }
            VesselFrame::PairCommit { commitment } => {
                map.serialize_entry("commitment", commitment)?;
            }
            VesselFrame::PairReveal { nonce } => map.serialize_entry("nonce", nonce)?,
            VesselFrame::KeyPaired => {}
            VesselFrame::Closing { code, reason } => {
                map.serialize_entry("code", code)?;
                map.serialize_entry("reason", reason)?;
            }
            VesselFrame::Error { error } => map.serialize_entry("error", error)?,
            VesselFrame::Streaming(_) | VesselFrame::StreamDropped(_) => {}
        }
        map.end()
    }
}

#[cfg(test)]
mod tests;
