//! The space a store keeps in reserve against a full disk: a file of its
//! own beside the database (`disk-reserve` in the vessel's data directory,
//! [`DEFAULT_RESERVE_BYTES`]), made when the store opens, while the file
//! system has room for it and [`DEFAULT_ROOM_BYTES`] more.
//!
//! When a write fails because the disk is full, the audit writer has the
//! store release it ([`Store::release_reserve`](crate::Store::release_reserve)):
//! the file is removed, its space is free again, and the decisions already
//! queued (every call that reached a device among them) are committed into
//! it, while no further call reaches a device. The reserve is made again
//! ([`Store::restore_reserve`](crate::Store::restore_reserve)) once the file
//! system has room for it and as much more again as a start wants: calls
//! then reach devices again. A vessel does not start without it.
//!
//! The file's blocks are allocated (`fallocate`), not a sparse file; where
//! the file system cannot allocate them so, they are written with bytes a
//! compressing file system cannot shrink.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rand::RngExt;
use rustix::fs::{FallocateFlags, Mode, OFlags};

use crate::Cause;

/// The reserve file's name in the data directory.
pub const RESERVE_FILE: &str = "disk-reserve";

/// How much a vessel keeps in reserve by default: 4 MiB, room for the
/// decisions of some thousands of calls (one commit's pages and the rest of
/// the queue) once the disk is full.
pub const DEFAULT_RESERVE_BYTES: u64 = 4 * 1024 * 1024;

/// How much free space a vessel wants beside its reserve, by default, to
/// start and to take calls again after the disk was full: 1 MiB, for the
/// writes of a start and the store's first commits. Below it, a write that
/// fails is taken for the disk being full.
pub const DEFAULT_ROOM_BYTES: u64 = 1024 * 1024;

/// What a write of the reserve writes at a time, where it cannot be
/// allocated at once.
const CHUNK: usize = 64 * 1024;

/// Why the reserve was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReserveError {
    /// The file system has less free space than the reserve (what is
    /// missing of it) and the room to work in.
    #[error(
        "not enough free space for the store in `{dir}`: {} free, {} needed ({} for the disk reserve `{file}`, {} to work in); free space on that disk, then start again",
        mib(*free),
        mib(*needed),
        mib(*reserve),
        mib(*room)
    )]
    NoRoom {
        /// The directory the reserve is kept in.
        dir: String,
        /// The reserve file.
        file: String,
        /// The free space there, in bytes.
        free: u64,
        /// What is needed there, in bytes: `reserve` and `room`.
        needed: u64,
        /// What is missing of the reserve, in bytes.
        reserve: u64,
        /// The room to work in, in bytes.
        room: u64,
    },
    /// The file system refused something else: the reserve file is not a
    /// regular file, or could not be written.
    #[error("cannot keep the disk reserve `{file}`: {reason}")]
    File {
        /// The reserve file.
        file: String,
        /// The file system's error.
        #[source]
        reason: Cause,
    },
}

/// `bytes` in MiB, to a tenth.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A reserve file: its path, its size, and the room wanted beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskReserve {
    file: PathBuf,
    bytes: u64,
    room: u64,
}

impl DiskReserve {
    /// A reserve of `bytes` in `file`, wanting `room` more free beside it.
    pub fn new(file: impl Into<PathBuf>, bytes: u64, room: u64) -> DiskReserve {
        DiskReserve {
            file: file.into(),
            bytes,
            room,
        }
    }

    /// The default reserve of the data directory `data_dir`:
    /// [`RESERVE_FILE`] in it, [`DEFAULT_RESERVE_BYTES`], wanting
    /// [`DEFAULT_ROOM_BYTES`] beside it.
    pub fn of_data_dir(data_dir: &Path) -> DiskReserve {
        DiskReserve::new(
            data_dir.join(RESERVE_FILE),
            DEFAULT_RESERVE_BYTES,
            DEFAULT_ROOM_BYTES,
        )
    }

    /// The reserve file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The reserve's size, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The directory the file is in.
    fn dir(&self) -> &Path {
        match self.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        }
    }

    /// Makes the reserve whole, when the file system has room for what is
    /// missing of it and the room to work in beside it; nothing to do when
    /// it is whole already (and the room is there). A file half made is
    /// removed.
    pub fn make(&self) -> Result<(), ReserveError> {
        let refused = |reason: Cause| ReserveError::File {
            file: self.file.display().to_string(),
            reason,
        };
        let held = match std::fs::symlink_metadata(&self.file) {
            Ok(metadata) if metadata.is_file() => metadata.len(),
            Ok(_) => return Err(refused(Cause::msg("it is not a regular file"))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => 0,
            Err(error) => return Err(refused(Cause::new(error))),
        };
        let free = free_space(self.dir()).map_err(|error| refused(Cause::new(error)))?;
        let missing = self.bytes.saturating_sub(held);
        let needed = missing.saturating_add(self.room);
        if free < needed {
            return Err(self.no_room(free, missing));
        }
        if missing == 0 {
            return Ok(());
        }
        match self.allocate(held) {
            Ok(()) => Ok(()),
            Err(error) => {
                let _ = std::fs::remove_file(&self.file);
                if error.kind() == io::ErrorKind::StorageFull {
                    let free = free_space(self.dir()).unwrap_or(0);
                    return Err(self.no_room(free, self.bytes));
                }
                Err(refused(Cause::new(error)))
            }
        }
    }

    fn no_room(&self, free: u64, missing: u64) -> ReserveError {
        ReserveError::NoRoom {
            dir: self.dir().display().to_string(),
            file: self.file.display().to_string(),
            free,
            needed: missing.saturating_add(self.room),
            reserve: missing,
            room: self.room,
        }
    }

    /// Allocates the file's blocks past `held` bytes, and syncs it.
    fn allocate(&self, held: u64) -> io::Result<()> {
        let fd = rustix::fs::open(
            &self.file,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        match rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, self.bytes) {
            Ok(()) => {}
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {
                let mut file = File::from(fd);
                write_incompressible(&mut file, held, self.bytes)?;
                return file.sync_all();
            }
            Err(error) => return Err(error.into()),
        }
        File::from(fd).sync_all()
    }

    /// Removes the reserve file, freeing its space: true when it was there.
    pub fn release(&self) -> bool {
        match std::fs::remove_file(&self.file) {
            Ok(()) => true,
            Err(error) if error.kind() == io::ErrorKind::NotFound => false,
            Err(error) => {
                tracing::error!(%error, file = %self.file.display(), "cannot release the disk reserve");
                false
            }
        }
    }

    /// Whether the file system has less free space than the room wanted
    /// beside the reserve (or cannot say how much): a write that failed
    /// then failed because the disk is full.
    pub fn low(&self) -> bool {
        free_space(self.dir()).map_or(true, |free| free < self.room)
    }

    /// How much free space the file system of the reserve has now, in
    /// bytes, for what a person is told.
    pub fn free(&self) -> u64 {
        free_space(self.dir()).unwrap_or(0)
    }

    /// The room wanted beside the reserve, in bytes.
    pub fn room(&self) -> u64 {
        self.room
    }

    /// What a person should free for calls to reach devices again, as
    /// words: how much, and where.
    pub fn wanted(&self) -> String {
        format!(
            "{} free in `{}` (the disk reserve and {} to work in)",
            mib(self.bytes.saturating_add(self.room)),
            self.dir().display(),
            mib(self.room)
        )
    }
}

/// The space an unprivileged process may still take on the file system of
/// `dir`, in bytes.
fn free_space(dir: &Path) -> io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Writes bytes a compressing file system cannot shrink into `file` from
/// `from` to `to`.
fn write_incompressible(file: &mut File, from: u64, to: u64) -> io::Result<()> {
    use std::io::Seek;
    let mut chunk = vec![0_u8; CHUNK];
    rand::rng().fill(&mut chunk[..]);
    file.seek(io::SeekFrom::Start(from))?;
    let mut left = to.saturating_sub(from);
    while left > 0 {
        let take = usize::try_from(left).map_or(CHUNK, |left| left.min(CHUNK));
        file.write_all(chunk.get(..take).unwrap_or(&chunk))?;
        left = left.saturating_sub(take as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_made_whole_once_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let reserve = DiskReserve::new(dir.path().join(RESERVE_FILE), 256 * 1024, 4096);
        reserve.make().unwrap();
        let metadata = std::fs::metadata(reserve.file()).unwrap();
        assert_eq!(metadata.len(), 256 * 1024);
        // Allocated, not sparse.
        use std::os::unix::fs::MetadataExt;
        assert!(metadata.blocks() * 512 >= 256 * 1024, "{metadata:?}");
        assert_eq!(metadata.mode() & 0o777, 0o600);
        // Whole already: nothing to do.
        reserve.make().unwrap();
        assert!(reserve.release());
        assert!(!reserve.file().exists());
        assert!(!reserve.release());
        // A file cut short is made whole again.
        std::fs::write(reserve.file(), b"short").unwrap();
        reserve.make().unwrap();
        assert_eq!(std::fs::metadata(reserve.file()).unwrap().len(), 256 * 1024);
    }

    #[test]
    fn no_room_says_where_how_much_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        // More room wanted than any disk of a test machine has.
        let reserve = DiskReserve::new(dir.path().join(RESERVE_FILE), 4 << 20, u64::MAX / 2);
        let error = reserve.make().unwrap_err();
        let ReserveError::NoRoom {
            reserve: missing, ..
        } = &error
        else {
            panic!("{error}");
        };
        assert_eq!(*missing, 4 << 20);
        let said = error.to_string();
        assert!(
            said.contains(&format!("`{}`", dir.path().display())),
            "{said}"
        );
        assert!(said.contains("4.0 MiB for the disk reserve"), "{said}");
        assert!(
            said.contains("free space on that disk, then start again"),
            "{said}"
        );
        assert!(!reserve.file().exists());
        assert!(reserve.low());
    }

    #[test]
    fn a_reserve_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(RESERVE_FILE);
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &file).unwrap();
        let error = DiskReserve::new(&file, 4096, 0).make().unwrap_err();
        assert!(matches!(error, ReserveError::File { .. }), "{error}");
        assert!(!dir.path().join("elsewhere").exists());
    }
}
