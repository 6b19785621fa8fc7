//! What dk's tests share, in one place: the reference lamp's manifest
//! ([`lamp`]), a wait for something that happens on another task
//! ([`eventually`], [`eventually_some`], [`eventually_async`], and
//! [`eventually_blocking`] and [`eventually_blocking_some`] for a test
//! without a runtime) with one generous ceiling
//! ([`PATIENCE`]; [`eventually_within`] and [`eventually_blocking_within`]
//! for a longer one), a buffer a log writer can write into ([`LogBuffer`]),
//! for the desktop tests an X server of their own and a window that
//! records what it receives ([`x11`]), for the stores' tests a
//! PostgreSQL server of their own ([`postgres`]), for the fleet's tests
//! a `nats-server` of their own ([`nats`]), for the voice device's tests
//! a PulseAudio server of their own with a microphone and a speaker
//! ([`pulse`]), for a vessel on a full disk a small file system to fill
//! ([`SmallDisk`]), and for every test of a
//! real server the rule for a missing one ([`peer_or_skip`]) and a free
//! loopback port ([`free_port`]).
//!
//! A dev-dependency only: no crate names it under `[dependencies]` (the
//! layering test checks). It depends on no dk crate, so dk-proto or
//! dk-core can take it for their own unit tests without a second copy of
//! themselves; helpers that need a vessel live beside it, in dk-core's
//! `testing` module.
//!
//! Everything here is for tests: a wait that runs out or a lock that is
//! poisoned fails the test that called it, by a panic with a message.

#![forbid(unsafe_code)]

mod disk;
mod log;
mod manifest;
pub mod nats;
mod peers;
pub mod postgres;
pub mod pulse;
mod wait;
pub mod x11;

pub use disk::SmallDisk;
pub use log::LogBuffer;
pub use manifest::{LAMP_JSON, lamp};
pub use peers::{firmware_build, free_port, peer_or_skip};
pub use wait::{
    PATIENCE, eventually, eventually_async, eventually_blocking, eventually_blocking_some,
    eventually_blocking_within, eventually_some, eventually_within,
};
