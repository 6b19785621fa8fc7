//! Benchmarks of the durable store on a real file in the temp directory:
//! a grant committed and synced, a pairing put, the load of 10,000
//! pairings, an audit batch of 256, and the cost of `AuditWriter::record`.
//! Before divan's table it prints median and p99 of the committed writes,
//! measured one by one. Run with `cargo bench -p dk-store --bench store`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dk_store::{
    AuditEvent, AuditWriter, MemoryStore, SqliteStore, Store, StoredPairing, WriterOptions,
};
use serde_json::json;

/// Pairings in the load bench.
const DEVICES: usize = 10_000;

/// Writes measured one by one for the percentiles.
const ROUNDS: usize = 1_000;

/// Records measured one by one (fewer than the writer's queue holds).
const RECORDS: usize = 50_000;

fn main() {
    percentiles();
    divan::main();
}

/// A directory for one bench's database, removed on drop.
struct Scratch(tempfile::TempDir);

impl Scratch {
    #[expect(clippy::panic, reason = "a bench cannot go on without its directory")]
    fn new(name: &str) -> Scratch {
        match tempfile::Builder::new()
            .prefix(&format!("dk-store-bench-{name}-"))
            .tempdir()
        {
            Ok(dir) => Scratch(dir),
            Err(error) => panic!("cannot make the bench directory: {error}"),
        }
    }

    #[expect(clippy::panic, reason = "a bench cannot go on without its store")]
    fn open(&self) -> SqliteStore {
        match SqliteStore::open(&self.0.path().join("dk.db")) {
            Ok(store) => store,
            Err(error) => panic!("cannot open the bench store: {error}"),
        }
    }
}

fn pairing(id: &str, generation: u64) -> StoredPairing {
    StoredPairing {
        device_id: id.to_owned(),
        manifest_json: format!(
            r#"{{"capabilities":[{{"description":"Turn the lamp on or off","input":{{"on":{{"type":"boolean"}}}},"kind":"actuator","name":"set_power"}}],"deviceId":"{id}","name":"Desk lamp","protocol":"8dk/1"}}"#
        ),
        digest: format!("sha256:{id:0>64}"),
        token_hash: [7; 32],
        device_key: None,
        grants: vec!["set_power".to_owned(), "brightness".to_owned()],
        generation,
        paired_at_ms: 1_700_000_000_000,
    }
}

fn event(kind: &str, n: u64) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: kind.to_owned(),
        entry: json!({
            "agentId": "agent-1", "sessionId": "session-1", "device": "desk-lamp",
            "capability": "set_power", "input": { "on": true },
            "decision": "allowed", "rule": "grant", "n": n,
        }),
    }
}

#[expect(clippy::panic, reason = "a failed write ends the bench")]
fn must<T>(result: Result<T, dk_store::StoreError>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("store error in bench: {error}"),
    }
}

fn print(name: &str, mut samples: Vec<Duration>) {
    println!(
        "{name:<36}median {:>9.2} µs   p99 {:>9.2} µs   ({} samples)",
        micros(percentile(&mut samples, 0.5)),
        micros(percentile(&mut samples, 0.99)),
        samples.len()
    );
}

/// Committed writes timed one by one, for median and p99.
fn percentiles() {
    let scratch = Scratch::new("percentiles");
    let store = scratch.open();
    must(store.put_pairing(&pairing("desk-lamp", 1), &event("paired", 0)));
    let mut grants = Vec::with_capacity(ROUNDS);
    for n in 0..ROUNDS {
        let granted = n.is_multiple_of(2);
        let kind = if granted { "granted" } else { "revoked" };
        let started = Instant::now();
        must(store.set_grant("desk-lamp", "color", granted, &event(kind, n as u64)));
        grants.push(started.elapsed());
    }
    print("store/set_grant_committed", grants);

    let mut puts = Vec::with_capacity(ROUNDS);
    for n in 0..ROUNDS {
        let p = pairing(&format!("device-{}", n % 100), n as u64 + 2);
        let started = Instant::now();
        must(store.put_pairing(&p, &event("paired", n as u64)));
        puts.push(started.elapsed());
    }
    print("store/put_pairing_committed", puts);

    let store: Arc<dyn Store> = Arc::new(store);
    let writer = AuditWriter::start(Arc::clone(&store), WriterOptions::default());
    let events: Vec<AuditEvent> = (0..RECORDS as u64).map(|n| event("decision", n)).collect();
    let mut records = Vec::with_capacity(RECORDS);
    for event in events {
        let started = Instant::now();
        writer.record(event);
        records.push(started.elapsed());
    }
    let started = Instant::now();
    must(writer.flush());
    let drained = started.elapsed();
    print("store/audit_writer_record", records);
    println!(
        "store/audit_writer: {} committed in {} batches, {} dropped, queue drained {:.1} ms after the last record",
        writer.committed(),
        writer.batches(),
        writer.dropped(),
        drained.as_secs_f64() * 1e3
    );
}

#[divan::bench(sample_count = 200, sample_size = 1)]
fn set_grant_committed(bencher: divan::Bencher) {
    let scratch = Scratch::new("set-grant");
    let store = scratch.open();
    must(store.put_pairing(&pairing("desk-lamp", 1), &event("paired", 0)));
    let mut n = 0u64;
    bencher.bench_local(|| {
        n += 1;
        let granted = n.is_multiple_of(2);
        must(store.set_grant("desk-lamp", "color", granted, &event("granted", n)));
    });
}

#[divan::bench(sample_count = 200, sample_size = 1)]
fn put_pairing_committed(bencher: divan::Bencher) {
    let scratch = Scratch::new("put-pairing");
    let store = scratch.open();
    let mut n = 0u64;
    bencher.bench_local(|| {
        n += 1;
        let p = pairing(&format!("device-{}", n % 100), n);
        must(store.put_pairing(&p, &event("paired", n)));
    });
}

#[divan::bench(sample_count = 100, sample_size = 1)]
fn append_audit_batch_256(bencher: divan::Bencher) {
    let scratch = Scratch::new("append");
    let store = scratch.open();
    let batch: Vec<AuditEvent> = (0..256).map(|n| event("decision", n)).collect();
    bencher.bench_local(|| must(store.append_audit(black_box(&batch))));
}

#[divan::bench(sample_count = 20, sample_size = 1)]
fn load_10000_pairings(bencher: divan::Bencher) {
    let scratch = Scratch::new("load");
    let store = scratch.open();
    // Written through the store, one committed pairing each, as a vessel
    // would have over time; only the first run pays for this.
    for n in 0..DEVICES {
        must(store.put_pairing(
            &pairing(&format!("device-{n:05}"), n as u64 + 1),
            &event("paired", n as u64),
        ));
    }
    drop(store);
    let store = scratch.open();
    bencher.bench_local(|| {
        let snapshot = must(store.load());
        assert_eq!(snapshot.pairings.len(), DEVICES);
        snapshot
    });
}

#[divan::bench(sample_count = 100, sample_size = 100)]
fn audit_writer_record(bencher: divan::Bencher) {
    // Over the in-memory store so the queue never fills during the bench:
    // what is measured is the caller's side only.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let writer = AuditWriter::start(store, WriterOptions::default());
    bencher
        .with_inputs(|| event("decision", 1))
        .bench_local_values(|event| writer.record(event));
    if writer.dropped() > 0 {
        println!("audit_writer_record: {} dropped", writer.dropped());
    }
}

/// The sample at quantile `q` (0 to 1, the nearest rank), sorting them.
fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len().saturating_sub(1)) as f64 * q).round() as usize;
    samples.get(i).copied().unwrap_or_default()
}

/// A duration in microseconds.
fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
