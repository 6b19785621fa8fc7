//! The handshake: `Noise_XX_25519_ChaChaPoly_SHA256`, prologue `dk/2`,
//! empty payloads. The device is the [`Initiator`], the vessel the
//! [`Responder`]:
//!
//! ```text
//! device                      vessel
//!   first_message  -- 32 -->  read_first
//!   read_second    <-- 96 --  second_message
//!   (check the vessel's key against the pin here)
//!   third_message  -- 64 -->  read_third
//! ```
//!
//! Each side's steps must come in this order; a step out of turn, a message
//! of another length or one that does not decrypt fails the handshake, and
//! a failed side refuses every step after. A peer's ephemeral key (the clear
//! first 32 bytes of messages 1 and 2) and its static key (known once
//! message 2 or 3 is read) must not be low-order points: with one, a key
//! agreement gives zeros that anyone can compute, and a static key of the
//! point 0 would be a credential anyone can present.

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::error::{ChannelError, LowOrderSlot, from_noise, unsupported};
use crate::keys::{PublicKey, StaticKey};
use crate::noise::{Randomness, builder, is_low_order};
use crate::protocol::{HANDSHAKE_LENGTHS, PROLOGUE, TAG_LEN};
use crate::record::{Opener, RecordLimits, Sealer};

#[cfg(all(feature = "vectors", feature = "ring"))]
#[path = "tests/hostile_peer.rs"]
mod hostile_peer;

/// A handshake state for one side, its ephemeral key made from `random`.
fn start(
    key: &StaticKey,
    random: Randomness,
    initiator: bool,
) -> Result<snow::HandshakeState, ChannelError> {
    start_with(builder(random)?, key, initiator)
}

/// [`start`] on a given builder.
fn start_with(
    builder: snow::Builder<'static>,
    key: &StaticKey,
    initiator: bool,
) -> Result<snow::HandshakeState, ChannelError> {
    let builder = builder
        .prologue(PROLOGUE)
        .map_err(from_noise)?
        .local_private_key(key.secret())
        .map_err(from_noise)?;
    let state = if initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    };
    state.map_err(from_noise)
}

/// The length handshake message `step` (1, 2 or 3) must have.
fn expected_length(step: u8) -> usize {
    let [first, second, third] = HANDSHAKE_LENGTHS;
    match step {
        1 => first,
        2 => second,
        _ => third,
    }
}

/// Writes handshake message `step`, with an empty payload.
fn write(state: &mut snow::HandshakeState, step: u8) -> Result<Vec<u8>, ChannelError> {
    let expected = expected_length(step);
    // Noise asks for room for a tag even where message 1 has none.
    let mut message = vec![0; expected + TAG_LEN];
    let written = state.write_message(&[], &mut message).map_err(from_noise)?;
    message.truncate(written);
    if written != expected {
        return Err(ChannelError::HandshakeLength {
            step,
            got: written,
            expected,
        });
    }
    Ok(message)
}

/// Reads handshake message `step`, which must have exactly its length (and
/// so an empty payload).
fn read(state: &mut snow::HandshakeState, step: u8, message: &[u8]) -> Result<(), ChannelError> {
    let expected = expected_length(step);
    if message.len() != expected {
        return Err(ChannelError::HandshakeLength {
            step,
            got: message.len(),
            expected,
        });
    }
    // Messages 1 and 2 open with the sender's ephemeral key, in clear.
    if step != 3
        && let Some(ephemeral) = message.first_chunk::<32>()
        && is_low_order(ephemeral)?
    {
        return Err(ChannelError::LowOrderKey(LowOrderSlot::Ephemeral));
    }
    let mut payload = [0u8; 0];
    state
        .read_message(message, &mut payload)
        .map_err(from_noise)?;
    Ok(())
}

/// The peer's static key, known after message 2 (device) or 3 (vessel).
fn remote_of(state: &snow::HandshakeState) -> Result<PublicKey, ChannelError> {
    let remote = state
        .get_remote_static()
        .ok_or(ChannelError::HandshakeOrder)?;
    let bytes = <[u8; 32]>::try_from(remote).map_err(|_| unsupported())?;
    if is_low_order(&bytes)? {
        return Err(ChannelError::LowOrderKey(LowOrderSlot::Static));
    }
    Ok(PublicKey::from_bytes(bytes))
}

/// The channel a finished handshake leaves.
fn finish(state: snow::HandshakeState) -> Result<Established, ChannelError> {
    let remote = remote_of(&state)?;
    let handshake_hash =
        <[u8; 32]>::try_from(state.get_handshake_hash()).map_err(|_| unsupported())?;
    let transport = state.into_stateless_transport_mode().map_err(from_noise)?;
    Ok(Established {
        remote,
        handshake_hash,
        transport,
    })
}

/// Where a side's handshake stands: the step it may take next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Write or read message 1.
    First,
    /// Write or read message 2.
    Second,
    /// Write or read message 3.
    Third,
    /// A step failed; nothing more.
    Failed,
}

/// Takes one step of a handshake if it is `turn`'s, marking the side failed
/// when the step is out of turn or fails.
fn step<T>(
    current: &mut Turn,
    turn: Turn,
    next: Turn,
    run: impl FnOnce() -> Result<T, ChannelError>,
) -> Result<T, ChannelError> {
    if *current != turn {
        *current = Turn::Failed;
        return Err(ChannelError::HandshakeOrder);
    }
    match run() {
        Ok(value) => {
            *current = next;
            Ok(value)
        }
        Err(error) => {
            *current = Turn::Failed;
            Err(error)
        }
    }
}

/// The device's side of the handshake (the Noise initiator).
pub struct Initiator {
    /// Noise's handshake state.
    state: snow::HandshakeState,
    /// The step it may take next.
    turn: Turn,
}

impl Initiator {
    /// A handshake with this static key and a fresh ephemeral key from the
    /// system's CSPRNG (the `ring` feature).
    #[cfg(feature = "ring")]
    pub fn new(key: &StaticKey) -> Result<Initiator, ChannelError> {
        Ok(Initiator {
            state: start(key, Randomness::System, true)?,
            turn: Turn::First,
        })
    }

    /// A handshake with this static key and the ephemeral key whose secret
    /// is `ephemeral`: 32 fresh bytes from the platform's CSPRNG, used for
    /// this handshake only (the same bytes twice would make its secrets
    /// predictable). They are the only random bytes the handshake uses
    /// (it fails if it wants more), and the copy it keeps is zeroed once
    /// the key is made or the handshake is dropped.
    pub fn with_random(key: &StaticKey, ephemeral: [u8; 32]) -> Result<Initiator, ChannelError> {
        Ok(Initiator {
            state: start(key, Randomness::once(ephemeral), true)?,
            turn: Turn::First,
        })
    }

    /// Message 1 (`e`): 32 bytes.
    pub fn first_message(&mut self) -> Result<Vec<u8>, ChannelError> {
        let state = &mut self.state;
        step(&mut self.turn, Turn::First, Turn::Second, || {
            write(state, 1)
        })
    }

    /// Reads message 2 (`e, ee, s, es`), which must be exactly 96 bytes,
    /// and returns the vessel's static key, so that the device checks it
    /// against its pin before it sends message 3.
    pub fn read_second(&mut self, message: &[u8]) -> Result<PublicKey, ChannelError> {
        let state = &mut self.state;
        step(&mut self.turn, Turn::Second, Turn::Third, || {
            read(state, 2, message)?;
            remote_of(state)
        })
    }

    /// Message 3 (`s, se`): 64 bytes, and the channel it finishes.
    pub fn third_message(mut self) -> Result<(Vec<u8>, Established), ChannelError> {
        let state = &mut self.state;
        let message = step(&mut self.turn, Turn::Third, Turn::Failed, || {
            write(state, 3)
        })?;
        Ok((message, finish(self.state)?))
    }
}

impl fmt::Debug for Initiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Initiator")
            .field("turn", &self.turn)
            .finish_non_exhaustive()
    }
}

/// The vessel's side of the handshake (the Noise responder).
pub struct Responder {
    /// Noise's handshake state.
    state: snow::HandshakeState,
    /// The step it may take next.
    turn: Turn,
}

impl Responder {
    /// A handshake with this static key and a fresh ephemeral key from the
    /// system's CSPRNG (the `ring` feature).
    #[cfg(feature = "ring")]
    pub fn new(key: &StaticKey) -> Result<Responder, ChannelError> {
        Ok(Responder {
            state: start(key, Randomness::System, false)?,
            turn: Turn::First,
        })
    }

    /// A handshake with this static key and the ephemeral key whose secret
    /// is `ephemeral`, as [`Initiator::with_random`].
    pub fn with_random(key: &StaticKey, ephemeral: [u8; 32]) -> Result<Responder, ChannelError> {
        Ok(Responder {
            state: start(key, Randomness::once(ephemeral), false)?,
            turn: Turn::First,
        })
    }

    /// Reads message 1, which must be exactly 32 bytes.
    pub fn read_first(&mut self, message: &[u8]) -> Result<(), ChannelError> {
        let state = &mut self.state;
        step(&mut self.turn, Turn::First, Turn::Second, || {
            read(state, 1, message)
        })
    }

    /// Message 2: 96 bytes, carrying this side's static key encrypted.
    pub fn second_message(&mut self) -> Result<Vec<u8>, ChannelError> {
        let state = &mut self.state;
        step(&mut self.turn, Turn::Second, Turn::Third, || {
            write(state, 2)
        })
    }

    /// Reads message 3, which must be exactly 64 bytes, and returns the
    /// channel it finishes, with the device's static key.
    pub fn read_third(mut self, message: &[u8]) -> Result<Established, ChannelError> {
        let state = &mut self.state;
        step(&mut self.turn, Turn::Third, Turn::Failed, || {
            read(state, 3, message)
        })?;
        finish(self.state)
    }
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("turn", &self.turn)
            .finish_non_exhaustive()
    }
}

/// A finished handshake: who is on the other side, the handshake hash the
/// pairing code is computed from, and the keys of the records to come.
pub struct Established {
    /// The peer's static key: the device's credential on the vessel's
    /// side, the vessel's identity on the device's.
    pub remote: PublicKey,
    /// The Noise handshake hash `h` after message 3, the same on both
    /// sides of one channel and different on the two channels a relay runs.
    pub handshake_hash: [u8; 32],
    /// The two directions' cipher states; each side keeps its own nonce.
    transport: snow::StatelessTransportState,
}

impl Established {
    /// The channel's two directions, owned independently (a reader and a
    /// writer task share no lock): a [`Sealer`] for what this side sends
    /// and an [`Opener`] for what it receives, accepting frames within
    /// `limits`.
    pub fn split(self, limits: RecordLimits) -> (Sealer, Opener) {
        let transport = Arc::new(self.transport);
        (
            Sealer::new(Arc::clone(&transport)),
            Opener::new(transport, limits),
        )
    }
}

#[cfg(any(test, feature = "vectors"))]
impl Established {
    /// The cipher states alone, so that tests and fuzz targets make many
    /// sealers and openers (each starting at nonce 0) from one handshake.
    pub(crate) fn into_transport(self) -> Arc<snow::StatelessTransportState> {
        Arc::new(self.transport)
    }
}

impl fmt::Debug for Established {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Established")
            .field("remote", &self.remote)
            .field(
                "handshake_hash",
                &crate::hex::to_hex32(&self.handshake_hash),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "vectors")]
impl Initiator {
    /// A handshake whose ephemeral key is `ephemeral` instead of a fresh
    /// one: only for reproducing test vectors (with the `vectors` feature,
    /// which no build that talks to a real peer has). A fixed ephemeral key
    /// makes every secret of the channel predictable.
    pub fn with_fixed_ephemeral_for_vectors(
        key: &StaticKey,
        ephemeral: &[u8; 32],
    ) -> Result<Initiator, ChannelError> {
        Initiator::with_random(key, *ephemeral)
    }
}

#[cfg(feature = "vectors")]
impl Responder {
    /// A handshake whose ephemeral key is `ephemeral` instead of a fresh
    /// one: only for reproducing test vectors and benches (with the
    /// `vectors` feature). A fixed ephemeral key makes every secret of the
    /// channel predictable.
    pub fn with_fixed_ephemeral_for_vectors(
        key: &StaticKey,
        ephemeral: &[u8; 32],
    ) -> Result<Responder, ChannelError> {
        Responder::with_random(key, *ephemeral)
    }
}

/// A fresh device sealer and vessel opener of one handshake between the
/// first test vector's keys, made once and shared by every call (each pair
/// starts at nonce 0 again, which only a fuzz target may do): every run of
/// the fuzz target starts the same, and costs no handshake.
#[cfg(all(feature = "vectors", feature = "std"))]
pub(crate) fn fixed_pair() -> Option<(Sealer, Opener)> {
    type Shared = Arc<snow::StatelessTransportState>;
    static SHARED: std::sync::OnceLock<Option<(Shared, Shared)>> = std::sync::OnceLock::new();
    let (device, vessel) = SHARED
        .get_or_init(|| {
            let (device, vessel) = fixed_handshake().ok()?;
            Some((device.into_transport(), vessel.into_transport()))
        })
        .as_ref()?;
    fixed_pair_of(device, vessel)
}

/// [`fixed_pair`] without the standard library: a handshake each call.
#[cfg(all(feature = "vectors", not(feature = "std")))]
pub(crate) fn fixed_pair() -> Option<(Sealer, Opener)> {
    let (device, vessel) = fixed_handshake().ok()?;
    fixed_pair_of(&device.into_transport(), &vessel.into_transport())
}

/// A fresh device sealer and vessel opener of these cipher states.
#[cfg(feature = "vectors")]
fn fixed_pair_of(
    device: &Arc<snow::StatelessTransportState>,
    vessel: &Arc<snow::StatelessTransportState>,
) -> Option<(Sealer, Opener)> {
    let limits = RecordLimits {
        max_text: 100_000,
        max_binary: 4_096,
    };
    Some((
        Sealer::new(Arc::clone(device)),
        Opener::new(Arc::clone(vessel), limits),
    ))
}

/// The two ends of the handshake between the first test vector's keys.
#[cfg(feature = "vectors")]
fn fixed_handshake() -> Result<(Established, Established), ChannelError> {
    let secret = |first: u8| core::array::from_fn(|i| first.wrapping_add(i as u8));
    let device = StaticKey::from_secret(secret(0x01))?;
    let vessel = StaticKey::from_secret(secret(0x41))?;
    let mut initiator = Initiator::with_fixed_ephemeral_for_vectors(&device, &secret(0x21))?;
    let mut responder = Responder::with_fixed_ephemeral_for_vectors(&vessel, &secret(0x61))?;
    responder.read_first(&initiator.first_message()?)?;
    initiator.read_second(&responder.second_message()?)?;
    let (third, device_side) = initiator.third_message()?;
    Ok((device_side, responder.read_third(&third)?))
}

#[cfg(all(feature = "vectors", feature = "ring"))]
impl Initiator {
    /// A hostile device for tests (the `vectors` feature): it presents the
    /// point 0 as its `zero` key (static or ephemeral), computing the
    /// all-zero key agreements its peer computes with it; `key` is its
    /// other, real static key when `zero` is the ephemeral one.
    #[doc(hidden)]
    pub fn presenting_low_order_for_tests(
        key: &StaticKey,
        zero: LowOrderSlot,
    ) -> Result<Initiator, ChannelError> {
        let builder = hostile_peer::hostile_builder(zero)?;
        Ok(Initiator {
            state: start_with(builder, key, true)?,
            turn: Turn::First,
        })
    }
}

#[cfg(all(feature = "vectors", feature = "ring"))]
impl Responder {
    /// A hostile vessel for tests (the `vectors` feature): it presents the
    /// point 0 as its `zero` key (static or ephemeral), as
    /// [`Initiator::presenting_low_order_for_tests`] does.
    #[doc(hidden)]
    pub fn presenting_low_order_for_tests(
        key: &StaticKey,
        zero: LowOrderSlot,
    ) -> Result<Responder, ChannelError> {
        let builder = hostile_peer::hostile_builder(zero)?;
        Ok(Responder {
            state: start_with(builder, key, false)?,
            turn: Turn::First,
        })
    }
}
