//! Crash safety of a `dk vessel` process: a churn of pairings, grants,
//! revokes and unpairings through the admin API, the vessel killed with
//! SIGKILL at a random moment in each round and started again on the same
//! data directory. Every change the API acknowledged must be there; the one
//! in flight at the kill must be wholly there or wholly absent, with exactly
//! one audit entry per applied change and an intact chain.
//!
//! A few rounds by default; `DK_SOAK=1` runs 200 (`DK_SOAK_ROUNDS=N` sets
//! another count) and prints the counts. `DK_SEED=N` replays a run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use dk_http::AdminClient;
use serde_json::{Value, json};

use crate::process::{
    Running, Scratch, audit, audit_entries, consent_in, devices, hello, lamp_manifest, read_until,
};

/// Device ids the churn pairs, unpairs and pairs again.
const IDS: [&str; 4] = ["churn-0", "churn-1", "churn-2", "churn-3"];
const CAPABILITIES: [&str; 3] = ["read_light", "set_light", "strobe"];
/// Pairings per vessel run: under its budget of 10 hellos a minute per address.
const PAIRS_PER_ROUND: usize = 3;

/// xorshift64*: small, seedable, good enough to pick changes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Change {
    Grant(String, String),
    Revoke(String, String),
    Unpair(String),
    Pair(String, Vec<String>),
}

impl Change {
    /// The audit entry's kind and details this change must leave.
    fn matches(&self, entry: &Value) -> bool {
        let (kind, details) = (&entry["kind"], &entry["entry"]);
        match self {
            Change::Grant(id, cap) => {
                kind == "granted" && details["deviceId"] == *id && details["capability"] == *cap
            }
            Change::Revoke(id, cap) => {
                kind == "revoked" && details["deviceId"] == *id && details["capability"] == *cap
            }
            Change::Unpair(id) => kind == "unpaired" && details["deviceId"] == *id,
            Change::Pair(id, grants) => {
                kind == "paired" && details["deviceId"] == *id && details["grants"] == json!(grants)
            }
        }
    }
}

/// What the vessel must hold: device id -> grants, and each pairing's
/// generation as last seen in the database.
#[derive(Default)]
struct Model {
    devices: BTreeMap<String, BTreeSet<String>>,
    generations: BTreeMap<String, u64>,
    max_generation: u64,
}

impl Model {
    fn apply(&mut self, change: &Change) {
        match change {
            Change::Grant(id, cap) => {
                self.devices.get_mut(id).unwrap().insert(cap.clone());
            }
            Change::Revoke(id, cap) => {
                self.devices.get_mut(id).unwrap().remove(cap);
            }
            Change::Unpair(id) => {
                self.devices.remove(id);
            }
            Change::Pair(id, grants) => {
                self.devices
                    .insert(id.clone(), grants.iter().cloned().collect());
            }
        }
    }

    /// A change that does something (no grant of a held grant, no revoke
    /// of an absent one), so each one leaves exactly one audit entry.
    fn pick(&self, rng: &mut Rng, pairs_left: usize) -> Change {
        loop {
            let roll = rng.below(100);
            let paired: Vec<&String> = self.devices.keys().collect();
            if roll < 25 && pairs_left > 0 {
                let id = rng.pick(&IDS).to_string();
                let grants: Vec<String> = CAPABILITIES
                    .iter()
                    .filter(|_| rng.below(2) == 0)
                    .map(|c| c.to_string())
                    .collect();
                return Change::Pair(id, grants);
            }
            if paired.is_empty() {
                continue;
            }
            let id = (*rng.pick(&paired)).clone();
            let held = &self.devices[&id];
            if roll < 35 && paired.len() > 1 {
                return Change::Unpair(id);
            }
            let cap = rng.pick(&CAPABILITIES).to_string();
            if roll < 70 && !held.contains(&cap) {
                return Change::Grant(id, cap);
            }
            if roll >= 70 && held.contains(&cap) {
                return Change::Revoke(id, cap);
            }
        }
    }
}

#[derive(Default, Debug)]
struct Counts {
    rounds: usize,
    acknowledged: usize,
    in_flight_applied: usize,
    in_flight_absent: usize,
    pairings: usize,
}

/// Makes one change; `Ok` once the vessel acknowledged it, `Err` when the
/// vessel went away first (the change is in flight).
async fn perform(change: &Change, admin: &AdminClient, url: &str) -> Result<(), String> {
    let status = match change {
        Change::Grant(id, cap) => admin.put(&format!("/v1/devices/{id}/grants/{cap}")).await,
        Change::Revoke(id, cap) => {
            admin
                .delete(&format!("/v1/devices/{id}/grants/{cap}"))
                .await
        }
        Change::Unpair(id) => admin.delete(&format!("/v1/devices/{id}")).await,
        Change::Pair(id, grants) => return pair(admin, url, id, grants).await,
    }
    .map_err(|e| e.to_string())?
    .status;
    assert_eq!(status, 204, "{change:?}");
    Ok(())
}

/// Pairs through a raw hello and the consent API; acknowledged when the
/// device receives `device:paired`, which the vessel sends once committed.
async fn pair(admin: &AdminClient, url: &str, id: &str, grants: &[String]) -> Result<(), String> {
    let mut socket = hello(url, &lamp_manifest(id)).await?;
    // The vessel may be killed while the request is awaited: a pending
    // list that cannot be read ends the wait with the change in flight.
    let consent = dk_testkit::eventually_async(&format!("a consent request for {id}"), || {
        consent_or_gone(admin, id)
    })
    .await?;
    let answer = admin
        .post(
            &format!("/v1/pending/{consent}/consent"),
            &json!({"approved": true, "grant": grants}),
        )
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(answer.status, 204, "{answer:?}");
    read_until(&mut socket, "device:paired").await.map(drop)
}

/// `id`'s consent request once the vessel lists it, or the error that
/// says the vessel is gone; `None` while it is up and not asking yet.
async fn consent_or_gone(admin: &AdminClient, id: &str) -> Option<Result<u64, String>> {
    match admin.get("/v1/pending").await {
        Err(gone) => Some(Err(gone.to_string())),
        Ok(pending) => consent_in(&pending.body, id).map(Ok),
    }
}

/// Generations of the stored pairings, read from the database.
fn stored_generations(data_dir: &Path) -> BTreeMap<String, u64> {
    let db = rusqlite::Connection::open_with_flags(
        data_dir.join("vessel.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut select = db
        .prepare("SELECT device_id, generation FROM pairing")
        .unwrap();
    select
        .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as u64)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// After a restart: the audit entries since the last check are exactly the
/// acknowledged changes, maybe followed by the one in flight; the devices
/// and grants are the model's, with the in-flight change wholly applied or
/// wholly absent.
async fn reconcile(
    model: &mut Model,
    acknowledged: &mut Vec<Change>,
    in_flight: Option<Change>,
    checked_seq: &mut u64,
    vessel: &Running,
    scratch: &Scratch,
    counts: &mut Counts,
) {
    let dir = scratch.data_dir();
    let changes: Vec<Value> = audit_entries(&dir, u64::MAX / 2)
        .into_iter()
        .filter(|e| e["seq"].as_u64().unwrap() > *checked_seq)
        .filter(|e| {
            ["paired", "granted", "revoked", "unpaired"].contains(&e["kind"].as_str().unwrap())
        })
        .collect();
    let context =
        format!("acknowledged {acknowledged:?}, in flight {in_flight:?}, log {changes:?}");
    let context = || context.clone();
    assert!(
        changes.len() == acknowledged.len() || changes.len() == acknowledged.len() + 1,
        "{}",
        context()
    );
    for (change, entry) in acknowledged.iter().zip(&changes) {
        assert!(change.matches(entry), "{}", context());
    }
    // Pairings since the last check must have new, larger generations.
    let mut repaired: BTreeSet<String> = acknowledged
        .iter()
        .filter_map(|c| match c {
            Change::Pair(id, _) => Some(id.clone()),
            _ => None,
        })
        .collect();
    if let Some(extra) = changes.get(acknowledged.len()) {
        let change = in_flight.clone().unwrap_or_else(|| panic!("{}", context()));
        assert!(change.matches(extra), "{}", context());
        model.apply(&change);
        if let Change::Pair(id, _) = &change {
            repaired.insert(id.clone());
        }
        counts.in_flight_applied += 1;
    } else if in_flight.is_some() {
        counts.in_flight_absent += 1;
    }
    if let Some(last) = changes.last() {
        *checked_seq = last["seq"].as_u64().unwrap();
    }
    acknowledged.clear();

    let admin = vessel.admin(scratch);
    let held: BTreeMap<String, BTreeSet<String>> = devices(&admin)
        .await
        .iter()
        .map(|d| {
            let grants = d["grants"].as_array().unwrap();
            let grants = grants.iter().map(|g| g.as_str().unwrap().to_owned());
            (d["id"].as_str().unwrap().to_owned(), grants.collect())
        })
        .collect();
    assert_eq!(held, model.devices, "{}", context());

    let generations = stored_generations(&dir);
    for (id, generation) in &generations {
        if repaired.contains(id) {
            assert!(*generation > model.max_generation, "{id}: {generation}");
        } else {
            assert_eq!(Some(generation), model.generations.get(id), "{id}");
        }
    }
    model.max_generation = generations
        .values()
        .copied()
        .fold(model.max_generation, u64::max);
    model.generations = generations;

    let verify = audit(&dir, &["verify"]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_changes_survive_sigkill_and_none_is_half_applied() {
    let rounds = match std::env::var("DK_SOAK_ROUNDS") {
        Ok(n) => n.parse().unwrap(),
        Err(_) if std::env::var_os("DK_SOAK").is_some() => 200,
        Err(_) => 5,
    };
    let seed = match std::env::var("DK_SEED") {
        Ok(n) => n.parse().unwrap(),
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        }
    };
    println!("crash churn: {rounds} rounds, DK_SEED={seed}");
    let mut rng = Rng(seed);
    let scratch = Scratch::new("crash");
    let mut model = Model::default();
    let mut acknowledged: Vec<Change> = Vec::new();
    let mut in_flight: Option<Change> = None;
    let mut checked_seq = 0;
    let mut counts = Counts::default();

    for round in 0..rounds {
        let mut vessel = Running::start(&scratch);
        reconcile(
            &mut model,
            &mut acknowledged,
            in_flight.take(),
            &mut checked_seq,
            &vessel,
            &scratch,
            &mut counts,
        )
        .await;
        let admin = vessel.admin(&scratch);
        let url = vessel.url();
        let mut pairs_left = PAIRS_PER_ROUND;
        let mut changes = Vec::new();
        if round == 0 {
            // Devices to churn on, paired like any change.
            changes.push(Change::Pair(IDS[0].to_owned(), Vec::new()));
            changes.push(Change::Pair(IDS[1].to_owned(), vec!["read_light".into()]));
        }
        let steps = 2 + rng.below(12);
        let mut killer = None;
        for step in 0..steps {
            let change = match changes.pop() {
                Some(change) => change,
                None => model.pick(&mut rng, pairs_left),
            };
            if matches!(change, Change::Pair(..)) {
                pairs_left = pairs_left.saturating_sub(1);
                counts.pairings += 1;
            }
            if step + 1 == steps {
                // The kill comes at a random moment of the last change (or
                // just after it).
                let mut child = vessel.child.take().unwrap();
                let delay = Duration::from_micros(rng.below(1500) as u64);
                killer = Some(std::thread::spawn(move || {
                    // The kill's random moment.
                    std::thread::sleep(delay);
                    child.kill().unwrap();
                    child.wait().unwrap();
                }));
            }
            match perform(&change, &admin, &url).await {
                Ok(()) => {
                    model.apply(&change);
                    acknowledged.push(change);
                    counts.acknowledged += 1;
                }
                Err(_) => {
                    in_flight = Some(change);
                    break;
                }
            }
        }
        if let Some(killer) = killer {
            killer.join().unwrap();
        }
        drop(vessel);
        counts.rounds += 1;
    }
    let vessel = Running::start(&scratch);
    reconcile(
        &mut model,
        &mut acknowledged,
        in_flight.take(),
        &mut checked_seq,
        &vessel,
        &scratch,
        &mut counts,
    )
    .await;
    println!("crash churn: {counts:?}, {checked_seq} audit entries checked");
    assert!(counts.acknowledged > 0);
}
