//! The thread that keeps the audit head file (see `anchor.rs`) up to date
//! after every commit that appends, coalescing heads that come quickly.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::AuditHead;

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
/// keeps its sync from contending with theirs. A vessel under load commits
/// a batch every few tens of milliseconds, and each write of the file (a
/// new file synced, renamed, its directory synced) costs about a
/// millisecond and a half of CPU: a tenth of a second makes that one write
/// where it was five.
const COALESCE: Duration = Duration::from_millis(100);

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
