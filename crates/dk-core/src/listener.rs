//! What the core knows of a listener: the counters it keeps
//! ([`ListenerStats`], reported by the admin API). The listeners, their
//! caps and their deadlines are the HTTP layer's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

/// Counters of one listener: what it holds, held at most, and closed.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Connections held now, counted from `accept`.
    pub open: AtomicUsize,
    /// The most connections held at once since the listener started.
    pub peak: AtomicUsize,
    /// Connections accepted and served (not refused at `accept`).
    pub accepted: AtomicU64,
    /// Connections closed at `accept` for a cap (in all or per address).
    pub refused_at_accept: AtomicU64,
    /// Connections closed for moving no byte for the idle timeout.
    pub idle_closed: AtomicU64,
    /// The listener's accept loop runs: set when it starts, cleared when
    /// it ends for any reason (a readiness check reads it).
    pub serving: AtomicBool,
}
