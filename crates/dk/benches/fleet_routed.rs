//! A fleet of three vessels (`cargo xtask bench fleet-routed`): three `dk
//! vessel` processes on one PostgreSQL and one `nats-server` (Debian's,
//! started by the bench in temporary directories), each holding 3,000 dk/2
//! lamps (`DK_FLEET_ROUTED_DEVICES` changes the count), the lamps real
//! dk-device clients in this process.
//!
//! - `fleet-routed/local` and `fleet-routed/routed`: one call at a time to
//!   the same lamp, through the admin API of the member holding it and of
//!   another member (the call decided there and carried over NATS),
//!   interleaved; medians, and the routed call's cost over the local one
//!   (budget 1 ms);
//! - `fleet-routed/throughput`: 32 callers for 10 s on random lamps
//!   through random members (two calls in three routed), every decision in
//!   the shared PostgreSQL log; beside one vessel on SQLite with as many
//!   lamps under the same callers.
//!
//! Figures are reported, never asserted on.

mod common;
#[path = "fleet/mod.rs"]
mod fleet;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::BoxError;
use dk_http::AdminClient;
use dk_store::PgStore;
use dk_testkit::nats::{Nats, nats_or_skip};
use dk_testkit::postgres::PgServer;
use fleet::{Fleet, Home, Member, Vessel, read_tool};
use serde_json::json;

/// Lamps per member when `DK_FLEET_ROUTED_DEVICES` is not set.
const DEFAULT_DEVICES: usize = 3_000;
/// Members.
const MEMBERS: usize = 3;
/// Calls measured one at a time, each way.
const SINGLE_CALLS: usize = 400;
/// Callers at once, and for how long, for the throughput.
const CALLERS: usize = 32;
const THROUGHPUT_FOR: Duration = Duration::from_secs(10);
/// The budget of a routed call over a local one.
const ROUTED_BUDGET: Duration = Duration::from_millis(1);

fn main() -> Result<(), BoxError> {
    if std::env::var_os("DK_FLEET_SKIP").is_some() {
        return Ok(());
    }
    let devices = match std::env::var("DK_FLEET_ROUTED_DEVICES") {
        Ok(text) => text
            .parse::<usize>()
            .map_err(|e| format!("DK_FLEET_ROUTED_DEVICES `{text}`: {e}"))?,
        Err(_) => DEFAULT_DEVICES,
    };
    common::main("fleet-routed", || {
        run(Path::new(env!("CARGO_BIN_EXE_dk")), devices)
    })
}

async fn run(dk: &Path, devices: usize) -> Result<(), BoxError> {
    let pg = PgServer::start("fleet-routed").ok_or("PostgreSQL is not installed")?;
    let nats = Nats::start(
        nats_or_skip("fleet-routed").ok_or("nats-server is not installed")?,
        "",
    );
    let url = pg.database();
    let fleet_secret: [u8; 32] = rand::random();
    let seeded = Instant::now();
    let homes = {
        let store = PgStore::connect(&url)?;
        (0..MEMBERS)
            .map(|k| Home::seed_member(devices, k * devices, fleet_secret, &store))
            .collect::<Result<Vec<_>, _>>()?
    };
    println!(
        "\nfleet-routed: {} dk/2 lamps paired through one PostgreSQL store in {:.1} s, {devices} on each of {MEMBERS} vessels",
        devices * MEMBERS,
        seeded.elapsed().as_secs_f64()
    );
    let mut vessels = Vec::new();
    let mut lamps = Vec::new();
    for (k, home) in homes.iter().enumerate() {
        let member = Member {
            store: url.clone(),
            nats: nats.url(),
            name: format!("m{k}"),
        };
        let port = fleet::free_port()?;
        let (vessel, took) = Vessel::start_as(dk, home, port, Some(&member)).await?;
        let mut held = Fleet::start(home, port)?;
        let connecting = held.connected(&vessel).await?;
        println!(
            "  member m{k}: started in {:.0} ms, its {devices} lamps connected in {:.1} s",
            took.as_secs_f64() * 1e3,
            connecting.as_secs_f64()
        );
        vessels.push(vessel);
        lamps.push(held);
    }
    let admins: Vec<&AdminClient> = vessels.iter().map(|v| &v.admin).collect();
    let [holder, other, third] = admins.as_slice() else {
        return Err("three members expected".into());
    };
    // Every member reaches lamp 0 (held by m0) before anything is timed.
    wait_reachable(other, 0).await?;
    wait_reachable(third, 0).await?;

    let (local, routed) = single_calls(holder, other, 0).await?;
    let (local, routed) = (common::median(local), common::median(routed));
    let overhead = routed.saturating_sub(local);
    println!(
        "{:<28}median {:>8.3} ms   ({SINGLE_CALLS} calls one at a time to lamp 0 through the member holding it)",
        "fleet-routed/local",
        ms(local)
    );
    println!(
        "{:<28}median {:>8.3} ms   (the same calls through another member, interleaved)",
        "fleet-routed/routed",
        ms(routed)
    );
    println!(
        "{:<28}median {:>8.3} ms   (routed minus local, same run; budget {} ms: {})",
        "fleet-routed/overhead",
        ms(overhead),
        ROUTED_BUDGET.as_millis(),
        verdict(overhead <= ROUTED_BUDGET)
    );

    let lamps_total = devices * MEMBERS;
    let fleet_rate = throughput(&admins, lamps_total).await?;
    println!(
        "{:<28}{:>8.0} calls/s   ({CALLERS} callers for {} s on random lamps of {lamps_total} through random members of {MEMBERS}, every decision in PostgreSQL)",
        "fleet-routed/throughput",
        fleet_rate,
        THROUGHPUT_FOR.as_secs()
    );
    for held in lamps {
        held.stop().await?;
    }
    for vessel in vessels {
        vessel.interrupt().await?;
    }

    // One vessel on SQLite with as many lamps, under the same callers.
    let home = Home::seed(lamps_total)?;
    let port = fleet::free_port()?;
    let (vessel, _) = Vessel::start(dk, &home, port).await?;
    let mut held = Fleet::start(&home, port)?;
    held.connected(&vessel).await?;
    let single_rate = throughput(&[&vessel.admin], lamps_total).await?;
    println!(
        "{:<28}{:>8.0} calls/s   (one vessel on SQLite, {lamps_total} lamps, the same callers; the fleet does {:.2}x)",
        "fleet-routed/one_vessel",
        single_rate,
        fleet_rate / single_rate.max(1.0)
    );
    held.stop().await?;
    vessel.interrupt().await?;
    drop(nats);
    Ok(())
}

/// Waits until `admin`'s vessel can call lamp `i`.
async fn wait_reachable(admin: &AdminClient, i: usize) -> Result<(), BoxError> {
    let deadline = Instant::now() + fleet::PATIENCE;
    loop {
        let answer = call(admin, i).await?;
        if answer {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("lamp {i} not reachable").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One call to lamp `i` through `admin`: whether it succeeded.
async fn call(admin: &AdminClient, i: usize) -> Result<bool, BoxError> {
    let answer = admin
        .post(
            "/v1/tools/call",
            &json!({"tool": read_tool(i), "input": {}}),
        )
        .await?;
    Ok(answer.status == 200 && answer.body.get("ok") == Some(&serde_json::Value::Bool(true)))
}

/// [`SINGLE_CALLS`] timed calls each way, interleaved.
async fn single_calls(
    holder: &AdminClient,
    other: &AdminClient,
    i: usize,
) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let (mut local, mut routed) = (Vec::new(), Vec::new());
    for _ in 0..SINGLE_CALLS {
        for (admin, times) in [(holder, &mut local), (other, &mut routed)] {
            let started = Instant::now();
            if !call(admin, i).await? {
                return Err("a timed call failed".into());
            }
            times.push(started.elapsed());
        }
    }
    Ok((local, routed))
}

/// Calls per second from [`CALLERS`] callers for [`THROUGHPUT_FOR`], each
/// call to a random lamp of `lamps` through a random one of `admins`.
async fn throughput(admins: &[&AdminClient], lamps: usize) -> Result<f64, BoxError> {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + THROUGHPUT_FOR;
    let started = Instant::now();
    let callers = (0..CALLERS).map(|_| {
        let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
        async move {
            while Instant::now() < until {
                let pick = rand::random_range(0..admins.len());
                let lamp = rand::random_range(0..lamps);
                let Some(admin) = admins.get(pick) else {
                    break;
                };
                match call(admin, lamp).await {
                    Ok(true) => done.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }
    });
    futures::future::join_all(callers).await;
    let took = started.elapsed().as_secs_f64();
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        println!("  {failed} calls failed during the throughput run");
    }
    Ok(done.load(Ordering::Relaxed) as f64 / took)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
}
