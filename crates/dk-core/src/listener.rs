//! What the core knows of a listener: the caps and deadlines it applies
//! ([`ListenerLimits`], from [`Limits`](crate::Limits)) and the counters it
//! keeps ([`ListenerStats`], reported by the admin API). The listeners
//! themselves are the HTTP layer's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Caps and deadlines one listener applies to its connections, from
/// `accept` on. The defaults of each listener are in
/// [`Limits`](crate::Limits) and `docs/CONFIG.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections held at once, counted from `accept`.
    pub max_connections: usize,
    /// Connections held at once from one remote address.
    pub max_connections_per_address: usize,
    /// How long a request's headers may take to arrive in full.
    pub header_read_timeout: Duration,
    /// How long a connection may move no byte while nothing is being
    /// answered.
    pub idle_timeout: Duration,
}

/// Counters of one listener: what it holds, held at most, and closed.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Connections held now, counted from `accept`.
    pub open: AtomicUsize,
    /// The most connections held at once since the listener started.
    pub peak: AtomicUsize,
    /// Connections closed at `accept` for a cap (in all or per address).
    pub refused_at_accept: AtomicU64,
    /// Connections closed for moving no byte for the idle timeout.
    pub idle_closed: AtomicU64,
}

impl ListenerStats {
    /// The counters as JSON, for the admin API's status.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "open": self.open.load(Ordering::Relaxed),
            "peak": self.peak.load(Ordering::Relaxed),
            "refusedAtAccept": self.refused_at_accept.load(Ordering::Relaxed),
            "idleClosed": self.idle_closed.load(Ordering::Relaxed),
        })
    }
}
