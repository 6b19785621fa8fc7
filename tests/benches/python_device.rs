//! `python/...`: a call's round trip through a vessel to a device on the
//! Python SDK, against the same to dk-device's Rust client:
//!
//! - the Python device is examples/python/thermostat.py on the SDK's
//!   release wheel, in the virtualenv `cargo xtask bench python` makes and
//!   names in `DK_BENCH_DEVICE_PYTHON` (its manifest is the hall
//!   thermostat's with the id `py-thermostat`);
//! - the Rust device is dk-device's `Thermostat::declaring`, on the client
//!   in a process of its own (this bench run again with
//!   `DK_BENCH_RUST_DEVICE`), as `dk device simulate` runs one;
//! - both are paired with one vessel served on loopback in this process and
//!   called through its admin API (`POST /v1/tools/call`, all seven
//!   checks), one call at a time, in blocks of `BLOCK` calls to each in
//!   turn until each had `CALLS`: `set_target` (a plain Python handler) and
//!   `read_temperature` (an `async def` one).
//!
//! Prints the medians and p99s, and the ratio of the medians against the
//! budget (the Python device's at most 1.5x the Rust client's). Without
//! `DK_BENCH_DEVICE_PYTHON` (a plain `cargo bench`) it says how to run it
//! and stops. Budgets are reported, never asserted on.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dk_device::samples::Thermostat;
use dk_device::{ClientOptions, run_client};
use dk_http::AdminClient;
use dk_testkit::{eventually, eventually_async};
use dk_vessel::Vessel;
use serde_json::{Value, json};

use common::{BoxError, vessel};

/// Calls to each device, per capability.
const CALLS: usize = 1_000;
/// Calls to one device before the other's turn.
const BLOCK: usize = 100;
/// Calls to each device before measuring.
const WARM_UP: usize = 50;
/// The Python device's median may be this many times the Rust client's.
const BUDGET: f64 = 1.5;

const RUST_ID: &str = "hall-thermostat";
const PYTHON_ID: &str = "py-thermostat";

fn main() -> Result<(), BoxError> {
    if let Some(url) = std::env::var_os("DK_BENCH_RUST_DEVICE") {
        return rust_device(&url.to_string_lossy());
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty() && !filter.iter().any(|f| f.starts_with("python")) {
        return Ok(());
    }
    let Some(python) = std::env::var_os("DK_BENCH_DEVICE_PYTHON") else {
        println!("python/call skipped: run `cargo xtask bench python` (it builds the SDK's wheel)");
        return Ok(());
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(Path::new(&python)))
}

/// The Rust thermostat on dk-device's client, until it is killed.
fn rust_device(url: &str) -> Result<(), BoxError> {
    let key_file = std::env::var_os("DK_BENCH_KEY_FILE").ok_or("no DK_BENCH_KEY_FILE")?;
    let device = Thermostat::declaring().device();
    let options = ClientOptions::new(url).key_file(PathBuf::from(key_file));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run_client(&device, options, std::future::pending()))?;
    Ok(())
}

/// Waits for `device`'s pairing request, grants all it asks, and waits for
/// it to connect.
async fn pair(vessel: &Vessel, admin: &AdminClient, device: &str) -> Result<(), BoxError> {
    let id = eventually_async(
        &format!("a pairing request from {device}"),
        move || async move {
            let pending = admin.get("/v1/pending").await.ok()?.body;
            pending
                .as_array()?
                .iter()
                .find(|p| {
                    p.get("kind").and_then(Value::as_str) == Some("consent")
                        && p.pointer("/request/deviceId").and_then(Value::as_str) == Some(device)
                })?
                .get("id")?
                .as_u64()
        },
    )
    .await;
    admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true,
                    "grant": ["read_temperature", "set_target", "temperature_changed"]}),
        )
        .await?;
    eventually(&format!("{device} to connect"), || {
        vessel.links().is_connected(device)
    })
    .await;
    Ok(())
}

/// One call through the admin API: how long it took.
async fn call(admin: &AdminClient, tool: &str, input: &Value) -> Result<Duration, BoxError> {
    let body = json!({"tool": tool, "input": input, "timeoutMs": 10_000});
    let started = Instant::now();
    let answer = admin.post("/v1/tools/call", &body).await?.body;
    let took = started.elapsed();
    if answer.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!("{tool} failed: {answer}").into());
    }
    Ok(took)
}

/// The median and the 99th percentile, in microseconds.
fn summary(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples
            .get(index)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
    };
    (at(0.5), at(0.99))
}

/// The 1-minute load average, as the kernel tells it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

struct Devices(Vec<Child>);

impl Drop for Devices {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn run(python: &Path) -> Result<(), BoxError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let program = root.join("examples/python/thermostat.py");
    let fixture = root.join("fixtures/manifests/dk/hall-thermostat.json");
    let dir = tempfile::tempdir()?;
    let mut manifest: Value = serde_json::from_str(&std::fs::read_to_string(fixture)?)?;
    *manifest.get_mut("id").ok_or("the manifest has no id")? = json!(PYTHON_ID);
    let manifest_file = dir.path().join("py-thermostat.json");
    std::fs::write(&manifest_file, manifest.to_string())?;

    println!(
        "python/load  1-minute load average {} at start",
        load_average()
    );
    let (vessel, url, admin, stop) = vessel().await?;
    let mut devices = Devices(Vec::new());
    devices.0.push(
        Command::new(std::env::current_exe()?)
            .env("DK_BENCH_RUST_DEVICE", &url)
            .env("DK_BENCH_KEY_FILE", dir.path().join("rust.key"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    pair(&vessel, &admin, RUST_ID).await?;
    devices.0.push(
        Command::new(python)
            .arg(&program)
            .arg(&url)
            .arg("--manifest")
            .arg(&manifest_file)
            .arg("--key-file")
            .arg(dir.path().join("python.key"))
            .arg("--period")
            .arg("3600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    pair(&vessel, &admin, PYTHON_ID).await?;

    for (capability, input, kind) in [
        ("set_target", json!({"celsius": 21}), "a plain handler"),
        ("read_temperature", json!({}), "an async def handler"),
    ] {
        let rust_tool = format!("device__hall_thermostat__{capability}");
        let python_tool = format!("device__py_thermostat__{capability}");
        for _ in 0..WARM_UP {
            call(&admin, &rust_tool, &input).await?;
            call(&admin, &python_tool, &input).await?;
        }
        let mut rust = Vec::with_capacity(CALLS);
        let mut python = Vec::with_capacity(CALLS);
        while rust.len() < CALLS {
            for _ in 0..BLOCK {
                rust.push(call(&admin, &rust_tool, &input).await?);
            }
            for _ in 0..BLOCK {
                python.push(call(&admin, &python_tool, &input).await?);
            }
        }
        let (rust_median, rust_p99) = summary(&mut rust);
        let (python_median, python_p99) = summary(&mut python);
        let ratio = python_median / rust_median;
        println!(
            "python/{capability}/rust      median {rust_median:>8.1} µs   p99 {rust_p99:>8.1} µs   ({CALLS} calls to dk-device's client)"
        );
        println!(
            "python/{capability}/python    median {python_median:>8.1} µs   p99 {python_p99:>8.1} µs   ({CALLS} calls, {kind})"
        );
        println!(
            "python/{capability}/ratio     {ratio:.2}x the Rust client's median (budget {BUDGET}x: {})",
            if ratio <= BUDGET { "within" } else { "OVER" }
        );
    }
    println!(
        "python/load  1-minute load average {} at the end",
        load_average()
    );
    drop(devices);
    stop.send_replace(true);
    Ok(())
}
