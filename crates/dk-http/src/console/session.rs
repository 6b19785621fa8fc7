//! The console's sign-in: the secret path, one-time login links, sessions
//! and their cookie, kept as SHA-256 of their secrets.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use rand::RngExt;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::by::By;

use super::pages;

/// How long a login link works, unused (15 minutes).
pub const LOGIN_LINK_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// How long a console session lasts from sign-in (12 hours).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Most unused login links kept; a new one beyond it replaces the oldest.
const MAX_LINKS: usize = 16;
/// Most sessions kept; a new one beyond it ends the oldest.
const MAX_SESSIONS: usize = 32;
/// The session cookie's name.
pub(super) const COOKIE: &str = "dk_console";
/// Random bytes in the console's secret path (shown as twice as many hex
/// characters).
const PATH_SECRET_BYTES: usize = 16;
/// Random bytes in a session's id, as the audit log names it.
const SESSION_ID_BYTES: usize = 8;
/// Device events kept per device for its page.
const EVENTS_PER_DEVICE: usize = 10;
/// Devices whose recent events are kept.
const EVENT_DEVICES: usize = 4096;

/// The console's sign-in state: unused login links and open sessions,
/// both kept only as SHA-256 of their secrets, and where the console is
/// reached. Shared by the admin listener that serves it and the admin
/// socket that makes fresh links for `dk console`.
pub struct Console {
    /// The secret path segment: 32 hex characters, for this run only.
    secret: String,
    access: Mutex<Access>,
    places: Mutex<Places>,
    events: Mutex<RecentEvents>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Access {
    /// Unused login links: the secret's hash and when it stops working.
    links: HashMap<[u8; 32], Instant>,
    /// Open sessions by the cookie secret's hash.
    sessions: HashMap<[u8; 32], Session>,
}

#[derive(Clone)]
struct Session {
    /// What the audit log names the session by: random, made apart from
    /// the cookie, so nothing leads from one to the other.
    id: String,
    csrf: String,
    expires: Instant,
    /// When it was opened: the oldest goes first when there are too many.
    opened: Instant,
}

#[derive(Default)]
pub(super) struct Places {
    /// `http://host:port` of the admin listener serving the console.
    base: Option<String>,
    /// The MCP endpoint agents are told to use.
    pub(super) mcp_url: Option<String>,
}

/// The last events of each device, for its page.
#[derive(Default)]
struct RecentEvents {
    by_device: BTreeMap<String, VecDeque<pages::RecentEvent>>,
}

/// A signed-in request's session, as the handlers see it.
#[derive(Clone)]
pub(super) struct Signed {
    pub(super) key: [u8; 32],
    pub(super) csrf: String,
    pub(super) id: String,
}

impl Signed {
    /// Who makes a change through this session, for its audit entry.
    pub(super) fn by(&self) -> By {
        By::console(&self.id)
    }
}

/// A secret from a CSPRNG as 64 hex characters, and its hash.
fn secret() -> (String, [u8; 32]) {
    let mut bytes = [0u8; 32];
    rand::rng().fill(&mut bytes);
    let text = dk_files::hex::encode(&bytes);
    let hash = Sha256::digest(text.as_bytes()).into();
    (text, hash)
}

pub(super) fn hash_of(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Console {
    /// A console with no link and no session yet.
    pub fn new() -> Arc<Console> {
        let mut path = [0u8; PATH_SECRET_BYTES];
        rand::rng().fill(&mut path);
        Arc::new(Console {
            secret: dk_files::hex::encode(&path),
            access: Mutex::new(Access::default()),
            places: Mutex::new(Places::default()),
            events: Mutex::new(RecentEvents::default()),
        })
    }

    fn access(&self) -> std::sync::MutexGuard<'_, Access> {
        self.access.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn places(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the console's sign-in page is
    /// (`http://127.0.0.1:7778/console/`), once the admin API listens on
    /// TCP: safe to print or send, it holds no secret. A browser that
    /// signed in before is forwarded from there to its console.
    pub fn url(&self) -> Option<String> {
        self.places().base.as_ref().map(|b| format!("{b}/console/"))
    }

    /// The console's own pages (`http://127.0.0.1:7778/console/<secret>/`),
    /// once the admin API listens on TCP. The path is a secret: whoever
    /// knows it can have a signed-in person's browser send the session
    /// cookie to another program on this host, so it goes only where a
    /// login link may go.
    pub fn home(&self) -> Option<String> {
        let prefix = self.prefix();
        self.places().base.as_ref().map(|b| format!("{b}{prefix}/"))
    }

    /// `/console/<secret>`: the path every signed-in page is under, and
    /// the session cookie's `Path`.
    pub(super) fn prefix(&self) -> String {
        format!("/console/{}", self.secret)
    }

    /// Whether `segment` is the secret path segment, compared in constant
    /// time.
    pub(super) fn is_secret(&self, segment: &str) -> bool {
        bool::from(hash_of(segment).ct_eq(&hash_of(&self.secret)))
    }

    /// A fresh one-time login link, or `None` when the admin API does not
    /// listen on TCP (the console is served nowhere). It works once,
    /// within [`LOGIN_LINK_LIFETIME`].
    pub fn login_link(&self) -> Option<String> {
        let base = self.places().base.clone()?;
        let (text, hash) = secret();
        let now = Instant::now();
        let mut access = self.access();
        access.links.retain(|_, until| *until > now);
        if access.links.len() >= MAX_LINKS
            && let Some(oldest) = access
                .links
                .iter()
                .min_by_key(|(_, until)| **until)
                .map(|(k, _)| *k)
        {
            access.links.remove(&oldest);
        }
        access.links.insert(hash, now + LOGIN_LINK_LIFETIME);
        drop(access);
        Some(format!("{base}{}/login?key={text}", self.prefix()))
    }

    /// Tells agents' MCP configuration snippets where MCP is served.
    pub fn set_mcp_url(&self, url: impl Into<String>) {
        self.places().mcp_url = Some(url.into());
    }

    /// Open sessions (expired ones not counted).
    pub fn sessions(&self) -> usize {
        let now = Instant::now();
        self.access()
            .sessions
            .values()
            .filter(|s| s.expires > now)
            .count()
    }

    /// Makes login links to the listener bound to `local` (an unspecified
    /// address is reached as 127.0.0.1). [`serve_admin`](crate::serve_admin)
    /// sets it when it starts serving; a caller that prints a link before
    /// that sets it first.
    pub fn set_address(&self, local: SocketAddr) {
        let host = if local.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], local.port()))
        } else {
            local
        };
        self.places().base = Some(format!("http://{host}"));
    }

    /// Uses a login link's secret: a new session's cookie secret, or
    /// `None` when the secret is unknown, used or expired.
    pub(super) fn redeem(&self, key: &str) -> Option<String> {
        let now = Instant::now();
        let mut access = self.access();
        let until = access.links.remove(&hash_of(key))?;
        if until <= now {
            return None;
        }
        access.sessions.retain(|_, s| s.expires > now);
        if access.sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = access
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.opened)
                .map(|(k, _)| *k)
        {
            access.sessions.remove(&oldest);
        }
        let (cookie, hash) = secret();
        let (csrf, _) = secret();
        let mut id = [0u8; SESSION_ID_BYTES];
        rand::rng().fill(&mut id);
        access.sessions.insert(
            hash,
            Session {
                id: dk_files::hex::encode(&id),
                csrf,
                expires: now + SESSION_LIFETIME,
                opened: now,
            },
        );
        Some(cookie)
    }

    pub(super) fn session(&self, cookie: &str) -> Option<Signed> {
        let key = hash_of(cookie);
        let now = Instant::now();
        let mut access = self.access();
        match access.sessions.get(&key) {
            Some(session) if session.expires > now => Some(Signed {
                key,
                csrf: session.csrf.clone(),
                id: session.id.clone(),
            }),
            Some(_) => {
                access.sessions.remove(&key);
                None
            }
            None => None,
        }
    }

    pub(super) fn alive(&self, key: &[u8; 32]) -> bool {
        let now = Instant::now();
        self.access()
            .sessions
            .get(key)
            .is_some_and(|s| s.expires > now)
    }

    pub(super) fn end(&self, key: &[u8; 32]) {
        self.access().sessions.remove(key);
    }

    pub(super) fn remember_event(&self, event: pages::RecentEvent) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if !events.by_device.contains_key(&event.device_id)
            && events.by_device.len() >= EVENT_DEVICES
            && let Some(first) = events.by_device.keys().next().cloned()
        {
            events.by_device.remove(&first);
        }
        let ring = events.by_device.entry(event.device_id.clone()).or_default();
        if ring.len() >= EVENTS_PER_DEVICE {
            ring.pop_front();
        }
        ring.push_back(event);
    }

    pub(super) fn recent_events(&self, device_id: &str) -> Vec<pages::RecentEvent> {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events
            .by_device
            .get(device_id)
            .map(|ring| ring.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}

/// Every value the request gives the session cookie. A page on another
/// port of the same host can add cookies for this one (browsers share
/// cookies across ports): a planted `dk_console`, or a header that is not
/// ASCII, must not hide the real session, so each value is tried and
/// unreadable headers are skipped. Session secrets cannot be guessed, so
/// trying a planted value gains nothing.
pub(super) fn cookies_of(headers: &HeaderMap) -> Vec<&str> {
    let mut found = Vec::new();
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else {
            continue;
        };
        for pair in text.split(';') {
            if let Some((name, value)) = pair.trim().split_once('=')
                && name == COOKIE
                && found.len() < 8
            {
                found.push(value);
            }
        }
    }
    found
}
