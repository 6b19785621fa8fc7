//! Why a vessel refused an agent's call to a device: one variant per
//! refusal the seven checks make. `Display` is the reason the agent reads,
//! 8DK's text byte for byte: `[8dk-deny] ...` for the vessel's own checks,
//! `[policy] ...` for the rules and the person's answer.

use crate::InputError;

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
    /// Check 3: a rule with a limit could not count the call.
    #[error("[policy] a rule with a limit cannot count this call ({why})")]
    Uncountable {
        /// Why the count could not be taken.
        why: String,
    },
    /// Check 4: the input does not match the capability's params.
    #[error("[8dk-deny] {0}")]
    Input(#[from] InputError),
    /// Between checks 4 and 5: the agent's rate or the run's budget refused
    /// the call; the meter's own text, prefix included.
    #[error("{0}")]
    Metered(String),
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
}

#[cfg(test)]
mod tests;
