//! dk/2's secure channel, without IO: the Noise handshake a device (the
//! initiator) and a vessel (the responder) run, the record layer that
//! carries frames over Noise transport messages once it is done, and the
//! pairing math that turns the handshake into a 6-digit code both sides
//! compute and neither sends. The contract is `secure-channel.md`; this
//! crate reproduces its test vectors byte for byte
//! (`fixtures/secure-channel-vectors.json`).
//!
//! - [`StaticKey`] and [`PublicKey`]: long-term X25519 keys, a key's
//!   [fingerprint](PublicKey::fingerprint).
//! - [`Initiator`] and [`Responder`]: `Noise_XX_25519_ChaChaPoly_SHA256`
//!   with the prologue `dk/2` and empty payloads, so the three messages are
//!   exactly 32, 96 and 64 bytes; the device sees the vessel's static key
//!   after message 2 and can refuse it before it sends message 3. Both
//!   refuse a peer's static or ephemeral key that is a low-order point
//!   ([`ChannelError::LowOrderKey`]). Both end in an [`Established`]
//!   channel.
//! - [`Sealer`] and [`Opener`]: one Noise transport message per record, a
//!   header byte saying text or binary and whether more pieces follow, a
//!   frame's size limit checked while its pieces arrive. They are owned
//!   independently, so a reader and a writer task need no lock.
//! - [`commitment`], [`pairing_code`] and their kin: the commit, nonce,
//!   reveal exchange's hashes.
//!
//! Everything here is pure: no IO, no async runtime, no clock. The Noise
//! protocol is the `snow` crate's, its primitives curve25519-dalek's,
//! sha2's and ring's, or RustCrypto's `chacha20poly1305` without the `ring`
//! feature (no primitive is written here), and no type of theirs appears
//! in this crate's API.
//!
//! The crate is `no_std` with `alloc`, so that a device's firmware builds
//! it. Its default features are `std` and `ring`: ring's ChaCha20-Poly1305
//! and the system's random bytes ([`StaticKey::generate`],
//! [`random_nonce`], [`Initiator::new`], [`Responder::new`]). Without
//! `ring` the platform brings the random bytes:
//! [`StaticKey::from_secret`], [`Initiator::with_random`] and
//! [`Responder::with_random`] take them, and nothing here reads the
//! system's. No input from a peer can make
//! this crate panic: every failure is a [`ChannelError`], and none of them is
//! told to the peer (the vessel closes with one code whatever failed).
//! Secrets never appear in `Debug` output.

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(any(test, feature = "std"))]
extern crate std;

mod error;
mod handshake;
mod hex;
mod keys;
mod noise;
mod pairing;
mod protocol;
mod record;
#[cfg(all(feature = "vectors", feature = "ring"))]
mod scripted;

pub use error::{ChannelError, LowOrderSlot, NoiseError};
pub use handshake::{Established, Initiator, Responder};
pub use hex::{from_hex32, to_hex32};
pub use keys::{PublicKey, StaticKey};
#[cfg(feature = "ring")]
pub use pairing::random_nonce;
pub use pairing::{code_number, commitment, commitment_holds, pairing_code};
pub use protocol::{
    HANDSHAKE_LENGTHS, MAX_MESSAGE, MAX_PIECE, NOISE_PATTERN, PROLOGUE, SUBPROTOCOL,
};
pub use record::{FrameKind, OpenError, OpenedFrame, Opener, RecordLimits, Sealer};
#[cfg(all(feature = "vectors", feature = "ring"))]
pub use scripted::ScriptedVessel;

#[cfg(test)]
mod tests;

/// Fuzzing entry points: each takes arbitrary bytes and must never panic.
#[doc(hidden)]
pub mod fuzz {
    /// Reads arbitrary text as a 32-byte hex value, and a valid one back.
    pub fn pairing_hex(data: &[u8]) {
        let Ok(text) = core::str::from_utf8(data) else {
            return;
        };
        if let Some(bytes) = crate::from_hex32(text) {
            assert_eq!(crate::to_hex32(&bytes), text, "hex does not read back");
        }
        let _ = crate::PublicKey::from_hex(text);
    }

    /// Feeds arbitrary messages to an [`Opener`](crate::Opener) set up from
    /// a fixed handshake. The data is a list of `u16` big-endian lengths,
    /// each followed by that many bytes (cut short at the end); a length
    /// with its top bit set means "seal these bytes as a record's plaintext
    /// first", so that the record layer behind the decryption is reached
    /// too.
    #[cfg(feature = "vectors")]
    pub fn channel_records(data: &[u8]) {
        let Some((mut sealer, mut opener)) = crate::handshake::fixed_pair() else {
            return;
        };
        let mut rest = data;
        while let [high, low, after @ ..] = rest {
            let word = u16::from_be_bytes([*high, *low]);
            let seal = word & 0x8000 != 0;
            let len = usize::from(word & 0x7fff).min(after.len());
            let (message, after) = after.split_at(len);
            rest = after;
            let result = if seal {
                match sealer.seal_plaintext_for_vectors(message) {
                    Ok(record) => opener.open(&record),
                    Err(_) => return,
                }
            } else {
                opener.open(message)
            };
            if result.is_err() {
                // Refused once, refused for good.
                assert!(opener.open(&[]).is_err(), "an opener recovered");
                return;
            }
        }
    }
}
