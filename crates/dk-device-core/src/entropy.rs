//! Random bytes, from the platform.

use core::fmt;

/// The platform's source of random bytes: a hardware generator on a
/// microcontroller, the operating system's elsewhere. The core asks for
/// them when it makes the device's key (once), for each handshake's
/// ephemeral key, for each pairing nonce, and once to key the hash of
/// the call ids it remembers. They must be unpredictable: a device whose
/// generator repeats can be impersonated.
pub trait Entropy {
    /// Fills `dest` with random bytes, or says the platform has none.
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), EntropyFailed>;
}

impl<F> Entropy for F
where
    F: FnMut(&mut [u8]) -> Result<(), EntropyFailed>,
{
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), EntropyFailed> {
        self(dest)
    }
}

/// The platform gave no random bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntropyFailed;

impl fmt::Display for EntropyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the platform gave no random bytes")
    }
}

impl core::error::Error for EntropyFailed {}

/// 32 random bytes.
pub(crate) fn random32(entropy: &mut dyn Entropy) -> Result<[u8; 32], EntropyFailed> {
    let mut bytes = [0u8; 32];
    entropy.fill(&mut bytes)?;
    Ok(bytes)
}
