//! End-to-end tests joining the dk crates. `in_process` runs a device defined
//! with dk-device against a vessel's registry and adapter over an in-process
//! link that carries every frame as JSON text, both ways; `socket` runs a real
//! vessel on loopback with devices over real WebSockets.

#![cfg(test)]

mod browser;
mod budget;
mod console_browser;
mod desktop_console;
mod dk2;
mod dk2_client;
mod dk2_hostile;
mod harness;
mod hostile;
mod images;
mod in_process;
mod layering;
mod map;
mod net;
mod replay;
mod socket;
mod streaming;
mod tidy;
mod voice;
