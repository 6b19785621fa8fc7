//! The vessel's state in one place: registry, connected devices, the tool
//! adapter, the person channel, device events, limits and admission counters.
//! Transports (the WebSocket route, in-process links) and front ends (the
//! admin API, the terminal prompt) all work on a shared [`Vessel`].

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod agent_tests;
#[cfg(test)]
mod bytes_tests;
#[cfg(test)]
mod decision_tests;
#[cfg(test)]
mod durable_tests;
#[cfg(test)]
mod store_tests;
mod streaming;

pub use crate::limits::{Limits, PlainV1};

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use dk_channel::StaticKey;
use dk_policy::PolicySet;
use dk_proto::{Channel, PairingLimit};
use serde_json::Value;
use tokio::sync::{Notify, broadcast, watch};

use crate::adapter::{AllowanceUse, DecisionRecord, DeviceToolAdapter};
use crate::agents::{
    AgentCredential, AgentDirectory, AgentError, AgentId, AgentRole, AgentScope, StoredAgent,
};
use crate::by::By;
use crate::link::{DeviceEvent, Links};
use crate::listener::ListenerStats;
use crate::metrics::Metrics;
use crate::person::PersonChannel;
use crate::redact::{SecretRedactor, redact_logs_with};
use crate::registry::DeviceRegistry;
use crate::store::entry as schema;
use crate::store::{
    AuditEvent, AuditText, AuditWriter, Made, Store, StoreError, WriterOptions, fits_in_entry,
};

/// Pairing requests for one device id that may wait for the person at once,
/// each from another address: the person tells them apart by their codes.
pub(crate) const MAX_WAITING_PER_DEVICE_ID: usize = 4;

/// How many decision records the vessel keeps in memory for listings.
const RECENT_DECISIONS: usize = 1000;

/// Counters a vessel keeps about its connections.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections refused for the total or per-address limit.
    pub refused_connections: AtomicU64,
    /// The most unauthenticated connections one address has held at once:
    /// never more than `max_unauthenticated_per_address`.
    pub peak_unauthenticated: AtomicU64,
    /// Frames that did not parse or were not allowed at that point.
    pub malformed_frames: AtomicU64,
    /// Results for calls that were not pending.
    pub unknown_results: AtomicU64,
    /// Device events dropped because no subscriber listened.
    pub events_dropped: AtomicU64,
    /// dk/2 handshakes that finished.
    pub secure_handshakes: AtomicU64,
    /// dk/2 connections closed 4012: a handshake or record that did not
    /// hold.
    pub channel_failures: AtomicU64,
    /// v1 upgrades refused where plain v1 is not allowed.
    pub plain_v1_refused: AtomicU64,
    /// The `/device` listener's connections.
    pub device_listener: Arc<ListenerStats>,
    /// The admin API listener's connections.
    pub admin_listener: Arc<ListenerStats>,
    /// The MCP listener's connections.
    pub mcp_listener: Arc<ListenerStats>,
    /// The admin API's Unix socket's connections.
    pub admin_socket: Arc<ListenerStats>,
    /// The MCP Unix socket's connections.
    pub mcp_socket: Arc<ListenerStats>,
    /// The metrics listener's connections, when it has one of its own.
    pub metrics_listener: Arc<ListenerStats>,
}

/// Pairing attempts per address: waiting requests and a refilling budget.
struct AddressPairings {
    pending: usize,
    tokens: f64,
    refilled: tokio::time::Instant,
}

#[derive(Default)]
struct PairingGate {
    /// Waiting requests: (device id, address) -> how many (at most one).
    pending_ids: HashSet<(String, Option<IpAddr>)>,
    /// Waiting requests per device id, from any address.
    per_id: HashMap<String, usize>,
    per_address: HashMap<Option<IpAddr>, AddressPairings>,
}

/// One pairing request waiting for the person; leaves the count when dropped.
pub struct PairingTicket {
    vessel: Arc<Vessel>,
    device_id: String,
    address: Option<IpAddr>,
}

impl fmt::Debug for PairingTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PairingTicket")
            .field("device_id", &self.device_id)
            .finish()
    }
}

impl Drop for PairingTicket {
    fn drop(&mut self) {
        let mut gate = self
            .vessel
            .pairings
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (std::mem::take(&mut self.device_id), self.address);
        gate.pending_ids.remove(&key);
        if let Some(count) = gate.per_id.get_mut(&key.0) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                gate.per_id.remove(&key.0);
            }
        }
        if let Some(entry) = gate.per_address.get_mut(&self.address) {
            entry.pending = entry.pending.saturating_sub(1);
        }
    }
}

/// Why a new connection was refused before its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionRefused {
    /// The vessel is shutting down.
    #[error("the vessel is shutting down")]
    ShuttingDown,
    /// The vessel holds its most connections.
    #[error("the vessel has too many connections")]
    TooMany,
    /// The address holds its most connections.
    #[error("too many connections from this address")]
    TooManyFromAddress,
    /// The address holds its most connections that have not authenticated.
    #[error("too many unauthenticated connections from this address")]
    TooManyUnauthenticated,
}

/// Permission to hold one connection; counts down when dropped.
pub struct ConnectionPermit {
    vessel: Arc<Vessel>,
    address: Option<IpAddr>,
    authenticated: bool,
    connected_at: tokio::time::Instant,
    off_loopback: bool,
}

impl fmt::Debug for ConnectionPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionPermit")
            .field("address", &self.address)
            .field("authenticated", &self.authenticated)
            .finish()
    }
}

impl ConnectionPermit {
    /// The remote address the connection came from, when known.
    pub fn address(&self) -> Option<IpAddr> {
        self.address
    }

    /// When the connection was made: the handshake deadline counts from it.
    pub(crate) fn connected_at(&self) -> tokio::time::Instant {
        self.connected_at
    }

    /// Says the connection was accepted at `at`, before the permit was
    /// taken (the upgrade came later), so its handshake deadline counts
    /// from the connect.
    pub fn accepted_at(&mut self, at: tokio::time::Instant) {
        self.connected_at = self.connected_at.min(at);
    }

    /// Says the connection did not come over loopback: the listener is on
    /// another address, or a proxy header says the peer is elsewhere. A
    /// device that says it has no screen may then pair only when
    /// [`Limits::no_screen_off_loopback`] allows it.
    pub fn off_loopback(&mut self) {
        self.off_loopback = true;
    }

    /// Whether [`ConnectionPermit::off_loopback`] was said.
    pub fn is_off_loopback(&self) -> bool {
        self.off_loopback
    }

    /// The connection authenticated: it no longer counts against the
    /// per-address limit on unauthenticated connections.
    pub fn authenticated(&mut self) {
        if !self.authenticated {
            self.authenticated = true;
            self.vessel.release_unauthenticated(self.address);
        }
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        if !self.authenticated {
            self.vessel.release_unauthenticated(self.address);
        }
        self.vessel.release_connection(self.address);
        self.vessel.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A running vessel's shared state.
pub struct Vessel {
    adapter: DeviceToolAdapter,
    person: Arc<PersonChannel>,
    events: broadcast::Sender<DeviceEvent>,
    limits: Limits,
    stats: Stats,
    connections: AtomicUsize,
    /// Per remote address: (all connections, unauthenticated ones).
    per_address: Mutex<HashMap<Option<IpAddr>, (usize, usize)>>,
    /// Per remote address, the upgrades waiting for one of its places for
    /// unauthenticated connections ([`Vessel::admit_waiting`]), woken one
    /// at a time as places free.
    waiting: Mutex<HashMap<Option<IpAddr>, Arc<Notify>>>,
    pairings: Mutex<PairingGate>,
    decisions: Arc<Mutex<VecDeque<Arc<Decision>>>>,
    shutdown: watch::Sender<bool>,
    writer: Arc<AuditWriter>,
    redactor: SecretRedactor,
    agents: Arc<AgentDirectory>,
    /// Streaming devices: admission, sessions, subscribers.
    streams: crate::stream::Streams,
    /// Microphones open on voice devices, as their events said.
    microphones: crate::microphones::Microphones,
    /// The vessel's static key for dk/2: made fresh for a vessel in memory,
    /// replaced by the one kept outside the data directory.
    identity: RwLock<Option<Arc<StaticKey>>>,
    /// Where the rules in force came from (their file and its digest),
    /// held while a reload loads, applies and records them.
    pub(crate) rule_source: Mutex<RuleSource>,
    /// What the vessel counts for its operator.
    metrics: Arc<Metrics>,
    /// The vessel's place in its fleet, when it is a member: told by the
    /// fleet's membership, read by the status and metrics.
    fleet_status: crate::hook::Hook<FleetStatusFn>,
}

/// Says a fleet member's state now ([`Vessel::set_fleet_status`]).
pub type FleetStatusFn = dyn Fn() -> dk_proto::admin::FleetStatus + Send + Sync;

/// Where the rules in force came from (`reload.rs` keeps it).
#[derive(Clone, Default)]
pub(crate) struct RuleSource {
    /// The rule file, when they came from one.
    pub(crate) file: Option<std::path::PathBuf>,
    /// The SHA-256 of the file's bytes when they were read.
    pub(crate) sha256: Option<String>,
    /// How the host reads the rule file again, when they came from one.
    #[expect(
        clippy::type_complexity,
        reason = "the reader's type, spelt out: naming it here would make the modules use each other"
    )]
    pub(crate) reader: Option<
        Arc<dyn Fn(&std::path::Path) -> Result<String, dk_policy::PolicyFileError> + Send + Sync>,
    >,
}

impl std::fmt::Debug for RuleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSource")
            .field("file", &self.file)
            .field("sha256", &self.sha256)
            .finish_non_exhaustive()
    }
}

/// Keeps each decision: in the recent list, and in the audit log with the
/// call's input (secrets removed, long values cut).
struct DecisionAudit {
    recent: Arc<Mutex<VecDeque<Arc<Decision>>>>,
    writer: Arc<AuditWriter>,
    /// The vessel's redactor: every entry goes through it whole.
    redactor: SecretRedactor,
}

/// A decision record owned, taken on the call path: its texts copied into
/// one string (one allocation, freed as one wherever the decision is
/// dropped), the rest as it was, and a clone of the input; building the
/// record, its JSON and redacting happen later, off the path.
#[derive(Debug)]
struct Decision {
    at_ms: u64,
    /// The record's texts one after the other; `spans` says where each is.
    texts: String,
    /// Where each of [`Text`]'s fields lies in `texts`, when it was given.
    spans: [Option<(usize, usize)>; Text::COUNT],
    allowed: bool,
    person_answer: Option<bool>,
    allowance: Option<AllowanceUse>,
    by_person: bool,
    channel: Option<Channel>,
    answered_by: Option<By>,
    /// The call's input, as given.
    input: Option<Value>,
}

/// The text fields of a decision record, by their place in
/// [`Decision::spans`].
#[derive(Clone, Copy)]
enum Text {
    Tool,
    DeviceId,
    Capability,
    Reason,
    AgentId,
    SessionId,
    Rule,
}

impl Text {
    const COUNT: usize = 7;
}

impl Decision {
    /// Copies what the record borrows, at `at_ms`.
    fn of(record: &DecisionRecord<'_>, at_ms: u64) -> Decision {
        let given: [Option<&str>; Text::COUNT] = [
            Some(record.tool),
            record.device_id,
            record.capability,
            Some(record.reason),
            record.agent_id,
            record.session_id,
            record.rule,
        ];
        let mut texts = String::with_capacity(given.iter().flatten().map(|t| t.len()).sum());
        let spans = given.map(|text| {
            text.map(|text| {
                let start = texts.len();
                texts.push_str(text);
                (start, texts.len())
            })
        });
        Decision {
            at_ms,
            texts,
            spans,
            allowed: record.allowed,
            person_answer: record.person_answer,
            allowance: record.allowance,
            by_person: record.by_person,
            channel: record.channel,
            answered_by: record.answered_by.cloned(),
            input: record.input.cloned(),
        }
    }

    /// The text of `field`, when the record had it.
    fn text(&self, field: Text) -> Option<&str> {
        let (start, end) = self.spans.get(field as usize).copied().flatten()?;
        self.texts.get(start..end)
    }

    /// The record as the audit schema has it (its input aside).
    fn record(&self) -> schema::Decision {
        let owned = |field| self.text(field).map(str::to_owned);
        let (person, allowance) = match self.allowance {
            Some(AllowanceUse::Used(id)) => (
                Some(schema::PersonAnswer::Remembered),
                Some(schema::AllowanceRef { id, created: false }),
            ),
            made => (
                self.person_answer.map(|yes| {
                    if yes {
                        schema::PersonAnswer::Approved
                    } else {
                        schema::PersonAnswer::Refused
                    }
                }),
                match made {
                    Some(AllowanceUse::Created(id)) => {
                        Some(schema::AllowanceRef { id, created: true })
                    }
                    _ => None,
                },
            ),
        };
        schema::Decision {
            tool: owned(Text::Tool).unwrap_or_default(),
            device_id: owned(Text::DeviceId),
            capability: owned(Text::Capability),
            allowed: self.allowed,
            reason: owned(Text::Reason).unwrap_or_default(),
            agent_id: owned(Text::AgentId),
            session_id: owned(Text::SessionId),
            rule: owned(Text::Rule),
            person,
            allowance,
            caller: self.by_person.then_some(schema::Caller::Person),
            channel: self.channel.map(|channel| channel.as_str().to_owned()),
            by: self.answered_by.clone(),
            input: None,
        }
    }

    /// The record as 8DK's shape (plus `rule`), without the input; with
    /// `person` (`approved` or `refused`) when the person was asked, and
    /// `caller: "person"` for the person's own call.
    fn to_json(&self) -> Value {
        serde_json::to_value(self.record()).unwrap_or(Value::Null)
    }

    /// What the decision's audit entry is made of on the writer thread: its
    /// text written straight from the record, redacted field by field, when
    /// the record allows (see [`SecretRedactor::redact_decision_for_audit`])
    /// and the entry fits; else [`Decision::audit_event`]. Both give the
    /// same entry.
    fn audit_made(&self, redactor: &SecretRedactor) -> Made {
        let mut record = self.record();
        if redactor.redact_decision_for_audit(&mut record) {
            record.input = self
                .input
                .as_ref()
                .map(|input| redactor.redact_for_audit(input));
            if let Ok(text) = AuditText::decision(self.at_ms, &record) {
                return Made::Text(text);
            }
        }
        Made::Event(self.audit_event(redactor))
    }

    /// The decision's audit event: the record and its input, each redacted
    /// and cut by [`SecretRedactor::redact_for_audit`]. An input whose cut
    /// form would still make the entry too large to store (wide nesting,
    /// escapes) is replaced by a marker giving its size: the decision itself
    /// is always recorded.
    fn audit_event(&self, redactor: &SecretRedactor) -> AuditEvent {
        let mut entry = redactor.redact_owned_for_audit(self.to_json());
        if let (Some(input), Value::Object(map)) = (&self.input, &mut entry) {
            map.insert(
                schema::fields::INPUT.to_owned(),
                redactor.redact_for_audit(input),
            );
        }
        if !fits_in_entry(&entry)
            && let Value::Object(map) = &mut entry
            && let Some(input) = map.get_mut(schema::fields::INPUT)
        {
            *input = schema::Decision::input_cut(input.to_string().len());
        }
        AuditEvent {
            at_ms: self.at_ms,
            kind: schema::kinds::DECISION.to_owned(),
            entry,
        }
    }
}

/// The audit event of an entry of `kind` with these details, happening
/// now, every known secret in it redacted.
fn redacted_event(kind: &str, entry: &Value, redactor: &SecretRedactor) -> AuditEvent {
    AuditEvent {
        at_ms: crate::registry::epoch_ms(std::time::SystemTime::now()),
        kind: kind.to_owned(),
        entry: redactor.redact_json(entry),
    }
}

impl DecisionAudit {
    fn record(&self, record: &DecisionRecord<'_>) {
        let decision = Arc::new(Decision::of(
            record,
            crate::registry::epoch_ms(std::time::SystemTime::now()),
        ));
        let evicted = {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            let evicted = if recent.len() >= RECENT_DECISIONS {
                recent.pop_front()
            } else {
                None
            };
            recent.push_back(Arc::clone(&decision));
            evicted
        };
        let redactor = self.redactor.clone();
        // The adapter took this decision's place in the queue before the
        // call's checks. The decision that made room goes with it: freeing
        // its strings and input is the writer thread's work, not the call's.
        self.writer.record_placed(move || {
            drop(evicted);
            Some(decision.audit_made(&redactor))
        });
    }
}

impl fmt::Debug for Vessel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vessel")
            .field("adapter", &self.adapter)
            .field("connections", &self.connections.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Vessel {
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

    /// The agents that may use the vessel's tools. A change through the
    /// directory itself does what [`Vessel::remove_agent`] and
    /// [`Vessel::set_agent_scope`] do (committed to the store first, then
    /// the agent's waiting calls and allowances withdrawn as needed);
    /// [`Vessel::add_agent`] also registers the new credential as a plain
    /// secret, which the redactor otherwise knows by its hash.
    pub fn agents(&self) -> &Arc<AgentDirectory> {
        &self.agents
    }

    /// Adds an agent, committed to the store (with an `agent` audit entry,
    /// never the credential) before it returns, and registers its credential
    /// as a secret so it never reaches the audit log. The credential is
    /// returned once and not kept.
    pub fn add_agent(
        &self,
        name: &str,
        scope: AgentScope,
        role: AgentRole,
    ) -> Result<(AgentId, AgentCredential), AgentError> {
        self.add_agent_by(name, scope, role, None)
    }

    /// Adds an agent as [`Vessel::add_agent`] does; the audit entry names
    /// `by`.
    pub fn add_agent_by(
        &self,
        name: &str,
        scope: AgentScope,
        role: AgentRole,
        by: Option<&By>,
    ) -> Result<(AgentId, AgentCredential), AgentError> {
        let (id, credential) = self.agents.add_by(name, scope, role, by)?;
        self.add_secret(credential.expose());
        Ok((id, credential))
    }

    /// Removes an agent, committed to the store before it returns; its
    /// credential stops working at once, and its calls waiting for the
    /// person are withdrawn (they get a no). The same as removing it through
    /// [`Vessel::agents`]: the directory does all of it.
    pub fn remove_agent(&self, id: &str) -> Result<(), AgentError> {
        self.agents.remove(id)
    }

    /// Removes an agent as [`Vessel::remove_agent`] does; the audit entry
    /// names `by`.
    pub fn remove_agent_by(&self, id: &str, by: Option<&By>) -> Result<(), AgentError> {
        self.agents.remove_by(id, by)
    }

    /// Replaces an agent's scope, committed to the store before it returns;
    /// its calls waiting for the person that the new scope leaves out are
    /// withdrawn (they get a no). The same as re-scoping it through
    /// [`Vessel::agents`].
    pub fn set_agent_scope(&self, id: &str, scope: AgentScope) -> Result<(), AgentError> {
        self.agents.set_scope(id, scope)
    }

    /// Replaces an agent's scope as [`Vessel::set_agent_scope`] does; the
    /// audit entry names `by`.
    pub fn set_agent_scope_by(
        &self,
        id: &str,
        scope: AgentScope,
        by: Option<&By>,
    ) -> Result<(), AgentError> {
        self.agents.set_scope_by(id, scope, by)
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

    /// Connections open now.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Admits a new connection from `address`, or refuses it (with why) when
    /// the vessel is full or that address already holds too many
    /// unauthenticated connections.
    pub fn admit(
        self: &Arc<Self>,
        address: Option<IpAddr>,
    ) -> Result<ConnectionPermit, ConnectionRefused> {
        let admitted = self.try_admit(address);
        if admitted.is_err() {
            self.stats
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// [`Vessel::admit`], except that a connection refused only because
    /// its address holds its most unauthenticated connections waits, in
    /// turn with the others from that address, for one of them to
    /// authenticate or end, for up to `patience`. A fleet reconnecting at
    /// once from one address (behind a NAT, or after the vessel restarted)
    /// then comes in as fast as handshakes finish, instead of being
    /// refused and coming back at random.
    pub async fn admit_waiting(
        self: &Arc<Self>,
        address: Option<IpAddr>,
        patience: Duration,
    ) -> Result<ConnectionPermit, ConnectionRefused> {
        /// A waiter looks again at least this often, whether or not it
        /// was woken.
        const LOOK_AGAIN: Duration = Duration::from_millis(250);
        let deadline = tokio::time::Instant::now() + patience;
        let notify = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(waiting.entry(address).or_default())
        };
        let admitted = loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so a place freed meanwhile wakes it.
            notified.as_mut().enable();
            match self.try_admit(address) {
                Err(ConnectionRefused::TooManyUnauthenticated)
                    if tokio::time::Instant::now() < deadline =>
                {
                    let slice = deadline
                        .saturating_duration_since(tokio::time::Instant::now())
                        .min(LOOK_AGAIN);
                    let _ = tokio::time::timeout(slice, notified).await;
                }
                other => break other,
            }
        };
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            // The map's and this one: nobody else waits on it.
            if Arc::strong_count(&notify) <= 2 {
                waiting.remove(&address);
            }
        }
        if admitted.is_err() {
            self.stats
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Takes a place for a connection, or says why there is none (counted
    /// by the caller).
    fn try_admit(
        self: &Arc<Self>,
        address: Option<IpAddr>,
    ) -> Result<ConnectionPermit, ConnectionRefused> {
        if self.is_shutting_down() {
            return Err(ConnectionRefused::ShuttingDown);
        }
        let total = self.connections.fetch_add(1, Ordering::AcqRel);
        if total >= self.limits.max_connections {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            return Err(ConnectionRefused::TooMany);
        }
        {
            let mut counts = self
                .per_address
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (all, unauthenticated) = counts.entry(address).or_insert((0, 0));
            let refusal = if *all >= self.limits.max_connections_per_address {
                Some(ConnectionRefused::TooManyFromAddress)
            } else if *unauthenticated >= self.limits.max_unauthenticated_per_address {
                Some(ConnectionRefused::TooManyUnauthenticated)
            } else {
                None
            };
            if let Some(why) = refusal {
                drop(counts);
                self.connections.fetch_sub(1, Ordering::AcqRel);
                return Err(why);
            }
            *all += 1;
            *unauthenticated += 1;
            self.stats.peak_unauthenticated.fetch_max(
                u64::try_from(*unauthenticated).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        Ok(ConnectionPermit {
            vessel: Arc::clone(self),
            address,
            authenticated: false,
            connected_at: tokio::time::Instant::now(),
            off_loopback: false,
        })
    }

    /// Counts a `device:hello` from `address` against its per-minute budget.
    pub(crate) fn note_pairing_attempt(&self, address: Option<IpAddr>) -> Result<(), PairingLimit> {
        let per_minute = f64::from(self.limits.pairings_per_minute_per_address);
        let now = tokio::time::Instant::now();
        let mut gate = self.pairings.lock().unwrap_or_else(PoisonError::into_inner);
        // Addresses with nothing waiting and a full budget are forgotten.
        if gate.per_address.len() > 4096 {
            gate.per_address.retain(|_, a| {
                a.pending > 0
                    || a.tokens + now.duration_since(a.refilled).as_secs_f64() * per_minute / 60.0
                        < per_minute
            });
        }
        let entry = gate.per_address.entry(address).or_insert(AddressPairings {
            pending: 0,
            tokens: per_minute,
            refilled: now,
        });
        let elapsed = now.duration_since(entry.refilled).as_secs_f64();
        entry.tokens = (entry.tokens + elapsed * per_minute / 60.0).min(per_minute);
        entry.refilled = now;
        if entry.tokens < 1.0 {
            return Err(PairingLimit::TooManyAttempts);
        }
        entry.tokens -= 1.0;
        Ok(())
    }

    /// Reserves a place for a pairing request of `device_id` from `address`:
    /// one waiting request per device id and address, at most
    /// [`MAX_WAITING_PER_DEVICE_ID`] per device id (so a request made in a
    /// device's name from elsewhere cannot lock the device itself out), a
    /// cap per address and overall.
    pub(crate) fn begin_pairing(
        self: &Arc<Self>,
        device_id: &str,
        address: Option<IpAddr>,
    ) -> Result<PairingTicket, PairingLimit> {
        let mut gate = self.pairings.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (device_id.to_owned(), address);
        if gate.pending_ids.contains(&key) {
            return Err(PairingLimit::AlreadyWaiting);
        }
        if gate.per_id.get(device_id).copied().unwrap_or(0) >= MAX_WAITING_PER_DEVICE_ID {
            return Err(PairingLimit::TooManyForDevice);
        }
        if gate.pending_ids.len() >= self.limits.max_pending_pairings {
            return Err(PairingLimit::TooMany);
        }
        let pending_here = gate.per_address.get(&address).map_or(0, |a| a.pending);
        if pending_here >= self.limits.max_pending_pairings_per_address {
            return Err(PairingLimit::TooManyFromAddress);
        }
        gate.pending_ids.insert(key);
        *gate.per_id.entry(device_id.to_owned()).or_insert(0) += 1;
        let full = f64::from(self.limits.pairings_per_minute_per_address);
        gate.per_address
            .entry(address)
            .or_insert(AddressPairings {
                pending: 0,
                tokens: full,
                refilled: tokio::time::Instant::now(),
            })
            .pending += 1;
        Ok(PairingTicket {
            vessel: Arc::clone(self),
            device_id: device_id.to_owned(),
            address,
        })
    }

    fn release_unauthenticated(&self, address: Option<IpAddr>) {
        let mut counts = self
            .per_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, unauthenticated)) = counts.get_mut(&address) {
            *unauthenticated = unauthenticated.saturating_sub(1);
        }
        drop(counts);
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(next) = waiting.get(&address) {
            next.notify_one();
        }
    }

    fn release_connection(&self, address: Option<IpAddr>) {
        let mut counts = self
            .per_address
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((all, _)) = counts.get_mut(&address) {
            *all = all.saturating_sub(1);
            if *all == 0 {
                counts.remove(&address);
            }
        }
    }
}

/// What the vessel withdraws when an agent is removed (every call it has
/// waiting for the person) or re-scoped (those its new scope leaves out).
fn withdraw_waiting(
    person: Arc<PersonChannel>,
    registry: Arc<DeviceRegistry>,
) -> crate::agents::WithdrawHook {
    Arc::new(
        move |id: &str, rescoped: Option<&crate::agents::Agent>| match rescoped {
            None => {
                person.withdraw_approvals(|r| r.agent_id.as_deref() == Some(id));
            }
            Some(agent) => {
                person.withdraw_approvals(|r| {
                    let read_only = registry.get(&r.device_id).is_some_and(|d| {
                        d.manifest()
                            .capability(&r.capability)
                            .is_some_and(|c| c.kind() == dk_proto::CapabilityKind::Sensor)
                    });
                    r.agent_id.as_deref() == Some(id)
                        && !agent.may_use(&r.device_id, &r.capability, read_only)
                });
            }
        },
    )
}
