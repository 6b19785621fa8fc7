//! Benchmarks of the PostgreSQL store on dk-testkit's server (loopback, the
//! test server's settings: no fsync), beside the SQLite store in the same
//! run: a grant committed, one decision appended, a batch of 256, and
//! three stores on one database appending from four threads each (one
//! chain, serialized in the database). Run with
//! `cargo bench -p dk-store --features postgres --bench pg`; without
//! PostgreSQL it says so and measures nothing.

use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dk_store::{AuditEvent, PgStore, SqliteStore, Store, StoreError, StoredPairing};
use dk_testkit::postgres::PgServer;
use serde_json::json;

/// Writes timed one by one for the percentiles.
const ROUNDS: usize = 500;

/// Stores, threads each, and appends each thread makes, for the
/// throughput of one chain.
const STORES: usize = 3;
const THREADS: usize = 4;
const APPENDS: usize = 200;

fn main() {
    if server().is_none() {
        return;
    }
    percentiles();
    throughput();
    divan::main();
}

/// The bench binary's server, or `None` when PostgreSQL is missing.
fn server() -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<&'static PgServer>> = OnceLock::new();
    *SERVER.get_or_init(|| PgServer::shared("bench pg"))
}

#[expect(clippy::panic, reason = "a failed write ends the bench")]
fn must<T>(result: Result<T, StoreError>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("store error in bench: {error}"),
    }
}

/// A store on a fresh database.
fn pg() -> PgStore {
    let Some(server) = server() else {
        std::process::exit(0);
    };
    must(PgStore::connect(&server.database()))
}

/// An SQLite store in a directory removed on drop.
fn sqlite() -> (tempfile::TempDir, SqliteStore) {
    let dir = match tempfile::Builder::new().prefix("dk-pg-bench-").tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("cannot make the bench directory: {error}");
            std::process::exit(1);
        }
    };
    let store = must(SqliteStore::open(&dir.path().join("dk.db")));
    (dir, store)
}

fn pairing(id: &str, generation: u64) -> StoredPairing {
    StoredPairing {
        device_id: id.to_owned(),
        manifest_json: format!(r#"{{"deviceId":"{id}","name":"Desk lamp"}}"#),
        digest: format!("sha256:{id:0>64}"),
        token_hash: [7; 32],
        device_key: None,
        grants: vec!["set_power".to_owned()],
        generation,
        paired_at_ms: 1_700_000_000_000,
    }
}

fn event(kind: &str, n: u64) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: kind.to_owned(),
        entry: json!({
            "agentId": "agent-1", "deviceId": "desk-lamp", "capability": "set_power",
            "input": { "on": true }, "allowed": true, "n": n,
        }),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn percentile(samples: &mut [Duration], at: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * at).round() as usize;
    samples.get(index).copied().unwrap_or_default()
}

fn print(name: &str, mut samples: Vec<Duration>) {
    println!(
        "{name:<36}median {:>9.2} µs   p99 {:>9.2} µs   ({} samples)",
        micros(percentile(&mut samples, 0.5)),
        micros(percentile(&mut samples, 0.99)),
        samples.len()
    );
}

/// A grant and a one-decision append, timed one by one, on each store.
fn percentiles() {
    let (_dir, lite) = sqlite();
    let stores: [(&str, Box<dyn Store>); 2] = [("pg", Box::new(pg())), ("sqlite", Box::new(lite))];
    for (name, store) in stores {
        must(store.put_pairing(&pairing("desk-lamp", 1), &event("paired", 0)));
        let mut grants = Vec::with_capacity(ROUNDS);
        let mut appends = Vec::with_capacity(ROUNDS);
        for n in 0..ROUNDS {
            let granted = n.is_multiple_of(2);
            let kind = if granted { "granted" } else { "revoked" };
            let started = Instant::now();
            must(store.set_grant("desk-lamp", "color", granted, &event(kind, n as u64)));
            grants.push(started.elapsed());
            let started = Instant::now();
            must(store.append_audit(&[event("decision", n as u64)]));
            appends.push(started.elapsed());
        }
        print(&format!("{name}/set_grant_committed"), grants);
        print(&format!("{name}/append_one_decision"), appends);
    }
}

/// Entries a second into one chain, from `STORES` stores (one SQLite
/// store shared for SQLite) and `THREADS` threads each.
fn throughput() {
    let url = match server() {
        Some(server) => server.database(),
        None => return,
    };
    let pg: Vec<Arc<dyn Store>> = (0..STORES)
        .map(|_| Arc::new(must(PgStore::connect(&url))) as Arc<dyn Store>)
        .collect();
    let (_dir, lite) = sqlite();
    let lite: Arc<dyn Store> = Arc::new(lite);
    let shared: Vec<Arc<dyn Store>> = (0..STORES).map(|_| Arc::clone(&lite)).collect();
    for (name, stores) in [("pg", pg), ("sqlite", shared)] {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for store in &stores {
                for t in 0..THREADS {
                    scope.spawn(move || {
                        for n in 0..APPENDS {
                            must(
                                store.append_audit(&[event("decision", (t * APPENDS + n) as u64)]),
                            );
                        }
                    });
                }
            }
        });
        let took = started.elapsed();
        let entries = STORES * THREADS * APPENDS;
        let intact = stores
            .first()
            .map(|store| must(store.verify_audit()).is_intact())
            .unwrap_or(false);
        println!(
            "{name}/one_chain_{STORES}x{THREADS}_threads: {entries} appends in {:.0} ms, {:.0} a second, chain intact: {intact}",
            took.as_secs_f64() * 1e3,
            entries as f64 / took.as_secs_f64()
        );
    }
}

#[divan::bench(sample_count = 100, sample_size = 1)]
fn pg_append_audit_batch_256(bencher: divan::Bencher) {
    let store = pg();
    let batch: Vec<AuditEvent> = (0..256).map(|n| event("decision", n)).collect();
    bencher.bench_local(|| must(store.append_audit(black_box(&batch))));
}

#[divan::bench(sample_count = 100, sample_size = 1)]
fn sqlite_append_audit_batch_256(bencher: divan::Bencher) {
    let (_dir, store) = sqlite();
    let batch: Vec<AuditEvent> = (0..256).map(|n| event("decision", n)).collect();
    bencher.bench_local(|| must(store.append_audit(black_box(&batch))));
}
