//! How long the client waits between reconnects: the defaults and the
//! "full jitter" draw.

use std::time::Duration;

use rand::RngExt as _;

/// The first reconnect waits up to this long, by default.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(500);

/// A reconnect never waits longer than this, by default.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A connection that lasted at least this long resets the backoff and the
/// count of attempts.
pub const STABLE_SESSION: Duration = Duration::from_secs(10);

/// A random wait up to `initial * 2^doublings`, capped at `max`.
pub(super) fn full_jitter(initial: Duration, max: Duration, doublings: u32) -> Duration {
    let factor = 2u32.saturating_pow(doublings.min(31));
    let ceiling = initial.saturating_mul(factor).min(max);
    let ceiling = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rand::rng().random_range(0..=ceiling))
}
