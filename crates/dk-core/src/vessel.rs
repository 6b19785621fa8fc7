//! The vessel's state in one place: registry, connected devices, the tool
//! adapter, the person channel, device events, limits and admission counters.
//! Transports (the WebSocket route, in-process links) and front ends (the
//! admin API, the terminal prompt) all work on a shared [`Vessel`].

mod admission;
#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod agent_tests;
mod agents;
#[cfg(test)]
mod bytes_tests;
#[cfg(test)]
mod decision_tests;
mod decisions;
#[cfg(test)]
mod durable_tests;
mod state;
#[cfg(test)]
mod store_tests;
mod streaming;

pub use crate::limits::{Limits, PlainV1};
pub use admission::{ConnectionPermit, ConnectionRefused, PairingTicket};
use agents::withdraw_waiting;
use decisions::{Decision, DecisionAudit, redacted_event};
use state::PairingGate;
pub(crate) use state::RuleSource;
pub use state::{FleetStatusFn, Stats, Vessel};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use dk_channel::StaticKey;
use dk_policy::PolicySet;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::adapter::{DecisionRecord, DeviceToolAdapter};
use crate::agents::{AgentDirectory, AgentError, StoredAgent};
use crate::link::{DeviceEvent, Links};
use crate::metrics::Metrics;
use crate::person::PersonChannel;
use crate::redact::{SecretRedactor, redact_logs_with};
use crate::registry::DeviceRegistry;
use crate::store::entry as schema;
use crate::store::{AuditWriter, Store, StoreError, WriterOptions};

impl Vessel {
    /// The most recent decision records, oldest first (at most 1,000).
    pub fn recent_decisions(&self) -> Vec<Value> {
        let recent: Vec<Arc<Decision>> = self
            .decisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        recent
            .iter()
            .map(|d| self.redactor.redact_json(&d.to_json()))
            .collect()
    }

    /// A vessel with an empty registry kept in memory, the given rules and
    /// limits.
    pub fn new(policies: PolicySet, limits: Limits) -> Arc<Vessel> {
        Vessel::build(
            DeviceRegistry::new(),
            AgentDirectory::new(),
            policies,
            limits,
            WriterOptions::default(),
        )
    }

    /// A vessel over `store`: the pairings and agents it holds are served at
    /// once, every change is committed to it before it is acknowledged, and
    /// every decision goes to its audit log through a write-behind writer.
    pub fn open(
        store: Arc<dyn Store>,
        policies: PolicySet,
        limits: Limits,
    ) -> Result<Arc<Vessel>, StoreError> {
        Vessel::open_with_writer(store, policies, limits, WriterOptions::default())
    }

    /// [`Vessel::open`] with the audit writer batching and queueing as
    /// `writer` says.
    pub(crate) fn open_with_writer(
        store: Arc<dyn Store>,
        policies: PolicySet,
        limits: Limits,
        writer: WriterOptions,
    ) -> Result<Arc<Vessel>, StoreError> {
        let stored: Vec<StoredAgent> = store.load_agents()?;
        let agents = AgentDirectory::from_stored(stored).map_err(|error| match error {
            AgentError::Store(error) => error,
            error => StoreError::Corrupt(error.to_string()),
        })?;
        Ok(Vessel::build(
            DeviceRegistry::open(store)?,
            agents,
            policies,
            limits,
            writer,
        ))
    }

    fn build(
        registry: DeviceRegistry,
        agents: AgentDirectory,
        policies: PolicySet,
        limits: Limits,
        writer: WriterOptions,
    ) -> Arc<Vessel> {
        let agents = Arc::new(
            agents
                .with_store(Arc::clone(registry.store()))
                .with_allowances(Arc::clone(registry.allowances())),
        );
        let metrics = Arc::new(Metrics::default());
        // The bound calls are held to is the vessel's limit.
        let writer = WriterOptions {
            durable_within: limits.durable_within,
            ..writer
        };
        let writer = Arc::new(AuditWriter::start(Arc::clone(registry.store()), writer));
        let committing = Arc::clone(&metrics);
        writer.observe_commits(Box::new(move |took| committing.audit_committed(took)));
        let decisions: Arc<Mutex<VecDeque<Arc<Decision>>>> = Arc::new(Mutex::new(VecDeque::new()));
        let registry = Arc::new(registry);
        let redactor = SecretRedactor::new();
        redactor.watch_tokens(&registry, &agents);
        let (to_log, redacting) = (Arc::clone(&writer), redactor.clone());
        registry
            .allowances()
            .set_audit_hook(Arc::new(move |kind: &str, entry: Value| {
                to_log.record(redacted_event(kind, &entry, &redacting));
            }));
        redact_logs_with(&redactor);
        let hook = DecisionAudit {
            recent: Arc::clone(&decisions),
            writer: Arc::clone(&writer),
            redactor: redactor.clone(),
        };
        let mut adapter = DeviceToolAdapter::new(registry, Arc::new(Links::new()))
            .with_call_timeout(limits.call_timeout)
            .with_policies(Arc::new(policies))
            .with_decision_hook(Arc::new(move |record: &DecisionRecord<'_>| {
                hook.record(record)
            }))
            .with_decision_room(writer.room())
            .with_metrics(Arc::clone(&metrics));
        if let Some(run_limits) = &limits.run_limits {
            adapter = adapter.with_run_limits(run_limits.clone());
        }
        if let Some(rate_limits) = &limits.rate_limits {
            adapter = adapter.with_rate_limits(rate_limits.clone());
        }
        let person = Arc::new(
            PersonChannel::new(limits.approval_timeout).with_metrics(Arc::clone(&metrics)),
        );
        agents.set_withdraw(withdraw_waiting(
            Arc::clone(&person),
            Arc::clone(adapter.registry()),
        ));
        Arc::new(Vessel {
            adapter,
            person,
            events: broadcast::channel(1024).0,
            limits,
            stats: Stats::default(),
            connections: AtomicUsize::new(0),
            per_address: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            pairings: Mutex::new(PairingGate::default()),
            decisions,
            shutdown: watch::channel(false).0,
            writer,
            redactor,
            agents,
            streams: crate::stream::Streams::new(),
            microphones: crate::microphones::Microphones::default(),
            // Without randomness there is no key, and no dk/2.
            identity: RwLock::new(StaticKey::generate().ok().map(Arc::new)),
            rule_source: Mutex::new(RuleSource::default()),
            metrics,
            fleet_status: crate::hook::Hook::default(),
        })
    }

    /// Says the vessel runs as a member of a fleet, whose state `status`
    /// tells ([`Vessel::fleet_status`]).
    pub fn set_fleet_status(&self, status: Arc<FleetStatusFn>) {
        self.fleet_status.set(status);
    }

    /// The vessel's place in its fleet, when it runs as a member.
    pub fn fleet_status(&self) -> Option<dk_proto::admin::FleetStatus> {
        self.fleet_status.get().map(|status| status())
    }

    /// Uses `key` as the vessel's static key for dk/2 from the next
    /// connection on (the one kept in the data directory, so devices that
    /// pinned it still know the vessel after a restart).
    pub fn set_identity(&self, key: StaticKey) {
        *self
            .identity
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(key));
    }

    /// The vessel's static key for dk/2, if it has one (a vessel whose
    /// system gave no randomness has none and speaks only v1).
    pub fn identity(&self) -> Option<Arc<StaticKey>> {
        self.identity
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The fingerprint of the vessel's static key, as people compare it:
    /// base32 groups of four (see `docs/PROTOCOL.md`).
    pub fn fingerprint(&self) -> Option<String> {
        self.identity().map(|key| key.public().fingerprint())
    }

    /// Adds a secret (an admin or agent token, a host's own) that must never
    /// leave the vessel: from now on every occurrence is replaced by
    /// `[REDACTED]` in audit entries, device events, stream metadata and log
    /// lines (see [`Vessel::redactor`]).
    pub fn add_secret(&self, secret: &str) {
        self.redactor.add_secret(secret);
    }

    /// The vessel's one redactor: the secrets given to
    /// [`Vessel::add_secret`], the agents' credentials, and the device tokens
    /// and agent credentials known by their hashes. Clones share it.
    pub fn redactor(&self) -> &SecretRedactor {
        &self.redactor
    }

    /// Telemetry (stream metadata, anything else the vessel emits as JSON)
    /// with every known secret replaced by `[REDACTED]`, in strings and
    /// object keys, nested no deeper than 32 (`[MaxDepth]` below).
    pub fn redact_telemetry(&self, telemetry: &Value) -> Value {
        self.redactor.redact_json(telemetry)
    }

    /// Appends an entry of dk's own (one of the audit schema's kinds) to the
    /// audit log (write-behind, like decisions),
    /// known secrets redacted. When the audit queue is full this waits for
    /// room on the caller's thread (a batch commit, about a millisecond), at
    /// most [`RECORD_PATIENCE`](crate::store::RECORD_PATIENCE), then queues
    /// the event past the queue's bound: it is never dropped.
    pub fn record(&self, entry: impl Into<schema::Entry>) {
        let entry = entry.into();
        self.writer.record(redacted_event(
            entry.kind(),
            &entry.to_value(),
            &self.redactor,
        ));
    }

    /// Appends an event of the host's own, of `kind` with `entry` as its
    /// details, as [`Vessel::record`] does. dk's own entries go through
    /// [`Vessel::record`], typed by the audit schema (`dk_store::entry`);
    /// this is for a host's kinds, which readers show as raw JSON.
    pub fn audit(&self, kind: &str, entry: Value) {
        self.writer
            .record(redacted_event(kind, &entry, &self.redactor));
    }

    /// Waits until every audit entry recorded so far is committed.
    pub fn flush_audit(&self) -> Result<(), StoreError> {
        self.writer.flush()
    }

    /// Audit entries lost so far: zero unless the audit writer stopped
    /// while its store kept failing (a full queue makes calls wait, it drops
    /// nothing; see [`AuditWriter::dropped`]).
    pub fn audit_dropped(&self) -> u64 {
        self.writer.dropped()
    }

    /// Whether the store took a write within the durability bound
    /// ([`AuditWriter::store_takes_writes`]): a commit of the audit writer,
    /// or the small write it probes the store with when idle, which no
    /// reader sees and is not an audit entry ([`Store::probe_write`]).
    /// What the call path reads too: while it is false, no call reaches a
    /// device. Two atomic reads; it never waits for the store.
    pub fn store_takes_writes(&self) -> bool {
        self.writer.store_takes_writes()
    }

    /// Whether the audit writer keeps up ([`AuditWriter::keeping_up`]): its
    /// thread runs, its last commit held, no decision waits longer than the
    /// bound, and its queue is not nearly full.
    pub fn audit_keeping_up(&self) -> bool {
        self.writer.keeping_up()
    }

    /// Asks every connection to close (code 1001) and refuses new ones.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    /// Whether [`Vessel::shut_down`] was called.
    pub(crate) fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Resolves once [`Vessel::shut_down`] is called.
    pub(crate) async fn shutting_down(&self) {
        let mut rx = self.shutdown.subscribe();
        // An error means the sender is gone, which cannot happen while self lives.
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Waits until every connection has ended, at most `patience`.
    pub async fn drained(&self, patience: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + patience;
        while self.connection_count() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// The tool adapter (and through it the registry, links and rules).
    pub fn adapter(&self) -> &DeviceToolAdapter {
        &self.adapter
    }

    /// The registry of paired devices.
    pub fn registry(&self) -> &Arc<DeviceRegistry> {
        self.adapter.registry()
    }

    /// Connected devices.
    pub fn links(&self) -> &Arc<Links> {
        self.adapter.links()
    }

    /// The queue of what the person must answer.
    pub fn person(&self) -> &Arc<PersonChannel> {
        &self.person
    }

    /// Connection limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Connection counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// What the vessel counts for its operator: calls, answers, audit
    /// commits, handshakes (`metrics.rs`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Places taken in the audit writer's queue now: events waiting for a
    /// commit, and calls holding the place their decision will take.
    pub fn audit_queue_depth(&self) -> usize {
        self.writer.queued()
    }

    /// Audit entries committed since the vessel started: those the audit
    /// writer committed, and those the store committed with their change
    /// (pairings, grants, revokes, unpairs, agents).
    pub fn audit_committed(&self) -> u64 {
        self.writer
            .committed()
            .saturating_add(self.registry().changes_audited())
            .saturating_add(self.agents.changes_audited())
    }

    /// Streaming devices' admission state and subscribers (see `stream.rs`).
    pub(crate) fn streams(&self) -> &crate::stream::Streams {
        &self.streams
    }

    /// How many devices the vessel keeps stream state for: those with a
    /// stream session or a subscriber.
    pub fn stream_devices_tracked(&self) -> usize {
        self.streams.tracked()
    }

    /// The largest binary message a streaming device may send under the
    /// streaming configuration in force, if any kind is enabled.
    pub fn largest_stream_message(&self) -> Option<usize> {
        self.streams.largest_message()
    }

    /// Device events from now on (a slow subscriber misses events rather than
    /// holding devices back), known secrets already redacted.
    pub fn subscribe_events(&self) -> broadcast::Receiver<DeviceEvent> {
        self.events.subscribe()
    }

    /// Microphones open on voice devices now.
    pub fn microphones(&self) -> &crate::microphones::Microphones {
        &self.microphones
    }

    /// The person's stop: calls `device_id`'s `stop` straight through its
    /// link (a voice device's stop only ends what it does, so no grant or
    /// rule is asked), waiting at most 2 s for its answer. Logged; never
    /// an agent's call.
    pub async fn stop_microphone(
        &self,
        device_id: &str,
    ) -> Result<(), crate::microphones::StopError> {
        use crate::microphones::{StopError, VOICE_KIND};
        let device = self
            .registry()
            .get(device_id)
            .ok_or_else(|| StopError::NotPaired(device_id.to_owned()))?;
        if device.manifest().kind() != VOICE_KIND || device.manifest().capability("stop").is_none()
        {
            return Err(StopError::NotVoice(device_id.to_owned()));
        }
        let link = self
            .links()
            .reach(device_id)
            .ok_or_else(|| StopError::NotConnected(device_id.to_owned()))?;
        let input = serde_json::Map::new();
        tracing::info!(device = device_id, "the person stops the device");
        link.invoke("stop", &input, std::time::Duration::from_secs(2))
            .await
            .map(|_| ())
            .map_err(|e| StopError::Failed {
                device: device_id.to_owned(),
                why: e.to_string(),
            })
    }

    /// Sends a device event to every subscriber, its data redacted first.
    /// A voice device's microphone events are kept for the front ends
    /// ([`Vessel::microphones`]).
    pub fn publish_event(&self, mut event: DeviceEvent) {
        if let Some(device) = self.registry().get(&event.device_id) {
            let now = crate::registry::epoch_ms(std::time::SystemTime::now());
            self.microphones
                .observe(&event, device.manifest().kind(), now);
        }
        if let Some(redacted) = event
            .data
            .as_deref()
            .and_then(|d| self.redactor.redact_raw(d))
        {
            event.data = Some(redacted);
        }
        if let std::borrow::Cow::Owned(capability) = self.redactor.redact_str(&event.capability) {
            event.capability = capability;
        }
        if self.events.send(event).is_err() {
            self.stats.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
