//! The audit chain's head kept outside the database: a small file holding
//! `SEQ:HASH` of the last committed entry, rewritten after every commit
//! that appends (atomically: a new file under a random name, created
//! exclusively with mode 0600, synced, then renamed over the old one).
//! A [`HeadKeeper`] thread does the writing, so a commit does not wait for
//! a second disk sync: the file may lag the log by the commits of the last
//! few milliseconds (several coalesced into one write), never run ahead of
//! it, and is up to date once the keeper is dropped.
//!
//! By default it lies beside the data directory, not in it:
//! `<parent>/<name>.audit-head` for a data directory `<parent>/<name>`
//! ([`audit_head_file`]), so copying or replacing the data directory does
//! not carry it along. Against it, entries cut off the end of the log, and a
//! chain rewritten with recomputed hashes, are found.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{AuditHead, StoreError};

/// The largest head file read: `SEQ:HASH` and a newline fit many times.
const MAX_HEAD_FILE: u64 = 1024;

/// Where the audit head of the data directory `data_dir` is kept by
/// default: beside it, `<parent>/<name>.audit-head` (for
/// `~/.local/share/dk/vessel`, `~/.local/share/dk/vessel.audit-head`).
/// `None` for a path without a final name (such as `/`).
pub fn audit_head_file(data_dir: &Path) -> Option<PathBuf> {
    let name = data_dir.file_name()?;
    let mut file = name.to_owned();
    file.push(".audit-head");
    Some(data_dir.with_file_name(file))
}

impl fmt::Display for AuditHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

/// Why a text is not an [`AuditHead`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an audit head is SEQ:HASH, a number and 64 lower-case hex characters")]
pub struct HeadSyntaxError;

impl FromStr for AuditHead {
    type Err = HeadSyntaxError;

    /// `SEQ:HASH`, surrounding white space ignored.
    fn from_str(text: &str) -> Result<AuditHead, HeadSyntaxError> {
        let (seq, hash) = text.trim().split_once(':').ok_or(HeadSyntaxError)?;
        let seq = seq.parse().map_err(|_| HeadSyntaxError)?;
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if hash.len() != 64 || !hash.bytes().all(hex) {
            return Err(HeadSyntaxError);
        }
        Ok(AuditHead {
            seq,
            hash: hash.to_owned(),
        })
    }
}

impl AuditHead {
    /// The head kept in `path`, or `None` when there is no such file. A
    /// file that is not a regular file, cannot be read or does not hold
    /// `SEQ:HASH` is an error.
    pub fn read_from(path: &Path) -> Result<Option<AuditHead>, StoreError> {
        let refused = |reason: String| StoreError::HeadFile {
            path: path.display().to_string(),
            reason,
        };
        let metadata = match std::fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(refused(error.to_string())),
        };
        if !metadata.is_file() {
            return Err(refused("it is not a regular file".to_owned()));
        }
        if metadata.len() > MAX_HEAD_FILE {
            return Err(refused(format!("it is {} bytes long", metadata.len())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| refused(e.to_string()))?;
        text.parse()
            .map(Some)
            .map_err(|error: HeadSyntaxError| refused(error.to_string()))
    }

    /// Keeps this head in `path`, replacing what was there at once, mode
    /// 0600, never through a link (see [`crate::write_private_file`]).
    pub(crate) fn write_to(&self, path: &Path) -> std::io::Result<()> {
        crate::unix::write_private_file(path, format!("{self}\n").as_bytes())
            .map_err(std::io::Error::from)
    }
}

/// What the keeper thread is asked to do.
#[derive(Debug, Default)]
struct Keeping {
    /// The newest head not yet written.
    next: Option<AuditHead>,
    /// Heads handed over and written (or failed), counted.
    handed: u64,
    written: u64,
    /// Someone waits in [`HeadKeeper::settle`]: write without waiting for
    /// more heads.
    settling: bool,
    stop: bool,
}

#[derive(Debug, Default)]
struct Shared {
    keeping: Mutex<Keeping>,
    /// Told when there is a head to write, a head was written, or stop.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Keeping> {
        self.keeping.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps the newest head it is given in its file, on its own thread.
/// Dropping it writes the last head and joins the thread.
#[derive(Debug)]
pub(crate) struct HeadKeeper {
    file: PathBuf,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl HeadKeeper {
    /// Starts the thread keeping heads in `file`. Without a thread (it
    /// could not start), each head is written by the caller.
    pub fn start(file: PathBuf) -> HeadKeeper {
        let shared = Arc::new(Shared::default());
        let (thread_shared, thread_file) = (Arc::clone(&shared), file.clone());
        let thread = std::thread::Builder::new()
            .name("dk-audit-head".to_owned())
            .spawn(move || keep_heads(&thread_shared, &thread_file));
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::error!(%error, "cannot start the audit head thread: heads are written inline");
                None
            }
        };
        HeadKeeper {
            file,
            shared,
            thread,
        }
    }

    /// The file heads are kept in.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Hands over the head of a commit just made; heads are handed over in
    /// the order of their commits.
    pub fn keep(&self, head: AuditHead) {
        if self.thread.is_none() {
            write_logged(&head, &self.file, &mut false);
            return;
        }
        let mut keeping = self.shared.lock();
        keeping.next = Some(head);
        keeping.handed += 1;
        drop(keeping);
        self.shared.changed.notify_all();
    }

    /// Waits until every head handed over so far is written.
    pub fn settle(&self) {
        if self.thread.is_none() {
            return;
        }
        let mut keeping = self.shared.lock();
        let target = keeping.handed;
        keeping.settling = true;
        self.shared.changed.notify_all();
        while keeping.written < target {
            keeping = self
                .shared
                .changed
                .wait(keeping)
                .unwrap_or_else(PoisonError::into_inner);
        }
        keeping.settling = false;
    }
}

impl Drop for HeadKeeper {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the audit head thread panicked");
        }
    }
}

/// How long the keeper lets heads come after the first of a burst before
/// it writes the newest: commits in quick succession make one write, which
/// keeps its sync from contending with theirs.
const COALESCE: Duration = Duration::from_millis(5);

/// The keeper thread: writes the newest head handed over until stopped,
/// the last one included.
fn keep_heads(shared: &Shared, file: &Path) {
    let mut failing = false;
    loop {
        let (head, handed) = {
            let mut keeping = shared.lock();
            while keeping.next.is_none() && !keeping.stop {
                keeping = shared
                    .changed
                    .wait(keeping)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let deadline = Instant::now() + COALESCE;
            while !keeping.stop && !keeping.settling {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                keeping = shared
                    .changed
                    .wait_timeout(keeping, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            match keeping.next.take() {
                Some(head) => (head, keeping.handed),
                None => return,
            }
        };
        write_logged(&head, file, &mut failing);
        shared.lock().written = handed;
        shared.changed.notify_all();
    }
}

/// Writes `head` to `file`, logging the first failure of a run of them and
/// the recovery after it.
fn write_logged(head: &AuditHead, file: &Path, failing: &mut bool) {
    match head.write_to(file) {
        Ok(()) if *failing => {
            *failing = false;
            tracing::info!(file = %file.display(), "the audit head is kept again");
        }
        Ok(()) => {}
        Err(error) => {
            if !*failing {
                tracing::error!(%error, file = %file.display(), "cannot keep the audit head");
            }
            *failing = true;
        }
    }
}
