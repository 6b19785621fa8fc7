//! `Fleet`: one member's connection to the fleet over NATS: presence,
//! routed requests and broadcast events, every message sealed.
//!
//! Subjects: `dk.fleet.presence` (beats and goodbyes), `dk.fleet.event`
//! (events), `dk.fleet.request.<member>` (requests to that member), and a
//! fresh inbox per request for its reply.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::error::{ConnectError, FleetError, RequestError};
use crate::key::FleetKey;
use crate::member::MemberId;
use crate::options::{Auth, FleetOptions};
use crate::seal::{Opened, Replays, SealError, Sealer, now_ms};

/// The subject presence is announced on.
pub const PRESENCE_SUBJECT: &str = "dk.fleet.presence";
/// The subject events are broadcast on.
pub const EVENT_SUBJECT: &str = "dk.fleet.event";
/// The prefix of each member's request subject (`dk.fleet.request.<member>`).
pub const REQUEST_PREFIX: &str = "dk.fleet.request.";

/// How long a round trip to the server may take before the connection is
/// taken for down.
const SETTLE: Duration = Duration::from_secs(5);

/// Most devices one member announces.
pub const MAX_DEVICES: usize = 4096;

/// How often a request waiting for its reply looks at the connection.
const CONNECTION_CHECK: Duration = Duration::from_millis(50);

/// How many messages were dropped, by reason, since the member joined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Not sealed with the fleet key for their subject and sender (or not
    /// fleet messages at all).
    pub forged: u64,
    /// Seen before, or outside the replay window.
    pub replayed: u64,
    /// Over [`crate::MAX_MESSAGE`], refused unread.
    pub too_large: u64,
}

#[derive(Default)]
struct Counters {
    forged: AtomicU64,
    replayed: AtomicU64,
    too_large: AtomicU64,
}

/// What one member announced, and when it was last heard.
struct Holding {
    devices: BTreeSet<String>,
    seen: Instant,
}

/// A beat (or a goodbye) as sealed on [`PRESENCE_SUBJECT`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Beat {
    devices: Vec<String>,
    #[serde(default)]
    goodbye: bool,
}

/// What every task of a member shares.
struct Shared {
    client: async_nats::Client,
    member: MemberId,
    sealer: Sealer,
    /// How old a message may be; each listener keeps the ids it saw
    /// within it (a message reaches every subscription, and each takes it
    /// once).
    window: Duration,
    counters: Counters,
    held: Mutex<BTreeSet<String>>,
    changed: Notify,
    view: Mutex<HashMap<MemberId, Holding>>,
    expiry: Duration,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// `body` sealed by this member for `subject`.
    fn seal(&self, subject: &str, body: &[u8]) -> Result<Vec<u8>, SealError> {
        self.sealer.seal(subject, &self.member, now_ms(), body)
    }

    /// The message received on `subject`, verified, fresh and seen once;
    /// anything else is counted and dropped.
    fn open(&self, subject: &str, bytes: &[u8], replays: &mut Replays) -> Option<Opened> {
        let opened = self.sealer.open(subject, bytes).and_then(|opened| {
            replays.accept(opened.id, opened.sent_ms, now_ms())?;
            Ok(opened)
        });
        match opened {
            Ok(opened) => Some(opened),
            Err(why) => {
                let counter = match why {
                    SealError::TooLarge => &self.counters.too_large,
                    SealError::Forged => &self.counters.forged,
                    SealError::Stale | SealError::Replayed => &self.counters.replayed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(subject, %why, "fleet message dropped");
                None
            }
        }
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// Returns once the server has taken every subscription made before:
    /// it answers a connection's messages in order, so a message to a
    /// fresh inbox of ours coming back proves it.
    async fn settle(&self) -> Result<(), FleetError> {
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

    async fn beat(&self, goodbye: bool) -> Result<(), FleetError> {
        let devices = if goodbye {
            Vec::new()
        } else {
            lock(&self.held).iter().cloned().collect()
        };
        let body =
            serde_json::to_vec(&Beat { devices, goodbye }).map_err(|_| FleetError::TooLarge)?;
        let sealed = self
            .seal(PRESENCE_SUBJECT, &body)
            .map_err(|_| FleetError::TooLarge)?;
        self.client
            .publish(PRESENCE_SUBJECT, sealed.into())
            .await
            .map_err(|_| FleetError::NatsDown)
    }
}

/// One member's place in the fleet. Its tasks stop when it is dropped
/// (without a goodbye: the others see its presence expire) or closed.
pub struct Fleet {
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("member", &self.shared.member)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Joins the fleet: reads the fleet key (no key file, no fleet) and
    /// the credentials, connects to the NATS servers, and starts listening
    /// to presence and beating.
    pub async fn connect(options: FleetOptions) -> Result<Fleet, ConnectError> {
        let key = FleetKey::read(&options.key_file)?;
        let mut addrs = Vec::with_capacity(options.servers.len());
        for server in &options.servers {
            // Credentials belong in files, never in an address that is shown.
            if server.contains('@') {
                return Err(ConnectError::CredentialsInAddress);
            }
            let addr = server
                .parse::<async_nats::ServerAddr>()
                .map_err(|_| ConnectError::BadAddress(server.clone()))?;
            addrs.push(addr);
        }
        if addrs.is_empty() {
            return Err(ConnectError::NoServers);
        }
        let mut nats = match &options.auth {
            Auth::None => async_nats::ConnectOptions::new(),
            Auth::UserPassword {
                user,
                password_file,
            } => async_nats::ConnectOptions::with_user_and_password(
                user.clone(),
                crate::error::read_secret(password_file)?,
            ),
            Auth::TokenFile(path) => {
                async_nats::ConnectOptions::with_token(crate::error::read_secret(path)?)
            }
        };
        if let Some(ca) = &options.ca_file {
            nats = nats.add_root_certificates(ca.clone()).require_tls(true);
        }
        let client = nats
            .name(format!("dk-fleet {}", options.member))
            .connection_timeout(Duration::from_secs(5))
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(
                    100u64
                        .saturating_mul(u64::try_from(attempts).unwrap_or(u64::MAX))
                        .min(1000),
                )
            })
            .connect(addrs)
            .await
            .map_err(|e| ConnectError::Nats(e.kind().to_string()))?;
        let shared = Arc::new(Shared {
            client,
            member: options.member.clone(),
            sealer: Sealer::new(key.seal_key()),
            window: options.window,
            counters: Counters::default(),
            held: Mutex::new(BTreeSet::new()),
            changed: Notify::new(),
            view: Mutex::new(HashMap::new()),
            expiry: options.expiry,
        });
        let presence = shared
            .client
            .subscribe(PRESENCE_SUBJECT)
            .await
            .map_err(|e| ConnectError::Nats(e.to_string()))?;
        shared
            .settle()
            .await
            .map_err(|e| ConnectError::Nats(e.to_string()))?;
        let mut tasks = JoinSet::new();
        tasks.spawn(listen_presence(Arc::clone(&shared), presence));
        tasks.spawn(beat_forever(Arc::clone(&shared), options.heartbeat));
        Ok(Fleet { shared, tasks })
    }

    /// This member's id.
    pub fn member(&self) -> &MemberId {
        &self.shared.member
    }

    /// Announces the devices this member holds now, at once and with every
    /// beat after (at most [`MAX_DEVICES`]).
    pub fn announce(
        &self,
        devices: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<(), FleetError> {
        let devices: BTreeSet<String> = devices.into_iter().map(Into::into).collect();
        if devices.len() > MAX_DEVICES {
            return Err(FleetError::TooLarge);
        }
        *lock(&self.shared.held) = devices;
        self.shared.changed.notify_one();
        Ok(())
    }

    /// The member holding `device`: this one if it announced it, else one
    /// whose last beat named it and is not older than the expiry.
    pub fn holder_of(&self, device: &str) -> Option<MemberId> {
        if lock(&self.shared.held).contains(device) {
            return Some(self.shared.member.clone());
        }
        let now = Instant::now();
        lock(&self.shared.view)
            .iter()
            .filter(|(_, h)| now.duration_since(h.seen) <= self.shared.expiry)
            .find(|(_, h)| h.devices.contains(device))
            .map(|(member, _)| member.clone())
    }

    /// The other members heard from within the expiry, in order.
    pub fn members(&self) -> Vec<MemberId> {
        let now = Instant::now();
        let mut members: Vec<MemberId> = lock(&self.shared.view)
            .iter()
            .filter(|(_, h)| now.duration_since(h.seen) <= self.shared.expiry)
            .map(|(member, _)| member.clone())
            .collect();
        members.sort();
        members
    }

    /// The messages dropped so far, by reason.
    pub fn dropped(&self) -> Dropped {
        let c = &self.shared.counters;
        Dropped {
            forged: c.forged.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            too_large: c.too_large.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection to NATS is up now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected()
    }

    /// Sends `payload` to `member` and waits for its one reply until
    /// `deadline` (which the member is told). Fails at once when NATS is
    /// down or no such member listens.
    pub async fn request(
        &self,
        member: &MemberId,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<Vec<u8>, RequestError> {
        let shared = &self.shared;
        if !shared.connected() {
            return Err(RequestError::NatsDown);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RequestError::DeadlinePassed);
        }
        let subject = format!("{REQUEST_PREFIX}{member}");
        let deadline_ms =
            now_ms().saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        let mut body = Vec::with_capacity(8 + payload.len());
        body.extend_from_slice(&deadline_ms.to_be_bytes());
        body.extend_from_slice(payload);
        let sealed = shared
            .seal(&subject, &body)
            .map_err(|_| RequestError::TooLarge)?;
        let inbox = shared.client.new_inbox();
        let mut replies = shared
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|_| RequestError::NatsDown)?;
        shared
            .client
            .publish_with_reply(subject, inbox.clone(), sealed.into())
            .await
            .map_err(|_| RequestError::NatsDown)?;
        let wait = async {
            let mut replays = Replays::new(shared.window);
            let mut refused = None;
            while let Some(message) = replies.next().await {
                if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                    return Err(
                        refused.unwrap_or_else(|| RequestError::NoSuchMember(member.clone()))
                    );
                }
                match shared.open(&inbox, &message.payload, &mut replays) {
                    Some(opened) if opened.from == *member => return Ok(opened.body),
                    // A reply another member sealed, or none: wait on for
                    // the one asked, remembering why.
                    _ => refused = Some(RequestError::Refused),
                }
            }
            Err(RequestError::NatsDown)
        };
        // A connection lost while waiting fails the request then, not at
        // its deadline: the reply cannot come through a closed connection.
        let lost = async {
            loop {
                tokio::time::sleep(CONNECTION_CHECK).await;
                if !shared.connected() {
                    return RequestError::NatsDown;
                }
            }
        };
        tokio::select! {
            answered = tokio::time::timeout(left, wait) => {
                answered.unwrap_or(Err(RequestError::DeadlinePassed))
            }
            lost = lost => Err(lost),
        }
    }

    /// Serves the requests sent to this member: verified, each with its
    /// sender and deadline, answered once.
    pub async fn serve(&self) -> Result<Requests, FleetError> {
        let subject = format!("{REQUEST_PREFIX}{}", self.shared.member);
        let subscriber = self
            .shared
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|_| FleetError::NatsDown)?;
        // The subscription is in place at the server once this returns.
        self.shared.settle().await?;
        Ok(Requests {
            replays: Replays::new(self.shared.window),
            shared: Arc::clone(&self.shared),
            subject,
            subscriber,
        })
    }

    /// Broadcasts `event` to every other member.
    pub async fn publish(&self, event: &[u8]) -> Result<(), FleetError> {
        if !self.shared.connected() {
            return Err(FleetError::NatsDown);
        }
        let sealed = self
            .shared
            .seal(EVENT_SUBJECT, event)
            .map_err(|_| FleetError::TooLarge)?;
        self.shared
            .client
            .publish(EVENT_SUBJECT, sealed.into())
            .await
            .map_err(|_| FleetError::NatsDown)
    }

    /// The events other members publish from now on, verified.
    pub async fn events(&self) -> Result<Events, FleetError> {
        let subscriber = self
            .shared
            .client
            .subscribe(EVENT_SUBJECT)
            .await
            .map_err(|_| FleetError::NatsDown)?;
        self.shared.settle().await?;
        Ok(Events {
            replays: Replays::new(self.shared.window),
            shared: Arc::clone(&self.shared),
            subscriber,
        })
    }

    /// Leaves the fleet cleanly: says goodbye, so others forget this
    /// member's devices at once, and stops its tasks.
    pub async fn close(mut self) -> Result<(), FleetError> {
        self.tasks.abort_all();
        lock(&self.shared.held).clear();
        let said = self.shared.beat(true).await;
        let flushed = self
            .shared
            .client
            .flush()
            .await
            .map_err(|_| FleetError::NatsDown);
        while self.tasks.join_next().await.is_some() {}
        said.and(flushed)
    }
}

/// Requests sent to this member, from [`Fleet::serve`].
pub struct Requests {
    shared: Arc<Shared>,
    replays: Replays,
    subject: String,
    subscriber: async_nats::Subscriber,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Requests {
    /// The next verified request whose deadline has not passed; `None`
    /// when the subscription ends. Anything else is dropped (and counted
    /// when it was not sealed).
    pub async fn next(&mut self) -> Option<Request> {
        while let Some(message) = self.subscriber.next().await {
            let Some(opened) = self
                .shared
                .open(&self.subject, &message.payload, &mut self.replays)
            else {
                continue;
            };
            let Some(reply) = message.reply else {
                continue;
            };
            let Some((head, payload)) = opened.body.split_at_checked(8) else {
                continue;
            };
            let deadline_ms = u64::from_be_bytes(head.try_into().unwrap_or([0; 8]));
            let left = deadline_ms.saturating_sub(now_ms());
            if left == 0 {
                continue;
            }
            return Some(Request {
                shared: Arc::clone(&self.shared),
                from: opened.from,
                payload: payload.to_vec(),
                deadline: Instant::now() + Duration::from_millis(left),
                reply: reply.to_string(),
            });
        }
        None
    }
}

/// One verified request, to be answered once.
pub struct Request {
    shared: Arc<Shared>,
    from: MemberId,
    payload: Vec<u8>,
    deadline: Instant,
    reply: String,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("from", &self.from)
            .field("bytes", &self.payload.len())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// The member that sent it.
    pub fn from(&self) -> &MemberId {
        &self.from
    }

    /// What it asks.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// When the sender stops waiting.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Answers it with `reply`, sealed for the sender's inbox.
    pub async fn respond(self, reply: &[u8]) -> Result<(), FleetError> {
        let sealed = self
            .shared
            .seal(&self.reply, reply)
            .map_err(|_| FleetError::TooLarge)?;
        self.shared
            .client
            .publish(self.reply, sealed.into())
            .await
            .map_err(|_| FleetError::NatsDown)
    }
}

/// One verified event from another member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The member that published it.
    pub from: MemberId,
    /// What it says.
    pub payload: Vec<u8>,
}

/// Events other members publish, from [`Fleet::events`].
pub struct Events {
    shared: Arc<Shared>,
    replays: Replays,
    subscriber: async_nats::Subscriber,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// The next verified event from another member; `None` when the
    /// subscription ends. This member's own events are skipped.
    pub async fn next(&mut self) -> Option<Event> {
        while let Some(message) = self.subscriber.next().await {
            let Some(opened) = self
                .shared
                .open(EVENT_SUBJECT, &message.payload, &mut self.replays)
            else {
                continue;
            };
            if opened.from == self.shared.member {
                continue;
            }
            return Some(Event {
                from: opened.from,
                payload: opened.body,
            });
        }
        None
    }
}

/// Keeps the view of who holds what from the beats heard.
async fn listen_presence(shared: Arc<Shared>, mut subscriber: async_nats::Subscriber) {
    let mut replays = Replays::new(shared.window);
    while let Some(message) = subscriber.next().await {
        let Some(opened) = shared.open(PRESENCE_SUBJECT, &message.payload, &mut replays) else {
            continue;
        };
        if opened.from == shared.member {
            continue;
        }
        let Ok(beat) = serde_json::from_slice::<Beat>(&opened.body) else {
            continue;
        };
        let mut view = lock(&shared.view);
        if beat.goodbye {
            view.remove(&opened.from);
        } else {
            let devices = beat.devices.into_iter().take(MAX_DEVICES).collect();
            view.insert(
                opened.from,
                Holding {
                    devices,
                    seen: Instant::now(),
                },
            );
        }
    }
}

/// Beats every `heartbeat`, and at once when the devices held change.
async fn beat_forever(shared: Arc<Shared>, heartbeat: Duration) {
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.changed.notified() => {}
        }
        if let Err(why) = shared.beat(false).await {
            tracing::debug!(%why, "fleet beat not sent");
        }
        // Forget members long gone, so the view stays bounded by the
        // members alive.
        let now = Instant::now();
        let forget_after = shared.expiry.saturating_mul(10);
        lock(&shared.view).retain(|_, h| now.duration_since(h.seen) <= forget_after);
    }
}
