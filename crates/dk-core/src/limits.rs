//! The vessel's limits: on device connections, pairing, calls, rates, run
//! budgets and each listener's caps and deadlines. `dk vessel`'s flags and
//! its configuration file set them; their defaults are documented in
//! `docs/PROTOCOL.md` and `docs/CONFIG.md`.

use std::time::Duration;

use crate::adapter::{AgentRateLimits, AgentRunLimits, DEFAULT_CALL_TIMEOUT};
use crate::link::DEFAULT_MAX_PENDING;
use crate::listener::ListenerLimits;
use crate::person::DEFAULT_APPROVAL_TIMEOUT;
use crate::registry::DEFAULT_CONSENT_TIMEOUT;

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
    /// How long a request's headers may take to arrive in full, on every
    /// listener (devices, admin API, MCP): from `accept` for a connection's
    /// first request, from its first byte for the next ones.
    pub header_read_timeout: Duration,
    /// How long a connection on any listener may move no byte while no
    /// request on it is being answered.
    pub idle_timeout: Duration,
    /// Connections the admin API's TCP listener holds at once, in total and
    /// from one address, counted from `accept`.
    pub admin_connections: ConnectionCaps,
    /// Connections the MCP listener holds at once, in total and from one
    /// address, counted from `accept`.
    pub mcp_connections: ConnectionCaps,
    /// `Origin` values allowed on a `/device` upgrade. Native devices send
    /// none; a request that carries one not listed here (a web page acting
    /// as a device) is refused. Empty by default.
    pub device_origins: Vec<String>,
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

/// Caps on the connections one listener holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// In total.
    pub total: usize,
    /// From one remote address.
    pub per_address: usize,
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
            max_pending_pairings: 16,
            max_pending_pairings_per_address: 4,
            pairings_per_minute_per_address: 10,
            rate_limits: Some(AgentRateLimits::default()),
            run_limits: Some(AgentRunLimits::default()),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            admin_connections: ConnectionCaps {
                total: 512,
                per_address: 128,
            },
            mcp_connections: ConnectionCaps {
                total: 2048,
                per_address: 1024,
            },
            device_origins: Vec::new(),
            plain_v1: PlainV1::Loopback,
            no_screen_off_loopback: false,
        }
    }
}

impl Limits {
    /// What the `/device` listener applies from `accept` on: the
    /// connection caps, the header-read deadline and the idle timeout.
    pub fn device_listener(&self) -> ListenerLimits {
        self.listener(ConnectionCaps {
            total: self.max_connections,
            per_address: self.max_connections_per_address,
        })
    }

    /// What the admin API's listener applies from `accept` on.
    pub fn admin_listener(&self) -> ListenerLimits {
        self.listener(self.admin_connections)
    }

    /// What the MCP listener applies from `accept` on.
    pub fn mcp_listener(&self) -> ListenerLimits {
        self.listener(self.mcp_connections)
    }

    fn listener(&self, caps: ConnectionCaps) -> ListenerLimits {
        ListenerLimits {
            max_connections: caps.total,
            max_connections_per_address: caps.per_address,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}
