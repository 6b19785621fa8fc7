//! The vessel's limits: on device connections, pairing, calls, rates and
//! run budgets. `dk vessel`'s flags and its configuration file set them;
//! their defaults are documented in `docs/PROTOCOL.md` and
//! `docs/CONFIG.md`. The caps and deadlines of the listeners are the HTTP
//! layer's (dk-http's `HttpLimits`, dk-mcp's `McpOptions`).

use std::time::Duration;

use crate::adapter::{AgentRateLimits, AgentRunLimits, DEFAULT_CALL_TIMEOUT};
use crate::link::DEFAULT_MAX_PENDING;
use crate::person::DEFAULT_APPROVAL_TIMEOUT;
use crate::registry::DEFAULT_CONSENT_TIMEOUT;
use crate::store::DEFAULT_DURABLE_WITHIN;

/// Limits on device connections. Every one is configurable; the defaults are
/// documented in `docs/PROTOCOL.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame, in bytes.
    pub max_frame_bytes: usize,
    /// Deepest JSON nesting in a frame.
    pub max_depth: usize,
    /// Time a new connection has to send `device:hello` or `device:auth`.
    pub handshake_timeout: Duration,
    /// Calls in flight per device.
    pub max_pending_calls: usize,
    /// Connections at once, authenticated or not.
    pub max_connections: usize,
    /// Connections at once from one remote address, authenticated or not
    /// (generous: many devices may share an address behind a NAT).
    pub max_connections_per_address: usize,
    /// Connections at once from one remote address that have not yet
    /// authenticated (pairing or reconnecting).
    pub max_unauthenticated_per_address: usize,
    /// Malformed frames tolerated on one connection; the next one closes it.
    pub max_malformed_frames: u32,
    /// Frames per second a device may send unasked (a burst of twice this is
    /// allowed); its results to the vessel's pending calls are not counted.
    pub max_frames_per_second: u32,
    /// How often the vessel pings a device; two intervals of silence close it.
    pub ping_interval: Duration,
    /// How long the person has to answer a pairing request.
    pub consent_timeout: Duration,
    /// How long the person has to answer an approval; no answer is a no.
    pub approval_timeout: Duration,
    /// How long a device has to answer a call, unless the caller says
    /// otherwise.
    pub call_timeout: Duration,
    /// How recently the store must have taken the audit log's writes (a
    /// commit, or the audit writer's probe when nothing is committed), and
    /// how old the oldest decision not yet committed may be, for a call to
    /// reach a device; also how long a call waits for the store on its way
    /// to one (a `limit` rule's count, a fleet's rate). A store that took
    /// no write within it refuses calls before the device; one whose
    /// oldest decision waits longer makes calls wait for it to catch up:
    /// at most this much of the calls that reached devices can be lost
    /// with their records. Default 1 s.
    pub durable_within: Duration,
    /// Pairing requests waiting for the person at once, from everyone.
    pub max_pending_pairings: usize,
    /// Pairing requests waiting for the person at once from one address.
    pub max_pending_pairings_per_address: usize,
    /// `device:hello` frames one address may send per minute (a burst of
    /// this many, refilled evenly over the minute).
    pub pairings_per_minute_per_address: u32,
    /// The rate limits each agent's device calls are charged to before the
    /// device is reached (see `docs/POLICY.md`); `None` charges no rate.
    /// Default: on, 300 calls a minute in bursts of 60 per agent, 120 a
    /// minute in bursts of 20 per agent and device.
    pub rate_limits: Option<AgentRateLimits>,
    /// The run budgets of explicit runs (started by the host, or named by an
    /// MCP client in a call's `_meta`), charged before the device is reached
    /// (see `docs/POLICY.md`); `None` charges no run (for a host that
    /// enforces run limits itself). A call that names no run is charged to
    /// none. Default: on, with Prism's limits (32 tool calls, 120 s from a
    /// run's start).
    pub run_limits: Option<AgentRunLimits>,
    /// Where devices may speak plain 8DK v1 (in clear, with a bearer
    /// token). dk/2 is always offered.
    pub plain_v1: PlainV1,
    /// Whether a device that says it has no screen may pair on a listener
    /// that is not loopback, where a relay cannot be excluded. Off by
    /// default.
    pub no_screen_off_loopback: bool,
}

/// Where a vessel accepts 8DK v1 connections, which travel in clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlainV1 {
    /// Nowhere: every device must speak dk/2 (for a vessel behind a
    /// TCP-level proxy, which adds no header to tell it).
    Never,
    /// On a loopback listener, from a peer that no proxy header says is
    /// elsewhere (the default).
    #[default]
    Loopback,
    /// Everywhere, as the person explicitly chose (`--allow-plain-v1`).
    Everywhere,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: dk_proto::MAX_FRAME_BYTES,
            max_depth: dk_proto::MAX_FRAME_DEPTH,
            handshake_timeout: Duration::from_secs(10),
            max_pending_calls: DEFAULT_MAX_PENDING,
            max_connections: 20_000,
            max_connections_per_address: 4096,
            max_unauthenticated_per_address: 32,
            max_malformed_frames: 3,
            max_frames_per_second: 200,
            ping_interval: Duration::from_secs(20),
            consent_timeout: DEFAULT_CONSENT_TIMEOUT,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            durable_within: DEFAULT_DURABLE_WITHIN,
            max_pending_pairings: 16,
            max_pending_pairings_per_address: 4,
            pairings_per_minute_per_address: 10,
            rate_limits: Some(AgentRateLimits::default()),
            run_limits: Some(AgentRunLimits::default()),
            plain_v1: PlainV1::Loopback,
            no_screen_off_loopback: false,
        }
    }
}
