//! The console's handlers: the ways in, the assets, and every page and
//! form.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dk_proto::admin as api;
use serde::Deserialize;

use crate::agents::{AgentRole, AgentScope};
use crate::allowances::{AllowanceMinutes, AllowanceScope, Remember};
use crate::changes::on_blocking_thread;
use crate::person::{AnswerError, ApprovalAnswer};
use crate::registry::ConsentDecision;
use crate::store::{AuditEntry, AuditQuery};

use super::guard::Form;
use super::pages::{AuditFilter, Page};
use super::respond::{Shared, html, refusal_page, see_other};
use super::session::{COOKIE, SESSION_LIFETIME, Signed};
use super::{html, pages};

pub(super) async fn to_landing() -> Response {
    see_other("/console/")
}

/// The sign-in page: nothing but how to sign in, and the script that
/// forwards a browser which signed in before.
pub(super) async fn landing() -> Response {
    html(StatusCode::OK, pages::landing_page())
}

pub(super) async fn to_home(State(shared): State<Shared>) -> Response {
    see_other(&format!("{}/", shared.console.prefix()))
}

pub(super) async fn not_found() -> Response {
    refusal_page(StatusCode::NOT_FOUND, "no such page")
}

pub(super) async fn style() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("assets/console.css"),
    )
}

pub(super) async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/console.js"),
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
pub(super) struct LoginQuery {
    key: Option<String>,
}

/// Exchanges a login link's secret for a session cookie, once.
pub(super) async fn login(
    State(shared): State<Shared>,
    Query(query): Query<LoginQuery>,
) -> Response {
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

pub(super) async fn logout(
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
        microphones: shared.vessel.microphones().list(),
    }
}

/// The person's stop of a device's microphone, from the banner's button:
/// the device's `stop`, called at once. Back to the device's page (the
/// script sends it without leaving the page).
pub(super) async fn stop_microphone(
    State(shared): State<Shared>,
    UrlPath((_, id)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    use crate::microphones::StopError;
    tracing::info!(device = %id, session = %signed.id, "the person stops a microphone from the console");
    match shared.vessel.stop_microphone(&id).await {
        Ok(()) => see_other(&format!(
            "{}/devices/{}",
            shared.console.prefix(),
            html::segment(&id)
        )),
        Err(e @ StopError::NotPaired(_)) => refusal_page(StatusCode::NOT_FOUND, &e.to_string()),
        Err(e @ StopError::NotVoice(_)) => refusal_page(StatusCode::BAD_REQUEST, &e.to_string()),
        Err(e @ StopError::NotConnected(_)) => refusal_page(StatusCode::CONFLICT, &e.to_string()),
        Err(e @ StopError::Failed { .. }) => refusal_page(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

pub(super) async fn prompts_page(
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

/// A consent answered from its card: pair with the ticked capabilities, or
/// refuse.
pub(super) async fn answer_pairing(
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
    match shared
        .vessel
        .person()
        .answer_consent_confirmed(id, decision)
        .await
    {
        Ok(()) => see_other(&format!("{}/", shared.console.prefix())),
        Err(e @ AnswerError::NotTaken(..)) => refusal_page(StatusCode::CONFLICT, &e.to_string()),
        Err(e) => refusal_page(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

/// An approval answered from its card: once, refused, or remembered.
pub(super) async fn answer_approval(
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
        .answer_approval_confirmed(id, answer, Some(signed.by()))
        .await
    {
        Ok(_) => see_other(&format!("{}/", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::CONFLICT, &e.to_string()),
    }
}

pub(super) async fn devices_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Devices);
    let devices = crate::bodies::device_list(&shared.vessel);
    html(StatusCode::OK, pages::devices(&frame, &devices))
}

pub(super) async fn device_page(
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

pub(super) async fn set_grant(
    State(shared): State<Shared>,
    UrlPath((_, id, capability)): UrlPath<(String, String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
    axum::Extension(form): axum::Extension<Form>,
) -> Response {
    let by = signed.by();
    let vessel = Arc::clone(&shared.vessel);
    let (device, cap) = (id.clone(), capability);
    let done = match form.get("allow") {
        Some("yes") => on_blocking_thread(move || {
            vessel
                .registry()
                .grant_by(&device, &cap, Some(&by))
                .map_err(|e| e.to_string())
        })
        .await
        .and_then(|done| done),
        Some("no") => on_blocking_thread(move || {
            vessel
                .registry()
                .revoke_by(&device, &cap, Some(&by))
                .map_err(|e| e.to_string())
        })
        .await
        .and_then(|done| done),
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

pub(super) async fn unpair(
    State(shared): State<Shared>,
    UrlPath((_, id)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let vessel = Arc::clone(&shared.vessel);
    let by = signed.by();
    let unpaired = on_blocking_thread(move || {
        vessel
            .registry()
            .unpair_by(&id, Some(&by))
            .map_err(|e| e.to_string())
    })
    .await
    .and_then(|done| done);
    match unpaired {
        Ok(()) => see_other(&format!("{}/devices", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::NOT_FOUND, &e),
    }
}

/// Every agent as the pages show it (never a credential).
fn agent_list(shared: &Shared) -> Vec<api::Agent> {
    let agents = shared.vessel.agents().list();
    agents.iter().map(crate::bodies::agent_body).collect()
}

pub(super) async fn agents_page(
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

pub(super) async fn add_agent(
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
    let (vessel, name, by) = (Arc::clone(&shared.vessel), name.to_owned(), signed.by());
    let added = on_blocking_thread(move || {
        vessel
            .add_agent_by(&name, scope, role, Some(&by))
            .map_err(|e| e.to_string())
    })
    .await
    .and_then(|added| added);
    match added {
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
        Err(e) => refusal_page(StatusCode::BAD_REQUEST, &e),
    }
}

pub(super) async fn set_scope(
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
    let (vessel, by) = (Arc::clone(&shared.vessel), signed.by());
    let set = on_blocking_thread(move || {
        vessel
            .set_agent_scope_by(&name, scope, Some(&by))
            .map_err(|e| e.to_string())
    })
    .await
    .and_then(|set| set);
    match set {
        Ok(()) => see_other(&format!("{}/agents", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::BAD_REQUEST, &e),
    }
}

pub(super) async fn remove_agent(
    State(shared): State<Shared>,
    UrlPath((_, name)): UrlPath<(String, String)>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let (vessel, by) = (Arc::clone(&shared.vessel), signed.by());
    let removed = on_blocking_thread(move || {
        vessel
            .remove_agent_by(&name, Some(&by))
            .map_err(|e| e.to_string())
    })
    .await
    .and_then(|removed| removed);
    match removed {
        Ok(()) => see_other(&format!("{}/agents", shared.console.prefix())),
        Err(e) => refusal_page(StatusCode::NOT_FOUND, &e),
    }
}

pub(super) async fn audit_page(
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
pub(super) async fn verify_audit(
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

pub(super) async fn status_page(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Response {
    let frame = page(&shared, &signed, Page::Status);
    let status = crate::bodies::status_body(&shared.vessel);
    html(StatusCode::OK, pages::status(&frame, &status))
}
