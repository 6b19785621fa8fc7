//! `dk vessel --store postgres://...` while its PostgreSQL is paused
//! (SIGSTOP, as a frozen host would leave it: connections open, nothing
//! answered, nothing refused), on a PostgreSQL of each test's own:
//!
//! - every call keeps being answered at once, and no call reaches a device
//!   more than the durability bound (`durableWithinMs`, 1 s by default)
//!   after the pause began: from then on calls are refused before the
//!   device, saying the audit log cannot be written; grants the person
//!   makes meanwhile wait for the database without stopping anything else;
//!   once it answers again, calls reach devices again and every call has
//!   its decision in the log, which verifies;
//! - a call under a `limit:` rule is refused within the bound instead of
//!   waiting for the database.
//!
//! The pause lasts 5 s, five times the bound. The checks against time
//! compare with the bound only where the bound is the claim (when calls
//! stop reaching the device), with a generous margin, and otherwise with
//! the pause itself (what must happen before the server is resumed).
//!
//! Without PostgreSQL the tests say so and pass, unless `DK_REQUIRE_PEERS`
//! is set.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dk_device::Device;
use dk_http::AdminClient;
use dk_testkit::postgres::PgServer;
use serde_json::{Value, json};

use crate::durable::{DeviceRun, approve, connected};
use crate::process::{Running, Scratch, succeeded};

/// How long the server is paused.
const PAUSE: Duration = Duration::from_secs(5);

const READ: &str = "device__meter__read";
const COUNT: &str = "device__meter__count";
const AUDIT_FAILING: &str =
    "[8dk-deny] the audit log cannot be written now: no call is made until it can";

/// A meter: `read` and `count` sensors, `reset` an actuator; it notes when
/// each call reaches it.
fn meter(seen: Arc<Mutex<Vec<(&'static str, Instant)>>>) -> Device {
    let manifest = json!({
        "id": "meter",
        "name": "Meter",
        "kind": "meter",
        "version": "1.0.0",
        "capabilities": [
            {"name": "read", "kind": "sensor", "description": "Read the meter."},
            {"name": "count", "kind": "sensor", "description": "Count once."},
            {"name": "reset", "kind": "actuator", "description": "Reset the meter."},
        ],
    });
    let mut device = Device::define(&manifest);
    for capability in ["read", "count", "reset"] {
        let seen = Arc::clone(&seen);
        device = device.handler(capability, move |_input| {
            seen.lock().unwrap().push((capability, Instant::now()));
            async { Ok(json!({"value": 42})) }
        });
    }
    device.build().unwrap()
}

/// A vessel on `url` with the meter connected and `read` and `count`
/// granted, `count` limited by a rule.
struct Setup {
    vessel: Running,
    admin: AdminClient,
    meter: DeviceRun,
    seen: Arc<Mutex<Vec<(&'static str, Instant)>>>,
    /// Last: fields drop in order, so the vessel and the meter are gone
    /// before their folder is removed.
    scratch: Scratch,
}

async fn setup(name: &str, url: &str) -> Setup {
    let scratch = Scratch::new(name);
    let rules = scratch.root().join("rules.yaml");
    std::fs::write(
        &rules,
        "version: 1
policies:
  - name: a-hundred-counts
    action: device_use
    condition: deviceId equals meter and capability equals count
    decision: block
    message: counted enough
    limit: 100 per 1h
",
    )
    .unwrap();
    let vessel = Running::start_env(
        &scratch,
        &["--policies", rules.to_str().unwrap()],
        &[("DK_STORE", url)],
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let meter = DeviceRun::spawn(
        meter(Arc::clone(&seen)),
        &vessel.url(),
        &scratch.device_token_file("meter"),
    );
    let dir = scratch.data_dir();
    approve(&dir, "meter", "read,count").await;
    connected(&dir, &["meter"]).await;
    let admin = vessel.admin(&scratch);
    Setup {
        scratch,
        vessel,
        admin,
        meter,
        seen,
    }
}

/// Calls `tool` through the admin API: the device's result, or the
/// refusal's reason.
async fn call(admin: &AdminClient, tool: &str) -> Result<Value, String> {
    let answer = admin
        .post("/v1/tools/call", &json!({"tool": tool, "input": {}}))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    if answer.body["ok"] == true {
        Ok(answer.body["result"].clone())
    } else {
        Err(answer.body["reason"].as_str().unwrap_or("").to_owned())
    }
}

/// The decisions in the log of the store at `url`.
fn decisions(scratch: &Scratch, url: &str) -> Vec<Value> {
    let out =
        succeeded(&scratch.run(&["audit", "tail", "--store", url, "--json", "-n", "1000000"]));
    out.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|entry| entry["kind"] == "decision")
        .collect()
}

/// The server paused until dropped, resumed then (a failed assertion
/// included).
struct Paused<'a>(&'a PgServer);

impl<'a> Paused<'a> {
    fn pause(server: &'a PgServer) -> Paused<'a> {
        server.pause();
        Paused(server)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_postgres_stops_calls_reaching_devices_within_the_bound_and_slows_only_what_needs_it()
 {
    let test = "a_paused_postgres_stops_calls_reaching_devices_within_the_bound_and_slows_only_what_needs_it";
    let Some(pg) = PgServer::start(test) else {
        return;
    };
    let url = pg.database();
    let setup = setup("frozen-pg", &url).await;
    let admin = &setup.admin;
    let mut made = 0;
    assert!(call(admin, READ).await.is_ok());
    made += 1;

    let paused = Paused::pause(&pg);
    let began = Instant::now();
    let resume_at = began + PAUSE;
    // Calls one after another through the first part of the pause: each is
    // answered (the device's result, or refused before the device).
    let mut refused = 0;
    let mut first_refused = None;
    while began.elapsed() < PAUSE / 2 {
        match call(admin, READ).await {
            Ok(_) => {}
            Err(reason) => {
                assert_eq!(reason, AUDIT_FAILING);
                refused += 1;
                first_refused.get_or_insert_with(Instant::now);
            }
        }
        made += 1;
        // Paces the calls through the pause: one every 20 ms at most.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        refused > 0,
        "no call was refused while the store was paused"
    );
    // The person grants `reset` many times over meanwhile: each grant waits
    // for the database, and none holds up the calls.
    let granting: Vec<_> = (0..32)
        .map(|_| {
            let admin = setup.vessel.admin(&setup.scratch);
            tokio::spawn(async move {
                let answer = admin.put("/v1/devices/meter/grants/reset").await.unwrap();
                (answer.status, Instant::now())
            })
        })
        .collect();
    let mut answered_while_granting = 0;
    while Instant::now() + Duration::from_secs(1) < resume_at {
        let asked = tokio::time::timeout_at(resume_at.into(), call(admin, READ)).await;
        let Ok(answer) = asked else {
            break;
        };
        assert_eq!(answer, Err(AUDIT_FAILING.to_owned()));
        answered_while_granting += 1;
        made += 1;
        // Paced as above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the resume a call still waiting is answered: it counts too.
    let waiting_at_resume = Instant::now() >= resume_at;
    tokio::time::sleep_until(resume_at.into()).await;
    // Taken before the resume: the backends answer as soon as they get
    // their SIGCONT, before the postmaster is signalled and `drop` returns.
    let resumed = Instant::now();
    drop(paused);
    assert!(
        !waiting_at_resume,
        "a call was not answered while the person's grants waited for the database ({answered_while_granting} were)"
    );
    assert!(answered_while_granting > 0);

    // Once a call was refused, no call reached the meter until the
    // database answered again (how soon the first refusal came after the
    // bound is for a bench to measure).
    let first_refused = first_refused.unwrap_or(resumed);
    let reached: Vec<Instant> = setup
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, at)| *at)
        .filter(|at| *at >= began && *at < resumed)
        .collect();
    let late = reached.iter().filter(|at| **at > first_refused).count();
    assert_eq!(late, 0, "calls reached the meter after one was refused");
    // Every grant was taken once the database answered again.
    for grant in granting {
        let (status, at) = grant.await.unwrap();
        assert_eq!(status, 204);
        assert!(at >= resumed);
    }
    // Calls reach the meter again, and every call made has its decision.
    let counted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    crate::process::eventually("a call reaching the meter again", || async {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        call(admin, READ).await.ok()
    })
    .await;
    made += counted.load(std::sync::atomic::Ordering::SeqCst);
    setup.vessel.interrupt();
    let _ = setup.meter.stop().await;
    assert_eq!(decisions(&setup.scratch, &url).len(), made);
    let verified = succeeded(&setup.scratch.run(&["audit", "verify", "--store", &url]));
    assert!(verified.contains("intact"), "{verified}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_call_under_a_paused_postgres_is_refused_within_the_bound() {
    let test = "a_limit_call_under_a_paused_postgres_is_refused_within_the_bound";
    let Some(pg) = PgServer::start(test) else {
        return;
    };
    let url = pg.database();
    let setup = setup("frozen-pg-limit", &url).await;
    let admin = &setup.admin;
    // Counted in the database while it answers.
    assert!(call(admin, COUNT).await.is_ok());

    let paused = Paused::pause(&pg);
    let began = Instant::now();
    let resume_at = began + PAUSE;
    let counting = tokio::time::timeout_at(resume_at.into(), call(admin, COUNT)).await;
    tokio::time::sleep_until(resume_at.into()).await;
    drop(paused);
    let counting =
        counting.expect("the limited call was not answered while the database was paused");
    let reason = counting.expect_err("the limited call reached the meter");
    assert!(
        reason.starts_with("[8dk-deny] the counts of rules with a limit cannot be kept")
            && reason.contains("did not answer within 1000 ms")
            || reason == AUDIT_FAILING,
        "{reason}"
    );
    let counts = setup
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(capability, _)| *capability == "count")
        .count();
    assert_eq!(counts, 1, "the limited call reached the meter");
    // Once the database answers, counting works again.
    crate::process::eventually("a count once the database answers", || async {
        call(admin, COUNT).await.ok()
    })
    .await;
    setup.vessel.interrupt();
    let _ = setup.meter.stop().await;
}
