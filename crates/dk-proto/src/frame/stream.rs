//! Stream frames: chunks of audio, screenshots and the like that a streaming
//! device (kind `voice` or `desktop-control`) sends once the vessel admitted
//! it, and the two JSON frames around them.
//!
//! A chunk travels as one binary WebSocket message: a fixed 16-byte header,
//! the stream's name, then the payload, all lengths declared up front so a
//! chunk is checked before anything is copied:
//!
//! ```text
//! offset size field
//! 0      1    magic 0xDC
//! 1      1    frame kind 0x01 (stream chunk); other values are refused
//! 2      1    flags, must be 0 (reserved)
//! 3      1    N: length of the stream name, 1..=30
//! 4      8    seq: the device's chunk counter, u64 big-endian
//! 12     4    L: payload length, u32 big-endian
//! 16     N    stream name: a capability name of the device (lower snake case)
//! 16+N   L    payload
//! ```
//!
//! The message must be exactly `16 + N + L` bytes: a header claiming more
//! than the message holds is [`StreamFrameError::Truncated`], one claiming
//! less is [`StreamFrameError::TrailingBytes`].
//!
//! A v1 peer never sees any of this: the vessel announces streaming with
//! `device:streaming` only to a device it admitted as a streaming kind (a v1
//! device ignores the unknown type), and dk's device client sends chunks only
//! after that announcement, so a vessel that never sent it never receives one.

use alloc::string::String;
use alloc::vec::Vec;

use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};

/// First byte of every stream message.
pub const STREAM_MAGIC: u8 = 0xDC;
/// Frame kind of a stream chunk (second byte).
pub const STREAM_CHUNK_KIND: u8 = 0x01;
/// Bytes of the fixed header, before the stream name.
pub const STREAM_HEADER_BYTES: usize = 16;
/// Longest stream name, in bytes (the longest capability name).
pub const MAX_STREAM_NAME_BYTES: usize = 30;
/// Largest header with its name: what a chunk costs on top of its payload.
pub const MAX_STREAM_OVERHEAD: usize = STREAM_HEADER_BYTES + MAX_STREAM_NAME_BYTES;

/// The `type` of the vessel's announcement that it admitted a streaming device.
pub const STREAMING_FRAME: &str = "device:streaming";
/// The `type` of the vessel's report of a chunk it dropped.
pub const STREAM_DROPPED_FRAME: &str = "device:stream-dropped";

/// One stream chunk, borrowed from the message it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamChunk<'a> {
    /// The stream's name: a capability name of the device.
    pub stream: &'a str,
    /// The device's chunk counter.
    pub seq: u64,
    /// The chunk's bytes.
    pub payload: &'a [u8],
}

/// Why a binary message is not a stream chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamFrameError {
    /// Shorter than the fixed header.
    #[error("stream message of {len} bytes is shorter than its 16-byte header")]
    TooShort {
        /// The message's size.
        len: usize,
    },
    /// The first byte is not [`STREAM_MAGIC`].
    #[error("stream message does not start with 0xDC")]
    BadMagic,
    /// A frame kind other than [`STREAM_CHUNK_KIND`].
    #[error("unknown stream frame kind {0:#04x}")]
    UnknownKind(u8),
    /// Reserved flag bits set.
    #[error("stream frame flags {0:#04x} are reserved")]
    ReservedFlags(u8),
    /// A name that is empty, longer than 30 bytes, or not lower snake case.
    #[error("stream name must be 1 to 30 bytes of lower snake case")]
    BadName,
    /// The header declares more bytes than the message holds.
    #[error("stream header declares {declared} bytes but the message holds {actual}")]
    Truncated {
        /// Bytes the header declares (header, name and payload).
        declared: u64,
        /// Bytes the message holds.
        actual: usize,
    },
    /// The message holds more bytes than the header declares.
    #[error("stream header declares {declared} bytes but the message holds {actual}")]
    TrailingBytes {
        /// Bytes the header declares (header, name and payload).
        declared: u64,
        /// Bytes the message holds.
        actual: usize,
    },
}

/// Whether `name` is a capability-style name: `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`.
fn is_stream_name(name: &[u8]) -> bool {
    let Some((&first, rest)) = name.split_first() else {
        return false;
    };
    if name.len() > MAX_STREAM_NAME_BYTES || !first.is_ascii_lowercase() {
        return false;
    }
    let mut after_underscore = false;
    for &b in rest {
        match b {
            b'_' if after_underscore => return false,
            b'_' => after_underscore = true,
            b'a'..=b'z' | b'0'..=b'9' => after_underscore = false,
            _ => return false,
        }
    }
    !after_underscore
}

impl<'a> StreamChunk<'a> {
    /// Reads a stream chunk from an untrusted binary message. Every length
    /// is checked against the message before anything is read; no input
    /// makes it panic.
    pub fn parse(message: &'a [u8]) -> Result<StreamChunk<'a>, StreamFrameError> {
        let Some((header, rest)) = message.split_first_chunk::<STREAM_HEADER_BYTES>() else {
            return Err(StreamFrameError::TooShort { len: message.len() });
        };
        let [
            magic,
            kind,
            flags,
            name_len,
            s0,
            s1,
            s2,
            s3,
            s4,
            s5,
            s6,
            s7,
            l0,
            l1,
            l2,
            l3,
        ] = *header;
        if magic != STREAM_MAGIC {
            return Err(StreamFrameError::BadMagic);
        }
        if kind != STREAM_CHUNK_KIND {
            return Err(StreamFrameError::UnknownKind(kind));
        }
        if flags != 0 {
            return Err(StreamFrameError::ReservedFlags(flags));
        }
        let name_len = usize::from(name_len);
        if name_len == 0 || name_len > MAX_STREAM_NAME_BYTES {
            return Err(StreamFrameError::BadName);
        }
        let seq = u64::from_be_bytes([s0, s1, s2, s3, s4, s5, s6, s7]);
        let payload_len = u32::from_be_bytes([l0, l1, l2, l3]);
        let declared = (STREAM_HEADER_BYTES as u64)
            .saturating_add(name_len as u64)
            .saturating_add(u64::from(payload_len));
        let actual = message.len();
        if declared > actual as u64 {
            return Err(StreamFrameError::Truncated { declared, actual });
        }
        if declared < actual as u64 {
            return Err(StreamFrameError::TrailingBytes { declared, actual });
        }
        let (name, payload) = rest
            .split_at_checked(name_len)
            .ok_or(StreamFrameError::Truncated { declared, actual })?;
        if !is_stream_name(name) {
            return Err(StreamFrameError::BadName);
        }
        // Checked above to be ASCII.
        let stream = core::str::from_utf8(name).map_err(|_| StreamFrameError::BadName)?;
        Ok(StreamChunk {
            stream,
            seq,
            payload,
        })
    }

    /// The chunk as one binary message. `None` when the stream name is not
    /// lower snake case of 1 to 30 bytes or the payload is longer than
    /// `u32::MAX` bytes.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut message =
            Vec::with_capacity(STREAM_HEADER_BYTES + self.stream.len() + self.payload.len());
        self.encode_header_into(&mut message)?;
        message.extend_from_slice(self.payload);
        Some(message)
    }

    /// Writes the header and the name (not the payload) to `out`, so a
    /// sender can append the payload without another copy. `None` (and
    /// nothing written) for a name or payload [`StreamChunk::encode`] refuses.
    pub fn encode_header_into(&self, out: &mut Vec<u8>) -> Option<()> {
        if !is_stream_name(self.stream.as_bytes()) {
            return None;
        }
        let payload_len = u32::try_from(self.payload.len()).ok()?;
        let name_len = u8::try_from(self.stream.len()).ok()?;
        out.extend_from_slice(&[STREAM_MAGIC, STREAM_CHUNK_KIND, 0, name_len]);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&payload_len.to_be_bytes());
        out.extend_from_slice(self.stream.as_bytes());
        Some(())
    }
}

/// `device:streaming {kind, maxChunkBytes, maxConcurrentSessions}`: the
/// vessel admitted this connection as a streaming session, and chunks of at
/// most `maxChunkBytes` will be forwarded. Sent once, right after
/// `device:paired` or a successful `device:auth`, only to a device whose
/// manifest kind is a streaming class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamingFrame {
    /// `voice` or `desktop-control`.
    pub kind: String,
    /// The chunk cap: larger chunks are dropped.
    pub max_chunk_bytes: u64,
    /// Sessions this device may hold at once.
    pub max_concurrent_sessions: u64,
}

impl StreamingFrame {
    /// The frame as JSON text, with its `type` (last, as the vessel has
    /// always written it).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&WithType(self)).unwrap_or_default()
    }

    /// Writes the frame's keys in order, then its `type`.
    pub(super) fn serialize_with_type<S: Serializer>(
        &self,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("kind", &self.kind)?;
        map.serialize_entry("maxChunkBytes", &self.max_chunk_bytes)?;
        map.serialize_entry("maxConcurrentSessions", &self.max_concurrent_sessions)?;
        map.serialize_entry("type", STREAMING_FRAME)?;
        map.end()
    }
}

/// `device:stream-dropped {stream, seq, accepted:false, bytes, marker}`: a
/// chunk over the cap was dropped, never forwarded. `marker` is always
/// `dropped_oversize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StreamDroppedFrame {
    /// The chunk's stream.
    pub stream: String,
    /// The chunk's counter.
    pub seq: u64,
    /// Always `false`.
    pub accepted: bool,
    /// The payload's size.
    pub bytes: u64,
    /// `dropped_oversize`.
    pub marker: String,
}

impl StreamDroppedFrame {
    /// The frame as JSON text, with its `type` (last, as the vessel has
    /// always written it).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&WithType(self)).unwrap_or_default()
    }

    /// Writes the frame's keys in order, then its `type`.
    pub(super) fn serialize_with_type<S: Serializer>(
        &self,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(6))?;
        map.serialize_entry("stream", &self.stream)?;
        map.serialize_entry("seq", &self.seq)?;
        map.serialize_entry("accepted", &self.accepted)?;
        map.serialize_entry("bytes", &self.bytes)?;
        map.serialize_entry("marker", &self.marker)?;
        map.serialize_entry("type", STREAM_DROPPED_FRAME)?;
        map.end()
    }
}

/// A streaming frame written with its `type`.
struct WithType<'f, F>(&'f F);

impl Serialize for WithType<'_, StreamingFrame> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_with_type(serializer)
    }
}

impl Serialize for WithType<'_, StreamDroppedFrame> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_with_type(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Channel, DeviceFrame, FrameError, FrameLimits, VesselFrame};
    use alloc::borrow::ToOwned as _;

    fn chunk(stream: &str, seq: u64, payload: &[u8]) -> Vec<u8> {
        StreamChunk {
            stream,
            seq,
            payload,
        }
        .encode()
        .unwrap()
    }

    #[test]
    fn round_trips_at_every_small_size() {
        for len in [0usize, 1, 2, 15, 16, 17, 640, 65_536] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let message = chunk("audio", 7, &payload);
            assert_eq!(message.len(), STREAM_HEADER_BYTES + 5 + len);
            let parsed = StreamChunk::parse(&message).unwrap();
            assert_eq!(parsed.stream, "audio");
            assert_eq!(parsed.seq, 7);
            assert_eq!(parsed.payload, payload.as_slice());
        }
    }

    #[test]
    fn layout_is_the_documented_one() {
        let message = chunk("a_1", 0x0102_0304_0506_0708, b"xy");
        assert_eq!(
            message,
            [
                0xDC, 0x01, 0x00, 3, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 2, b'a', b'_', b'1', b'x',
                b'y'
            ]
        );
    }

    #[track_caller]
    fn refused(message: &[u8], expected: StreamFrameError) {
        assert_eq!(StreamChunk::parse(message), Err(expected));
    }

    #[test]
    fn hostile_messages_are_refused() {
        let good = chunk("audio", 1, b"hello");
        refused(&[], StreamFrameError::TooShort { len: 0 });
        refused(
            good.get(..15).unwrap(),
            StreamFrameError::TooShort { len: 15 },
        );
        let mut bad = good.clone();
        bad[0] = b'{';
        refused(&bad, StreamFrameError::BadMagic);
        let mut bad = good.clone();
        bad[1] = 2;
        refused(&bad, StreamFrameError::UnknownKind(2));
        let mut bad = good.clone();
        bad[2] = 0x80;
        refused(&bad, StreamFrameError::ReservedFlags(0x80));
        let mut bad = good.clone();
        bad[3] = 0;
        refused(&bad, StreamFrameError::BadName);
        bad[3] = 31;
        refused(&bad, StreamFrameError::BadName);
        // The header claims more than the message holds.
        let actual = good.len() - 1;
        refused(
            good.get(..actual).unwrap(),
            StreamFrameError::Truncated {
                declared: good.len() as u64,
                actual,
            },
        );
        let mut huge = good.clone();
        huge[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        refused(
            &huge,
            StreamFrameError::Truncated {
                declared: 16 + 5 + u64::from(u32::MAX),
                actual: good.len(),
            },
        );
        // A name length past the end of a message whose payload is empty.
        let mut bad = chunk("a", 0, b"");
        bad[3] = 30;
        refused(
            &bad,
            StreamFrameError::Truncated {
                declared: 46,
                actual: 17,
            },
        );
        let mut trailing = good.clone();
        trailing.push(0);
        refused(
            &trailing,
            StreamFrameError::TrailingBytes {
                declared: good.len() as u64,
                actual: good.len() + 1,
            },
        );
        for name in ["Audio", "a__b", "_a", "a_", "1a", "a-b", "é"] {
            let mut bad = chunk("abcde", 0, b"");
            let bytes = name.as_bytes();
            bad.truncate(STREAM_HEADER_BYTES);
            bad[3] = bytes.len() as u8;
            bad.extend_from_slice(bytes);
            refused(&bad, StreamFrameError::BadName);
        }
    }

    #[test]
    fn encode_refuses_what_parse_would() {
        for name in ["", "Audio", "a__b", &"a".repeat(31)] {
            let chunk = StreamChunk {
                stream: name,
                seq: 0,
                payload: b"",
            };
            assert_eq!(chunk.encode(), None, "{name:?}");
        }
    }

    #[test]
    fn json_frames_round_trip() {
        let frame = StreamingFrame {
            kind: "voice".to_owned(),
            max_chunk_bytes: 65_536,
            max_concurrent_sessions: 1,
        };
        // The bytes the vessel has always sent.
        let text = frame.to_json();
        assert_eq!(
            text,
            r#"{"kind":"voice","maxChunkBytes":65536,"maxConcurrentSessions":1,"type":"device:streaming"}"#
        );
        let read = VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2);
        assert_eq!(read, Ok(VesselFrame::Streaming(frame.clone())));
        assert_eq!(VesselFrame::Streaming(frame.clone()).to_json(), text);
        let v1 = VesselFrame::parse(text.as_bytes());
        assert_eq!(v1, Ok(VesselFrame::Streaming(frame)));
        let dropped = StreamDroppedFrame {
            stream: "audio".to_owned(),
            seq: 3,
            accepted: false,
            bytes: 9,
            marker: "dropped_oversize".to_owned(),
        };
        let text = dropped.to_json();
        assert_eq!(
            text,
            r#"{"stream":"audio","seq":3,"accepted":false,"bytes":9,"marker":"dropped_oversize","type":"device:stream-dropped"}"#
        );
        let read = VesselFrame::parse(text.as_bytes());
        assert_eq!(read, Ok(VesselFrame::StreamDropped(dropped.clone())));
        assert_eq!(VesselFrame::StreamDropped(dropped).to_json(), text);
    }

    #[test]
    fn streaming_frames_that_do_not_hold_are_refused_by_field() {
        let refused = |text: &str| VesselFrame::parse(text.as_bytes()).err();
        assert_eq!(
            refused(
                r#"{"type":"device:streaming","kind":"voice","maxChunkBytes":0,"maxConcurrentSessions":1}"#
            ),
            Some(FrameError::WrongType {
                frame: STREAMING_FRAME,
                field: "maxChunkBytes",
                expected: "a positive whole number",
            })
        );
        assert_eq!(
            refused(
                r#"{"type":"device:streaming","kind":"voice","maxChunkBytes":-1,"maxConcurrentSessions":1}"#
            ),
            Some(FrameError::WrongType {
                frame: STREAMING_FRAME,
                field: "maxChunkBytes",
                expected: "a whole number",
            })
        );
        assert_eq!(
            refused(r#"{"type":"device:streaming","maxChunkBytes":5,"maxConcurrentSessions":1}"#),
            Some(FrameError::MissingField {
                frame: STREAMING_FRAME,
                field: "kind",
            })
        );
        assert_eq!(
            refused(
                r#"{"type":"device:stream-dropped","stream":"a","seq":1,"accepted":"no","bytes":2,"marker":"m"}"#
            ),
            Some(FrameError::WrongType {
                frame: STREAM_DROPPED_FRAME,
                field: "accepted",
                expected: "a boolean",
            })
        );
        // A vessel never takes them from a device.
        assert_eq!(
            DeviceFrame::parse(br#"{"type":"device:streaming"}"#).err(),
            Some(FrameError::UnknownType(STREAMING_FRAME.to_owned()))
        );
    }

    proptest::proptest! {
        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = StreamChunk::parse(&bytes);
        }
    }
}
