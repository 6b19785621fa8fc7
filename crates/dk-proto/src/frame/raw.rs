//! The first reading of an untrusted frame: its size, its nesting depth
//! in one pass over the bytes, then its known keys read into a
//! [`RawFrame`], scalars directly and payloads kept as raw JSON, by a fast
//! path for the plainest frames and serde_json for the rest.

use alloc::borrow::Cow;
use alloc::borrow::ToOwned;
use alloc::string::{String, ToString};
use core::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::depth::nests_deeper_than;
use super::{FrameError, FrameLimits};

/// serde_json's own recursion limit.
const PARSER_DEPTH_LIMIT: usize = 127;

/// The known keys of any frame, each as raw JSON; unknown keys are skipped.
/// A repeated key keeps its last value, as `JSON.parse` does.
#[derive(Default)]
pub(super) struct RawFrame<'a> {
    pub(super) kind: Option<Scalar<'a>>,
    pub(super) manifest: Option<&'a RawValue>,
    pub(super) device_id: Option<Scalar<'a>>,
    pub(super) token: Option<Scalar<'a>>,
    pub(super) call_id: Option<Scalar<'a>>,
    pub(super) ok: Option<Scalar<'a>>,
    pub(super) result: Option<&'a RawValue>,
    pub(super) error: Option<Scalar<'a>>,
    pub(super) capability: Option<Scalar<'a>>,
    pub(super) data: Option<&'a RawValue>,
    pub(super) code: Option<Scalar<'a>>,
    pub(super) device_token: Option<Scalar<'a>>,
    pub(super) input: Option<&'a RawValue>,
    pub(super) commitment: Option<Scalar<'a>>,
    pub(super) nonce: Option<Scalar<'a>>,
    pub(super) reason: Option<Scalar<'a>>,
    /// `device:streaming`'s fields (`kind` is the device's kind).
    pub(super) device_kind: Option<Scalar<'a>>,
    pub(super) max_chunk_bytes: Option<Scalar<'a>>,
    pub(super) max_concurrent_sessions: Option<Scalar<'a>>,
    /// `device:stream-dropped`'s fields.
    pub(super) stream: Option<Scalar<'a>>,
    pub(super) seq: Option<Scalar<'a>>,
    pub(super) accepted: Option<Scalar<'a>>,
    pub(super) bytes: Option<Scalar<'a>>,
    pub(super) marker: Option<Scalar<'a>>,
}

/// A field that must be a string or a boolean: read directly, without
/// keeping its raw text. Anything else is `Other`, a wrong type.
#[derive(Debug, Clone)]
pub(super) enum Scalar<'a> {
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
    pub(super) fn into_str(self) -> Option<Cow<'a, str>> {
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
pub(super) struct FrameSeed<'f, 'a>(pub(super) &'f mut RawFrame<'a>);

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
pub(super) fn read_plain<'a>(text: &'a str, frame: &mut RawFrame<'a>) -> Option<()> {
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
pub(super) fn string_stop(bytes: &[u8]) -> Option<usize> {
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
pub(super) fn read_raw<'a>(
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
