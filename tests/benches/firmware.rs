//! The firmware's budgets, measured on the C lamp (`examples/c/lamp.c` on
//! `libdk_device.a`, built by `cargo xtask firmware`) against a real vessel
//! served on loopback:
//!
//! - `firmware/heap/pairing_peak`: the most the library held at once from
//!   its start to the end of the pairing (budget 48 KiB);
//! - `firmware/heap/idle`: what it holds connected with nothing to do
//!   (budget 8 KiB);
//! - `firmware/heap/frame_beyond`: the most a received frame made the heap
//!   grow beyond the frame's own size, and the mean, over calls;
//! - `firmware/code`: the library's sections kept in the lamp's link, from
//!   the linker map: code, read-only data, data and bss (budget 256 KiB),
//!   and the unwinding tables beside them;
//! - `firmware/handshake`: a dk/2 handshake by key on the device side, from
//!   opening the socket to the handshake's end, the C lamp's median of 30
//!   against dk-device's tokio client's median of 30, the same vessel in
//!   the same run (budget: at most 2x).
//!
//! Run with `cargo xtask bench firmware`; needs gcc and libwebsockets'
//! development files (`cargo xtask peers`). Budgets are reported, never
//! asserted on.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dk_device::samples::Lamp;
use dk_device::{ClientOptions, ConnectionEvent, connect_once, run_client};
use dk_http::AdminClient;
use dk_vessel::Vessel;
use serde_json::{Value, json};

use common::{BoxError, vessel};
use tokio::sync::Notify;

const HANDSHAKES: usize = 30;
const CALLS: usize = 20;
const KIB: f64 = 1024.0;

fn main() -> Result<(), BoxError> {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty() && !filter.iter().any(|f| f.starts_with("firmware")) {
        return Ok(());
    }
    let (lamp, map) = built()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(&lamp, &map))
}

/// The lamp and its linker map, from `cargo xtask firmware`.
fn built() -> Result<(PathBuf, PathBuf), BoxError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["run", "--quiet", "-p", "xtask", "--", "firmware"])
        .current_dir(root)
        .output()?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "cargo xtask firmware: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let line = |name: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(PathBuf::from)
            .ok_or_else(|| format!("cargo xtask firmware built no {name} {said}"))
    };
    Ok((line("lamp: ")?, line("map: ")?))
}

/// Approves the next pairing request, granting the lamp's capabilities.
async fn approve(admin: &AdminClient) -> Result<String, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = admin.get("/v1/pending").await?.body;
        if let Some(prompt) = pending.as_array().and_then(|a| {
            a.iter()
                .find(|p| p.get("kind").and_then(Value::as_str) == Some("consent"))
        }) {
            let id = prompt.get("id").and_then(Value::as_u64).ok_or("no id")?;
            admin
                .post(
                    &format!("/v1/pending/{id}/consent"),
                    &json!({"approved": true, "grant": ["set_light", "read_light"]}),
                )
                .await?;
            let code = prompt
                .get("request")
                .and_then(|r| r.get("code"))
                .and_then(Value::as_str);
            return Ok(code.unwrap_or("").to_owned());
        }
        if Instant::now() > deadline {
            return Err("no pairing request".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn connected(vessel: &Vessel, yes: bool) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while vessel.links().is_connected("desk-lamp") != yes {
        if Instant::now() > deadline {
            return Err(
                format!("desk-lamp never {}", if yes { "connected" } else { "left" }).into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn spawn_lamp(
    lamp: &Path,
    url: &str,
    dir: &Path,
    stats: &str,
    extra: &[&str],
) -> Result<Child, BoxError> {
    Ok(Command::new(lamp)
        .arg(url)
        .arg(dir.join("lamp.dk2"))
        .arg("--stats")
        .arg(dir.join(stats))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?)
}

async fn exited(child: &mut Child) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("the lamp did not exit".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn stats(path: &Path) -> Result<BTreeMap<String, f64>, BoxError> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect())
}

fn within(value: f64, budget: f64) -> &'static str {
    if value <= budget { "within" } else { "OVER" }
}

async fn run(lamp: &Path, map: &Path) -> Result<(), BoxError> {
    let (vessel, url, admin, stop) = vessel().await?;
    let dir = tempfile::tempdir()?;

    // Pairing, then calls, then idle.
    let mut child = spawn_lamp(lamp, &url, dir.path(), "pairing.stats", &[])?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let code = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("pairing code: ").map(str::to_owned))
    });
    let prompt = approve(&admin).await?;
    connected(&vessel, true).await?;
    if code.join().ok().flatten().as_deref() != Some(prompt.as_str()) {
        return Err("the lamp's code is not the prompt's".into());
    }
    for n in 0..CALLS {
        let call = json!({"tool": "device__desk_lamp__set_light",
                          "input": {"on": n % 2 == 0, "brightness": n}, "timeoutMs": 5000});
        let answer: Value = admin.post("/v1/tools/call", &call).await?.body;
        if answer.get("ok") != Some(&Value::Bool(true)) {
            return Err(format!("a call failed: {answer}").into());
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status()?;
    exited(&mut child).await?;
    connected(&vessel, false).await?;
    let paired = stats(&dir.path().join("pairing.stats"))?;
    let at = |name: &str| paired.get(name).copied().unwrap_or(f64::NAN);

    // Handshakes by key: the C lamp's, then dk-device's.
    let mut child = spawn_lamp(
        lamp,
        &url,
        dir.path(),
        "handshakes.stats",
        &["--handshakes", &HANDSHAKES.to_string()],
    )?;
    exited(&mut child).await?;
    let shaken = stats(&dir.path().join("handshakes.stats"))?;
    let c_median = shaken
        .get("handshake_median_us")
        .copied()
        .unwrap_or(f64::NAN)
        / 1000.0;
    connected(&vessel, false).await?;
    let tokio_median = tokio_handshakes(&vessel, &url, &admin, dir.path()).await?;

    let code = sizes(map)?;
    let stored = code.get("text").unwrap_or(&0)
        + code.get("rodata").unwrap_or(&0)
        + code.get("data").unwrap_or(&0)
        + code.get("bss").unwrap_or(&0);
    let unwind = code.get("eh_frame").unwrap_or(&0) + code.get("gcc_except_table").unwrap_or(&0);

    let kib = |bytes: f64| bytes / KIB;
    println!(
        "firmware/heap/pairing_peak      {:>8.1} KiB   budget 48 KiB: {}",
        kib(at("pairing_peak_bytes")),
        within(at("pairing_peak_bytes"), 48.0 * KIB)
    );
    println!(
        "firmware/heap/idle              {:>8.1} KiB   budget 8 KiB: {}",
        kib(at("idle_heap_bytes")),
        within(at("idle_heap_bytes"), 8.0 * KIB)
    );
    println!(
        "firmware/heap/frame_beyond      {:>8} B max, {} B mean, {} allocations at most, over {} frames",
        at("frame_alloc_beyond_max_bytes"),
        at("frame_alloc_beyond_mean_bytes"),
        at("frame_allocations_max"),
        at("frames")
    );
    println!(
        "firmware/code                   {:>8.1} KiB   (text {:.1}, rodata {:.1}, data+bss {:.1}) budget 256 KiB: {}; unwind tables {:.1} KiB more",
        kib(stored as f64),
        kib(*code.get("text").unwrap_or(&0) as f64),
        kib(*code.get("rodata").unwrap_or(&0) as f64),
        kib((code.get("data").unwrap_or(&0) + code.get("bss").unwrap_or(&0)) as f64),
        within(stored as f64, 256.0 * KIB),
        kib(unwind as f64)
    );
    let ratio = c_median / tokio_median;
    println!(
        "firmware/handshake              C lamp median {c_median:.2} ms, dk-device median {tokio_median:.2} ms, ratio {ratio:.2} (budget 2x: {})",
        within(ratio, 2.0)
    );
    stop.send_replace(true);
    Ok(())
}

/// dk-device's tokio client: paired once, then `HANDSHAKES` connections by
/// key, each from its start to `Connected`; the median in milliseconds.
async fn tokio_handshakes(
    vessel: &Vessel,
    url: &str,
    admin: &AdminClient,
    dir: &Path,
) -> Result<f64, BoxError> {
    // The C lamp holds desk-lamp: unpair it, and pair the tokio lamp.
    admin.delete("/v1/devices/desk-lamp").await?;
    let key_file = dir.join("tokio-lamp.key");
    let lamp = Lamp::new();
    let device = lamp.device();
    let options = ClientOptions::new(url).key_file(&key_file);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let pairing = {
        let device = device.clone();
        tokio::spawn(async move {
            run_client(&device, options, async move {
                let _ = stop_rx.await;
            })
            .await
        })
    };
    approve(admin).await?;
    connected(vessel, true).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kept: Value = std::fs::read_to_string(&key_file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        if kept.get("paired") == Some(&Value::Bool(true)) {
            break;
        }
        if Instant::now() > deadline {
            return Err("the tokio lamp never paired".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(());
    pairing.await??;
    connected(vessel, false).await?;

    let mut samples = Vec::with_capacity(HANDSHAKES);
    for _ in 0..HANDSHAKES {
        let done = Arc::new(Notify::new());
        let at = Arc::new(Mutex::new(None::<Instant>));
        let (heard, stamp) = (Arc::clone(&done), Arc::clone(&at));
        let mut options = ClientOptions::new(url)
            .key_file(&key_file)
            .on_connection(move |event| {
                if matches!(event, ConnectionEvent::Connected) {
                    if let Ok(mut at) = stamp.lock() {
                        *at = Some(Instant::now());
                    }
                    heard.notify_one();
                }
            });
        let started = Instant::now();
        connect_once(&device, &mut options, done.notified()).await?;
        let ended = at
            .lock()
            .map_err(|_| "poisoned")?
            .ok_or("never connected")?;
        samples.push(ended.duration_since(started));
        connected(vessel, false).await?;
    }
    samples.sort();
    let median = samples.get(samples.len() / 2).copied().unwrap_or_default();
    Ok(median.as_secs_f64() * 1000.0)
}

/// The sizes of `libdk_device.a`'s sections kept in the link, by kind
/// (`text`, `rodata`, `data`, `bss`, `eh_frame`, ...), read from a GNU ld
/// map: after "Linker script and memory map", each input section is a line
/// ` .name  0xADDRESS  0xSIZE  archive(member)`, or its name alone with the
/// rest on the next line; discarded sections are listed before that.
fn sizes(map: &Path) -> Result<BTreeMap<String, u64>, BoxError> {
    let text = std::fs::read_to_string(map)?;
    let start = text
        .find("Linker script and memory map")
        .ok_or("not a linker map")?;
    let lines: Vec<&str> = text[start..].lines().collect();
    let mut sizes = BTreeMap::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix(" .") else {
            continue;
        };
        let mut words: Vec<&str> = rest.split_whitespace().collect();
        let Some(name) = words.first().copied() else {
            continue;
        };
        if words.len() == 1 {
            words = lines
                .get(n + 1)
                .map(|next| next.split_whitespace().collect())
                .unwrap_or_default();
            words.insert(0, name);
        }
        let [name, address, size, source] = words[..] else {
            continue;
        };
        if !source.contains("libdk_device.a(") {
            continue;
        }
        let number = |hex: &str| u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok();
        let (Some(address), Some(size)) = (number(address), number(size)) else {
            continue;
        };
        if address == 0 {
            continue;
        }
        let kind = name.split('.').next().unwrap_or(name).to_owned();
        *sizes.entry(kind).or_insert(0) += size;
    }
    Ok(sizes)
}
