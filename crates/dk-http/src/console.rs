//! The person's console: web pages served on the admin listener, under
//! a secret path `/console/<secret>/`, for answering pairings and
//! approvals, granting and revoking, managing agents, reading and
//! verifying the audit log; and, on every page while a voice device's
//! microphone is open, a banner saying so with a button that stops it.
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
mod respond;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use tokio::sync::broadcast;

use crate::origins::LocalOrigins;
use crate::vessel::Vessel;

use guard::guard;
use handlers::{
    add_agent, agents_page, answer_approval, answer_pairing, audit_page, device_page, devices_page,
    landing, login, logout, not_found, prompts_page, remove_agent, script, set_grant, set_scope,
    status_page, stop_microphone, style, to_home, to_landing, unpair, verify_audit,
};
use live::live;
use respond::Shared;
pub use session::{Console, LOGIN_LINK_LIFETIME, SESSION_LIFETIME};

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
        .route(
            "/console/{secret}/microphones/{id}/stop",
            post(stop_microphone),
        )
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

#[cfg(test)]
mod tests;
