//! What every `/mcp` request passes before rmcp sees it: its `Host` must
//! name this listener on loopback (or its own address), its `Origin`, if
//! any, must be the listener's own (a web page open in the person's browser
//! cannot call tools), and it must carry an agent credential as a bearer
//! token. The Host/Origin rule is the admin API's (`origins.rs`). Then,
//! whatever the method, a session it names must be that agent's own:
//! another agent's is answered as one that does not exist. The session a
//! request is served in is the one found here, never the header as sent.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::session::{OPENER, Sessions};
use crate::agents::{Agent, AgentDirectory};
use crate::origins::{LocalOrigins, header_text};

/// The header that carries the MCP session id on every request after
/// `initialize`.
const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");

/// The agent a request authenticated as, put in the request's extensions
/// by [`guard`] for the MCP handler to read.
#[derive(Debug, Clone)]
pub(crate) struct Authenticated(pub(crate) Agent);

/// A live session the server issued to the request's agent, named by the
/// request: put in the request's extensions by [`guard`], and the only
/// source of a request's session id.
#[derive(Debug, Clone)]
pub(crate) struct IssuedSession(pub(crate) String);

/// The guard's state.
#[derive(Clone)]
pub(crate) struct Gate {
    pub(crate) local: Arc<LocalOrigins>,
    pub(crate) agents: Arc<AgentDirectory>,
    pub(crate) sessions: Arc<Sessions>,
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let body = dk_proto::admin::ErrorBody {
        error: message.to_owned(),
    };
    (status, Json(body)).into_response()
}

/// Host, Origin and the agent's credential, before anything else. A request
/// without a valid credential gets 401 and never reaches MCP: no session,
/// no tool list. A request naming another agent's session gets 404, for
/// every method (a `GET` would hear its notifications, a `DELETE` end it).
/// A request naming a session that is not live goes on without one: rmcp
/// answers 404 to a request that needs it, and a request served without a
/// session (the 2026-07-28 lifecycle) is served as one that named none.
pub(crate) async fn guard(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    if let Some(why) = gate.local.refusal(request.headers()) {
        return refuse(StatusCode::FORBIDDEN, why);
    }
    let presented = header_text(request.headers(), header::AUTHORIZATION)
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let Some(agent) = gate.agents.authenticate(presented.trim()) else {
        let mut response = refuse(
            StatusCode::UNAUTHORIZED,
            "a valid agent credential is required (Authorization: Bearer dka_...)",
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"dk\""),
        );
        return response;
    };
    let named = header_text(request.headers(), SESSION_HEADER).map(str::to_owned);
    if let Some(id) = named {
        match gate.sessions.owner(&id) {
            Some(owner) if owner == agent.id => {
                request.extensions_mut().insert(IssuedSession(id));
            }
            Some(_) => return refuse(StatusCode::NOT_FOUND, "no such MCP session"),
            None => {}
        }
    }
    let opener = agent.id.clone();
    request.extensions_mut().insert(Authenticated(agent));
    let ending_session = request.method() == Method::DELETE;
    let mut response = OPENER.scope(opener, next.run(request)).await;
    // rmcp accepts a session's end with 202; clients (the official Python
    // one among them) take 200 or 204 as done and warn about anything else.
    if ending_session && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}
