//! A front door lock, connected to a vessel. It starts locked; `unlock`
//! asks the person every time.
//!
//! Start a vessel, then:
//!
//! ```text
//! cargo run -p dk-device --example lock -- ws://127.0.0.1:7777/device [--key-file PATH]
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
use dk_device::samples::Lock;

fn main() -> ExitCode {
    let args = match common::args("lock") {
        Ok(args) => args,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let lock = Lock::new();
    let options = common::client_options(&args, ServeOptions::new());
    common::run(&lock.device(), options, std::future::pending())
}
