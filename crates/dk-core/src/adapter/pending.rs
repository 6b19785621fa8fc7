//! One call's decision until it is reported ([`PendingDecision`]): its
//! place in the audit queue, how far its checks went, and the one report
//! of it, made when the call ends or when it is abandoned half-way.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dk_proto::{CapabilityKind, Channel};
use serde_json::Value;

use super::record::{AllowanceUse, DecisionRecord};
use super::types::DeviceToolAdapter;
use crate::by::By;
use crate::metrics::{CallDecision, CallKind};
use crate::store::AuditPlace;

/// One call's decision until it is reported: it holds the call's place in
/// the audit queue, and reports the decision exactly once, when the call
/// ends or, once it has its place, when it is abandoned.
pub(super) struct PendingDecision<'a> {
    pub(super) adapter: &'a DeviceToolAdapter,
    pub(super) tool: &'a str,
    pub(super) device_id: Option<&'a str>,
    pub(super) capability: Option<&'a str>,
    pub(super) agent_id: Option<&'a str>,
    pub(super) session_id: Option<&'a str>,
    pub(super) input: Option<&'a Value>,
    /// The refusal a caller reports, also recorded if it is abandoned.
    pub(super) refusal: Option<&'a str>,
    pub(super) place: Placement<'a>,
    /// What the checks found, as far as they went.
    pub(super) progress: Progress,
    /// The person's answer, when asked.
    pub(super) person_answer: Option<bool>,
    /// The call is the person's own.
    pub(super) by_person: bool,
    /// The allowance the person's answer made, or that answered.
    pub(super) allowance: Option<AllowanceUse>,
    /// Who answered for the person, when they were asked.
    pub(super) answered_by: Option<By>,
    /// When the call started.
    pub(super) started: Instant,
}

/// How far a call's checks went, kept by its pending decision, so that a
/// call abandoned half-way (its future dropped) is counted and recorded
/// with what they found: the kind of the capability it named, not
/// `unknown`, and its device's channel.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// The channel of the device the call named, once check 1 found it.
    pub(super) channel: OnceLock<Channel>,
    /// The kind of capability the call named, once check 1 found it.
    pub(super) kind: OnceLock<CapabilityKind>,
    /// Set just before the device is sent the call.
    pub(super) reached: AtomicBool,
}

/// Where a pending decision stands with its place in the audit queue.
pub(super) enum Placement<'a> {
    /// Not yet taken: nothing has happened, nothing is to be recorded.
    Waiting,
    /// Taken: spent on the record.
    Held(AuditPlace<'a>),
    /// None needed (no queue behind the hook, or the writer has stopped).
    Unplaced,
    /// The decision was reported.
    Reported,
}

impl PendingDecision<'_> {
    /// Takes the call's place in the audit queue, waiting for room; false
    /// when the audit writer has stopped.
    pub(super) async fn take_place(&mut self) -> bool {
        let adapter = self.adapter;
        let room = match (&adapter.room, &adapter.on_decision) {
            (Some(room), Some(_)) => room,
            _ => {
                self.place = Placement::Unplaced;
                return true;
            }
        };
        match room.take().await {
            Ok(place) => {
                self.place = Placement::Held(place);
                true
            }
            Err(_) => {
                self.place = Placement::Unplaced;
                false
            }
        }
    }

    /// Counts the decision as `decided` and sends it to the hook, in the
    /// call's place; once.
    pub(super) fn report(
        &mut self,
        allowed: bool,
        reason: &str,
        rule: Option<&str>,
        decided: CallDecision,
    ) {
        let place = std::mem::replace(&mut self.place, Placement::Reported);
        if !matches!(place, Placement::Reported) {
            let kind = self
                .progress
                .kind
                .get()
                .map_or(CallKind::Unknown, |kind| CallKind::from(*kind));
            self.adapter
                .metrics
                .call_decided(kind, decided, self.started.elapsed());
        }
        match place {
            Placement::Waiting | Placement::Reported => return,
            Placement::Held(place) => place.spend(),
            Placement::Unplaced => {}
        }
        if let Some(hook) = &self.adapter.on_decision {
            hook(&DecisionRecord {
                tool: self.tool,
                device_id: self.device_id,
                capability: self.capability,
                allowed,
                reason,
                agent_id: self.agent_id,
                session_id: self.session_id,
                rule,
                input: self.input,
                person_answer: self.person_answer,
                by_person: self.by_person,
                allowance: self.allowance,
                channel: self.progress.channel.get().copied(),
                answered_by: self.answered_by.as_ref(),
            });
        }
    }
}

impl Drop for PendingDecision<'_> {
    fn drop(&mut self) {
        let reached = self.progress.reached.load(Ordering::Relaxed);
        let reason = match self.refusal {
            Some(refusal) => refusal,
            None if reached => "abandoned by the caller while the device was called",
            None => "abandoned by the caller before the device was reached",
        };
        self.report(reached, reason, None, CallDecision::Abandoned);
    }
}
