//! How long the client waits between reconnects: the defaults and the
//! "full jitter" draw, both the device core's rules (dk_device_core's
//! `reconnect`), with this process's random numbers.

use std::time::Duration;

use rand::RngExt as _;

pub use dk_device_core::reconnect::{DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF, STABLE_SESSION};

/// A random wait up to `initial * 2^doublings`, capped at `max`.
pub(super) fn full_jitter(initial: Duration, max: Duration, doublings: u32) -> Duration {
    dk_device_core::reconnect::next_backoff(initial, max, doublings, rand::rng().random())
}
