//! The vessel's state: [`Vessel`] itself, with what it counts ([`Stats`])
//! and the pairing requests it lets wait, the one struct every other part
//! of the vessel works on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dk_channel::StaticKey;
use tokio::sync::{Notify, broadcast, watch};

use super::decisions::Decision;
use crate::adapter::DeviceToolAdapter;
use crate::agents::AgentDirectory;
use crate::limits::Limits;
use crate::link::DeviceEvent;
use crate::listener::ListenerStats;
use crate::metrics::Metrics;
use crate::person::PersonChannel;
use crate::redact::SecretRedactor;
use crate::store::AuditWriter;

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

/// A running vessel's shared state.
pub struct Vessel {
    pub(super) adapter: DeviceToolAdapter,
    pub(super) person: Arc<PersonChannel>,
    pub(super) events: broadcast::Sender<DeviceEvent>,
    pub(super) limits: Limits,
    pub(super) stats: Stats,
    pub(super) connections: AtomicUsize,
    /// Per remote address: (all connections, unauthenticated ones).
    pub(super) per_address: Mutex<HashMap<Option<IpAddr>, (usize, usize)>>,
    /// Per remote address, the upgrades waiting for one of its places for
    /// unauthenticated connections ([`Vessel::admit_waiting`]), woken one
    /// at a time as places free.
    pub(super) waiting: Mutex<HashMap<Option<IpAddr>, Arc<Notify>>>,
    pub(super) pairings: Mutex<PairingGate>,
    pub(super) decisions: Arc<Mutex<VecDeque<Arc<Decision>>>>,
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) writer: Arc<AuditWriter>,
    pub(super) redactor: SecretRedactor,
    pub(super) agents: Arc<AgentDirectory>,
    /// Streaming devices: admission, sessions, subscribers.
    pub(super) streams: crate::stream::Streams,
    /// Microphones open on voice devices, as their events said.
    pub(super) microphones: crate::microphones::Microphones,
    /// The vessel's static key for dk/2: made fresh for a vessel in memory,
    /// replaced by the one kept outside the data directory.
    pub(super) identity: RwLock<Option<Arc<StaticKey>>>,
    /// Where the rules in force came from (their file and its digest),
    /// held while a reload loads, applies and records them.
    pub(crate) rule_source: Mutex<RuleSource>,
    /// What the vessel counts for its operator.
    pub(super) metrics: Arc<Metrics>,
    /// The vessel's place in its fleet, when it is a member: told by the
    /// fleet's membership, read by the status and metrics.
    pub(super) fleet_status: crate::hook::Hook<FleetStatusFn>,
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

impl fmt::Debug for Vessel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vessel")
            .field("adapter", &self.adapter)
            .field("connections", &self.connections.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Pairing requests for one device id that may wait for the person at once,
/// each from another address: the person tells them apart by their codes.
pub(crate) const MAX_WAITING_PER_DEVICE_ID: usize = 4;

/// Pairing attempts per address: waiting requests and a refilling budget.
pub(super) struct AddressPairings {
    pub(super) pending: usize,
    pub(super) tokens: f64,
    pub(super) refilled: tokio::time::Instant,
}

#[derive(Default)]
pub(super) struct PairingGate {
    /// Waiting requests: (device id, address) -> how many (at most one).
    pub(super) pending_ids: HashSet<(String, Option<IpAddr>)>,
    /// Waiting requests per device id, from any address.
    pub(super) per_id: HashMap<String, usize>,
    pub(super) per_address: HashMap<Option<IpAddr>, AddressPairings>,
}
