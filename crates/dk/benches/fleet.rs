//! One vessel at fleet scale (`cargo xtask bench fleet`): a `dk vessel`
//! process with 10,000 dk/2 lamps paired through the store
//! (`DK_FLEET_DEVICES` changes the count), the lamps real dk-device clients
//! in this process, the load generator, apart from the vessel it measures.
//!
//! - `fleet/start`: the vessel's start with every pairing, from the spawn
//!   until its admin API answers (median of 7);
//! - `fleet/memory`: its resident memory before any lamp connects and once
//!   every lamp is connected and the vessel's memory has settled (jemalloc
//!   gives back what the connecting burst used over about ten seconds), per
//!   lamp; the figure 2 s after the last lamp connected is shown beside it;
//! - `fleet/storm`: the vessel killed with SIGKILL and started again at
//!   once; the time until 50%, 99% and 100% of the lamps are connected again
//!   and have answered a call, and why any attempt failed;
//! - `fleet/calls`: calls spread over 1,000 lamps, allowed by their grants
//!   and past 1,000 rules, every decision in the SQLite audit log: the
//!   vessel's CPU time per call and the calls per second, beside a bare
//!   WebSocket echo server's CPU per message under the same generator
//!   (`fleet/calls.rs`).
//!
//! Needs an open-files limit above the lamps plus a margin. Figures are
//! reported, never asserted on.

#[path = "fleet/calls.rs"]
mod calls;
mod common;
#[path = "fleet/mod.rs"]
mod fleet;

use std::path::Path;
use std::time::{Duration, Instant};

use common::BoxError;
use fleet::{Fleet, Home, Vessel};

/// The allocator `dk` itself uses, so the vessel measured here (and the echo
/// beside it) allocate as the shipped binary does.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Lamps when `DK_FLEET_DEVICES` is not set.
const DEFAULT_DEVICES: usize = 10_000;
/// Starts measured.
const STARTS: usize = 7;
/// When the memory is read first, after the last lamp connected.
const IDLE: Duration = Duration::from_secs(2);
/// The longest the bench waits for the memory to settle after that.
const SETTLE: Duration = Duration::from_secs(30);
/// The budgets of the issue this bench answers to.
const START_BUDGET: Duration = Duration::from_millis(100);
const MEMORY_BUDGET_KIB: f64 = 16.0;
const STORM_BUDGET: Duration = Duration::from_secs(20);

fn main() -> Result<(), BoxError> {
    if let Some(role) = calls::child_role() {
        return calls::run_child(&role);
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // `fleet` runs both parts; `fleet/scale` (start, memory, storm) or
    // `fleet/calls` one of them.
    let wants = |part: &str| {
        filter.is_empty()
            || filter
                .iter()
                .any(|f| part.starts_with(f.as_str()) || f.starts_with(part))
    };
    let (scale_too, calls_too) = (wants("fleet/scale"), wants("fleet/calls"));
    // `cargo xtask bench` without a filter skips it: it takes minutes.
    if (!scale_too && !calls_too) || std::env::var_os("DK_FLEET_SKIP").is_some() {
        return Ok(());
    }
    let devices = match std::env::var("DK_FLEET_DEVICES") {
        Ok(text) => text
            .parse::<usize>()
            .map_err(|e| format!("DK_FLEET_DEVICES `{text}`: {e}"))?,
        Err(_) => DEFAULT_DEVICES,
    };
    let dk = Path::new(env!("CARGO_BIN_EXE_dk"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if scale_too {
        runtime.block_on(scale(dk, devices))?;
    }
    if calls_too {
        runtime.block_on(calls::throughput())?;
    }
    Ok(())
}

/// Start, memory and the storm, on one home of `devices` lamps.
async fn scale(dk: &Path, devices: usize) -> Result<(), BoxError> {
    let seeded = Instant::now();
    let home = Home::seed(devices)?;
    println!(
        "\nfleet: {devices} dk/2 lamps paired through the store in {:.1} s; the vessel is `{}`",
        seeded.elapsed().as_secs_f64(),
        dk.display()
    );
    let port = fleet::free_port()?;

    let mut starts = Vec::with_capacity(STARTS);
    let mut last = None;
    for i in 0..STARTS {
        let (vessel, took) = Vessel::start(dk, &home, port).await?;
        starts.push(took);
        if i + 1 == STARTS {
            last = Some(vessel);
        } else {
            vessel.interrupt().await?;
        }
    }
    let start = common::median(starts.clone());
    println!(
        "{:<28}median {:>8.1} ms   min {:.1} ms  max {:.1} ms  ({STARTS} starts with {devices} pairings, spawn until GET /v1/status answers; budget {} ms: {})",
        format!("fleet/start_{devices}"),
        ms(start),
        ms(starts.iter().copied().min().unwrap_or_default()),
        ms(starts.iter().copied().max().unwrap_or_default()),
        START_BUDGET.as_millis(),
        verdict(start <= START_BUDGET)
    );
    let vessel = last.ok_or("no vessel running")?;

    tokio::time::sleep(Duration::from_millis(200)).await;
    let baseline = vessel.status_kib("VmRSS")?;
    let mut lamps = Fleet::start(&home, port)?;
    let connecting = lamps.connected(&vessel).await?;
    tokio::time::sleep(IDLE).await;
    let early = vessel.status_kib("VmRSS")?;
    let (idle, settled_after) = settled(&vessel).await?;
    let peak = vessel.status_kib("VmHWM")?;
    let per_lamp = |rss: u64| rss.saturating_sub(baseline) as f64 / devices.max(1) as f64;
    let per_device = per_lamp(idle);
    println!(
        "{:<28}per lamp {per_device:>6.1} KiB   rss {:.1} MiB  before the lamps {:.1} MiB  peak {:.1} MiB  (all connected in {:.1} s, settled {:.0} s later; {:.1} KiB a lamp {} s after; budget {MEMORY_BUDGET_KIB:.0} KiB: {})",
        format!("fleet/memory_{devices}"),
        idle as f64 / 1024.0,
        baseline as f64 / 1024.0,
        peak as f64 / 1024.0,
        connecting.as_secs_f64(),
        (IDLE + settled_after).as_secs_f64(),
        per_lamp(early),
        IDLE.as_secs(),
        verdict(per_device <= MEMORY_BUDGET_KIB)
    );

    let (vessel, storm) = lamps.storm(vessel, dk, &home, port, Duration::ZERO).await?;
    println!(
        "{:<28}median {:>8.1} ms   p99 {:.1} ms  all {:.1} ms  (budget for all {} s: {})\n  {storm}",
        format!("fleet/storm_{devices}"),
        ms(storm.p50),
        ms(storm.p99),
        ms(storm.all),
        STORM_BUDGET.as_secs(),
        verdict(storm.all <= STORM_BUDGET)
    );
    lamps.stop().await?;
    vessel.interrupt().await?;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The vessel's resident memory once it stops falling: read every second
/// until four readings in a row are within 0.5% of each other (three
/// seconds without a change), or until [`SETTLE`] has passed; and how long
/// that took.
async fn settled(vessel: &Vessel) -> Result<(u64, Duration), BoxError> {
    let started = Instant::now();
    let mut readings = std::collections::VecDeque::from([vessel.status_kib("VmRSS")?]);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = vessel.status_kib("VmRSS")?;
        readings.push_back(now);
        if readings.len() > 4 {
            readings.pop_front();
        }
        let low = readings.iter().copied().min().unwrap_or(now);
        let high = readings.iter().copied().max().unwrap_or(now);
        let steady = readings.len() == 4 && (high - low) * 200 <= low;
        if steady || started.elapsed() >= SETTLE {
            return Ok((now, started.elapsed()));
        }
    }
}

fn verdict(within: bool) -> &'static str {
    if within { "within" } else { "OVER" }
}
