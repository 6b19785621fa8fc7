//! A vessel as a member of a fleet: the vessels sharing one PostgreSQL
//! store and one fleet key, talking over NATS through dk-fleet.
//!
//! What each member does for the others:
//!
//! - **Presence.** It announces the devices connected to it; a call for a
//!   device connected elsewhere goes to that member ([`RemoteLinks`]).
//! - **Calls.** The member the agent talks to runs the seven checks and
//!   writes the one decision record; only the last step, carrying the
//!   call to the device and its answer back, crosses to the member
//!   holding the device, within the call's own time.
//! - **State.** A pairing, grant, revocation or unpairing is committed to
//!   the shared store and then named to the others, which read that
//!   device again ([`DeviceRegistry::refresh`]); each member also reads
//!   everything again when its NATS connection comes back and every
//!   [`RECONCILE_EVERY`], so a word missed is caught up. Agents are
//!   read again the same way.
//! - **Prompts.** A prompt raised on one member is shown on every member
//!   ([`PersonChannel::mirror`]); an answer given anywhere goes to the
//!   member that raised it, which takes the first one and closes the
//!   prompt everywhere.
//!
//! - **Allowances.** A yes the person remembers on one member is kept as a
//!   copy by the others (it covers the same agent's calls decided there);
//!   revoking it on any member ends it everywhere.
//!
//! Every message is sealed under the fleet key by dk-fleet: a NATS client
//! without it can neither inject a call or an answer nor read one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use dk_core::Vessel;
use dk_core::by::By;
use dk_core::link::{DeviceLink, InvokeResult, RemoteLinks};
use dk_core::person::{ApprovalAnswer, MirroredAnswer, PersonEvent, Prompt as CorePrompt};
use dk_core::registry::{ConsentCapability, ConsentDecision, ConsentRequest};
use dk_fleet::{Fleet, MemberId, Request};
use dk_proto::InvokeError;
use dk_proto::admin::{self as api, AllowanceScope};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use crate::allowances::{AllowanceChange, AllowanceMinutes, Remember};

/// How often a member reads every pairing again from the shared store,
/// besides reading each one another member names as changed.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// How often the set of devices connected here is looked at, to announce
/// it when it changed.
const PRESENCE_CHECK: Duration = Duration::from_millis(100);

/// What a routed call adds to the call's own time before the member asking
/// gives up on the member holding the device: that member's answer, even
/// "did not answer within", comes back in the words of a local call.
const ROUTING_MARGIN: Duration = Duration::from_secs(1);

/// A request from one member to another.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "camelCase", deny_unknown_fields)]
enum Ask {
    /// Carry a call, already decided by the sender, to a device held here.
    #[serde(rename_all = "camelCase")]
    Invoke {
        device: String,
        capability: String,
        input: Map<String, Value>,
        timeout_ms: u64,
    },
    /// The person's answer to a pairing prompt raised here.
    #[serde(rename_all = "camelCase")]
    Consent {
        id: u64,
        answer: api::ConsentAnswer,
        by: Option<By>,
    },
    /// The person's answer to an approval prompt raised here.
    #[serde(rename_all = "camelCase")]
    Approval {
        id: u64,
        approved: bool,
        remember: Option<(AllowanceScope, u32)>,
        by: Option<By>,
    },
}

/// The reply to an [`Ask`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reply {
    ok: bool,
    /// A call's result, when the device sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Box<RawValue>>,
    /// Why not, in the words a local caller gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Whether the device itself answered with the error.
    #[serde(default)]
    device: bool,
}

impl Reply {
    fn ok() -> Reply {
        Reply {
            ok: true,
            result: None,
            error: None,
            device: false,
        }
    }

    fn failed(error: impl ToString, device: bool) -> Reply {
        Reply {
            ok: false,
            result: None,
            error: Some(error.to_string()),
            device,
        }
    }
}

/// An event for every other member.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "camelCase", deny_unknown_fields)]
enum Said {
    /// Read this device's pairing and grants again.
    Changed { device: String },
    /// Read the agents again.
    Agents,
    /// The person remembered a yes here: keep a copy.
    #[serde(rename_all = "camelCase")]
    Allowance {
        allowance: Value,
        generation: u64,
        read_only: bool,
    },
    /// The person revoked the allowance `id` that `member` made.
    Revoked { member: String, id: u64 },
    /// A prompt raised here, as `GET /v1/pending` lists it.
    Asked { prompt: Value },
    /// A prompt raised here left the queue.
    Closed { id: u64 },
}

/// A member's running part in the fleet: stopped with the vessel.
#[derive(Debug)]
pub(crate) struct Membership {
    fleet: Arc<Fleet>,
    tasks: Vec<JoinHandle<()>>,
}

impl Membership {
    /// Joins `vessel` to `fleet`: its calls reach devices held by other
    /// members, its state follows theirs, its prompts are shown on theirs.
    /// The tasks end when `stopped` turns true.
    pub(crate) async fn start(
        vessel: &Arc<Vessel>,
        fleet: Fleet,
        stopped: watch::Receiver<bool>,
    ) -> Result<Membership, dk_fleet::FleetError> {
        let fleet = Arc::new(fleet);
        let requests = fleet.serve().await?;
        let events = fleet.events().await?;
        let (say, said) = mpsc::unbounded_channel();
        let mirrors = Arc::new(Mirrors::default());
        vessel.links().set_remote(Arc::new(FleetLinks {
            fleet: Arc::clone(&fleet),
        }));
        {
            let say = say.clone();
            vessel.registry().on_change(Arc::new(move |device: &str| {
                let _ = say.send(Said::Changed {
                    device: device.to_owned(),
                });
            }));
        }
        {
            let say = say.clone();
            vessel.agents().on_change(Arc::new(move || {
                let _ = say.send(Said::Agents);
            }));
        }
        {
            let say = say.clone();
            let here = fleet.member().as_str().to_owned();
            vessel
                .registry()
                .allowances()
                .share_with(Arc::new(move |change| {
                    let said = match change {
                        AllowanceChange::Made {
                            allowance,
                            generation,
                            read_only,
                        } => match serde_json::to_value(&allowance) {
                            Ok(allowance) => Said::Allowance {
                                allowance,
                                generation,
                                read_only,
                            },
                            Err(_) => return,
                        },
                        AllowanceChange::Revoked { origin, id } => match origin {
                            Some((member, id)) => Said::Revoked { member, id },
                            None => Said::Revoked {
                                member: here.clone(),
                                id,
                            },
                        },
                    };
                    let _ = say.send(said);
                }));
        }
        let person = vessel.person().subscribe();
        let tasks = vec![
            tokio::spawn(until(
                stopped.clone(),
                announce(Arc::clone(vessel), Arc::clone(&fleet)),
            )),
            tokio::spawn(until(stopped.clone(), serve(Arc::clone(vessel), requests))),
            tokio::spawn(until(
                stopped.clone(),
                listen(
                    Arc::clone(vessel),
                    Arc::clone(&fleet),
                    events,
                    Arc::clone(&mirrors),
                ),
            )),
            tokio::spawn(until(stopped.clone(), tell(Arc::clone(&fleet), said))),
            tokio::spawn(until(stopped.clone(), show_prompts(person, say))),
            tokio::spawn(until(
                stopped,
                reconcile(Arc::clone(vessel), Arc::clone(&fleet)),
            )),
        ];
        Ok(Membership { fleet, tasks })
    }

    /// The member's place in the fleet.
    pub(crate) fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// Stops the tasks and says goodbye, so the others forget this
    /// member's devices at once.
    pub(crate) async fn leave(self) {
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        if let Err(error) = self.fleet.leave().await {
            tracing::warn!(%error, "this member's goodbye was not said");
        }
    }
}

/// Runs `work` until `stopped` turns true.
async fn until(mut stopped: watch::Receiver<bool>, work: impl Future<Output = ()>) {
    tokio::select! {
        _ = stopped.wait_for(|s| *s) => {}
        () = work => {}
    }
}

/// Announces the devices connected here whenever that set changes (the
/// fleet repeats it with every beat).
async fn announce(vessel: Arc<Vessel>, fleet: Arc<Fleet>) {
    let mut seen = None;
    loop {
        let now = vessel.links().changes();
        if seen != Some(now) {
            seen = Some(now);
            if let Err(error) = fleet.announce(vessel.links().ids()) {
                tracing::warn!(%error, "the devices held here are not announced to the fleet");
            }
        }
        tokio::time::sleep(PRESENCE_CHECK).await;
    }
}

/// Answers the requests other members send here.
async fn serve(vessel: Arc<Vessel>, mut requests: dk_fleet::Requests) {
    while let Some(request) = requests.next().await {
        let vessel = Arc::clone(&vessel);
        tokio::spawn(async move {
            let reply = answer(&vessel, &request).await;
            let bytes = serde_json::to_vec(&reply).unwrap_or_default();
            if let Err(error) = request.respond(&bytes).await {
                tracing::debug!(%error, "a fleet reply was not sent");
            }
        });
    }
}

/// What this member replies to `request`.
async fn answer(vessel: &Vessel, request: &Request) -> Reply {
    let ask: Ask = match serde_json::from_slice(request.payload()) {
        Ok(ask) => ask,
        Err(error) => {
            return Reply::failed(format!("fleet: a request not understood: {error}"), false);
        }
    };
    match ask {
        Ask::Invoke {
            device,
            capability,
            input,
            timeout_ms,
        } => {
            let Some(link) = vessel.links().get(&device) else {
                return Reply::failed(
                    format!(
                        "fleet: device \"{device}\" is no longer connected to the member holding it"
                    ),
                    false,
                );
            };
            let left = request.deadline().saturating_duration_since(Instant::now());
            let timeout = Duration::from_millis(timeout_ms).min(left);
            match link.invoke(&capability, &input, timeout).await {
                Ok(result) => Reply {
                    ok: true,
                    result,
                    error: None,
                    device: false,
                },
                Err(error) => Reply::failed(&error, error.is_device_error()),
            }
        }
        Ask::Consent { id, answer, by } => {
            let decision = ConsentDecision {
                approved: answer.approved,
                grant: answer.grant,
                confirmed_without_code: answer.confirm_without_code,
                by,
                confirmed_credential_change: answer.confirm_credential_change,
            };
            match vessel.person().answer_consent(id, decision) {
                Ok(()) => Reply::ok(),
                Err(error) => Reply::failed(error, false),
            }
        }
        Ask::Approval {
            id,
            approved,
            remember,
            by,
        } => {
            let answer = match (approved, remember) {
                (false, _) => ApprovalAnswer::Refuse,
                (true, None) => ApprovalAnswer::Once,
                (true, Some((scope, minutes))) => match AllowanceMinutes::new(u64::from(minutes)) {
                    Ok(minutes) => ApprovalAnswer::Remember(Remember { scope, minutes }),
                    Err(error) => return Reply::failed(error, false),
                },
            };
            match vessel.person().answer_approval_by(id, answer, by) {
                Ok(_) => Reply::ok(),
                Err(error) => Reply::failed(error, false),
            }
        }
    }
}

/// Prompts other members raised, shown here: by the member and its id,
/// the id in this vessel's queue.
#[derive(Default)]
struct Mirrors {
    shown: Mutex<HashMap<(MemberId, u64), u64>>,
}

impl Mirrors {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(MemberId, u64), u64>> {
        self.shown.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Acts on what the other members say.
async fn listen(
    vessel: Arc<Vessel>,
    fleet: Arc<Fleet>,
    mut events: dk_fleet::Events,
    mirrors: Arc<Mirrors>,
) {
    while let Some(event) = events.next().await {
        let said: Said = match serde_json::from_slice(&event.payload) {
            Ok(said) => said,
            Err(error) => {
                tracing::warn!(from = %event.from, %error, "a fleet event not understood");
                continue;
            }
        };
        match said {
            Said::Changed { device } => {
                let registry = Arc::clone(vessel.registry());
                let read = tokio::task::spawn_blocking(move || registry.refresh(&device)).await;
                if let Ok(Err(error)) = read {
                    tracing::warn!(%error, "a pairing another member changed was not read again");
                }
            }
            Said::Agents => reload_agents(&vessel).await,
            Said::Allowance {
                allowance,
                generation,
                read_only,
            } => match serde_json::from_value::<api::Allowance>(allowance) {
                Ok(allowance) => {
                    let kept = vessel.registry().allowances().adopt(
                        event.from.as_str(),
                        allowance,
                        generation,
                        read_only,
                    );
                    if kept.is_none() {
                        tracing::warn!(from = %event.from, "an allowance of another member not kept: too many live");
                    }
                }
                Err(error) => {
                    tracing::warn!(from = %event.from, %error, "an allowance not understood")
                }
            },
            Said::Revoked { member, id } => {
                vessel
                    .registry()
                    .allowances()
                    .forget(fleet.member().as_str(), &member, id);
            }
            Said::Asked { prompt } => {
                show(&vessel, &fleet, &mirrors, event.from, prompt);
            }
            Said::Closed { id } => {
                if let Some(local) = mirrors.lock().remove(&(event.from, id)) {
                    vessel.person().close_mirror(local);
                }
            }
        }
    }
}

/// Reads the agents again from the shared store.
async fn reload_agents(vessel: &Arc<Vessel>) {
    let store = Arc::clone(vessel.registry().store());
    match tokio::task::spawn_blocking(move || store.load_agents()).await {
        Ok(Ok(stored)) => {
            if let Err(error) = vessel.agents().reload(stored) {
                tracing::warn!(%error, "the shared agents were not read again");
            }
        }
        Ok(Err(error)) => tracing::warn!(%error, "the shared agents were not read again"),
        Err(_) => {}
    }
}

/// Shows here the prompt `from` raised (its listing's JSON), its answer
/// going back to `from`.
fn show(
    vessel: &Arc<Vessel>,
    fleet: &Arc<Fleet>,
    mirrors: &Arc<Mirrors>,
    from: MemberId,
    json: Value,
) {
    let Ok(pending) = serde_json::from_value::<api::Pending>(json) else {
        tracing::warn!(%from, "a prompt from the fleet not understood");
        return;
    };
    let Some(prompt) = core_prompt(pending.prompt) else {
        tracing::warn!(%from, "a prompt from the fleet not understood");
        return;
    };
    let origin_id = pending.id;
    let to = from.clone();
    let fleet_for_answer = Arc::clone(fleet);
    let send = Box::new(move |answer: MirroredAnswer| {
        let ask = match answer {
            MirroredAnswer::Consent(decision) => Ask::Consent {
                id: origin_id,
                answer: api::ConsentAnswer {
                    approved: decision.approved,
                    grant: decision.grant,
                    confirm_without_code: decision.confirmed_without_code,
                    confirm_credential_change: decision.confirmed_credential_change,
                },
                by: decision.by,
            },
            MirroredAnswer::Approval { answer, by } => Ask::Approval {
                id: origin_id,
                approved: !matches!(answer, ApprovalAnswer::Refuse),
                remember: match answer {
                    ApprovalAnswer::Remember(r) => Some((r.scope, r.minutes.get())),
                    _ => None,
                },
                by,
            },
        };
        tokio::spawn(async move {
            let Ok(bytes) = serde_json::to_vec(&ask) else {
                return;
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            match fleet_for_answer.request(&to, &bytes, deadline).await {
                Ok(reply) => {
                    if let Ok(Reply {
                        ok: false, error, ..
                    }) = serde_json::from_slice(&reply)
                    {
                        tracing::info!(member = %to, error = error.as_deref().unwrap_or(""),
                            "the member that raised a prompt did not take this answer");
                    }
                }
                Err(error) => {
                    tracing::warn!(member = %to, %error, "an answer did not reach the member that raised its prompt");
                }
            }
        });
    });
    let local = vessel
        .person()
        .mirror(prompt, pending.expires_at_ms, pending.can_remember, send);
    mirrors.lock().insert((from.clone(), origin_id), local);
    // Past its time the member that raised it took it as a no: gone here too.
    let left = pending
        .expires_at_ms
        .saturating_sub(dk_store::epoch_ms(SystemTime::now()))
        .saturating_add(1000);
    let (vessel, mirrors) = (Arc::clone(vessel), Arc::clone(mirrors));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(left)).await;
        if mirrors.lock().remove(&(from, origin_id)).is_some() {
            vessel.person().close_mirror(local);
        }
    });
}

/// dk-core's prompt for one listed by another member.
fn core_prompt(prompt: api::Prompt) -> Option<CorePrompt> {
    Some(match prompt {
        api::Prompt::Consent(request) => {
            let mut capabilities = Vec::with_capacity(request.capabilities.len());
            for cap in request.capabilities {
                let kind = match cap.kind.as_str() {
                    "sensor" => dk_proto::CapabilityKind::Sensor.as_str(),
                    "actuator" => dk_proto::CapabilityKind::Actuator.as_str(),
                    _ => return None,
                };
                capabilities.push(ConsentCapability {
                    name: cap.name,
                    kind,
                    description: cap.description,
                    confirm: cap.confirm,
                });
            }
            CorePrompt::Consent(ConsentRequest {
                device_id: request.device_id,
                name: request.name,
                kind: request.kind,
                code: request.code,
                capabilities,
                replaces: request.replaces.map(Box::new),
                no_screen: request.no_screen,
                channel: request.channel,
            })
        }
        api::Prompt::Approval(request) => CorePrompt::Approval(dk_core::adapter::ApprovalRequest {
            tool: request.tool,
            device_id: request.device_id,
            capability: request.capability,
            input: request.input,
            reason: request.reason,
            agent_id: request.agent_id,
            session_id: request.session_id,
            channel: request.channel,
        }),
    })
}

/// Publishes what this member has to say, in order.
async fn tell(fleet: Arc<Fleet>, mut said: mpsc::UnboundedReceiver<Said>) {
    while let Some(said) = said.recv().await {
        let Ok(bytes) = serde_json::to_vec(&said) else {
            continue;
        };
        if let Err(error) = fleet.publish(&bytes).await {
            // Caught up by the others' reading everything again.
            tracing::warn!(%error, "a fleet event was not published");
        }
    }
}

/// Names every prompt raised here, and its closing, to the other members.
async fn show_prompts(
    mut person: broadcast::Receiver<PersonEvent>,
    say: mpsc::UnboundedSender<Said>,
) {
    let mut raised_here = HashSet::new();
    loop {
        match person.recv().await {
            Ok(PersonEvent::Asked(view)) => {
                if view.mirrored {
                    continue;
                }
                if let Ok(prompt) = serde_json::to_value(&view) {
                    raised_here.insert(view.id);
                    let _ = say.send(Said::Asked { prompt });
                }
            }
            Ok(PersonEvent::Closed { id }) => {
                if raised_here.remove(&id) {
                    let _ = say.send(Said::Closed { id });
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Reads every pairing again now and then, and as soon as the NATS
/// connection comes back: whatever word was missed meanwhile is caught up.
async fn reconcile(vessel: Arc<Vessel>, fleet: Arc<Fleet>) {
    let mut was_connected = fleet.is_connected();
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let connected = fleet.is_connected();
        let back = connected && !was_connected;
        was_connected = connected;
        if !back && last.elapsed() < RECONCILE_EVERY {
            continue;
        }
        last = Instant::now();
        let registry = Arc::clone(vessel.registry());
        if let Ok(Err(error)) = tokio::task::spawn_blocking(move || registry.refresh_all()).await {
            tracing::warn!(%error, "the shared pairings were not read again");
        }
        reload_agents(&vessel).await;
    }
}

/// Devices connected to other members, reached through them.
struct FleetLinks {
    fleet: Arc<Fleet>,
}

impl RemoteLinks for FleetLinks {
    fn reach(&self, device_id: &str) -> Option<Arc<dyn DeviceLink>> {
        if !self.fleet.is_connected() {
            // Whether another member holds it cannot be known: say why.
            return Some(Arc::new(Unreachable));
        }
        let holder = self.fleet.holder_of(device_id)?;
        if holder == *self.fleet.member() {
            // Announced from here but gone meanwhile: not connected.
            return None;
        }
        Some(Arc::new(RoutedLink {
            fleet: Arc::clone(&self.fleet),
            holder,
            device: device_id.to_owned(),
        }))
    }

    fn holder(&self, device_id: &str) -> Option<String> {
        let holder = self.fleet.holder_of(device_id)?;
        (holder != *self.fleet.member()).then(|| holder.as_str().to_owned())
    }
}

/// A device not connected here while the fleet's NATS connection is down.
struct Unreachable;

impl DeviceLink for Unreachable {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        _: &'a Map<String, Value>,
        _: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        Box::pin(std::future::ready(Err(InvokeError::Routed(
            "fleet: the fleet's NATS connection is down: a device not connected to this \
             vessel cannot be reached"
                .to_owned(),
        ))))
    }
}

/// A device connected to another member, called through it.
struct RoutedLink {
    fleet: Arc<Fleet>,
    holder: MemberId,
    device: String,
}

impl DeviceLink for RoutedLink {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        input: &'a Map<String, Value>,
        timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        Box::pin(async move {
            let ask = Ask::Invoke {
                device: self.device.clone(),
                capability: capability.to_owned(),
                input: input.clone(),
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            };
            let bytes =
                serde_json::to_vec(&ask).map_err(|e| InvokeError::Routed(format!("fleet: {e}")))?;
            let deadline = Instant::now() + timeout + ROUTING_MARGIN;
            let reply = self
                .fleet
                .request(&self.holder, &bytes, deadline)
                .await
                .map_err(|e| InvokeError::Routed(format!("fleet: {e}")))?;
            let reply: Reply = serde_json::from_slice(&reply)
                .map_err(|_| InvokeError::Routed("fleet: a reply not understood".to_owned()))?;
            match reply {
                Reply {
                    ok: true, result, ..
                } => Ok(result),
                Reply {
                    error,
                    device: true,
                    ..
                } => Err(InvokeError::Device(error.unwrap_or_default())),
                Reply { error, .. } => Err(InvokeError::Routed(error.unwrap_or_default())),
            }
        })
    }
}
