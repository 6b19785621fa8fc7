//! The vessel's agents: adding, removing and re-scoping one, each audited,
//! and the calls it has waiting for the person withdrawn when it goes.

use std::sync::Arc;

use crate::agents::{AgentCredential, AgentDirectory, AgentError, AgentId, AgentRole, AgentScope};
use crate::by::By;
use crate::person::PersonChannel;
use crate::registry::DeviceRegistry;

use super::state::Vessel;

impl Vessel {
    /// The agents that may use the vessel's tools. A change through the
    /// directory itself does what [`Vessel::remove_agent`] and
    /// [`Vessel::set_agent_scope`] do (committed to the store first, then
    /// the agent's waiting calls and allowances withdrawn as needed);
    /// [`Vessel::add_agent`] also registers the new credential as a plain
    /// secret, which the redactor otherwise knows by its hash.
    pub fn agents(&self) -> &Arc<AgentDirectory> {
        &self.agents
    }

    /// Adds an agent, committed to the store (with an `agent` audit entry,
    /// never the credential) before it returns, and registers its credential
    /// as a secret so it never reaches the audit log. The credential is
    /// returned once and not kept.
    pub fn add_agent(
        &self,
        name: &str,
        scope: AgentScope,
        role: AgentRole,
    ) -> Result<(AgentId, AgentCredential), AgentError> {
        self.add_agent_by(name, scope, role, None)
    }

    /// Adds an agent as [`Vessel::add_agent`] does; the audit entry names
    /// `by`.
    pub fn add_agent_by(
        &self,
        name: &str,
        scope: AgentScope,
        role: AgentRole,
        by: Option<&By>,
    ) -> Result<(AgentId, AgentCredential), AgentError> {
        let (id, credential) = self.agents.add_by(name, scope, role, by)?;
        self.add_secret(credential.expose());
        Ok((id, credential))
    }

    /// Removes an agent, committed to the store before it returns; its
    /// credential stops working at once, and its calls waiting for the
    /// person are withdrawn (they get a no). The same as removing it through
    /// [`Vessel::agents`]: the directory does all of it.
    pub fn remove_agent(&self, id: &str) -> Result<(), AgentError> {
        self.agents.remove(id)
    }

    /// Removes an agent as [`Vessel::remove_agent`] does; the audit entry
    /// names `by`.
    pub fn remove_agent_by(&self, id: &str, by: Option<&By>) -> Result<(), AgentError> {
        self.agents.remove_by(id, by)
    }

    /// Replaces an agent's scope, committed to the store before it returns;
    /// its calls waiting for the person that the new scope leaves out are
    /// withdrawn (they get a no). The same as re-scoping it through
    /// [`Vessel::agents`].
    pub fn set_agent_scope(&self, id: &str, scope: AgentScope) -> Result<(), AgentError> {
        self.agents.set_scope(id, scope)
    }

    /// Replaces an agent's scope as [`Vessel::set_agent_scope`] does; the
    /// audit entry names `by`.
    pub fn set_agent_scope_by(
        &self,
        id: &str,
        scope: AgentScope,
        by: Option<&By>,
    ) -> Result<(), AgentError> {
        self.agents.set_scope_by(id, scope, by)
    }
}

/// What the vessel withdraws when an agent is removed (every call it has
/// waiting for the person) or re-scoped (those its new scope leaves out).
pub(super) fn withdraw_waiting(
    person: Arc<PersonChannel>,
    registry: Arc<DeviceRegistry>,
) -> crate::agents::WithdrawHook {
    Arc::new(
        move |id: &str, rescoped: Option<&crate::agents::Agent>| match rescoped {
            None => {
                person.withdraw_approvals(|r| r.agent_id.as_deref() == Some(id));
            }
            Some(agent) => {
                person.withdraw_approvals(|r| {
                    let read_only = registry.get(&r.device_id).is_some_and(|d| {
                        d.manifest()
                            .capability(&r.capability)
                            .is_some_and(|c| c.kind() == dk_proto::CapabilityKind::Sensor)
                    });
                    r.agent_id.as_deref() == Some(id)
                        && !agent.may_use(&r.device_id, &r.capability, read_only)
                });
            }
        },
    )
}
