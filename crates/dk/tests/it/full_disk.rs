//! `dk vessel` with its home on a small disk of its own (a tmpfs of 24 MiB,
//! so the tests run as root), filled while calls arrive, with a real
//! device counting the calls that reach it:
//!
//! - from the call refused because the store cannot be written on, no call
//!   reaches the device, and `/readyz` names `store` (the two agree);
//! - every call that reached the device has its decision in the log, which
//!   verifies, once the vessel is ended by SIGABRT (systemd's watchdog),
//!   SIGKILL or SIGTERM: the store's reserve, released when the disk
//!   filled, took them;
//! - a start on the disk still full is refused at once with exit status 75
//!   (the unit's `RestartPreventExitStatus=`), saying where and how much to
//!   free; once space is freed it starts, and calls reach the device again;
//! - a vessel left running takes calls again by itself once space is freed
//!   (its reserve made again);
//! - the disk filling is logged as an error, with plain fields.
//!
//! Without root the tests say so and pass, unless `DK_REQUIRE_PEERS` is set.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dk_device::Device;
use dk_http::AdminClient;
use dk_testkit::SmallDisk;
use serde_json::{Value, json};

use crate::durable::{DeviceRun, approve, connected};
use crate::log_fields::{debug_text, events};
use crate::process::{Killed, Running, Scratch, audit, audit_entries, eventually};
use crate::prometheus::get;

/// The disk's size: the store, its log, its 4 MiB reserve and the 1 MiB it
/// wants beside it fit with room to spare.
const DISK_MIB: u32 = 24;
const MARK: &str = "device__counter__mark";
const AUDIT_FAILING: &str =
    "[8dk-deny] the audit log cannot be written now: no call is made until it can";
/// `dk vessel`'s exit status for a disk without room for the store.
const NO_ROOM_EXIT: i32 = 75;

/// A counter: `mark` (an actuator) notes the `n` of each call that reaches
/// it.
fn counter(seen: Arc<Mutex<BTreeSet<u64>>>) -> Device {
    let manifest = json!({
        "id": "counter",
        "name": "Counter",
        "kind": "counter",
        "version": "1.0.0",
        "capabilities": [{
            "name": "mark",
            "kind": "actuator",
            "description": "Note a number.",
            "params": {"n": {"type": "number", "required": true}},
        }],
    });
    Device::define(&manifest)
        .handler("mark", move |input| {
            if let Some(n) = input["n"].as_u64() {
                seen.lock().unwrap().insert(n);
            }
            async { Ok(json!({"marked": true})) }
        })
        .build()
        .unwrap()
}

/// The calls a test makes, one after another, each with the next number.
struct Calls {
    admin: AdminClient,
    next: AtomicU64,
}

impl Calls {
    /// One call: `Ok(n)` when allowed, else its number and the reason.
    async fn make(&self) -> Result<u64, (u64, String)> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .admin
            .post("/v1/tools/call", &json!({"tool": MARK, "input": {"n": n}}))
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        if answer.body["ok"] == true {
            Ok(n)
        } else {
            Err((n, answer.body["reason"].as_str().unwrap_or("").to_owned()))
        }
    }
}

/// A vessel on the small disk, with the counter paired, granted `mark` and
/// connected.
struct Setup {
    vessel: Running,
    device: DeviceRun,
    calls: Calls,
    seen: Arc<Mutex<BTreeSet<u64>>>,
}

async fn setup(scratch: &Scratch) -> Setup {
    let vessel = start(scratch);
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let device = DeviceRun::spawn(
        counter(Arc::clone(&seen)),
        &vessel.url(),
        &scratch.device_token_file("counter"),
    );
    let dir = scratch.data_dir();
    approve(&dir, "counter", "mark").await;
    connected(&dir, &["counter"]).await;
    let calls = Calls {
        admin: vessel.admin(scratch),
        next: AtomicU64::new(1),
    };
    Setup {
        vessel,
        device,
        calls,
        seen,
    }
}

/// `dk vessel` on `scratch`'s home, logging JSON at `info`.
fn start(scratch: &Scratch) -> Running {
    Running::start_env(
        scratch,
        &["--log-format", "json", "--mcp-listen", "127.0.0.1:0"],
        &[("DK_LOG", "info")],
    )
}

/// The reserve file in the data directory, and its size when there.
fn reserve(scratch: &Scratch) -> Option<u64> {
    std::fs::metadata(scratch.data_dir().join("disk-reserve"))
        .ok()
        .map(|m| m.len())
}

/// `GET /readyz`: its status and the checks it names.
fn readyz(vessel: &Running) -> (u16, Value) {
    let (status, body) = get(vessel.admin, "/readyz", None).unwrap();
    (
        status,
        serde_json::from_str::<Value>(&body).unwrap()["failing"].clone(),
    )
}

/// The value of `name` in the vessel's metrics.
fn metric(vessel: &Running, scratch: &Scratch, name: &str) -> Option<f64> {
    let token = scratch.admin_token();
    let (_, text) = get(vessel.admin, "/metrics", Some(token.expose()))?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Fills the disk while calls arrive: calls are made until one is refused
/// (each refused as the audit log cannot be written), then ten more, none
/// of which reaches the device, and `/readyz` names the store. Once the
/// decisions queued are committed (the reserve's space takes them), the
/// calls that reached the device so far.
async fn fill_while_calling(disk: &SmallDisk, scratch: &Scratch, setup: &Setup) -> BTreeSet<u64> {
    for _ in 0..5 {
        setup.calls.make().await.unwrap();
    }
    assert_eq!(reserve(scratch), Some(4 << 20));
    disk.fill();
    let (n, reason) = eventually("a call refused on the full disk", || async {
        setup.calls.make().await.err()
    })
    .await;
    assert_eq!(reason, AUDIT_FAILING, "call {n}");
    let reached = setup.seen.lock().unwrap().clone();
    assert!(!reached.contains(&n));
    // The store refused, so does /readyz; and no call reaches the device.
    let (status, failing) = readyz(&setup.vessel);
    assert_eq!(status, 503);
    assert!(
        failing.as_array().unwrap().contains(&json!("store")),
        "{failing}"
    );
    for _ in 0..10 {
        let (_, reason) = setup.calls.make().await.unwrap_err();
        assert_eq!(reason, AUDIT_FAILING);
    }
    assert_eq!(*setup.seen.lock().unwrap(), reached);
    assert_eq!(readyz(&setup.vessel).0, 503);
    // The decisions queued are committed: the reserve was released.
    eventually("every decision committed", || async {
        (metric(&setup.vessel, scratch, "dk_audit_queue_depth") == Some(0.0)).then_some(())
    })
    .await;
    assert_eq!(reserve(scratch), None);
    reached
}

/// The decisions in the log of the data directory `dir`: the numbers of
/// those allowed, and how many there are.
fn decisions(dir: &Path) -> (BTreeSet<u64>, usize) {
    let entries: Vec<Value> = audit_entries(dir, 1_000_000)
        .into_iter()
        .filter(|e| e["kind"] == "decision")
        .collect();
    let allowed = entries
        .iter()
        .filter(|e| e["entry"]["allowed"] == true)
        .filter_map(|e| e["entry"]["input"]["n"].as_u64())
        .collect();
    (allowed, entries.len())
}

/// `dk audit verify` on `dir` says the log is intact, against its kept
/// head.
fn verifies(dir: &Path) {
    let out = audit(dir, &["verify"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("intact"), "{said}");
}

/// A start of `dk vessel` on `scratch`'s home that must end by itself:
/// its exit status and what it said on standard error.
fn refused_start(scratch: &Scratch) -> (Option<i32>, String) {
    let child = scratch
        .dk(&["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let mut status = None;
    dk_testkit::eventually_blocking("dk vessel to stop on a full disk", || {
        status = child.0.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut said).unwrap();
    (status.code(), said)
}

/// The JSON events of the vessel's log: the full disk said as errors, with
/// plain fields.
fn check_logged(vessel_err: &Path) {
    let all = events(vessel_err);
    let said = |text: &str| {
        all.iter().any(|e| {
            e["level"] == "ERROR" && e["message"].as_str().is_some_and(|m| m.contains(text))
        })
    };
    assert!(said("the disk holding the store is full"), "{all:?}");
    assert!(said("its reserve is released"), "{all:?}");
    for event in all
        .iter()
        .filter(|e| e["target"].as_str().is_some_and(|t| t.starts_with("dk")))
    {
        for (name, value) in event {
            if let Some(text) = value.as_str().filter(|_| name != "message") {
                assert!(!debug_text(text), "{name} in {event:?}");
            }
        }
    }
}

/// The vessel ended by `signal` on the full disk: every call that reached
/// the device has its decision; a start on the disk still full is refused
/// saying what to do; once space is freed the vessel starts and calls
/// reach the device again.
async fn ended_on_a_full_disk(test: &str, signal: &str) {
    let scratch = Scratch::new(test);
    let Some(disk) = SmallDisk::mount(test, &scratch.home(), DISK_MIB) else {
        return;
    };
    let dir = scratch.data_dir();
    let setup = setup(&scratch).await;
    let reached = fill_while_calling(&disk, &scratch, &setup).await;
    assert!(reached.len() >= 5, "{reached:?}");
    let made = setup.calls.next.load(Ordering::SeqCst) - 1;
    let log = setup.vessel.stdout.with_extension("err");
    let _ = setup.vessel.signal(signal);
    let _ = setup.device.stop().await;

    // Every call that reached the device has its decision, and so has
    // every call made; the log verifies against its kept head.
    let (allowed, count) = decisions(&dir);
    assert_eq!(allowed, reached, "after {signal}");
    assert_eq!(count as u64, made, "after {signal}");
    verifies(&dir);
    check_logged(&log);

    // On the disk still full, a start is refused at once, saying where and
    // how much to free.
    let (status, said) = refused_start(&scratch);
    assert_eq!(status, Some(NO_ROOM_EXIT), "{said}");
    let home = scratch.home();
    for words in [
        format!("`{}`", dir.display()),
        "5.0 MiB needed".to_owned(),
        "free space on that disk, then start again".to_owned(),
    ] {
        assert!(said.contains(&words), "{words} in {said}");
    }
    assert!(said.contains(&home.display().to_string()), "{said}");

    // Space freed: it starts, makes its reserve again, and calls reach the
    // device (which reconnects by itself).
    disk.free();
    let vessel = start(&scratch);
    assert_eq!(reserve(&scratch), Some(4 << 20));
    let device = DeviceRun::spawn(
        counter(Arc::clone(&setup.seen)),
        &vessel.url(),
        &scratch.device_token_file("counter"),
    );
    connected(&dir, &["counter"]).await;
    let calls = Calls {
        admin: vessel.admin(&scratch),
        next: AtomicU64::new(made + 1),
    };
    let n = calls.make().await.unwrap();
    assert!(setup.seen.lock().unwrap().contains(&n));
    let _ = device.stop().await;
    vessel.terminate();
    verifies(&dir);
    assert!(decisions(&dir).0.contains(&n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_no_decision_of_a_call_that_reached_the_device_under_sigabrt() {
    ended_on_a_full_disk("full-disk-abrt", "-ABRT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_no_decision_of_a_call_that_reached_the_device_under_sigkill() {
    ended_on_a_full_disk("full-disk-kill", "-KILL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_no_decision_of_a_call_that_reached_the_device_under_sigterm() {
    ended_on_a_full_disk("full-disk-term", "-TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_on_a_full_disk_takes_calls_again_once_space_is_freed() {
    let test = "full-disk-freed";
    let scratch = Scratch::new(test);
    let Some(disk) = SmallDisk::mount(test, &scratch.home(), DISK_MIB) else {
        return;
    };
    let dir = scratch.data_dir();
    let setup = setup(&scratch).await;
    fill_while_calling(&disk, &scratch, &setup).await;
    // Space freed while it runs: its reserve is made again, /readyz says
    // ready, and calls reach the device again.
    disk.free();
    let n = eventually("a call reaching the device again", || async {
        setup.calls.make().await.ok()
    })
    .await;
    assert!(setup.seen.lock().unwrap().contains(&n));
    assert_eq!(reserve(&scratch), Some(4 << 20));
    assert_eq!(readyz(&setup.vessel).0, 200);
    let reached = setup.seen.lock().unwrap().clone();
    let made = setup.calls.next.load(Ordering::SeqCst) - 1;
    let log = setup.vessel.stdout.with_extension("err");
    let _ = setup.device.stop().await;
    setup.vessel.terminate();
    let (allowed, count) = decisions(&dir);
    assert_eq!(allowed, reached);
    assert_eq!(count as u64, made);
    verifies(&dir);
    check_logged(&log);
    let all = events(&log);
    assert!(
        all.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.contains("its reserve is made again"))),
        "{all:?}"
    );
}
