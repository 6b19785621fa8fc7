//! The durable vessel's numbers: start with 10,000 stored pairings (the
//! `dk vessel` process from spawn until its admin API answers, and
//! `Vessel::open` in-process), a grant or revoke committed and acknowledged
//! through the admin API (median and p99), the call path over the SQLite
//! store against the in-memory store at a normal rate (batches the audit
//! writer keeps up with), measured interleaved in one run, and calls at full
//! speed, faster than the disk: how many per second, and how many decisions
//! are missing from the log afterwards (there must be none).
//! The process part builds `dk` in release mode (`cargo build --release -p
//! dk`). Run with `cargo xtask bench` (or `cargo bench -p dk-vessel --bench
//! durable`). Figures are reported, never asserted on.

#[path = "../../dk-core/benches/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dk_core::adapter::CallContext;
use dk_http::{AdminClient, AdminToken};
use dk_policy::PolicySet;
use dk_store::{AuditEvent, SqliteStore, Store, StoredPairing};
use dk_vessel::{Limits, Vessel};
use futures::FutureExt;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use common::{BoxError, LAMP, build_dk, percentile};

const NAME: &str = "durable";
/// Stored pairings for the start measurements.
const PAIRINGS: usize = 10_000;
/// Starts measured, of the process and of `Vessel::open`.
const STARTS: usize = 7;
/// Grants (and as many revokes) through the admin API.
const CHANGES: usize = 500;
/// The start-up budget for 10,000 pairings.
const START_BUDGET: Duration = Duration::from_millis(300);
/// Calls per batch and batches per store in the call-path comparison.
const CALLS_PER_BATCH: usize = 2_000;
const BATCHES: usize = 101;
/// Calls made back to back at full speed, on each store.
const FULL_SPEED_CALLS: usize = 400_000;
/// How long any one step may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(60);

fn main() -> Result<(), BoxError> {
    if common::filtered_out(&[NAME]) {
        return Ok(());
    }
    // Removed however the bench ends.
    let scratch = tempfile::Builder::new()
        .prefix("dk-bench-durable-")
        .tempdir()?;
    let data_dir = scratch.path().join("data");
    let token_file = scratch.path().join("admin-token");

    println!("\n{NAME}: a vessel over its SQLite store");
    let started = Instant::now();
    write_pairings(&data_dir.join("vessel.db"))?;
    println!(
        "{NAME}: {PAIRINGS} pairings written in {:.1} s, one committed put_pairing each",
        started.elapsed().as_secs_f64()
    );

    let mut opens = Vec::with_capacity(STARTS);
    for _ in 0..STARTS {
        let started = Instant::now();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data_dir.join("vessel.db"))?);
        let vessel = Vessel::open(store, PolicySet::empty(), Limits::default())?;
        opens.push(started.elapsed());
        if vessel.registry().list().len() != PAIRINGS {
            return Err("Vessel::open did not load every pairing".into());
        }
    }
    report(
        "durable/vessel_open_10000_pairings",
        &mut opens,
        "in-process SqliteStore::open + Vessel::open",
    );

    let dk = build_dk()?;
    AdminToken::generate().write_to(&token_file)?;
    let token = AdminToken::parse(&std::fs::read_to_string(&token_file)?)
        .ok_or("the admin token file holds no token")?;
    let runtime = common::multi_thread(Some(2))?;
    // The calls below are driven from this thread; a call that waits for
    // the audit log reads tokio's timer, so this thread is in the runtime's
    // context.
    let _entered = runtime.enter();
    let mut starts = Vec::with_capacity(STARTS);
    let mut last = None;
    for i in 0..STARTS {
        let (vessel, took) = runtime.block_on(start(&dk, &data_dir, &token_file, &token))?;
        starts.push(took);
        if i + 1 == STARTS {
            last = Some(vessel);
        } else {
            vessel.interrupt()?;
        }
    }
    let median = percentile(&mut starts, 0.5);
    report(
        "durable/dk_vessel_start_10000_pairings",
        &mut starts,
        &format!(
            "spawn until GET /v1/status answers; budget {} ms: {}",
            START_BUDGET.as_millis(),
            if median <= START_BUDGET {
                "within"
            } else {
                "OVER"
            }
        ),
    );

    let vessel = last.ok_or("no vessel running")?;
    let admin = AdminClient::new(vessel.admin, token);
    let (mut grants, mut revokes) = runtime.block_on(changes(&admin))?;
    vessel.interrupt()?;
    report(
        "durable/admin_grant_committed",
        &mut grants,
        "PUT /v1/devices/{id}/grants/{cap}: committed, synced, then 204",
    );
    report(
        "durable/admin_revoke_committed",
        &mut revokes,
        "DELETE /v1/devices/{id}/grants/{cap}: committed, synced, then 204",
    );

    call_path(&scratch.path().join("calls"))?;
    Ok(())
}

fn shown(d: Duration) -> String {
    let nanos = d.as_secs_f64() * 1e9;
    if nanos >= 1e6 {
        format!("{:.2} ms", nanos / 1e6)
    } else if nanos >= 1e3 {
        format!("{:.2} µs", nanos / 1e3)
    } else {
        format!("{nanos:.1} ns")
    }
}

fn report(name: &str, samples: &mut [Duration], what: &str) {
    let median = percentile(samples, 0.5);
    let p99 = percentile(samples, 0.99);
    let (min, max) = (percentile(samples, 0.0), percentile(samples, 1.0));
    println!(
        "{name:<40}median {:>10}   p99 {:>10}   min {} max {}  ({} samples; {what})",
        shown(median),
        shown(p99),
        shown(min),
        shown(max),
        samples.len()
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A lamp manifest with its own id.
fn lamp(i: usize) -> Result<Value, BoxError> {
    let mut manifest: Map<String, Value> = serde_json::from_str(LAMP)?;
    manifest.insert("id".to_owned(), json!(format!("bench-{i:05}")));
    manifest.insert("name".to_owned(), json!(format!("Desk lamp {i}")));
    Ok(Value::Object(manifest))
}

/// 10,000 pairings stored as the registry stores them: the validated
/// manifest's stored JSON and digest, the hash of a random token, a
/// generation each, with their audit entries.
fn write_pairings(path: &Path) -> Result<(), BoxError> {
    let store = SqliteStore::open(path)?;
    for i in 0..PAIRINGS {
        let manifest = dk_proto::validate_manifest(&lamp(i)?)?;
        let token = hex(&rand::random::<[u8; 32]>());
        let pairing = StoredPairing {
            device_id: manifest.id().to_owned(),
            manifest_json: manifest.to_stored_json(),
            digest: manifest.digest(),
            token_hash: Sha256::digest(token.as_bytes()).into(),
            device_key: None,
            grants: vec!["read_light".to_owned()],
            generation: i as u64 + 1,
            paired_at_ms: now_ms(),
        };
        let audit = AuditEvent {
            at_ms: now_ms(),
            kind: "paired".to_owned(),
            entry: json!({"deviceId": pairing.device_id, "name": manifest.name(),
                "digest": pairing.digest, "grants": pairing.grants, "replaced": false,
                "noScreen": false}),
        };
        store.put_pairing(&pairing, &audit)?;
    }
    Ok(())
}

/// A `dk vessel` process, killed on drop unless interrupted.
struct Running {
    child: Option<Child>,
    admin: SocketAddr,
}

impl Running {
    /// SIGINT, and waits for the vessel to exit.
    fn interrupt(mut self) -> Result<(), BoxError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + PATIENCE;
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("dk vessel did not stop on SIGINT".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Spawns `dk vessel` and times it until `GET /v1/status` answers 200.
async fn start(
    dk: &Path,
    data_dir: &Path,
    token_file: &Path,
    token: &AdminToken,
) -> Result<(Running, Duration), BoxError> {
    let address_file = data_dir.join("vessel.json");
    let _ = std::fs::remove_file(&address_file);
    let started = Instant::now();
    let child = Command::new(dk)
        // Nothing of the bench's vessel lands in the real home.
        .env("DK_HOME", data_dir.parent().unwrap_or(data_dir))
        .args(["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .arg("--admin-token-file")
        .arg(token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let mut running = Running {
        child: Some(child),
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let deadline = started + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(&address_file)
            && let Ok(value) = serde_json::from_str::<Value>(&text)
            && let Some(admin) = value.get("admin").and_then(Value::as_str)
        {
            running.admin = admin.parse()?;
            break;
        }
        if Instant::now() > deadline {
            return Err("dk vessel did not write vessel.json".into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let admin = AdminClient::new(running.admin, token.clone());
    loop {
        if let Ok(answer) = admin.get("/v1/status").await
            && answer.status == 200
        {
            let took = started.elapsed();
            let paired = answer.body.get("paired").and_then(Value::as_u64);
            if paired != Some(PAIRINGS as u64) {
                return Err(format!("the vessel says {}", answer.body).into());
            }
            return Ok((running, took));
        }
        if Instant::now() > deadline {
            return Err("the admin API did not answer".into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// Grants then revokes `strobe` on devices in turn, each timed from the
/// request until its 204.
async fn changes(admin: &AdminClient) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let mut grants = Vec::with_capacity(CHANGES);
    let mut revokes = Vec::with_capacity(CHANGES);
    for i in 0..CHANGES {
        let path = format!("/v1/devices/bench-{:05}/grants/strobe", i % 100);
        let started = Instant::now();
        let answer = admin.put(&path).await?;
        grants.push(started.elapsed());
        if answer.status != 204 {
            return Err(format!("grant: {answer:?}").into());
        }
        let started = Instant::now();
        let answer = admin.delete(&path).await?;
        revokes.push(started.elapsed());
        if answer.status != 204 {
            return Err(format!("revoke: {answer:?}").into());
        }
    }
    Ok((grants, revokes))
}

/// One allowed call, on an instant link. It returns at once unless the
/// audit queue is full; then it waits for room.
fn call(vessel: &Vessel) -> Result<(), BoxError> {
    let ctx = CallContext {
        agent_id: Some("main"),
        session_id: Some("s1"),
        ..CallContext::default()
    };
    let mut call = std::pin::pin!(vessel.adapter().execute(
        std::hint::black_box("device__desk_lamp__set_light"),
        json!({"on": true, "brightness": 40}),
        ctx,
    ));
    let outcome = match call.as_mut().now_or_never() {
        Some(outcome) => outcome,
        None => futures::executor::block_on(call),
    };
    if outcome.is_ok() {
        Ok(())
    } else {
        Err("an allowed call failed".into())
    }
}

/// One batch of allowed calls, once the audit writer has caught up (a
/// normal rate: the writer keeps up); the time per call.
fn batch(vessel: &Vessel) -> Result<Duration, BoxError> {
    vessel.flush_audit()?;
    let started = Instant::now();
    for _ in 0..CALLS_PER_BATCH {
        call(vessel)?;
    }
    Ok(started.elapsed() / CALLS_PER_BATCH as u32)
}

/// The audit log's length.
fn logged(vessel: &Vessel) -> Result<u64, BoxError> {
    Ok(vessel.registry().store().load()?.audit_entries)
}

/// Calls back to back, faster than the audit writer commits them: the
/// time per call, and how many of their decisions are not in the log once
/// it is flushed.
fn full_speed(vessel: &Vessel) -> Result<(Duration, u64), BoxError> {
    vessel.flush_audit()?;
    let before = logged(vessel)?;
    let started = Instant::now();
    for _ in 0..FULL_SPEED_CALLS {
        call(vessel)?;
    }
    let took = started.elapsed();
    vessel.flush_audit()?;
    let recorded = logged(vessel)? - before;
    Ok((
        took / FULL_SPEED_CALLS as u32,
        FULL_SPEED_CALLS as u64 - recorded,
    ))
}

/// `execute` of an allowed call with no rules, a vessel over the memory
/// store and one over a SQLite store, batches alternating; then each at
/// full speed.
fn call_path(dir: &Path) -> Result<(), BoxError> {
    let limits = common::unbudgeted();
    let memory = Vessel::new(PolicySet::empty(), limits.clone());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("vessel.db"))?);
    let sqlite = Vessel::open(store, PolicySet::empty(), limits)?;
    // The desk lamp paired with `set_light` granted, on an instant link.
    common::pair_instant_lamp(memory.registry(), memory.links())?;
    common::pair_instant_lamp(sqlite.registry(), sqlite.links())?;
    // Warm up both.
    batch(&memory)?;
    batch(&sqlite)?;
    let mut on_memory = Vec::with_capacity(BATCHES);
    let mut on_sqlite = Vec::with_capacity(BATCHES);
    for i in 0..BATCHES {
        if i % 2 == 0 {
            on_memory.push(batch(&memory)?);
            on_sqlite.push(batch(&sqlite)?);
        } else {
            on_sqlite.push(batch(&sqlite)?);
            on_memory.push(batch(&memory)?);
        }
    }
    memory.flush_audit()?;
    sqlite.flush_audit()?;
    let what = format!(
        "execute of an allowed call on an instant link, {BATCHES} batches of {CALLS_PER_BATCH} interleaved, each once the audit writer caught up; each decision recorded to the store's audit writer"
    );
    let (m, s) = (
        percentile(&mut on_memory, 0.5),
        percentile(&mut on_sqlite, 0.5),
    );
    report("durable/execute_memory_store", &mut on_memory, &what);
    report("durable/execute_sqlite_store", &mut on_sqlite, &what);
    let ratio = s.as_secs_f64() / m.as_secs_f64().max(f64::MIN_POSITIVE);
    println!(
        "{:<40}sqlite/memory {ratio:.3}x   target within 1.10x: {}",
        "durable/execute_ratio",
        if ratio <= 1.10 { "within" } else { "OVER" },
    );
    for (name, vessel) in [
        ("durable/full_speed_memory_store", &memory),
        ("durable/full_speed_sqlite_store", &sqlite),
    ] {
        let (per_call, missing) = full_speed(vessel)?;
        println!(
            "{name:<40}{:>10} per call ({:.0} calls/s)   dropped {missing}   ({FULL_SPEED_CALLS} calls back to back; decisions missing from the log once flushed)",
            shown(per_call),
            1.0 / per_call.as_secs_f64().max(f64::MIN_POSITIVE),
        );
    }
    Ok(())
}
