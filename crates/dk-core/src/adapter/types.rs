//! The adapter and a call's context ([`DeviceToolAdapter`],
//! [`CallContext`]): the state its checks, its pending decisions and its
//! public face share, and the adapter's wait for the audit log to be
//! durable.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dk_policy::PolicySet;

use super::approval::{AgentGate, Approver};
use super::budget::{Meter, RunRef};
use super::counts::{RuleCounts, within};
use super::record::DecisionRecord;
use crate::link::Links;
use crate::metrics::Metrics;
use crate::registry::DeviceRegistry;
use crate::store::{AuditRoom, DEFAULT_DURABLE_WITHIN, Durability};

/// How long a call waits for the device by default (10 s).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is calling, and how: the context of one call.
#[derive(Clone, Copy, Default)]
pub struct CallContext<'a> {
    /// The calling agent (`__shadow__` marks a shadow candidate).
    pub agent_id: Option<&'a str>,
    /// The calling session.
    pub session_id: Option<&'a str>,
    /// Who to ask when the person must say yes; none means no.
    pub approver: Option<&'a dyn Approver>,
    /// How long to wait for the device; the adapter's call timeout
    /// ([`DEFAULT_CALL_TIMEOUT`] unless set) when unset.
    pub timeout: Option<Duration>,
    /// The call is the person's own (the admin API's tool call), recorded
    /// as theirs; it names no agent.
    pub by_person: bool,
    /// The agents the caller is one of, read again after a wait for the
    /// person (check 6): an agent removed, or re-scoped away from the tool,
    /// meanwhile does not get its call made. Set by front ends whose callers
    /// are agents (MCP).
    pub agent_gate: Option<&'a dyn AgentGate>,
    /// The run the call belongs to, charged to that run's budget; none
    /// charges no run (only the agent's rate).
    pub run: Option<RunRef<'a>>,
}

impl fmt::Debug for CallContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallContext")
            .field("agent_id", &self.agent_id)
            .field("session_id", &self.session_id)
            .field("approver", &self.approver.is_some())
            .field("timeout", &self.timeout)
            .field("by_person", &self.by_person)
            .field("agent_gate", &self.agent_gate.is_some())
            .field("run", &self.run)
            .finish()
    }
}

/// Receives one [`DecisionRecord`] per call.
pub type DecisionHook = Arc<dyn Fn(&DecisionRecord<'_>) + Send + Sync>;

/// Turns granted capabilities into tools and runs calls through the checks.
pub struct DeviceToolAdapter {
    pub(super) registry: Arc<DeviceRegistry>,
    pub(super) links: Arc<Links>,
    pub(super) policies: RwLock<Arc<PolicySet>>,
    pub(super) on_decision: Option<DecisionHook>,
    /// The audit queue the hook records into, when it has places to take.
    pub(super) room: Option<AuditRoom>,
    pub(super) meter: Meter,
    /// The counts of rules with a `limit`.
    pub(super) counts: RuleCounts,
    pub(super) call_timeout: Duration,
    /// What every decision counts into.
    pub(super) metrics: Arc<Metrics>,
}

impl fmt::Debug for DeviceToolAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceToolAdapter")
            .field("registry", &self.registry)
            .field("links", &self.links)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

impl DeviceToolAdapter {
    /// Whether a call may reach a device now: the audit writer's store
    /// takes its writes within its bound (always, without a writer). While
    /// the store takes writes but is behind (calls came faster than its
    /// disk), the call waits for it to catch up, without holding the
    /// thread, looking again at each commit and at least every eighth of
    /// the bound; false once the store took no write within the bound.
    pub(super) async fn durable(&self) -> bool {
        let Some(room) = &self.room else {
            return true;
        };
        loop {
            let committed = room.committed();
            tokio::pin!(committed);
            committed.as_mut().enable();
            match room.durability() {
                Durability::Within => return true,
                Durability::Lost => return false,
                Durability::Behind => {
                    let _ = within(room.durable_within() / 8, committed).await;
                }
            }
        }
    }

    /// How long a call waits for the store on its way to a device: the
    /// audit writer's bound.
    pub(super) fn store_patience(&self) -> Duration {
        self.room
            .as_ref()
            .map_or(DEFAULT_DURABLE_WITHIN, AuditRoom::durable_within)
    }
}
