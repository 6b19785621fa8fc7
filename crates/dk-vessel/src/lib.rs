//! The dk vessel: the program side that hosts an agent. It keeps the
//! registry of paired devices and their grants, turns granted capabilities
//! into tools, and runs every tool call through the ordered checks before a
//! device sees it.
//!
//! This is the crate vessel authors depend on, and its surface is what
//! one needs, flat at the root:
//!
//! - [`VesselServer`], which starts a networked vessel (every route, the
//!   store, MCP, the Unix sockets and the address file) in a few lines, the
//!   [`RunningVessel`] it returns, [`McpListen`], [`ServerError`] and the
//!   names of the files it keeps in its folder;
//! - [`config`] (the vessel's file: [`config::load`] reads it) and
//!   [`reload`] ([`reload::watch_policy_file`] watches the rule file);
//! - the core pieces by hand: [`Vessel`] and its [`Limits`], the
//!   [`DeviceRegistry`] the person pairs devices into (a
//!   [`ConsentRequest`] answered with a [`ConsentDecision`]), the
//!   [`DeviceToolAdapter`] that turns grants into [`ToolDefinition`]s and
//!   runs every call ([`CallContext`]) through the checks to a
//!   [`ToolOutcome`], [`Links`] to connected devices;
//! - the person's side: [`Prompt`]s, [`ApprovalRequest`]s answered with an
//!   [`ApprovalAnswer`], and agents' [`AgentRole`] and [`AgentScope`];
//! - the events a vessel reports ([`RegistryEvent`], [`PersonEvent`],
//!   [`AgentEvent`], [`DeviceEvent`]) and the errors of pairing, granting,
//!   answering and agents.
//!
//! Everything else stays in the crate that owns it: the core's other
//! modules in `dk-core`, the stores and the audit log in `dk-store`, the
//! routes, the admin API and its client in `dk-http`, the MCP server in
//! `dk-mcp`; a program that needs them depends on that crate.
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

pub use dk_core::adapter::{
    ApprovalRequest, CallContext, DeviceToolAdapter, ToolDefinition, ToolOutcome,
};
pub use dk_core::agents::{AgentError, AgentEvent, AgentRole, AgentScope};
pub use dk_core::link::{DeviceEvent, Links};
pub use dk_core::person::{AnswerError, ApprovalAnswer, PersonEvent, Prompt};
pub use dk_core::registry::{
    ConsentDecision, ConsentRequest, DEFAULT_CONSENT_TIMEOUT, DeviceRegistry, GrantError,
    PairError, RegistryEvent,
};
pub use dk_core::{Limits, Vessel};
pub use server::{
    ADDRESS_FILE, ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET, McpListen, RunningVessel, ServerError,
    StoreOpener, VesselServer, vessel_key_file,
};
