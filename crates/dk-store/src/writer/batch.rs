//! The writer's thread: events batched within the window, committed,
//! committed again into the reserve when the disk is full, and the store
//! probed when no commit proved it within a quarter of the bound.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use super::options::{CommitObserver, FIRST_RETRY, LAST_RETRY, Made, STOP_ATTEMPTS, WriterOptions};
use super::queue::{Message, Queued, Receiver};
use super::room::{Counters, Place, Places};
use crate::crosscheck::refuse_reserved_kinds;
use crate::{AuditEvent, AuditText, Store, StoreError};

/// Gathers messages into batches until the channel closes.
pub(super) fn run(batch: &mut Batch<'_>, receiver: &Receiver, options: WriterOptions) {
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
pub(super) struct Batch<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) places: &'a Places,
    pub(super) counters: &'a Counters,
    pub(super) events: Vec<AuditText>,
    /// Places held by the events taken since the last commit.
    pub(super) taken: usize,
    /// While commits fail: the last error, the wait before the next try and
    /// when that try is due.
    pub(super) error: Option<StoreError>,
    pub(super) backoff: Duration,
    pub(super) retry_at: Option<Instant>,
    /// When the oldest event taken since the last commit was queued.
    pub(super) oldest_ms: Option<u64>,
    /// When the store was last written to (a commit or a probe began),
    /// whether it held or not: the next probe is due a quarter of the
    /// bound later.
    pub(super) checked_at: Instant,
    /// The last probe failed (said once until one holds again).
    pub(super) probe_failed: bool,
}

impl<'a> Batch<'a> {
    pub(super) fn new(
        store: &'a dyn Store,
        places: &'a Places,
        counters: &'a Counters,
    ) -> Batch<'a> {
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

    pub(super) fn push(&mut self, made: Option<Made>, queued: Queued) {
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
    pub(super) fn probe(&mut self) {
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
    pub(super) fn full_disk(&mut self, error: &StoreError) -> bool {
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
    pub(super) fn renew_reserve(&mut self) {
        if self.counters.full.load(Ordering::Relaxed) && self.store.restore_reserve() {
            self.counters.full.store(false, Ordering::Relaxed);
            tracing::info!(
                "there is room on the store's disk again: its reserve is made again, and calls reach devices again"
            );
        }
    }

    /// Commits what is held, unless a failed commit's retry is not yet due.
    pub(super) fn commit(&mut self) {
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        self.try_commit();
    }

    /// Commits what is held now, and says whether nothing is left.
    pub(super) fn flush(&mut self) -> Result<(), StoreError> {
        self.try_commit();
        match &self.error {
            Some(error) if !self.events.is_empty() => Err(error.clone()),
            _ => Ok(()),
        }
    }

    pub(super) fn try_commit(&mut self) {
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
    pub(super) fn stop(&mut self) {
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
pub(super) fn storable(made: Made) -> Option<AuditText> {
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
pub(super) fn unstorable(kind: &str, at_ms: u64, error: &StoreError) -> Option<AuditText> {
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
