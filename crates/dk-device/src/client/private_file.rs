//! Reading a file that must be the device's own, by the rules the vessel
//! reads its private files with (dk-files' `private`): opened without
//! following a link (`O_NOFOLLOW`), a regular file, owned by this process's
//! user, mode 0600, at most a given size. A file that breaks a rule is
//! refused, naming what is wrong and what to do, and never fixed or used: a
//! key file planted by another user (or a link to one) would make whoever
//! planted it the device once the person pairs.

use std::io;
use std::path::Path;

use zeroize::Zeroizing;

/// The bytes of the private file at `path`, wiped from memory when dropped;
/// `None` when nothing is there. At most `max` bytes are read; a larger
/// file is refused.
#[cfg(unix)]
pub(super) fn read_private(path: &Path, max: u64) -> io::Result<Option<Zeroizing<Vec<u8>>>> {
    use dk_files::private::{PrivateFileError, read_private_file_into};
    let refused = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, why);
    let mut bytes = Zeroizing::new(Vec::new());
    match read_private_file_into(path, max, &mut bytes) {
        Ok(()) => Ok(Some(bytes)),
        Err(absent) if absent.is_absent() => Ok(None),
        Err(PrivateFileError::Link { .. }) => Err(refused(link())),
        Err(PrivateFileError::WrongKind { found, .. }) => {
            Err(refused(format!("is {found}, not a regular file")))
        }
        Err(PrivateFileError::NotOurs { owner, uid, .. }) => Err(refused(format!(
            "belongs to another user (uid {owner}, while the device runs as uid {uid}): whoever owns it could be the device; remove it and pair again"
        ))),
        Err(PrivateFileError::Exposed { mode, .. }) => Err(refused(format!(
            "has mode {mode:04o}, not 0600: other users may have read or replaced it; if it is yours and nobody else could reach it, chmod 600 it, else remove it and pair again"
        ))),
        Err(PrivateFileError::TooLarge { max, .. }) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is larger than {max} bytes"),
        )),
        Err(other) => Err(io::Error::from(other)),
    }
}

/// The bytes of the file at `path`, wiped from memory when dropped; `None`
/// when nothing is there. At most `max` bytes are read; a larger file is
/// refused. (No owner or mode to check off Unix.)
#[cfg(not(unix))]
pub(super) fn read_private(path: &Path, max: u64) -> io::Result<Option<Zeroizing<Vec<u8>>>> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let capacity = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
    let mut bytes = Zeroizing::new(Vec::with_capacity(capacity));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is larger than {max} bytes"),
        ));
    }
    Ok(Some(bytes))
}

/// What a link is told.
#[cfg(unix)]
fn link() -> String {
    "is a symbolic link, which dk does not follow for a device's private file: put the file itself there".to_owned()
}
