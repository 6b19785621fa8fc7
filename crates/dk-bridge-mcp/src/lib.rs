//! dk's MCP bridge: any MCP server's tools as one dk device, so the
//! person pairs it by code, grants its tools one by one, is asked before
//! each call that changes anything, and every call is in the audit log.
//!
//! The bridge starts the server (`server.rs`: a child process on stdio,
//! rmcp's client, only the named environment variables, restarted with
//! backoff), reads what it writes through a filter (`filter.rs`: size,
//! depth and rate bounds), turns its tools into a manifest
//! (`manifest.rs`, names by `names.rs`, schemas compiled by `schema.rs`)
//! and its answers into results (`result.rs`), and runs the device
//! (`bridge.rs`), asking to pair again whenever the tools change.

#![forbid(unsafe_code)]

mod bridge;
mod filter;
mod manifest;
mod names;
mod result;
mod schema;
mod server;

pub use bridge::{
    BridgeError, BridgeOptions, CodeHook, DEFAULT_CALL_TIMEOUT, ManifestHook, describe, run_bridge,
};
pub use filter::{BURST, MAX_MESSAGE_BYTES, MAX_MESSAGE_DEPTH, PER_SECOND};
pub use manifest::{BuildError, Built, Carried, Identity, KIND, LeftOut, build};
pub use names::{RESERVED, capability_name};
pub use result::{MAX_ERROR_CHARS, MAX_RESULT_BYTES, to_result};
pub use server::{Health, Listing, ServerCommand, Upstream};
