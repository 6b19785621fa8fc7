//! Time as the platform tells it: a monotonic instant passed in, never read.

use core::time::Duration;

/// A moment on the platform's monotonic clock, in milliseconds since any
/// origin it likes (its boot, say). The core never reads a clock: every
/// call that needs the time is given one, and a timer it asks for is an
/// `Instant` on the same clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The instant `millis` milliseconds after the clock's origin.
    pub const fn from_millis(millis: u64) -> Instant {
        Instant(millis)
    }

    /// Milliseconds since the clock's origin.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This instant plus `duration`, at the clock's end rather than past it.
    pub fn saturating_add(self, duration: Duration) -> Instant {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(millis))
    }

    /// How long after `earlier` this is; zero when it is not after.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}
