//! dk's device side for C firmware: [`dk_device_core`] behind a C ABI,
//! declared in `include/dk_device.h` (written by cbindgen from this crate,
//! and checked against it by a test).
//!
//! The firmware creates a device from its manifest's JSON
//! ([`dk_device_new`]), opens a WebSocket to the vessel (subprotocol
//! `dk.2`) and then only feeds and drains: every message received goes to
//! [`dk_device_receive_binary`] (or the text, close and loss functions),
//! the time to [`dk_device_handle_timeout`] when
//! [`dk_device_next_timeout`] says, and after each of these
//! [`dk_device_poll`] gives what to do, in order: a message to send, the
//! pairing code to show, credentials to keep, a call to run, how the
//! connection ended. Calls run in handlers registered per capability
//! ([`dk_device_on`]), answered at once through their [`dk_reply`] or later
//! with [`dk_device_answer`]; events go out with [`dk_device_emit`].
//!
//! The platform gives random bytes, storage (the credentials come in at
//! creation and go out as [`dk_output_kind::DK_OUTPUT_STORE`]) and memory
//! ([`dk_platform`]). Every pointer and length that crosses the ABI is
//! checked: a NULL with a length, a length over [`DK_MAX_INPUT`], text
//! that is not UTF-8, a call that is not running are each answered with a
//! [`dk_status`], never undefined behaviour or an abort. So is memory the
//! platform refuses: [`dk_status::DK_ERR_NO_MEMORY`], the connection ended
//! and what it held freed (the library's reserve answers the small
//! allocations the platform refused meanwhile, see `reserve.rs`). What C
//! cannot be checked for (a dangling pointer, a buffer shorter than its
//! length, a device used from two threads at once) is the caller's to get
//! right.
//!
//! This crate is `no_std`, and so is everything under it: the static
//! library `libdk_device.a` is this crate built as a staticlib with the
//! workspace's `firmware` profile (opt-level z, panic=abort, LTO;
//! `cargo xtask firmware`), and that build links no std at all (it would
//! fail with a duplicate `panic_impl` if anything under the core pulled
//! std in). Its panic handler calls the C library's `abort()` (no input
//! makes the core panic) and its allocator is the platform's
//! ([`dk_platform_init`]).

#![cfg_attr(not(test), no_std)]
#![allow(
    unsafe_code,
    reason = "the C ABI: raw pointers from C, each use in a block with its SAFETY comment"
)]
#![allow(
    non_camel_case_types,
    reason = "the types keep the names C code knows them by (dk_device, dk_output)"
)]

extern crate alloc;

mod abi;
mod device;
mod platform;
mod reconnect;
mod reserve;

pub use abi::{
    DK_CREDENTIALS_BYTES, DK_MAX_IN_FLIGHT, DK_MAX_INPUT, DK_MAX_REMEMBERED_CALLS,
    DK_MIN_FRAME_BYTES, DK_RESERVE_BYTES, dk_call, dk_end, dk_options, dk_output, dk_output_kind,
    dk_reply, dk_state, dk_status,
};
pub use device::answer::{
    dk_device_answer, dk_device_emit, dk_device_on, dk_reply_error, dk_reply_ok,
};
pub use device::feed::{
    dk_device_connect, dk_device_handle_timeout, dk_device_lost, dk_device_next_timeout,
    dk_device_receive_binary, dk_device_receive_close, dk_device_receive_text, dk_device_shutdown,
    dk_device_shutdown_within, dk_device_state, dk_device_stops_on_http_status,
    dk_device_storage_failed,
};
pub use device::poll::dk_device_poll;
pub use device::status::dk_status_text;
pub use device::{dk_device, dk_device_free, dk_device_new};
pub use platform::{
    PlatformAllocator, dk_alloc_fn, dk_free_fn, dk_handler_fn, dk_log_fn, dk_platform,
    dk_platform_init, dk_random_fn,
};
pub use reconnect::dk_next_backoff_ms;

#[cfg(test)]
mod tests;
