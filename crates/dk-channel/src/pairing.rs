//! The pairing math: the code is computed on both sides from the channel,
//! never sent. The vessel commits to its nonce `Nv` before it learns the
//! device's `Nd`, then reveals it; both compute the code from the handshake
//! hash `h` and the two nonces, so a relay, which runs two channels with two
//! different hashes, shows the person two different codes.
//!
//! The labels are their ASCII bytes, no terminator, no length prefix; the
//! nonces and `h` enter the hashes as their raw 32 bytes.

use alloc::format;
use alloc::string::String;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[cfg(feature = "ring")]
use crate::error::ChannelError;

/// The label of the vessel's commitment.
const COMMIT_LABEL: &[u8] = b"dk/2 commit";

/// The label of the code's hash.
const CODE_LABEL: &[u8] = b"dk/2 code";

/// How many codes there are: six decimal digits.
const CODES: u32 = 1_000_000;

/// 32 fresh bytes from the system's CSPRNG, for `Nv` or `Nd` (the `ring`
/// feature); fails only when that generator does. Without it, the
/// platform's CSPRNG gives them.
#[cfg(feature = "ring")]
pub fn random_nonce() -> Result<[u8; 32], ChannelError> {
    crate::noise::random_bytes()
}

/// The vessel's commitment to its nonce: `SHA-256("dk/2 commit" || Nv || h)`.
pub fn commitment(nv: &[u8; 32], handshake_hash: &[u8; 32]) -> [u8; 32] {
    Sha256::new()
        .chain_update(COMMIT_LABEL)
        .chain_update(nv)
        .chain_update(handshake_hash)
        .finalize()
        .into()
}

/// Whether a revealed `Nv` is the one the vessel committed to, compared in
/// constant time. A device that finds it is not ends the pairing.
pub fn commitment_holds(commitment: &[u8; 32], nv: &[u8; 32], handshake_hash: &[u8; 32]) -> bool {
    self::commitment(nv, handshake_hash)
        .ct_eq(commitment)
        .into()
}

/// The code's number before it is cut to six digits: the first 4 bytes of
/// `SHA-256("dk/2 code" || h || Nd || Nv)` read as a big-endian `u32`.
pub fn code_number(handshake_hash: &[u8; 32], nd: &[u8; 32], nv: &[u8; 32]) -> u32 {
    let digest: [u8; 32] = Sha256::new()
        .chain_update(CODE_LABEL)
        .chain_update(handshake_hash)
        .chain_update(nd)
        .chain_update(nv)
        .finalize()
        .into();
    let [a, b, c, d, ..] = digest;
    u32::from_be_bytes([a, b, c, d])
}

/// The 6-digit code the device shows and the person's prompt shows:
/// [`code_number`] mod 1,000,000, with its leading zeros (`"000513"`).
pub fn pairing_code(handshake_hash: &[u8; 32], nd: &[u8; 32], nv: &[u8; 32]) -> String {
    format!("{:06}", code_number(handshake_hash, nd, nv) % CODES)
}
