//! The MCP server: agents that speak the Model Context Protocol list and
//! call the tools of paired devices over streamable HTTP at `/mcp`, with
//! the person still in charge. Every rmcp type stays inside this module, so
//! an upgrade of rmcp touches nothing else.
//!
//! - **Who.** Every request carries an agent credential
//!   (`Authorization: Bearer dka_...`, see [`AgentDirectory`]); without a
//!   valid one it gets 401 and never reaches MCP. Host and Origin are checked
//!   as the admin API checks them, so a web page cannot call tools.
//! - **Sessions.** Clients of the `initialize` handshake (protocol revisions
//!   up to 2025-11-25) get a stateful session; its `Mcp-Session-Id` is the
//!   `sessionId` of their calls, and it belongs to the agent that opened it.
//!   Clients of the 2026-07-28 `server/discover` lifecycle are served one
//!   request at a time, without a session: their calls carry no `sessionId`.
//! - **Tools.** The granted capabilities of paired devices within the
//!   agent's scope and role, sorted, with annotations from the approved
//!   manifest: a sensor is read-only and not destructive, an actuator is not
//!   read-only, and a `confirm` capability's description ends by saying the
//!   person is asked every time.
//! - **Calls.** Outside the scope or role: refused before policy with an
//!   `[8dk-deny]` reason, and one decision record. Otherwise the adapter's
//!   seven checks, with the person's channel as the approver (never the
//!   calling client). A refusal is a tool error whose text is the reason; a
//!   result is structured content and the same JSON as text.
//! - **Changes.** After a pairing, unpairing, grant, revoke or scope change,
//!   each connected session whose visible list changed is sent
//!   `notifications/tools/list_changed` (legacy sessions on their standalone
//!   stream, discover-lifecycle clients on `subscriptions/listen`).

mod guard;
mod server;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::serve::ListenerExt;
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::agents::AgentDirectory;
use crate::vessel::Vessel;
use guard::{Gate, LocalOrigins, guard};
use server::DeviceTools;

/// Largest MCP request body read (1 MiB, the device frame limit).
const MAX_BODY_BYTES: usize = 1 << 20;

/// The router and a way to end every MCP session at once.
fn build(
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    local: SocketAddr,
) -> (Router, impl FnOnce() + Send + 'static) {
    let origins = LocalOrigins::for_listener(local);
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(origins.hosts.clone())
        .with_allowed_origins(origins.origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_BODY_BYTES);
    let ending = config.cancellation_token.clone();
    let factory_agents = Arc::clone(&agents);
    let service = StreamableHttpService::new(
        move || {
            Ok(DeviceTools::new(
                Arc::clone(&vessel),
                Arc::clone(&factory_agents),
            ))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let gate = Gate {
        local: Arc::new(origins),
        agents,
    };
    let router = Router::new()
        .route_service("/mcp", service)
        .layer(from_fn_with_state(gate, guard));
    (router, move || ending.cancel())
}

/// The `/mcp` route for a listener bound to `local`, for embedding in a
/// larger app. Its sessions last until their clients end them or fall idle;
/// [`serve_mcp`] also ends them when it stops.
pub fn mcp_router(vessel: Arc<Vessel>, agents: Arc<AgentDirectory>, local: SocketAddr) -> Router {
    build(vessel, agents, local).0
}

/// Serves `/mcp` on `listener` until `shutdown` resolves; then every MCP
/// session ends and its streams close.
pub async fn serve_mcp(
    listener: tokio::net::TcpListener,
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let (router, end_sessions) = build(vessel, agents, local);
    // An answer goes out as several small writes (headers, the event, the
    // end of the stream): without TCP_NODELAY a client that delays its ACK
    // holds each call up for tens of milliseconds.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            end_sessions();
        })
        .await
}

#[cfg(test)]
mod tests;
