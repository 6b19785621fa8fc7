//! An X11 desktop as a dk device (`dk device desktop`): an agent takes
//! screenshots and zooms, moves and clicks the pointer, scrolls, presses
//! keys and types, each call granted and ruled by the person like any
//! device's, with `key` and `type` asking every time.
//!
//! It speaks the X protocol itself (x11rb's pure-Rust connection; XTest for
//! input, GetImage for pixels); nothing is shelled out. Coordinates are in
//! screenshot pixels: screenshots are scaled down to fit a configured size
//! and every coordinate is scaled back as `round(v * screen / shot)`.
//!
//! Windows named by class or title, and screen regions, are blacked out
//! before any pixel leaves the device (the window tree and the pixels read
//! with the server grabbed, so of one instant), and a pointer action landing
//! in one, or keys the server would send to one, is refused. The list is
//! written into the manifest, so the person sees it when pairing.
//!
//! Every call's input is checked before anything is sent to X; no input
//! from an agent or a vessel can make this crate panic. When the display
//! goes away calls are refused saying so, and the device connects again
//! by itself when the display returns.

#![forbid(unsafe_code)]

mod config;
mod desk;
mod device;
mod image;
mod keys;
mod x11;

pub use config::{
    Blackout, ConfigError, DEFAULT_ID, DEFAULT_NAME, DEFAULT_SIZE, DesktopConfig, MAX_CONFIG_BYTES,
    Region, Size, check_display,
};
pub use device::{
    Desktop, KIND, MAX_KEYS_TIME, MAX_SCROLL, MAX_TEXT, MAX_WAIT_SECONDS, StartError,
};
