//! Stream chunks from a streaming device (kind `voice` or `desktop-control`):
//! a bounded queue the device's code fills ([`StreamSender`]) and the client
//! empties onto the connection ([`ClientOptions::streams`](crate::ClientOptions::streams))
//! once the vessel has admitted the device (`device:streaming`). A vessel
//! that never admits the device (a v1 vessel, or one that does not stream
//! this kind) never receives a chunk.
//!
//! ```
//! use dk_device::{StreamSendError, stream_channel};
//!
//! let (chunks, outbox) = stream_channel(8);
//! chunks.try_send("microphone", vec![0; 640])?;
//! # drop(outbox);
//! # Ok::<(), StreamSendError>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dk_proto::{MAX_STREAM_NAME_BYTES, StreamChunk};
use tokio::sync::mpsc;

/// Chunks a stream queue holds by default before [`StreamSender::try_send`]
/// refuses more.
pub const DEFAULT_STREAM_QUEUE: usize = 32;

/// Why a chunk was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamSendError {
    /// The stream name is not a capability-style name of 1 to 30 bytes.
    #[error("stream name {0:?} must be 1 to {MAX_STREAM_NAME_BYTES} bytes of lower snake case")]
    BadName(String),
    /// The payload is longer than a chunk can declare (4 GiB).
    #[error("a chunk holds at most 4 GiB")]
    TooLarge,
    /// The queue is full: the connection is slower than the chunks come, or
    /// the device is not connected or not admitted. The chunk is dropped
    /// (and counted, [`StreamSender::dropped`]).
    #[error("the stream queue is full")]
    Full,
    /// The [`StreamReceiver`] was dropped.
    #[error("the stream queue is closed")]
    Closed,
}

/// One queued chunk.
pub(crate) struct OutChunk {
    pub(crate) stream: String,
    pub(crate) seq: u64,
    pub(crate) payload: Vec<u8>,
}

/// Queues stream chunks for the client to send. Cheap to clone; every clone
/// numbers its chunks from the same counter.
#[derive(Clone)]
pub struct StreamSender {
    tx: mpsc::Sender<OutChunk>,
    seq: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl fmt::Debug for StreamSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSender")
            .field("sent", &self.seq.load(Ordering::Relaxed))
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// The receiving end of [`stream_channel`]; give it to the client with
/// [`ClientOptions::streams`](crate::ClientOptions::streams).
pub struct StreamReceiver {
    pub(crate) rx: mpsc::Receiver<OutChunk>,
    pub(crate) dropped: Arc<AtomicU64>,
}

impl fmt::Debug for StreamReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamReceiver").finish_non_exhaustive()
    }
}

/// A queue of stream chunks holding up to `capacity` (at least one).
pub fn stream_channel(capacity: usize) -> (StreamSender, StreamReceiver) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let dropped = Arc::new(AtomicU64::new(0));
    (
        StreamSender {
            tx,
            seq: Arc::new(AtomicU64::new(0)),
            dropped: Arc::clone(&dropped),
        },
        StreamReceiver { rx, dropped },
    )
}

fn check(stream: &str, payload: &[u8]) -> Result<(), StreamSendError> {
    let probe = StreamChunk {
        stream,
        seq: 0,
        payload: &[],
    };
    if probe.encode().is_none() {
        return Err(StreamSendError::BadName(stream.to_owned()));
    }
    if u32::try_from(payload.len()).is_err() {
        return Err(StreamSendError::TooLarge);
    }
    Ok(())
}

impl StreamSender {
    /// Queues a chunk of `stream` (a sensor capability of the device) without
    /// waiting; returns its sequence number. A full queue drops it
    /// ([`StreamSendError::Full`]): live audio or screens are better late
    /// than piled up.
    pub fn try_send(&self, stream: &str, payload: Vec<u8>) -> Result<u64, StreamSendError> {
        check(stream, &payload)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let chunk = OutChunk {
            stream: stream.to_owned(),
            seq,
            payload,
        };
        self.tx.try_send(chunk).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                StreamSendError::Full
            }
            mpsc::error::TrySendError::Closed(_) => StreamSendError::Closed,
        })?;
        Ok(seq)
    }

    /// Queues a chunk, waiting for room; returns its sequence number.
    pub async fn send(&self, stream: &str, payload: Vec<u8>) -> Result<u64, StreamSendError> {
        check(stream, &payload)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let chunk = OutChunk {
            stream: stream.to_owned(),
            seq,
            payload,
        };
        self.tx
            .send(chunk)
            .await
            .map_err(|_| StreamSendError::Closed)?;
        Ok(seq)
    }

    /// Chunks dropped so far: the queue was full, or (counted by the client)
    /// a chunk was over the cap the vessel announced.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_are_numbered_and_a_full_queue_drops() {
        let (sender, mut receiver) = stream_channel(2);
        assert_eq!(sender.try_send("microphone", vec![1]), Ok(0));
        assert_eq!(sender.clone().try_send("microphone", vec![2]), Ok(1));
        assert_eq!(
            sender.try_send("microphone", vec![3]),
            Err(StreamSendError::Full)
        );
        assert_eq!(sender.dropped(), 1);
        let first = receiver.rx.recv().await.unwrap();
        assert_eq!((first.seq, first.payload), (0, vec![1]));
        assert_eq!(
            sender.try_send("Microphone", vec![]),
            Err(StreamSendError::BadName("Microphone".to_owned()))
        );
        drop(receiver);
        assert_eq!(
            sender.send("microphone", vec![]).await,
            Err(StreamSendError::Closed)
        );
    }
}
