//! `dk audit verify --store` on a large PostgreSQL log (`cargo xtask bench
//! verify-pg`, on demand): a PostgreSQL of the bench's own (dk-testkit's)
//! given a log of decisions the size of a fleet's (1,000,000 entries;
//! `DK_VERIFY_PG_ENTRIES` changes it), verified by the `dk` command as an
//! operator runs it, at a tenth of that size and at the whole.
//!
//! - `verify-pg/<entries>`: how long the command took, from spawn to exit,
//!   and its peak memory (`VmHWM`, read from `/proc` until it exits):
//!   memory is flat when the whole log costs what a tenth does.
//!
//! Figures are reported, never asserted on.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::BoxError;
use dk_store::{AuditEvent, PgStore, Store};
use dk_testkit::postgres::PgServer;
use serde_json::json;

/// Entries when `DK_VERIFY_PG_ENTRIES` is not set.
const DEFAULT_ENTRIES: u64 = 1_000_000;
/// Entries appended in one transaction while the log is filled.
const BATCH: u64 = 10_000;

fn main() -> Result<(), BoxError> {
    if std::env::var_os("DK_VERIFY_PG_SKIP").is_some() {
        return Ok(());
    }
    let entries = match std::env::var("DK_VERIFY_PG_ENTRIES") {
        Ok(text) => text
            .parse::<u64>()
            .map_err(|e| format!("DK_VERIFY_PG_ENTRIES `{text}`: {e}"))?,
        Err(_) => DEFAULT_ENTRIES,
    };
    common::main("verify-pg", || async move {
        run(Path::new(env!("CARGO_BIN_EXE_dk")), entries)
    })
}

/// A decision as a vessel records it, about 330 bytes of entry.
fn decision(n: u64) -> AuditEvent {
    let refused = n.is_multiple_of(10);
    AuditEvent {
        at_ms: 1_780_000_000_000 + n,
        kind: "decision".to_owned(),
        entry: json!({
            "tool": "device__desk_lamp__set_light",
            "deviceId": format!("lamp-{:05}", n % 30_000),
            "capability": "set_light",
            "agentId": format!("agent-{}", n % 7),
            "sessionId": format!("session-{}", n / 100),
            "allowed": !refused,
            "reason": if refused { "[policy] the lamp has been switched enough" } else { "allowed" },
            "input": {"on": n.is_multiple_of(2), "brightness": n % 100},
            "channel": "dk2",
        }),
    }
}

fn run(dk: &Path, entries: u64) -> Result<(), BoxError> {
    let pg = PgServer::start("verify-pg").ok_or("PostgreSQL is not installed")?;
    let url = pg.database();
    let store = PgStore::connect(&url)?;
    let sizes = [entries / 10, entries];
    let mut filled = 0;
    println!();
    for size in sizes {
        let started = Instant::now();
        while filled < size {
            let batch: Vec<AuditEvent> = (filled..size.min(filled + BATCH))
                .map(|n| decision(n + 1))
                .collect();
            store.append_audit(&batch)?;
            filled += batch.len() as u64;
        }
        println!(
            "verify-pg/fill: {filled} entries in the log after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let (took, peak_kib, said) = verify(dk, &url)?;
        if !said.contains(&format!("\"entries\":{filled}")) || !said.contains("\"intact\":true") {
            return Err(format!("dk audit verify said {said}").into());
        }
        println!(
            "verify-pg/{filled}: {:.2} s ({:.0} entries/s), peak memory {:.1} MiB",
            took.as_secs_f64(),
            filled as f64 / took.as_secs_f64(),
            peak_kib as f64 / 1024.0
        );
    }
    Ok(())
}

/// Runs `dk audit verify --store URL` to its end: how long it took, its
/// peak memory in KiB, and what it printed.
fn verify(dk: &Path, url: &str) -> Result<(Duration, u64, String), BoxError> {
    let started = Instant::now();
    let mut child = common::Killed(
        Command::new(dk)
            .args([
                "audit",
                "verify",
                "--store",
                url,
                "--no-kept-head",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let status = format!("/proc/{}/status", child.0.id());
    let mut peak = 0;
    loop {
        // The high-water mark only grows; it is gone once the process has
        // exited (before it is waited for).
        if let Some(kib) = std::fs::read_to_string(&status)
            .ok()
            .and_then(|text| high_water_kib(&text))
        {
            peak = peak.max(kib);
        }
        if child.0.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = started.elapsed();
    let mut out = String::new();
    if let Some(mut stdout) = child.0.stdout.take() {
        std::io::Read::read_to_string(&mut stdout, &mut out)?;
    }
    Ok((took, peak, out))
}

/// The `VmHWM` of a `/proc/PID/status`, in KiB.
fn high_water_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}
