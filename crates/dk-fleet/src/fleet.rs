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

//!
//! Its parts: [`shared`] (what every task of a member shares, and how it
//! seals, opens, asks and answers), [`incoming`] (the requests and events
//! that come to it) and [`tasks`] (presence heard and said).

mod incoming;
mod shared;
mod tasks;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;

pub use incoming::{Event, Events, Request, Requests};
pub use shared::{
    CLOCK_TOLERANCE, Dropped, EVENT_SUBJECT, PRESENCE_PREFIX, PRESENCE_SUBJECT, REQUEST_PREFIX,
};
use shared::{Counters, Shared, duration_ms, lock};
use tasks::{beat_forever, listen_presence, serve_whole};

use crate::error::{ConnectError, FleetError, RequestError};
use crate::key::FleetKey;
use crate::member::{Incarnation, MemberId};
use crate::options::{Auth, FleetOptions};
use crate::presence::{Departed, Held, PresenceChange, Said, Seen, View};
use crate::seal::{MAX_MESSAGE, Replays, Sealer};

/// The size limit when the server does not say one.
const DEFAULT_LIMIT: usize = 1024 * 1024;

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
        self.shared.counters.dropped()
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
