//! What several dk crates need of files and text and would otherwise each
//! write again: a person's private files ([`private`], Unix only: 0600,
//! written whole through a synced rename, never read through a link or
//! from another user), and lower-case hex ([`hex`]).
//!
//! It takes no dk crate, so the vessel's store, the device SDK and the
//! fleet share these rules without depending on each other.

#![forbid(unsafe_code)]

pub mod hex;
#[cfg(unix)]
pub mod private;
