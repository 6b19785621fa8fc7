//! The files that make a vessel itself across restarts: its dk/2 static
//! key (made once, moved out of an old data directory, never inside it)
//! and its admin token, each recorded in the audit log when made.

use std::path::{Path, PathBuf};

use dk_core::Vessel;
use dk_files::private::{PrivateFileError, is_inside, read_private_file, write_private_file};
use dk_http::{AdminToken, AdminTokenError};
use dk_store::Store;
use dk_store::entry as schema;

use super::error::ServerError;
use super::files::{OLD_VESSEL_KEY_FILE, VESSEL_KEY, vessel_key_file};

/// The vessel key's file: the one named, else the one beside `data_dir`.
pub(super) fn key_file_of(data_dir: &Path, named: Option<PathBuf>) -> Result<PathBuf, ServerError> {
    match named {
        Some(file) => Ok(file),
        None => vessel_key_file(data_dir).ok_or_else(|| {
            ServerError::VesselKeyPlace(format!(
                "the data directory `{}` has no name to put the vessel key file beside: name one",
                data_dir.display()
            ))
        }),
    }
}

/// The audit entry of the vessel's key when this start made or moved it.
pub(super) fn record_key(
    vessel: &Vessel,
    made_key: Made,
    moved_key: Option<&Path>,
    key_file: &Path,
    fingerprint: &str,
) {
    let fingerprint = fingerprint.to_owned();
    match (made_key, moved_key) {
        (Made::New, _) => vessel.record(schema::VesselKey::made(fingerprint)),
        (Made::Replacing, _) => vessel.record(schema::VesselKey::replaced(fingerprint)),
        (Made::Kept, Some(old)) => vessel.record(schema::VesselKey::moved(
            old.display().to_string(),
            key_file.display().to_string(),
            fingerprint,
        )),
        (Made::Kept, None) => {}
    }
}

/// Whether the vessel's key was made at this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Made {
    /// The key file's key.
    Kept,
    /// A first key, for a data directory that had none.
    New,
    /// A new key where devices had pinned another (`new_vessel_key`).
    Replacing,
}

/// The key in `path`, parsed; a file that holds no key is refused.
pub(super) fn parse_key(path: &Path, bytes: &[u8]) -> Result<dk_channel::StaticKey, ServerError> {
    let shown = || path.display().to_string();
    let text = std::str::from_utf8(bytes).map_err(|_| ServerError::NotAVesselKey(shown()))?;
    let secret = dk_channel::from_hex32(text.trim_end_matches('\n'))
        .ok_or_else(|| ServerError::NotAVesselKey(shown()))?;
    dk_channel::StaticKey::from_secret(secret).map_err(|_| ServerError::NotAVesselKey(shown()))
}

/// The SHA-256 of a key's public half, as the store keeps it.
pub(super) fn public_hash(key: &dk_channel::StaticKey) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(key.public().as_bytes()).into()
}

/// The vessel's static key kept in `path`, or a new one written there
/// (0600) when there is none and none was pinned; how it came. A file that
/// is not private or holds no key is refused, never replaced: devices
/// pinned the key it holds. A missing file where the store says devices
/// pinned a key is refused unless `new_key` (a copy of the data directory
/// without the key is not the vessel the devices paired with); a key the
/// store does not know as this data directory's is refused.
pub(super) fn vessel_key(
    store: &dyn Store,
    path: &Path,
    new_key: bool,
) -> Result<(dk_channel::StaticKey, Made), ServerError> {
    let shown = || path.display().to_string();
    let kept = store.secret_hash(VESSEL_KEY)?;
    match read_private_file(path) {
        Ok(_) if new_key => Err(ServerError::VesselKeyKept(shown())),
        Ok(bytes) => {
            let key = parse_key(path, &bytes)?;
            let hash = public_hash(&key);
            match kept {
                Some(kept) if kept != hash => Err(ServerError::AnotherVesselKey {
                    path: shown(),
                    fingerprint: key.public().fingerprint(),
                }),
                Some(_) => Ok((key, Made::Kept)),
                None => {
                    store.put_secret_hash(VESSEL_KEY, hash)?;
                    Ok((key, Made::Kept))
                }
            }
        }
        Err(e) if e.is_absent() => {
            let pinned = store
                .load()?
                .pairings
                .iter()
                .filter(|p| p.device_key.is_some())
                .count();
            let had_one = kept.is_some() || pinned > 0;
            if had_one && !new_key {
                return Err(ServerError::MissingVesselKey {
                    path: shown(),
                    pinned,
                });
            }
            let key = dk_channel::StaticKey::generate()
                .map_err(|e| ServerError::NoRandomness(e.to_string()))?;
            let text = format!("{}\n", dk_channel::to_hex32(key.secret()));
            write_private_file(path, text.as_bytes()).map_err(ServerError::VesselKey)?;
            store.put_secret_hash(VESSEL_KEY, public_hash(&key))?;
            Ok((key, if had_one { Made::Replacing } else { Made::New }))
        }
        Err(e) => Err(ServerError::VesselKey(e)),
    }
}

/// Moves a key an older dk left in the data directory to `key_file`
/// (written 0600 atomically, then the old one removed and the directory
/// synced); the old path when it did. The same key in both places only
/// loses the old copy; two different keys are refused.
pub(super) fn move_old_key(
    data_dir: &Path,
    key_file: &Path,
) -> Result<Option<PathBuf>, ServerError> {
    let old = data_dir.join(OLD_VESSEL_KEY_FILE);
    if std::fs::symlink_metadata(&old).is_err() {
        return Ok(None);
    }
    let bytes = read_private_file(&old).map_err(ServerError::VesselKey)?;
    let key = parse_key(&old, &bytes)?;
    match read_private_file(key_file) {
        Ok(there) => {
            let same = parse_key(key_file, &there)?;
            if same.secret() != key.secret() {
                return Err(ServerError::TwoVesselKeys {
                    old: old.display().to_string(),
                    new: key_file.display().to_string(),
                });
            }
        }
        Err(e) if e.is_absent() => {
            write_private_file(key_file, &bytes).map_err(ServerError::VesselKey)?;
        }
        Err(e) => return Err(ServerError::VesselKey(e)),
    }
    std::fs::remove_file(&old)
        .and_then(|()| std::fs::File::open(data_dir)?.sync_all())
        .map_err(|e| ServerError::VesselKey(PrivateFileError::io(&old, e)))?;
    Ok(Some(old))
}

/// Refuses a key file inside the data directory, which a copy or a backup
/// of it would carry.
pub(super) fn refuse_inside(data_dir: &Path, key_file: &Path) -> Result<(), ServerError> {
    if is_inside(data_dir, key_file).map_err(|e| ServerError::VesselKeyPlace(e.to_string()))? {
        return Err(ServerError::VesselKeyPlace(format!(
            "the vessel key file `{}` is inside the data directory `{}`: keep it outside, where a copy of the data directory does not take it",
            key_file.display(),
            data_dir.display()
        )));
    }
    Ok(())
}

/// The admin token: the one in `path` when the store holds its hash; else a
/// new one, written to `path` (0600) with only its hash in the store.
/// Without a file, a new one each time, its hash not kept. Returns whether
/// an earlier token was replaced.
pub(super) fn admin_token(
    store: &dyn Store,
    name: &str,
    path: Option<&Path>,
) -> Result<(AdminToken, bool), ServerError> {
    let Some(path) = path else {
        return Ok((AdminToken::generate(), false));
    };
    let kept = store.secret_hash(name)?;
    let on_file = match AdminToken::read_from(path) {
        Ok(token) => Some(token),
        Err(AdminTokenError::NotAToken { .. }) => None,
        Err(AdminTokenError::File(e)) if e.is_absent() => None,
        Err(AdminTokenError::File(e)) => return Err(ServerError::AdminTokenFile(e)),
        Err(other) => return Err(ServerError::AdminToken(other)),
    };
    if let (Some(hash), Some(token)) = (kept, &on_file)
        && token.hash() == hash
    {
        return Ok((token.clone(), false));
    }
    let token = match (kept, on_file) {
        (None, Some(token)) => token,
        _ => AdminToken::generate(),
    };
    token.write_to(path).map_err(ServerError::AdminTokenWrite)?;
    store.put_secret_hash(name, token.hash())?;
    Ok((token, kept.is_some()))
}
