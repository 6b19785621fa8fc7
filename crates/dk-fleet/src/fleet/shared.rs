//! What every task of a member shares ([`Shared`]): the connection, the
//! seal, the view of presence and the counters of messages dropped, and
//! how a member seals, opens, asks and answers with them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::{broadcast, mpsc, watch};

use crate::error::{FleetError, RequestError};
use crate::member::{Incarnation, MemberId};
use crate::presence::{Held, PresenceChange, Said, View};
use crate::reply::{Assembly, Chunk, Status, chunks};
use crate::seal::{Opened, Replays, SealError, Sealer, Sender, now_ms};

/// The subject presence is announced on.
pub const PRESENCE_SUBJECT: &str = "dk.fleet.presence";
/// The prefix of each member's subject for its whole set of devices
/// (`dk.fleet.presence.<member>`).
pub const PRESENCE_PREFIX: &str = "dk.fleet.presence.";
/// The subject events are broadcast on.
pub const EVENT_SUBJECT: &str = "dk.fleet.event";
/// The prefix of each member's request subject (`dk.fleet.request.<member>`).
pub const REQUEST_PREFIX: &str = "dk.fleet.request.";

/// How long a round trip to the server may take before the connection is
/// taken for down.
const SETTLE: Duration = Duration::from_secs(5);

/// How far apart the members' clocks may be: a request whose sender's
/// deadline passed by more than this on the receiver's clock is not
/// served (it waited somewhere, a paused process or a full buffer, and its
/// sender gave up on it).
pub const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// How many messages were dropped, by reason, since the member joined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Not sealed with the fleet key for their subject and sender (or not
    /// fleet messages at all).
    pub forged: u64,
    /// Seen before within the replay window.
    pub replayed: u64,
    /// Outside the replay window, from an incarnation that is gone, or
    /// meant for an earlier incarnation of this member.
    pub stale: u64,
    /// Over the size limit, refused unread.
    pub too_large: u64,
    /// Sealed in a layout of another version of dk (a member of another
    /// version during an upgrade).
    pub other_version: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    forged: AtomicU64,
    replayed: AtomicU64,
    stale: AtomicU64,
    too_large: AtomicU64,
    other_version: AtomicU64,
}

impl Counters {
    fn count(&self, why: SealError) {
        let counter = match why {
            SealError::TooLarge => &self.too_large,
            SealError::Forged => &self.forged,
            SealError::Stale => &self.stale,
            SealError::Replayed => &self.replayed,
            SealError::OtherVersion => &self.other_version,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The messages dropped so far, by reason.
    pub(super) fn dropped(&self) -> Dropped {
        Dropped {
            forged: self.forged.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            too_large: self.too_large.load(Ordering::Relaxed),
            other_version: self.other_version.load(Ordering::Relaxed),
        }
    }
}

/// What every task of a member shares.
pub(super) struct Shared {
    pub(super) client: async_nats::Client,
    pub(super) member: MemberId,
    pub(super) incarnation: Incarnation,
    pub(super) sealer: Sealer,
    /// How old a message may be; each listener keeps the ids it saw
    /// within it (a message reaches every subscription, and each takes it
    /// once).
    pub(super) window: Duration,
    /// The largest sealed message: the servers' `max_payload`.
    pub(super) limit: AtomicUsize,
    pub(super) counters: Counters,
    pub(super) held: Mutex<Held>,
    /// Deltas and goodbyes to say, in order, by the beating task.
    pub(super) say: mpsc::UnboundedSender<Said>,
    pub(super) view: Mutex<View>,
    pub(super) changes: broadcast::Sender<PresenceChange>,
    /// Raised at every change in presence, for requests waiting on a member.
    pub(super) epoch: watch::Sender<u64>,
    pub(super) connected: watch::Receiver<bool>,
    pub(super) left: AtomicBool,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub(super) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// `body` sealed by this member for `subject`, meant for `to`.
    pub(super) fn seal(
        &self,
        subject: &str,
        to: Option<Incarnation>,
        body: &[u8],
    ) -> Result<Vec<u8>, SealError> {
        let sender = Sender {
            member: &self.member,
            incarnation: self.incarnation,
            to,
        };
        self.sealer
            .seal(subject, sender, now_ms(), body, self.limit())
    }

    /// The message received on `subject`, verified, fresh and seen once;
    /// anything else is counted and dropped.
    pub(super) fn open(
        &self,
        subject: &str,
        bytes: &[u8],
        replays: &mut Replays,
    ) -> Option<Opened> {
        let opened = self.sealer.open(subject, bytes).and_then(|opened| {
            replays.accept(opened.id, opened.sent_ms, now_ms())?;
            if lock(&self.view).is_stale(&opened.from, opened.from_incarnation) {
                return Err(SealError::Stale);
            }
            Ok(opened)
        });
        match opened {
            Ok(opened) => Some(opened),
            Err(why) => {
                self.drop_message(subject, why);
                None
            }
        }
    }

    pub(super) fn drop_message(&self, subject: &str, why: SealError) {
        self.counters.count(why);
        // Counted, and told by `dk status` and `/metrics`: a log line per
        // message would let anyone on the servers fill the log.
        tracing::debug!(subject, %why, "fleet message dropped");
    }

    pub(super) fn connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// Returns once the server has taken every subscription made before:
    /// it answers a connection's messages in order, so a message to a
    /// fresh inbox of ours coming back proves it.
    pub(super) async fn settle(&self) -> Result<(), FleetError> {
        let inbox = self.client.new_inbox();
        let mut back = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|_| FleetError::NatsDown)?;
        self.client
            .publish(inbox, bytes::Bytes::new())
            .await
            .map_err(|_| FleetError::NatsDown)?;
        match tokio::time::timeout(SETTLE, back.next()).await {
            Ok(Some(_)) => Ok(()),
            _ => Err(FleetError::NatsDown),
        }
    }

    /// Says `said` on the presence subject.
    pub(super) async fn say(&self, said: &Said) -> Result<(), FleetError> {
        let body = serde_json::to_vec(said).map_err(|_| FleetError::TooLarge)?;
        let sealed = self
            .seal(PRESENCE_SUBJECT, None, &body)
            .map_err(|_| FleetError::TooLarge)?;
        self.client
            .publish(PRESENCE_SUBJECT, sealed.into())
            .await
            .map_err(|_| FleetError::NatsDown)
    }

    /// Tells whoever follows presence about `change`.
    pub(super) fn changed(&self, change: PresenceChange) {
        let _ = self.changes.send(change);
        self.epoch.send_modify(|epoch| *epoch += 1);
    }

    /// Room for ids in one delta: half the limit, well clear of the rest.
    pub(super) fn delta_room(&self) -> usize {
        self.limit() / 2
    }

    /// Sends `request` (a body for `subject`) to `member`'s `incarnation`
    /// and gathers its reply, until `deadline`, the connection going down,
    /// or the member leaving or restarting.
    pub(super) async fn ask(
        &self,
        subject: &str,
        member: &MemberId,
        incarnation: Incarnation,
        body: &[u8],
        deadline: Instant,
    ) -> Result<Vec<u8>, RequestError> {
        let sealed = self
            .seal(subject, Some(incarnation), body)
            .map_err(|_| RequestError::TooLarge)?;
        // Followed from before the request leaves, so a member leaving
        // meanwhile is noticed.
        let mut epoch = self.epoch.subscribe();
        let inbox = self.client.new_inbox();
        let mut replies = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|_| RequestError::NatsDown)?;
        self.client
            .publish_with_reply(subject.to_owned(), inbox.clone(), sealed.into())
            .await
            .map_err(|_| RequestError::NatsDown)?;
        let mut connected = self.connected.clone();
        let mut replays = Replays::new(self.window);
        let mut assembly = Assembly::default();
        let mut refused = None;
        let deadline = tokio::time::Instant::from_std(deadline);
        loop {
            tokio::select! {
                message = replies.next() => {
                    let Some(message) = message else {
                        return Err(RequestError::NatsDown);
                    };
                    if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                        return Err(refused.unwrap_or_else(|| RequestError::NoSuchMember(member.clone())));
                    }
                    let Some(opened) = self.open(&inbox, &message.payload, &mut replays) else {
                        refused = Some(RequestError::Refused);
                        continue;
                    };
                    if opened.from != *member
                        || opened.from_incarnation != incarnation
                        || opened.to_incarnation != Some(self.incarnation)
                    {
                        // A reply another member sealed: wait on for the
                        // one asked, remembering why.
                        refused = Some(RequestError::Refused);
                        continue;
                    }
                    let Ok(chunk) = Chunk::read(&opened.body) else {
                        refused = Some(RequestError::Refused);
                        continue;
                    };
                    match chunk.status {
                        Status::Stale => return Err(RequestError::MemberGone(member.clone())),
                        Status::Data => match assembly.take(chunk) {
                            Ok(Some(reply)) => return Ok(reply),
                            Ok(None) => {}
                            Err(()) => return Err(RequestError::Refused),
                        },
                    }
                }
                changed = connected.changed() => {
                    if changed.is_err() || !*connected.borrow_and_update() {
                        return Err(RequestError::NatsDown);
                    }
                }
                changed = epoch.changed() => {
                    let _ = changed;
                    epoch.borrow_and_update();
                    // Gone once it runs as another incarnation, or said
                    // goodbye as this one: neither serves this request. A
                    // member gone silent may only be paused, and take the
                    // request when it wakes (within its time to live): the
                    // wait goes on to the deadline, so that nobody is told
                    // "failed" about something that still happens.
                    let gone = {
                        let view = lock(&self.view);
                        match view.incarnation_of(member) {
                            Some(present) => present != incarnation,
                            None => view.said_goodbye(member, incarnation),
                        }
                    };
                    if gone {
                        return Err(RequestError::MemberGone(member.clone()));
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(RequestError::DeadlinePassed);
                }
            }
        }
    }

    /// Answers `reply_to` (a request from `to`) with `reply`, in as many
    /// chunks as the limit needs.
    pub(super) async fn answer(
        &self,
        reply_to: &str,
        to: Incarnation,
        status: Status,
        reply: &[u8],
    ) -> Result<(), FleetError> {
        let room = self
            .limit()
            .saturating_sub(crate::seal::overhead(&self.member) + Chunk::HEAD);
        let pieces = chunks(reply, room, status).ok_or(FleetError::TooLarge)?;
        for piece in pieces {
            let sealed = self
                .seal(reply_to, Some(to), &piece)
                .map_err(|_| FleetError::TooLarge)?;
            self.client
                .publish(reply_to.to_owned(), sealed.into())
                .await
                .map_err(|_| FleetError::NatsDown)?;
        }
        Ok(())
    }

    /// A request opened on `subject`, meant for this incarnation and not
    /// past its sender's deadline; one meant for an earlier incarnation is
    /// counted and refused at once, so its sender does not wait.
    pub(super) async fn take_request(
        &self,
        subject: &str,
        message: async_nats::Message,
        replays: &mut Replays,
    ) -> Option<Taken> {
        let opened = self.open(subject, &message.payload, replays)?;
        let reply = message.reply?.to_string();
        if opened.to_incarnation != Some(self.incarnation) {
            self.drop_message(subject, SealError::Stale);
            let _ = self
                .answer(&reply, opened.from_incarnation, Status::Stale, &[])
                .await;
            return None;
        }
        let (head, _) = opened.body.split_at_checked(8)?;
        let ttl_ms = u64::from_be_bytes(head.try_into().ok()?);
        // The sender's deadline on this clock, with the clocks' tolerance:
        // a request that waited past it (this process paused, say) is not
        // served, as its sender has stopped waiting for it.
        let by_clock = opened
            .sent_ms
            .saturating_add(ttl_ms)
            .saturating_add(duration_ms(CLOCK_TOLERANCE))
            .saturating_sub(now_ms());
        let left = ttl_ms.min(by_clock);
        if left == 0 {
            self.drop_message(subject, SealError::Stale);
            return None;
        }
        let mut payload = opened.body;
        payload.drain(..8);
        Some(Taken {
            from: opened.from,
            from_incarnation: opened.from_incarnation,
            payload,
            deadline: Instant::now() + Duration::from_millis(left),
            reply,
        })
    }
}

/// `duration` in whole milliseconds.
pub(super) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A request as taken off the wire.
pub(super) struct Taken {
    pub(super) from: MemberId,
    pub(super) from_incarnation: Incarnation,
    pub(super) payload: Vec<u8>,
    pub(super) deadline: Instant,
    pub(super) reply: String,
}
