//! The dk vessel: the program side that hosts an agent. It keeps the
//! registry of paired devices and their grants, turns granted capabilities
//! into tools, and runs every tool call through the ordered checks before a
//! device sees it.
//!
//! No input from a device, an agent or a person can make this crate panic:
//! every frame, manifest, tool name and input is parsed into a typed value
//! or refused with a reason.

#![forbid(unsafe_code)]

mod adapter;
mod admin;
mod admin_client;
mod agents;
mod allowances;
mod config;
mod connection;
mod link;
mod listen;
mod mcp;
mod origins;
mod person;
mod redact;
mod registry;
mod reload;
mod server;
use dk_store as store;
mod stream;
mod unix;
mod vessel;

pub use adapter::{
    AgentGate, AgentRateLimits, AgentRunLimits, AllowanceUse, Approval, ApprovalRequest, Approver,
    ApproverFn, CallContext, DEFAULT_AGENT_RATE, DEFAULT_CALL_TIMEOUT, DEFAULT_DEVICE_RATE,
    DEFAULT_MAX_TRACKED_BUCKETS, DEFAULT_MAX_TRACKED_RUNS, DEFAULT_RUN_IDLE_EXPIRY, DecisionHook,
    DecisionRecord, DeviceToolAdapter, RateLimit, RunClock, RunRef, ToolDefinition, ToolOutcome,
};
pub use admin::{AdminToken, AdminTokenError, admin_router, serve_admin, serve_admin_unix};
pub use admin_client::{AdminAnswer, AdminClient, AdminClientError};
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
pub use listen::ListenerStats;
pub use mcp::{McpOptions, mcp_router, mcp_router_with, serve_mcp, serve_mcp_unix, serve_mcp_with};
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
pub use server::{device_router, serve_devices};
pub use store::{
    AuditEntry, AuditEvent, AuditHead, AuditKey, AuditKeyError, AuditOptions, AuditProblem,
    AuditWriter, GENESIS_HASH, HeadSyntaxError, MAX_AUDIT_DEPTH, MAX_AUDIT_ENTRY_BYTES,
    MAX_AUDIT_ITEMS, MAX_AUDIT_STRING, MemoryStore, ProblemKind, RECORD_PATIENCE, RateHit,
    SCHEMA_VERSION, STOP_ATTEMPTS, Snapshot, SqliteStore, Store, StoreError, StoredPairing,
    VerifyReport, WriterOptions, audit_head_file,
};
pub use stream::{STREAM_SUBSCRIBER_QUEUE, StreamEvent, StreamStats, StreamSubscription};
pub use unix::{
    PrivateDir, PrivateFileError, bind_private_socket, connect_private_socket, current_uid,
    ensure_private_dir, read_private_file, write_private_file,
};
pub use vessel::{
    ConnectionCaps, ConnectionPermit, Limits, MAX_WAITING_PER_DEVICE_ID, PairingTicket, Stats,
    Vessel,
};
