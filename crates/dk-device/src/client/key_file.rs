//! The key file: a dk/2 device's static key, the vessel key it pinned and
//! whether the vessel paired it, kept as one JSON object, written whole or
//! not at all with mode 0600 (the token file's care), and read only when it
//! is a regular 0600 file of this user, never through a link.
//!
//! ```json
//! {"format": "dk-device-key/1", "secret": "<64 hex>", "vessel": "<64 hex>" | null, "paired": false}
//! ```

use std::io;
use std::path::Path;

use dk_channel::{PublicKey, from_hex32, to_hex32};
use dk_device_core::Credentials;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize as _, Zeroizing};

use super::entropy::OsEntropy;
use super::private_file::read_private;
use super::token_file::write_private;

/// The `format` a key file names.
const FORMAT: &str = "dk-device-key/1";

/// Largest key file read: the object is about 200 bytes.
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// A fresh key, no vessel pinned, not paired.
pub(super) fn generate() -> io::Result<Credentials> {
    Credentials::generate(&mut OsEntropy).map_err(io::Error::other)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    format: String,
    secret: String,
    vessel: Option<String>,
    paired: bool,
}

/// The credentials in `path`; `None` when the file is missing. The file is
/// read as a private file (`private_file.rs`): not through a link, owned by
/// this user, mode 0600; any other is refused, never used.
pub(super) fn read_key(path: &Path) -> io::Result<Option<Credentials>> {
    let Some(bytes) = read_private(path, MAX_KEY_FILE_BYTES)? else {
        return Ok(None);
    };
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_owned());
    let mut disk: OnDisk = serde_json::from_slice(&bytes)
        .map_err(|_| invalid("does not hold a dk device key (dk-device-key/1 JSON)"))?;
    let secret_hex = Zeroizing::new(std::mem::take(&mut disk.secret));
    if disk.format != FORMAT {
        return Err(invalid("is not in the dk-device-key/1 format"));
    }
    let mut secret = from_hex32(&secret_hex)
        .ok_or_else(|| invalid("holds a secret that is not 64 lower-case hex digits"))?;
    let vessel =
        match disk.vessel.as_deref() {
            None => None,
            Some(hex) => Some(PublicKey::from_hex(hex).ok_or_else(|| {
                invalid("holds a vessel key that is not 64 lower-case hex digits")
            })?),
        };
    // Paired without a pin cannot be: a hand-edited file. Pairing again
    // is safe; sending the id to an unpinned vessel is not.
    let credentials = Credentials::from_parts(secret, vessel, disk.paired);
    secret.zeroize();
    if credentials.key().is_none() {
        return Err(invalid("holds a secret that makes no key"));
    }
    Ok(Some(credentials))
}

/// Writes `credentials` to `path`, whole or not at all, mode 0600.
pub(super) fn write_key(path: &Path, credentials: &Credentials) -> io::Result<()> {
    let mut disk = OnDisk {
        format: FORMAT.to_owned(),
        secret: to_hex32(credentials.secret()),
        vessel: credentials.pinned().map(PublicKey::to_hex),
        paired: credentials.is_paired(),
    };
    // Room for the whole object, so no growing copy is left unwiped.
    let mut text = Zeroizing::new(Vec::with_capacity(4096));
    let written = serde_json::to_writer(&mut *text, &disk).map_err(io::Error::other);
    disk.secret.zeroize();
    written?;
    text.push(b'\n');
    write_private(path, &text)
}
