//! What the admin API and the console show, built once: dk-proto's
//! `admin` bodies from the vessel's state (its status, open prompts,
//! devices, agents).

use std::sync::atomic::Ordering;
use std::time::{Duration, UNIX_EPOCH};

use dk_proto::admin as api;

use crate::agents::Agent;
use crate::listen::ListenerStats;
use crate::person::PendingPrompt;
use crate::registry::DeviceSnapshot;
use crate::vessel::Vessel;

/// A listener's counters as the admin API shows them.
pub(crate) fn listener_counts(stats: &ListenerStats) -> api::ListenerCounts {
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    api::ListenerCounts {
        open: count(stats.open.load(Ordering::Relaxed)),
        peak: count(stats.peak.load(Ordering::Relaxed)),
        refused_at_accept: stats.refused_at_accept.load(Ordering::Relaxed),
        idle_closed: stats.idle_closed.load(Ordering::Relaxed),
    }
}

/// The vessel's status as the admin API and the console show it.
pub(crate) fn status_body(vessel: &Vessel) -> api::Status {
    let registry = vessel.registry();
    let connected = registry.count_matching(|id| vessel.links().is_connected(id));
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let stats = vessel.stats();
    api::Status {
        paired: count(registry.count()),
        connected: count(connected),
        connections: count(vessel.connection_count()),
        pending: count(vessel.person().pending().len()),
        listeners: api::Listeners {
            devices: listener_counts(&stats.device_listener),
            admin: listener_counts(&stats.admin_listener),
            mcp: listener_counts(&stats.mcp_listener),
            admin_socket: listener_counts(&stats.admin_socket),
            mcp_socket: listener_counts(&stats.mcp_socket),
        },
        fingerprint: vessel.fingerprint(),
        secure_handshakes: stats.secure_handshakes.load(Ordering::Relaxed),
        channel_failures: stats.channel_failures.load(Ordering::Relaxed),
        plain_v1_refused: stats.plain_v1_refused.load(Ordering::Relaxed),
        fleet: vessel.fleet_status(),
        microphones: vessel.microphones().list(),
    }
}

/// An open prompt as the admin API shows it.
pub(crate) fn pending_body(pending: PendingPrompt) -> api::Pending {
    pending.into()
}

/// Every paired device as the admin API and the console show it.
pub(crate) fn device_list(vessel: &Vessel) -> Vec<api::Device> {
    let list = vessel.registry().list();
    list.into_iter().map(|s| device_body(vessel, s)).collect()
}

/// One paired device as the admin API and the console show it.
pub(crate) fn device_one(vessel: &Vessel, id: &str) -> Option<api::Device> {
    let snapshot = vessel.registry().snapshot(id)?;
    Some(device_body(vessel, snapshot))
}

fn device_body(vessel: &Vessel, snapshot: DeviceSnapshot) -> api::Device {
    let m = snapshot.device.manifest();
    let paired_at = snapshot
        .device
        .paired_at()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    api::Device {
        id: m.id().to_owned(),
        name: m.name().to_owned(),
        kind: m.kind().to_owned(),
        version: m.version().to_owned(),
        digest: snapshot.device.digest().to_owned(),
        paired_at_ms: u64::try_from(paired_at).unwrap_or(u64::MAX),
        connected: vessel.links().is_connected(m.id()),
        held_by: vessel.links().held_elsewhere(m.id()),
        channel: snapshot.device.channel(),
        grants: snapshot.grants,
        capabilities: m
            .capabilities()
            .iter()
            .map(api::DeviceCapability::of)
            .collect(),
        events: api::DeclaredEvent::all_of(m),
    }
}

/// An agent as the admin API shows it: never its credential.
pub(crate) fn agent_body(agent: &Agent) -> api::Agent {
    api::Agent {
        name: agent.id.clone(),
        scope: agent.scope.to_items(),
        role: agent.role,
        added_at_ms: agent.added_at_ms,
    }
}
