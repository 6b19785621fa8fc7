//! A vessel as a member of a fleet: the vessels sharing one PostgreSQL
//! store and one fleet key, talking over NATS through dk-fleet.
//!
//! What each member does for the others:
//!
//! - **Presence.** It announces the devices connected to it as they
//!   change; a call for a device connected elsewhere goes to that member
//!   (`routing.rs`).
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
//! - **Prompts.** A prompt raised on one member is shown on every member;
//!   an answer given anywhere goes to the member that raised it, which
//!   takes it only if it is for the prompt that member raised in this run
//!   and is what the person was shown (`prompts.rs`).
//! - **Allowances.** A yes the person remembers on one member is kept as a
//!   copy by the others (it covers the same agent's calls decided there);
//!   revoking it on any member ends it everywhere.
//!
//! Every message is sealed under the fleet key by dk-fleet and typed here
//! (`wire.rs`): a NATS client without the key can neither inject a call or
//! an answer nor read one, and nothing said to a member's earlier run
//! reaches its later one.
//!
//! [`DeviceRegistry::refresh`]: dk_core::registry::DeviceRegistry::refresh

mod prompts;
mod routing;
mod wire;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dk_core::Vessel;
use dk_core::person::{ApprovalAnswer, PersonEvent};
use dk_core::registry::ConsentDecision;
use dk_fleet::{Fleet, Request};
use dk_proto::admin::{self as api};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;

use dk_core::allowances::{AllowanceChange, AllowanceMinutes, Remember};
use prompts::News;
use wire::{Ask, Reply, Said};

/// How often a member reads every pairing again from the shared store,
/// besides reading each one another member names as changed.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// How long a burst of connections and disconnections is gathered before
/// the devices held here are announced again (one delta for many).
const ANNOUNCE_GATHER: Duration = Duration::from_millis(20);

/// A member's running part in the fleet: stopped with the vessel.
#[derive(Debug)]
pub(crate) struct Membership {
    fleet: Arc<Fleet>,
    tasks: JoinSet<()>,
}

impl Membership {
    /// Joins `vessel` to `fleet`: its calls reach devices held by other
    /// members, its state follows theirs, its prompts are shown on theirs.
    /// The tasks end when `stopped` turns true, or at [`Membership::leave`].
    pub(crate) async fn start(
        vessel: &Arc<Vessel>,
        fleet: Fleet,
        stopped: watch::Receiver<bool>,
    ) -> Result<Membership, dk_fleet::FleetError> {
        let fleet = Arc::new(fleet);
        let requests = fleet.serve().await?;
        let events = fleet.events().await?;
        let changes = fleet.presence_changes();
        let (say, said) = mpsc::unbounded_channel();
        let (news, heard) = mpsc::unbounded_channel();
        vessel.links().set_remote(Arc::new(routing::FleetLinks {
            fleet: Arc::clone(&fleet),
        }));
        {
            let fleet = Arc::clone(&fleet);
            vessel.set_fleet_status(Arc::new(move || status(&fleet)));
        }
        tell_changes(vessel, &fleet, &say);
        let person = vessel.person().subscribe();
        let mut tasks = JoinSet::new();
        let until = |work| until(stopped.clone(), work);
        tasks.spawn(until(Box::pin(announce(
            Arc::clone(vessel),
            Arc::clone(&fleet),
        ))));
        tasks.spawn(until(Box::pin(serve(Arc::clone(vessel), requests))));
        tasks.spawn(until(Box::pin(listen(
            Arc::clone(vessel),
            fleet.member().as_str().to_owned(),
            events,
            news,
        ))));
        tasks.spawn(until(Box::pin(prompts::follow(
            Arc::clone(vessel),
            Arc::clone(&fleet),
            heard,
            changes,
        ))));
        tasks.spawn(until(Box::pin(tell(Arc::clone(&fleet), said))));
        tasks.spawn(until(Box::pin(show_prompts(person, say))));
        tasks.spawn(until(Box::pin(reconcile(
            Arc::clone(vessel),
            Arc::clone(&fleet),
        ))));
        Ok(Membership { fleet, tasks })
    }

    /// The member's place in the fleet.
    pub(crate) fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// Stops the tasks (and every task they started), then says goodbye,
    /// so the others forget this member's devices and prompts at once.
    pub(crate) async fn leave(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        if let Err(error) = self.fleet.leave().await {
            tracing::warn!(%error, "this member's goodbye was not said");
        }
    }
}

/// A task's work, boxed so that the member's tasks are one type.
type Work = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `work` until `stopped` turns true.
async fn until(mut stopped: watch::Receiver<bool>, work: Work) {
    tokio::select! {
        _ = stopped.wait_for(|s| *s) => {}
        () = work => {}
    }
}

/// The member's state as `GET /v1/status` and `/metrics` show it.
fn status(fleet: &Fleet) -> api::FleetStatus {
    let state = fleet.state();
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    api::FleetStatus {
        member: state.member.to_string(),
        incarnation: state.incarnation.to_string(),
        connected: state.connected,
        devices: count(state.devices),
        members: state
            .members
            .into_iter()
            .map(|seen| api::FleetMember {
                member: seen.member.to_string(),
                incarnation: seen.incarnation.to_string(),
                devices: count(seen.devices),
                heard_ago_ms: u64::try_from(seen.heard_ago.as_millis()).unwrap_or(u64::MAX),
            })
            .collect(),
        departed: state
            .departed
            .into_iter()
            .map(|gone| api::FleetDeparted {
                member: gone.member.to_string(),
                incarnation: gone.incarnation.to_string(),
                goodbye: gone.goodbye,
                ago_ms: u64::try_from(gone.ago.as_millis()).unwrap_or(u64::MAX),
            })
            .collect(),
        dropped: api::FleetDropped {
            forged: state.dropped.forged,
            replayed: state.dropped.replayed,
            stale: state.dropped.stale,
            too_large: state.dropped.too_large,
            other_version: state.dropped.other_version,
        },
        max_message: count(state.max_message),
    }
}

/// Has the registry, the agents and the allowances say what changed here.
fn tell_changes(vessel: &Arc<Vessel>, fleet: &Arc<Fleet>, say: &mpsc::UnboundedSender<Said>) {
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
                } => Said::Allowance {
                    allowance,
                    generation,
                    read_only,
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

/// Announces the devices connected here whenever that set changes,
/// gathering a burst of changes into one.
async fn announce(vessel: Arc<Vessel>, fleet: Arc<Fleet>) {
    let mut changes = vessel.links().watch_changes();
    loop {
        changes.borrow_and_update();
        if let Err(error) = fleet.announce(vessel.links().ids()) {
            tracing::warn!(%error, "the devices held here are not announced to the fleet");
        }
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(ANNOUNCE_GATHER).await;
    }
}

/// Answers the requests other members send here, each in a task of its
/// own that ends with this one.
async fn serve(vessel: Arc<Vessel>, mut requests: dk_fleet::Requests) {
    let mut answering = JoinSet::new();
    loop {
        tokio::select! {
            request = requests.next() => {
                let Some(request) = request else { return };
                let vessel = Arc::clone(&vessel);
                answering.spawn(async move { respond(&vessel, request).await });
            }
            Some(_) = answering.join_next() => {}
        }
    }
}

/// Answers `request`; a reply too large for the fleet is answered with a
/// short one saying so, at once.
async fn respond(vessel: &Vessel, request: Request) {
    let reply = answer(vessel, &request).await;
    let bytes = wire::encode(&reply);
    let sent = match request.respond(&bytes).await {
        Err(dk_fleet::FleetError::TooLarge) => {
            request
                .respond(&wire::encode(&routing::too_large(bytes.len())))
                .await
        }
        sent => sent,
    };
    if let Err(error) = sent {
        tracing::warn!(from = %request.from(), %error, "a fleet reply was not sent");
    }
}

/// What this member replies to `request`.
async fn answer(vessel: &Vessel, request: &Request) -> Reply {
    let ask: Ask = match wire::decode(request.payload()) {
        Ok(ask) => ask,
        Err(not) => {
            tracing::warn!(from = %request.from(), %not, "a fleet request not understood");
            return Reply::NotUnderstood {
                kind: not.kind,
                version: not.version,
            };
        }
    };
    match ask {
        Ask::Invoke {
            device,
            capability,
            input,
            timeout_ms,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            routing::carry(
                vessel,
                request.deadline(),
                &device,
                &capability,
                &input,
                timeout,
            )
            .await
        }
        Ask::Consent {
            id,
            digest,
            answer,
            by,
        } => {
            if let Err(why) = shown_as(vessel, id, &digest) {
                return Reply::NotTaken { why };
            }
            let decision = ConsentDecision {
                approved: answer.approved,
                grant: answer.grant,
                confirmed_without_code: answer.confirm_without_code,
                by,
                confirmed_credential_change: answer.confirm_credential_change,
            };
            match vessel.person().answer_consent(id, decision) {
                Ok(()) => Reply::Taken { allowance: None },
                Err(error) => Reply::NotTaken {
                    why: error.to_string(),
                },
            }
        }
        Ask::Approval {
            id,
            digest,
            approved,
            remember,
            by,
        } => {
            if let Err(why) = shown_as(vessel, id, &digest) {
                return Reply::NotTaken { why };
            }
            let answer = match (approved, remember) {
                (false, _) => ApprovalAnswer::Refuse,
                (true, None) => ApprovalAnswer::Once,
                (true, Some(remembered)) => {
                    match AllowanceMinutes::new(u64::from(remembered.minutes)) {
                        Ok(minutes) => ApprovalAnswer::Remember(Remember {
                            scope: remembered.scope,
                            minutes,
                        }),
                        Err(error) => {
                            return Reply::NotTaken {
                                why: error.to_string(),
                            };
                        }
                    }
                }
            };
            match vessel.person().answer_approval_by(id, answer, by) {
                Ok(allowance) => Reply::Taken { allowance },
                Err(error) => Reply::NotTaken {
                    why: error.to_string(),
                },
            }
        }
        Ask::Prompts => Reply::Prompts {
            prompts: vessel
                .person()
                .pending()
                .into_iter()
                .filter(|p| !p.mirrored)
                .map(api::Pending::from)
                .collect(),
        },
    }
}

/// Whether prompt `id`, raised here, is open and is what the person who
/// answered it elsewhere was shown (`digest`).
fn shown_as(vessel: &Vessel, id: u64, digest: &str) -> Result<(), String> {
    let pending = vessel.person().pending();
    let prompt = pending
        .into_iter()
        .find(|p| p.id == id && !p.mirrored)
        .ok_or_else(|| format!("no open prompt {id}"))?;
    if wire::digest(&api::Prompt::from(prompt.prompt)) == digest {
        Ok(())
    } else {
        Err(format!(
            "prompt {id} is not the one the person was shown: nothing was done"
        ))
    }
}

/// Acts on what the other members say; their prompts' news goes to the
/// task that keeps the mirrors.
async fn listen(
    vessel: Arc<Vessel>,
    here: String,
    mut events: dk_fleet::Events,
    news: mpsc::UnboundedSender<News>,
) {
    while let Some(event) = events.next().await {
        let said: Said = match wire::decode(&event.payload) {
            Ok(said) => said,
            Err(not) => {
                tracing::warn!(from = %event.from, %not, "a fleet event not understood");
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
            } => {
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
            Said::Revoked { member, id } => {
                vessel.registry().allowances().forget(&here, &member, id);
            }
            Said::Asked { prompt } => {
                let _ = news.send(News::Asked {
                    from: event.from,
                    incarnation: event.incarnation,
                    prompt: Box::new(prompt),
                });
            }
            Said::Closed { id } => {
                let _ = news.send(News::Closed {
                    from: event.from,
                    incarnation: event.incarnation,
                    id,
                });
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

/// Publishes what this member has to say, in order.
async fn tell(fleet: Arc<Fleet>, mut said: mpsc::UnboundedReceiver<Said>) {
    while let Some(said) = said.recv().await {
        if let Err(error) = fleet.publish(&wire::encode(&said)).await {
            // Caught up by the others' reading everything again, and
            // asking for the prompts when they hear this member again.
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
                raised_here.insert(view.id);
                let _ = say.send(Said::Asked {
                    prompt: view.into(),
                });
            }
            Ok(PersonEvent::Closed { id }) => {
                if raised_here.remove(&id) {
                    let _ = say.send(Said::Closed { id });
                }
            }
            // Missed: the others ask for the list when they need it.
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Reads every pairing again every [`RECONCILE_EVERY`], and as soon as
/// the NATS connection comes back: whatever word was missed meanwhile is
/// caught up.
async fn reconcile(vessel: Arc<Vessel>, fleet: Arc<Fleet>) {
    let mut connection = fleet.connection();
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + RECONCILE_EVERY,
        RECONCILE_EVERY,
    );
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_up = *connection.borrow_and_update();
    loop {
        tokio::select! {
            _ = every.tick() => {}
            changed = connection.changed() => {
                if changed.is_err() {
                    return;
                }
                let up = *connection.borrow_and_update();
                let back = up && !was_up;
                was_up = up;
                if !back {
                    continue;
                }
                every.reset();
            }
        }
        let started = Instant::now();
        let registry = Arc::clone(vessel.registry());
        if let Ok(Err(error)) = tokio::task::spawn_blocking(move || registry.refresh_all()).await {
            tracing::warn!(%error, "the shared pairings were not read again");
        }
        reload_agents(&vessel).await;
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(took_ms, "the shared state was read again");
    }
}
