//! The writer's room: the places in its queue a call takes before its
//! checks ([`AuditRoom`], [`AuditPlace`]), and the durability it keeps
//! within its bound ([`Durability`]), read with two atomic loads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit, TryAcquireError};

use super::options::{CommitObserver, MIN_DURABLE_WITHIN};
use crate::StoreError;

/// Whether a queued event holds one of the queue's places.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// It does: given back once the event is committed.
    Taken,
    /// It was queued past the bound, by a caller that waited its patience.
    Over,
}

/// The queue's places, shared by the writer, its thread and the tool
/// adapter.
#[derive(Debug)]
pub(super) struct Places {
    pub(super) semaphore: Semaphore,
    /// How many places there are.
    pub(super) count: usize,
    /// Threads waiting in [`AuditWriter::record`](crate::AuditWriter::record) for a place.
    pub(super) waiting: Mutex<usize>,
    /// Told when places come back and a thread waits.
    pub(super) freed: Condvar,
}

impl Places {
    pub(super) fn new(count: usize) -> Places {
        let count = count.clamp(1, Semaphore::MAX_PERMITS);
        Places {
            semaphore: Semaphore::new(count),
            count,
            waiting: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Gives back `count` places, to waiting calls first.
    pub(super) fn give_back(&self, count: usize) {
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
    pub(super) fn take_blocking(&self, patience: Duration) -> Place {
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

/// The places of an [`AuditWriter`](crate::AuditWriter)'s queue, for the tool adapter: a call
/// takes one before its checks and spends it on its decision record.
#[derive(Debug, Clone)]
pub struct AuditRoom(pub(super) Arc<Places>, pub(super) Arc<Counters>);

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

    /// The bound [`AuditRoom::accepting`](crate::AuditRoom::accepting) keeps
    /// ([`WriterOptions::durable_within`](crate::WriterOptions::durable_within)): also how long a call waits for
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

/// One place taken in an [`AuditWriter`](crate::AuditWriter)'s queue: spent by recording into it
/// ([`AuditPlace::spend`], then [`AuditWriter::record_placed`](crate::AuditWriter::record_placed)), given back
/// when dropped unspent.
#[derive(Debug)]
pub struct AuditPlace<'a>(pub(super) SemaphorePermit<'a>);

impl AuditPlace<'_> {
    /// Hands the place to the event about to be recorded: the writer gives
    /// it back once that event is committed.
    pub fn spend(self) {
        self.0.forget();
    }
}

/// Where the audit writer's store stands against its bound
/// ([`WriterOptions::durable_within`](crate::WriterOptions::durable_within)), for a call about to reach a device.
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
pub(super) struct Counters {
    pub(super) dropped: AtomicU64,
    pub(super) committed: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) over: AtomicU64,
    /// The last commit failed and is being retried.
    pub(super) failing: AtomicBool,
    /// A write failed because the store's disk is full, and its reserve
    /// is not made again yet.
    pub(super) full: AtomicBool,
    /// Told how long each commit that held took.
    pub(super) observer: OnceLock<CommitObserver>,
    /// The writer's clock: the times below are milliseconds since this.
    pub(super) epoch: Instant,
    /// When the last commit or probe that held began, plus one; zero until
    /// one held.
    pub(super) proven_ms: AtomicU64,
    /// When the oldest event not yet committed was queued, plus one; zero
    /// when every event queued is committed (or none has been taken from
    /// the queue since).
    pub(super) oldest_ms: AtomicU64,
    /// [`WriterOptions::durable_within`](crate::WriterOptions::durable_within).
    pub(super) bound: Duration,
    /// Told at every commit or probe that holds.
    pub(super) commits: tokio::sync::Notify,
}

impl Counters {
    pub(super) fn new(bound: Duration) -> Counters {
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
    pub(super) fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    pub(super) fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn bound_ms(&self) -> u64 {
        u64::try_from(self.bound.as_millis()).unwrap_or(u64::MAX)
    }

    /// See [`AuditRoom::durability`]. Until the store first took a write
    /// (the writer probes it as it starts), calls are refused.
    pub(super) fn durability(&self) -> Durability {
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
    pub(super) fn store_proven(&self) -> bool {
        match self.proven_ms.load(Ordering::Relaxed) {
            0 => false,
            proven => self.now_ms().saturating_sub(proven - 1) <= self.bound_ms(),
        }
    }

    /// Whether the oldest event not yet committed waits longer than the
    /// bound.
    pub(super) fn behind(&self) -> bool {
        let oldest = self.oldest_ms.load(Ordering::Relaxed);
        oldest != 0 && self.now_ms().saturating_sub(oldest - 1) > self.bound_ms()
    }

    /// The store showed at `began` (a commit or a probe started then, and
    /// held) that it takes writes.
    pub(super) fn proven(&self, began: Instant) {
        self.proven_ms
            .fetch_max(self.ms_at(began).saturating_add(1), Ordering::Relaxed);
        self.commits.notify_waiters();
    }
}
