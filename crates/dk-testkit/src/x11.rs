//! X11 for the desktop tests: an [`Xvfb`] server of their own,
//! [`TestWindow`]s on it that record the clicks and keys they receive, and
//! a Tk program's entry field ([`TkEntry`]) to type into.
//!
//! Debian's `xvfb` package provides the server (`cargo xtask peers`
//! installs it); a test that needs it and finds it missing fails saying
//! so, never skips.

mod keys;
mod pixels;
mod tk;
mod window;
mod xvfb;

pub use pixels::{Rect, Rgb, X11Error, screen_pixel, screen_pixels};
pub use tk::TkEntry;
pub use window::{Click, KeyPress, TestWindow, WindowSpec};
pub use xvfb::Xvfb;

#[cfg(test)]
mod tests;
