//! Why a vessel refused an agent's call to a device: one variant per
//! refusal the seven checks make. `Display` is the reason the agent reads,
//! 8DK's text byte for byte: `[8dk-deny] ...` for the vessel's own checks,
//! `[policy] ...` for the rules and the person's answer. Every
//! `[8dk-deny]` text dk writes is one of these, the refusals a caller makes
//! before the checks (an MCP agent's scope, a `_meta` naming a run) included.

use alloc::format;
use alloc::string::String;
use core::time::Duration;

use crate::InputError;

/// The `_meta` key of an MCP `tools/call` that names the run a call belongs to.
pub const RUN_META_KEY: &str = "dk/run";

/// The `_meta` key of an MCP `tools/call` with run-level limits for the run
/// named by [`RUN_META_KEY`]: they only narrow its budget.
pub const RUN_LIMITS_META_KEY: &str = "dk/runLimits";

/// The longest run id, in bytes.
pub const MAX_RUN_ID: usize = 128;

/// A refused call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Check 1: the tool name is not a device tool.
    #[error("[8dk-deny] \"{tool}\" is not a device tool")]
    NotADeviceTool {
        /// The tool name as called.
        tool: String,
    },
    /// Check 1: no device of that id is paired.
    #[error("[8dk-deny] device \"{device_id}\" is not paired")]
    NotPaired {
        /// The device id the tool name names.
        device_id: String,
    },
    /// Check 1: the device declares no such capability.
    #[error("[8dk-deny] device \"{device_id}\" has no capability \"{capability}\"")]
    NoCapability {
        /// The device.
        device_id: String,
        /// The capability the tool name names.
        capability: String,
    },
    /// Check 2: the person did not grant the capability.
    #[error("[8dk-deny] capability \"{capability}\" on \"{device_id}\" is not granted")]
    NotGranted {
        /// The device.
        device_id: String,
        /// The capability.
        capability: String,
    },
    /// Check 3: a rule blocked the call (shadow rules included); its reason.
    #[error("[policy] {reason}")]
    Blocked {
        /// The rule's reason.
        reason: String,
    },
    /// Check 3: a rule with a limit blocked the call, its limit reached; its
    /// reason, and how long until its next call is allowed (said in words,
    /// rounded up).
    #[error("[policy] {reason}; calls are allowed again in {}", wait_in_words(*wait))]
    RuleLimited {
        /// The rule's reason.
        reason: String,
        /// How long until the rule allows a call again.
        wait: Duration,
    },
    /// Check 3: a rule with a limit could not count the call.
    #[error("[policy] a rule with a limit cannot count this call ({why})")]
    Uncountable {
        /// Why the count could not be taken.
        why: String,
    },
    /// Check 4: the input does not match the capability's params.
    #[error("[8dk-deny] {0}")]
    Input(#[from] InputError),
    /// Between checks 4 and 5: the calling agent's rate over all devices
    /// is spent.
    #[error(
        "[8dk-deny] rate limit: this agent's device calls are limited to {calls_per_minute} \
         a minute, in bursts of {burst}; calls are allowed again in {wait_ms} ms"
    )]
    AgentRate {
        /// The rate's calls a minute.
        calls_per_minute: u32,
        /// The rate's burst.
        burst: u32,
        /// Milliseconds until a call is allowed again.
        wait_ms: u64,
    },
    /// Between checks 4 and 5: the calling agent's rate for this device is
    /// spent.
    #[error(
        "[8dk-deny] rate limit: this agent's calls to device \"{device_id}\" are limited \
         to {calls_per_minute} a minute, in bursts of {burst}; calls to it are allowed again \
         in {wait_ms} ms"
    )]
    DeviceRate {
        /// The device.
        device_id: String,
        /// The rate's calls a minute.
        calls_per_minute: u32,
        /// The rate's burst.
        burst: u32,
        /// Milliseconds until a call to it is allowed again.
        wait_ms: u64,
    },
    /// Between checks 4 and 5: a limit of the call's run went past (this
    /// call, or an earlier one: a spent run stays spent).
    #[error(
        "[8dk-deny] run limit {limit} of {maximum} exceeded: the budget of run \"{run}\" is spent"
    )]
    RunBudgetSpent {
        /// The limit's name, e.g. `maxToolCalls`.
        limit: &'static str,
        /// Its value in the run's budget.
        maximum: u64,
        /// The run's id.
        run: String,
    },
    /// Between checks 4 and 5: the run budget's configured layers are out
    /// of range.
    #[error("[8dk-deny] the run budget is misconfigured: {why}")]
    RunBudgetMisconfigured {
        /// Which value is out of range, and its range.
        why: String,
    },
    /// Check 5: the person would be asked, but nobody can ask them.
    #[error("[policy] {reason} (no approver wired)")]
    NoApprover {
        /// Why the person would be asked.
        reason: String,
    },
    /// Check 5: the person said no.
    #[error("[policy] the person said no: {reason}")]
    PersonSaidNo {
        /// Why the person was asked.
        reason: String,
    },
    /// Check 5: asking the person failed.
    #[error("[policy] the person was not asked ({why}): {reason}")]
    NotAsked {
        /// Why the question did not reach the person.
        why: String,
        /// Why the person would have been asked.
        reason: String,
    },
    /// Check 6: the capability was revoked while the person was asked.
    #[error(
        "[8dk-deny] capability \"{capability}\" on \"{device_id}\" was revoked before the call"
    )]
    RevokedMeanwhile {
        /// The device.
        device_id: String,
        /// The capability.
        capability: String,
    },
    /// Check 6: the device was unpaired, or paired again, while the person was asked.
    #[error("[8dk-deny] device \"{device_id}\" was unpaired or paired again before the call")]
    PairingChanged {
        /// The device.
        device_id: String,
    },
    /// Check 6 (or 5): the calling agent was removed, or may no longer call
    /// the tool, while the person was asked.
    #[error(
        "[8dk-deny] agent \"{agent}\" was removed or may no longer call \"{tool}\": the call was not made"
    )]
    AgentGone {
        /// The agent.
        agent: String,
        /// The tool it called.
        tool: String,
    },
    /// Check 7: the device is not connected.
    #[error("[8dk-deny] device \"{device_id}\" is not connected")]
    NotConnected {
        /// The device.
        device_id: String,
    },
    /// Check 7: the counts of the rules with a limit could not be stored,
    /// so the call is not made.
    #[error(
        "[8dk-deny] the counts of rules with a limit cannot be kept ({why}): the call was not made"
    )]
    CountsNotKept {
        /// Why they could not be stored.
        why: String,
    },
    /// Before any check: the audit log has stopped, and no call is made
    /// that could not be recorded.
    #[error("[8dk-deny] the audit log has stopped: no call can be recorded")]
    AuditStopped,
    /// Before any check, or just before the device: the store has not
    /// taken the audit log's writes within the vessel's durability bound
    /// (it answers nothing, a decision waits longer than the bound, or its
    /// last commit failed and is retried), and no call is made whose record
    /// might not be made durable.
    #[error("[8dk-deny] the audit log cannot be written now: no call is made until it can")]
    AuditFailing,
    /// Before the checks: the tool is outside the calling agent's scope or
    /// role (an MCP agent's rule).
    #[error("[8dk-deny] \"{tool}\" is not in the scope of agent \"{agent}\"")]
    OutOfScope {
        /// The tool name as called.
        tool: String,
        /// The agent.
        agent: String,
    },
    /// Before the checks: a `_meta` gives run-level limits without naming
    /// the run.
    #[error("[8dk-deny] _meta \"{RUN_LIMITS_META_KEY}\" is given without \"{RUN_META_KEY}\"")]
    RunLimitsWithoutRun,
    /// Before the checks: the run a `_meta` names is not a run id.
    #[error(
        "[8dk-deny] _meta \"{RUN_META_KEY}\" must be a run id: 1 to {MAX_RUN_ID} letters, \
         digits, '.', '_', ':' or '-'"
    )]
    BadRunId,
    /// Before the checks: a `_meta` narrows a run limit the vessel does not
    /// count.
    #[error(
        "[8dk-deny] _meta \"{RUN_LIMITS_META_KEY}\": the vessel does not enforce {limit}; \
         only maxToolCalls and maxWallTimeMs"
    )]
    RunLimitNotEnforced {
        /// The limit's name, e.g. `maxTurns`.
        limit: &'static str,
    },
    /// Before the checks: a `_meta`'s run-level limits do not read.
    #[error("[8dk-deny] _meta \"{RUN_LIMITS_META_KEY}\": {why}")]
    BadRunLimits {
        /// What is wrong with them.
        why: String,
    },
}

impl Refusal {
    /// Whether a rule or the person refused (the text begins `[policy]`),
    /// rather than one of the vessel's own checks (`[8dk-deny]`).
    pub fn by_policy(&self) -> bool {
        match self {
            Refusal::Blocked { .. }
            | Refusal::RuleLimited { .. }
            | Refusal::Uncountable { .. }
            | Refusal::NoApprover { .. }
            | Refusal::PersonSaidNo { .. }
            | Refusal::NotAsked { .. } => true,
            Refusal::NotADeviceTool { .. }
            | Refusal::NotPaired { .. }
            | Refusal::NoCapability { .. }
            | Refusal::NotGranted { .. }
            | Refusal::Input(_)
            | Refusal::AgentRate { .. }
            | Refusal::DeviceRate { .. }
            | Refusal::RunBudgetSpent { .. }
            | Refusal::RunBudgetMisconfigured { .. }
            | Refusal::RevokedMeanwhile { .. }
            | Refusal::PairingChanged { .. }
            | Refusal::AgentGone { .. }
            | Refusal::NotConnected { .. }
            | Refusal::CountsNotKept { .. }
            | Refusal::AuditStopped
            | Refusal::AuditFailing
            | Refusal::OutOfScope { .. }
            | Refusal::RunLimitsWithoutRun
            | Refusal::BadRunId
            | Refusal::RunLimitNotEnforced { .. }
            | Refusal::BadRunLimits { .. } => false,
        }
    }
}

/// A wait in words, rounded up so that waiting that long is enough: `850
/// ms`, `12 s`, `41 min`, `2 h 5 min`, `3 d 4 h`.
fn wait_in_words(wait: Duration) -> String {
    const MINUTE: u128 = 60_000;
    const HOUR: u128 = 60 * MINUTE;
    const DAY: u128 = 24 * HOUR;
    let ms = wait.as_millis().max(1);
    let up = |unit: u128| ms.div_ceil(unit);
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < MINUTE {
        format!("{} s", up(1_000))
    } else if ms < HOUR {
        format!("{} min", up(MINUTE))
    } else if ms < DAY {
        match up(MINUTE) {
            minutes if minutes % 60 == 0 => format!("{} h", minutes / 60),
            minutes => format!("{} h {} min", minutes / 60, minutes % 60),
        }
    } else {
        match up(HOUR) {
            hours if hours % 24 == 0 => format!("{} d", hours / 24),
            hours => format!("{} d {} h", hours / 24, hours % 24),
        }
    }
}

#[cfg(test)]
mod tests;
