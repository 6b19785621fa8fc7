//! The write-behind audit writer: events are committed in batches by one
//! thread, so a tool call never waits for a disk sync.
//!
//! Nothing recorded is dropped. The queue has a fixed number of places
//! (`queue`, 65,536 by default): an event takes one before it is queued and
//! the writer gives it back once the event is committed. A tool call takes
//! its place before its first check ([`AuditRoom::take`], waiting without
//! blocking its thread while every place is taken), so no call reaches a
//! device without room for its record, and calls faster than the disk wait
//! for it instead of outrunning it. [`AuditWriter::record`], for the few
//! events recorded outside a call, waits for a place on its own thread for
//! at most [`RECORD_PATIENCE`], then queues the event past the bound rather
//! than lose it.
//!
//! A commit that fails is retried, after 10 ms and then twice as long each
//! time up to 1 s, with everything that came meanwhile; each flush meanwhile
//! reports the failure. The places stay taken, so calls wait rather than pile
//! up in memory. An event the store refuses as not storable (a reserved or
//! malformed kind, an entry too large) is recorded as an `unstorable` entry
//! naming its kind and why, never left out.
//!
//! Durability within a bound ([`WriterOptions::durable_within`], 1 s by
//! default): the writer keeps when the store last showed it takes writes
//! (the start of the last commit that held, or of a probe: a small write,
//! [`Store::probe_write`], made as the writer starts, on the starter's
//! thread, and then on the writer's thread whenever a quarter of the bound
//! passed without a commit; until one holds, calls are refused) and when
//! the oldest event not yet
//! committed was queued ([`AuditRoom::durability`]). A store that took no
//! write within the bound, or whose failed commit is retried, is
//! [`Durability::Lost`]: a call is then refused before it reaches a
//! device. A store that hangs (a server paused, a disk that no longer
//! answers) is so noticed within the bound even with nothing queued. A
//! store that takes writes, but more slowly than calls come (the oldest
//! event waits longer than the bound), is [`Durability::Behind`]: calls
//! wait for it to catch up, as they wait for room in the queue, and reach
//! no device meanwhile.
//!
//! A full disk: when a write (a commit or a probe) fails and the store
//! says its disk is full ([`Store::disk_full`]), no call reaches a device
//! from then on ([`Durability::Lost`], [`AuditWriter::disk_full`]), and the
//! store releases the space it keeps in reserve ([`Store::release_reserve`],
//! the SQLite store's `disk-reserve` file): the commit is tried again at
//! once, so the decisions already queued, every call that reached a device
//! among them, are committed into that space, as are the refusals that
//! follow while it lasts. Calls reach devices again once the store has made
//! its reserve again ([`Store::restore_reserve`], asked after each write
//! that holds meanwhile), which it does only when there is room for it
//! and to work in beside it.
//!
//! What a crash can lose: the events queued and the batch being gathered, at
//! most `max_delay` plus one commit's worth of decisions when the disk keeps
//! up, and never more than the bound's worth of calls that reached a device
//! (a call reaches one only while the oldest event not committed is younger
//! than the bound). It never holds a pairing, grant, revoke or unpair: those
//! are written by the store in the transaction of the change, before it is
//! acknowledged.
//! Events are lost without a crash only when the writer is stopped while the
//! store still fails [`STOP_ATTEMPTS`] times in a row, or recorded after it
//! stopped: [`AuditWriter::dropped`] counts them, and each loss is logged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit, TryAcquireError};

use super::crosscheck::refuse_reserved_kinds;
use super::{AuditEvent, AuditText, Store, StoreError};

/// How long [`AuditWriter::record`] waits for a place in a full queue before
/// it queues its event past the bound.
pub const RECORD_PATIENCE: Duration = Duration::from_millis(100);

/// How many times a stopping writer tries to commit what it still holds.
pub const STOP_ATTEMPTS: u32 = 3;

/// How recently the store must have taken a write, and how old the oldest
/// event not yet committed may be, for a call to reach a device, by default.
pub const DEFAULT_DURABLE_WITHIN: Duration = Duration::from_secs(1);

/// The shortest bound a writer keeps: its probe runs every quarter of it.
const MIN_DURABLE_WITHIN: Duration = Duration::from_millis(40);

/// The wait before the first retry of a failed commit; it doubles up to
/// [`LAST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(10);
const LAST_RETRY: Duration = Duration::from_secs(1);

/// How an [`AuditWriter`] batches.
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
    /// [`AuditRoom::accepting`] (default [`DEFAULT_DURABLE_WITHIN`], at
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

/// Whether a queued event holds one of the queue's places.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// It does: given back once the event is committed.
    Taken,
    /// It was queued past the bound, by a caller that waited its patience.
    Over,
}

/// A queued event's place and when it was queued (the writer's clock,
/// [`Counters::now_ms`]).
#[derive(Debug, Clone, Copy)]
struct Queued {
    place: Place,
    at_ms: u64,
}

enum Message {
    Event(AuditEvent, Queued),
    /// An event built on the writer thread, off the caller's path.
    Deferred(Box<dyn FnOnce() -> Option<Made> + Send>, Queued),
    /// Commit what came before, then answer.
    Flush(mpsc::Sender<Result<(), StoreError>>),
}

/// The queue's places, shared by the writer, its thread and the tool
/// adapter.
#[derive(Debug)]
struct Places {
    semaphore: Semaphore,
    /// How many places there are.
    count: usize,
    /// Threads waiting in [`AuditWriter::record`] for a place.
    waiting: Mutex<usize>,
    /// Told when places come back and a thread waits.
    freed: Condvar,
}

impl Places {
    fn new(count: usize) -> Places {
        let count = count.clamp(1, Semaphore::MAX_PERMITS);
        Places {
            semaphore: Semaphore::new(count),
            count,
            waiting: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Gives back `count` places, to waiting calls first.
    fn give_back(&self, count: usize) {
        if count == 0 {
            return;
        }
        self.semaphore.add_permits(count);
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if *waiting > 0 {
            self.freed.notify_all();
        }
    }

    /// A place, waiting on this thread for at most `patience`; `Over` when
    /// none came (or the writer has stopped).
    fn take_blocking(&self, patience: Duration) -> Place {
        if let Ok(permit) = self.semaphore.try_acquire() {
            permit.forget();
            return Place::Taken;
        }
        let deadline = Instant::now() + patience;
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        *waiting += 1;
        let place = loop {
            match self.semaphore.try_acquire() {
                Ok(permit) => {
                    permit.forget();
                    break Place::Taken;
                }
                Err(TryAcquireError::Closed) => break Place::Over,
                Err(TryAcquireError::NoPermits) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Place::Over;
            }
            waiting = self
                .freed
                .wait_timeout(waiting, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        *waiting -= 1;
        place
    }
}

/// The places of an [`AuditWriter`]'s queue, for the tool adapter: a call
/// takes one before its checks and spends it on its decision record.
#[derive(Debug, Clone)]
pub struct AuditRoom(Arc<Places>, Arc<Counters>);

impl AuditRoom {
    /// Whether the writer's last commit failed and is being retried (the
    /// store does not take writes now): a call is then not made, as its
    /// record could not be made durable.
    pub fn failing(&self) -> bool {
        self.1.failing.load(Ordering::Relaxed)
    }

    /// Whether a call may reach a device now: the store took a commit or
    /// answered a probe within the bound, the oldest event not yet
    /// committed is younger than it, and no failed commit is being
    /// retried ([`Durability::Within`]). Two atomic reads and a clock read.
    pub fn accepting(&self) -> bool {
        self.1.durability() == Durability::Within
    }

    /// Where the store stands against the bound now (see [`Durability`]).
    pub fn durability(&self) -> Durability {
        self.1.durability()
    }

    /// Completes at the writer's next commit or probe that holds (a call
    /// [`Durability::Behind`] waits for it, or a timer, then looks again).
    /// Enable it before looking, so that a commit in between is not
    /// missed.
    pub fn committed(&self) -> tokio::sync::futures::Notified<'_> {
        self.1.commits.notified()
    }

    /// The bound [`AuditRoom::accepting`] keeps
    /// ([`WriterOptions::durable_within`]): also how long a call waits for
    /// the store's answer on its way to a device.
    pub fn durable_within(&self) -> Duration {
        self.1.bound
    }

    /// A place in the queue: at once when there is room (an atomic
    /// compare-and-swap), otherwise once a commit gives places back, waiting
    /// without blocking the thread. An error when the writer has stopped.
    pub async fn take(&self) -> Result<AuditPlace<'_>, StoreError> {
        let permit = match self.0.semaphore.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(StoreError::WriterStopped),
            Err(TryAcquireError::NoPermits) => self
                .0
                .semaphore
                .acquire()
                .await
                .map_err(|_| StoreError::WriterStopped)?,
        };
        Ok(AuditPlace(permit))
    }
}

/// One place taken in an [`AuditWriter`]'s queue: spent by recording into it
/// ([`AuditPlace::spend`], then [`AuditWriter::record_placed`]), given back
/// when dropped unspent.
#[derive(Debug)]
pub struct AuditPlace<'a>(SemaphorePermit<'a>);

impl AuditPlace<'_> {
    /// Hands the place to the event about to be recorded: the writer gives
    /// it back once that event is committed.
    pub fn spend(self) {
        self.0.forget();
    }
}

/// Where the audit writer's store stands against its bound
/// ([`WriterOptions::durable_within`]), for a call about to reach a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The store took a write within the bound and no event waits longer:
    /// a call may reach a device.
    Within,
    /// The store takes writes (one within the bound), but the oldest event
    /// not yet committed waits longer than the bound: calls came faster
    /// than the disk. A call waits for it to catch up, as for room in the
    /// queue.
    Behind,
    /// The store took no write within the bound (it answers nothing, or
    /// refuses), a failed commit is being retried, or a write failed
    /// because its disk is full and its reserve is not made again yet: no
    /// call reaches a device.
    Lost,
}

/// Counters shared with the writer thread.
#[derive(Debug)]
struct Counters {
    dropped: AtomicU64,
    committed: AtomicU64,
    batches: AtomicU64,
    over: AtomicU64,
    /// The last commit failed and is being retried.
    failing: AtomicBool,
    /// A write failed because the store's disk is full, and its reserve
    /// is not made again yet.
    full: AtomicBool,
    /// Told how long each commit that held took.
    observer: OnceLock<CommitObserver>,
    /// The writer's clock: the times below are milliseconds since this.
    epoch: Instant,
    /// When the last commit or probe that held began, plus one; zero until
    /// one held.
    proven_ms: AtomicU64,
    /// When the oldest event not yet committed was queued, plus one; zero
    /// when every event queued is committed (or none has been taken from
    /// the queue since).
    oldest_ms: AtomicU64,
    /// [`WriterOptions::durable_within`].
    bound: Duration,
    /// Told at every commit or probe that holds.
    commits: tokio::sync::Notify,
}

impl Counters {
    fn new(bound: Duration) -> Counters {
        Counters {
            dropped: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            over: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            full: AtomicBool::new(false),
            observer: OnceLock::new(),
            epoch: Instant::now(),
            proven_ms: AtomicU64::new(0),
            oldest_ms: AtomicU64::new(0),
            bound: bound.max(MIN_DURABLE_WITHIN),
            commits: tokio::sync::Notify::new(),
        }
    }

    /// Milliseconds on the writer's clock.
    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn bound_ms(&self) -> u64 {
        u64::try_from(self.bound.as_millis()).unwrap_or(u64::MAX)
    }

    /// See [`AuditRoom::durability`]. Until the store first took a write
    /// (the writer probes it as it starts), calls are refused.
    fn durability(&self) -> Durability {
        if self.failing.load(Ordering::Relaxed) || self.full.load(Ordering::Relaxed) {
            return Durability::Lost;
        }
        if !self.store_proven() {
            return Durability::Lost;
        }
        if self.behind() {
            return Durability::Behind;
        }
        Durability::Within
    }

    /// Whether the store took a write within the bound.
    fn store_proven(&self) -> bool {
        match self.proven_ms.load(Ordering::Relaxed) {
            0 => false,
            proven => self.now_ms().saturating_sub(proven - 1) <= self.bound_ms(),
        }
    }

    /// Whether the oldest event not yet committed waits longer than the
    /// bound.
    fn behind(&self) -> bool {
        let oldest = self.oldest_ms.load(Ordering::Relaxed);
        oldest != 0 && self.now_ms().saturating_sub(oldest - 1) > self.bound_ms()
    }

    /// The store showed at `began` (a commit or a probe started then, and
    /// held) that it takes writes.
    fn proven(&self, began: Instant) {
        self.proven_ms
            .fetch_max(self.ms_at(began).saturating_add(1), Ordering::Relaxed);
        self.commits.notify_waiters();
    }
}

/// What [`AuditWriter::observe_commits`] was given.
struct CommitObserver(Box<dyn Fn(Duration) + Send + Sync>);

impl std::fmt::Debug for CommitObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitObserver(..)")
    }
}

/// Commits audit events in batches on its own thread. Recording costs the
/// caller a place in the queue and a push; [`AuditWriter::flush`] waits for
/// everything recorded before it. Dropping the writer flushes and joins the
/// thread.
#[derive(Debug)]
pub struct AuditWriter {
    sender: Option<Sender>,
    thread: Option<JoinHandle<()>>,
    places: Arc<Places>,
    counters: Arc<Counters>,
}

impl AuditWriter {
    /// Starts the writer thread over `store`.
    pub fn start(store: Arc<dyn Store>, options: WriterOptions) -> AuditWriter {
        let (sender, receiver) = queue();
        let places = Arc::new(Places::new(options.queue));
        let counters = Arc::new(Counters::new(options.durable_within));
        // The store shows at once, on the starter's thread, whether it
        // takes writes: no call reaches a device before it has. When it
        // does not, the writer's thread probes again at once, and finds
        // why (a full disk among others).
        let started = Instant::now();
        let first_probe = store.probe_write(crate::epoch_ms(std::time::SystemTime::now()));
        if first_probe.is_ok() {
            counters.proven(started);
        }
        let (thread_places, thread_counters) = (Arc::clone(&places), Arc::clone(&counters));
        // The thread logs where its starter logs (a host's or a test's
        // subscriber, not only the process's global one).
        let logging = tracing::dispatcher::get_default(Clone::clone);
        let thread = std::thread::Builder::new()
            .name("dk-audit-writer".to_owned())
            .spawn(move || {
                tracing::dispatcher::with_default(&logging, || {
                    let mut batch = Batch::new(&*store, &thread_places, &thread_counters);
                    if first_probe.is_ok() {
                        batch.checked_at = started;
                    }
                    run(&mut batch, &receiver, options);
                    batch.stop();
                });
            });
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::error!(%error, "cannot start the audit writer thread");
                places.semaphore.close();
                None
            }
        };
        AuditWriter {
            sender: thread.as_ref().map(|_| sender),
            thread,
            places,
            counters,
        }
    }

    /// Queues an event. When every place is taken this waits on the
    /// caller's thread until a commit gives one back, at most
    /// [`RECORD_PATIENCE`]; then the event is queued past the bound (and
    /// logged) rather than dropped.
    pub fn record(&self, event: AuditEvent) {
        let place = self.take_blocking();
        self.send(Message::Event(event, self.queued_now(place)));
    }

    /// Like [`AuditWriter::record`], but the event is built by `make` on the
    /// writer thread: the caller pays for a place and a queue push, not for
    /// serialising or redacting. `make` returning `None` records nothing.
    pub fn record_with(&self, make: impl FnOnce() -> Option<AuditEvent> + Send + 'static) {
        let place = self.take_blocking();
        self.send(Message::Deferred(
            Box::new(move || make().map(Made::Event)),
            self.queued_now(place),
        ));
    }

    /// Like [`AuditWriter::record_with`], in a place already taken from
    /// [`AuditWriter::room`] and spent: it never waits. `make` may give an
    /// event or its text ([`Made`]).
    pub fn record_placed<M: Into<Made>>(&self, make: impl FnOnce() -> Option<M> + Send + 'static) {
        self.send(Message::Deferred(
            Box::new(move || make().map(Into::into)),
            self.queued_now(Place::Taken),
        ));
    }

    /// An event queued now in `place`.
    fn queued_now(&self, place: Place) -> Queued {
        Queued {
            place,
            at_ms: self.counters.now_ms(),
        }
    }

    /// The queue's places, for a caller that takes its place ahead of time.
    pub fn room(&self) -> AuditRoom {
        AuditRoom(Arc::clone(&self.places), Arc::clone(&self.counters))
    }

    fn take_blocking(&self) -> Place {
        let place = self.places.take_blocking(RECORD_PATIENCE);
        if place == Place::Over && self.sender.is_some() {
            let over = self.counters.over.fetch_add(1, Ordering::Relaxed) + 1;
            // Log the first and then every power of two, not every one.
            if over.is_power_of_two() {
                tracing::warn!(
                    over,
                    "audit queue full for {} ms: an event queued past its bound",
                    RECORD_PATIENCE.as_millis()
                );
            }
        }
        place
    }

    fn send(&self, message: Message) {
        let sent = match &self.sender {
            Some(sender) => sender.send(message).is_ok(),
            None => false,
        };
        if !sent {
            let dropped = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::error!(dropped, "the audit writer has stopped: an event was lost");
            }
        }
    }

    /// Waits until every event recorded before this call is committed. An
    /// error when the store fails now (the events stay queued and are
    /// retried) or the writer has stopped.
    pub fn flush(&self) -> Result<(), StoreError> {
        let sender = self.sender.as_ref().ok_or(StoreError::WriterStopped)?;
        let (answer, answered) = mpsc::channel();
        sender
            .send(Message::Flush(answer))
            .map_err(|_| StoreError::WriterStopped)?;
        // The thread may be parked out its batch window: wake it.
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

    /// How many events were lost: recorded after the writer stopped, or
    /// still not committed when it stopped because the store kept failing.
    /// Zero otherwise: a full queue makes callers wait, it drops nothing.
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

    /// Tells `observe` how long each commit that holds takes, on the
    /// writer's thread (it must be quick: an atomic add, not IO). Only the
    /// first observer given is kept; a later one is refused (`false`).
    pub fn observe_commits(&self, observe: Box<dyn Fn(Duration) + Send + Sync>) -> bool {
        self.counters.observer.set(CommitObserver(observe)).is_ok()
    }

    /// How many events wait in the queue for a commit now (those queued
    /// past the bound not counted).
    pub fn queued(&self) -> usize {
        self.places
            .count
            .saturating_sub(self.places.semaphore.available_permits())
    }

    /// Whether the writer keeps up with what is recorded: its thread runs,
    /// its last commit did not fail, no event waits longer than the bound,
    /// and at most three quarters of the queue's places are taken (with
    /// every place taken, calls wait for the disk). A readiness check reads
    /// it, beside [`AuditWriter::store_takes_writes`]: a call reaches a
    /// device only while both hold ([`AuditRoom::accepting`]).
    pub fn keeping_up(&self) -> bool {
        let running = self.thread.as_ref().is_some_and(|t| !t.is_finished());
        running
            && !self.counters.failing.load(Ordering::Relaxed)
            && !self.counters.behind()
            && self.queued() <= self.places.count / 4 * 3
    }

    /// Whether the store took a write within the bound: a commit that held,
    /// or the writer's own probe, which it makes when a quarter of the
    /// bound went by without a commit. What a readiness check reads of the
    /// store: the same fact the call path reads ([`AuditRoom::durability`]
    /// is [`Durability::Lost`] without it), found without a write of its
    /// own, so a check made often costs the store nothing and never waits
    /// for it, however it hangs.
    pub fn store_takes_writes(&self) -> bool {
        !self.disk_full() && self.counters.store_proven()
    }

    /// Whether a write failed because the store's disk is full and its
    /// reserve is not made again yet ([`Store::restore_reserve`]): no call
    /// reaches a device meanwhile, even while the reserve's space takes
    /// the writer's commits.
    pub fn disk_full(&self) -> bool {
        self.counters.full.load(Ordering::Relaxed)
    }
}

impl Drop for AuditWriter {
    fn drop(&mut self) {
        if let Err(error) = self.flush() {
            tracing::error!(%error, "audit writer: the last events are not committed yet");
        }
        // Closing the channel ends the thread's loop; it tries what it still
        // holds a few more times.
        self.sender = None;
        self.wake();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the audit writer thread panicked");
        }
        self.places.semaphore.close();
    }
}

/// The writer's queue: a deque under a lock, which keeps its buffer from
/// one batch to the next, so queueing an event allocates nothing (a list
/// channel allocates a block every few messages and the writer thread
/// frees it, across threads). The thread waits on the condition variable
/// only for the first message of a batch; a record wakes it only then.
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

struct QueueState {
    messages: VecDeque<Message>,
    /// The sending side is gone: once the messages are read, nothing more
    /// comes.
    closed: bool,
    /// The writer thread waits for a message.
    waiting: bool,
}

/// The sending side of the queue; dropping it closes the queue.
struct Sender(Arc<Queue>);

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("queued", &self.0.state().messages.len())
            .finish()
    }
}

/// The writer thread's side of the queue.
struct Receiver(Arc<Queue>);

fn queue() -> (Sender, Receiver) {
    let queue = Arc::new(Queue {
        state: Mutex::new(QueueState {
            messages: VecDeque::new(),
            closed: false,
            waiting: false,
        }),
        ready: Condvar::new(),
    });
    (Sender(Arc::clone(&queue)), Receiver(queue))
}

impl Queue {
    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Sender {
    /// Queues `message`; it comes back when the writer thread is gone.
    fn send(&self, message: Message) -> Result<(), Message> {
        let mut state = self.0.state();
        if state.closed {
            return Err(message);
        }
        state.messages.push_back(message);
        let waiting = state.waiting;
        drop(state);
        if waiting {
            self.0.ready.notify_one();
        }
        Ok(())
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.state().closed = true;
        self.0.ready.notify_all();
    }
}

impl Receiver {
    /// The next message, waiting for one at most `timeout`; an error once
    /// the queue is closed and empty.
    fn recv_timeout(&self, timeout: Duration) -> Result<Message, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.0.state();
        loop {
            if let Some(message) = state.messages.pop_front() {
                return Ok(message);
            }
            if state.closed {
                return Err(RecvTimeoutError::Disconnected);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            state.waiting = true;
            state = self
                .0
                .ready
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.waiting = false;
        }
    }

    /// The next message if one is queued.
    fn try_recv(&self) -> Result<Message, TryRecvError> {
        let mut state = self.0.state();
        match state.messages.pop_front() {
            Some(message) => Ok(message),
            None if state.closed => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

/// Gathers messages into batches until the channel closes.
fn run(batch: &mut Batch<'_>, receiver: &Receiver, options: WriterOptions) {
    let max_batch = options.max_batch.max(1);
    // Wait for the first message of a batch until a probe is due (or, after
    // a failed commit, until its retry); then park for the rest of the
    // batch window and drain what came meanwhile. Parking instead of
    // waiting on the queue means a record never wakes this thread: on the
    // call path, recording costs a place and a queue push and nothing
    // more. A flush unparks it.
    loop {
        let first = match batch.retry_at {
            None => {
                let due = batch.checked_at + batch.counters.bound / 4;
                match receiver.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(message) => message,
                    Err(RecvTimeoutError::Timeout) => {
                        batch.probe();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            Some(at) => match receiver.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => {
                    batch.commit();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            },
        };
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
                        batch.commit();
                        break;
                    }
                    Err(TryRecvError::Disconnected) => return,
                },
            };
            match message {
                Message::Event(event, queued) => batch.push(Some(Made::Event(event)), queued),
                Message::Deferred(make, queued) => batch.push(make(), queued),
                Message::Flush(answer) => {
                    let _ = answer.send(batch.flush());
                    break;
                }
            }
            if batch.events.len() >= max_batch {
                batch.commit();
            }
        }
    }
}

/// The events not yet committed, and what a commit gives back.
struct Batch<'a> {
    store: &'a dyn Store,
    places: &'a Places,
    counters: &'a Counters,
    events: Vec<AuditText>,
    /// Places held by the events taken since the last commit.
    taken: usize,
    /// While commits fail: the last error, the wait before the next try and
    /// when that try is due.
    error: Option<StoreError>,
    backoff: Duration,
    retry_at: Option<Instant>,
    /// When the oldest event taken since the last commit was queued.
    oldest_ms: Option<u64>,
    /// When the store was last written to (a commit or a probe began),
    /// whether it held or not: the next probe is due a quarter of the
    /// bound later.
    checked_at: Instant,
    /// The last probe failed (said once until one holds again).
    probe_failed: bool,
}

impl<'a> Batch<'a> {
    fn new(store: &'a dyn Store, places: &'a Places, counters: &'a Counters) -> Batch<'a> {
        // A probe is due at once, unless one just held.
        let now = Instant::now();
        let checked_at = now.checked_sub(counters.bound / 4).unwrap_or(now);
        Batch {
            store,
            places,
            counters,
            events: Vec::new(),
            taken: 0,
            error: None,
            backoff: FIRST_RETRY,
            retry_at: None,
            oldest_ms: None,
            checked_at,
            probe_failed: false,
        }
    }

    fn push(&mut self, made: Option<Made>, queued: Queued) {
        self.events.extend(made.and_then(storable));
        if queued.place == Place::Taken {
            self.taken += 1;
        }
        // Events from several threads may be queued out of the order their
        // times were read in: the oldest is the least.
        let oldest = self
            .oldest_ms
            .map_or(queued.at_ms, |at| at.min(queued.at_ms));
        if self.oldest_ms != Some(oldest) {
            self.oldest_ms = Some(oldest);
            self.counters
                .oldest_ms
                .store(oldest.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// One small write that changes nothing the vessel reads
    /// ([`Store::probe_write`]): when it holds, the store is shown to take
    /// writes as of its start.
    fn probe(&mut self) {
        let started = Instant::now();
        self.checked_at = started;
        match self
            .store
            .probe_write(crate::epoch_ms(std::time::SystemTime::now()))
        {
            Ok(()) => {
                self.counters.proven(started);
                if std::mem::take(&mut self.probe_failed) {
                    tracing::info!("the store takes writes again");
                }
                self.renew_reserve();
            }
            Err(error) => {
                if !std::mem::replace(&mut self.probe_failed, true) {
                    tracing::error!(%error, "the store does not take writes: no call reaches a device until it does");
                }
                // Calls under way may still reach a device: their
                // decisions will fit in the reserve's space.
                self.full_disk(&error);
            }
        }
    }

    /// A write failed with `error`. When the store says its disk is full,
    /// no call reaches a device from now on until its reserve is made
    /// again, and the reserve is released so that what is queued (every
    /// call that reached a device among it) fits: true when it was
    /// released now, so that a commit tried again may hold.
    fn full_disk(&mut self, error: &StoreError) -> bool {
        if !self.store.disk_full(error) {
            return false;
        }
        if !self.counters.full.swap(true, Ordering::Relaxed) {
            tracing::error!(%error, "the disk holding the store is full: no call reaches a device until there is room again");
        }
        self.store.release_reserve()
    }

    /// After a write that held while the disk was full: once the store's
    /// reserve is in place again (there is room for it, and to work in),
    /// calls may reach devices again.
    fn renew_reserve(&mut self) {
        if self.counters.full.load(Ordering::Relaxed) && self.store.restore_reserve() {
            self.counters.full.store(false, Ordering::Relaxed);
            tracing::info!(
                "there is room on the store's disk again: its reserve is made again, and calls reach devices again"
            );
        }
    }

    /// Commits what is held, unless a failed commit's retry is not yet due.
    fn commit(&mut self) {
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        self.try_commit();
    }

    /// Commits what is held now, and says whether nothing is left.
    fn flush(&mut self) -> Result<(), StoreError> {
        self.try_commit();
        match &self.error {
            Some(error) if !self.events.is_empty() => Err(error.clone()),
            _ => Ok(()),
        }
    }

    fn try_commit(&mut self) {
        if !self.events.is_empty() {
            let started = Instant::now();
            self.checked_at = started;
            let mut committed = self.store.append_audit_texts(&self.events);
            if let Err(error) = &committed
                && self.full_disk(error)
            {
                // The reserve's space takes what is queued.
                committed = self.store.append_audit_texts(&self.events);
            }
            if let Err(error) = committed {
                if self.error.is_none() {
                    tracing::error!(%error, events = self.events.len(), "audit batch not committed yet; retrying");
                }
                self.error = Some(error);
                self.counters.failing.store(true, Ordering::Relaxed);
                self.retry_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(LAST_RETRY);
                return;
            }
            self.counters.failing.store(false, Ordering::Relaxed);
            self.counters.proven(started);
            if self.error.take().is_some() {
                tracing::info!(
                    events = self.events.len(),
                    "audit batch committed after a retry"
                );
            }
            if let Some(CommitObserver(observe)) = self.counters.observer.get() {
                observe(started.elapsed());
            }
            let count = u64::try_from(self.events.len()).unwrap_or(u64::MAX);
            self.counters.committed.fetch_add(count, Ordering::Relaxed);
            self.counters.batches.fetch_add(1, Ordering::Relaxed);
            self.events.clear();
            self.renew_reserve();
        }
        self.retry_at = None;
        self.backoff = FIRST_RETRY;
        if self.oldest_ms.take().is_some() {
            self.counters.oldest_ms.store(0, Ordering::Relaxed);
        }
        self.places.give_back(std::mem::take(&mut self.taken));
    }

    /// The writer is stopping: a few last tries, then what is left is lost,
    /// counted and logged.
    fn stop(&mut self) {
        for attempt in 1..=STOP_ATTEMPTS {
            self.try_commit();
            if self.events.is_empty() {
                return;
            }
            if attempt < STOP_ATTEMPTS {
                std::thread::sleep(FIRST_RETRY * attempt);
            }
        }
        let lost = u64::try_from(self.events.len()).unwrap_or(u64::MAX);
        self.counters.dropped.fetch_add(lost, Ordering::Relaxed);
        let lost_message =
            "the audit writer stopped with events the store would not take: they are lost";
        match &self.error {
            Some(error) => tracing::error!(lost, %error, "{lost_message}"),
            None => tracing::error!(lost, "{lost_message}"),
        }
        self.events.clear();
        self.places.give_back(std::mem::take(&mut self.taken));
    }
}

/// What is committed for `made`: its text; or, for an event no store takes
/// (a malformed kind, too large) or a kind stores write only with their
/// change, an `unstorable` entry in its place, so that it neither holds
/// back the others nor is left out.
fn storable(made: Made) -> Option<AuditText> {
    let text = match made {
        Made::Text(text) => text,
        Made::Event(event) => match AuditText::of(&event) {
            Ok(text) => text,
            Err(error) => return unstorable(&event.kind, event.at_ms, &error),
        },
    };
    match refuse_reserved_kinds(std::iter::once(text.kind())) {
        Ok(()) => Some(text),
        Err(error) => unstorable(text.kind(), text.at_ms(), &error),
    }
}

/// What is recorded in place of an event of `kind` at `at_ms` no store
/// takes: its kind (cut and escaped) and why.
fn unstorable(kind: &str, at_ms: u64, error: &StoreError) -> Option<AuditText> {
    let kind: String = kind.escape_debug().to_string().chars().take(64).collect();
    let why: String = error.to_string().chars().take(256).collect();
    let event = AuditEvent::of(
        &crate::entry::Entry::Unstorable(crate::entry::Unstorable { kind, error: why }),
        at_ms.min(i64::MAX.unsigned_abs()),
    );
    // Its kind is known and its entry small: every store takes it.
    AuditText::of(&event)
        .inspect_err(
            |error| tracing::error!(%error, "audit writer: an unstorable entry was refused"),
        )
        .ok()
}
