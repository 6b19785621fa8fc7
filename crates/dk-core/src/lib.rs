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
pub mod by;
pub mod config;
pub mod connection;
mod hook;
mod input_schema;
pub mod limits;
pub mod link;
pub mod listener;
pub mod metrics;
pub mod microphones;
pub mod person;
pub mod redact;
pub mod registry;
pub mod reload;
pub mod stream;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod vessel;

pub use dk_store as store;
pub use vessel::{Limits, Vessel};
