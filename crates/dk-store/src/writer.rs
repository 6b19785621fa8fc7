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

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{AuditEvent, Store, StoreError};

mod batch;
mod options;
mod queue;
mod room;

use batch::*;
use options::CommitObserver;
pub use options::{DEFAULT_DURABLE_WITHIN, Made, RECORD_PATIENCE, STOP_ATTEMPTS, WriterOptions};
use queue::*;
use room::*;
pub use room::{AuditPlace, AuditRoom, Durability};

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
