//! The vessel's streaming side: the configuration in force, subscribers
//! and the admission and chunk checks of streaming devices' connections,
//! on the state `stream.rs` keeps.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dk_policy::{ChunkVerdict, RunLimits, accept_chunk};
use serde_json::Value;

use super::Vessel;
use crate::config::StreamingConfig;
use crate::stream::*;

impl Vessel {
    /// Replaces the streaming configuration: which kinds are admitted and
    /// their caps. It applies to every later connect and resume; sessions
    /// already admitted keep the policy they were admitted under.
    pub fn set_streaming(&self, config: StreamingConfig) {
        self.streams().set_config(config);
    }

    /// The streaming configuration in force (by default, no kind admitted).
    pub fn streaming(&self) -> Arc<StreamingConfig> {
        self.streams().config()
    }

    /// Subscribes to `device_id`'s stream chunks from now on, whether or not
    /// the device is connected. The queue holds [`STREAM_SUBSCRIBER_QUEUE`]
    /// chunks; a subscriber that falls behind loses chunks and is told how
    /// many ([`StreamEvent::lost_before`], [`StreamSubscription::lost`]).
    pub fn subscribe_stream(&self, device_id: &str) -> StreamSubscription {
        self.streams().subscribe(device_id)
    }

    /// Counters of the stream path.
    pub fn stream_stats(&self) -> &StreamStats {
        self.streams().stats()
    }

    /// Streaming sessions `device_id` holds now.
    pub fn stream_sessions(&self, device_id: &str) -> u64 {
        self.streams().sessions(device_id)
    }

    /// A chunk's metadata as JSON for logs, front ends and the audit log,
    /// through the vessel's redactor: the one place stream metadata leaves
    /// the vessel.
    pub fn stream_metadata(&self, event: &StreamEvent) -> Value {
        self.redact_telemetry(&event.metadata())
    }

    /// The run budget the vessel charges every agent session's device calls
    /// to, when it charges them: the agent-level layer of its run limits.
    pub(crate) fn session_budget(&self) -> Option<RunLimits> {
        let limits = self.limits().run_limits.as_ref()?;
        RunLimits::from_layer(&limits.agent_level).ok()
    }

    /// Takes one binary message from an admitted session: checks it against
    /// the session's cap and the grants, and offers it to subscribers.
    /// `message` is a chunk [`dk_proto::StreamChunk::parse`] accepted, as
    /// `chunk`; the caller has already checked the declared capability.
    pub(crate) fn take_chunk(
        &self,
        session: &StreamSession,
        message: Vec<u8>,
        stream: &str,
        seq: u64,
        granted: bool,
    ) -> ChunkOutcome {
        let stats = self.stream_stats();
        if !granted {
            stats.chunks_not_granted.fetch_add(1, Ordering::Relaxed);
            return ChunkOutcome::NotGranted;
        }
        let payload_len = message
            .len()
            .saturating_sub(dk_proto::STREAM_HEADER_BYTES.saturating_add(stream.len()));
        // A length is always a safe integer; were it not, it is dropped.
        let verdict = accept_chunk(session.policy(), payload_len as f64).unwrap_or(
            ChunkVerdict::DroppedOversize {
                bytes: payload_len as u64,
            },
        );
        let start = message.len().saturating_sub(payload_len);
        let end = message.len();
        let (message, payload) = if verdict.accepted() {
            (Arc::new(message), start..end)
        } else {
            // A dropped chunk's bytes are never kept or forwarded.
            (Arc::new(Vec::new()), 0..0)
        };
        let event = StreamEvent {
            device_id: Arc::from(session.device_id.as_str()),
            stream: Arc::from(stream),
            seq,
            verdict,
            message,
            payload,
            lost_before: 0,
        };
        self.streams().publish(event);
        match verdict {
            ChunkVerdict::Accepted { bytes } => {
                stats.chunks_forwarded.fetch_add(1, Ordering::Relaxed);
                stats.bytes_forwarded.fetch_add(bytes, Ordering::Relaxed);
                ChunkOutcome::Forwarded
            }
            ChunkVerdict::DroppedOversize { bytes } => {
                stats
                    .chunks_dropped_oversize
                    .fetch_add(1, Ordering::Relaxed);
                ChunkOutcome::Dropped(dk_proto::StreamDroppedFrame {
                    stream: stream.to_owned(),
                    seq,
                    accepted: false,
                    bytes,
                    marker: dk_policy::DROPPED_OVERSIZE.to_owned(),
                })
            }
        }
    }
}
