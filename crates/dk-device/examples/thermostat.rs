//! A hall thermostat, connected to a vessel. Its temperature drifts toward
//! the target, and it reports each reading as its declared event
//! `temperature_changed` every few seconds. Its manifest declares the
//! target's range (5 to 30 °C) and its modes (the dk manifest extension):
//! the vessel refuses 35 °C before the person is asked.
//!
//! Start a vessel, then:
//!
//! ```text
//! cargo run -p dk-device --example thermostat -- ws://127.0.0.1:7777/device [--key-file PATH]
//! ```
//!
//! The first run pairs: check that the code printed here matches the
//! vessel's prompt (the device speaks dk/2: the code is computed on both
//! sides, never sent). With `--key-file` the device key and the vessel key
//! it pinned are kept (mode 0600), so later runs reconnect without asking the person again. Each call
//! is printed. Ctrl-C closes the connection and exits.

mod common;

use std::process::ExitCode;
use std::time::Duration;

use dk_device::ServeOptions;
use dk_device::samples::Thermostat;

/// How often the thermostat reads its temperature.
const READING_PERIOD: Duration = Duration::from_secs(3);

fn main() -> ExitCode {
    let args = match common::args("thermostat") {
        Ok(args) => args,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let thermostat = Thermostat::declaring();
    let device = thermostat.device();
    let (events, receiver) = device.events(16);
    let options = common::client_options(&args, ServeOptions::new().events(receiver));
    common::run(&device, options, async {
        thermostat.drift(&events, READING_PERIOD).await;
    })
}
