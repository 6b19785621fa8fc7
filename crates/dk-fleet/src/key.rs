//! The fleet key: a vessel key file (64 hex digits of a dk/2 static
//! secret, read only when it is a 0600 file of this user), and the key
//! that seals fleet messages, derived from its secret by HKDF-SHA256.

use std::fmt;
use std::path::{Path, PathBuf};

use dk_files::private::{PrivateFileError, read_private_file};
use zeroize::Zeroize;

/// The HKDF label of the sealing key: no other key of dk is derived under it.
const SEAL_LABEL: &[u8] = b"dk fleet message seal v1";

/// Why the fleet key could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file is missing, not private, not ours, or unreadable.
    #[error("fleet key: {0}")]
    File(#[from] PrivateFileError),
    /// The file holds no vessel key.
    #[error("fleet key: `{}` holds no vessel key (64 lower-case hex digits)", .0.display())]
    NotAKey(PathBuf),
}

/// The fleet's key: the dk/2 static key every member holds (devices pin
/// its public half) and the sealing key derived from it. Neither secret
/// appears in `Debug`.
pub struct FleetKey {
    identity: dk_channel::StaticKey,
    seal: [u8; 32],
}

impl FleetKey {
    /// Reads the key from `path`, a vessel key file of this user, mode 0600.
    pub fn read(path: &Path) -> Result<FleetKey, KeyError> {
        let bytes = read_private_file(path)?;
        let not_a_key = || KeyError::NotAKey(path.to_owned());
        let text = std::str::from_utf8(&bytes).map_err(|_| not_a_key())?;
        let secret = dk_channel::from_hex32(text.trim_end_matches('\n')).ok_or_else(not_a_key)?;
        FleetKey::from_secret(secret).ok_or_else(not_a_key)
    }

    /// The key of a dk/2 static secret, or `None` for a secret dk/2 refuses.
    pub fn from_secret(secret: [u8; 32]) -> Option<FleetKey> {
        let identity = dk_channel::StaticKey::from_secret(secret).ok()?;
        let seal = derive(identity.secret());
        Some(FleetKey { identity, seal })
    }

    /// The public half devices pin.
    pub fn public(&self) -> dk_channel::PublicKey {
        self.identity.public()
    }

    pub(crate) fn seal_key(&self) -> &[u8; 32] {
        &self.seal
    }
}

impl fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetKey")
            .field("public", &self.identity.public().fingerprint())
            .finish_non_exhaustive()
    }
}

impl Drop for FleetKey {
    fn drop(&mut self) {
        // Volatile writes: a plain fill of memory about to be freed is a
        // dead store the optimiser may remove.
        self.seal.zeroize();
    }
}

/// HKDF-SHA256 of the static secret (no salt) under [`SEAL_LABEL`].
fn derive(secret: &[u8; 32]) -> [u8; 32] {
    use ring::hkdf;
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(secret);
    let mut out = [0u8; 32];
    let label = [SEAL_LABEL];
    // Thirty-two bytes is one block of SHA-256, always within HKDF's bound.
    if let Ok(okm) = prk.expand(&label, hkdf::HKDF_SHA256) {
        let _ = okm.fill(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealing_key_is_not_the_secret_and_depends_on_it() {
        let a = FleetKey::from_secret([7; 32]).unwrap();
        let b = FleetKey::from_secret([8; 32]).unwrap();
        assert_ne!(a.seal_key(), &[0; 32]);
        assert_ne!(a.seal_key(), &[7; 32]);
        assert_ne!(a.seal_key(), b.seal_key());
        assert_eq!(
            a.seal_key(),
            FleetKey::from_secret([7; 32]).unwrap().seal_key()
        );
        assert!(!format!("{a:?}").contains("0707"));
    }
}
