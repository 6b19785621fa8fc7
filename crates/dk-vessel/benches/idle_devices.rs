//! Resident memory of a real `dk vessel` process holding N idle paired
//! devices (default 1,000; `DK_BENCH_DEVICES` changes it), once over v1 and
//! once over dk/2 (each in its own vessel). The vessel runs as a separate
//! process (built with `cargo build --release -p dk`), so only its memory is
//! counted: VmRSS from `/proc/<pid>/status` before any device connects and
//! again once every device is paired and has sat idle for 2 s. Devices pair
//! through the admin API, in batches under the per-address limit on
//! unauthenticated connections; over dk/2 each runs the handshake and the
//! pairing exchange first. Needs Linux and an open-files limit above
//! N plus a margin (`ulimit -n`). Run with `cargo xtask bench` (or `cargo
//! bench -p dk-vessel --bench idle_devices`). Figures are reported, never
//! asserted on.

#[path = "../../dk-core/benches/common/mod.rs"]
mod common;
#[path = "dk2_device/mod.rs"]
mod dk2_device;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dk_http::{AdminClient, AdminToken};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

use common::{BoxError, build_dk};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

const NAME: &str = "idle/devices";
const DK2_NAME: &str = "idle/dk2_devices";
/// Devices connected when `DK_BENCH_DEVICES` is not set.
const DEFAULT_DEVICES: usize = 1000;
/// Devices paired at once: under the vessel's 32 unauthenticated connections
/// per address.
const BATCH: usize = 25;
/// How long the devices sit idle before the second reading.
const IDLE: Duration = Duration::from_secs(2);
/// The budget for 1,000 idle v1 devices, in MiB.
const BUDGET_MIB: f64 = 64.0;
/// The budget for each idle dk/2 device, in KiB.
const DK2_BUDGET_KIB: f64 = 24.0;
/// How long any one step may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(30);
/// Open files the bench needs besides one per device (and the vessel too).
const SPARE_FILES: u64 = 64;

fn main() -> Result<(), BoxError> {
    if common::filtered_out(&[NAME, DK2_NAME]) {
        return Ok(());
    }
    let devices = match std::env::var("DK_BENCH_DEVICES") {
        Ok(text) => text
            .parse::<usize>()
            .map_err(|e| format!("DK_BENCH_DEVICES `{text}`: {e}"))?,
        Err(_) => DEFAULT_DEVICES,
    };
    let needed = u64::try_from(devices)?.saturating_add(SPARE_FILES);
    if let Some(limit) = open_files_limit()
        && limit < needed
    {
        return Err(format!(
            "{devices} devices need an open-files limit of at least {needed}, this process has {limit}: raise it with `ulimit -n 4096`"
        )
        .into());
    }

    let dk = build_dk()?;
    for channel in [Channel::V1, Channel::Dk2] {
        run_vessel(&dk, devices, channel)?.print();
    }
    Ok(())
}

/// The device channel the bench's devices speak.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Channel {
    V1,
    Dk2,
}

/// Starts a vessel, pairs `devices` over `channel`, and reads its memory.
fn run_vessel(dk: &Path, devices: usize, channel: Channel) -> Result<Report, BoxError> {
    // dk's home for this run, removed however the bench ends: the data
    // directory and, beside it, the admin token (the directory holds only
    // its hash).
    let home = tempfile::Builder::new()
        .prefix("dk-bench-idle-")
        .tempdir()?;
    let data_dir = home.path().join("vessel");
    let token_file = home.path().join("admin-token");
    let child = Command::new(dk)
        .env("DK_HOME", home.path())
        .args(["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_dir)
        .arg("--admin-token-file")
        .arg(&token_file)
        // Every bench device pairs from this one address.
        .args([
            "--pairings-per-minute",
            "1000000",
            "--pending-pairings-per-address",
            "32",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", dk.display()))?;
    let mut vessel = KillOnDrop(child);
    let pid = vessel.0.id();
    let (device_addr, admin_addr) = wait_for_address(&mut vessel.0, &data_dir)?;
    let token = AdminToken::read_from(&token_file)?;
    let admin = AdminClient::new(admin_addr, token);

    let runtime = common::multi_thread(None)?;
    let report = runtime.block_on(measure(pid, devices, device_addr, &admin, channel));
    drop(vessel);
    runtime.shutdown_timeout(Duration::from_secs(5));
    report
}

/// Waits for `dk vessel` to write its address file.
fn wait_for_address(
    child: &mut Child,
    data_dir: &Path,
) -> Result<(SocketAddr, SocketAddr), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    let path = data_dir.join("vessel.json");
    loop {
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Ok(value) = serde_json::from_str::<Value>(&text)
        {
            let address = |key: &str| -> Result<SocketAddr, BoxError> {
                let text = value
                    .get(key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("vessel.json has no `{key}`"))?;
                Ok(text.parse()?)
            };
            return Ok((address("devices")?, address("admin")?));
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("dk vessel exited at start ({status})").into());
        }
        if Instant::now() > deadline {
            return Err("dk vessel did not write vessel.json".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Report {
    channel: Channel,
    devices: usize,
    baseline_kib: u64,
    idle_kib: u64,
    peak_kib: u64,
    pairing: Duration,
}

/// Connects and pairs every device, lets them idle, and reads the vessel's
/// memory before and after.
async fn measure(
    pid: u32,
    devices: usize,
    device_addr: SocketAddr,
    admin: &AdminClient,
    channel: Channel,
) -> Result<Report, BoxError> {
    // Let the vessel settle before the baseline.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let baseline_kib = status_kib(pid, "VmRSS")?;

    let started = Instant::now();
    let mut idle: JoinSet<()> = JoinSet::new();
    let ids: Vec<usize> = (0..devices).collect();
    for batch in ids.chunks(BATCH) {
        let sockets = match channel {
            Channel::V1 => pair_batch(batch, device_addr, admin).await?,
            Channel::Dk2 => pair_dk2_batch(batch, device_addr, admin).await?,
        };
        for socket in sockets {
            idle.spawn(stay_idle(socket));
        }
    }
    let pairing = started.elapsed();

    let status = admin.get("/v1/status").await?;
    let connected = status.body.get("connected").and_then(Value::as_u64);
    if connected != Some(u64::try_from(devices)?) {
        return Err(
            format!("expected {devices} connected devices, the vessel says {status:?}").into(),
        );
    }
    tokio::time::sleep(IDLE).await;
    let idle_kib = status_kib(pid, "VmRSS")?;
    let peak_kib = status_kib(pid, "VmHWM")?;
    if idle.try_join_next().is_some() {
        return Err("a device connection ended while idle".into());
    }
    idle.shutdown().await;
    Ok(Report {
        channel,
        devices,
        baseline_kib,
        idle_kib,
        peak_kib,
        pairing,
    })
}

/// Connects the devices of one batch, approves each through the admin API,
/// and returns their sockets once every one is paired.
async fn pair_batch(
    batch: &[usize],
    device_addr: SocketAddr,
    admin: &AdminClient,
) -> Result<Vec<Socket>, BoxError> {
    let url = format!("ws://{device_addr}/device");
    let mut sockets = Vec::with_capacity(batch.len());
    for &i in batch {
        let (mut socket, _) = connect_async(url.as_str()).await?;
        let hello = json!({"type": "device:hello", "manifest": manifest(i)});
        socket.send(Message::text(hello.to_string())).await?;
        sockets.push(socket);
    }
    for socket in &mut sockets {
        read_until(socket, "device:pairing").await?;
    }
    approve(batch.len(), admin).await?;
    for socket in &mut sockets {
        read_until(socket, "device:paired").await?;
    }
    Ok(sockets)
}

/// The same over dk/2: each device runs the handshake and the pairing
/// exchange, then waits for the person. Only the sockets are kept: an idle
/// device answers pings, which travel outside the channel.
async fn pair_dk2_batch(
    batch: &[usize],
    device_addr: SocketAddr,
    admin: &AdminClient,
) -> Result<Vec<Socket>, BoxError> {
    let url = format!("ws://{device_addr}/device");
    let mut devices = Vec::with_capacity(batch.len());
    for &i in batch {
        let mut device = dk2_device::connect(&url).await?;
        tokio::time::timeout(PATIENCE, device.hello(&manifest(i)))
            .await
            .map_err(|_| "the pairing exchange did not finish")??;
        devices.push(device);
    }
    approve(batch.len(), admin).await?;
    let mut sockets = Vec::with_capacity(batch.len());
    for mut device in devices {
        tokio::time::timeout(PATIENCE, device.read_until("device:paired"))
            .await
            .map_err(|_| "no `device:paired` in time")??;
        sockets.push(device.socket);
    }
    Ok(sockets)
}

/// Approves `count` pairing requests through the admin API.
async fn approve(count: usize, admin: &AdminClient) -> Result<(), BoxError> {
    let mut approved = 0;
    let deadline = Instant::now() + PATIENCE;
    while approved < count {
        let pending = admin.get("/v1/pending").await?;
        let prompts = pending.body.as_array().cloned().unwrap_or_default();
        for prompt in prompts {
            let is_consent = prompt.get("kind").and_then(Value::as_str) == Some("consent");
            let Some(id) = prompt.get("id").and_then(Value::as_u64) else {
                continue;
            };
            if !is_consent {
                continue;
            }
            let answer = admin
                .post(
                    &format!("/v1/pending/{id}/consent"),
                    &json!({"approved": true, "grant": ["read_light"]}),
                )
                .await?;
            if answer.status != 204 {
                return Err(format!("consent {id} refused: {answer:?}").into());
            }
            approved += 1;
        }
        if approved < count {
            if Instant::now() > deadline {
                return Err("pairing requests did not reach the person".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

/// A lamp manifest with its own id.
fn manifest(i: usize) -> Value {
    json!({
        "id": format!("bench-{i}"),
        "name": format!("Bench lamp {i}"),
        "kind": "lamp",
        "version": "0.1.0",
        "capabilities": [
            {
                "name": "read_light",
                "kind": "sensor",
                "description": "Read whether the lamp is on and its brightness (0-100).",
            },
            {
                "name": "set_light",
                "kind": "actuator",
                "description": "Turn the lamp on or off and set its brightness.",
                "params": {
                    "on": {"type": "boolean", "required": true, "description": "true for on"},
                    "brightness": {"type": "number", "description": "0-100"},
                },
            },
        ],
    })
}

/// Reads frames until one of type `kind`.
async fn read_until(socket: &mut Socket, kind: &str) -> Result<(), BoxError> {
    let wait = async {
        while let Some(message) = socket.next().await {
            if let Message::Text(text) = message? {
                let frame: Value = serde_json::from_str(text.as_str())?;
                if frame.get("type").and_then(Value::as_str) == Some(kind) {
                    return Ok(());
                }
            }
        }
        Err::<(), BoxError>(format!("the vessel closed before `{kind}`").into())
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .map_err(|_| format!("no `{kind}` within {PATIENCE:?}"))?
}

/// Keeps reading so pings are answered, until the connection ends.
async fn stay_idle(mut socket: Socket) {
    while let Some(Ok(_)) = socket.next().await {}
}

/// A `kB` field of `/proc/<pid>/status`, such as `VmRSS`.
fn status_kib(pid: u32, field: &str) -> Result<u64, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no `{field}` in /proc/{pid}/status").into())
}

/// This process's soft limit on open files, when known.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

impl Report {
    fn print(&self) {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let grown = self.idle_kib.saturating_sub(self.baseline_kib);
        let per_device = grown as f64 / self.devices.max(1) as f64;
        let (prefix, words) = match self.channel {
            Channel::V1 => ("idle", "v1"),
            Channel::Dk2 => ("idle/dk2", "dk/2"),
        };
        let name = format!("{prefix}/{}_devices", self.devices);
        println!(
            "\nidle: {} {words} devices paired in {:.1} s, then idle for {} s; memory of the dk vessel process",
            self.devices,
            self.pairing.as_secs_f64(),
            IDLE.as_secs()
        );
        println!(
            "{name:<24}rss {:.1} MiB  baseline {:.1} MiB  per device {:.1} KiB  peak {:.1} MiB",
            mib(self.idle_kib),
            mib(self.baseline_kib),
            per_device,
            mib(self.peak_kib)
        );
        if self.channel == Channel::Dk2 {
            let verdict = if per_device <= DK2_BUDGET_KIB {
                "within"
            } else {
                "OVER"
            };
            println!(
                "{:<24}per device {per_device:.1} KiB  budget {DK2_BUDGET_KIB:.0} KiB  {verdict}",
                "idle/dk2_budget"
            );
            return;
        }
        // The budget is for 1,000 devices; other counts are scaled to it.
        let projected = mib(self.baseline_kib) + per_device * 1000.0 / 1024.0;
        let verdict = if projected <= BUDGET_MIB {
            "within"
        } else {
            "OVER"
        };
        println!(
            "{:<24}rss at 1000 devices {:.1} MiB  budget {BUDGET_MIB:.0} MiB  {verdict}",
            "idle/budget", projected
        );
    }
}

/// Kills and reaps the vessel however the bench ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
