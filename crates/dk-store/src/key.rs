//! The key of a keyed audit chain: 32 random bytes kept outside the data
//! directory, in a file of 64 lower-case hex characters and mode 0600. With
//! it, every entry's hash is HMAC-SHA256 under the key instead of SHA-256,
//! so nobody without the key can write an entry that verifies: not append
//! one, not rewrite the chain with recomputed hashes.
//!
//! HMAC is RFC 2104's construction over `sha2`'s SHA-256 (a 64-byte block,
//! the key zero-padded, inner and outer pads), checked against RFC 4231's
//! test vectors; a dozen lines, so no dependency is added for it.

use std::fmt;
use std::io::Read as _;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::Cause;
use dk_files::hex::encode as hex;

/// SHA-256's block size, in bytes.
const BLOCK: usize = 64;

/// What the key's id is the HMAC of: the id names a key without revealing
/// it.
const ID_MESSAGE: &[u8] = b"dk audit key id";

/// HMAC-SHA256 of the concatenated `parts` under `key` (RFC 2104).
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block
            .iter_mut()
            .zip(Sha256::digest(key))
            .for_each(|(b, k)| *b = k);
    } else {
        block.iter_mut().zip(key).for_each(|(b, k)| *b = *k);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The key of a keyed audit chain. `Debug` shows its id, never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct AuditKey([u8; 32]);

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuditKey({})", self.id())
    }
}

/// Why an audit key file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuditKeyError {
    /// It cannot be read or written.
    #[error("cannot use the audit key file `{path}`: {reason}")]
    Io {
        /// The file.
        path: String,
        /// Why: the file system's error.
        #[source]
        reason: Cause,
    },
    /// It is a directory, a link or anything but a regular file.
    #[error("the audit key file `{path}` is not a regular file")]
    NotRegular {
        /// The file.
        path: String,
    },
    /// Others than its owner may read or write it.
    #[error("the audit key file `{path}` has mode {mode:04o}, not 0600")]
    Mode {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// It does not hold 64 lower-case hex characters.
    #[error("the audit key file `{path}` does not hold a key (64 lower-case hex characters)")]
    Malformed {
        /// The file.
        path: String,
    },
}

impl AuditKey {
    /// A new key from the operating system's random source.
    pub fn generate() -> AuditKey {
        AuditKey(rand::random())
    }

    /// The key with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> AuditKey {
        AuditKey(bytes)
    }

    /// The key's id: 16 hex characters of the HMAC of a fixed text under
    /// it. It names the key, in the log and in messages, and tells nothing
    /// of it.
    pub fn id(&self) -> String {
        let mac = hmac_sha256(&self.0, &[ID_MESSAGE]);
        let mut id = hex(&mac);
        id.truncate(16);
        id
    }

    /// HMAC-SHA256 of `parts` under the key, lower-case hex.
    pub(crate) fn mac(&self, parts: &[&[u8]]) -> String {
        hex(&hmac_sha256(&self.0, parts))
    }

    /// The key kept in `path`, which must be a regular file (not a link) of
    /// mode 0600 holding 64 lower-case hex characters and an optional
    /// newline.
    pub fn load(path: &Path) -> Result<AuditKey, AuditKeyError> {
        let shown = path.display().to_string();
        let io = |error: std::io::Error| AuditKeyError::Io {
            path: shown.clone(),
            reason: Cause::new(error),
        };
        let listed = std::fs::symlink_metadata(path).map_err(io)?;
        if !listed.is_file() {
            return Err(AuditKeyError::NotRegular { path: shown });
        }
        let file = std::fs::File::open(path).map_err(io)?;
        let opened = file.metadata().map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            // The file opened is the one listed, not a link put there since.
            if (opened.dev(), opened.ino()) != (listed.dev(), listed.ino()) {
                return Err(AuditKeyError::NotRegular { path: shown });
            }
            let mode = opened.mode() & 0o7777;
            if mode != 0o600 {
                return Err(AuditKeyError::Mode { path: shown, mode });
            }
        }
        let mut text = String::new();
        file.take(256).read_to_string(&mut text).map_err(io)?;
        let text = text.strip_suffix('\n').unwrap_or(&text);
        dk_files::hex::decode32(text)
            .map(AuditKey)
            .ok_or(AuditKeyError::Malformed { path: shown })
    }

    /// The key kept in `path`; when there is no such file, a new key is
    /// made and kept there first (mode 0600, written whole or not at all;
    /// its directory made with mode 0700 if missing).
    pub fn load_or_create(path: &Path) -> Result<AuditKey, AuditKeyError> {
        match std::fs::symlink_metadata(path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            _ => return AuditKey::load(path),
        }
        let key = AuditKey::generate();
        // Its directory is made with mode 0700 if missing.
        dk_files::private::write_private_file(path, format!("{}\n", hex(&key.0)).as_bytes())
            .map_err(|error| AuditKeyError::Io {
                path: path.display().to_string(),
                reason: Cause::new(std::io::Error::from(error)),
            })?;
        Ok(key)
    }
}
