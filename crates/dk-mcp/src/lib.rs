//! The MCP server: agents that speak the Model Context Protocol list and
//! call the tools of paired devices over streamable HTTP at `/mcp`, with
//! the person still in charge. Every rmcp type stays inside this crate, so
//! an upgrade of rmcp touches nothing else.
//!
//! - **Who.** Every request carries an agent credential
//!   (`Authorization: Bearer dka_...`, see [`AgentDirectory`]); without a
//!   valid one it gets 401 and never reaches MCP. Host and Origin are checked
//!   as the admin API checks them, so a web page cannot call tools.
//! - **Sessions.** Clients of the `initialize` handshake (protocol revisions
//!   up to 2025-11-25) get a stateful session; its `Mcp-Session-Id` is the
//!   `sessionId` of their calls, and it belongs to the agent that opened it:
//!   the guard answers another agent naming it with 404, whatever the
//!   method. Clients of the 2026-07-28 `server/discover` lifecycle are served
//!   one request at a time, without a session: their calls carry no
//!   `sessionId` unless they name a live session the server issued to the
//!   same agent (a made-up one is ignored, never read from the header).
//!   Sessions are kept by `session.rs`, which hands a request straight to
//!   the session's service loop and its answer straight back, by JSON-RPC
//!   id (rmcp's own manager routes both through a worker task per session),
//!   and bounds them per agent (its own longest unused go first) and in all
//!   (the agent holding the most gives one up).
//! - **Tools.** The granted capabilities of paired devices within the
//!   agent's scope and role, with annotations from the approved manifest: a
//!   sensor is read-only and not destructive, an actuator is not read-only,
//!   and a `confirm` capability's description ends by saying the person is
//!   asked every time; and the built-in `read_more`, listed to every agent.
//!   One list sorted by name, so `read_more` comes after the `device__`
//!   tools.
//! - **Calls.** Outside the scope or role: refused before policy with an
//!   `[8dk-deny]` reason, and one decision record. Otherwise the adapter's
//!   seven checks, with the person's channel as the approver (never the
//!   calling client). A refusal is a tool error whose text is the reason; a
//!   result is structured content and the same JSON as text. A call its
//!   client gives up (it cancels it, closes the connection its answer
//!   would come on, or ends its session) is dropped there and then, as the
//!   admin API drops one: a prompt waiting for the person is withdrawn, so
//!   no later yes runs it, and the decision says it was abandoned. Nothing
//!   is ever run again for a client.
//! - **Images** (`image.rs`). A result whose `image` member is exactly
//!   `{"type": "image", "mimeType": "image/png" or "image/jpeg", "data":
//!   base64}`, the data decoding to bytes of that format, comes as MCP image
//!   content, then the result's JSON with the data replaced by `"bytes":
//!   <length>` (also the structured content), so no model reads a picture
//!   as base64 text; only that text is ever paged.
//! - **Oversized results** (`read_more.rs`). A result whose JSON is longer
//!   than [`McpOptions::read_more_threshold`] comes back as
//!   `{truncated, handle, totalBytes, offset, nextOffset, chunk,
//!   expiresInSeconds, note}` with its first chunk; `read_more {handle}`
//!   returns the chunk after the last one served for it, and with an
//!   `offset` the chunk there, cut on character boundaries. A handle
//!   belongs to its MCP session (without one, to its agent), expires, and
//!   goes with its session; handles hold a bounded number of bytes per
//!   agent (its own oldest dropped first) and in all (the agent holding the
//!   most loses its oldest). Misuse is a tool error.
//! - **Events** (`events.rs`). Each paired device the agent sees a tool of
//!   is a resource, `dk://devices/{deviceId}/events`, whose contents are the
//!   device's recent events of capabilities the agent sees, from a ring
//!   bounded in count and bytes that one feed task fills from
//!   [`Vessel::subscribe_events`]. Devices outside the scope are neither
//!   listed nor readable (the same error as a device that does not exist),
//!   and an event's `seq` counts only the events the reading agent sees.
//! - **Changes** (`watch.rs`). One watch per session (or per
//!   `subscriptions/listen`): after a pairing, unpairing, grant, revoke or
//!   scope change, `notifications/tools/list_changed` and
//!   `notifications/resources/list_changed` when the agent's lists differ;
//!   `notifications/resources/updated` for a followed resource when an event
//!   it may see arrives, coalesced to one per resource per interval. Legacy
//!   sessions hear these on their standalone stream and follow resources
//!   with `resources/subscribe`; discover-lifecycle clients name what they
//!   want in `subscriptions/listen`. Every queue is bounded: a watch that
//!   falls behind treats all it follows as updated.

#![forbid(unsafe_code)]

mod audio;
mod events;
mod guard;
mod image;
mod options;
mod read_more;
mod server;
mod session;
mod tools;
mod watch;

#[cfg(test)]
use dk_core::person;
use dk_core::{adapter, agents, link, registry, vessel};
use dk_http::{listen, origins};

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::StreamableHttpService;

use crate::agents::AgentDirectory;
use crate::origins::LocalOrigins;
use crate::vessel::Vessel;
use events::EventLog;
use guard::{Gate, guard};
pub use options::McpOptions;
use read_more::ResultPages;
use server::{DeviceTools, Shared};
use session::Sessions;

/// Largest MCP request body read (1 MiB, the device frame limit).
const MAX_BODY_BYTES: usize = 1 << 20;

/// Ends the event feed when the last clone of the route is dropped.
struct FeedTask(Option<tokio::task::AbortHandle>);

impl Drop for FeedTask {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// The router and a way to end every MCP session at once.
fn build(
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    origins: LocalOrigins,
    options: McpOptions,
) -> (Router, impl FnOnce() + Send + 'static) {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(origins.hosts.clone())
        .with_allowed_origins(origins.origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        // Clients of the 2026-07-28 lifecycle (served without a session)
        // get a plain JSON answer when the handler sends nothing before it,
        // which spares them an event stream per call; rmcp falls back to
        // SSE when the handler does send something first.
        .with_json_response(true);
    let ending = config.cancellation_token.clone();
    let events = Arc::new(EventLog::new(&options));
    // The feed ends when the sessions are ended, or with the route. Outside
    // a Tokio runtime there is no feed, and event resources stay empty.
    let feed = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let stop = ending.clone();
            let task = runtime.spawn(events::feed(
                Arc::clone(&events),
                vessel.subscribe_events(),
                vessel.registry().subscribe(),
                async move { stop.cancelled().await },
            ));
            FeedTask(Some(task.abort_handle()))
        }
        Err(_) => {
            tracing::warn!("no Tokio runtime: MCP event resources will stay empty");
            FeedTask(None)
        }
    };
    let feed = Arc::new(feed);
    let shared = Arc::new(Shared {
        vessel,
        agents: Arc::clone(&agents),
        options,
        pages: ResultPages::new(&options),
        events,
    });
    let factory = move || {
        let _owner = &feed;
        Ok(DeviceTools::new(Arc::clone(&shared)))
    };
    let sessions = Arc::new(Sessions::new(&options));
    let service = StreamableHttpService::new(factory, Arc::clone(&sessions), config);
    let router = Router::new().route_service("/mcp", service);
    let gate = Gate {
        local: Arc::new(origins),
        agents,
        sessions,
    };
    let router = router.layer(from_fn_with_state(gate, guard));
    (router, move || ending.cancel())
}

/// Serves `/mcp` on `listener` with [`McpOptions::default`] until
/// `shutdown` resolves; then every MCP session ends and its streams close.
pub async fn serve_mcp(
    listener: tokio::net::TcpListener,
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_mcp_with(listener, vessel, agents, McpOptions::default(), shutdown).await
}

/// [`serve_mcp`] with `options`.
pub async fn serve_mcp_with(
    listener: tokio::net::TcpListener,
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    options: McpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let limits = options.listener;
    let stats = Arc::clone(&vessel.stats().mcp_listener);
    let (router, end_sessions) = build(vessel, agents, LocalOrigins::for_listener(local), options);
    // Every accepted connection gets TCP_NODELAY: an answer goes out as
    // several small writes (headers, the event, the end of the stream), and
    // a client that delays its ACK would hold each call up for tens of
    // milliseconds.
    crate::listen::serve_http(listener, router, limits, stats, async move {
        shutdown.await;
        end_sessions();
    })
    .await
}

/// [`serve_mcp_with`] on a Unix socket (made with
/// [`dk_http::bind_private_socket`] in the vessel's 0700 data directory),
/// with `Host: localhost`: how `dk mcp` reaches the vessel it can trust.
pub async fn serve_mcp_unix(
    listener: tokio::net::UnixListener,
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    options: McpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = options.listener;
    let stats = Arc::clone(&vessel.stats().mcp_socket);
    let (router, end_sessions) = build(vessel, agents, LocalOrigins::for_unix_socket(), options);
    crate::listen::serve_http(listener, router, limits, stats, async move {
        shutdown.await;
        end_sessions();
    })
    .await
}

#[cfg(test)]
mod event_tests;
#[cfg(test)]
mod image_tests;
#[cfg(test)]
mod read_more_tests;
#[cfg(test)]
mod tests;
