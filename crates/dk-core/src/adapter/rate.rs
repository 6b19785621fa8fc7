//! Rate limits of agents: every device call an agent makes takes a token
//! from that agent's bucket for all devices and from its bucket for that
//! device, before the device is reached. A bucket holds a burst of calls and
//! refills evenly over the minute, so an agent calling at a steady pace never
//! meets it, and a loop calling as fast as it can is refused once its burst
//! is spent, told when calls are allowed again.
//!
//! Calls without an agent (the in-process API, admin calls without
//! `agentId`) are not charged. Memory is bounded: a bucket refilled to full
//! is the same as none and is forgotten, and past
//! [`AgentRateLimits::max_tracked`] the least recently used buckets are
//! dropped first.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Mutex, MutexGuard, PoisonError};

use dk_proto::Refusal;

/// A nonzero count for the constants below (`n` is at least 1 in each).
const fn count(n: u32) -> NonZeroU32 {
    NonZeroU32::MIN.saturating_add(n.saturating_sub(1))
}

/// The default rate of one agent's device calls, all devices together: 300
/// a minute (5 a second) in bursts of 60. An agent reading four devices
/// every second uses four fifths of it, and a burst of 60 lets it act on
/// many devices at once; a loop spraying calls over many devices is refused
/// after 60.
pub const DEFAULT_AGENT_RATE: RateLimit = RateLimit {
    calls_per_minute: count(300),
    burst: count(60),
};

/// The default rate of one agent's calls to one device: 120 a minute (2 a
/// second) in bursts of 20. A thermostat read every 30 s, or every second,
/// uses at most half of it, so jitter in its timing never adds up to a
/// refusal; a loop calling one device as fast as it can is refused at its
/// 21st call.
pub const DEFAULT_DEVICE_RATE: RateLimit = RateLimit {
    calls_per_minute: count(120),
    burst: count(20),
};

/// How many buckets are tracked at once by default (10,000).
pub const DEFAULT_MAX_TRACKED_BUCKETS: usize = 10_000;

/// How often (in the clock's milliseconds) buckets refilled to full are swept.
const SWEEP_EVERY_MS: u64 = 10_000;

/// One token bucket's rate: calls a minute, refilled evenly, and the burst
/// it holds when full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Calls a minute; one call's token comes back every
    /// `60,000 / calls_per_minute` milliseconds.
    pub calls_per_minute: NonZeroU32,
    /// Calls that may come at once after a quiet spell (the bucket's size).
    pub burst: NonZeroU32,
}

/// How the vessel limits the rate of each agent's device calls: a token
/// bucket per agent for all devices ([`AgentRateLimits::overall`]) and one
/// per (agent, device) ([`AgentRateLimits::per_device`]), charged after
/// checks 1 to 4 and before the person is asked.
///
/// Every field is plain data, meant to be filled from a configuration file;
/// [`AgentRateLimits::default`] gives the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRateLimits {
    /// The rate of one agent's calls to all devices together; `None` sets
    /// no such limit. Default: [`DEFAULT_AGENT_RATE`].
    pub overall: Option<RateLimit>,
    /// The rate of one agent's calls to one device; `None` sets no such
    /// limit. Default: [`DEFAULT_DEVICE_RATE`].
    pub per_device: Option<RateLimit>,
    /// Buckets tracked at once (each agent's overall one and one per device
    /// it calls; at least 2); past this the least recently used are
    /// forgotten, as if full. Default: [`DEFAULT_MAX_TRACKED_BUCKETS`].
    pub max_tracked: usize,
}

impl Default for AgentRateLimits {
    fn default() -> Self {
        AgentRateLimits {
            overall: Some(DEFAULT_AGENT_RATE),
            per_device: Some(DEFAULT_DEVICE_RATE),
            max_tracked: DEFAULT_MAX_TRACKED_BUCKETS,
        }
    }
}

/// Which bucket refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    /// The agent's bucket for all devices.
    Overall,
    /// The agent's bucket for this device.
    Device(String),
}

/// Why a call was refused for its rate: which bucket, its rate, and how long
/// until a call is allowed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateRefusal {
    scope: Scope,
    limit: RateLimit,
    wait_ms: u64,
}

impl From<RateRefusal> for Refusal {
    fn from(refusal: RateRefusal) -> Refusal {
        let (calls_per_minute, burst, wait_ms) = (
            refusal.limit.calls_per_minute.get(),
            refusal.limit.burst.get(),
            refusal.wait_ms,
        );
        match refusal.scope {
            Scope::Overall => Refusal::AgentRate {
                calls_per_minute,
                burst,
                wait_ms,
            },
            Scope::Device(device_id) => Refusal::DeviceRate {
                device_id,
                calls_per_minute,
                burst,
                wait_ms,
            },
        }
    }
}

/// Whose bucket: an agent's for all devices (`device: None`) or for one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BucketKey {
    agent: Box<str>,
    device: Option<Box<str>>,
}

/// One bucket, as the time at which it would be full again (a generic cell
/// rate algorithm): `full_at` is in the clock's milliseconds times the
/// bucket's calls a minute, so one call is exactly a minute of it
/// (dk-store's `take_from_bucket`, which a fleet's shared buckets use too).
struct Bucket {
    full_at: u128,
    last_used_ms: u64,
}

struct Buckets {
    map: HashMap<BucketKey, Bucket>,
    next_sweep_ms: u64,
}

/// The rate limits of the agents calling through one adapter.
pub(crate) struct RateLimiter {
    config: AgentRateLimits,
    buckets: Mutex<Buckets>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("config", &self.config)
            .field("tracked", &self.tracked())
            .finish_non_exhaustive()
    }
}

/// A call's take from one bucket: the bucket's new `full_at`, or how long
/// until the bucket has a token again.
fn take(limit: RateLimit, full_at: Option<u128>, now_ms: u64) -> Result<u128, u64> {
    dk_store::take_from_bucket(
        limit.calls_per_minute.get(),
        limit.burst.get(),
        full_at,
        now_ms,
    )
}

impl RateLimiter {
    pub(crate) fn new(config: AgentRateLimits) -> RateLimiter {
        RateLimiter {
            config,
            buckets: Mutex::new(Buckets {
                map: HashMap::new(),
                next_sweep_ms: 0,
            }),
        }
    }

    pub(crate) fn config(&self) -> &AgentRateLimits {
        &self.config
    }

    /// Buckets tracked now (none is full).
    pub(crate) fn tracked(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> MutexGuard<'_, Buckets> {
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges one call of `agent` to `device` at `now_ms`: a token from the
    /// agent's bucket for all devices and from its bucket for the device.
    /// When either has none, nothing is taken from either, and the refusal
    /// names the one a call waits for longest.
    pub(crate) fn charge(&self, agent: &str, device: &str, now_ms: u64) -> Result<(), RateRefusal> {
        let mut buckets = self.lock();
        if now_ms >= buckets.next_sweep_ms {
            forget_full(&mut buckets, now_ms, &self.config);
            buckets.next_sweep_ms = now_ms.saturating_add(SWEEP_EVERY_MS);
        }
        let charged = [
            (self.config.overall, Scope::Overall),
            (self.config.per_device, Scope::Device(device.to_owned())),
        ];
        let mut takes = Vec::with_capacity(2);
        let mut refusal: Option<RateRefusal> = None;
        for (limit, scope) in charged {
            let Some(limit) = limit else { continue };
            let key = BucketKey {
                agent: agent.into(),
                device: match &scope {
                    Scope::Overall => None,
                    Scope::Device(device) => Some(device.as_str().into()),
                },
            };
            let bucket = buckets.map.get_mut(&key);
            match take(limit, bucket.as_ref().map(|b| b.full_at), now_ms) {
                Ok(full_at) => takes.push((key, full_at)),
                Err(wait_ms) => {
                    // A refused call still counts as use, so an agent kept
                    // refused is not the first to be forgotten.
                    if let Some(bucket) = bucket {
                        bucket.last_used_ms = now_ms;
                    }
                    if refusal.as_ref().is_none_or(|r| wait_ms > r.wait_ms) {
                        refusal = Some(RateRefusal {
                            scope,
                            limit,
                            wait_ms,
                        });
                    }
                }
            }
        }
        if let Some(refusal) = refusal {
            return Err(refusal);
        }
        // This call's buckets are put back whatever else is dropped.
        for (key, _) in &takes {
            buckets.map.remove(key);
        }
        self.make_room(&mut buckets, takes.len(), now_ms);
        for (key, full_at) in takes {
            buckets.map.insert(
                key,
                Bucket {
                    full_at,
                    last_used_ms: now_ms,
                },
            );
        }
        Ok(())
    }

    /// Makes room for `new` more buckets: full ones go first, then the least
    /// recently used eighth (at least as many as needed), so the cost of
    /// choosing is spread over many new buckets.
    fn make_room(&self, buckets: &mut Buckets, new: usize, now_ms: u64) {
        let max = self.config.max_tracked.max(2);
        if buckets.map.len().saturating_add(new) <= max {
            return;
        }
        forget_full(buckets, now_ms, &self.config);
        let excess = buckets.map.len().saturating_add(new).saturating_sub(max);
        if excess == 0 {
            return;
        }
        let mut last_used: Vec<u64> = buckets.map.values().map(|b| b.last_used_ms).collect();
        let drop_count = (max / 8).max(excess).min(last_used.len());
        let Some(nth) = drop_count.checked_sub(1) else {
            return;
        };
        let (_, cutoff, _) = last_used.select_nth_unstable(nth);
        let cutoff = *cutoff;
        buckets.map.retain(|_, bucket| bucket.last_used_ms > cutoff);
    }
}

/// Forgets every bucket refilled to full by `now_ms`: a full bucket is the
/// same as none.
fn forget_full(buckets: &mut Buckets, now_ms: u64, config: &AgentRateLimits) {
    buckets.map.retain(|key, bucket| {
        let limit = match key.device {
            None => config.overall,
            Some(_) => config.per_device,
        };
        limit.is_some_and(|limit| {
            let now = u128::from(now_ms).saturating_mul(u128::from(limit.calls_per_minute.get()));
            bucket.full_at > now
        })
    });
}
