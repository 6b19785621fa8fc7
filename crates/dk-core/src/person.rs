//! The person channel: one queue of what the person must answer (consents
//! to pair, approvals of calls), each with a deadline. Front ends (the
//! terminal prompt, the admin API, the command line) list and answer it; the
//! registry and the adapter ask through it and wait.
//!
//! An unanswered prompt is a no when its deadline passes. A prompt whose
//! asker gave up (the device disconnected during pairing, the call was
//! dropped) leaves the queue at once. One agent keeps at most
//! [`APPROVALS_PER_AGENT`] approvals waiting (the channel is shared
//! by every agent and front end): past it, its call is refused without
//! asking, so one agent cannot bury the others' prompts.
//!
//! An approval of an agent's call may be answered with more than a yes or
//! a no ([`ApprovalAnswer`]): a yes for this call once, or a yes remembered
//! for N minutes for this agent and tool with exactly these arguments, or
//! for this agent and the whole capability (`allowances.rs`). A call that
//! names no agent can only be allowed once or refused.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::{broadcast, oneshot};

use crate::adapter::{Answered, Approval, ApprovalError, ApprovalRequest, Approver};
use crate::allowances::{Allowance, AllowanceError, AllowanceOffer, Remember};
use crate::by::By;
use crate::metrics::{Metrics, PromptKind};
use crate::registry::{ConsentDecision, ConsentRequest};
use dk_proto::admin as api;
use dk_store::epoch_ms;

/// How long the person has to answer an approval by default (two minutes).
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// How many approvals one agent may have waiting for the person at once.
pub const APPROVALS_PER_AGENT: usize = 16;

/// What the person is asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", content = "request", rename_all = "camelCase")]
pub enum Prompt {
    /// A device asks to pair.
    Consent(ConsentRequest),
    /// A call needs a yes.
    Approval(ApprovalRequest),
}

/// One open prompt, as front ends list it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPrompt {
    /// Identifies the prompt when answering.
    pub id: u64,
    /// Milliseconds since the Unix epoch after which the prompt is a no.
    pub expires_at_ms: u64,
    /// What is asked.
    #[serde(flatten)]
    pub prompt: Prompt,
    /// Whether a yes may be remembered (`canRemember`, only on approvals
    /// of an agent's call): answered with [`ApprovalAnswer::Remember`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub can_remember: bool,
    /// Whether another vessel of the fleet raised it ([`PersonChannel::mirror`]):
    /// its answer goes there, and that vessel tells the others.
    #[serde(skip)]
    pub mirrored: bool,
}

/// The person's answer to a prompt another vessel of the fleet raised,
/// for that vessel to apply.
#[derive(Debug, Clone, PartialEq)]
pub enum MirroredAnswer {
    /// The answer to a pairing.
    Consent(ConsentDecision),
    /// The answer to an approval, and who gave it.
    Approval {
        /// Yes once, yes remembered, or no.
        answer: ApprovalAnswer,
        /// The front end it came through.
        by: Option<By>,
    },
}

/// Carries a mirrored prompt's answer to the vessel that raised it, and
/// resolves with that vessel's word: taken (with the allowance it made,
/// for a yes remembered) or not, and why. Called again when the person
/// answers again after an answer that was not taken.
pub type AnswerSink = Arc<
    dyn Fn(MirroredAnswer) -> BoxFuture<'static, Result<Option<Allowance>, NotTaken>> + Send + Sync,
>;

/// Why an answer given here to a prompt another vessel of the fleet raised
/// was not taken. The prompt stays listed until that vessel closes it, or
/// leaves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotTaken {
    /// The vessel that raised it refused it, saying why (answered already,
    /// timed out, or not the prompt shown here).
    #[error("the vessel that raised it refused the answer: {0}")]
    Refused(String),
    /// The vessel that raised it did not confirm in time: it will not take
    /// the answer once its time has passed.
    #[error("the vessel that raised it did not confirm the answer in time")]
    Unconfirmed,
    /// The vessel that raised it cannot be reached (it left, restarted, or
    /// the fleet's connection is down), saying why.
    #[error("the vessel that raised it cannot be reached: {0}")]
    Unreachable(String),
}

/// The person's answer to an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalAnswer {
    /// No.
    Refuse,
    /// Yes, for this call only.
    Once,
    /// Yes, and the same again without asking, as this says.
    Remember(Remember),
}

/// A change in the queue, for front ends that show it live.
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one event per prompt the person is shown: a few hundred bytes each is nothing"
)]
pub enum PersonEvent {
    /// A new prompt is waiting.
    Asked(PendingPrompt),
    /// A prompt left the queue (answered, timed out, or withdrawn).
    Closed {
        /// The prompt's id.
        id: u64,
    },
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// No open prompt has that id (answered already, timed out or withdrawn).
    #[error("no open prompt {0}")]
    NotFound(u64),
    /// The prompt is of the other kind.
    #[error("prompt {0} is not {1}")]
    WrongKind(u64, &'static str),
    /// The approval cannot be remembered: its call names no agent, or it
    /// was not asked by a call that may be remembered.
    #[error("call {0} cannot be remembered (it names no agent): allow it once or refuse it")]
    NotRememberable(u64),
    /// The allowance was not made; the prompt is still open.
    #[error("{1}: call {0} is still waiting for an answer")]
    NotRemembered(u64, #[source] AllowanceError),
    /// The prompt was raised by another vessel of the fleet, which did not
    /// take this answer.
    #[error("prompt {0} was not answered: {1}")]
    NotTaken(u64, #[source] NotTaken),
    /// The prompt was raised by another vessel of the fleet: its answer
    /// goes there, through the confirmed answers
    /// ([`PersonChannel::answer_consent_confirmed`],
    /// [`PersonChannel::answer_approval_confirmed`]).
    #[error(
        "prompt {0} was raised by another vessel of the fleet: its answer must be confirmed there"
    )]
    Mirrored(u64),
}

enum Responder {
    Consent(oneshot::Sender<ConsentDecision>),
    Approval(oneshot::Sender<Answered>),
    /// A prompt another vessel raised: whether it is a consent, and where
    /// its answer goes.
    Mirror(bool, AnswerSink),
}

impl Responder {
    fn is_consent(&self) -> bool {
        matches!(self, Responder::Consent(_) | Responder::Mirror(true, _))
    }
}

struct Entry {
    view: PendingPrompt,
    responder: Responder,
    /// What a yes may be remembered as, for an agent's call.
    offer: Option<AllowanceOffer>,
    /// When the person was asked.
    asked: Instant,
}

/// The queue of prompts for the person.
pub struct PersonChannel {
    pending: Mutex<BTreeMap<u64, Entry>>,
    next_id: AtomicU64,
    events: broadcast::Sender<PersonEvent>,
    approval_timeout: Duration,
    /// Where the person's answer times are counted.
    metrics: Arc<Metrics>,
}

impl fmt::Debug for PersonChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PersonChannel")
            .field("pending", &self.lock().len())
            .finish()
    }
}

impl Default for PersonChannel {
    fn default() -> Self {
        PersonChannel::new(DEFAULT_APPROVAL_TIMEOUT)
    }
}

/// Removes a prompt when its asker stops waiting, however that happens.
struct Withdraw<'a> {
    channel: &'a PersonChannel,
    id: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.channel.close(self.id);
    }
}

impl PersonChannel {
    /// An empty queue; approvals asked through [`Approver`] wait at most
    /// `approval_timeout`.
    pub fn new(approval_timeout: Duration) -> PersonChannel {
        PersonChannel {
            pending: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            events: broadcast::channel(256).0,
            approval_timeout,
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// Counts the time the person takes to answer into `metrics` (by
    /// default, counters of its own).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> PersonChannel {
        self.metrics = metrics;
        self
    }

    /// How many prompts wait now: pairings, then approvals.
    pub fn waiting(&self) -> (usize, usize) {
        let pending = self.lock();
        let pairings = pending
            .values()
            .filter(|e| e.responder.is_consent())
            .count();
        (pairings, pending.len() - pairings)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `prompt` in the queue, unless it is an approval of an agent
    /// that has its cap of approvals waiting (counted under the same lock).
    fn open(
        &self,
        prompt: Prompt,
        timeout: Duration,
        responder: Responder,
        offer: Option<AllowanceOffer>,
    ) -> Result<u64, ApprovalError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let view = PendingPrompt {
            id,
            expires_at_ms: epoch_ms(SystemTime::now() + timeout),
            prompt,
            can_remember: offer.is_some(),
            mirrored: false,
        };
        {
            let mut pending = self.lock();
            if let Some(agent) = asking_agent(&view.prompt) {
                let waiting = pending
                    .values()
                    .filter(|e| asking_agent(&e.view.prompt) == Some(agent))
                    .count();
                if waiting >= APPROVALS_PER_AGENT {
                    return Err(ApprovalError::TooManyWaiting {
                        agent: agent.to_owned(),
                        limit: APPROVALS_PER_AGENT,
                    });
                }
            }
            pending.insert(
                id,
                Entry {
                    view: view.clone(),
                    responder,
                    offer,
                    asked: Instant::now(),
                },
            );
        }
        let _ = self.events.send(PersonEvent::Asked(view));
        Ok(id)
    }

    fn close(&self, id: u64) {
        if self.lock().remove(&id).is_some() {
            let _ = self.events.send(PersonEvent::Closed { id });
        }
    }

    /// Shows the person `prompt`, which another vessel of the fleet raised
    /// and waits on, under an id of this queue (returned, never used
    /// before by this queue). Answering it here hands the answer to `send`,
    /// for that vessel (the first answer it gets wins), and tells the
    /// person whether it was taken; it is not timed out or counted against
    /// its agent here, and leaves only when [`PersonChannel::close_mirror`]
    /// says the other vessel closed it (or left).
    pub fn mirror(
        &self,
        prompt: Prompt,
        expires_at_ms: u64,
        can_remember: bool,
        send: AnswerSink,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let consent = matches!(prompt, Prompt::Consent(_));
        let view = PendingPrompt {
            id,
            expires_at_ms,
            prompt,
            can_remember,
            mirrored: true,
        };
        self.lock().insert(
            id,
            Entry {
                view: view.clone(),
                responder: Responder::Mirror(consent, send),
                offer: None,
                asked: Instant::now(),
            },
        );
        let _ = self.events.send(PersonEvent::Asked(view));
        id
    }

    /// Takes the mirrored prompt `id` out of the queue without an answer
    /// (the vessel that raised it closed it). Does nothing to a prompt
    /// raised here.
    pub fn close_mirror(&self, id: u64) {
        let mut pending = self.lock();
        if !pending
            .get(&id)
            .is_some_and(|e| matches!(e.responder, Responder::Mirror(..)))
        {
            return;
        }
        pending.remove(&id);
        drop(pending);
        let _ = self.events.send(PersonEvent::Closed { id });
    }

    /// Asks the person to pair a device; no answer within `timeout` is a no.
    pub async fn ask_consent(&self, request: ConsentRequest, timeout: Duration) -> ConsentDecision {
        let (tx, rx) = oneshot::channel();
        // Consents are not counted against an agent: this cannot fail.
        let Ok(id) = self.open(
            Prompt::Consent(request),
            timeout,
            Responder::Consent(tx),
            None,
        ) else {
            return ConsentDecision::refuse();
        };
        let _withdraw = Withdraw { channel: self, id };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(decision)) => decision,
            _ => ConsentDecision::refuse(),
        }
    }

    /// Asks the person to approve a call; no answer within `timeout` is a
    /// no, and so is a request the person is not asked
    /// (an agent that already has its cap of approvals waiting).
    pub(crate) async fn ask_approval(&self, request: ApprovalRequest, timeout: Duration) -> bool {
        self.try_ask_approval(request, timeout)
            .await
            .unwrap_or(false)
    }

    /// Asks the person to approve a call; no answer within `timeout` is a
    /// no. A request of an agent that already has its cap of approvals
    /// waiting is not put to the person.
    pub(crate) async fn try_ask_approval(
        &self,
        request: ApprovalRequest,
        timeout: Duration,
    ) -> Result<bool, ApprovalError> {
        Ok(matches!(
            self.try_ask_remembering(request, None, timeout)
                .await?
                .approval,
            Approval::Once | Approval::Remembered(_)
        ))
    }

    /// Asks the person to approve a call, letting them remember a yes as
    /// `offer` allows; no answer within `timeout` is a no. A request of an
    /// agent that already has its cap of approvals waiting is not put to
    /// the person. The answer says which front end gave it.
    pub(crate) async fn try_ask_remembering(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
        timeout: Duration,
    ) -> Result<Answered, ApprovalError> {
        let (tx, rx) = oneshot::channel();
        let id = self.open(
            Prompt::Approval(request),
            timeout,
            Responder::Approval(tx),
            offer,
        )?;
        let _withdraw = Withdraw { channel: self, id };
        Ok(match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answered)) => answered,
            _ => Answered {
                approval: Approval::Refused,
                by: None,
            },
        })
    }

    /// Withdraws every waiting approval for which `withdraw` says yes: its
    /// call gets a no, and every front end sees the prompt close. Returns
    /// how many were withdrawn.
    pub(crate) fn withdraw_approvals(&self, withdraw: impl Fn(&ApprovalRequest) -> bool) -> usize {
        let ids: Vec<u64> = self
            .lock()
            .iter()
            .filter(|(_, e)| !e.view.mirrored)
            .filter(|(_, e)| matches!(&e.view.prompt, Prompt::Approval(r) if withdraw(r)))
            .map(|(id, _)| *id)
            .collect();
        let mut withdrawn = 0;
        for id in ids {
            if let Ok((Responder::Approval(tx), _)) = self.take(id, "an approval") {
                let _ = tx.send(Answered {
                    approval: Approval::Refused,
                    by: None,
                });
                withdrawn += 1;
            }
        }
        withdrawn
    }

    /// Open prompts, oldest first.
    pub fn pending(&self) -> Vec<PendingPrompt> {
        self.lock().values().map(|e| e.view.clone()).collect()
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<PersonEvent> {
        self.events.subscribe()
    }

    /// Takes prompt `id` out of the queue: its responder, and when it was
    /// asked.
    fn take(&self, id: u64, want: &'static str) -> Result<(Responder, Instant), AnswerError> {
        let mut pending = self.lock();
        let entry = pending.get(&id).ok_or(AnswerError::NotFound(id))?;
        let kind = if entry.responder.is_consent() {
            "a consent"
        } else {
            "an approval"
        };
        if kind != want {
            return Err(AnswerError::WrongKind(id, want));
        }
        let entry = pending.remove(&id).ok_or(AnswerError::NotFound(id))?;
        drop(pending);
        let _ = self.events.send(PersonEvent::Closed { id });
        Ok((entry.responder, entry.asked))
    }

    /// Answers a consent prompt (the decision says who answered, when a
    /// front end set [`ConsentDecision::by`]).
    pub fn answer_consent(&self, id: u64, decision: ConsentDecision) -> Result<(), AnswerError> {
        if self.is_mirror(id) {
            return Err(AnswerError::Mirrored(id));
        }
        match self.take(id, "a consent")? {
            (Responder::Consent(tx), asked) => {
                self.metrics
                    .person_answered(PromptKind::Pairing, asked.elapsed());
                tx.send(decision).map_err(|_| AnswerError::NotFound(id))
            }
            (Responder::Approval(_), _) => Err(AnswerError::WrongKind(id, "a consent")),
            (Responder::Mirror(..), _) => Err(AnswerError::Mirrored(id)),
        }
    }

    /// Answers an approval prompt with a yes for this call once, or a no.
    pub fn answer_approval(&self, id: u64, approve: bool) -> Result<(), AnswerError> {
        let answer = if approve {
            ApprovalAnswer::Once
        } else {
            ApprovalAnswer::Refuse
        };
        self.answer_approval_with(id, answer).map(|_| ())
    }

    /// Answers an approval prompt; a yes to remember makes the allowance
    /// first and returns it. When it cannot be made (the call names no
    /// agent, [`MAX_ALLOWANCES`](crate::allowances::MAX_ALLOWANCES) are live, the grant
    /// or the agent changed meanwhile) the prompt stays open for another
    /// answer.
    pub fn answer_approval_with(
        &self,
        id: u64,
        answer: ApprovalAnswer,
    ) -> Result<Option<Allowance>, AnswerError> {
        self.answer_approval_by(id, answer, None)
    }

    /// Answers an approval prompt as [`PersonChannel::answer_approval_with`]
    /// does; the call's audit entry names `by`.
    pub fn answer_approval_by(
        &self,
        id: u64,
        answer: ApprovalAnswer,
        by: Option<By>,
    ) -> Result<Option<Allowance>, AnswerError> {
        let (approval, made) = match answer {
            ApprovalAnswer::Refuse => (Approval::Refused, None),
            ApprovalAnswer::Once => (Approval::Once, None),
            _ if self.is_mirror(id) => return Err(AnswerError::Mirrored(id)),
            ApprovalAnswer::Remember(remember) => {
                return self.remember(id, remember, by).map(Some);
            }
        };
        match self.take(id, "an approval")? {
            (Responder::Mirror(..), _) => return Err(AnswerError::Mirrored(id)),
            (Responder::Approval(tx), asked) => {
                self.metrics
                    .person_answered(PromptKind::Approval, asked.elapsed());
                tx.send(Answered { approval, by })
                    .map_err(|_| AnswerError::NotFound(id))?
            }
            (Responder::Consent(_), _) => {
                return Err(AnswerError::WrongKind(id, "an approval"));
            }
        }
        Ok(made)
    }

    /// Answers a consent prompt as [`PersonChannel::answer_consent`] does;
    /// one another vessel of the fleet raised goes to that vessel, and is
    /// answered only once it says it took the answer (else
    /// [`AnswerError::NotTaken`], the prompt still listed).
    pub async fn answer_consent_confirmed(
        &self,
        id: u64,
        decision: ConsentDecision,
    ) -> Result<(), AnswerError> {
        match self.mirror_sink(id, "a consent")? {
            None => self.answer_consent(id, decision),
            Some(send) => send(MirroredAnswer::Consent(decision))
                .await
                .map(|_| ())
                .map_err(|why| AnswerError::NotTaken(id, why)),
        }
    }

    /// Answers an approval prompt as [`PersonChannel::answer_approval_by`]
    /// does; one another vessel of the fleet raised goes to that vessel
    /// (which makes the allowance of a yes remembered), and is answered
    /// only once it says it took the answer (else
    /// [`AnswerError::NotTaken`], the prompt still listed).
    pub async fn answer_approval_confirmed(
        &self,
        id: u64,
        answer: ApprovalAnswer,
        by: Option<By>,
    ) -> Result<Option<Allowance>, AnswerError> {
        let send = {
            let pending = self.lock();
            let entry = pending.get(&id).ok_or(AnswerError::NotFound(id))?;
            match &entry.responder {
                Responder::Mirror(false, send) => {
                    if matches!(answer, ApprovalAnswer::Remember(_)) && !entry.view.can_remember {
                        return Err(AnswerError::NotRememberable(id));
                    }
                    Some(Arc::clone(send))
                }
                Responder::Mirror(true, _) | Responder::Consent(_) => {
                    return Err(AnswerError::WrongKind(id, "an approval"));
                }
                Responder::Approval(_) => None,
            }
        };
        match send {
            None => self.answer_approval_by(id, answer, by),
            Some(send) => send(MirroredAnswer::Approval { answer, by })
                .await
                .map_err(|why| AnswerError::NotTaken(id, why)),
        }
    }

    /// Where the answer to prompt `id` goes when another vessel raised it
    /// (`None` for a prompt raised here), checking it is `want`.
    fn mirror_sink(&self, id: u64, want: &'static str) -> Result<Option<AnswerSink>, AnswerError> {
        let pending = self.lock();
        let entry = pending.get(&id).ok_or(AnswerError::NotFound(id))?;
        let consent = entry.responder.is_consent();
        if consent != (want == "a consent") {
            return Err(AnswerError::WrongKind(id, want));
        }
        Ok(match &entry.responder {
            Responder::Mirror(_, send) => Some(Arc::clone(send)),
            _ => None,
        })
    }

    /// Whether prompt `id` is another vessel's, shown here.
    fn is_mirror(&self, id: u64) -> bool {
        self.lock()
            .get(&id)
            .is_some_and(|e| matches!(e.responder, Responder::Mirror(..)))
    }

    /// Makes the allowance approval `id` offers, then answers it with a yes:
    /// under the queue's lock, so the prompt is answered once.
    fn remember(
        &self,
        id: u64,
        remember: Remember,
        by: Option<By>,
    ) -> Result<Allowance, AnswerError> {
        let (entry, allowance) = {
            let mut pending = self.lock();
            let entry = pending.get(&id).ok_or(AnswerError::NotFound(id))?;
            if entry.responder.is_consent() {
                return Err(AnswerError::WrongKind(id, "an approval"));
            }
            let offer = entry
                .offer
                .as_ref()
                .ok_or(AnswerError::NotRememberable(id))?;
            let allowance = offer
                .accept(remember)
                .map_err(|e| AnswerError::NotRemembered(id, e))?;
            let entry = pending.remove(&id).ok_or(AnswerError::NotFound(id))?;
            (entry, allowance)
        };
        let _ = self.events.send(PersonEvent::Closed { id });
        self.metrics
            .person_answered(PromptKind::Approval, entry.asked.elapsed());
        if let Some(offer) = &entry.offer {
            offer.announce(&allowance);
        }
        if let Responder::Approval(tx) = entry.responder {
            // An asker gone meanwhile leaves the allowance: the person made it.
            let _ = tx.send(Answered {
                approval: Approval::Remembered(allowance.clone()),
                by,
            });
        }
        Ok(allowance)
    }
}

/// The agent an approval prompt is asked for, if any.
fn asking_agent(prompt: &Prompt) -> Option<&str> {
    match prompt {
        Prompt::Approval(request) => request.agent_id.as_deref(),
        Prompt::Consent(_) => None,
    }
}

impl Approver for PersonChannel {
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, ApprovalError>> {
        Box::pin(self.try_ask_approval(request, self.approval_timeout))
    }

    fn approve_remembering(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
    ) -> BoxFuture<'_, Result<Approval, ApprovalError>> {
        let asking = self.approve_answered(request, offer);
        Box::pin(async move { asking.await.map(|answered| answered.approval) })
    }

    fn approve_answered(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
    ) -> BoxFuture<'_, Result<Answered, ApprovalError>> {
        Box::pin(self.try_ask_remembering(request, offer, self.approval_timeout))
    }
}

/// An open prompt as the admin API lists it (and a fleet member shows it
/// to the others).
impl From<PendingPrompt> for api::Pending {
    fn from(pending: PendingPrompt) -> api::Pending {
        api::Pending {
            id: pending.id,
            expires_at_ms: pending.expires_at_ms,
            prompt: pending.prompt.into(),
            can_remember: pending.can_remember,
        }
    }
}

impl From<Prompt> for api::Prompt {
    fn from(prompt: Prompt) -> api::Prompt {
        match prompt {
            Prompt::Consent(request) => api::Prompt::Consent(request.into()),
            Prompt::Approval(request) => api::Prompt::Approval(request.into()),
        }
    }
}

impl From<ConsentRequest> for api::ConsentRequest {
    fn from(request: ConsentRequest) -> api::ConsentRequest {
        api::ConsentRequest {
            device_id: request.device_id,
            name: request.name,
            kind: request.kind,
            code: request.code,
            capabilities: request
                .capabilities
                .into_iter()
                .map(|c| api::DeviceCapability {
                    name: c.name,
                    kind: c.kind,
                    description: c.description,
                    confirm: c.confirm,
                    params: c.params,
                    title: c.title,
                    claims: c.claims,
                })
                .collect(),
            events: request.events,
            replaces: request.replaces.map(|old| *old),
            no_screen: request.no_screen,
            channel: request.channel,
        }
    }
}

impl From<ApprovalRequest> for api::ApprovalRequest {
    fn from(request: ApprovalRequest) -> api::ApprovalRequest {
        api::ApprovalRequest {
            tool: request.tool,
            device_id: request.device_id,
            capability: request.capability,
            input: request.input,
            reason: request.reason,
            agent_id: request.agent_id,
            session_id: request.session_id,
            channel: request.channel,
            microphone: request.microphone,
        }
    }
}

/// A prompt another vessel of the fleet listed, to be shown here.
impl From<api::Prompt> for Prompt {
    fn from(prompt: api::Prompt) -> Prompt {
        match prompt {
            api::Prompt::Consent(request) => {
                let capabilities = request
                    .capabilities
                    .into_iter()
                    .map(|cap| crate::registry::ConsentCapability {
                        name: cap.name,
                        kind: cap.kind,
                        description: cap.description,
                        confirm: cap.confirm,
                        params: cap.params,
                        title: cap.title,
                        claims: cap.claims,
                    })
                    .collect();
                Prompt::Consent(ConsentRequest {
                    device_id: request.device_id,
                    name: request.name,
                    kind: request.kind,
                    code: request.code,
                    capabilities,
                    events: request.events,
                    replaces: request.replaces.map(Box::new),
                    no_screen: request.no_screen,
                    channel: request.channel,
                })
            }
            api::Prompt::Approval(request) => Prompt::Approval(ApprovalRequest {
                tool: request.tool,
                device_id: request.device_id,
                capability: request.capability,
                input: request.input,
                reason: request.reason,
                agent_id: request.agent_id,
                session_id: request.session_id,
                channel: request.channel,
                microphone: request.microphone,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
