//! The dk vessel: the program side that hosts an agent. It keeps the
//! registry of paired devices and their grants, turns granted capabilities
//! into tools, and runs every tool call through the ordered checks before a
//! device sees it.
//!
//! No input from a device, an agent or a person can make this crate panic:
//! every frame, manifest, tool name and input is parsed into a typed value
//! or refused with a reason.

#![forbid(unsafe_code)]

mod server;

pub use server::{
    ADDRESS_FILE, ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET, McpListen, RunningVessel, ServerError,
    StoreOpener, VesselServer,
};

pub use dk_core::*;
pub use dk_http::{
    AdminAnswer, AdminClient, AdminClientError, AdminToken, AdminTokenError, admin_router,
    bind_private_socket, connect_private_socket, device_router, serve_admin, serve_admin_unix,
    serve_devices,
};
pub use dk_mcp::{
    McpOptions, mcp_router, mcp_router_with, serve_mcp, serve_mcp_unix, serve_mcp_with,
};
pub use dk_store::private::{
    PrivateDir, PrivateFileError, current_uid, ensure_private_dir, read_private_file,
    write_private_file,
};
pub use dk_store::{
    AuditEntry, AuditEvent, AuditHead, AuditKey, AuditKeyError, AuditOptions, AuditProblem,
    AuditWriter, GENESIS_HASH, HeadSyntaxError, MAX_AUDIT_DEPTH, MAX_AUDIT_ENTRY_BYTES,
    MAX_AUDIT_ITEMS, MAX_AUDIT_STRING, MemoryStore, ProblemKind, RECORD_PATIENCE, RateHit,
    SCHEMA_VERSION, STOP_ATTEMPTS, Snapshot, SqliteStore, Store, StoreError, StoredPairing,
    VerifyReport, WriterOptions, audit_head_file,
};
