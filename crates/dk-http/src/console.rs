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

mod guard;
mod handlers;
mod html;
mod live;
mod pages;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::broadcast;

use crate::origins::LocalOrigins;
use crate::vessel::Vessel;

use guard::guard;
use handlers::{
    add_agent, agents_page, answer_approval, answer_pairing, audit_page, device_page, devices_page,
    landing, not_found, prompts_page, remove_agent, script, set_grant, set_scope, status_page,
    style, to_home, to_landing, unpair, verify_audit,
};
use live::live;
pub use session::Console;
use session::{login, logout};

/// How long a login link works, unused (15 minutes).
pub const LOGIN_LINK_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// How long a console session lasts from sign-in (12 hours).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

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

#[cfg(test)]
mod tests;
