//! Where a connection stands, as one enum: the handshake, the pairing's
//! step, serving, closing. v1 and dk/2 are told apart by its variants, and
//! dk/2's channel halves live in the variants that have a channel, so no
//! state the protocol forbids (a code shown with no commitment, a v1
//! connection with a channel) can be written down.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;

use dk_channel::{FrameKind, Initiator, MAX_MESSAGE, OpenedFrame, Opener, PublicKey, Sealer};

use super::{End, Message, Notice, Output};
use crate::time::Instant;

/// Where a connection stands, with what each step holds.
pub(super) enum Phase {
    /// No connection.
    Idle,
    /// dk/2: the handshake runs.
    Handshake {
        initiator: Box<Initiator>,
        deadline: Instant,
    },
    /// `device:hello` was sent: the pairing runs.
    Pairing(PairStep),
    /// Paired or authenticated: calls are served.
    Serving {
        link: Link,
        /// The largest stream chunk payload the vessel admitted; 0 until it
        /// admits a streaming session.
        stream_cap: u64,
        /// Once the device shuts down with calls running: when the close
        /// comes whatever still runs. No new call is taken meanwhile.
        stop_by: Option<Instant>,
    },
    /// The device closed and waits for the vessel's close.
    Closing {
        deadline: Instant,
        then: End,
        /// Kept so that a refusal the vessel announces meanwhile is read.
        link: Link,
    },
    /// The connection ended ([`Output::Ended`] was given).
    Ended,
}

/// The pairing's step: on v1 one, on dk/2 the commit/nonce/reveal
/// exchange in the order the rules demand, each carrying the channel.
pub(super) enum PairStep {
    /// v1: the vessel's code, then its token, to come.
    V1,
    /// dk/2: the vessel's commitment to its nonce to come.
    AwaitCommit(Box<Secure>),
    /// dk/2: the device's nonce was sent; the vessel's reveal to come.
    AwaitReveal {
        secure: Box<Secure>,
        /// The vessel's commitment.
        commitment: [u8; 32],
        /// The device's nonce.
        nonce: [u8; 32],
    },
    /// dk/2: the reveal matched and the code was shown; `device:paired`
    /// (the person's yes) to come.
    AwaitPaired(Box<Secure>),
}

/// How an open connection carries frames.
pub(super) enum Link {
    /// v1: text messages in clear.
    V1,
    /// dk/2: records inside the channel.
    Dk2(Box<Secure>),
}

/// A dk/2 connection's channel.
pub(super) struct Secure {
    pub(super) sealer: Sealer,
    pub(super) opener: Opener,
    pub(super) handshake_hash: [u8; 32],
    /// The vessel's static key, as this handshake presented it.
    pub(super) vessel: PublicKey,
    /// The close the vessel announced inside the channel
    /// (`device:closing`): the only kind of close a dk/2 device acts on.
    pub(super) closing: Option<(u16, String)>,
}

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No connection: [`DeviceCore::connect`](super::DeviceCore::connect)
    /// starts one.
    Idle,
    /// dk/2: the handshake runs.
    Handshaking,
    /// `device:hello` was sent: the pairing runs.
    Pairing,
    /// Paired or authenticated: calls are served.
    Serving,
    /// The device closed and waits for the vessel's close.
    Closing,
    /// The connection ended ([`Output::Ended`] was given).
    Ended,
}

impl Phase {
    /// What the driver is told of where the connection stands.
    pub(super) fn state(&self) -> State {
        match self {
            Phase::Idle => State::Idle,
            Phase::Handshake { .. } => State::Handshaking,
            Phase::Pairing(_) => State::Pairing,
            Phase::Serving { .. } => State::Serving,
            Phase::Closing { .. } => State::Closing,
            Phase::Ended => State::Ended,
        }
    }

    /// The dk/2 channel of the open connection, if it has one.
    pub(super) fn secure_mut(&mut self) -> Option<&mut Secure> {
        match self {
            Phase::Pairing(step) => step.secure_mut(),
            Phase::Serving {
                link: Link::Dk2(secure),
                ..
            }
            | Phase::Closing {
                link: Link::Dk2(secure),
                ..
            } => Some(secure),
            _ => None,
        }
    }

    /// Takes the open connection's link, leaving [`Phase::Ended`]: to
    /// move the channel from one step to the next.
    pub(super) fn take_link(&mut self) -> Link {
        match core::mem::replace(self, Phase::Ended) {
            Phase::Pairing(step) => step.into_link(),
            Phase::Serving { link, .. } | Phase::Closing { link, .. } => link,
            Phase::Idle | Phase::Handshake { .. } | Phase::Ended => Link::V1,
        }
    }
}

impl PairStep {
    pub(super) fn secure_mut(&mut self) -> Option<&mut Secure> {
        match self {
            PairStep::V1 => None,
            PairStep::AwaitCommit(secure)
            | PairStep::AwaitReveal { secure, .. }
            | PairStep::AwaitPaired(secure) => Some(secure),
        }
    }

    /// The channel the pairing ran in, for what follows it.
    pub(super) fn into_link(self) -> Link {
        match self {
            PairStep::V1 => Link::V1,
            PairStep::AwaitCommit(secure)
            | PairStep::AwaitReveal { secure, .. }
            | PairStep::AwaitPaired(secure) => Link::Dk2(secure),
        }
    }
}

impl Secure {
    /// Seals `bytes` into records to send. Only a frame over the record
    /// layer's limit fails, and every frame sent was checked against the
    /// vessel's: then nothing goes.
    pub(super) fn seal(
        &mut self,
        kind: FrameKind,
        bytes: &[u8],
        outputs: &mut VecDeque<Output>,
    ) -> Result<(), ()> {
        let records = self.sealer.seal(kind, bytes).map_err(|_| ())?;
        outputs.extend(
            records
                .into_iter()
                .map(|record| Output::Send(Message::Binary(record))),
        );
        Ok(())
    }

    /// Opens one record: the text frame it completes, if any. `Err` when
    /// the channel failed (the opener then refuses everything).
    pub(super) fn open(
        &mut self,
        bytes: &[u8],
        outputs: &mut VecDeque<Output>,
    ) -> Result<Option<String>, ()> {
        if bytes.len() > MAX_MESSAGE {
            return Err(());
        }
        match self.opener.open(bytes) {
            Ok(None) => Ok(None),
            Ok(Some(OpenedFrame::Text(text))) => Ok(Some(text)),
            Ok(Some(OpenedFrame::Binary(_))) => {
                outputs.push_back(Output::Notice(Notice::IgnoredBinary));
                Ok(None)
            }
            Err(_) => Err(()),
        }
    }
}
