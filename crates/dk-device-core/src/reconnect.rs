//! When and whether a device connects again, as rules every driver shares:
//! the wait between attempts ("full jitter" over a doubling ceiling), which
//! answers that come before the channel a device may believe, a busy
//! vessel's `Retry-After`, and how long running calls get when the device
//! shuts down. Pure functions: the driver passes in the random number, the
//! HTTP status and the header's text; the core reads no clock and draws no
//! randomness here.

use core::time::Duration;

/// The first reconnect waits up to this long, by default.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(500);

/// A reconnect never waits longer than this, by default.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A connection that lasted at least this long resets the backoff and the
/// count of attempts.
pub const STABLE_SESSION: Duration = Duration::from_secs(10);

/// How long calls still running get to answer when the device shuts down,
/// by default, before the connection is closed.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The shortest and the longest wait a busy vessel's `Retry-After` is taken
/// as.
pub const RETRY_AFTER: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// The wait before the next attempt: `random` spread uniformly over zero
/// to `initial * 2^doublings`, that ceiling capped at `max`. The spread
/// keeps a fleet of devices refused at once from coming back at once.
pub fn next_backoff(initial: Duration, max: Duration, doublings: u32, random: u64) -> Duration {
    let factor = 2u32.saturating_pow(doublings.min(31));
    let ceiling = initial.saturating_mul(factor).min(max);
    let ceiling = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
    let micros = match ceiling.checked_add(1) {
        Some(span) => random % span,
        None => random,
    };
    Duration::from_micros(micros)
}

/// A busy vessel's `Retry-After` (`text`, the header's value when there is
/// one) as a wait: whole seconds, from 1 s to 60 s; 1 s when it is missing
/// or is not a number of seconds (an HTTP date is not taken: the device's
/// clock need not agree with the vessel's).
pub fn retry_after(text: Option<&str>) -> Duration {
    let seconds = text.and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(1);
    Duration::from_secs(seconds).clamp(RETRY_AFTER.0, RETRY_AFTER.1)
}

/// An answer a connection got before any channel was made: said by the
/// vessel, or by anyone on the path between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outside {
    /// HTTP 403 at the upgrade: the vessel does not take this device here.
    Forbidden,
    /// An upgrade without the `dk.2` subprotocol: the vessel speaks only v1.
    NotDk2,
    /// HTTP 503: the vessel is busy and says when to come back.
    Busy {
        /// The wait it asked for ([`retry_after`]).
        retry_after: Duration,
    },
    /// Anything else that is not a WebSocket (another HTTP status, no
    /// answer at all).
    Unreachable,
}

/// What a device does with an [`Outside`] answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Stop connecting: retrying cannot help until the person acts.
    Stop,
    /// Try again after the usual backoff ([`next_backoff`]).
    Retry,
    /// Try again after a wait spread over this long (a busy vessel's
    /// `Retry-After`, as [`next_backoff`] with it as both bounds).
    RetryWithin(Duration),
}

/// Whether a device believes an answer from outside the channel. A device
/// paired over dk/2 hears its vessel's refusals inside the channel, so a
/// 403 or a v1-only answer before it may be forged by anyone on the path to
/// stop it for good: it tries again. An unpaired or v1 device has no
/// channel to hear them in and stops, so a person sees why. A busy vessel
/// is waited for, either way.
pub fn believe(answer: Outside, paired_dk2: bool) -> Verdict {
    match answer {
        Outside::Forbidden | Outside::NotDk2 if paired_dk2 => Verdict::Retry,
        Outside::Forbidden | Outside::NotDk2 => Verdict::Stop,
        Outside::Busy { retry_after } => Verdict::RetryWithin(retry_after),
        Outside::Unreachable => Verdict::Retry,
    }
}

/// [`Outside`] for an HTTP status answered at the upgrade (`retry_after`:
/// the 503's header, if any).
pub fn outside_status(status: u16, retry_after: Option<&str>) -> Outside {
    match status {
        403 => Outside::Forbidden,
        503 => Outside::Busy {
            retry_after: self::retry_after(retry_after),
        },
        _ => Outside::Unreachable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spreads_the_random_number_under_a_doubling_capped_ceiling() {
        let (initial, max) = (Duration::from_millis(500), Duration::from_secs(30));
        assert_eq!(next_backoff(initial, max, 0, 0), Duration::ZERO);
        assert_eq!(next_backoff(initial, max, 0, 500_000), initial);
        assert_eq!(next_backoff(initial, max, 0, 500_001), Duration::ZERO);
        assert_eq!(
            next_backoff(initial, max, 2, 1_999_999),
            Duration::from_micros(1_999_999)
        );
        // Past the cap, the ceiling stays at `max` whatever the doublings.
        for doublings in [6, 31, 40, u32::MAX] {
            assert_eq!(next_backoff(initial, max, doublings, 30_000_000), max);
            assert!(next_backoff(initial, max, doublings, u64::MAX) <= max);
        }
        assert!(next_backoff(Duration::MAX, Duration::MAX, u32::MAX, u64::MAX) > Duration::ZERO);
    }

    #[test]
    fn retry_after_is_whole_seconds_from_one_to_sixty() {
        assert_eq!(retry_after(None), Duration::from_secs(1));
        assert_eq!(retry_after(Some(" 7 ")), Duration::from_secs(7));
        assert_eq!(retry_after(Some("0")), Duration::from_secs(1));
        assert_eq!(retry_after(Some("3600")), Duration::from_secs(60));
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2026 07:28:00 GMT")),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn only_a_device_without_a_channel_believes_a_refusal_from_outside_it() {
        for answer in [Outside::Forbidden, Outside::NotDk2] {
            assert_eq!(believe(answer, true), Verdict::Retry);
            assert_eq!(believe(answer, false), Verdict::Stop);
        }
        let busy = outside_status(503, Some("5"));
        assert_eq!(
            believe(busy, true),
            Verdict::RetryWithin(Duration::from_secs(5))
        );
        assert_eq!(believe(outside_status(502, None), false), Verdict::Retry);
        assert_eq!(outside_status(403, None), Outside::Forbidden);
    }
}
