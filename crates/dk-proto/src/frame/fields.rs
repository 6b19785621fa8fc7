//! The checks on a frame's fields once read: its type against the
//! channel and the side reading it, and each field's presence and kind.

use alloc::borrow::Cow;
use alloc::borrow::ToOwned;
use alloc::string::String;

use serde_json::value::RawValue;

use super::raw::Scalar;
use super::stream::{STREAM_DROPPED_FRAME, STREAMING_FRAME};
use super::{
    AUTH, CLOSING, Channel, ERROR, EVENT, FrameError, HELLO, INVOKE, PAIR_COMMIT, PAIR_NONCE,
    PAIR_REVEAL, PAIRED, PAIRING, RESULT, REVOKED, is_hex32,
};

/// How much of an unknown frame type an error quotes, in bytes.
const TYPE_QUOTE: usize = 64;

/// A required non-empty string field.
pub(super) fn required_str<'a>(
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
pub(super) fn string(
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
pub(super) fn whole(
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
pub(super) fn required_hex<'a>(
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

pub(super) fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

/// Which side parses a frame: the one it is sent to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    Vessel,
    Device,
}

/// The frame type, checked against those of the channel: v1 knows 8DK's
/// eight; dk/2 adds the pairing exchange and `device:closing`, and has no
/// `device:pairing` (its code is never sent). A device also knows dk's
/// `device:error`, `device:streaming` and `device:stream-dropped` on both (a
/// vessel reading one sent to it finds an unknown type, as 8DK's does).
pub(super) fn frame_type(
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
