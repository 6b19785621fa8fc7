//! What only the person's own user may touch: directories made 0700 (and
//! refused when another user owns them), files written 0600 under a fresh
//! temporary name that is never a link, files read only when they are a
//! regular 0600 file of this user, and Unix sockets in such a directory,
//! which prove to a client that the vessel listening there is this user's.

use std::fs::{DirBuilder, File, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Largest private file [`read_private_file`] reads (64 KiB): a token or an
/// address file is far smaller.
pub const MAX_PRIVATE_FILE_BYTES: u64 = 64 * 1024;

/// Why a private file, directory or socket was refused or could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrivateFileError {
    /// Opening, reading, writing or creating failed.
    #[error("`{}`: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The path is a symbolic link, which is never followed.
    #[error("`{}` is a symbolic link, which dk does not follow for its private files", path.display())]
    Link {
        /// The path.
        path: PathBuf,
    },
    /// The path is not the kind of file expected there.
    #[error("`{}` is {found}, not {expected}", path.display())]
    WrongKind {
        /// The path.
        path: PathBuf,
        /// What was expected: "a regular file", "a directory", "a socket".
        expected: &'static str,
        /// What is there.
        found: &'static str,
    },
    /// Another user owns the path.
    #[error("`{}` belongs to another user (uid {owner}, while dk runs as uid {uid})", path.display())]
    NotOurs {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective user.
        uid: u32,
    },
    /// A private file that others may read or write.
    #[error("`{}` has mode {mode:04o}, not 0600: other users may read it", path.display())]
    Exposed {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A private file too large to be one of dk's.
    #[error("`{}` is larger than {max} bytes", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The most that was to be read.
        max: u64,
    },
    /// A vessel already answers on the socket.
    #[error("a vessel already runs in `{}`", dir.display())]
    AlreadyRunning {
        /// The directory of its socket.
        dir: PathBuf,
    },
}

impl PrivateFileError {
    /// True when nothing is there: the file does not exist, or nothing
    /// listens on the socket (a vessel that did not stop cleanly left it).
    pub fn is_absent(&self) -> bool {
        matches!(self, PrivateFileError::Io { source, .. }
            if matches!(source.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused))
    }

    /// An I/O failure on `path`.
    pub fn io(path: &Path, source: impl Into<io::Error>) -> PrivateFileError {
        PrivateFileError::Io {
            path: path.to_owned(),
            source: source.into(),
        }
    }
}

impl From<PrivateFileError> for io::Error {
    /// The I/O error underneath, when there is one; else the refusal as an
    /// error of its own.
    fn from(error: PrivateFileError) -> io::Error {
        match error {
            PrivateFileError::Io { source, .. } => source,
            other => io::Error::other(other),
        }
    }
}

/// What [`ensure_private_dir`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivateDir {
    /// The directory was made, with mode 0700.
    Created,
    /// It was there, this user's, with no access for others.
    Kept,
    /// It was there and this user's, but others had access: its mode was
    /// set to 0700.
    Tightened {
        /// The mode it had.
        was: u32,
    },
}

/// The effective user id of this process: who must own dk's private files.
pub fn current_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Makes `dir` (and missing parents) with mode 0700, or checks an existing
/// one: it must be a directory (a link to one is followed) owned by this
/// user, and group and other access is taken away.
pub fn ensure_private_dir(dir: &Path) -> Result<PrivateDir, PrivateFileError> {
    let created = match std::fs::metadata(dir) {
        Ok(_) => false,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| PrivateFileError::io(dir, e))?;
            true
        }
        Err(e) => return Err(PrivateFileError::io(dir, e)),
    };
    let meta = std::fs::metadata(dir).map_err(|e| PrivateFileError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(PrivateFileError::WrongKind {
            path: dir.to_owned(),
            expected: "a directory",
            found: kind_of(&meta.file_type()),
        });
    }
    owned(dir, &meta)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, Permissions::from_mode(0o700))
            .map_err(|e| PrivateFileError::io(dir, e))?;
        return Ok(PrivateDir::Tightened { was: mode });
    }
    Ok(if created {
        PrivateDir::Created
    } else {
        PrivateDir::Kept
    })
}

/// Writes `bytes` to `path`, readable by its owner only (0600), atomically:
/// into a new file of a random name beside it (created exclusively, never
/// through a link), synced, renamed over `path` (a link at `path` is
/// replaced, not followed), then the directory synced. Missing parent
/// directories are made with mode 0700.
pub fn write_private_file(path: &Path, bytes: &[u8]) -> Result<(), PrivateFileError> {
    let dir = dir_of(path);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| PrivateFileError::io(dir, e))?;
    let (temporary, mut file) = create_temporary_beside(path)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&temporary, path));
    drop(file);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(PrivateFileError::io(path, e));
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| PrivateFileError::io(dir, e))
}

/// A new empty 0600 file beside `path` (in its directory, which must
/// exist), named `.<name>.<16 random hex digits>.tmp` and
/// created exclusively, never through a link: where a whole new content is
/// written before it is renamed over `path`. The caller removes it when it
/// is not renamed.
pub fn create_temporary_beside(path: &Path) -> Result<(PathBuf, File), PrivateFileError> {
    let dir = dir_of(path);
    let Some(name) = path.file_name() else {
        return Err(PrivateFileError::io(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
        ));
    };
    let suffix = crate::hex::random(8);
    let temporary = dir.join(format!(".{}.{suffix}.tmp", name.to_string_lossy()));
    let file = create_new_private(&temporary)?;
    Ok((temporary, file))
}

/// The directory `path` is in: `.` for a bare name.
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Creates `path` with mode 0600, failing if anything (a link included) is
/// already there.
pub fn create_new_private(path: &Path) -> Result<File, PrivateFileError> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::open(path, flags, Mode::RUSR | Mode::WUSR)
        .map(File::from)
        .map_err(|e| PrivateFileError::io(path, e))
}

/// Reads `path`, which must be a regular file (not a link) of this user
/// with mode 0600, of at most [`MAX_PRIVATE_FILE_BYTES`]. Nothing is fixed:
/// a file that is not so is refused.
pub fn read_private_file(path: &Path) -> Result<Vec<u8>, PrivateFileError> {
    let mut bytes = Vec::new();
    read_private_file_into(path, MAX_PRIVATE_FILE_BYTES, &mut bytes)?;
    Ok(bytes)
}

/// Reads `path` as [`read_private_file`] does, at most `max` bytes, onto the
/// end of `bytes`, which is given room for `max + 1` more bytes before
/// anything is read, so it never moves while the file's content is in it (a
/// buffer that wipes itself when dropped leaves no unwiped copy behind).
pub fn read_private_file_into(
    path: &Path,
    max: u64,
    bytes: &mut Vec<u8>,
) -> Result<(), PrivateFileError> {
    // A clear word for what is there, before the checks that count, which
    // are made on the opened file.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_symlink() {
            return Err(PrivateFileError::Link {
                path: path.to_owned(),
            });
        }
        if !meta.is_file() {
            return Err(PrivateFileError::WrongKind {
                path: path.to_owned(),
                expected: "a regular file",
                found: kind_of(&meta.file_type()),
            });
        }
    }
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(rustix::io::Errno::LOOP) => {
            return Err(PrivateFileError::Link {
                path: path.to_owned(),
            });
        }
        Err(e) => return Err(PrivateFileError::io(path, e)),
    };
    let meta = file.metadata().map_err(|e| PrivateFileError::io(path, e))?;
    if !meta.is_file() {
        return Err(PrivateFileError::WrongKind {
            path: path.to_owned(),
            expected: "a regular file",
            found: kind_of(&meta.file_type()),
        });
    }
    owned(path, &meta)?;
    let mode = meta.mode() & 0o7777;
    if mode != 0o600 {
        return Err(PrivateFileError::Exposed {
            path: path.to_owned(),
            mode,
        });
    }
    let start = bytes.len();
    bytes.reserve(usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX));
    file.take(max.saturating_add(1))
        .read_to_end(bytes)
        .map_err(|e| PrivateFileError::io(path, e))?;
    let read = bytes.len().saturating_sub(start);
    if u64::try_from(read).unwrap_or(u64::MAX) > max {
        return Err(PrivateFileError::TooLarge {
            path: path.to_owned(),
            max,
        });
    }
    Ok(())
}

/// Whether `file` would lie inside `dir` (its parent is `dir` or below it),
/// each path made absolute and, where it exists, resolved through links: a
/// secret kept there goes wherever a copy or a backup of `dir` goes. An
/// error names the path that could not be made absolute.
pub fn is_inside(dir: &Path, file: &Path) -> Result<bool, PrivateFileError> {
    let absolute = |path: &Path| {
        std::path::absolute(path)
            .map(|path| path.components().collect::<std::path::PathBuf>())
            .map_err(|e| PrivateFileError::io(path, e))
    };
    let dir = absolute(dir)?;
    let dir = dir.canonicalize().unwrap_or(dir);
    let file = absolute(file)?;
    let parent = file
        .parent()
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.to_owned()))
        .unwrap_or_default();
    Ok(parent.starts_with(&dir))
}

/// Refuses what another user owns.
pub fn owned(path: &Path, meta: &std::fs::Metadata) -> Result<(), PrivateFileError> {
    let uid = current_uid();
    if meta.uid() == uid {
        Ok(())
    } else {
        Err(PrivateFileError::NotOurs {
            path: path.to_owned(),
            owner: meta.uid(),
            uid,
        })
    }
}

/// A file type in words.
pub fn kind_of(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_file() {
        "a regular file"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_fifo() {
        "a named pipe"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "something else"
    }
}

#[cfg(test)]
mod tests;
