//! Admission: the connections a vessel lets in ([`Vessel::admit`] and the
//! [`ConnectionPermit`] that counts them, total and per address,
//! [`Vessel::admit_waiting`] for an upgrade over its address's cap) and the
//! pairing requests it lets wait for the person ([`PairingTicket`]).

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use dk_proto::PairingLimit;

use super::state::{AddressPairings, MAX_WAITING_PER_DEVICE_ID, Vessel};

impl Vessel {
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
    pub(super) fn try_admit(
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

    pub(super) fn release_unauthenticated(&self, address: Option<IpAddr>) {
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

    pub(super) fn release_connection(&self, address: Option<IpAddr>) {
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
    /// [`Limits::no_screen_off_loopback`](crate::Limits::no_screen_off_loopback) allows it.
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
