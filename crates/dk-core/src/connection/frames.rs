//! The frames waiting for a connection's writer: the calls' `device:invoke`
//! frames and the vessel's own (pairing codes, errors).
//!
//! A deque under a lock that keeps its buffer, and the writer's waker: a
//! frame queued allocates nothing, where a channel allocates a block every
//! few frames on the caller's thread for the connection's task to free.
//! It holds at most its bound; past it, or once the writer is gone, a frame
//! is refused at once, never waited for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use dk_proto::SendError;
use futures::future::BoxFuture;
use futures::task::AtomicWaker;

use crate::link::FrameSink;

/// The queue, shared by its senders and the writer.
struct Shared {
    state: Mutex<State>,
    writer: AtomicWaker,
    bound: usize,
}

struct State {
    frames: VecDeque<String>,
    /// The writer is gone: nothing queued from now on would be sent.
    closed: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What queues frames: cloned for every part of the connection that sends.
#[derive(Clone)]
pub(super) struct Frames(Arc<Shared>);

/// What the writer takes frames from; dropping it refuses every later frame.
pub(super) struct Queued(Arc<Shared>);

/// A queue holding at most `bound` frames.
pub(super) fn frames(bound: usize) -> (Frames, Queued) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            closed: false,
        }),
        writer: AtomicWaker::new(),
        bound,
    });
    (Frames(Arc::clone(&shared)), Queued(shared))
}

impl Frames {
    /// Queues `text` for the writer, without waiting.
    pub(super) fn send(&self, text: String) -> Result<(), SendError> {
        let mut state = self.0.state();
        if state.closed {
            return Err(SendError::Closed);
        }
        if state.frames.len() >= self.0.bound {
            return Err(SendError::BackedUp);
        }
        state.frames.push_back(text);
        drop(state);
        self.0.writer.wake();
        Ok(())
    }
}

impl FrameSink for Frames {
    fn send_frame(&self, text: String) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(std::future::ready(self.send(text)))
    }
}

impl Queued {
    /// The next frame, waiting for one.
    pub(super) async fn next(&self) -> String {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<String> {
        if let Some(text) = self.try_next() {
            return Poll::Ready(text);
        }
        self.0.writer.register(cx.waker());
        // A frame queued between the look and the registration woke nobody.
        match self.try_next() {
            Some(text) => Poll::Ready(text),
            None => Poll::Pending,
        }
    }

    /// The next frame, if one is queued.
    pub(super) fn try_next(&self) -> Option<String> {
        self.0.state().frames.pop_front()
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.closed = true;
        state.frames.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use futures::FutureExt;

    use super::*;

    #[test]
    fn frames_come_out_in_order_up_to_the_bound_and_none_once_the_writer_is_gone() {
        let (frames, queued) = frames(2);
        assert_eq!(frames.send("a".to_owned()), Ok(()));
        assert_eq!(frames.send("b".to_owned()), Ok(()));
        assert_eq!(frames.send("c".to_owned()), Err(SendError::BackedUp));
        assert_eq!(queued.next().now_or_never().as_deref(), Some("a"));
        assert_eq!(frames.send("c".to_owned()), Ok(()));
        assert_eq!(queued.try_next().as_deref(), Some("b"));
        assert_eq!(queued.try_next().as_deref(), Some("c"));
        assert_eq!(queued.try_next(), None);
        drop(queued);
        assert_eq!(frames.send("d".to_owned()), Err(SendError::Closed));
    }

    #[test]
    fn a_frame_queued_wakes_the_waiting_writer() {
        let (frames, queued) = frames(4);
        let woken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waker = Waker::from(Arc::new(Flag(Arc::clone(&woken))));
        let mut cx = Context::from_waker(&waker);
        assert!(queued.poll_next(&mut cx).is_pending());
        frames.send("x".to_owned()).unwrap();
        assert!(woken.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(queued.poll_next(&mut cx), Poll::Ready("x".to_owned()));
    }

    struct Flag(Arc<std::sync::atomic::AtomicBool>);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
