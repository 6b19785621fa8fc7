//! Reading a file that must be the device's own, by the rules the vessel
//! reads its private files with (dk-store's `private.rs`, which dk-device
//! may not depend on): opened without following a link (`O_NOFOLLOW`), a
//! regular file, owned by this process's user, mode 0600, at most a given
//! size. A file that breaks a rule is refused, naming what is wrong, and
//! never fixed or used: a key file planted by another user (or a link to
//! one) would make whoever planted it the device once the person pairs.

use std::fs::File;
use std::io::{self, Read as _};
use std::path::Path;

use zeroize::Zeroizing;

/// The bytes of the private file at `path`, wiped from memory when dropped;
/// `None` when nothing is there. At most `max` bytes are read; a larger
/// file is refused.
pub(super) fn read_private(path: &Path, max: u64) -> io::Result<Option<Zeroizing<Vec<u8>>>> {
    let refused = |why: String| io::Error::new(io::ErrorKind::PermissionDenied, why);
    // A clear word for a link or another kind of file first; the checks that
    // count are made on the opened file.
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(refused(link()));
        }
        Ok(_) => {}
    }
    let file = match open_no_follow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if is_loop(&e) => return Err(refused(link())),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(format!(
            "is {}, not a regular file",
            kind_of(&meta.file_type())
        )));
    }
    check_owner_and_mode(&meta).map_err(refused)?;
    // Room for the whole file up front, so the buffer never moves and
    // leaves no unwiped copy behind.
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
fn link() -> String {
    "is a symbolic link, which dk does not follow for a device's private file: put the file itself there".to_owned()
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    rustix::fs::open(path, flags, Mode::empty())
        .map(File::from)
        .map_err(io::Error::from)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> io::Result<File> {
    File::open(path)
}

#[cfg(unix)]
fn is_loop(error: &io::Error) -> bool {
    error.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

#[cfg(not(unix))]
fn is_loop(_error: &io::Error) -> bool {
    false
}

/// Refuses a file another user owns, or that others may read or write
/// (any mode but 0600).
#[cfg(unix)]
fn check_owner_and_mode(meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let uid = rustix::process::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(format!(
            "belongs to another user (uid {}, while the device runs as uid {uid}): whoever owns it could be the device; remove it and pair again",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o600 {
        return Err(format!(
            "has mode {mode:04o}, not 0600: other users may have read or replaced it; if it is yours and nobody else could reach it, chmod 600 it, else remove it and pair again"
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner_and_mode(_meta: &std::fs::Metadata) -> Result<(), String> {
    Ok(())
}

/// A file type in words.
fn kind_of(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}
