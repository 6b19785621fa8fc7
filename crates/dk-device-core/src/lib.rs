//! dk's device side without IO, clock, threads or std (`#![no_std]` with
//! `alloc`): everything a device does on the wire to a vessel, as one state
//! machine that a driver feeds and drains.
//!
//! - In: received WebSocket messages ([`Received`]), the time (an
//!   [`Instant`] the driver passes in; the core never reads a clock), random
//!   bytes from the platform ([`Entropy`]), and handlers' outcomes.
//! - Out ([`Output`]): messages to send, the pairing code to show,
//!   credentials to keep ([`Credentials`]: the device's key and the vessel's
//!   pin), calls to run ([`Invocation`]), things to log, and how each
//!   connection ended ([`End`]); timers to arm through
//!   [`DeviceCore::poll_timeout`].
//!
//! dk/2 (the default): the Noise handshake, the vessel's key checked
//! against the pin before message 3, `device:hello` and the
//! commit/nonce/reveal pairing with the computed code, or `device:auth` by
//! key, then records both ways; closes count only when announced inside the
//! channel. v1: `device:hello` with the vessel's code and token, or
//! `device:auth` with the token. Calls ([`Calls`]): each id runs at most
//! once, at most so many at once, only declared capabilities, every answer
//! a frame the vessel takes.
//!
//! dk-device's tokio client is a driver over this crate; so is dk-device-c,
//! the C library for firmware. Nothing here uses ring or the operating
//! system: the channel's primitives are curve25519-dalek's, sha2's and the
//! RustCrypto ChaCha20-Poly1305 (ring's when a std build of dk-channel turns
//! it on), and no input can make it panic.

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

mod calls;
mod credentials;
mod entropy;
mod machine;
pub mod reconnect;
mod time;

pub use calls::{
    Accepted, CallRefusal, Calls, DEFAULT_MAX_IN_FLIGHT, DEFAULT_REMEMBERED_CALLS, EventRefusal,
    Input, Invocation, SetAside, event_frame, refused_by_vessel, result_frame,
};
pub use credentials::{CREDENTIALS_BYTES, Credentials, CredentialsError};
pub use entropy::{Entropy, EntropyFailed};
pub use machine::{
    CLOSE_TIMEOUT, ChunkRefusal, Config, DeviceCore, End, HANDSHAKE_TIMEOUT, MAX_TOKEN_BYTES,
    Message, Notice, Output, Received, Retry, State, Stop, is_token, printable,
};
pub use time::Instant;

pub use dk_channel::{PublicKey, StaticKey};
pub use dk_proto::{Channel, CloseFrame, Manifest, StreamChunk};

#[cfg(test)]
mod tests;
