//! The vessel's HTTP layer: the `/device` WebSocket route, the admin API
//! and its typed client, the accept loop every listener runs (caps and
//! deadlines from `accept` on), the Host/Origin rule of loopback listeners
//! and Unix sockets, and Unix sockets in a private directory. It owns the
//! HTTP server (axum and hyper); their types stay inside `listen.rs`,
//! `server.rs`, `admin.rs`, `admin_client.rs`, the console and `notify.rs`.

#![forbid(unsafe_code)]

mod admin;
mod admin_client;
mod bodies;
mod changes;
pub mod console;
pub mod listen;
pub mod notify;
pub mod origins;
mod server;
mod unix;

use dk_core::{adapter, agents, allowances, by, connection, listener, person, registry, vessel};
#[cfg(test)]
use dk_core::{config, redact, stream};
use dk_core::{link, metrics, microphones, reload, store};

pub use admin::{
    AdminToken, AdminTokenError, ReadinessCheck, readiness_failures, serve_admin, serve_admin_unix,
    serve_admin_unix_with, serve_admin_with, serve_metrics,
};
pub use admin_client::{AdminAnswer, AdminClient, AdminClientError};
pub use console::Console;
pub use listen::HttpLimits;
pub use server::{serve_devices, serve_devices_with};
pub use unix::{bind_private_socket, connect_private_socket};
