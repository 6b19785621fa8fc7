//! The person's console: web pages served on the admin listener, under
//! a secret path `/console/<secret>/`, for answering pairings and
//! approvals, granting and revoking, managing agents, reading and
//! verifying the audit log.
//!
//! Signing in: [`Console::login_link`] makes a one-time link (printed by
//! `dk vessel` and `dk console`) under the secret path; its key, used once
//! within [`LOGIN_LINK_LIFETIME`], becomes a session held in an
//! `HttpOnly`, `SameSite=Strict` cookie for [`SESSION_LIFETIME`]. The
//! bearer token is never asked for and the API keeps taking it.
//!
//! Browsers do not keep cookies apart by port: a page on another loopback
//! port that asks its own server for `/console/...` would hand that server
//! a cookie scoped to `/console`. The cookie's `Path` is therefore the
//! secret path (128 random bits, made fresh when the vessel starts, found
//! only in login links): a neighbour that does not know it is sent no
//! cookie. Requests under `/console/` with any other first segment get a
//! plain 404 and never need nor set a cookie; the secret is compared in
//! constant time. `/console/` itself is a sign-in page (what a
//! notification links to) that forwards a browser which signed in before
//! to its console (the path is kept in that origin's own storage).
//!
//! Every console request passes the admin listener's `Host` and `Origin`
//! rule; every state-changing one must be a `POST` carrying this
//! listener's own `Origin`, no `Sec-Fetch-Site` other than `same-origin`,
//! and the session's CSRF token. Pages are rendered on the server
//! (`pages.rs`), with everything a device or agent wrote escaped and its
//! hidden characters shown (`html.rs`); a small script (`assets/`, embedded
//! in the binary) adds the live updates, which arrive as server-sent events
//! from `/console/live`. The Content-Security-Policy allows nothing but
//! this listener's own script and style.

mod html;
mod pages;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dk_proto::admin as api;
use futures::Stream;
use rand::RngExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::broadcast;

use crate::agents::{AgentRole, AgentScope};
use crate::allowances::{AllowanceMinutes, AllowanceScope, Remember};
use crate::by::By;
use crate::origins::{LocalOrigins, single};
use crate::person::{ApprovalAnswer, PersonEvent};
use crate::registry::ConsentDecision;
use crate::store::{AuditEntry, AuditQuery};
use crate::vessel::Vessel;

use pages::{AuditFilter, Page};

/// How long a login link works, unused (15 minutes).
pub const LOGIN_LINK_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// How long a console session lasts from sign-in (12 hours).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Most unused login links kept; a new one beyond it replaces the oldest.
const MAX_LINKS: usize = 16;
/// Most sessions kept; a new one beyond it ends the oldest.
const MAX_SESSIONS: usize = 32;
/// The session cookie's name.
const COOKIE: &str = "dk_console";
/// Random bytes in the console's secret path (shown as twice as many hex
/// characters).
const PATH_SECRET_BYTES: usize = 16;
/// Random bytes in a session's id, as the audit log names it.
const SESSION_ID_BYTES: usize = 8;
/// Largest form body the console reads (64 KiB).
const MAX_FORM_BYTES: usize = 64 * 1024;
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
struct Places {
    /// `http://host:port` of the admin listener serving the console.
    base: Option<String>,
    /// The MCP endpoint agents are told to use.
    mcp_url: Option<String>,
}

/// The last events of each device, for its page.
#[derive(Default)]
struct RecentEvents {
    by_device: BTreeMap<String, VecDeque<pages::RecentEvent>>,
}

/// A signed-in request's session, as the handlers see it.
#[derive(Clone)]
struct Signed {
    key: [u8; 32],
    csrf: String,
    id: String,
}

impl Signed {
    /// Who makes a change through this session, for its audit entry.
    fn by(&self) -> By {
        By::console(&self.id)
    }
}

/// A form's fields, read and checked (CSRF) before the handler runs.
#[derive(Clone, Default)]
struct Form(Vec<(String, String)>);

impl Form {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// A secret from a CSPRNG as 64 hex characters, and its hash.
fn secret() -> (String, [u8; 32]) {
    let mut bytes = [0u8; 32];
    rand::rng().fill(&mut bytes);
    let text = hex(&bytes);
    let hash = Sha256::digest(text.as_bytes()).into();
    (text, hash)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hash_of(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl Console {
    /// A console with no link and no session yet.
    pub fn new() -> Arc<Console> {
        let mut path = [0u8; PATH_SECRET_BYTES];
        rand::rng().fill(&mut path);
        Arc::new(Console {
            secret: hex(&path),
            access: Mutex::new(Access::default()),
            places: Mutex::new(Places::default()),
            events: Mutex::new(RecentEvents::default()),
        })
    }

    fn access(&self) -> std::sync::MutexGuard<'_, Access> {
        self.access.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Places> {
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
    fn prefix(&self) -> String {
        format!("/console/{}", self.secret)
    }

    /// Whether `segment` is the secret path segment, compared in constant
    /// time.
    fn is_secret(&self, segment: &str) -> bool {
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
    fn redeem(&self, key: &str) -> Option<String> {
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
                id: hex(&id),
                csrf,
                expires: now + SESSION_LIFETIME,
                opened: now,
            },
        );
        Some(cookie)
    }

    fn session(&self, cookie: &str) -> Option<Signed> {
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

    fn alive(&self, key: &[u8; 32]) -> bool {
        let now = Instant::now();
        self.access()
            .sessions
            .get(key)
            .is_some_and(|s| s.expires > now)
    }

    fn end(&self, key: &[u8; 32]) {
        self.access().sessions.remove(key);
    }

    fn remember_event(&self, event: pages::RecentEvent) {
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

    fn recent_events(&self, device_id: &str) -> Vec<pages::RecentEvent> {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events
            .by_device
            .get(device_id)
            .map(|ring| ring.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}

/// What the console's handlers share.
#[derive(Clone)]
struct Shared {
    vessel: Arc<Vessel>,
    console: Arc<Console>,
    local: Arc<LocalOrigins>,
}

/// The console's routes for a listener bound to `local`, with their own
/// guard (session cookie, Origin, CSRF) in place of the bearer token.
/// Starts keeping the devices' recent events for their pages.
pub(crate) fn console_router(
    vessel: Arc<Vessel>,
    console: Arc<Console>,
    local: SocketAddr,
) -> Router {
    console.set_address(local);
    let mut events = vessel.subscribe_events();
    let keeper = Arc::downgrade(&console);
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) => match keeper.upgrade() {
                    Some(console) => console.remember_event(pages::RecentEvent::of(&event)),
                    None => break,
                },
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    });
    let shared = Shared {
        vessel,
        console,
        local: Arc::new(LocalOrigins::for_listener(local)),
    };
    // Every signed-in route is under `/console/{secret}`; the guard
    // compares the secret (in constant time) before routing matters.
    Router::new()
        .route("/", get(to_landing))
        .route("/console", get(to_landing))
        .route("/console/", get(landing))
        .route("/console/assets/console.css", get(style))
        .route("/console/assets/console.js", get(script))
        .route("/console/{secret}", get(to_home))
        .route("/console/{secret}/", get(prompts_page))
        .route("/console/{secret}/login", get(login))
        .route("/console/{secret}/logout", post(logout))
        .route("/console/{secret}/live", get(live))
        .route("/console/{secret}/pairings/{id}", post(answer_pairing))
        .route("/console/{secret}/approvals/{id}", post(answer_approval))
        .route("/console/{secret}/devices", get(devices_page))
        .route("/console/{secret}/devices/{id}", get(device_page))
        .route(
            "/console/{secret}/devices/{id}/grants/{capability}",
            post(set_grant),
        )
        .route("/console/{secret}/devices/{id}/unpair", post(unpair))
        .route("/console/{secret}/agents", get(agents_page).post(add_agent))
        .route("/console/{secret}/agents/{name}/scope", post(set_scope))
        .route("/console/{secret}/agents/{name}/remove", post(remove_agent))
        .route("/console/{secret}/audit", get(audit_page))
        .route("/console/{secret}/audit/verify", post(verify_audit))
        .route("/console/{secret}/status", get(status_page))
        .fallback(not_found)
        .layer(from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

/// The headers every console answer carries.
fn harden(headers: &mut HeaderMap) {
    let fixed = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Same-origin requests keep their Origin (a POST's is checked);
        // nothing leaves for another site.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            header::HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// A full HTML page with a status.
fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

/// A page saying why a request was refused, with no session's details.
fn refusal_page(status: StatusCode, message: &str) -> Response {
    html(status, pages::message_page("Refused", message))
}

/// `303 See Other` to `location` (a path on this listener).
fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// Every value the request gives the session cookie. A page on another
/// port of the same host can add cookies for this one (browsers share
/// cookies across ports): a planted `dk_console`, or a header that is not
/// ASCII, must not hide the real session, so each value is tried and
/// unreadable headers are skipped. Session secrets cannot be guessed, so
/// trying a planted value gains nothing.
fn cookies_of(headers: &HeaderMap) -> Vec<&str> {
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

/// Host and Origin for every request; under `/console/`, the secret path
/// or a plain 404; a session for all but the login, the assets and the
/// ways in; for a `POST`, this listener's own Origin, a same-origin fetch
/// and the session's CSRF token in the form.
async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let mut response = checked(shared, request, next).await;
    harden(response.headers_mut());
    response
}

async fn checked(shared: Shared, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if let Some(why) = shared.local.refusal(headers) {
        return refusal_page(StatusCode::FORBIDDEN, why);
    }
    // The ways in (`/`, `/console`, `/console/`) and the assets hold no
    // secret and need no session. Under `/console/`, anything but the
    // secret path is not found, whoever asks: no cookie is read or set.
    let path = request.uri().path();
    let Some(rest) = path.strip_prefix("/console/") else {
        return next.run(request).await;
    };
    let (segment, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if rest.is_empty() || segment == "assets" {
        return next.run(request).await;
    }
    if !shared.console.is_secret(segment) {
        // An old bookmark or a forwarded address from before a restart
        // lands here too: say so, and where a fresh link comes from.
        return html(
            StatusCode::NOT_FOUND,
            pages::message_page(
                "No such page",
                "The console's address changes each time the vessel starts. \
                 Run `dk console` for a fresh login link.",
            ),
        );
    }
    if !rest.contains('/') || tail == "login" {
        return next.run(request).await;
    }
    let session = cookies_of(headers)
        .into_iter()
        .find_map(|cookie| shared.console.session(cookie));
    let Some(signed) = session else {
        return html(StatusCode::UNAUTHORIZED, pages::signed_out_page());
    };
    if request.method() == Method::GET || request.method() == Method::HEAD {
        let mut request = request;
        request.extensions_mut().insert(signed);
        return next.run(request).await;
    }
    if request.method() != Method::POST {
        return refusal_page(
            StatusCode::METHOD_NOT_ALLOWED,
            "the console takes GET and POST",
        );
    }
    // A POST must say where it comes from, and that must be this console.
    match single(headers, header::ORIGIN) {
        Ok(Some(_)) => {}
        _ => {
            return refusal_page(
                StatusCode::FORBIDDEN,
                "a change needs the console's own Origin header",
            );
        }
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"same-origin"
    {
        return refusal_page(
            StatusCode::FORBIDDEN,
            "a change must come from the console's own pages",
        );
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
        return refusal_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large");
    };
    let form = Form(
        form_urlencoded::parse(&bytes)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
    );
    let presented = form.get("csrf").unwrap_or("");
    if !bool::from(hash_of(presented).ct_eq(&hash_of(&signed.csrf))) {
        return refusal_page(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or not this session's: reload the page",
        );
    }
    let mut request = Request::from_parts(parts, Body::from(Bytes::new()));
    request.extensions_mut().insert(signed);
    request.extensions_mut().insert(form);
    next.run(request).await
}

async fn to_landing() -> Response {
    see_other("/console/")
}

/// The sign-in page: nothing but how to sign in, and the script that
/// forwards a browser which signed in before.
async fn landing() -> Response {
    html(StatusCode::OK, pages::landing_page())
}

async fn to_home(State(shared): State<Shared>) -> Response {
    see_other(&format!("{}/", shared.console.prefix()))
}

async fn not_found() -> Response {
    refusal_page(StatusCode::NOT_FOUND, "no such page")
}

async fn style() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("console/assets/console.css"),
    )
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("console/assets/console.js"),
    )
}

fn asset(kind: &'static str, text: &'static str) -> Response {
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

#[derive(Deserialize)]
struct LoginQuery {
    key: Option<String>,
}

/// Exchanges a login link's secret for a session cookie, once.
async fn login(State(shared): State<Shared>, Query(query): Query<LoginQuery>) -> Response {
    let Some(cookie) = query.key.and_then(|key| shared.console.redeem(&key)) else {
        return html(
            StatusCode::FORBIDDEN,
            pages::message_page(
                "This link does not work",
                "A login link works once, for 15 minutes. Run `dk console` for a fresh one.",
            ),
        );
    };
    let prefix = shared.console.prefix();
    let mut response = see_other(&format!("{prefix}/"));
    let value = format!(
        "{COOKIE}={cookie}; Path={prefix}; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_LIFETIME.as_secs()
    );
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn logout(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    shared.console.end(&signed.key);
    let mut response = html(
        StatusCode::OK,
        pages::message_page("Signed out", "Run `dk console` for a new login link."),
    );
    let prefix = shared.console.prefix();
    let value = format!("{COOKIE}=; Path={prefix}; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// What every page's frame needs: the pending count and the CSRF token.
fn page(shared: &Shared, signed: &Signed, current: Page) -> pages::Frame {
    pages::Frame {
        base: shared.console.prefix(),
        current,
        pending: shared.vessel.person().pending().len(),
        csrf: signed.csrf.clone(),
        session: signed.id.clone(),
    }
}

async fn prompts_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Prompts);
    let prompts: Vec<api::Pending> = shared
        .vessel
        .person()
        .pending()
        .into_iter()
        .map(crate::bodies::pending_body)
        .collect();
    html(StatusCode::OK, pages::prompts(&frame, &prompts))
}

/// The live feed: a server-sent event for every prompt asked (with its
/// card's HTML) and closed, each with the count still waiting; at the
/// start, every prompt open now and the list of their ids. Ends with the
/// session.
async fn live(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = shared.vessel.person().subscribe();
    let open = shared.vessel.person().pending();
    let mut first: VecDeque<Event> = VecDeque::new();
    let ids: Vec<u64> = open.iter().map(|p| p.id).collect();
    first.push_back(
        Event::default()
            .event("sync")
            .data(serde_json::json!({"pending": ids.len(), "ids": ids}).to_string()),
    );
    for prompt in open {
        first.push_back(asked_event(&shared, &signed, prompt, ids.len()));
    }
    struct Feed {
        shared: Shared,
        signed: Signed,
        receiver: broadcast::Receiver<PersonEvent>,
        first: VecDeque<Event>,
    }
    let feed = Feed {
        shared,
        signed,
        receiver,
        first,
    };
    let stream = futures::stream::unfold(feed, |mut feed| async move {
        if let Some(event) = feed.first.pop_front() {
            return Some((Ok(event), feed));
        }
        loop {
            let next = tokio::time::timeout(Duration::from_secs(30), feed.receiver.recv()).await;
            if !feed.shared.console.alive(&feed.signed.key) {
                return None;
            }
            let pending = feed.shared.vessel.person().pending().len();
            let event = match next {
                Err(_) => continue,
                Ok(Ok(PersonEvent::Asked(prompt))) => {
                    asked_event(&feed.shared, &feed.signed, prompt, pending)
                }
                Ok(Ok(PersonEvent::Closed { id })) => Event::default()
                    .event("closed")
                    .data(serde_json::json!({"id": id, "pending": pending}).to_string()),
                // Missed some: the page reloads to catch up.
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    Event::default().event("reload").data("{}")
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
            };
            return Some((Ok(event), feed));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn asked_event(
    shared: &Shared,
    signed: &Signed,
    prompt: crate::person::PendingPrompt,
    pending: usize,
) -> Event {
    let body = crate::bodies::pending_body(prompt);
    let data = serde_json::json!({
        "id": body.id,
        "pending": pending,
        "summary": pages::summary(&body),
        "html": pages::prompt_card(&body, &shared.console.prefix(), &signed.csrf),
    });
    Event::default().event("asked").data(data.to_string())
}

/// A consent answered from its card: pair with the ticked capabilities, or
/// refuse.
async fn answer_pairing(
    State(shared): State<Shared>,
    UrlPath((_, id)): UrlPath<(String, u64)>,
    axum::Extension(signed): axum::Extension<Signed>,
    axum::Extension(form): axum::Extension<Form>,
) -> Response {
    let decision = match form.get("answer") {
        Some("pair") => ConsentDecision {
            approved: true,
            grant: form.all("grant"),
            confirmed_without_code: form.get("without_code") == Some("yes"),
            by: Some(signed.by()),
            confirmed_credential_change: form.get("credential_change") == Some("yes"),
        },
        Some("refuse") => ConsentDecision::refuse().by(signed.by()),
        _ => return refusal_page(StatusCode::BAD_REQUEST, "answer `pair` or `refuse`"),
    };
    match shared.vessel.person().answer_consent(id, decision) {
        Ok(()) => see_other(&format!("{}/", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

/// An approval answered from its card: once, refused, or remembered.
async fn answer_approval(
    State(shared): State<Shared>,
    UrlPath((_, id)): UrlPath<(String, u64)>,
    axum::Extension(signed): axum::Extension<Signed>,
    axum::Extension(form): axum::Extension<Form>,
) -> Response {
    let answer = match form.get("answer") {
        Some("once") => ApprovalAnswer::Once,
        Some("deny") => ApprovalAnswer::Refuse,
        Some("remember") => {
            let scope = match AllowanceScope::parse(form.get("scope").unwrap_or("arguments")) {
                Ok(scope) => scope,
                Err(e) => return refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
            };
            let minutes = match form.get("minutes").map(str::parse::<u64>) {
                None => AllowanceMinutes::default(),
                Some(Ok(minutes)) => match AllowanceMinutes::new(minutes) {
                    Ok(minutes) => minutes,
                    Err(e) => return refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
                },
                Some(Err(_)) => {
                    return refusal_page(StatusCode::BAD_REQUEST, "minutes must be a number");
                }
            };
            ApprovalAnswer::Remember(Remember { scope, minutes })
        }
        _ => {
            return refusal_page(
                StatusCode::BAD_REQUEST,
                "answer `once`, `deny` or `remember`",
            );
        }
    };
    match shared
        .vessel
        .person()
        .answer_approval_by(id, answer, Some(signed.by()))
    {
        Ok(_) => see_other(&format!("{}/", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::CONFLICT, &e.to_string()),
    }
}

async fn devices_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Devices);
    let devices = crate::bodies::device_list(&shared.vessel);
    html(StatusCode::OK, pages::devices(&frame, &devices))
}

async fn device_page(
    State(shared): State<Shared>,
    UrlPath((_, id)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Devices);
    let Some(device) = crate::bodies::device_one(&shared.vessel, &id) else {
        return refusal_page(StatusCode::NOT_FOUND, "no paired device has that id");
    };
    let mut query = AuditQuery::newest(10);
    query.device_id = Some(id.clone());
    let activity = read_audit(&shared, query).await.unwrap_or_default();
    let events = shared.console.recent_events(&id);
    html(
        StatusCode::OK,
        pages::device(&frame, &device, &events, &activity),
    )
}

async fn read_audit(shared: &Shared, query: AuditQuery) -> Result<Vec<AuditEntry>, String> {
    let store = Arc::clone(shared.vessel.registry().store());
    tokio::task::spawn_blocking(move || store.query_audit(&query))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

async fn set_grant(
    State(shared): State<Shared>,
    UrlPath((_, id, capability)): UrlPath<(String, String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
    axum::Extension(form): axum::Extension<Form>,
) -> Response {
    let registry = shared.vessel.registry();
    let by = signed.by();
    let done = match form.get("allow") {
        Some("yes") => registry
            .grant_by(&id, &capability, Some(&by))
            .map_err(|e| e.to_string()),
        Some("no") => registry
            .revoke_by(&id, &capability, Some(&by))
            .map_err(|e| e.to_string()),
        _ => Err("say `allow=yes` or `allow=no`".to_owned()),
    };
    match done {
        Ok(()) => see_other(&format!(
            "{}/devices/{}",
            shared.console.prefix(),
            html::segment(&id)
        )),
        Err(why) => refusal_page(StatusCode::BAD_REQUEST, &why),
    }
}

async fn unpair(
    State(shared): State<Shared>,
    UrlPath((_, id)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    match shared.vessel.registry().unpair_by(&id, Some(&signed.by())) {
        Ok(()) => see_other(&format!("{}/devices", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

/// Every agent as the pages show it (never a credential).
fn agent_list(shared: &Shared) -> Vec<api::Agent> {
    let agents = shared.vessel.agents().list();
    agents.iter().map(crate::bodies::agent_body).collect()
}

async fn agents_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Agents);
    let agents = agent_list(&shared);
    html(StatusCode::OK, pages::agents(&frame, &agents, None))
}

/// The scope a form's text names: items separated by commas or spaces.
fn scope_items(text: &str) -> Vec<String> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn add_agent(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
    axum::Extension(form): axum::Extension<Form>,
) -> Response {
    let name = form.get("name").unwrap_or("");
    let items = scope_items(form.get("scope").unwrap_or(""));
    let scope = match AgentScope::from_items(items.iter().map(String::as_str)) {
        Ok(scope) => scope,
        Err(e) => return refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let role = match AgentRole::parse(form.get("role").unwrap_or("user")) {
        Some(role) => role,
        None => {
            return refusal_page(StatusCode::BAD_REQUEST, "role must be guest, user or admin");
        }
    };
    match shared
        .vessel
        .add_agent_by(name, scope, role, Some(&signed.by()))
    {
        Ok((name, credential)) => {
            let frame = page(&shared, &signed, Page::Agents);
            let agents = agent_list(&shared);
            let mcp_url = shared
                .console
                .places()
                .mcp_url
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:7779/mcp".to_owned());
            let added = pages::Added {
                name,
                credential: credential.expose().to_owned(),
                mcp_url,
            };
            html(
                StatusCode::CREATED,
                pages::agents(&frame, &agents, Some(&added)),
            )
        }
        Err(e) => refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn set_scope(
    State(shared): State<Shared>,
    UrlPath((_, name)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
    axum::Extension(form): axum::Extension<Form>,
) -> Response {
    let items = scope_items(form.get("scope").unwrap_or(""));
    let scope = match AgentScope::from_items(items.iter().map(String::as_str)) {
        Ok(scope) => scope,
        Err(e) => return refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    match shared
        .vessel
        .set_agent_scope_by(&name, scope, Some(&signed.by()))
    {
        Ok(()) => see_other(&format!("{}/agents", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn remove_agent(
    State(shared): State<Shared>,
    UrlPath((_, name)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    match shared.vessel.remove_agent_by(&name, Some(&signed.by())) {
        Ok(()) => see_other(&format!("{}/agents", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

async fn audit_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
    Query(filter): Query<AuditFilter>,
) -> Response {
    audit_response(&shared, &signed, &filter, None).await
}

async fn audit_response(
    shared: &Shared,
    signed: &Signed,
    filter: &AuditFilter,
    verified: Option<pages::Verified>,
) -> Response {
    let frame = page(shared, signed, Page::Audit);
    let entries = match read_audit(shared, filter.query()).await {
        Ok(entries) => entries,
        Err(why) => return refusal_page(StatusCode::INTERNAL_SERVER_ERROR, &why),
    };
    let store = Arc::clone(shared.vessel.registry().store());
    let head = tokio::task::spawn_blocking(move || store.audit_head())
        .await
        .ok()
        .and_then(Result::ok);
    html(
        StatusCode::OK,
        pages::audit(&frame, filter, &entries, head.as_ref(), verified.as_ref()),
    )
}

/// Verifies the whole chain (and replays it against the state), then shows
/// the newest page with the result.
async fn verify_audit(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let vessel = Arc::clone(&shared.vessel);
    let store = Arc::clone(shared.vessel.registry().store());
    let report = tokio::task::spawn_blocking(move || {
        // What was decided so far is in the log before it is checked.
        let _ = vessel.flush_audit();
        store.verify_audit()
    })
    .await;
    let verified = match report {
        Ok(Ok(report)) => pages::Verified {
            entries: report.entries,
            problems: report.problems.iter().map(ToString::to_string).collect(),
        },
        Ok(Err(e)) => pages::Verified {
            entries: 0,
            problems: vec![e.to_string()],
        },
        Err(e) => pages::Verified {
            entries: 0,
            problems: vec![e.to_string()],
        },
    };
    audit_response(&shared, &signed, &AuditFilter::default(), Some(verified)).await
}

async fn status_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Status);
    let status = crate::bodies::status_body(&shared.vessel);
    html(StatusCode::OK, pages::status(&frame, &status))
}

#[cfg(test)]
mod tests;
