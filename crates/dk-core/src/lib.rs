//! The dk vessel's core: the registry of paired devices and their grants,
//! the tool adapter and its ordered checks, device links and call
//! correlation, the device connection's logic, the person channel, agents,
//! remembered allowances, streams, redaction, configuration and the
//! [`Vessel`] state that holds them. It has no HTTP, SQL or MCP dependency:
//! the store comes in as a [`store::Store`], the listeners and the MCP
//! server are other crates'.
//!
//! No input from a device, an agent or a person can make this crate panic:
//! every frame, manifest, tool name and input is parsed into a typed value
//! or refused with a reason.

#![forbid(unsafe_code)]

pub mod adapter;
pub mod agents;
pub mod allowances;
pub mod config;
pub mod connection;
pub mod link;
pub mod listener;
pub mod person;
pub mod redact;
pub mod registry;
pub mod reload;
pub mod stream;
pub mod vessel;

pub use dk_store as store;

pub use adapter::{
    AgentGate, AgentRateLimits, AgentRunLimits, AllowanceUse, Approval, ApprovalRequest, Approver,
    ApproverFn, CallContext, DEFAULT_AGENT_RATE, DEFAULT_CALL_TIMEOUT, DEFAULT_DEVICE_RATE,
    DEFAULT_MAX_TRACKED_BUCKETS, DEFAULT_MAX_TRACKED_RUNS, DEFAULT_RUN_IDLE_EXPIRY, DecisionHook,
    DecisionRecord, DeviceToolAdapter, RateLimit, RunClock, RunRef, ToolDefinition, ToolOutcome,
};
pub use agents::{
    AGENT_CREDENTIAL_PREFIX, Agent, AgentAuditHook, AgentCredential, AgentDirectory, AgentError,
    AgentEvent, AgentId, AgentRole, AgentScope, CapabilityScope, MAX_AGENT_NAME, ScopeError,
    StoredAgent,
};
pub use allowances::{
    Allowance, AllowanceClock, AllowanceError, AllowanceMinutes, AllowanceOffer, AllowanceScope,
    Allowances, DEFAULT_ALLOWANCE_MINUTES, MAX_ALLOWANCE_MINUTES, MAX_ALLOWANCES,
    MIN_ALLOWANCE_MINUTES, Remember, arguments_digest,
};
pub use config::{
    ConfigError, LimitSettings, MAX_CONFIG_BYTES, RateLimitSettings, StreamingConfig, VesselConfig,
};
pub use connection::{CloseFrame, ConnectionOutcome, WireMessage, close_code, serve_connection};
pub use link::{
    CallCorrelator, DEFAULT_MAX_PENDING, DeviceEvent, DeviceLink, FrameSink, Handled, InvokeResult,
    Links, PumpReport, pump_device_frames,
};
pub use listener::{ListenerLimits, ListenerStats};
pub use person::{
    AnswerError, ApprovalAnswer, DEFAULT_APPROVAL_TIMEOUT, PendingPrompt, PersonChannel,
    PersonEvent, Prompt,
};
pub use redact::{
    MAX_HASHED_WINDOWS, RedactingWriter, SecretRedactor, redact_for_audit, redacting_log_writer,
};
pub use registry::{
    AuthError, AuthenticatedDevice, CapabilityChange, ChangeKind, ConsentCapability,
    ConsentDecision, ConsentRequest, DEFAULT_CONSENT_TIMEOUT, DeviceRegistry, DeviceSnapshot,
    DeviceToken, Difference, GrantError, PairError, Paired, PairedDevice, RegistryEvent, Replaced,
};
pub use reload::{FileStamp, Reloaded, watch_policy_file};
pub use stream::{STREAM_SUBSCRIBER_QUEUE, StreamEvent, StreamStats, StreamSubscription};
pub use vessel::{
    ConnectionCaps, ConnectionPermit, Limits, MAX_WAITING_PER_DEVICE_ID, PairingTicket, Stats,
    Vessel,
};
