//! The record layer: after the handshake every WebSocket message is one
//! Noise transport message, a record. Its plaintext is one header byte and
//! a piece of a frame:
//!
//! | header | piece of            | more to follow |
//! |--------|---------------------|----------------|
//! | `0x00` | a text frame        | no             |
//! | `0x01` | a text frame        | yes            |
//! | `0x02` | a binary stream msg | no             |
//! | `0x03` | a binary stream msg | yes            |
//!
//! A frame is its pieces concatenated; they are consecutive records of one
//! kind, a piece with more to follow has at least one byte, and a record
//! carries at most [`MAX_PIECE`] frame bytes. Each direction numbers its
//! records from 0 (the Noise nonce), so a replayed, reordered, dropped or
//! altered record fails to decrypt.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use crate::error::{ChannelError, from_noise};
use crate::protocol::{MAX_MESSAGE, MAX_PIECE, TAG_LEN};

/// The kind of a frame: a v1 JSON text frame or a binary stream message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A JSON text frame, UTF-8.
    Text,
    /// A binary stream message.
    Binary,
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Text => "text",
            FrameKind::Binary => "binary",
        })
    }
}

impl FrameKind {
    /// The header byte of a piece of this kind.
    fn header(self, more: bool) -> u8 {
        match (self, more) {
            (FrameKind::Text, false) => 0x00,
            (FrameKind::Text, true) => 0x01,
            (FrameKind::Binary, false) => 0x02,
            (FrameKind::Binary, true) => 0x03,
        }
    }

    /// The kind and "more to follow" of a header byte.
    fn of_header(header: u8) -> Result<(FrameKind, bool), ChannelError> {
        match header {
            0x00 => Ok((FrameKind::Text, false)),
            0x01 => Ok((FrameKind::Text, true)),
            0x02 => Ok((FrameKind::Binary, false)),
            0x03 => Ok((FrameKind::Binary, true)),
            other => Err(ChannelError::UnknownHeader(other)),
        }
    }
}

/// What one side accepts while it reassembles a frame, in frame bytes.
/// Each limit is checked as every piece arrives, before more than it is
/// held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLimits {
    /// The largest text frame (v1's is 1 MiB, refused with close 1009).
    pub max_text: usize,
    /// The largest binary stream message (the stream rule's).
    pub max_binary: usize,
}

impl RecordLimits {
    /// The limit of a kind.
    fn of(self, kind: FrameKind) -> usize {
        match kind {
            FrameKind::Text => self.max_text,
            FrameKind::Binary => self.max_binary,
        }
    }
}

/// Encrypts this side's outgoing frames: one Noise transport message per
/// piece, numbered from 0.
pub struct Sealer {
    /// The channel's cipher states, shared with the [`Opener`], which uses
    /// only the other direction's.
    transport: Arc<snow::StatelessTransportState>,
    /// The nonce of the next record.
    nonce: u64,
    /// Whether sealing failed once; nothing is sealed after.
    failed: bool,
}

impl Sealer {
    /// A sealer whose first record has nonce 0.
    pub(crate) fn new(transport: Arc<snow::StatelessTransportState>) -> Sealer {
        Sealer {
            transport,
            nonce: 0,
            failed: false,
        }
    }

    /// The records of one frame, to send in order, one WebSocket binary
    /// message each: pieces of at most [`MAX_PIECE`] bytes, every one but
    /// the last marked "more to follow". An empty frame is one record with
    /// only its header. A text frame should be UTF-8: the peer decodes it
    /// whole and fails the channel if it is not.
    ///
    /// Memory is asked for without aborting when there is none
    /// ([`ChannelError::OutOfMemory`]): a record not sealed takes no
    /// nonce, but those sealed before it in the frame did.
    pub fn seal(&mut self, kind: FrameKind, frame: &[u8]) -> Result<Vec<Vec<u8>>, ChannelError> {
        let count = frame.len().div_ceil(MAX_PIECE).max(1);
        let mut records = Vec::new();
        records
            .try_reserve_exact(count)
            .map_err(|_| ChannelError::OutOfMemory)?;
        let mut pieces = frame.chunks(MAX_PIECE);
        for number in 1..=count {
            let piece = pieces.next().unwrap_or_default();
            let mut plaintext = buffer(1 + piece.len())?;
            plaintext.push(kind.header(number < count));
            plaintext.extend_from_slice(piece);
            records.push(self.seal_plaintext(&plaintext)?);
        }
        Ok(records)
    }

    /// One record of this plaintext (header included), with the next nonce.
    fn seal_plaintext(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, ChannelError> {
        if self.failed {
            return Err(ChannelError::Closed);
        }
        let mut record = buffer(plaintext.len() + TAG_LEN)?;
        record.resize(plaintext.len() + TAG_LEN, 0);
        let sealed = self
            .transport
            .write_message(self.nonce, plaintext, &mut record)
            .map_err(from_noise)
            .and_then(|written| {
                let next = self
                    .nonce
                    .checked_add(1)
                    .ok_or(ChannelError::NonceExhausted)?;
                Ok((written, next))
            });
        match sealed {
            Ok((written, next)) => {
                self.nonce = next;
                record.truncate(written);
                Ok(record)
            }
            Err(error) => {
                self.failed = true;
                Err(error)
            }
        }
    }

    /// One record of an arbitrary plaintext, header byte included, so that
    /// tests and fuzz targets can make records [`Sealer::seal`] never would
    /// (only with the `vectors` feature).
    #[cfg(feature = "vectors")]
    pub fn seal_plaintext_for_vectors(
        &mut self,
        plaintext: &[u8],
    ) -> Result<Vec<u8>, ChannelError> {
        self.seal_plaintext(plaintext)
    }
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("nonce", &self.nonce)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// A frame the [`Opener`] reassembled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenedFrame {
    /// A text frame, decoded as UTF-8 over the whole frame.
    Text(String),
    /// A binary stream message.
    Binary(Vec<u8>),
}

/// Why [`Opener::open`] refused a record. After either, the opener refuses
/// everything further.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The channel failed (the vessel closes 4012 `secure channel failed`,
    /// whatever the kind).
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The frame being assembled would exceed its kind's limit (the vessel
    /// closes 1009 for a text frame, as v1 does).
    #[error("a {kind} frame is over its limit of {max} bytes")]
    TooLarge {
        /// The frame's kind.
        kind: FrameKind,
        /// The limit it crossed.
        max: usize,
    },
}

/// A frame whose pieces are arriving.
struct Assembly {
    /// Its kind, which every piece must have.
    kind: FrameKind,
    /// The pieces so far, concatenated.
    bytes: Vec<u8>,
    /// How many records they came in.
    records: usize,
}

/// Decrypts this side's incoming records, in order, and reassembles their
/// frames.
pub struct Opener {
    /// The channel's cipher states, shared with the [`Sealer`], which uses
    /// only the other direction's.
    transport: Arc<snow::StatelessTransportState>,
    /// The nonce the next record must have.
    nonce: u64,
    /// The limits frames are held to.
    limits: RecordLimits,
    /// The frame being assembled, if one is.
    assembly: Option<Assembly>,
    /// Whether a record was refused once; everything after is.
    failed: bool,
}

impl Opener {
    /// An opener expecting nonce 0 first.
    pub(crate) fn new(
        transport: Arc<snow::StatelessTransportState>,
        limits: RecordLimits,
    ) -> Opener {
        Opener {
            transport,
            nonce: 0,
            limits,
            assembly: None,
            failed: false,
        }
    }

    /// Takes the next WebSocket message: `Some` frame when it was the last
    /// piece of one, `None` while a frame is incomplete. Any failure,
    /// [`OpenError::TooLarge`] included, ends the channel: this opener
    /// refuses every message after it with [`ChannelError::Closed`].
    ///
    /// A frame in one record is decrypted into the buffer it is then
    /// handed out in, with no other copy; the memory for it (and for a
    /// frame's pieces as they arrive) is asked for without aborting when
    /// there is none, [`ChannelError::OutOfMemory`].
    pub fn open(&mut self, message: &[u8]) -> Result<Option<OpenedFrame>, OpenError> {
        if self.failed {
            return Err(ChannelError::Closed.into());
        }
        let opened = self.open_record(message);
        if opened.is_err() {
            self.failed = true;
            self.assembly = None;
        }
        opened
    }

    /// Decrypts one record and adds its piece.
    fn open_record(&mut self, message: &[u8]) -> Result<Option<OpenedFrame>, OpenError> {
        if message.len() > MAX_MESSAGE {
            return Err(ChannelError::TooLong { len: message.len() }.into());
        }
        if message.len() < TAG_LEN {
            return Err(ChannelError::Decrypt.into());
        }
        let mut plaintext = buffer(message.len() - TAG_LEN)?;
        plaintext.resize(message.len() - TAG_LEN, 0);
        let read = self
            .transport
            .read_message(self.nonce, message, &mut plaintext)
            .map_err(from_noise)?;
        self.nonce = self
            .nonce
            .checked_add(1)
            .ok_or(ChannelError::NonceExhausted)?;
        plaintext.truncate(read);

        let (&header, piece) = plaintext.split_first().ok_or(ChannelError::MissingHeader)?;
        let (kind, more) = FrameKind::of_header(header)?;
        if more && piece.is_empty() {
            return Err(ChannelError::EmptyPiece.into());
        }
        let held = match &self.assembly {
            Some(assembly) if assembly.kind != kind => {
                return Err(ChannelError::KindSwitch.into());
            }
            Some(assembly) => assembly.bytes.len(),
            None => 0,
        };
        let max = self.limits.of(kind);
        if held.saturating_add(piece.len()) > max {
            return Err(OpenError::TooLarge { kind, max });
        }

        let bytes = match self.assembly.take() {
            // A frame in one record, the usual case: its plaintext becomes
            // the frame.
            None if !more => {
                plaintext.remove(0);
                plaintext
            }
            None => {
                let mut bytes = buffer(piece.len())?;
                bytes.extend_from_slice(piece);
                self.assembly = Some(Assembly {
                    kind,
                    bytes,
                    records: 1,
                });
                return Ok(None);
            }
            Some(mut assembly) => {
                assembly
                    .bytes
                    .try_reserve(piece.len())
                    .map_err(|_| ChannelError::OutOfMemory)?;
                assembly.bytes.extend_from_slice(piece);
                assembly.records += 1;
                if more {
                    self.assembly = Some(assembly);
                    return Ok(None);
                }
                assembly.bytes
            }
        };
        match kind {
            FrameKind::Text => match String::from_utf8(bytes) {
                Ok(text) => Ok(Some(OpenedFrame::Text(text))),
                Err(_) => Err(ChannelError::InvalidUtf8.into()),
            },
            FrameKind::Binary => Ok(Some(OpenedFrame::Binary(bytes))),
        }
    }

    /// Changes the limits for the pieces still to come (a vessel raises
    /// `max_binary` once a streaming device is admitted).
    pub fn set_limits(&mut self, limits: RecordLimits) {
        self.limits = limits;
    }

    /// The records of the frame being assembled so far; 0 between frames.
    /// A vessel counts them towards its flood limit.
    pub fn records_in_frame(&self) -> usize {
        self.assembly
            .as_ref()
            .map_or(0, |assembly| assembly.records)
    }
}

/// An empty buffer with room for `capacity` bytes, or
/// [`ChannelError::OutOfMemory`] when the allocator has none (a device's
/// small heap), instead of aborting.
fn buffer(capacity: usize) -> Result<Vec<u8>, ChannelError> {
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(capacity)
        .map_err(|_| ChannelError::OutOfMemory)?;
    Ok(bytes)
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("nonce", &self.nonce)
            .field("limits", &self.limits)
            .field("records_in_frame", &self.records_in_frame())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}
