//! What a writer is told and given: its bounds ([`WriterOptions`] and the
//! constants), what a deferred record makes ([`Made`]), and the observer of
//! its commits.

use std::time::Duration;

use crate::{AuditEvent, AuditText};

/// How long [`AuditWriter::record`](crate::AuditWriter::record) waits for a place in a full queue before
/// it queues its event past the bound.
pub const RECORD_PATIENCE: Duration = Duration::from_millis(100);

/// How many times a stopping writer tries to commit what it still holds.
pub const STOP_ATTEMPTS: u32 = 3;

/// How recently the store must have taken a write, and how old the oldest
/// event not yet committed may be, for a call to reach a device, by default.
pub const DEFAULT_DURABLE_WITHIN: Duration = Duration::from_secs(1);

/// The shortest bound a writer keeps: its probe runs every quarter of it.
pub(super) const MIN_DURABLE_WITHIN: Duration = Duration::from_millis(40);

/// The wait before the first retry of a failed commit; it doubles up to
/// [`LAST_RETRY`].
pub(super) const FIRST_RETRY: Duration = Duration::from_millis(10);
pub(super) const LAST_RETRY: Duration = Duration::from_secs(1);

/// How an [`AuditWriter`](crate::AuditWriter) batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// The most events committed in one transaction (default 2,048), while
    /// commits succeed. Past a few hundred, a larger batch mostly saves the
    /// commit's fixed cost (the WAL sync, the pages every commit rewrites);
    /// under a steady load `max_delay` bounds a batch before this does.
    pub max_batch: usize,
    /// How long the first event of a batch waits for others before the
    /// batch is committed (default 20 ms).
    pub max_delay: Duration,
    /// How many events may wait to be committed (default 65,536); with
    /// every place taken, a tool call waits for one before its checks.
    pub queue: usize,
    /// How recently the store must have shown that it takes writes, and
    /// how old the oldest event not yet committed may be, for
    /// [`AuditRoom::accepting`](crate::AuditRoom::accepting) (default [`DEFAULT_DURABLE_WITHIN`], at
    /// least 40 ms). Without a commit for a quarter of it, the writer
    /// probes the store.
    pub durable_within: Duration,
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions {
            max_batch: 2048,
            max_delay: Duration::from_millis(20),
            queue: 65_536,
            durable_within: DEFAULT_DURABLE_WITHIN,
        }
    }
}

/// What a record deferred to the writer thread makes: an event, or its
/// text already (a decision's, written straight from its record). An event
/// no store can take is recorded as `unstorable`.
#[derive(Debug, Clone, PartialEq)]
pub enum Made {
    /// An event, made text on the writer thread.
    Event(AuditEvent),
    /// An event's text.
    Text(AuditText),
}

impl From<AuditEvent> for Made {
    fn from(event: AuditEvent) -> Made {
        Made::Event(event)
    }
}

impl From<AuditText> for Made {
    fn from(text: AuditText) -> Made {
        Made::Text(text)
    }
}

/// What [`AuditWriter::observe_commits`] was given.
pub(super) struct CommitObserver(pub(super) Box<dyn Fn(Duration) + Send + Sync>);

impl std::fmt::Debug for CommitObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitObserver(..)")
    }
}
