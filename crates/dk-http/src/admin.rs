//! The person's admin API: list and answer pending consents and approvals,
//! list devices and grants, grant, revoke, unpair, add, list, remove and
//! re-scope agents, list and revoke remembered allowances, read recent
//! decisions, and list and call tools.
//!
//! It listens on loopback by default, and on a Unix socket in the vessel's
//! private data directory (`serve_admin_unix`), the one the person's
//! commands use. Every request needs the admin token as a bearer token, and
//! its `Host` must name this listener (`localhost` on the socket) and its
//! `Origin`, if any, must be this listener's own: a web page open in the
//! person's browser cannot answer a prompt for them. `docs/ADMIN-API.md`
//! lists the routes.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use dk_proto::admin as api;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::adapter::CallContext;
use crate::agents::{AgentError, AgentRole, AgentScope};
use crate::allowances::{AllowanceError, AllowanceMinutes, Remember};
use crate::bodies::{agent_body, device_list, pending_body, status_body};
use crate::by::By;
use crate::changes::on_blocking_thread;
use crate::console::Console;
use crate::listen::HttpLimits;
use crate::origins::LocalOrigins;
use crate::person::{AnswerError, ApprovalAnswer};
use crate::registry::{ConsentDecision, GrantError};
use crate::reload::{ReloadCause, Reloaded};
use crate::unix::{PrivateFileError, read_private_file, write_private_file};
use crate::vessel::Vessel;

mod health;
mod metrics;

pub use metrics::serve_metrics;

pub use health::{ReadinessCheck, readiness_failures};

/// Largest request body the admin API reads (64 KiB).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// The admin token: 64 lower-case hex characters from a CSPRNG. `Debug`
/// does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// A new random token.
    pub fn generate() -> AdminToken {
        AdminToken(dk_files::hex::random(32))
    }

    /// A token from its text, which must be 64 lower-case hex characters.
    pub fn parse(text: &str) -> Option<AdminToken> {
        let text = text.trim();
        (text.len() == 64
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| AdminToken(text.to_owned()))
    }

    /// The token text, to give to the person's tools.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The token's SHA-256: all a store keeps of it.
    pub fn hash(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }

    /// Writes the token to `path`, readable by its owner only (mode 0600):
    /// into a new file of a random name beside it, created exclusively and
    /// never through a link, then renamed over `path`.
    pub fn write_to(&self, path: &Path) -> Result<(), PrivateFileError> {
        write_private_file(path, self.0.as_bytes())
    }

    fn matches(&self, presented: &str) -> bool {
        let expected = Sha256::digest(self.0.as_bytes());
        let presented = Sha256::digest(presented.as_bytes());
        bool::from(expected.ct_eq(&presented))
    }

    /// Reads the token from `path`, which must be a regular file (not a
    /// link) of this user with mode 0600; anything else is refused, not
    /// fixed: a token others could read may have been seen.
    pub fn read_from(path: &Path) -> Result<AdminToken, AdminTokenError> {
        let bytes = read_private_file(path)?;
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(AdminToken::parse)
            .ok_or_else(|| AdminTokenError::NotAToken {
                path: path.to_owned(),
            })
    }

    /// Reads the token from `path` as [`AdminToken::read_from`] does, or,
    /// when there is no file, makes one and writes it there as
    /// [`AdminToken::write_to`] does.
    pub fn load_or_create(path: &Path) -> Result<AdminToken, AdminTokenError> {
        match AdminToken::read_from(path) {
            Err(AdminTokenError::File(e)) if e.is_absent() => {
                let token = AdminToken::generate();
                token.write_to(path)?;
                Ok(token)
            }
            read => read,
        }
    }
}

/// Why an admin token file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminTokenError {
    /// The file is not a private file of this user, or could not be used.
    #[error(transparent)]
    File(#[from] PrivateFileError),
    /// The file is private but holds no admin token.
    #[error("`{}` does not hold an admin token", path.display())]
    NotAToken {
        /// The file.
        path: std::path::PathBuf,
    },
}

#[derive(Clone)]
struct Admin {
    vessel: Arc<Vessel>,
    token: AdminToken,
    local: Arc<LocalOrigins>,
    console: Arc<Console>,
}

/// The admin API for `vessel`, for a listener bound to `local`, with the
/// person's console beside it (its own guard: a session, not the token).
pub(crate) fn admin_router(
    vessel: Arc<Vessel>,
    token: AdminToken,
    console: Arc<Console>,
    local: SocketAddr,
) -> Router {
    let pages = crate::console::console_router(Arc::clone(&vessel), Arc::clone(&console), local);
    router(vessel, token, console, LocalOrigins::for_listener(local)).merge(pages)
}

/// The admin API for `vessel`, accepting the `Host` and `Origin`s of
/// `local`.
fn router(
    vessel: Arc<Vessel>,
    token: AdminToken,
    console: Arc<Console>,
    local: LocalOrigins,
) -> Router {
    let admin = Admin {
        vessel: Arc::clone(&vessel),
        token,
        local: Arc::new(local),
        console,
    };
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/rules", get(rules))
        .route("/v1/rules/reload", post(reload_rules))
        .route("/v1/pending", get(pending))
        .route("/v1/pending/{id}/consent", post(answer_consent))
        .route("/v1/pending/{id}/approval", post(answer_approval))
        .route("/v1/approvals/remembered", get(remembered))
        .route(
            "/v1/approvals/remembered/{id}",
            get(remembered_one).delete(forget_remembered),
        )
        .route("/v1/devices", get(devices))
        .route("/v1/devices/{id}", axum::routing::delete(unpair))
        .route("/v1/devices/{id}/stop", post(stop_device))
        .route(
            "/v1/devices/{id}/grants/{capability}",
            put(grant).delete(revoke),
        )
        .route("/v1/agents", get(agents).post(add_agent))
        .route("/v1/agents/{name}", axum::routing::delete(remove_agent))
        .route("/v1/agents/{name}/scope", put(set_agent_scope))
        .route("/v1/decisions", get(decisions))
        .route("/v1/streams/{id}", get(watch_stream))
        .route("/v1/tools", get(tools))
        .route("/v1/tools/call", post(call_tool))
        .route("/v1/console/link", post(console_link))
        .route("/metrics", get(metrics))
        .layer(from_fn_with_state(admin.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(admin)
        .merge(health::routes(vessel))
}

/// Serves the admin API and the person's console (`/console/`) on
/// `listener` with [`HttpLimits::default`] until `shutdown` resolves. From
/// here on `console` makes login links to this listener.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    vessel: Arc<Vessel>,
    token: AdminToken,
    console: Arc<Console>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_admin_with(
        listener,
        vessel,
        token,
        console,
        HttpLimits::default(),
        shutdown,
    )
    .await
}

/// [`serve_admin`] with `limits`: connections are counted and capped from
/// `accept` ([`HttpLimits::admin_connections`]), a request's headers have a
/// deadline and an idle connection is closed.
pub async fn serve_admin_with(
    listener: tokio::net::TcpListener,
    vessel: Arc<Vessel>,
    token: AdminToken,
    console: Arc<Console>,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let limits = limits.admin_listener();
    let stats = Arc::clone(&vessel.stats().admin_listener);
    let app = admin_router(vessel, token, console, local);
    crate::listen::serve_http(listener, app, limits, stats, shutdown).await
}

/// Serves the admin API on a Unix socket with [`HttpLimits::default`]
/// until `shutdown` resolves: the same routes and token check as
/// [`serve_admin`], with `Host: localhost`, and no console pages (`POST
/// /v1/console/link` makes a link to the console the TCP listener serves).
/// Bind it with [`crate::bind_private_socket`] in the vessel's 0700 data
/// directory: only the vessel's own user can then make or reach it, so a
/// client that checked the socket is its own knows whom it gives the token.
pub async fn serve_admin_unix(
    listener: tokio::net::UnixListener,
    vessel: Arc<Vessel>,
    token: AdminToken,
    console: Arc<Console>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_admin_unix_with(
        listener,
        vessel,
        token,
        console,
        HttpLimits::default(),
        shutdown,
    )
    .await
}

/// [`serve_admin_unix`] with `limits` (the admin API's caps and the
/// deadlines, as on TCP).
pub async fn serve_admin_unix_with(
    listener: tokio::net::UnixListener,
    vessel: Arc<Vessel>,
    token: AdminToken,
    console: Arc<Console>,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = limits.admin_listener();
    let stats = Arc::clone(&vessel.stats().admin_socket);
    let app = router(vessel, token, console, LocalOrigins::for_unix_socket());
    crate::listen::serve_http(listener, app, limits, stats, shutdown).await
}

/// An error answer: `{"error": "..."}` with a status.
fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    let body = api::ErrorBody {
        error: message.into(),
    };
    (status, Json(body)).into_response()
}

/// Token, Host and Origin, before anything else.
async fn guard(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if let Some(why) = admin.local.refusal(headers) {
        return refuse(StatusCode::FORBIDDEN, why);
    }
    let presented = header_text(headers, header::AUTHORIZATION.as_str())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !admin.token.matches(presented) {
        return refuse(StatusCode::UNAUTHORIZED, "a valid admin token is required");
    }
    next.run(request).await
}

fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn status(State(admin): State<Admin>) -> Json<api::Status> {
    Json(status_body(&admin.vessel))
}

/// The rules in force: `{"file", "sha256", "rules"}`.
async fn rules(State(admin): State<Admin>) -> Response {
    Json(admin.vessel.rules_in_force()).into_response()
}

/// Reads the rule file again: 200 `{"reloaded": true, "file", "sha256",
/// "rules"}` when its rules are in force; 422 `{"reloaded": false,
/// "errors", "inForce"}` when it is refused (the rules in force stay);
/// 409 when the vessel's rules came from no file. Recorded either way.
async fn reload_rules(State(admin): State<Admin>) -> Response {
    let vessel = Arc::clone(&admin.vessel);
    let reloaded = tokio::task::spawn_blocking(move || {
        let outcome = vessel.reload_rules(ReloadCause::AdminApi);
        (outcome, vessel.rules_in_force())
    })
    .await;
    match reloaded {
        Ok((Some(Reloaded::Applied { .. } | Reloaded::Unchanged), now)) => {
            Json(api::RulesReloaded {
                reloaded: true,
                file: now.file,
                sha256: now.sha256,
                rules: now.rules,
            })
            .into_response()
        }
        Ok((Some(Reloaded::Refused { errors }), now)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(api::RulesRefused {
                reloaded: false,
                errors: errors.lines().map(str::to_owned).collect(),
                in_force: api::RulesInForce {
                    file: now.file,
                    sha256: now.sha256,
                    rules: now.rules,
                },
            }),
        )
            .into_response(),
        Ok((None, _)) => refuse(
            StatusCode::CONFLICT,
            "the vessel's rules come from no file (start it with --policies FILE)",
        ),
        Err(_) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the reload did not finish",
        ),
    }
}

/// A fresh one-time login link to the console: `{"url": ...}`, or 409
/// when the admin API does not listen on TCP (no console is served).
async fn console_link(State(admin): State<Admin>) -> Response {
    match admin.console.login_link() {
        Some(url) => Json(api::LoginLink { url }).into_response(),
        None => refuse(
            StatusCode::CONFLICT,
            "the console is served on the admin API's TCP listener, and this vessel has none",
        ),
    }
}

async fn pending(State(admin): State<Admin>) -> Json<Vec<api::Pending>> {
    let pending = admin.vessel.person().pending();
    Json(pending.into_iter().map(pending_body).collect())
}

async fn answer_consent(
    State(admin): State<Admin>,
    UrlPath(id): UrlPath<u64>,
    Json(answer): Json<api::ConsentAnswer>,
) -> Response {
    let decision = ConsentDecision {
        approved: answer.approved,
        grant: answer.grant,
        confirmed_without_code: answer.confirm_without_code,
        by: Some(By::admin_api()),
        confirmed_credential_change: answer.confirm_credential_change,
    };
    match admin
        .vessel
        .person()
        .answer_consent_confirmed(id, decision)
        .await
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e @ AnswerError::NotTaken(..)) => refuse(StatusCode::CONFLICT, e.to_string()),
        Err(e) => refuse(StatusCode::NOT_FOUND, e.to_string()),
    }
}

/// The answer a body gives, or why it gives none.
fn approval_answer(body: api::ApprovalAnswer) -> Result<ApprovalAnswer, String> {
    match (body.approved, body.remember) {
        (false, Some(_)) => {
            Err("a refusal is not remembered: `remember` goes with `\"approved\": true`".to_owned())
        }
        (false, None) => Ok(ApprovalAnswer::Refuse),
        (true, None) => Ok(ApprovalAnswer::Once),
        (true, Some(remember)) => {
            let scope = remember.scope.known().map_err(|e| e.to_string())?;
            let minutes = match remember.minutes {
                Some(minutes) => AllowanceMinutes::new(minutes).map_err(|e| e.to_string())?,
                None => AllowanceMinutes::default(),
            };
            Ok(ApprovalAnswer::Remember(Remember { scope, minutes }))
        }
    }
}

/// Answers an approval: 204 for a yes once or a no, 201 with the allowance
/// for a yes remembered.
async fn answer_approval(
    State(admin): State<Admin>,
    UrlPath(id): UrlPath<u64>,
    Json(body): Json<api::ApprovalAnswer>,
) -> Response {
    let answer = match approval_answer(body) {
        Ok(answer) => answer,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, why),
    };
    match admin
        .vessel
        .person()
        .answer_approval_confirmed(id, answer, Some(By::admin_api()))
        .await
    {
        Ok(None) => StatusCode::NO_CONTENT.into_response(),
        Ok(Some(allowance)) => (StatusCode::CREATED, Json(allowance)).into_response(),
        Err(e @ (AnswerError::NotFound(_) | AnswerError::WrongKind(..))) => {
            refuse(StatusCode::NOT_FOUND, e.to_string())
        }
        Err(
            e @ (AnswerError::NotRememberable(_)
            | AnswerError::NotRemembered(..)
            | AnswerError::NotTaken(..)),
        ) => refuse(StatusCode::CONFLICT, e.to_string()),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn remembered(State(admin): State<Admin>) -> Json<Vec<api::Allowance>> {
    let list = admin.vessel.registry().allowances().list();
    Json(list)
}

async fn remembered_one(State(admin): State<Admin>, UrlPath(id): UrlPath<u64>) -> Response {
    match admin.vessel.registry().allowances().get(id) {
        Some(allowance) => Json(allowance).into_response(),
        None => refuse(
            StatusCode::NOT_FOUND,
            AllowanceError::NotFound(id).to_string(),
        ),
    }
}

async fn forget_remembered(State(admin): State<Admin>, UrlPath(id): UrlPath<u64>) -> Response {
    match admin.vessel.registry().allowances().revoke(id) {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refuse(StatusCode::NOT_FOUND, e.to_string()),
    }
}

/// Most chunks one `GET /v1/streams/{id}` returns.
const MAX_WATCHED_CHUNKS: usize = 1000;
/// Longest one `GET /v1/streams/{id}` waits, in milliseconds.
const MAX_WATCH_MS: u64 = 60_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "camelCase")]
struct WatchQuery {
    /// Chunks to wait for (default 10, at most [`MAX_WATCHED_CHUNKS`]).
    max: Option<usize>,
    /// How long to wait for them (default 5,000, at most [`MAX_WATCH_MS`]).
    wait_ms: Option<u64>,
}

/// Watches a device's stream: subscribes, waits for `max` chunks or
/// `waitMs`, and answers their metadata (through the vessel's redactor,
/// never the bytes) and how many this watch lost for being slow.
async fn watch_stream(
    State(admin): State<Admin>,
    UrlPath(id): UrlPath<String>,
    axum::extract::Query(query): axum::extract::Query<WatchQuery>,
) -> Json<api::StreamChunks> {
    let max = query.max.unwrap_or(10).clamp(1, MAX_WATCHED_CHUNKS);
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(5_000).min(MAX_WATCH_MS));
    let mut subscription = admin.vessel.subscribe_stream(&id);
    let mut chunks = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while chunks.len() < max {
        match tokio::time::timeout_at(deadline, subscription.recv()).await {
            Ok(Some(event)) => chunks.push(admin.vessel.stream_metadata(&event)),
            Ok(None) | Err(_) => break,
        }
    }
    Json(api::StreamChunks {
        device_id: id,
        chunks,
        lost: subscription.lost(),
    })
}

async fn devices(State(admin): State<Admin>) -> Json<Vec<api::Device>> {
    Json(device_list(&admin.vessel))
}

async fn grant(
    State(admin): State<Admin>,
    UrlPath((id, capability)): UrlPath<(String, String)>,
) -> Response {
    let vessel = Arc::clone(&admin.vessel);
    let granted = on_blocking_thread(move || {
        vessel
            .registry()
            .grant_by(&id, &capability, Some(&By::admin_api()))
    })
    .await;
    match granted {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e @ GrantError::NotPaired(_))) => refuse(StatusCode::NOT_FOUND, e.to_string()),
        Ok(Err(e @ GrantError::NotStored(_))) => {
            refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
        Ok(Err(e)) => refuse(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn revoke(
    State(admin): State<Admin>,
    UrlPath((id, capability)): UrlPath<(String, String)>,
) -> Response {
    let vessel = Arc::clone(&admin.vessel);
    let revoked = on_blocking_thread(move || {
        vessel
            .registry()
            .revoke_by(&id, &capability, Some(&By::admin_api()))
    })
    .await;
    match revoked {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn unpair(State(admin): State<Admin>, UrlPath(id): UrlPath<String>) -> Response {
    let vessel = Arc::clone(&admin.vessel);
    let unpaired =
        on_blocking_thread(move || vessel.registry().unpair_by(&id, Some(&By::admin_api()))).await;
    match unpaired {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The person's stop of a voice device (`POST /v1/devices/{id}/stop`):
/// its microphone closed and its speaker silenced at once.
async fn stop_device(State(admin): State<Admin>, UrlPath(id): UrlPath<String>) -> Response {
    use crate::microphones::StopError;
    tracing::info!(device = %id, "the person stops a device through the admin API");
    match admin.vessel.stop_microphone(&id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e @ StopError::NotPaired(_)) => refuse(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ StopError::NotVoice(_)) => refuse(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ StopError::NotConnected(_)) => refuse(StatusCode::CONFLICT, e.to_string()),
        Err(e @ StopError::Failed { .. }) => refuse(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

fn agent_refusal(error: &AgentError) -> Response {
    let status = match error {
        AgentError::BadName(_) => StatusCode::BAD_REQUEST,
        AgentError::Exists(_) => StatusCode::CONFLICT,
        AgentError::NotFound(_) => StatusCode::NOT_FOUND,
        AgentError::BadHash(_) | AgentError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(status, error.to_string())
}

fn scope_of(items: &[String]) -> Result<AgentScope, String> {
    AgentScope::from_items(items.iter().map(String::as_str)).map_err(|e| e.to_string())
}

async fn agents(State(admin): State<Admin>) -> Json<Vec<api::Agent>> {
    Json(
        admin
            .vessel
            .agents()
            .list()
            .iter()
            .map(agent_body)
            .collect(),
    )
}

async fn add_agent(State(admin): State<Admin>, Json(new): Json<api::NewAgent>) -> Response {
    let scope = match scope_of(&new.scope) {
        Ok(scope) => scope,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let role = match new.role.map(api::Named::known) {
        None => AgentRole::User,
        Some(Ok(role)) => role,
        Some(Err(unknown)) => return refuse(StatusCode::BAD_REQUEST, unknown.to_string()),
    };
    let vessel = Arc::clone(&admin.vessel);
    let added = on_blocking_thread(move || {
        vessel.add_agent_by(&new.name, scope, role, Some(&By::admin_api()))
    })
    .await;
    let added = match added {
        Ok(added) => added,
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    match added {
        Ok((name, credential)) => (
            StatusCode::CREATED,
            Json(api::AddedAgent {
                name,
                credential: credential.expose().to_owned(),
            }),
        )
            .into_response(),
        Err(e) => agent_refusal(&e),
    }
}

async fn remove_agent(State(admin): State<Admin>, UrlPath(name): UrlPath<String>) -> Response {
    let vessel = Arc::clone(&admin.vessel);
    let removed =
        on_blocking_thread(move || vessel.remove_agent_by(&name, Some(&By::admin_api()))).await;
    match removed {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => agent_refusal(&e),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn set_agent_scope(
    State(admin): State<Admin>,
    UrlPath(name): UrlPath<String>,
    Json(new): Json<api::NewScope>,
) -> Response {
    let scope = match scope_of(&new.scope) {
        Ok(scope) => scope,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    let vessel = Arc::clone(&admin.vessel);
    let set =
        on_blocking_thread(move || vessel.set_agent_scope_by(&name, scope, Some(&By::admin_api())))
            .await;
    match set {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => agent_refusal(&e),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// The vessel's metrics in Prometheus' text format (`admin/metrics.rs`).
async fn metrics(State(admin): State<Admin>) -> Response {
    metrics::answer(&admin.vessel)
}

async fn decisions(State(admin): State<Admin>) -> Json<Vec<Value>> {
    Json(admin.vessel.recent_decisions())
}

async fn tools(State(admin): State<Admin>) -> Json<Vec<dk_core::adapter::ToolDefinition>> {
    Json(admin.vessel.adapter().tool_definitions())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ToolCall {
    tool: String,
    #[serde(default)]
    input: Value,
    /// Refused: a call through the admin API is the person's own.
    agent_id: Option<Value>,
    /// Refused, like `agentId`.
    session_id: Option<Value>,
    timeout_ms: Option<u64>,
}

/// A tool call made by the person through the admin API: recorded as the
/// person's (`caller: "person"`), never as an agent's. Naming an agent or a
/// session is refused, since it would put the person's call under an
/// agent's name without that agent's scope (agents call over MCP).
async fn call_tool(State(admin): State<Admin>, Json(call): Json<ToolCall>) -> Response {
    if call.agent_id.is_some() || call.session_id.is_some() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "a call through the admin API is the person's own: agentId and sessionId are not taken (an agent calls over MCP, with its own credential and scope)",
        );
    }
    let vessel = &admin.vessel;
    let ctx = CallContext {
        approver: Some(vessel.person().as_ref()),
        timeout: call.timeout_ms.map(Duration::from_millis),
        by_person: true,
        ..CallContext::default()
    };
    let outcome = vessel.adapter().execute(&call.tool, call.input, ctx).await;
    Json(outcome).into_response()
}

#[cfg(test)]
mod tests;
