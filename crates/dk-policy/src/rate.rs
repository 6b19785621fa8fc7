//! Rate rules: a rule's `limit: N per <window>`, and a bounded in-memory log
//! of the calls each limited rule counted.
//!
//! A rule with a limit decides only once the agent has made `N` allowed
//! calls matching it within the window; until then it is passed over as if
//! its condition did not hold. Counts are kept per rule name and per agent
//! id (a call with no agent id counts under the empty id). Evaluation only
//! reads counts ([`RateCounts`]); the host records a call against every
//! limited rule it matched once the call is allowed, and keeps the counts
//! across restarts if it wants them to survive (the vessel does, in its
//! store).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest `N` of a `limit: N per <window>`.
pub const MAX_LIMIT_CALLS: u32 = 10_000;

/// The longest window of a limit: seven days.
pub const MAX_LIMIT_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many (rule, agent) pairs a [`RateLog`] keeps by default.
pub const DEFAULT_RATE_LOG_KEYS: usize = 16_384;

/// Why a `limit` does not read. `Display` says how to write it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    /// Not `N per <window>`; the text as given.
    #[error(
        "`limit` `{}`: write `limit: N per <window>`, such as `limit: 3 per 1h` (the window in s, m, h or d)",
        .0.escape_debug()
    )]
    Shape(String),
    /// `N` is not a whole number from 1 to [`MAX_LIMIT_CALLS`]; `N` as given.
    #[error(
        "`limit` calls `{}` must be a whole number from 1 to {MAX_LIMIT_CALLS}",
        .0.escape_debug()
    )]
    Calls(String),
    /// The window is not a whole number of s, m, h or d from 1 s to
    /// [`MAX_LIMIT_WINDOW`]; the window as given.
    #[error(
        "`limit` window `{}` must be a whole number of s, m, h or d, from 1s to 7d (`1h`, `30m`)",
        .0.escape_debug()
    )]
    Window(String),
}

/// A rule's `limit`: at most `calls` allowed matching calls per agent in
/// any `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    calls: u32,
    window: Duration,
}

const UNITS: [(&str, u64); 4] = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];

impl RateLimit {
    /// A limit of `calls` per `window`, if both are within bounds (1 to
    /// [`MAX_LIMIT_CALLS`] calls; a whole number of seconds from 1 s to
    /// [`MAX_LIMIT_WINDOW`]).
    pub fn new(calls: u32, window: Duration) -> Option<RateLimit> {
        let whole = window.subsec_nanos() == 0;
        ((1..=MAX_LIMIT_CALLS).contains(&calls)
            && whole
            && window >= Duration::from_secs(1)
            && window <= MAX_LIMIT_WINDOW)
            .then_some(RateLimit { calls, window })
    }

    /// Reads `N per <window>`, where the window is a whole number followed
    /// by `s`, `m`, `h` or `d` (`3 per 1h`, `10 per 30m`, `100 per 1d`).
    /// The error says how to write it.
    pub fn parse(text: &str) -> Result<RateLimit, RateLimitError> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let [calls, per, window] = words.as_slice() else {
            return Err(RateLimitError::Shape(text.to_owned()));
        };
        if !per.eq_ignore_ascii_case("per") {
            return Err(RateLimitError::Shape(text.to_owned()));
        }
        let calls: u32 = match calls.parse() {
            Ok(n) if (1..=MAX_LIMIT_CALLS).contains(&n) => n,
            _ => return Err(RateLimitError::Calls((*calls).to_owned())),
        };
        let bad_window = || RateLimitError::Window((*window).to_owned());
        let digits = window.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = window.get(digits.len()..).unwrap_or("");
        let Some(&(_, seconds_per_unit)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(bad_window());
        };
        let amount: Option<u64> = digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse().ok())
            .flatten();
        amount
            .and_then(|a| a.checked_mul(seconds_per_unit))
            .and_then(|s| RateLimit::new(calls, Duration::from_secs(s)))
            .ok_or_else(bad_window)
    }

    /// At most this many allowed calls in a window.
    pub fn calls(&self) -> u32 {
        self.calls
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        self.window
    }
}

impl fmt::Display for RateLimit {
    /// `N per <window>` in the largest unit that divides the window.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.window.as_secs();
        let (unit, size) = UNITS
            .iter()
            .copied()
            .find(|(_, size)| seconds.is_multiple_of(*size))
            .unwrap_or(("s", 1));
        write!(f, "{} per {}{unit}", self.calls, seconds / size)
    }
}

/// Where evaluation reads how many calls a limited rule has counted.
pub trait RateCounts {
    /// How many allowed calls by `agent` (empty for none) matching rule
    /// `rule` fall within `window` before `at`. A call recorded after `at`
    /// (the clock went back) counts as within.
    fn counted(&self, rule: &str, agent: &str, window: Duration, at: SystemTime) -> u32;
}

/// No call counted yet: every limited rule is under its limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCounts;

impl RateCounts for NoCounts {
    fn counted(&self, _rule: &str, _agent: &str, _window: Duration, _at: SystemTime) -> u32 {
        0
    }
}

/// Milliseconds since the Unix epoch (0 before it, saturating far after it).
pub(crate) fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The log could not take another (rule, agent) pair: it holds as many as
/// it may, none of them expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the rate log holds {0} rule and agent pairs, none expired")]
pub struct RateLogFull(pub usize);

#[derive(Debug)]
struct Hits {
    /// The longest window the pair was recorded with, in milliseconds.
    window_ms: u64,
    /// When each call was recorded (ms since the epoch), oldest first.
    at_ms: VecDeque<u64>,
}

/// A bounded in-memory log of the calls limited rules counted: per (rule,
/// agent) pair, the times of at most the limit's `N` latest calls (more are
/// never needed to tell whether the limit is reached), and at most a fixed
/// number of pairs.
#[derive(Debug)]
pub struct RateLog {
    /// Rule name -> agent id -> calls.
    rules: HashMap<String, HashMap<String, Hits>>,
    pairs: usize,
    max_pairs: usize,
}

impl Default for RateLog {
    fn default() -> Self {
        RateLog::new(DEFAULT_RATE_LOG_KEYS)
    }
}

impl RateLog {
    /// An empty log keeping at most `max_pairs` (rule, agent) pairs.
    pub fn new(max_pairs: usize) -> RateLog {
        RateLog {
            rules: HashMap::new(),
            pairs: 0,
            max_pairs,
        }
    }

    /// How many (rule, agent) pairs the log holds.
    pub fn len(&self) -> usize {
        self.pairs
    }

    /// True when no call is recorded.
    pub fn is_empty(&self) -> bool {
        self.pairs == 0
    }

    /// Records one call by `agent` against `rule`, whose limit is `limit`,
    /// at `at`. When the log is full it first forgets pairs whose calls have
    /// all left their window; if none has, the call is not recorded and
    /// the error says so (a host should then treat the limit as reached).
    pub fn record(
        &mut self,
        rule: &str,
        agent: &str,
        limit: RateLimit,
        at: SystemTime,
    ) -> Result<(), RateLogFull> {
        let at_ms = epoch_ms(at);
        let window_ms = u64::try_from(limit.window().as_millis()).unwrap_or(u64::MAX);
        let known = self
            .rules
            .get(rule)
            .is_some_and(|agents| agents.contains_key(agent));
        if !known && self.pairs >= self.max_pairs {
            self.forget_expired(at_ms);
            if self.pairs >= self.max_pairs {
                return Err(RateLogFull(self.max_pairs));
            }
        }
        let agents = self.rules.entry(rule.to_owned()).or_default();
        if !known {
            self.pairs += 1;
        }
        let hits = agents.entry(agent.to_owned()).or_insert_with(|| Hits {
            window_ms,
            at_ms: VecDeque::new(),
        });
        hits.window_ms = hits.window_ms.max(window_ms);
        // Keep the times in order even if the clock went back.
        let place = hits.at_ms.partition_point(|&t| t <= at_ms);
        hits.at_ms.insert(place, at_ms);
        let keep = usize::try_from(limit.calls()).unwrap_or(usize::MAX);
        while hits.at_ms.len() > keep {
            hits.at_ms.pop_front();
        }
        Ok(())
    }

    /// Forgets every pair whose calls are all older than its window at `at_ms`.
    fn forget_expired(&mut self, at_ms: u64) {
        for agents in self.rules.values_mut() {
            agents.retain(|_, hits| {
                hits.at_ms
                    .back()
                    .is_some_and(|&last| last > at_ms || at_ms - last < hits.window_ms)
            });
        }
        self.rules.retain(|_, agents| !agents.is_empty());
        self.pairs = self.rules.values().map(HashMap::len).sum();
    }

    /// Forgets one call recorded by `agent` against `rule` at `at` (a call
    /// counted before it was made, and then not made). True if there was one.
    pub fn forget_one(&mut self, rule: &str, agent: &str, at: SystemTime) -> bool {
        let at_ms = epoch_ms(at);
        let Some(agents) = self.rules.get_mut(rule) else {
            return false;
        };
        let Some(hits) = agents.get_mut(agent) else {
            return false;
        };
        let Some(place) = hits.at_ms.iter().position(|&t| t == at_ms) else {
            return false;
        };
        hits.at_ms.remove(place);
        if hits.at_ms.is_empty() {
            agents.remove(agent);
            self.pairs = self.pairs.saturating_sub(1);
            if agents.is_empty() {
                self.rules.remove(rule);
            }
        }
        true
    }

    /// How long after `at` a call by `agent` matching `rule` is allowed
    /// again, when `limit` is reached at `at`: until enough of the counted
    /// calls have left the window. `None` when the limit is not reached.
    pub fn next_allowed(
        &self,
        rule: &str,
        agent: &str,
        limit: RateLimit,
        at: SystemTime,
    ) -> Option<Duration> {
        let at_ms = epoch_ms(at);
        let window_ms = u64::try_from(limit.window().as_millis()).unwrap_or(u64::MAX);
        let hits = self.rules.get(rule)?.get(agent)?;
        let within: Vec<u64> = hits
            .at_ms
            .iter()
            .copied()
            .filter(|&t| t > at_ms || at_ms - t < window_ms)
            .collect();
        let calls = usize::try_from(limit.calls()).unwrap_or(usize::MAX);
        // The call that must leave the window for one more to fit.
        let leaving = within.len().checked_sub(calls)?;
        let leaves_ms = within.get(leaving)?.saturating_add(window_ms);
        Some(Duration::from_millis(leaves_ms.saturating_sub(at_ms)))
    }

    /// Forgets every call counted against `rule` (say, once it is gone
    /// from the rules).
    pub fn forget_rule(&mut self, rule: &str) {
        if let Some(agents) = self.rules.remove(rule) {
            self.pairs = self.pairs.saturating_sub(agents.len());
        }
    }
}

impl RateCounts for RateLog {
    fn counted(&self, rule: &str, agent: &str, window: Duration, at: SystemTime) -> u32 {
        let at_ms = epoch_ms(at);
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        let Some(hits) = self.rules.get(rule).and_then(|agents| agents.get(agent)) else {
            return 0;
        };
        let within = hits
            .at_ms
            .iter()
            .filter(|&&t| t > at_ms || at_ms - t < window_ms)
            .count();
        u32::try_from(within).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests;
