//! The write-behind audit writer: decision events are queued without
//! waiting and committed in batches by one thread, so a tool call never
//! waits for a disk sync.
//!
//! What a crash can lose: the events queued or in the batch being
//! gathered, at most `max_delay` plus one commit's worth of decisions. It
//! never holds a pairing, grant, revoke or unpair: those are written by the
//! store in the transaction of the change, before it is acknowledged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{AuditEvent, Store, StoreError};

/// How an [`AuditWriter`] batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// The most events committed in one transaction (default 256).
    pub max_batch: usize,
    /// How long the first event of a batch waits for others before the
    /// batch is committed (default 20 ms).
    pub max_delay: Duration,
    /// How many events may wait in the queue (default 65,536); past this,
    /// [`AuditWriter::record`] drops the event and counts it.
    pub queue: usize,
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions {
            max_batch: 256,
            max_delay: Duration::from_millis(20),
            queue: 65_536,
        }
    }
}

enum Message {
    Event(AuditEvent),
    /// An event built on the writer thread, off the caller's path.
    Deferred(Box<dyn FnOnce() -> Option<AuditEvent> + Send>),
    /// Commit what came before, then answer.
    Flush(mpsc::Sender<Result<(), StoreError>>),
}

/// Counters shared with the writer thread.
#[derive(Debug, Default)]
struct Counters {
    dropped: AtomicU64,
    committed: AtomicU64,
    batches: AtomicU64,
}

/// Commits audit events in batches on its own thread. [`AuditWriter::record`]
/// never blocks; [`AuditWriter::flush`] waits for everything recorded before
/// it. Dropping the writer flushes and joins the thread.
#[derive(Debug)]
pub struct AuditWriter {
    sender: Option<SyncSender<Message>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl AuditWriter {
    /// Starts the writer thread over `store`.
    pub fn start(store: Arc<dyn Store>, options: WriterOptions) -> AuditWriter {
        let (sender, receiver) = mpsc::sync_channel(options.queue.max(1));
        let counters = Arc::new(Counters::default());
        let shared = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("dk-audit-writer".to_owned())
            .spawn(move || run(&*store, &receiver, options, &shared));
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::error!(%error, "cannot start the audit writer thread");
                None
            }
        };
        AuditWriter {
            sender: thread.as_ref().map(|_| sender),
            thread,
            counters,
        }
    }

    /// Queues an event without waiting. When the queue is full (or the
    /// writer has stopped) the event is dropped, counted in
    /// [`AuditWriter::dropped`] and logged.
    pub fn record(&self, event: AuditEvent) {
        self.send(Message::Event(event));
    }

    /// Like [`AuditWriter::record`], but the event is built by `make` on the
    /// writer thread: the caller pays for a move and a queue push, not for
    /// serialising or redacting. `make` returning `None` records nothing.
    pub fn record_with(&self, make: impl FnOnce() -> Option<AuditEvent> + Send + 'static) {
        self.send(Message::Deferred(Box::new(make)));
    }

    fn send(&self, message: Message) {
        let sent = match &self.sender {
            Some(sender) => sender.try_send(message).is_ok(),
            None => false,
        };
        if !sent {
            let dropped = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // Log the first and then every power of two, not every drop.
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "audit queue full: decision records dropped");
            }
        }
    }

    /// Waits until every event recorded before this call is committed, and
    /// reports the first failure since the last flush, if any.
    pub fn flush(&self) -> Result<(), StoreError> {
        let sender = self.sender.as_ref().ok_or(StoreError::WriterStopped)?;
        let (answer, answered) = mpsc::channel();
        // The thread may be parked out its batch window, with the queue full:
        // wake it before queueing the flush and after.
        self.wake();
        sender
            .send(Message::Flush(answer))
            .map_err(|_| StoreError::WriterStopped)?;
        self.wake();
        answered.recv().map_err(|_| StoreError::WriterStopped)?
    }

    /// Unparks the writer thread (a no-op when it is not parked; the next
    /// park then returns at once).
    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }

    /// How many events were not written: dropped on a full queue or lost to
    /// a failed commit.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// How many events were committed.
    pub fn committed(&self) -> u64 {
        self.counters.committed.load(Ordering::Relaxed)
    }

    /// How many transactions committed them.
    pub fn batches(&self) -> u64 {
        self.counters.batches.load(Ordering::Relaxed)
    }
}

impl Drop for AuditWriter {
    fn drop(&mut self) {
        if let Err(error) = self.flush() {
            tracing::error!(%error, "audit writer: last batch not written");
        }
        // Closing the channel ends the thread's loop.
        self.sender = None;
        self.wake();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the audit writer thread panicked");
        }
    }
}

fn run(
    store: &dyn Store,
    receiver: &Receiver<Message>,
    options: WriterOptions,
    counters: &Counters,
) {
    let max_batch = options.max_batch.max(1);
    let mut batch: Vec<AuditEvent> = Vec::with_capacity(max_batch);
    // The first failure since the last flush, for the next flush to report.
    let mut failure: Option<StoreError> = None;
    // Wait for the first message of a batch with no deadline; then park for
    // the rest of the batch window and drain what came meanwhile. Parking
    // instead of waiting on the queue means a record never wakes this
    // thread: on the call path, recording costs a queue push and nothing
    // more. A flush unparks it.
    while let Ok(first) = receiver.recv() {
        let deadline = Instant::now() + options.max_delay;
        let mut pending = Some(first);
        let mut slept = false;
        loop {
            let message = match pending.take() {
                Some(message) => message,
                None => match receiver.try_recv() {
                    Ok(message) => message,
                    Err(TryRecvError::Empty) if !slept => {
                        // A flush (or the writer's end) unparks this thread.
                        std::thread::park_timeout(
                            deadline.saturating_duration_since(Instant::now()),
                        );
                        slept = true;
                        continue;
                    }
                    Err(TryRecvError::Empty) => {
                        commit(store, &mut batch, counters, &mut failure);
                        break;
                    }
                    Err(TryRecvError::Disconnected) => {
                        commit(store, &mut batch, counters, &mut failure);
                        return;
                    }
                },
            };
            match message {
                Message::Event(event) => batch.push(event),
                Message::Deferred(make) => batch.extend(make()),
                Message::Flush(answer) => {
                    commit(store, &mut batch, counters, &mut failure);
                    let _ = answer.send(failure.take().map_or(Ok(()), Err));
                    break;
                }
            }
            if batch.len() >= max_batch {
                commit(store, &mut batch, counters, &mut failure);
            }
        }
    }
    commit(store, &mut batch, counters, &mut failure);
}

/// Commits a batch in one transaction and empties it.
fn commit(
    store: &dyn Store,
    batch: &mut Vec<AuditEvent>,
    counters: &Counters,
    failure: &mut Option<StoreError>,
) {
    if batch.is_empty() {
        return;
    }
    let count = u64::try_from(batch.len()).unwrap_or(u64::MAX);
    match store.append_audit(batch) {
        Ok(()) => {
            counters.committed.fetch_add(count, Ordering::Relaxed);
            counters.batches.fetch_add(1, Ordering::Relaxed);
        }
        Err(error) => {
            counters.dropped.fetch_add(count, Ordering::Relaxed);
            tracing::error!(%error, count, "audit batch not written");
            failure.get_or_insert(error);
        }
    }
    batch.clear();
}
