//! What goes between the core and its driver: the WebSocket messages in
//! and out, what the core asks the driver to do, and what it tells it to
//! log.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use dk_channel::PublicKey;
use dk_proto::CloseFrame;

use super::End;
use crate::calls::{Invocation, SetAside};
use crate::credentials::Credentials;

/// A WebSocket message for the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message (v1's frames).
    Text(String),
    /// A binary message (dk/2's handshake messages and records, stream
    /// chunks).
    Binary(Vec<u8>),
    /// A close, with its code and reason or none. Nothing is sent after it.
    Close(Option<CloseFrame>),
}

/// A WebSocket message (or the lack of one) the driver received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received<'a> {
    /// A text message.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
    /// The vessel's close, with its code and reason when it gave them. The
    /// WebSocket library answers it; the core only reads it.
    Close(Option<(u16, &'a str)>),
    /// The connection dropped (or could not be written to) without a close.
    Lost,
}

/// What the core asks of the driver, in the order it must happen.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send this message.
    Send(Message),
    /// The connection is open: on dk/2 the handshake is done and the
    /// vessel's key checked; on v1 at once.
    Connected,
    /// Show the person this 6-digit pairing code, to compare with the
    /// vessel's prompt.
    ShowCode(String),
    /// dk/2: keep these credentials (a new key, a new pin, paired or not
    /// any more), replacing what was kept. Until kept, the device cannot
    /// reconnect by key.
    Store(Credentials),
    /// dk/2: the vessel's key was pinned (the person said yes).
    Pinned(PublicKey),
    /// v1: keep this device token for reconnecting (a secret).
    StoreToken(String),
    /// v1: forget this token (the vessel refused it or unpaired the
    /// device), unless what is kept is another one.
    ForgetToken(String),
    /// Run this call's handler and give the outcome to
    /// [`DeviceCore::answer`](crate::DeviceCore::answer).
    Invoke(Invocation),
    /// Something to log; nothing to do.
    Notice(Notice),
    /// The connection ended; see [`End`]. The driver drops the socket, and
    /// [`DeviceCore::connect`](crate::DeviceCore::connect) starts another when `End` says so.
    Ended(End),
}

/// Something that happened and needs no answer: for the device's log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// A frame the calls' rules set aside.
    SetAside(SetAside),
    /// A frame that came before the pairing ended and was ignored.
    Ignored(&'static str),
    /// A pairing code that is not 6 digits, not shown (printable).
    InvalidCode(String),
    /// The vessel admitted this session as a streaming one.
    StreamingAdmitted {
        /// The device kind.
        kind: String,
        /// The largest chunk payload the vessel takes.
        max_chunk_bytes: u64,
    },
    /// The vessel dropped a stream chunk.
    StreamChunkDropped {
        /// The stream.
        stream: String,
        /// The chunk's sequence number.
        seq: u64,
        /// Its size.
        bytes: u64,
        /// The vessel's marker.
        marker: String,
    },
    /// A stream chunk over the vessel's cap, dropped before sending.
    ChunkOverCap {
        /// The chunk's sequence number.
        seq: u64,
    },
    /// dk/2: a close the vessel did not announce inside the channel, which
    /// anyone on the path can forge: the device connects again.
    UnannouncedClose(u16),
    /// A binary message the device has no use for.
    IgnoredBinary,
}

/// Why a stream chunk was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkRefusal {
    /// No connection is serving.
    NotConnected,
    /// The vessel has not admitted a streaming session (yet): keep it.
    NotAdmitted,
    /// Over the vessel's cap: dropped.
    OverCap,
    /// The chunk cannot be encoded (a stream name too long): dropped.
    Malformed,
}

impl fmt::Display for ChunkRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkRefusal::NotConnected => "no connection to the vessel",
            ChunkRefusal::NotAdmitted => "the vessel has not admitted a streaming session",
            ChunkRefusal::OverCap => "the chunk is over the vessel's cap",
            ChunkRefusal::Malformed => "the chunk cannot be encoded",
        })
    }
}
