//! Run limits: the shared run budget, its layers, and a tracker that reports the first breach.
//!
//! The limits and their defaults and hard caps are Prism's (`src/run-limits.ts`
//! of the release the admission contract comes from): every limit is an
//! integer in `1..=hard cap`; a layer value outside that range is refused,
//! never clamped. Prism's `maxCost` is not carried: it is not an integer
//! limit and nothing in dk prices a run.

use serde_json::Value;

use super::error::InputError;
use super::names::{RunLimit, safe_integer};

/// One value per limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct PerLimit<T> {
    turns: T,
    provider_attempts: T,
    tool_rounds: T,
    tool_calls: T,
    wall_time_ms: T,
    request_bytes: T,
    response_bytes: T,
    input_tokens: T,
    output_tokens: T,
    total_tokens: T,
}

impl<T> PerLimit<T> {
    fn from_fn(mut f: impl FnMut(RunLimit) -> T) -> Self {
        PerLimit {
            turns: f(RunLimit::MaxTurns),
            provider_attempts: f(RunLimit::MaxProviderAttempts),
            tool_rounds: f(RunLimit::MaxToolRounds),
            tool_calls: f(RunLimit::MaxToolCalls),
            wall_time_ms: f(RunLimit::MaxWallTimeMs),
            request_bytes: f(RunLimit::MaxRequestBytes),
            response_bytes: f(RunLimit::MaxResponseBytes),
            input_tokens: f(RunLimit::MaxInputTokens),
            output_tokens: f(RunLimit::MaxOutputTokens),
            total_tokens: f(RunLimit::MaxTotalTokens),
        }
    }

    fn get(&self, limit: RunLimit) -> &T {
        match limit {
            RunLimit::MaxTurns => &self.turns,
            RunLimit::MaxProviderAttempts => &self.provider_attempts,
            RunLimit::MaxToolRounds => &self.tool_rounds,
            RunLimit::MaxToolCalls => &self.tool_calls,
            RunLimit::MaxWallTimeMs => &self.wall_time_ms,
            RunLimit::MaxRequestBytes => &self.request_bytes,
            RunLimit::MaxResponseBytes => &self.response_bytes,
            RunLimit::MaxInputTokens => &self.input_tokens,
            RunLimit::MaxOutputTokens => &self.output_tokens,
            RunLimit::MaxTotalTokens => &self.total_tokens,
        }
    }

    fn get_mut(&mut self, limit: RunLimit) -> &mut T {
        match limit {
            RunLimit::MaxTurns => &mut self.turns,
            RunLimit::MaxProviderAttempts => &mut self.provider_attempts,
            RunLimit::MaxToolRounds => &mut self.tool_rounds,
            RunLimit::MaxToolCalls => &mut self.tool_calls,
            RunLimit::MaxWallTimeMs => &mut self.wall_time_ms,
            RunLimit::MaxRequestBytes => &mut self.request_bytes,
            RunLimit::MaxResponseBytes => &mut self.response_bytes,
            RunLimit::MaxInputTokens => &mut self.input_tokens,
            RunLimit::MaxOutputTokens => &mut self.output_tokens,
            RunLimit::MaxTotalTokens => &mut self.total_tokens,
        }
    }
}

/// One host-authored layer of a run budget (an agent's, or one run's): each
/// limit it sets, unchecked until it is resolved.
///
/// A value must be an integer in `1..=`[`RunLimit::hard_cap`]; resolving
/// ([`RunLimits::from_layer`], [`narrow`]) refuses anything else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RunLimitsLayer {
    values: PerLimit<Option<u64>>,
}

impl RunLimitsLayer {
    /// A layer that sets nothing.
    pub fn new() -> Self {
        RunLimitsLayer::default()
    }

    /// The same layer with `limit` set to `value`.
    #[must_use]
    pub fn with(mut self, limit: RunLimit, value: u64) -> Self {
        self.set(limit, Some(value));
        self
    }

    /// Sets (or, with `None`, unsets) one limit.
    pub fn set(&mut self, limit: RunLimit, value: Option<u64>) {
        *self.values.get_mut(limit) = value;
    }

    /// The value this layer sets for `limit`, if any.
    pub fn get(&self, limit: RunLimit) -> Option<u64> {
        *self.values.get(limit)
    }

    /// Reads a layer from JSON (`{"maxTurns": 8, "maxToolCalls": 50}`), checking
    /// every value.
    ///
    /// `null` counts as absent (as Prism's `??` does); `8.0` is the integer 8
    /// (JSON does not tell them apart); a fraction, a string, a value out of
    /// range or an unknown name is refused ([`InputError`]).
    pub fn from_json(value: &Value) -> Result<RunLimitsLayer, InputError> {
        let Value::Object(map) = value else {
            return Err(InputError::FieldType {
                field: "runLimits",
                expected: "an object",
            });
        };
        let mut layer = RunLimitsLayer::new();
        for (name, value) in map {
            let Some(limit) = RunLimit::from_name(name) else {
                return Err(InputError::UnknownRunLimit(name.clone()));
            };
            if value.is_null() {
                continue;
            }
            let checked = value
                .as_f64()
                .and_then(safe_integer)
                .filter(|v| (1..=limit.hard_cap()).contains(v))
                .ok_or(InputError::RunLimit { limit })?;
            layer.set(limit, Some(checked));
        }
        Ok(layer)
    }

    fn check(&self) -> Result<(), InputError> {
        for limit in RunLimit::ALL {
            if let Some(value) = self.get(limit)
                && !(1..=limit.hard_cap()).contains(&value)
            {
                return Err(InputError::RunLimit { limit });
            }
        }
        Ok(())
    }
}

/// A resolved run budget: every limit set, each within its hard cap.
///
/// Only [`RunLimits::default`], [`RunLimits::from_layer`], [`narrow`] and
/// [`RunLimits::narrowed_by`] make one, so a `RunLimits` is always in range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunLimits {
    values: PerLimit<u64>,
}

impl Default for RunLimits {
    /// Prism's defaults.
    fn default() -> Self {
        RunLimits {
            values: PerLimit::from_fn(RunLimit::default_value),
        }
    }
}

impl RunLimits {
    /// One layer over the defaults: what it sets replaces the default (up to
    /// the hard cap), the rest is the default. Same as `narrow(None, Some(layer))`.
    pub fn from_layer(layer: &RunLimitsLayer) -> Result<RunLimits, InputError> {
        narrow(None, Some(layer))
    }

    /// The value of one limit.
    pub fn get(&self, limit: RunLimit) -> u64 {
        *self.values.get(limit)
    }

    /// The smaller of the two budgets, limit by limit: combining two budgets
    /// never widens either.
    #[must_use]
    pub fn narrowed_by(&self, other: &RunLimits) -> RunLimits {
        RunLimits {
            values: PerLimit::from_fn(|limit| self.get(limit).min(other.get(limit))),
        }
    }
}

/// Resolves an agent-level layer and a run-level layer into one budget, as
/// Prism's `resolveRunLimits` does.
///
/// Both layers are checked first (each value an integer in `1..=hard cap`).
/// Then, limit by limit: the agent layer's value, else the default; a
/// run-level value may only narrow it (the minimum is taken, so a run asking
/// for more than its agent gets the agent's value: clamped, not refused).
/// Without an agent layer the run layer stands alone and replaces the default.
pub fn narrow(
    agent_level: Option<&RunLimitsLayer>,
    run_level: Option<&RunLimitsLayer>,
) -> Result<RunLimits, InputError> {
    if let Some(layer) = agent_level {
        layer.check()?;
    }
    if let Some(layer) = run_level {
        layer.check()?;
    }
    let values = PerLimit::from_fn(|limit| {
        let base = agent_level
            .and_then(|layer| layer.get(limit))
            .unwrap_or(limit.default_value());
        match (agent_level, run_level.and_then(|layer| layer.get(limit))) {
            (Some(_), Some(run)) => base.min(run),
            (None, Some(run)) => run,
            (_, None) => base,
        }
    });
    Ok(RunLimits { values })
}

/// A run limit gone past: which, its value, and what was observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("run limit {} of {maximum} exceeded", limit.name())]
pub struct RunLimitBreach {
    /// The limit breached.
    pub limit: RunLimit,
    /// Its value in the budget.
    pub maximum: u64,
    /// The count that went past it (for a byte limit, the frame's size).
    pub observed: u64,
}

/// Counts what a run does against its [`RunLimits`] and refuses the first
/// charge that goes past a limit.
///
/// Reaching a limit is allowed; going past it is a breach. Counting limits
/// are cumulative over the run; the byte limits bound each frame (a request
/// or a response) on its own, as Prism settled on (a long run re-sends its
/// history, so a running byte total would end healthy runs); their totals are
/// still counted. Once a breach happens the tracker is spent: every later
/// charge is refused with that same first breach and counts nothing (Prism
/// lets later charges under their own limits through; dk fails closed).
///
/// There is no clock inside: the caller passes times in milliseconds from a
/// clock of its choosing ([`RunTracker::new`], [`RunTracker::check_wall_time`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunTracker {
    limits: RunLimits,
    started_at_ms: u64,
    counts: PerLimit<u64>,
    breach: Option<RunLimitBreach>,
}

impl RunTracker {
    /// A tracker for a run that started at `started_at_ms` on the caller's clock.
    pub fn new(limits: RunLimits, started_at_ms: u64) -> Self {
        RunTracker {
            limits,
            started_at_ms,
            counts: PerLimit::default(),
            breach: None,
        }
    }

    /// The budget charged.
    pub fn limits(&self) -> &RunLimits {
        &self.limits
    }

    /// What has been counted against `limit` so far (for the byte limits, the
    /// total over the run; for wall time, the latest elapsed time seen).
    pub fn count(&self, limit: RunLimit) -> u64 {
        *self.counts.get(limit)
    }

    /// The first breach, if there has been one.
    pub fn breach(&self) -> Option<RunLimitBreach> {
        self.breach
    }

    /// Adds `amount` to `limit`'s count; refuses when that goes past the limit
    /// (for a byte limit: when `amount` alone is over it).
    pub fn charge(&mut self, limit: RunLimit, amount: u64) -> Result<(), RunLimitBreach> {
        if let Some(breach) = self.breach {
            return Err(breach);
        }
        let count = self.counts.get_mut(limit);
        *count = count.saturating_add(amount);
        let observed = if limit.is_per_frame() { amount } else { *count };
        self.check(limit, observed)
    }

    /// One model turn.
    pub fn charge_turn(&mut self) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxTurns, 1)
    }

    /// One provider attempt.
    pub fn charge_provider_attempt(&mut self) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxProviderAttempts, 1)
    }

    /// One round of tool calls.
    pub fn charge_tool_round(&mut self) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxToolRounds, 1)
    }

    /// One tool call; in dk, every device call charges this before the device is reached.
    pub fn charge_tool_call(&mut self) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxToolCalls, 1)
    }

    /// One provider request of `bytes`.
    pub fn charge_request_bytes(&mut self, bytes: u64) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxRequestBytes, bytes)
    }

    /// One provider response frame of `bytes`.
    pub fn charge_response_bytes(&mut self, bytes: u64) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxResponseBytes, bytes)
    }

    /// A provider's reported usage: input, then output, then their sum.
    pub fn charge_usage(
        &mut self,
        input_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), RunLimitBreach> {
        self.charge(RunLimit::MaxInputTokens, input_tokens)?;
        self.charge(RunLimit::MaxOutputTokens, output_tokens)?;
        self.charge(
            RunLimit::MaxTotalTokens,
            input_tokens.saturating_add(output_tokens),
        )
    }

    /// Checks the wall time at `now_ms` (same clock as the start); a time
    /// before the start counts as no time at all.
    pub fn check_wall_time(&mut self, now_ms: u64) -> Result<(), RunLimitBreach> {
        if let Some(breach) = self.breach {
            return Err(breach);
        }
        let elapsed = now_ms.saturating_sub(self.started_at_ms);
        let count = self.counts.get_mut(RunLimit::MaxWallTimeMs);
        *count = (*count).max(elapsed);
        self.check(RunLimit::MaxWallTimeMs, elapsed)
    }

    fn check(&mut self, limit: RunLimit, observed: u64) -> Result<(), RunLimitBreach> {
        let maximum = self.limits.get(limit);
        if observed > maximum {
            let breach = RunLimitBreach {
                limit,
                maximum,
                observed,
            };
            self.breach = Some(breach);
            return Err(breach);
        }
        Ok(())
    }
}
