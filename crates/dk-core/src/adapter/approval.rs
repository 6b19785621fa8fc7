//! The person's side of a call: what the person is shown
//! ([`ApprovalRequest`]), what they answer ([`Approval`], [`Answered`]),
//! the [`Approver`] that asks them, and the [`AgentGate`] read again after
//! they were asked.

use dk_proto::Channel;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::allowances::{Allowance, AllowanceOffer};
use crate::by::By;

/// What the person is shown when a call needs a yes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The tool called.
    pub tool: String,
    /// The device.
    pub device_id: String,
    /// The capability.
    pub capability: String,
    /// Exactly the input that will be sent, already validated.
    pub input: Map<String, Value>,
    /// Why the person is asked.
    pub reason: String,
    /// The calling agent, when the call names one: the person sees who
    /// asks, and the person channel bounds what one agent keeps waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The calling agent's session, when the call names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The channel the device is paired and connected on: the person sees
    /// whether what they allow travels encrypted.
    pub channel: Channel,
    /// Set when the call opens a voice device's microphone: for how long
    /// at most, so the person is told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub microphone: Option<dk_proto::admin::MicrophoneRequest>,
}

/// Which agents exist and what they may call, read again after the person
/// was asked (check 6): an agent removed, or re-scoped away from the tool,
/// while its call waited does not get the call made.
pub trait AgentGate: Send + Sync {
    /// `None` when `agent_id` is not one of the gate's agents (a host's own
    /// agent id); else whether it may call `capability` of `device_id`,
    /// given whether that capability only reads.
    fn may_call(
        &self,
        agent_id: &str,
        device_id: &str,
        capability: &str,
        read_only: bool,
    ) -> Option<bool>;
}

/// The person's answer to a call, when a yes may be remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// No (or no answer in time).
    Refused,
    /// Yes, for this call only.
    Once,
    /// Yes, and remembered as this allowance.
    Remembered(Allowance),
}

/// The person's answer to a call, and the front end that gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The answer.
    pub approval: Approval,
    /// Who answered, when the approver knows (the person channel does).
    pub by: Option<By>,
}

/// Why the person was not asked. `Display` is the why of the refusal's
/// reason (`[policy] the person was not asked (<why>): ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// The calling agent already has this many approvals waiting for the
    /// person (the person channel's cap).
    #[error("agent \"{agent}\" already has {limit} approvals waiting for the person")]
    TooManyWaiting {
        /// The agent.
        agent: String,
        /// Its cap.
        limit: usize,
    },
    /// An approver of the host's own could not reach the person; its words,
    /// one line.
    #[error("{0}")]
    Unreachable(String),
}

/// Asks the person. An error counts as a no, and says why the person was
/// not asked (it is the refusal's reason).
pub trait Approver: Send + Sync {
    /// Returns `Ok(true)` for a yes.
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, ApprovalError>>;

    /// Asks as [`Approver::approve`] does, letting the person remember a
    /// yes as `offer` allows (none: the call cannot be remembered). An
    /// approver that never offers (the default) answers once or no.
    fn approve_remembering(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
    ) -> BoxFuture<'_, Result<Approval, ApprovalError>> {
        drop(offer);
        let asking = self.approve(request);
        Box::pin(async move {
            asking.await.map(|yes| {
                if yes {
                    Approval::Once
                } else {
                    Approval::Refused
                }
            })
        })
    }

    /// Asks as [`Approver::approve_remembering`] does, and says who
    /// answered. An approver that cannot tell (the default) names nobody.
    fn approve_answered(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
    ) -> BoxFuture<'_, Result<Answered, ApprovalError>> {
        let asking = self.approve_remembering(request, offer);
        Box::pin(async move { asking.await.map(|approval| Answered { approval, by: None }) })
    }
}

/// An [`Approver`] from a closure returning a future.
pub struct ApproverFn<F>(pub F);

impl<F, Fut> Approver for ApproverFn<F>
where
    F: Fn(ApprovalRequest) -> Fut + Send + Sync,
    Fut: Future<Output = Result<bool, ApprovalError>> + Send + 'static,
{
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, ApprovalError>> {
        Box::pin((self.0)(request))
    }
}
