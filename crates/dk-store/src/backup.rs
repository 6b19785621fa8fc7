//! Online backup and restore of the SQLite store, with SQLite's backup API:
//! a copy is read in one step, inside one read transaction, so it is the
//! database as of one commit while a running vessel goes on writing; it is
//! never a copy of the database's files, which a live vessel changes under
//! the reader (the `-wal` file holds commits not yet in the main file).
//!
//! Both directions write a new private file beside the destination, sync
//! it, and rename (or link) it into place, then sync the directory: a crash
//! leaves the old file or the new one, never half of one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use super::{Cause, SqliteStore, StoreError};
use dk_files::private::create_temporary_beside;

/// Why a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The backup could not be read or written into place, or is not a dk
    /// store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The caller's check of the backup (its audit chain) failed.
    #[error("{0}")]
    Refused(String),
}

/// Pause between tries while another connection holds a lock the copy waits
/// for.
const PAUSE: Duration = Duration::from_millis(20);

/// How many times a copy is tried while locks keep it waiting.
const TRIES: u32 = 250;

impl SqliteStore {
    /// Writes a consistent copy of the database to `dest`, as of one commit,
    /// with SQLite's online backup (writers in other processes go on). The
    /// copy is one self-contained file (rollback journal mode; a store opened
    /// on it goes back to WAL), mode 0600. An existing `dest` is refused with
    /// [`StoreError::Open`] unless `replace`.
    pub fn backup_to(&self, dest: &Path, replace: bool) -> Result<(), StoreError> {
        let temporary = temporary_beside(dest)?;
        let copied = (|| {
            let mut to = open_plain(&temporary)?;
            {
                let from = self.conn();
                copy(&from, &mut to)?;
                drop(from);
            }
            to.pragma_update(None, "journal_mode", "DELETE")
                .map_err(cause)?;
            to.close().map_err(|(_, e)| cause(e))?;
            File::open(&temporary)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::Database(Cause::new(e)))?;
            put_in_place(&temporary, dest, replace)
        })();
        if copied.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        copied.map_err(|e| opening(dest, e))
    }

    /// Puts the backup at `backup` in place as the database at `db`: the
    /// backup is copied (SQLite's backup API) into a new file beside `db`,
    /// refused unless it is a dk store, brought up to this build's schema,
    /// and given to `check` (which verifies its audit chain, say); only
    /// then is it renamed over `db`, the old database's `-wal` and `-shm`
    /// removed first (after a best-effort checkpoint), so none of the old
    /// database's pages are ever read with the new one. The backup file
    /// itself is not changed. No vessel may have `db` open meanwhile: the
    /// caller makes sure of that.
    pub fn restore_from(
        backup: &Path,
        db: &Path,
        check: impl FnOnce(&SqliteStore) -> Result<(), String>,
    ) -> Result<(), RestoreError> {
        if !backup.is_file() {
            return Err(RestoreError::Store(StoreError::Corrupt(format!(
                "`{}` is not a file",
                backup.display()
            ))));
        }
        if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
            dk_files::private::ensure_private_dir(dir)
                .map_err(|e| StoreError::Database(Cause::new(e)))?;
        }
        let temporary = temporary_beside(db)?;
        let restored = (|| {
            {
                let from = Connection::open_with_flags(
                    backup,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(|e| opening(backup, cause(e)))?;
                let mut to = open_plain(&temporary)?;
                copy(&from, &mut to).map_err(|e| not_a_store(backup, e))?;
                let application: i64 = to
                    .pragma_query_value(None, "application_id", |row| row.get(0))
                    .map_err(|e| not_a_store(backup, cause(e)))?;
                if application != i64::from(super::sqlite::APPLICATION_ID) {
                    return Err(RestoreError::Store(StoreError::Corrupt(format!(
                        "`{}` is not a dk store",
                        backup.display()
                    ))));
                }
                to.close().map_err(|(_, e)| cause(e))?;
            }
            {
                let store = SqliteStore::open(&temporary)?;
                check(&store).map_err(RestoreError::Refused)?;
            }
            File::open(&temporary)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::Database(Cause::new(e)))?;
            drop_old(db);
            put_in_place(&temporary, db, true).map_err(|e| opening(db, e))?;
            Ok(())
        })();
        if restored.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        remove_sidecars(&temporary);
        restored
    }
}

/// Copies `from` into `to` in one step (all pages: one read transaction on
/// `from`), trying again while a lock is held, for at most [`TRIES`] tries.
fn copy(from: &Connection, to: &mut Connection) -> Result<(), StoreError> {
    let backup = Backup::new(from, to).map_err(cause)?;
    for _ in 0..TRIES {
        match backup.step(-1).map_err(cause)? {
            StepResult::Done => return Ok(()),
            _ => {
                std::thread::sleep(PAUSE);
            }
        }
    }
    Err(StoreError::Database(Cause::msg(format!(
        "the database stayed locked for {:?}",
        PAUSE * TRIES
    ))))
}

/// A connection on a new, empty file, without the store's settings.
fn open_plain(path: &Path) -> Result<Connection, StoreError> {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(cause)
}

/// A new empty 0600 file of a random name beside `path`.
fn temporary_beside(path: &Path) -> Result<PathBuf, StoreError> {
    path.file_name()
        .ok_or_else(|| StoreError::InvalidInput(format!("`{}` names no file", path.display())))?;
    // Named for `path`: the hidden file is the store's own business.
    let (temporary, _file) = create_temporary_beside(path).map_err(|e| {
        opening(
            path,
            StoreError::Database(Cause::new(std::io::Error::from(e))),
        )
    })?;
    Ok(temporary)
}

/// Moves `temporary` to `dest` (refused when `dest` exists, unless
/// `replace`), then syncs the directory.
fn put_in_place(temporary: &Path, dest: &Path, replace: bool) -> Result<(), StoreError> {
    let io = |e: std::io::Error| StoreError::Database(Cause::new(e));
    if replace {
        std::fs::rename(temporary, dest).map_err(io)?;
    } else {
        // A link fails when `dest` exists, so nothing there is replaced.
        std::fs::hard_link(temporary, dest).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                StoreError::InvalidInput(format!("`{}` already exists", dest.display()))
            } else {
                io(e)
            }
        })?;
        std::fs::remove_file(temporary).map_err(io)?;
    }
    let dir = match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

/// Folds the old database's `-wal` into it where it can, then removes its
/// `-wal` and `-shm`, which must never be read with another main file.
fn drop_old(db: &Path) {
    if db.exists()
        && let Ok(conn) = Connection::open_with_flags(
            db,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    {
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        let _ = conn.close();
    }
    remove_sidecars(db);
}

fn remove_sidecars(db: &Path) {
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
}

fn cause(error: rusqlite::Error) -> StoreError {
    StoreError::Database(Cause::new(error))
}

fn opening(path: &Path, error: StoreError) -> StoreError {
    match error {
        StoreError::Database(reason) => StoreError::Open {
            path: path.display().to_string(),
            reason,
        },
        other => other,
    }
}

fn not_a_store(path: &Path, error: StoreError) -> RestoreError {
    RestoreError::Store(StoreError::Corrupt(format!(
        "`{}` is not a dk store: {error}",
        path.display()
    )))
}
