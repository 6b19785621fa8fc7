//! A vessel's side of dk/2 that a test scripts by hand (features `vectors`
//! and `ring`): the responder's handshake, then text frames sealed and the
//! device's records opened, with no socket and no vessel behind it. The
//! device core's tests, the C library's and the workspace's socket tests
//! drive a device with it.

use alloc::string::String;
use alloc::vec::Vec;

use crate::{
    ChannelError, FrameKind, OpenError, OpenedFrame, Opener, RecordLimits, Responder, Sealer,
    StaticKey,
};

/// One connection's vessel side: a responder until the handshake's third
/// message, then the channel's two halves.
pub struct ScriptedVessel {
    key: StaticKey,
    responder: Option<Responder>,
    channel: Option<(Sealer, Opener)>,
    handshake_hash: [u8; 32],
    limits: RecordLimits,
}

impl ScriptedVessel {
    /// A vessel with (a copy of) `key`, ready for a device's first
    /// handshake message; frames it opens may be as large as `limits` says.
    pub fn new(key: &StaticKey, limits: RecordLimits) -> Result<ScriptedVessel, ChannelError> {
        let key = StaticKey::from_secret(*key.secret())?;
        Ok(ScriptedVessel {
            responder: Some(Responder::new(&key)?),
            key,
            channel: None,
            handshake_hash: [0; 32],
            limits,
        })
    }

    /// The vessel's static key.
    pub fn key(&self) -> &StaticKey {
        &self.key
    }

    /// Forgets the connection: ready for a new handshake with the same key
    /// (a vessel restarted, or the device connecting again).
    pub fn restart(&mut self) -> Result<(), ChannelError> {
        self.responder = Some(Responder::new(&self.key)?);
        self.channel = None;
        Ok(())
    }

    /// Reads the device's message 1 and answers with message 2.
    pub fn second(&mut self, first: &[u8]) -> Result<Vec<u8>, ChannelError> {
        let responder = self
            .responder
            .as_mut()
            .ok_or(ChannelError::HandshakeOrder)?;
        responder.read_first(first)?;
        responder.second_message()
    }

    /// Reads the device's message 3: the channel is open.
    pub fn third(&mut self, third: &[u8]) -> Result<(), ChannelError> {
        let responder = self.responder.take().ok_or(ChannelError::HandshakeOrder)?;
        let established = responder.read_third(third)?;
        self.handshake_hash = established.handshake_hash;
        self.channel = Some(established.split(self.limits));
        Ok(())
    }

    /// The handshake's hash, which the pairing's commitment binds (zeros
    /// before the handshake ends).
    pub fn handshake_hash(&self) -> [u8; 32] {
        self.handshake_hash
    }

    /// The records of a text frame to the device.
    pub fn seal(&mut self, frame: &str) -> Result<Vec<Vec<u8>>, ChannelError> {
        let (sealer, _) = self.channel.as_mut().ok_or(ChannelError::HandshakeOrder)?;
        sealer.seal(FrameKind::Text, frame.as_bytes())
    }

    /// Opens one record from the device: the text frame it completes, or
    /// `None` (a piece with more to follow, or a binary frame).
    pub fn open(&mut self, record: &[u8]) -> Result<Option<String>, OpenError> {
        let (_, opener) = self.channel.as_mut().ok_or(ChannelError::HandshakeOrder)?;
        Ok(match opener.open(record)? {
            Some(OpenedFrame::Text(text)) => Some(text),
            _ => None,
        })
    }
}
