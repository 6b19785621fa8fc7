//! dk's automation, run as `cargo xtask <task>`: the CI steps, the public API
//! snapshots, benchmarks with a summary of their medians, and short fuzzing
//! runs seeded from `fixtures/`.
//!
//! Only the standard library, serde_json (for `cargo metadata`) and
//! public-api (to render rustdoc's JSON for the API snapshots) are used, so
//! the tasks build quickly and the same way everywhere.

#![forbid(unsafe_code)]

mod api;
mod bench;
mod ci;
mod features;
mod firmware;
mod fuzz;
mod peers;
mod python;
mod run;

use std::process::ExitCode;

/// What `cargo xtask help` prints.
const HELP: &str = "\
usage: cargo xtask <task> [args]

tasks:
  ci                       what CI runs: fmt check, clippy, dk-core's tokio features,
                           dk-channel's tests without ring, the peers, tests, python client tests,
                           docs, the public API snapshots (fails fast)
  api [--bless]            compare every library crate's public items with their
                           signatures (from rustdoc's JSON) with api/<crate>.txt,
                           failing with the difference;
                           --bless rewrites the snapshots
  bench [FILTER] [--save FILE]
                           run the benchmarks of dk-proto, dk-policy, dk-channel,
                           dk-store, dk-core, dk-vessel, the console (dk-tests) and the
                           MQTT bridge (dk), then print their medians (and write them
                           to FILE as JSON); `bench firmware` alone measures the C
                           lamp's heap, code size and handshake against their budgets;
                           `bench desktop` alone the desktop device's screenshot and
                           click latency and idle memory against the issue's limits;
                           `bench python` alone a Python device's call round trip
                           against the Rust client's, on the SDK's release wheel
  features                 check that dk-core builds tokio with sync, time and macros
                           only (no socket, no file, no task of its own), and run
                           dk-channel's tests without its default features (no ring)
  firmware                 build dk-device-c as target/firmware/c/libdk_device.a (no_std,
                           opt-level z, panic=abort, LTO) and the C lamp and thermostat
                           of examples/c on it; print their paths and the header's
  peers                    install Debian's chromium, chromium-driver, mosquitto,
                           libwebsockets-dev, pkg-config, valgrind and xvfb (the console's
                           browser tests, the MQTT bridge's tests, the C lamp's test and
                           the desktop device's tests use them) when they are missing
  python [-k FILTER]       the python MCP client tests against a real vessel, in a
                           virtualenv under target/ made from tests/python/requirements.txt
                           and build-requirements.txt, and the Python device SDK's tests:
                           its wheel built with that maturin, installed in a fresh virtualenv
  fuzz [SECONDS]           run every fuzz target for SECONDS each (default 10),
                           seeded from fixtures/; needs nightly and cargo-fuzz
  help                     print this list";

/// The failure of a task: a message for the person at the terminal.
#[derive(Debug)]
pub struct TaskError(pub String);

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a task returns.
pub type TaskResult = Result<(), TaskError>;

fn main() -> ExitCode {
    // Run by cargo as rustdoc, for `api`'s JSON (see `api.rs`).
    if let Some(code) = api::rustdoc_wrapper() {
        return code;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("help", &[][..]),
    };
    let outcome = match task {
        "ci" => no_arguments("ci", rest).and_then(|()| ci::run()),
        "api" => api::run(rest),
        "bench" => bench::run(rest),
        "firmware" => no_arguments("firmware", rest).and_then(|()| firmware::run()),
        "features" => no_arguments("features", rest).and_then(|()| {
            features::check_core()?;
            features::check_channel_without_ring()
        }),
        "peers" => no_arguments("peers", rest).and_then(|()| peers::ensure()),
        "fuzz" => fuzz::run(rest),
        "python" => python::run(rest),
        "help" | "-h" | "--help" => {
            println!("{HELP}");
            Ok(())
        }
        other => Err(TaskError(format!("unknown task `{other}`\n\n{HELP}"))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask {task}: error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Refuses arguments for a task that takes none.
fn no_arguments(task: &str, rest: &[String]) -> TaskResult {
    match rest.first() {
        None => Ok(()),
        Some(arg) => Err(TaskError(format!(
            "`{task}` takes no arguments, got `{arg}`"
        ))),
    }
}
