//! Prompts across the fleet. A prompt raised on one member is shown on
//! every other (a mirror, under an id of that member's own queue); the
//! person's answer to a mirror goes to the member that raised it, named by
//! its identity (member, incarnation, id) with the digest of what the
//! person was shown, and is reported taken only when that member says it
//! took it. A mirror leaves when the member that raised it closes the
//! prompt, leaves, or restarts (a restarted member's prompts are new ones,
//! never answered by a yes given to its earlier run); a member that joins,
//! or is heard again, is asked for its open prompts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use dk_core::Vessel;
use dk_core::person::{ApprovalAnswer, MirroredAnswer, NotTaken, Prompt};
use dk_fleet::{Fleet, Incarnation, MemberId, PresenceChange, RequestError};
use dk_proto::admin as api;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use super::wire::{self, Ask, Remembered, Reply};

/// How long the member that raised a prompt has to take an answer given
/// here (the fleet then waits as long again twice over for its word, for
/// the members' clocks): past it, the answer is not taken there, and the
/// person is told so here.
const ANSWER_TTL: Duration = Duration::from_secs(5);

/// How long a member has to list its open prompts.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// What the others said about their prompts, from the fleet's events.
#[derive(Debug)]
pub(super) enum News {
    /// `from`, as `incarnation`, raised `prompt`.
    Asked {
        from: MemberId,
        incarnation: Incarnation,
        prompt: Box<api::Pending>,
    },
    /// `from`, as `incarnation`, closed its prompt `id`.
    Closed {
        from: MemberId,
        incarnation: Incarnation,
        id: u64,
    },
}

/// A prompt's identity across the fleet: never the same for two prompts,
/// whatever restarted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Origin {
    member: MemberId,
    incarnation: Incarnation,
    id: u64,
}

/// A mirror shown here: its id in this queue and when its prompt expires.
struct Shown {
    local: u64,
    expires_at_ms: u64,
}

/// The mirrors this member shows, kept by the one task that changes them.
struct Mirrors {
    vessel: Arc<Vessel>,
    fleet: Arc<Fleet>,
    shown: HashMap<Origin, Shown>,
}

impl Mirrors {
    /// Shows `pending`, raised by `origin`'s member, unless it is shown.
    fn show(&mut self, member: &MemberId, incarnation: Incarnation, pending: api::Pending) {
        let origin = Origin {
            member: member.clone(),
            incarnation,
            id: pending.id,
        };
        if self.shown.contains_key(&origin) {
            return;
        }
        let prompt = Prompt::from(pending.prompt);
        // The digest of what the person is shown here: the member that
        // raised it takes the answer only if it is what it asked.
        let digest = wire::digest(&api::Prompt::from(prompt.clone()));
        let send = answer_sink(Arc::clone(&self.fleet), origin.clone(), digest);
        let local =
            self.vessel
                .person()
                .mirror(prompt, pending.expires_at_ms, pending.can_remember, send);
        self.shown.insert(
            origin,
            Shown {
                local,
                expires_at_ms: pending.expires_at_ms,
            },
        );
    }

    /// Takes every mirror `leaves` says leaves out of the queue.
    fn close_where(&mut self, leaves: impl Fn(&Origin) -> bool) {
        let person = self.vessel.person();
        self.shown.retain(|origin, shown| {
            if leaves(origin) {
                person.close_mirror(shown.local);
                false
            } else {
                true
            }
        });
    }

    /// Makes the mirrors of `member`'s `incarnation` the prompts it listed.
    fn take_list(&mut self, member: &MemberId, incarnation: Incarnation, list: Vec<api::Pending>) {
        let open: std::collections::HashSet<u64> = list.iter().map(|p| p.id).collect();
        self.close_where(|o| {
            o.member == *member && o.incarnation == incarnation && !open.contains(&o.id)
        });
        for pending in list {
            self.show(member, incarnation, pending);
        }
    }

    /// When the next mirror's prompt is past its time on the member that
    /// raised it (a second later, for the clocks).
    fn next_expiry(&self) -> Option<u64> {
        self.shown.values().map(|s| s.expires_at_ms).min()
    }
}

/// Follows the prompts the other members raise and close, and who is
/// present, keeping the mirrors shown here to match.
pub(super) async fn follow(
    vessel: Arc<Vessel>,
    fleet: Arc<Fleet>,
    mut news: mpsc::UnboundedReceiver<News>,
    mut changes: broadcast::Receiver<PresenceChange>,
) {
    let mut mirrors = Mirrors {
        vessel,
        fleet: Arc::clone(&fleet),
        shown: HashMap::new(),
    };
    let mut listing: JoinSet<(MemberId, Incarnation, Option<Vec<api::Pending>>)> = JoinSet::new();
    for seen in fleet.seen() {
        listing.spawn(list(Arc::clone(&fleet), seen.member, seen.incarnation));
    }
    loop {
        let now_ms = dk_store::epoch_ms(SystemTime::now());
        let expiry = mirrors
            .next_expiry()
            .map(|at| Duration::from_millis(at.saturating_add(1000).saturating_sub(now_ms)));
        let expired = async {
            match expiry {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            said = news.recv() => match said {
                Some(News::Asked { from, incarnation, prompt }) => {
                    mirrors.show(&from, incarnation, *prompt);
                }
                Some(News::Closed { from, incarnation, id }) => {
                    mirrors.close_where(|o| {
                        o.member == from && o.incarnation == incarnation && o.id == id
                    });
                }
                None => return,
            },
            change = changes.recv() => match change {
                Ok(PresenceChange::Joined { member, incarnation }) => {
                    listing.spawn(list(Arc::clone(&fleet), member, incarnation));
                }
                Ok(PresenceChange::Restarted { member, incarnation, .. }) => {
                    mirrors.close_where(|o| o.member == member && o.incarnation != incarnation);
                    listing.spawn(list(Arc::clone(&fleet), member, incarnation));
                }
                Ok(PresenceChange::Left { member, .. }) => {
                    mirrors.close_where(|o| o.member == member);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Changes were missed: match the mirrors to who is
                    // present now, and ask each for its prompts.
                    let present = fleet.seen();
                    mirrors.close_where(|o| {
                        !present.iter().any(|s| s.member == o.member && s.incarnation == o.incarnation)
                    });
                    for seen in present {
                        listing.spawn(list(Arc::clone(&fleet), seen.member, seen.incarnation));
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            Some(listed) = listing.join_next() => {
                if let Ok((member, incarnation, Some(list))) = listed
                    && fleet.incarnation_of(&member) == Some(incarnation)
                {
                    mirrors.take_list(&member, incarnation, list);
                }
            }
            () = expired => {
                // Past its time the member that raised it took it as a no.
                let now_ms = dk_store::epoch_ms(SystemTime::now());
                let past: Vec<Origin> = mirrors
                    .shown
                    .iter()
                    .filter(|(_, s)| s.expires_at_ms.saturating_add(1000) <= now_ms)
                    .map(|(o, _)| o.clone())
                    .collect();
                mirrors.close_where(|o| past.contains(o));
            }
        }
    }
}

/// The open prompts `member`'s `incarnation` lists, or `None` when it did
/// not answer.
async fn list(
    fleet: Arc<Fleet>,
    member: MemberId,
    incarnation: Incarnation,
) -> (MemberId, Incarnation, Option<Vec<api::Pending>>) {
    let deadline = Instant::now() + LIST_TIMEOUT;
    let listed = match fleet
        .request_to(&member, incarnation, &wire::encode(&Ask::Prompts), deadline)
        .await
    {
        Ok(bytes) => match wire::decode::<Reply>(&bytes) {
            Ok(Reply::Prompts { prompts }) => Some(prompts),
            _ => {
                tracing::warn!(%member, "a member's prompts not understood");
                None
            }
        },
        Err(error) => {
            tracing::debug!(%member, %error, "a member's prompts not read");
            None
        }
    };
    (member, incarnation, listed)
}

/// Where the answer to the mirror of `origin` goes: to the member that
/// raised it, as its identity and the digest of what the person saw.
fn answer_sink(fleet: Arc<Fleet>, origin: Origin, digest: String) -> dk_core::person::AnswerSink {
    Arc::new(move |answer: MirroredAnswer| {
        let fleet = Arc::clone(&fleet);
        let origin = origin.clone();
        let digest = digest.clone();
        Box::pin(async move {
            let ask = match answer {
                MirroredAnswer::Consent(decision) => Ask::Consent {
                    id: origin.id,
                    digest,
                    answer: api::ConsentAnswer {
                        approved: decision.approved,
                        grant: decision.grant,
                        confirm_without_code: decision.confirmed_without_code,
                        confirm_credential_change: decision.confirmed_credential_change,
                    },
                    by: decision.by,
                },
                MirroredAnswer::Approval { answer, by } => Ask::Approval {
                    id: origin.id,
                    digest,
                    approved: !matches!(answer, ApprovalAnswer::Refuse),
                    remember: match answer {
                        ApprovalAnswer::Remember(r) => Some(Remembered {
                            scope: r.scope,
                            minutes: r.minutes.get(),
                        }),
                        ApprovalAnswer::Once | ApprovalAnswer::Refuse => None,
                    },
                    by,
                },
            };
            let deadline = Instant::now() + ANSWER_TTL;
            let reply = fleet
                .request_to(
                    &origin.member,
                    origin.incarnation,
                    &wire::encode(&ask),
                    deadline,
                )
                .await;
            match reply {
                Ok(bytes) => match wire::decode::<Reply>(&bytes) {
                    Ok(Reply::Taken { allowance }) => Ok(allowance),
                    Ok(Reply::NotTaken { why }) => Err(NotTaken::Refused(why)),
                    Ok(Reply::NotUnderstood { kind, version }) => Err(NotTaken::Refused(format!(
                        "it did not understand the answer (`{kind}`, version {version})"
                    ))),
                    Ok(_) => Err(NotTaken::Refused("a reply of another kind".to_owned())),
                    Err(why) => Err(NotTaken::Refused(why.to_string())),
                },
                Err(RequestError::DeadlinePassed) => Err(NotTaken::Unconfirmed),
                Err(error) => Err(NotTaken::Unreachable(error.to_string())),
            }
        })
    })
}
