//! 8DK's reference desk lamp, connected to a vessel.
//!
//! Start a vessel, then:
//!
//! ```text
//! cargo run -p dk-device --example lamp -- ws://127.0.0.1:7777/device [--key-file PATH]
//! ```
//!
//! The first run pairs: check that the code printed here matches the
//! vessel's prompt (the device speaks dk/2: the code is computed on both
//! sides, never sent). With `--key-file` the device key and the vessel key
//! it pinned are kept (mode 0600), so later runs reconnect without asking the person again. Each call
//! is printed. Ctrl-C closes the connection and exits.

mod common;

use std::process::ExitCode;

use dk_device::ServeOptions;
use dk_device::samples::Lamp;

fn main() -> ExitCode {
    let args = match common::args("lamp") {
        Ok(args) => args,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let lamp = Lamp::new();
    let options = common::client_options(&args, ServeOptions::new());
    common::run(&lamp.device(), options, std::future::pending())
}
