//! What an MCP server may hold, how much it sends at once, and what its
//! listener applies to connections.

use std::time::Duration;

use dk_http::listen::{DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, ListenerLimits};

/// The bounds of an MCP server: how many connections its listener holds
/// and its deadlines, how many sessions an agent and all agents hold, when
/// a result is paged through `read_more`, how long and how much of those
/// results are kept (in all and per agent), and how many device events each
/// event resource keeps. [`McpOptions::default`] is what
/// [`serve_mcp`](crate::serve_mcp) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpOptions {
    /// What the MCP listener (on TCP and on its Unix socket) applies from
    /// `accept` on: at most 2,048 connections at once, 1,024 from one
    /// address, and dk-http's default header-read deadline (10 s) and idle
    /// timeout (60 s). `limits.mcpConnections`,
    /// `limits.mcpConnectionsPerAddress`, `limits.headerReadTimeoutMs` and
    /// `limits.idleTimeoutMs` in `dk vessel`'s configuration file.
    pub listener: ListenerLimits,
    /// The most sessions one agent holds at once (default 64; values below
    /// 1 count as 1). A new one past it ends that agent's own longest
    /// unused session, never another agent's.
    pub sessions_per_agent: usize,
    /// The most sessions all agents hold together (default 1,024; values
    /// below 1 count as 1). A new one past it ends the longest unused
    /// session of the agent holding the most, so an agent with fewer can
    /// always open one.
    pub max_sessions: usize,
    /// A device result whose JSON is longer than this many bytes is not
    /// returned whole: the agent gets the first chunk and a `read_more`
    /// handle. Also the most bytes of the result in one chunk (default
    /// 16 KiB; values below 1 count as 1).
    pub read_more_threshold: usize,
    /// How long a `read_more` handle lasts after its result came back
    /// (default 10 minutes).
    pub read_more_expiry: Duration,
    /// The most bytes of results all `read_more` handles hold together
    /// (default 32 MiB); a new one past it drops the oldest first.
    pub read_more_memory: usize,
    /// The most bytes of results one agent's handles hold (default 8 MiB,
    /// a quarter of the default pool); a new one past it drops that
    /// agent's oldest first. Past [`McpOptions::read_more_memory`], the
    /// agent holding the most bytes loses its oldest, so no agent can push
    /// out the handles of one holding less.
    pub read_more_memory_per_agent: usize,
    /// The most recent events kept per device for its event resource
    /// (default 64).
    pub events_per_device: usize,
    /// The most bytes of event data kept per device (default 64 KiB); an
    /// event larger than this is kept without its data.
    pub event_bytes_per_device: usize,
    /// The shortest time between two `notifications/resources/updated` for
    /// one resource to one client (default 250 ms): events in between are
    /// told as one update.
    pub event_update_interval: Duration,
}

impl Default for McpOptions {
    fn default() -> McpOptions {
        McpOptions {
            listener: ListenerLimits {
                max_connections: 2048,
                max_connections_per_address: 1024,
                header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
            },
            sessions_per_agent: 64,
            max_sessions: 1024,
            read_more_threshold: 16 * 1024,
            read_more_expiry: Duration::from_secs(10 * 60),
            read_more_memory: 32 * 1024 * 1024,
            read_more_memory_per_agent: 8 * 1024 * 1024,
            events_per_device: 64,
            event_bytes_per_device: 64 * 1024,
            event_update_interval: Duration::from_millis(250),
        }
    }
}
