//! Streaming devices (manifest kind `voice` or `desktop-control`): their
//! admission on every connect and resume, the sessions each device holds, and
//! the chunk path from a device to the vessel's subscribers.
//!
//! Admission follows dk-policy's contract ([`dk_policy::admit`]) under the
//! policy the vessel's configuration gives the kind ([`StreamingConfig`]); a
//! kind the configuration does not name is refused `DISABLED`. Each admitted
//! connection holds a `StreamSession` until it ends, so the count of
//! sessions per device identity is exact and capped.
//!
//! Chunks reach subscribers through bounded queues
//! ([`STREAM_SUBSCRIBER_QUEUE`] each): a subscriber that does not keep up
//! loses chunks, is told how many with the next one it gets
//! ([`StreamEvent::lost_before`]), and never makes the vessel hold more.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dk_policy::{
    AdmissionError, AdmissionRequest, Admitted, ChunkVerdict, DeviceClass, DisabledReason,
    ResolvedPolicy, RunLimits, admit,
};
use dk_proto::MAX_STREAM_OVERHEAD;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::config::StreamingConfig;

/// Chunks a subscriber's queue holds; past that it loses chunks.
pub const STREAM_SUBSCRIBER_QUEUE: usize = 64;

/// A binary message up to this many times a session's chunk cap (plus the
/// largest header) is read and, when over the cap, dropped with the
/// `dropped_oversize` marker; a larger one closes the connection (1009).
pub(crate) const OVERSIZE_WINDOW: u64 = 2;

/// The streaming class of a manifest kind, when it is one (exactly `voice`
/// or `desktop-control`); any other kind is a v1 device, unaffected.
pub(crate) fn streaming_class(manifest_kind: &str) -> Option<DeviceClass> {
    DeviceClass::parse(manifest_kind).ok()
}

/// The largest binary message read for a chunk cap of `max_chunk_bytes`.
pub(crate) fn message_limit(max_chunk_bytes: u64) -> usize {
    let limit = max_chunk_bytes
        .saturating_mul(OVERSIZE_WINDOW)
        .saturating_add(MAX_STREAM_OVERHEAD as u64);
    usize::try_from(limit).unwrap_or(usize::MAX)
}

/// Counters of the stream path.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Streaming sessions admitted.
    pub admitted: AtomicU64,
    /// Streaming connections refused admission (each closed 4011).
    pub refused: AtomicU64,
    /// Chunks accepted and offered to subscribers.
    pub chunks_forwarded: AtomicU64,
    /// Payload bytes of the chunks accepted.
    pub bytes_forwarded: AtomicU64,
    /// Chunks over the cap: dropped, never forwarded, reported `dropped_oversize`.
    pub chunks_dropped_oversize: AtomicU64,
    /// Chunks of a stream whose capability the person has not granted: dropped.
    pub chunks_not_granted: AtomicU64,
    /// Chunks a subscriber lost because its queue was full (one per subscriber).
    pub chunks_lost: AtomicU64,
}

/// One chunk as a subscriber sees it: accepted (with its bytes) or dropped
/// for its size (without them).
#[derive(Clone)]
pub struct StreamEvent {
    pub(crate) device_id: Arc<str>,
    pub(crate) stream: Arc<str>,
    pub(crate) seq: u64,
    pub(crate) verdict: ChunkVerdict,
    pub(crate) message: Arc<Vec<u8>>,
    pub(crate) payload: Range<usize>,
    pub(crate) lost_before: u64,
}

impl fmt::Debug for StreamEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamEvent")
            .field("device_id", &self.device_id)
            .field("stream", &self.stream)
            .field("seq", &self.seq)
            .field("verdict", &self.verdict)
            .field("lost_before", &self.lost_before)
            .finish_non_exhaustive()
    }
}

impl StreamEvent {
    /// The device that sent the chunk.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// The stream: one of the device's sensor capabilities.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The device's chunk counter.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Accepted, or dropped with the `dropped_oversize` marker.
    pub fn verdict(&self) -> ChunkVerdict {
        self.verdict
    }

    /// The chunk's bytes; empty for a dropped chunk (they were never kept).
    pub fn payload(&self) -> &[u8] {
        if !self.verdict.accepted() {
            return &[];
        }
        self.message.get(self.payload.clone()).unwrap_or_default()
    }

    /// Chunks this subscriber lost (its queue was full) just before this one.
    pub fn lost_before(&self) -> u64 {
        self.lost_before
    }

    /// The chunk's metadata, as Prism reports a chunk plus where it came
    /// from: `{deviceId, stream, seq, accepted, bytes, marker?, lostBefore}`.
    /// Emit it through [`Vessel::stream_metadata`](crate::Vessel::stream_metadata), which redacts it.
    pub(crate) fn metadata(&self) -> Value {
        let mut value = json!({
            "deviceId": &*self.device_id,
            "stream": &*self.stream,
            "seq": self.seq,
        });
        if let (Value::Object(map), Ok(Value::Object(verdict))) =
            (&mut value, serde_json::to_value(self.verdict))
        {
            map.extend(verdict);
            map.insert("lostBefore".to_owned(), self.lost_before.into());
        }
        value
    }
}

/// A subscription to one device's streams, from now on. Dropping it
/// unsubscribes.
pub struct StreamSubscription {
    device_id: String,
    events: mpsc::Receiver<StreamEvent>,
    lost: Arc<AtomicU64>,
    streams: std::sync::Weak<Inner>,
}

impl fmt::Debug for StreamSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSubscription")
            .field("device_id", &self.device_id)
            .field("lost", &self.lost())
            .finish_non_exhaustive()
    }
}

impl Drop for StreamSubscription {
    fn drop(&mut self) {
        // Closes the queue first, so this subscriber is among those pruned.
        self.events.close();
        if let Some(inner) = self.streams.upgrade() {
            inner.prune(&self.device_id);
        }
    }
}

impl StreamSubscription {
    /// The device subscribed to.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// The next chunk; `None` once the vessel is gone.
    pub async fn recv(&mut self) -> Option<StreamEvent> {
        self.events.recv().await
    }

    /// The next chunk if one is waiting.
    pub fn try_recv(&mut self) -> Option<StreamEvent> {
        self.events.try_recv().ok()
    }

    /// Chunks this subscription lost in all because its queue was full.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

struct Subscriber {
    events: mpsc::Sender<StreamEvent>,
    /// Lost since the last chunk delivered.
    lost: u64,
    lost_total: Arc<AtomicU64>,
}

#[derive(Default)]
struct DeviceStreams {
    sessions: u64,
    subscribers: Vec<Subscriber>,
}

struct Inner {
    config: RwLock<Arc<StreamingConfig>>,
    devices: Mutex<HashMap<String, DeviceStreams>>,
    stats: StreamStats,
}

impl Inner {
    fn devices(&self) -> std::sync::MutexGuard<'_, HashMap<String, DeviceStreams>> {
        self.devices.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets `device_id`'s closed subscribers, and the device once it has
    /// neither sessions nor subscribers, so nothing is kept for a device
    /// nobody streams or watches.
    fn prune(&self, device_id: &str) {
        let mut devices = self.devices();
        if let Some(entry) = devices.get_mut(device_id) {
            entry.subscribers.retain(|s| !s.events.is_closed());
            if entry.sessions == 0 && entry.subscribers.is_empty() {
                devices.remove(device_id);
            }
        }
    }
}

/// The vessel's streaming state: the configuration, sessions per device,
/// subscribers per device.
pub(crate) struct Streams {
    inner: Arc<Inner>,
}

impl fmt::Debug for Streams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Streams")
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

/// One admitted streaming connection; the device's session count goes down
/// when it is dropped.
pub(crate) struct StreamSession {
    inner: Arc<Inner>,
    pub(crate) device_id: String,
    policy: ResolvedPolicy,
    admitted: Admitted,
}

impl fmt::Debug for StreamSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSession")
            .field("device_id", &self.device_id)
            .field("kind", &self.admitted.kind())
            .finish_non_exhaustive()
    }
}

impl StreamSession {
    /// The policy the session was admitted under.
    pub(crate) fn policy(&self) -> &ResolvedPolicy {
        &self.policy
    }

    /// The admission, with the run budget the session's calls charge.
    pub(crate) fn admitted(&self) -> &Admitted {
        &self.admitted
    }
}

impl Drop for StreamSession {
    fn drop(&mut self) {
        if let Some(entry) = self.inner.devices().get_mut(&self.device_id) {
            entry.sessions = entry.sessions.saturating_sub(1);
        }
        self.inner.prune(&self.device_id);
    }
}

impl Streams {
    /// No streaming kind admitted, no session, no subscriber.
    pub(crate) fn new() -> Streams {
        Streams {
            inner: Arc::new(Inner {
                config: RwLock::new(Arc::new(StreamingConfig::deny_all())),
                devices: Mutex::new(HashMap::new()),
                stats: StreamStats::default(),
            }),
        }
    }

    pub(crate) fn config(&self) -> Arc<StreamingConfig> {
        Arc::clone(
            &self
                .inner
                .config
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    pub(crate) fn set_config(&self, config: StreamingConfig) {
        *self
            .inner
            .config
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
    }

    pub(crate) fn stats(&self) -> &StreamStats {
        &self.inner.stats
    }

    /// The largest binary message any admitted kind may send, if any kind
    /// is enabled.
    pub(crate) fn largest_message(&self) -> Option<usize> {
        self.config().largest_chunk_cap().map(message_limit)
    }

    /// Whether admitting `class` asks the person (its policy is enabled, has
    /// a sandbox and requires approval).
    pub(crate) fn requires_approval(&self, class: DeviceClass) -> bool {
        self.config()
            .configured(class)
            .is_some_and(|p| p.enabled() && p.sandbox().is_some() && p.requires_approval())
    }

    /// Admits a session of `device_id` (checks in the contract's order) and
    /// counts it, under one lock so two connections cannot both take the
    /// last place. `session_budget` is the vessel's run budget for agent
    /// sessions, when it charges device calls to one.
    pub(crate) fn admit(
        &self,
        device_id: &str,
        class: DeviceClass,
        approved: bool,
        session_budget: Option<&RunLimits>,
    ) -> Result<StreamSession, AdmissionError> {
        let config = self.config();
        let policy = config.configured(class).ok_or(AdmissionError::Disabled(
            DisabledReason::NotEnabled { kind: class },
        ))?;
        let mut devices = self.inner.devices();
        let active = devices.get(device_id).map_or(0, |d| d.sessions);
        let admitted = admit(
            policy,
            AdmissionRequest {
                approved,
                // Counts stay far below 2^53, so the conversion is exact.
                active_sessions: active as f64,
                run_limits: session_budget,
            },
        )?;
        devices.entry(device_id.to_owned()).or_default().sessions += 1;
        Ok(StreamSession {
            inner: Arc::clone(&self.inner),
            device_id: device_id.to_owned(),
            policy: policy.clone(),
            admitted,
        })
    }

    /// Whether a session of `device_id` would be admitted were it approved:
    /// every check but the person's, so the person is never asked for a
    /// session that would be refused anyway.
    pub(crate) fn precheck(
        &self,
        device_id: &str,
        class: DeviceClass,
        session_budget: Option<&RunLimits>,
    ) -> Result<(), AdmissionError> {
        let config = self.config();
        let policy = config.configured(class).ok_or(AdmissionError::Disabled(
            DisabledReason::NotEnabled { kind: class },
        ))?;
        let active = self.sessions(device_id);
        admit(
            policy,
            AdmissionRequest {
                approved: true,
                active_sessions: active as f64,
                run_limits: session_budget,
            },
        )
        .map(|_| ())
    }

    pub(crate) fn sessions(&self, device_id: &str) -> u64 {
        self.inner
            .devices()
            .get(device_id)
            .map_or(0, |d| d.sessions)
    }

    /// Devices with sessions or subscribers (what the vessel keeps).
    pub(crate) fn tracked(&self) -> usize {
        self.inner.devices().len()
    }

    pub(crate) fn subscribe(&self, device_id: &str) -> StreamSubscription {
        let (tx, rx) = mpsc::channel(STREAM_SUBSCRIBER_QUEUE);
        let lost = Arc::new(AtomicU64::new(0));
        let mut devices = self.inner.devices();
        let entry = devices.entry(device_id.to_owned()).or_default();
        entry.subscribers.retain(|s| !s.events.is_closed());
        entry.subscribers.push(Subscriber {
            events: tx,
            lost: 0,
            lost_total: Arc::clone(&lost),
        });
        StreamSubscription {
            device_id: device_id.to_owned(),
            events: rx,
            lost,
            streams: Arc::downgrade(&self.inner),
        }
    }

    /// Offers an event to every subscriber of its device without waiting:
    /// a full queue loses it (and counts it), a closed one is removed.
    pub(crate) fn publish(&self, mut event: StreamEvent) {
        let stats = &self.inner.stats;
        let mut devices = self.inner.devices();
        let Some(entry) = devices.get_mut(&*event.device_id) else {
            return;
        };
        entry.subscribers.retain_mut(|subscriber| {
            event.lost_before = subscriber.lost;
            match subscriber.events.try_send(event.clone()) {
                Ok(()) => {
                    subscriber.lost = 0;
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    subscriber.lost = subscriber.lost.saturating_add(1);
                    subscriber.lost_total.fetch_add(1, Ordering::Relaxed);
                    stats.chunks_lost.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }
}

/// What one binary message from an admitted device came to.
pub(crate) enum ChunkOutcome {
    /// Accepted and offered to subscribers.
    Forwarded,
    /// Over the cap: dropped; the report for the device.
    Dropped(dk_proto::StreamDroppedFrame),
    /// The stream's capability is not granted: dropped, not reported.
    NotGranted,
}
