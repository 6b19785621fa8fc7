//! The dk device SDK: define a device from its manifest and one handler per
//! capability, then serve it on a connection to a vessel.
//!
//! ```
//! use dk_device::{Device, HandlerError, serve_device};
//! use serde_json::{Value, json};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::define(&json!({
//!     "id": "door-bell", "name": "Door bell", "kind": "bell", "version": "1.0.0",
//!     "capabilities": [{"name": "ring", "kind": "actuator", "description": "Ring the bell."}]
//! }))
//! .handler("ring", |_input| async move { Ok::<Value, HandlerError>(json!({"rang": true})) })
//! .build()?;
//!
//! // Any Stream of incoming text frames and Sink of outgoing ones will do.
//! let (to_device, incoming) = futures::channel::mpsc::unbounded::<String>();
//! let (outgoing, _from_device) = futures::channel::mpsc::unbounded::<String>();
//! drop(to_device);
//! serve_device(&device, incoming, outgoing).await?;
//! # Ok(())
//! # }
//! ```
//!
//! [`serve_device`] treats every frame from the vessel as untrusted: frames
//! that do not parse or are not invokes are set aside, and each call runs in
//! a task of its own whose failure or panic is answered as an error. No frame
//! from a vessel can make this crate panic or stop the serve loop.
//!
//! [`run_client`] connects a device to a vessel's `/device` WebSocket route
//! over dk/2 (a Noise channel; v1 only when [`ClientOptions::v1`] asks): it
//! pairs by computing the code the person compares, keeps its key and the
//! vessel's pinned key in a key file, serves calls, and reconnects with
//! backoff. `wss://` URLs work too, for a vessel behind a TLS proxy.
//!
//! A streaming device (kind `voice` or `desktop-control`) queues chunks with
//! a [`StreamSender`] from [`stream_channel`]; the client sends them once the
//! vessel admits it.
//!
//! [`Home`] names dk's home on this machine and the key file a device
//! keeps in it.
//!
//! [`samples`] holds ready devices (8DK's reference lamp, a door lock, a
//! thermostat) used by the simulators, the demo and the end-to-end tests.

#![forbid(unsafe_code)]

mod client;
mod device;
mod event;
mod home;
pub mod samples;
mod serve;
mod stream;

pub use client::{
    CONNECT_TIMEOUT, ClientError, ClientOptions, ConnectionEvent, DEFAULT_INITIAL_BACKOFF,
    DEFAULT_MAX_BACKOFF, HANDSHAKE_TIMEOUT, STABLE_SESSION, SessionEnd, connect_once, run_client,
};
pub use device::{CallError, DefineError, Device, DeviceBuilder, HandlerError};
pub use event::{EmitError, EventReceiver, EventSender};
pub use home::{HOME_ENV, Home, HomeError, HomeSource};
pub use serve::{
    DEFAULT_GRACE, DEFAULT_MAX_IN_FLIGHT, DEFAULT_REMEMBERED_CALLS, Notice, ServeError,
    ServeOptions, serve_device, serve_device_with,
};
pub use stream::{
    DEFAULT_STREAM_QUEUE, StreamReceiver, StreamSendError, StreamSender, stream_channel,
};
