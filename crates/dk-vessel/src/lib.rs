//! The dk vessel: the program side that hosts an agent. It keeps the
//! registry of paired devices and their grants, turns granted capabilities
//! into tools, and runs every tool call through the ordered checks before a
//! device sees it.
//!
//! This is the crate vessel authors depend on. It gathers the vessel's
//! crates under one roof, each as a namespace:
//!
//! - the core (`dk-core`): [`Vessel`] and [`Limits`] at the root, and the
//!   modules [`adapter`], [`agents`], [`allowances`], [`config`] (with
//!   [`config::load`], which reads the file),
//!   [`connection`], [`link`], [`listener`], [`metrics`], [`person`], [`redact`],
//!   [`registry`], [`reload`] (with [`reload::watch_policy_file`], which
//!   watches the rule file), [`stream`] and [`vessel`];
//! - [`store`] (`dk-store`): the `Store` trait, the SQLite and in-memory
//!   stores, the audit log and its writer, private files;
//! - [`http`] (`dk-http`): the `/device` route, the admin API and its
//!   client, listeners, Unix sockets;
//! - [`mcp`] (`dk-mcp`): the MCP server;
//!
//! and [`VesselServer`], which starts a networked vessel (every route, the
//! store, MCP, the Unix sockets and the address file) in a few lines.
//!
//! No input from a device, an agent or a person can make this crate panic:
//! every frame, manifest, tool name and input is parsed into a typed value
//! or refused with a reason.

#![forbid(unsafe_code)]

pub mod config;
#[cfg(feature = "fleet")]
mod member;
pub mod reload;
mod server;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

pub use dk_core::{
    Limits, Vessel, adapter, agents, allowances, by, connection, link, listener, metrics, person,
    redact, registry, stream, vessel,
};
#[cfg(feature = "fleet")]
pub use dk_fleet as fleet;
pub use dk_http as http;
pub use dk_mcp as mcp;
pub use dk_store as store;
pub use server::{
    ADDRESS_FILE, ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET, McpListen, OLD_VESSEL_KEY_FILE,
    RunningVessel, ServerError, StoreOpener, VesselServer, vessel_key_file,
};
