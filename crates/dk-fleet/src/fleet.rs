//! `Fleet`: one member's connection to the fleet over NATS: presence,
//! routed requests and broadcast events, every message sealed.
//!
//! Subjects: `dk.fleet.presence` (beats, deltas and goodbyes),
//! `dk.fleet.presence.<member>` (a member's whole set of devices, asked
//! for), `dk.fleet.event` (events), `dk.fleet.request.<member>` (requests
//! to that member), and a fresh inbox per request for its reply.
//!
//! A request is meant for the incarnation of the member that presence
//! names: a member that restarted refuses what was meant for its earlier
//! run (and says so at once), so a request or an answer captured before a
//! restart and sent again after it does nothing. A request waits for its
//! reply until its deadline, or until the connection goes down, or the
//! member leaves or restarts, whichever comes first.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;

use crate::error::{ConnectError, FleetError, RequestError};
use crate::key::FleetKey;
use crate::member::{Incarnation, MemberId};
use crate::options::{Auth, FleetOptions};
use crate::presence::{Departed, Held, PresenceChange, Said, Seen, View, Whole};
use crate::reply::{Assembly, Chunk, Status, chunks};
use crate::seal::{MAX_MESSAGE, Opened, Replays, SealError, Sealer, Sender, now_ms};

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

/// The size limit when the server does not say one.
const DEFAULT_LIMIT: usize = 1024 * 1024;

/// How long a member waits for another's whole set before asking again.
const WHOLE_TIMEOUT: Duration = Duration::from_secs(5);

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
struct Counters {
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
}

/// A member's state in the fleet, as an operator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetState {
    /// This member.
    pub member: MemberId,
    /// This run of it.
    pub incarnation: Incarnation,
    /// Whether the connection to NATS is up.
    pub connected: bool,
    /// How many devices this member announces.
    pub devices: usize,
    /// The other members present, in order.
    pub members: Vec<Seen>,
    /// The members that left and are not back, and how.
    pub departed: Vec<Departed>,
    /// The messages dropped, by reason.
    pub dropped: Dropped,
    /// The largest message the servers carry, in bytes.
    pub max_message: usize,
}

/// What every task of a member shares.
struct Shared {
    client: async_nats::Client,
    member: MemberId,
    incarnation: Incarnation,
    sealer: Sealer,
    /// How old a message may be; each listener keeps the ids it saw
    /// within it (a message reaches every subscription, and each takes it
    /// once).
    window: Duration,
    /// The largest sealed message: the servers' `max_payload`.
    limit: AtomicUsize,
    counters: Counters,
    held: Mutex<Held>,
    /// Deltas and goodbyes to say, in order, by the beating task.
    say: mpsc::UnboundedSender<Said>,
    view: Mutex<View>,
    changes: broadcast::Sender<PresenceChange>,
    /// Raised at every change in presence, for requests waiting on a member.
    epoch: watch::Sender<u64>,
    connected: watch::Receiver<bool>,
    left: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// `body` sealed by this member for `subject`, meant for `to`.
    fn seal(
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
    fn open(&self, subject: &str, bytes: &[u8], replays: &mut Replays) -> Option<Opened> {
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

    fn drop_message(&self, subject: &str, why: SealError) {
        self.counters.count(why);
        // Counted, and told by `dk status` and `/metrics`: a log line per
        // message would let anyone on the servers fill the log.
        tracing::debug!(subject, %why, "fleet message dropped");
    }

    fn connected(&self) -> bool {
        *self.connected.borrow()
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

    /// Says `said` on the presence subject.
    async fn say(&self, said: &Said) -> Result<(), FleetError> {
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
    fn changed(&self, change: PresenceChange) {
        let _ = self.changes.send(change);
        self.epoch.send_modify(|epoch| *epoch += 1);
    }

    /// Room for ids in one delta: half the limit, well clear of the rest.
    fn delta_room(&self) -> usize {
        self.limit() / 2
    }

    /// Sends `request` (a body for `subject`) to `member`'s `incarnation`
    /// and gathers its reply, until `deadline`, the connection going down,
    /// or the member leaving or restarting.
    async fn ask(
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
    async fn answer(
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
    async fn take_request(
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
fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One member's place in the fleet. Its tasks stop when it leaves
/// ([`Fleet::leave`], saying goodbye) or is dropped (without a goodbye:
/// the others see its presence expire).
pub struct Fleet {
    shared: Arc<Shared>,
    tasks: Mutex<JoinSet<()>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("member", &self.shared.member)
            .field("incarnation", &self.shared.incarnation)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Joins the fleet as a new incarnation of its member: reads the fleet
    /// key (no key file, no fleet) and the credentials, connects to the
    /// NATS servers, and starts listening to presence and beating.
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
        let tls = options.ca_file.is_some();
        if let Some(ca) = &options.ca_file {
            nats = nats.add_root_certificates(ca.clone()).require_tls(true);
        }
        let (connection, connected) = watch::channel(false);
        let connection = Arc::new(connection);
        let client = {
            let connection = Arc::clone(&connection);
            nats.event_callback(move |event| {
                let connection = Arc::clone(&connection);
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            connection.send_replace(true);
                        }
                        async_nats::Event::Disconnected | async_nats::Event::Closed => {
                            connection.send_replace(false);
                        }
                        _ => {}
                    }
                }
            })
        }
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
        .map_err(|e| ConnectError::nats(&e, tls))?;
        connection
            .send_replace(client.connection_state() == async_nats::connection::State::Connected);
        let limit = match client.server_info().max_payload {
            0 => DEFAULT_LIMIT,
            max => max.min(MAX_MESSAGE),
        };
        let (say, said) = mpsc::unbounded_channel();
        let member = options.member.clone();
        let shared = Arc::new(Shared {
            client,
            incarnation: Incarnation::new(),
            member: member.clone(),
            sealer: Sealer::new(key.seal_key()),
            window: options.window,
            limit: AtomicUsize::new(limit),
            counters: Counters::default(),
            held: Mutex::new(Held::default()),
            say,
            view: Mutex::new(View::new(options.expiry)),
            changes: broadcast::channel(1024).0,
            epoch: watch::channel(0).0,
            connected,
            left: AtomicBool::new(false),
        });
        let nats_error = |e: async_nats::SubscribeError| ConnectError::Nats(e.to_string());
        let presence = shared
            .client
            .subscribe(PRESENCE_SUBJECT)
            .await
            .map_err(nats_error)?;
        let whole = shared
            .client
            .subscribe(format!("{PRESENCE_PREFIX}{member}"))
            .await
            .map_err(nats_error)?;
        shared
            .settle()
            .await
            .map_err(|e| ConnectError::Nats(e.to_string()))?;
        let mut tasks = JoinSet::new();
        tasks.spawn(listen_presence(Arc::clone(&shared), presence));
        tasks.spawn(serve_whole(Arc::clone(&shared), whole));
        tasks.spawn(beat_forever(Arc::clone(&shared), said, options.heartbeat));
        Ok(Fleet {
            shared,
            tasks: Mutex::new(tasks),
        })
    }

    /// This member's id.
    pub fn member(&self) -> &MemberId {
        &self.shared.member
    }

    /// This run of the member: new at every start.
    pub fn incarnation(&self) -> Incarnation {
        self.shared.incarnation
    }

    /// Announces the devices this member holds now: the change is said at
    /// once (at most [`crate::MAX_DEVICES`]; more is an error and nothing
    /// changes).
    pub fn announce(
        &self,
        devices: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<(), FleetError> {
        let devices: BTreeSet<String> = devices.into_iter().map(Into::into).collect();
        if devices.len() > crate::MAX_DEVICES {
            return Err(FleetError::TooLarge);
        }
        let room = self.shared.delta_room();
        let deltas = lock(&self.shared.held).replace(devices, room);
        for delta in deltas {
            let _ = self.shared.say.send(delta);
        }
        Ok(())
    }

    /// The member holding `device`: this one if it announced it, else the
    /// present member whose presence names it (the one heard last, when
    /// two do).
    pub fn holder_of(&self, device: &str) -> Option<MemberId> {
        if lock(&self.shared.held).devices.contains(device) {
            return Some(self.shared.member.clone());
        }
        lock(&self.shared.view)
            .holder_of(device)
            .map(|(member, _)| member)
    }

    /// The incarnation `member` is present as, if it is (this member's own
    /// for itself).
    pub fn incarnation_of(&self, member: &MemberId) -> Option<Incarnation> {
        if *member == self.shared.member {
            return Some(self.shared.incarnation);
        }
        lock(&self.shared.view).incarnation_of(member)
    }

    /// The other members present, in order.
    pub fn members(&self) -> Vec<MemberId> {
        self.seen().into_iter().map(|s| s.member).collect()
    }

    /// The other members present, in order, with what is known of each.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.shared.view).seen(Instant::now())
    }

    /// Changes in presence from now on: members joining, restarting and
    /// leaving. A receiver that lags behind misses changes (and is told
    /// so); [`Fleet::seen`] says who is present.
    pub fn presence_changes(&self) -> broadcast::Receiver<PresenceChange> {
        self.shared.changes.subscribe()
    }

    /// The messages dropped so far, by reason.
    pub fn dropped(&self) -> Dropped {
        let c = &self.shared.counters;
        Dropped {
            forged: c.forged.load(Ordering::Relaxed),
            replayed: c.replayed.load(Ordering::Relaxed),
            stale: c.stale.load(Ordering::Relaxed),
            too_large: c.too_large.load(Ordering::Relaxed),
            other_version: c.other_version.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection to NATS is up now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected()
    }

    /// The connection's state from now on (`true` while up).
    pub fn connection(&self) -> watch::Receiver<bool> {
        self.shared.connected.clone()
    }

    /// The largest message the servers carry, in bytes (their
    /// `max_payload`): the largest request a member sends.
    pub fn max_message(&self) -> usize {
        self.shared.limit()
    }

    /// The member's state, as an operator reads it.
    pub fn state(&self) -> FleetState {
        FleetState {
            member: self.shared.member.clone(),
            incarnation: self.shared.incarnation,
            connected: self.is_connected(),
            devices: lock(&self.shared.held).devices.len(),
            members: self.seen(),
            departed: lock(&self.shared.view).departed(Instant::now()),
            dropped: self.dropped(),
            max_message: self.max_message(),
        }
    }

    /// Sends `payload` to `member` and waits for its one reply until
    /// `deadline` (the member is told how long that leaves, and refuses the
    /// request once that time has passed on its clock, give or take
    /// [`CLOCK_TOLERANCE`]; so the reply is awaited that long again twice
    /// over before the request is given up). Fails at once when NATS is
    /// down or the member is not present, and as soon as the connection
    /// goes down or the member says goodbye or restarts while the reply is
    /// awaited. A member that goes silent meanwhile is waited for until
    /// the deadline: it may be paused, and still serve the request.
    pub async fn request(
        &self,
        member: &MemberId,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<Vec<u8>, RequestError> {
        let incarnation = lock(&self.shared.view)
            .incarnation_of(member)
            .ok_or_else(|| RequestError::NoSuchMember(member.clone()))?;
        self.request_to(member, incarnation, payload, deadline)
            .await
    }

    /// [`Fleet::request`] to `member`'s `incarnation` only: when the member
    /// present runs as another (it restarted since), the request is not
    /// sent and fails with [`RequestError::MemberGone`]. A member not heard
    /// yet is asked all the same (its incarnation came with a message of
    /// its own); only the deadline bounds the wait then.
    pub async fn request_to(
        &self,
        member: &MemberId,
        incarnation: Incarnation,
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
        // A member not heard yet (a message of its came before its first
        // beat) is asked all the same: its incarnation says which run.
        if let Some(present) = lock(&shared.view).incarnation_of(member)
            && present != incarnation
        {
            return Err(RequestError::MemberGone(member.clone()));
        }
        let mut body = Vec::with_capacity(8 + payload.len());
        body.extend_from_slice(&duration_ms(left).to_be_bytes());
        body.extend_from_slice(payload);
        let subject = format!("{REQUEST_PREFIX}{member}");
        let waited = deadline + CLOCK_TOLERANCE * 2;
        shared
            .ask(&subject, member, incarnation, &body, waited)
            .await
    }

    /// Serves the requests sent to this member: verified, meant for this
    /// incarnation, each with its sender and deadline, answered once.
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
            .seal(EVENT_SUBJECT, None, event)
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

    /// Leaves the fleet cleanly: stops the member's tasks and says goodbye
    /// before the connection closes, so others forget this member's
    /// devices, and what it asked them, at once. Leaving twice does
    /// nothing more.
    pub async fn leave(&self) -> Result<(), FleetError> {
        if self.shared.left.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        lock(&self.shared.held).devices.clear();
        let said = self.shared.say(&Said::Goodbye).await;
        let flushed = self
            .shared
            .client
            .flush()
            .await
            .map_err(|_| FleetError::NatsDown);
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
    /// The next verified request meant for this incarnation whose
    /// deadline has not passed; `None` when the subscription ends.
    /// Anything else is dropped and counted.
    pub async fn next(&mut self) -> Option<Request> {
        while let Some(message) = self.subscriber.next().await {
            if let Some(request) = self
                .shared
                .take_request(&self.subject, message, &mut self.replays)
                .await
            {
                return Some(request.with(Arc::clone(&self.shared)));
            }
        }
        None
    }
}

/// A request as taken off the wire.
struct Taken {
    from: MemberId,
    from_incarnation: Incarnation,
    payload: Vec<u8>,
    deadline: Instant,
    reply: String,
}

/// One verified request, to be answered once.
pub struct Request {
    shared: Arc<Shared>,
    request: Taken,
}

impl Taken {
    fn with(self, shared: Arc<Shared>) -> Request {
        Request {
            shared,
            request: self,
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("from", &self.request.from)
            .field("bytes", &self.request.payload.len())
            .field("deadline", &self.request.deadline)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// The member that sent it.
    pub fn from(&self) -> &MemberId {
        &self.request.from
    }

    /// The incarnation of the member that sent it.
    pub fn from_incarnation(&self) -> Incarnation {
        self.request.from_incarnation
    }

    /// What it asks.
    pub fn payload(&self) -> &[u8] {
        &self.request.payload
    }

    /// When the sender stops waiting.
    pub fn deadline(&self) -> Instant {
        self.request.deadline
    }

    /// Answers it with `reply`, sealed for the sender's inbox, in as many
    /// messages as the servers' limit needs; a reply larger than
    /// [`crate::MAX_REPLY`] is [`FleetError::TooLarge`] and nothing is
    /// sent, so a smaller answer saying so can follow.
    pub async fn respond(&self, reply: &[u8]) -> Result<(), FleetError> {
        self.shared
            .answer(
                &self.request.reply,
                self.request.from_incarnation,
                Status::Data,
                reply,
            )
            .await
    }
}

/// One verified event from another member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The member that published it.
    pub from: MemberId,
    /// The incarnation that published it.
    pub incarnation: Incarnation,
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
    /// subscription ends. This member's own events are skipped, and so
    /// are those of an incarnation that is gone.
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
                incarnation: opened.from_incarnation,
                payload: opened.body,
            });
        }
        None
    }
}

/// Keeps the view of who holds what from what members say, asks a member
/// for its whole set when its word does not follow, and forgets a member
/// not heard within the expiry.
async fn listen_presence(shared: Arc<Shared>, mut subscriber: async_nats::Subscriber) {
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
async fn serve_whole(shared: Arc<Shared>, mut subscriber: async_nats::Subscriber) {
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
async fn beat_forever(
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
