//! Reading and writing the frames a vessel sends ([`VesselFrame`]), and
//! [`VesselFrame::parse_keeping_input`], which leaves an invoke's input as
//! its text.

use alloc::borrow::Cow;
use alloc::string::String;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::fields::{Reader, frame_type, is_object, required_hex, required_str, string, whole};
use super::raw::{RawFrame, Scalar, read_raw};
use super::stream::{STREAM_DROPPED_FRAME, STREAMING_FRAME, StreamDroppedFrame, StreamingFrame};
use super::{
    CLOSING, Channel, ERROR, FrameError, FrameLimits, INVOKE, PAIR_COMMIT, PAIR_NONCE, PAIR_REVEAL,
    PAIRED, PAIRING, REVOKED, RawInvoke, VesselFrame, VesselRead,
};

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
        let frame = match frame_type(raw.kind.take(), channel, Reader::Device)? {
            PAIRED if channel == Channel::Dk2 => VesselFrame::KeyPaired,
            PAIR_COMMIT => VesselFrame::PairCommit {
                commitment: required_hex(raw.commitment, PAIR_COMMIT, "commitment")?,
            },
            PAIR_REVEAL => VesselFrame::PairReveal {
                nonce: required_hex(raw.nonce, PAIR_REVEAL, "nonce")?,
            },
            CLOSING => closing(raw)?,
            ERROR => VesselFrame::Error {
                error: optional_text(raw.error, ERROR, "error")?,
            },
            INVOKE => return invoke(raw).map(VesselRead::Invoke),
            PAIRING => VesselFrame::Pairing {
                code: required_str(raw.code, PAIRING, "code")?,
            },
            PAIRED => VesselFrame::Paired {
                device_token: required_str(raw.device_token, PAIRED, "deviceToken")?,
            },
            REVOKED => revoked(raw)?,
            STREAMING_FRAME => VesselFrame::Streaming(streaming(raw)?),
            STREAM_DROPPED_FRAME => VesselFrame::StreamDropped(stream_dropped(raw)?),
            other => return Err(FrameError::WrongSide(other)),
        };
        Ok(VesselRead::Frame(frame))
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

/// `device:closing {code, reason}`: a close code that fits in 16 bits, and
/// a reason that reads as empty when absent.
fn closing(raw: RawFrame<'_>) -> Result<VesselFrame<'_>, FrameError> {
    let code = match raw.code {
        Some(Scalar::Uint(code)) => u16::try_from(code).ok(),
        _ => None,
    }
    .ok_or(FrameError::WrongType {
        frame: CLOSING,
        field: "code",
        expected: "a close code",
    })?;
    let reason = optional_text(raw.reason, CLOSING, "reason")?;
    Ok(VesselFrame::Closing { code, reason })
}

/// A string field that reads as empty when absent, and refuses the frame
/// when it is there but not a string.
fn optional_text<'a>(
    field_value: Option<Scalar<'a>>,
    frame: &'static str,
    field: &'static str,
) -> Result<Cow<'a, str>, FrameError> {
    match field_value {
        None => Ok(Cow::Borrowed("")),
        Some(value) => value.into_str().ok_or(FrameError::WrongType {
            frame,
            field,
            expected: "a string",
        }),
    }
}

/// `device:invoke {callId, capability, input}`, its input checked to be
/// an object and left as its text.
fn invoke(raw: RawFrame<'_>) -> Result<RawInvoke<'_>, FrameError> {
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
    Ok(RawInvoke {
        call_id,
        capability,
        input,
    })
}

/// `device:revoked {capability?}`.
fn revoked(raw: RawFrame<'_>) -> Result<VesselFrame<'_>, FrameError> {
    Ok(VesselFrame::Revoked {
        // A capability that is not a string must not read as "the
        // whole pairing ended": refuse the frame instead.
        capability: match raw.capability {
            None => None,
            Some(value) => Some(required_str(Some(value), REVOKED, "capability")?),
        },
    })
}

/// `device:streaming {kind, maxChunkBytes, maxConcurrentSessions}`, a
/// `maxChunkBytes` of 0 refused.
fn streaming(raw: RawFrame<'_>) -> Result<StreamingFrame, FrameError> {
    let kind = string(raw.device_kind, STREAMING_FRAME, "kind")?;
    let max_chunk_bytes = match whole(raw.max_chunk_bytes, STREAMING_FRAME, "maxChunkBytes")? {
        0 => {
            return Err(FrameError::WrongType {
                frame: STREAMING_FRAME,
                field: "maxChunkBytes",
                expected: "a positive whole number",
            });
        }
        cap => cap,
    };
    Ok(StreamingFrame {
        kind,
        max_chunk_bytes,
        max_concurrent_sessions: whole(
            raw.max_concurrent_sessions,
            STREAMING_FRAME,
            "maxConcurrentSessions",
        )?,
    })
}

/// `device:stream-dropped {stream, seq, accepted, bytes, marker}`.
fn stream_dropped(raw: RawFrame<'_>) -> Result<StreamDroppedFrame, FrameError> {
    Ok(StreamDroppedFrame {
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
    })
}
