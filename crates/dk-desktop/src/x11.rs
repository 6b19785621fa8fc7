//! One connection to an X display, on x11rb's pure-Rust connection: the
//! screen's size, its pixels (GetImage, ZPixmap), the windows to black out
//! (the window tree walked from the root), the pointer, where keys would go,
//! and input through XTest. What must not change between a check and the
//! act it allows runs with the server grabbed ([`Session::grabbed`]).
//!
//! Its parts: [`link`] (the errors, and what every part does with the bare
//! connection), [`session`] (connecting, the grab, the screen's pixels),
//! [`windows`] (the blackout's windows, where keys go), [`keyboard`] (the
//! mapping and the spare keycodes) and [`input`] (XTest's pointer, buttons
//! and keys).

mod input;
mod keyboard;
mod link;
mod session;
mod windows;

pub use input::{DRAG_STEPS, Pressed};
pub use link::XError;
pub use session::{GRAB_LIMIT, Session};
