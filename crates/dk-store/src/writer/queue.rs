//! The queue between the writer's callers and its thread: a mutex-held
//! deque and a condition variable, so a flush wakes the thread at once.

use std::collections::VecDeque;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::options::Made;
use super::room::Place;
use crate::{AuditEvent, StoreError};

/// A queued event's place and when it was queued (the writer's clock,
/// [`Counters::now_ms`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Queued {
    pub(super) place: Place,
    pub(super) at_ms: u64,
}

pub(super) enum Message {
    Event(AuditEvent, Queued),
    /// An event built on the writer thread, off the caller's path.
    Deferred(Box<dyn FnOnce() -> Option<Made> + Send>, Queued),
    /// Commit what came before, then answer.
    Flush(mpsc::Sender<Result<(), StoreError>>),
}

/// The writer's queue: a deque under a lock, which keeps its buffer from
/// one batch to the next, so queueing an event allocates nothing (a list
/// channel allocates a block every few messages and the writer thread
/// frees it, across threads). The thread waits on the condition variable
/// only for the first message of a batch; a record wakes it only then.
pub(super) struct Queue {
    pub(super) state: Mutex<QueueState>,
    pub(super) ready: Condvar,
}

pub(super) struct QueueState {
    pub(super) messages: VecDeque<Message>,
    /// The sending side is gone: once the messages are read, nothing more
    /// comes.
    pub(super) closed: bool,
    /// The writer thread waits for a message.
    pub(super) waiting: bool,
}

/// The sending side of the queue; dropping it closes the queue.
pub(super) struct Sender(pub(super) Arc<Queue>);

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("queued", &self.0.state().messages.len())
            .finish()
    }
}

/// The writer thread's side of the queue.
pub(super) struct Receiver(pub(super) Arc<Queue>);

pub(super) fn queue() -> (Sender, Receiver) {
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
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Sender {
    /// Queues `message`; it comes back when the writer thread is gone.
    pub(super) fn send(&self, message: Message) -> Result<(), Message> {
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
    pub(super) fn recv_timeout(&self, timeout: Duration) -> Result<Message, RecvTimeoutError> {
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
    pub(super) fn try_recv(&self) -> Result<Message, TryRecvError> {
        let mut state = self.0.state();
        match state.messages.pop_front() {
            Some(message) => Ok(message),
            None if state.closed => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}
