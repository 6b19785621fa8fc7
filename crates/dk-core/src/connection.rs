//! One device connection, from the first frame to the close: the handshake
//! (`device:hello` to pair, `device:auth` to reconnect), then calls, events
//! and revocations, with every limit enforced.
//!
//! The logic is written against a `Stream` and a `Sink` of [`WireMessage`]s,
//! so the WebSocket route and the tests (through channels) run the same code.
//!
//! A device whose manifest kind is a streaming class (`voice`,
//! `desktop-control`) is admitted under the vessel's streaming policy after
//! it paired or authenticated, on every connection (a resume is admitted
//! afresh); a refusal closes 4011 with the admission code and message. An
//! admitted session is told so (`device:streaming`) and may send stream
//! chunks as binary messages (see `stream.rs`).

mod frames;
mod secure;
mod serve;
#[cfg(test)]
mod tests;

pub use secure::serve_secure_connection;
pub use serve::{ConnectionOutcome, WireMessage, serve_connection};
