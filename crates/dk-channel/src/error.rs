//! Why the channel failed. Each kind has its own text for logs; the wire
//! never tells which (a vessel closes 4012 `secure channel failed`,
//! whatever it was), so a peer learns nothing from the failure.

/// A handshake or record failure. Any of them ends the channel: a
/// [`Initiator`](crate::Initiator), [`Responder`](crate::Responder),
/// [`Sealer`](crate::Sealer) or [`Opener`](crate::Opener) that returned one
/// refuses everything after it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// A handshake message of another length than its step's (a payload
    /// included: dk/2's handshake payloads are empty).
    #[error("handshake message {step} is {got} bytes, not {expected}")]
    HandshakeLength {
        /// Which message: 1, 2 or 3.
        step: u8,
        /// Its length on the wire.
        got: usize,
        /// The only length it may have.
        expected: usize,
    },
    /// A handshake step taken out of turn, or after a failure.
    #[error("handshake step out of order")]
    HandshakeOrder,
    /// The peer's static or ephemeral key is a low-order X25519 point (0,
    /// 1 or another of the few the key agreement maps to all zeros):
    /// nothing secret would come of it, and anyone can present such a
    /// static key as their own.
    #[error(
        "the peer's {0} key is a low-order point, which contributes nothing to the key agreement"
    )]
    LowOrderKey(LowOrderSlot),
    /// A message that did not decrypt: altered, replayed, reordered, cut,
    /// or from another session.
    #[error("a message failed to decrypt")]
    Decrypt,
    /// A transport message over [`MAX_MESSAGE`](crate::MAX_MESSAGE) bytes.
    #[error("a message of {len} bytes is over the 65535 a Noise message may have")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A record whose plaintext is empty: no header byte.
    #[error("a record has no header byte")]
    MissingHeader,
    /// A record header other than `0x00` to `0x03`.
    #[error("unknown record header 0x{0:02x}")]
    UnknownHeader(u8),
    /// A piece with more to follow that carries no frame byte.
    #[error("a piece with more to follow is empty")]
    EmptyPiece,
    /// A record of the other kind while a frame's pieces were arriving
    /// (pieces of one frame are consecutive and of one kind).
    #[error("a frame's pieces changed kind before it ended")]
    KindSwitch,
    /// A text frame that is not UTF-8 (decoded over the whole frame).
    #[error("a text frame is not UTF-8")]
    InvalidUtf8,
    /// A side that failed before is asked to go on.
    #[error("the channel failed earlier and refuses everything after")]
    Closed,
    /// The 2^64 - 1 messages one direction may carry are used up.
    #[error("the channel's nonces are used up")]
    NonceExhausted,
    /// The system's random number generator failed.
    #[error("the system's random number generator failed")]
    Random,
    /// The allocator had no memory for a record or the frame it belongs
    /// to (a device on a small heap): nothing was decrypted or sealed.
    #[error("no memory for a record")]
    OutOfMemory,
    /// Anything else the Noise library refused (a state or setup problem
    /// that dk-channel's own checks should have made impossible).
    #[error("noise: {0}")]
    Noise(#[source] NoiseError),
}

/// Which of a peer's keys [`ChannelError::LowOrderKey`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowOrderSlot {
    /// Its long-term static key.
    Static,
    /// The ephemeral key of this handshake.
    Ephemeral,
}

impl core::fmt::Display for LowOrderSlot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            LowOrderSlot::Static => "static",
            LowOrderSlot::Ephemeral => "ephemeral",
        })
    }
}

/// An error from the Noise library, kept as the source of
/// [`ChannelError::Noise`] without naming the library's type.
#[derive(Debug)]
pub struct NoiseError {
    /// The library's error.
    inner: snow::Error,
}

impl core::fmt::Display for NoiseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.inner.fmt(f)
    }
}

impl core::error::Error for NoiseError {}

/// The channel error for one of snow's: decryption, the nonce and the RNG
/// have kinds of their own, the rest is kept as it is.
pub(crate) fn from_noise(error: snow::Error) -> ChannelError {
    match error {
        snow::Error::Decrypt => ChannelError::Decrypt,
        snow::Error::Rng => ChannelError::Random,
        snow::Error::State(snow::error::StateProblem::Exhausted) => ChannelError::NonceExhausted,
        inner => ChannelError::Noise(NoiseError { inner }),
    }
}

/// The error for a primitive the Noise library was built without (dk-channel
/// turns on every one it uses, so this does not happen).
pub(crate) fn unsupported() -> ChannelError {
    ChannelError::Noise(NoiseError {
        inner: snow::Error::Init(snow::error::InitStage::GetDhImpl),
    })
}
