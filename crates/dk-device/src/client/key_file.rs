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

use dk_channel::{PublicKey, StaticKey, from_hex32, to_hex32};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize as _, Zeroizing};

use super::private_file::read_private;
use super::token_file::write_private;

/// The `format` a key file names.
const FORMAT: &str = "dk-device-key/1";

/// Largest key file read: the object is about 200 bytes.
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// A device's dk/2 identity and what it knows of its vessel.
pub(super) struct KeyState {
    /// The device's static key: its credential once paired.
    pub(super) key: StaticKey,
    /// The vessel's static key, pinned when the vessel paired the device.
    pub(super) vessel: Option<PublicKey>,
    /// Whether the vessel paired this key (reconnects send `device:auth`).
    pub(super) paired: bool,
}

impl KeyState {
    /// A fresh key, no vessel pinned, not paired.
    pub(super) fn generate() -> io::Result<KeyState> {
        let key = StaticKey::generate().map_err(io::Error::other)?;
        Ok(KeyState {
            key,
            vessel: None,
            paired: false,
        })
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    format: String,
    secret: String,
    vessel: Option<String>,
    paired: bool,
}

/// The key state in `path`; `None` when the file is missing. The file is
/// read as a private file (`private_file.rs`): not through a link, owned by
/// this user, mode 0600; any other is refused, never used.
pub(super) fn read_key(path: &Path) -> io::Result<Option<KeyState>> {
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
    let key = StaticKey::from_secret(secret);
    secret.zeroize();
    let key = key.map_err(io::Error::other)?;
    let vessel =
        match disk.vessel.as_deref() {
            None => None,
            Some(hex) => Some(PublicKey::from_hex(hex).ok_or_else(|| {
                invalid("holds a vessel key that is not 64 lower-case hex digits")
            })?),
        };
    // Paired without a pin cannot be: a hand-edited file. Pairing again
    // is safe; sending the id to an unpinned vessel is not.
    let paired = disk.paired && vessel.is_some();
    Ok(Some(KeyState {
        key,
        vessel,
        paired,
    }))
}

/// Writes `state` to `path`, whole or not at all, mode 0600.
pub(super) fn write_key(path: &Path, state: &KeyState) -> io::Result<()> {
    let mut disk = OnDisk {
        format: FORMAT.to_owned(),
        secret: to_hex32(state.key.secret()),
        vessel: state.vessel.as_ref().map(PublicKey::to_hex),
        paired: state.paired,
    };
    // Room for the whole object, so no growing copy is left unwiped.
    let mut text = Zeroizing::new(Vec::with_capacity(4096));
    let written = serde_json::to_writer(&mut *text, &disk).map_err(io::Error::other);
    disk.secret.zeroize();
    written?;
    text.push(b'\n');
    write_private(path, &text)
}
