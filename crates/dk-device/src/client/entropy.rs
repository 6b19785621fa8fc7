//! The device core's random bytes: the operating system's.

use dk_device_core::{Entropy, EntropyFailed};
use rand::TryRng as _;
use rand::rngs::SysRng;

/// The operating system's random bytes, for the device's key, each
/// handshake and each pairing nonce.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OsEntropy;

impl Entropy for OsEntropy {
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), EntropyFailed> {
        SysRng.try_fill_bytes(dest).map_err(|_| EntropyFailed)
    }
}
