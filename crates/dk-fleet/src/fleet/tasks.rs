//! A member's tasks: listening to presence (and asking a member for its
//! whole set when its word does not follow), answering those who ask for
//! this member's, and beating.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::shared::{PRESENCE_PREFIX, PRESENCE_SUBJECT, Shared, duration_ms, lock};
use crate::member::{Incarnation, MemberId};
use crate::presence::{PresenceChange, Said, Whole};
use crate::reply::Status;
use crate::seal::{Replays, SealError};

/// How long a member waits for another's whole set before asking again.
const WHOLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps the view of who holds what from what members say, asks a member
/// for its whole set when its word does not follow, and forgets a member
/// not heard within the expiry.
pub(super) async fn listen_presence(shared: Arc<Shared>, mut subscriber: async_nats::Subscriber) {
    let mut replays = Replays::new(shared.window);
    let mut asking: JoinSet<MemberId> = JoinSet::new();
    let mut asked: HashSet<MemberId> = HashSet::new();
    loop {
        let expiry = lock(&shared.view).next_expiry();
        let expired = async {
            match expiry {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            message = subscriber.next() => {
                let Some(message) = message else { return };
                let Some(opened) = shared.open(PRESENCE_SUBJECT, &message.payload, &mut replays) else {
                    continue;
                };
                if opened.from == shared.member {
                    continue;
                }
                let Ok(said) = serde_json::from_slice::<Said>(&opened.body) else {
                    tracing::warn!(from = %opened.from, "a presence message not understood");
                    continue;
                };
                let heard = lock(&shared.view).hear(&opened.from, opened.from_incarnation, said, Instant::now());
                if heard.stale {
                    shared.drop_message(PRESENCE_SUBJECT, SealError::Stale);
                }
                if let Some(change) = heard.change {
                    if matches!(change, PresenceChange::Joined { .. } | PresenceChange::Restarted { .. }) {
                        // Beat at once, so a member that just started
                        // hears this one without waiting for its next beat.
                        let _ = shared.say.send(lock(&shared.held).beat());
                    }
                    shared.changed(change);
                }
                if heard.ask_whole && asked.insert(opened.from.clone()) {
                    asking.spawn(ask_whole(Arc::clone(&shared), opened.from, opened.from_incarnation));
                }
            }
            Some(done) = asking.join_next() => {
                if let Ok(member) = done {
                    asked.remove(&member);
                    // Behind still (the answer did not come, or more
                    // changed meanwhile): the next beat asks again.
                }
            }
            () = expired => {
                for change in lock(&shared.view).expire(Instant::now()) {
                    shared.changed(change);
                }
            }
        }
    }
}

/// Asks `member` for its whole set and takes it: returns the member.
async fn ask_whole(shared: Arc<Shared>, member: MemberId, incarnation: Incarnation) -> MemberId {
    let subject = format!("{PRESENCE_PREFIX}{member}");
    let deadline = Instant::now() + WHOLE_TIMEOUT;
    let mut body = Vec::with_capacity(8);
    body.extend_from_slice(&duration_ms(WHOLE_TIMEOUT).to_be_bytes());
    match shared
        .ask(&subject, &member, incarnation, &body, deadline)
        .await
    {
        Ok(bytes) => match serde_json::from_slice::<Whole>(&bytes) {
            Ok(whole) => lock(&shared.view).take_whole(&member, incarnation, whole),
            Err(_) => tracing::warn!(%member, "a member's devices not understood"),
        },
        Err(error) => tracing::debug!(%member, %error, "a member's devices not read"),
    }
    member
}

/// Answers other members asking for this member's whole set.
pub(super) async fn serve_whole(shared: Arc<Shared>, mut subscriber: async_nats::Subscriber) {
    let subject = format!("{PRESENCE_PREFIX}{}", shared.member);
    let mut replays = Replays::new(shared.window);
    while let Some(message) = subscriber.next().await {
        let Some(request) = shared.take_request(&subject, message, &mut replays).await else {
            continue;
        };
        let whole = lock(&shared.held).whole();
        let Ok(bytes) = serde_json::to_vec(&whole) else {
            continue;
        };
        if let Err(error) = shared
            .answer(
                &request.reply,
                request.from_incarnation,
                Status::Data,
                &bytes,
            )
            .await
        {
            tracing::warn!(%error, "this member's devices were not sent to another");
        }
    }
}

/// Beats every `heartbeat`, and says every change as it comes, in order.
pub(super) async fn beat_forever(
    shared: Arc<Shared>,
    mut said: mpsc::UnboundedReceiver<Said>,
    heartbeat: Duration,
) {
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let what = tokio::select! {
            _ = tick.tick() => lock(&shared.held).beat(),
            next = said.recv() => match next {
                Some(next) => next,
                None => return,
            },
        };
        if let Err(why) = shared.say(&what).await {
            tracing::warn!(%why, "a presence message was not sent");
        }
    }
}
