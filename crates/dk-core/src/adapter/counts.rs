//! The counts of rules with a `limit` (`limit: 3 per 1h`): read at check 3
//! under one lock, with the call counted at once so that two calls at the
//! same moment cannot both take a rule's last call; kept in the store once
//! the call is made, and given back when it is not.
//!
//! Counts live in a bounded [`RateLog`] and, durably, in the store
//! ([`Store::put_rate_hit`]), from which a vessel reloads them when it
//! starts: a restart does not reset a limit. When the counts cannot be read
//! or kept, limited rules fail closed: every one of them reads as reached.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dk_policy::{Call, Evaluation, PolicySet, RateCounts, RateLimit, RateLog, RateLogFull, Rule};

use crate::store::{RateClaim, RateHit, Store, StoreError};
use dk_store::epoch_ms;

/// Every limit reads as reached: the counts could not be loaded.
struct AllReached;

impl RateCounts for AllReached {
    fn counted(&self, _: &str, _: &str, _: std::time::Duration, _: SystemTime) -> u32 {
        u32::MAX
    }
}

/// The counts of limited rules, in memory and in the store.
#[derive(Debug)]
pub(crate) struct RuleCounts {
    log: Mutex<RateLog>,
    /// Why the counts could not be loaded from the store, if they could not.
    broken: Option<String>,
}

impl RuleCounts {
    /// The counts kept in `store`, still within their windows.
    pub(crate) fn load(store: &dyn Store) -> RuleCounts {
        let now = SystemTime::now();
        let mut log = RateLog::default();
        let broken = match store.load_rate_hits(epoch_ms(now)) {
            Ok(hits) => hits.iter().find_map(|hit| {
                let window = std::time::Duration::from_millis(hit.window_ms);
                let at = UNIX_EPOCH + std::time::Duration::from_millis(hit.at_ms);
                let limit = RateLimit::new(hit.calls, window)?;
                log.record(&hit.rule, &hit.agent, limit, at)
                    .err()
                    .map(|full| full.to_string())
            }),
            Err(error) => Some(error.to_string()),
        };
        if let Some(why) = &broken {
            tracing::error!("rules with a limit will refuse every call: {why}");
        }
        RuleCounts {
            log: Mutex::new(log),
            broken,
        }
    }

    fn log(&self) -> MutexGuard<'_, RateLog> {
        // The log is whole between calls of its methods, none of which panics.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides a call, counting it at once against the limited rules it
    /// matches that are under their limits. The counts are given back when
    /// the returned [`Counted`] is dropped without [`Counted::keep`].
    pub(crate) fn evaluate<'p>(
        &self,
        policies: &'p PolicySet,
        call: &Call<'_>,
    ) -> Result<(Evaluation<'p>, Counted<'_>), RateLogFull> {
        let mut log = self.log();
        let evaluation = if self.broken.is_some() {
            policies.evaluate_call_counted(call, &AllReached)
        } else {
            policies.evaluate_call_counted(call, &*log)
        };
        let at = call.at;
        let agent = call.device.agent_id.unwrap_or("");
        let mut counted = Counted {
            counts: self,
            hits: Vec::new(),
            reasons: Vec::new(),
            at,
            kept: false,
        };
        for rule in &evaluation.counted {
            let Some(limit) = rule.limit() else {
                continue;
            };
            log.record(rule.name(), agent, limit, at)?;
            counted.reasons.push(rule.reason().to_owned());
            counted.hits.push(RateHit {
                rule: rule.name().to_owned(),
                agent: agent.to_owned(),
                at_ms: epoch_ms(at),
                calls: limit.calls(),
                window_ms: u64::try_from(limit.window().as_millis()).unwrap_or(u64::MAX),
            });
        }
        Ok((evaluation, counted))
    }
}

impl RuleCounts {
    /// How long after `at` a call by `agent` is allowed again by `rule`,
    /// a rule with a limit that decided: `None` when it has no limit, or
    /// the counts could not be loaded (every limit then reads as reached).
    pub(crate) fn next_allowed(
        &self,
        rule: &Rule,
        agent: &str,
        at: SystemTime,
    ) -> Option<std::time::Duration> {
        let limit = rule.limit()?;
        if self.broken.is_some() {
            return None;
        }
        self.log().next_allowed(rule.name(), agent, limit, at)
    }
}

/// The calls one call counted against limited rules, given back unless kept.
#[must_use = "dropping it gives the counts back"]
pub(crate) struct Counted<'c> {
    counts: &'c RuleCounts,
    hits: Vec<RateHit>,
    /// The reason of each hit's rule, for a refusal when the store finds
    /// its limit reached.
    reasons: Vec<String>,
    at: SystemTime,
    kept: bool,
}

/// Why a call's counts were not kept.
#[derive(Debug)]
pub(crate) enum NotKept {
    /// The store failed.
    Store(StoreError),
    /// A store shared by a fleet found a rule's limit reached by calls
    /// other vessels made: the rule's reason, and how long until it
    /// allows a call again.
    Reached(String, std::time::Duration),
}

impl Counted<'_> {
    /// Whether the call counted against no rule with a limit (keeping it
    /// asks nothing of the store).
    pub(crate) fn is_empty(&self) -> bool {
        self.hits.is_empty()
    }

    /// The call is being made: keeps its counts, in the store too, where a
    /// store shared by a fleet may find a limit reached by the other
    /// members' calls (then this call is not made: its counts are given
    /// back here, and those the store took stay taken). The store's answer
    /// is awaited without holding the thread, at most `within` for each
    /// count: a store that does not answer in time refuses the call (a
    /// count it takes later stays taken, as if the call had been made).
    pub(crate) async fn keep(mut self, store: &dyn Store, within: Duration) -> Result<(), NotKept> {
        for (hit, reason) in self.hits.iter().zip(&self.reasons) {
            let claimed = self::within(within, store.claim_rate_hit_async(hit))
                .await
                .unwrap_or_else(|| Err(unanswered(within)));
            match claimed.map_err(NotKept::Store)? {
                RateClaim::Counted => {}
                RateClaim::Reached { retry_after_ms } => {
                    return Err(NotKept::Reached(
                        reason.clone(),
                        Duration::from_millis(retry_after_ms),
                    ));
                }
            }
        }
        self.kept = true;
        Ok(())
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if self.kept || self.hits.is_empty() {
            return;
        }
        let mut log = self.counts.log();
        for hit in &self.hits {
            log.forget_one(&hit.rule, &hit.agent, self.at);
        }
    }
}

/// `work`'s output if it comes within `limit`, on tokio's timer; `None`
/// past it.
pub(crate) async fn within<F: std::future::Future>(limit: Duration, work: F) -> Option<F::Output> {
    tokio::time::timeout(limit, work).await.ok()
}

/// The error of a store that did not answer within `within`.
pub(crate) fn unanswered(within: Duration) -> StoreError {
    StoreError::Database(dk_store::Cause::msg(format!(
        "the store did not answer within {} ms",
        within.as_millis()
    )))
}

#[cfg(test)]
mod tests;
