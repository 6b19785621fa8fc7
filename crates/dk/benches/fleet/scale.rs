//! A fleet at size, shared by the fleet-scale bench
//! (`benches/fleet_scale.rs`: three members of 10,000 dk/2 lamps each) and
//! its small version in the tests (`tests/it/fleet.rs`): PostgreSQL,
//! `nats-server` and three `dk vessel` members on this machine, every lamp
//! a real dk-device client in this process given every member's address.
//!
//! [`run`] measures, and [`Figures`] says each figure with its budget:
//! every member present with its devices on the others and the largest
//! presence message; a routed call beside a local one; a routed answer of
//! 300 KiB; one member killed (SIGKILL) and its lamps calling again
//! through the others, with every decision in the log once and the chain
//! intact.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dk_device::{ClientOptions, Device, run_client};
use dk_http::AdminClient;
use dk_store::{PgStore, Store};
use dk_testkit::nats::{Nats, nats_or_skip};
use dk_testkit::postgres::PgServer;
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::{BoxError, Fleet, Home, Member, PATIENCE, Storm, Vessel, read_tool};

/// Members of the fleet.
pub const MEMBERS: usize = 3;
/// The budget of what routing adds to a call.
pub const ROUTED_BUDGET: Duration = Duration::from_micros(500);
/// The budget of the slowest lamp of a killed member calling again.
pub const MOVED_BUDGET: Duration = Duration::from_secs(30);
/// The budget of the largest presence message.
pub const PRESENCE_BUDGET: usize = 1024 * 1024;
/// The size of the routed answer.
pub const LARGE_ANSWER: usize = 300 * 1024;

/// What a run measured.
pub struct Figures {
    /// Lamps per member.
    pub devices: usize,
    /// From the first spawn until every member counted every other's lamps.
    pub present: Duration,
    /// The largest presence message sealed on the servers, in bytes.
    pub largest_presence: usize,
    /// The largest beat (a presence message without ids), in bytes.
    pub largest_beat: usize,
    /// Median of the calls to lamp 0 through the member holding it.
    pub local: Duration,
    /// Median of the same calls through another member.
    pub routed: Duration,
    /// Calls measured each way.
    pub calls: usize,
    /// Whether the 300 KiB answer arrived whole.
    pub large_whole: bool,
    /// The killed member's lamps calling again through the others.
    pub moved: Storm,
    /// Decisions the members were asked for, and those in the log.
    pub decisions: (u64, u64),
    /// What `dk audit verify --store` said.
    pub verified: String,
}

/// Runs the fleet of `devices` lamps per member, making `calls` timed calls
/// each way.
pub async fn run(dk: &Path, devices: usize, calls: usize) -> Result<Figures, BoxError> {
    let pg = PgServer::start("fleet-scale").ok_or("PostgreSQL is not installed")?;
    let nats = Nats::start(
        nats_or_skip("fleet-scale").ok_or("nats-server is not installed")?,
        "",
    );
    let url = pg.database();
    let fleet_secret: [u8; 32] = rand::random();
    let homes = {
        let store = PgStore::connect(&url)?;
        (0..MEMBERS)
            .map(|k| Home::seed_member(devices, k * devices, fleet_secret, &store))
            .collect::<Result<Vec<_>, _>>()?
    };
    let presence = Presence::watch(&nats).await?;
    let ports = (0..MEMBERS)
        .map(|_| super::free_port())
        .collect::<Result<Vec<_>, _>>()?;
    let spawned = Instant::now();
    let mut vessels = Vec::new();
    let mut lamps = Vec::new();
    for (k, (home, port)) in homes.iter().zip(ports.iter().copied()).enumerate() {
        let member = Member {
            store: url.clone(),
            nats: nats.url(),
            name: format!("m{k}"),
        };
        let (vessel, _) = Vessel::start_as(dk, home, port, Some(&member)).await?;
        // Its own member first, then the others.
        let mut order = vec![port];
        order.extend(ports.iter().copied().filter(|p| *p != port));
        let mut held = Fleet::start_at(home, &order)?;
        held.connected(&vessel).await?;
        vessels.push(vessel);
        lamps.push(held);
    }
    let admins: Vec<AdminClient> = vessels.iter().map(|v| v.admin.clone()).collect();
    all_present(&admins, devices).await?;
    let present = spawned.elapsed();

    // A routed call beside a local one, interleaved.
    let decided = AtomicU64::new(0);
    let [holder, other, ..] = admins.as_slice() else {
        return Err("three members expected".into());
    };
    wait_reachable(other, 0, &decided).await?;
    let (mut local, mut routed) = (Vec::new(), Vec::new());
    for _ in 0..calls {
        for (admin, times) in [(holder, &mut local), (other, &mut routed)] {
            let started = Instant::now();
            if !call(admin, &read_tool(0), &decided).await?.0 {
                return Err("a timed call failed".into());
            }
            times.push(started.elapsed());
        }
    }

    // A camera on the first member; its 300 KiB answer read through another.
    let snapshot: String = (0..LARGE_ANSWER)
        .map(|i| char::from(b'a' + u8::try_from(i % 26).unwrap_or(0)))
        .collect();
    let camera = camera(snapshot.clone())?;
    let first = homes.first().ok_or("no member")?;
    let camera_key = first.data_dir().join("camera.key");
    let camera_url = format!(
        "ws://127.0.0.1:{}/device",
        ports.first().ok_or("no member")?
    );
    let (stop_camera, camera_stopped) = tokio::sync::oneshot::channel::<()>();
    let camera_task = tokio::spawn(async move {
        let options = ClientOptions::new(camera_url).key_file(camera_key);
        run_client(&camera, options, async move {
            let _ = camera_stopped.await;
        })
        .await
    });
    pair_camera(holder, &admins).await?;
    let (ok, answer) = call(other, "device__camera__snapshot", &decided).await?;
    let large_whole =
        ok && answer.pointer("/result/image").and_then(Value::as_str) == Some(snapshot.as_str());
    let _ = stop_camera.send(());
    let _ = camera_task.await;

    // Every decision so far committed, then the first member killed.
    let store = PgStore::connect(&url)?;
    let before_kill = decided.load(Ordering::Relaxed);
    committed(&store, before_kill).await?;
    let mut vessels = vessels.into_iter();
    let killed = vessels.next().ok_or("no member")?;
    let mut moving = lamps.remove(0);
    let moved = moving.moved(killed, other).await?;
    let asked = before_kill + moved.decided;
    let logged = committed(&store, asked).await?;
    let out = std::process::Command::new(dk)
        .args(["audit", "verify", "--store", &url])
        .output()?;
    // Its last line says whether the chain holds.
    let verified = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("(nothing said)")
        .to_owned();

    moving.stop().await?;
    for held in lamps {
        held.stop().await?;
    }
    for vessel in vessels {
        vessel.interrupt().await?;
    }
    let (largest_presence, largest_beat) = presence.largest();
    drop(nats);
    Ok(Figures {
        devices,
        present,
        largest_presence,
        largest_beat,
        local: median(local),
        routed: median(routed),
        calls,
        large_whole,
        moved,
        decisions: (asked, logged),
        verified,
    })
}

/// The sizes of what is said on the presence subject.
struct Presence {
    largest: Arc<AtomicUsize>,
    beat: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Presence {
    async fn watch(nats: &Nats) -> Result<Presence, BoxError> {
        let client = async_nats::connect(nats.url()).await?;
        let mut messages = client.subscribe("dk.fleet.presence").await?;
        client.flush().await?;
        let (largest, beat) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (l, b) = (Arc::clone(&largest), Arc::clone(&beat));
        let task = tokio::spawn(async move {
            let _client = client;
            while let Some(message) = messages.next().await {
                let size = message.payload.len();
                l.fetch_max(size, Ordering::Relaxed);
                // A beat is a few dozen bytes sealed; a delta carries ids.
                if size < 256 {
                    b.fetch_max(size, Ordering::Relaxed);
                }
            }
        });
        Ok(Presence {
            largest,
            beat,
            task,
        })
    }

    fn largest(self) -> (usize, usize) {
        self.task.abort();
        (
            self.largest.load(Ordering::Relaxed),
            self.beat.load(Ordering::Relaxed),
        )
    }
}

/// Waits until every member counts every other member present with
/// `devices` lamps.
async fn all_present(admins: &[AdminClient], devices: usize) -> Result<(), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    for admin in admins {
        loop {
            let status = admin.get("/v1/status").await?.body;
            let members = status
                .pointer("/fleet/members")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let all = members.len() == MEMBERS - 1
                && members.iter().all(|m| {
                    m.get("devices").and_then(Value::as_u64) == u64::try_from(devices).ok()
                });
            if all {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("members not all present: {status}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// One call of `tool` through `admin`: whether it succeeded, and the body.
async fn call(
    admin: &AdminClient,
    tool: &str,
    decided: &AtomicU64,
) -> Result<(bool, Value), BoxError> {
    let answer = admin
        .post("/v1/tools/call", &json!({"tool": tool, "input": {}}))
        .await?;
    if answer.status == 200 {
        decided.fetch_add(1, Ordering::Relaxed);
    }
    let ok = answer.status == 200 && answer.body.get("ok") == Some(&Value::Bool(true));
    Ok((ok, answer.body))
}

/// Waits until `admin`'s member can call lamp `i`.
async fn wait_reachable(
    admin: &AdminClient,
    i: usize,
    decided: &AtomicU64,
) -> Result<(), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    while !call(admin, &read_tool(i), decided).await?.0 {
        if Instant::now() > deadline {
            return Err(format!("lamp {i} not reachable").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A camera whose `snapshot` answers `{"image": snapshot}`.
fn camera(snapshot: String) -> Result<Device, BoxError> {
    let manifest = json!({
        "id": "camera", "name": "Camera", "kind": "camera", "version": "1.0.0",
        "capabilities": [{"name": "snapshot", "kind": "sensor", "description": "A snapshot."}]
    });
    Ok(Device::define(&manifest)
        .handler("snapshot", move |_| {
            let answer = json!({"image": snapshot.clone()});
            async move { Ok(answer) }
        })
        .build()?)
}

/// Answers the camera's pairing on `holder` and waits until every member
/// can reach it.
async fn pair_camera(holder: &AdminClient, admins: &[AdminClient]) -> Result<(), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    let id = loop {
        let pending = holder.get("/v1/pending").await?.body;
        let found = pending.as_array().and_then(|list| {
            list.iter()
                .find(|p| {
                    p.get("kind") == Some(&json!("consent"))
                        && p.pointer("/request/deviceId") == Some(&json!("camera"))
                })
                .and_then(|p| p.get("id")?.as_u64())
        });
        if let Some(id) = found {
            break id;
        }
        if Instant::now() > deadline {
            return Err("the camera never asked to pair".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let answer = holder
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": ["snapshot"]}),
        )
        .await?;
    if answer.status >= 300 {
        return Err(format!("the camera's pairing: {}", answer.body).into());
    }
    for admin in admins {
        loop {
            let listed = admin.get("/v1/devices").await?.body;
            let camera = listed
                .as_array()
                .and_then(|list| list.iter().find(|d| d.get("id") == Some(&json!("camera"))))
                .cloned()
                .unwrap_or_default();
            if camera.get("connected") == Some(&json!(true))
                || camera.get("heldBy") == Some(&json!("m0"))
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the camera not reached: {camera}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Waits until the log holds `expected` decisions (at most a while after
/// it stops growing); how many it holds.
async fn committed(store: &PgStore, expected: u64) -> Result<u64, BoxError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let count = decisions(store)?;
        if count >= expected || Instant::now() > deadline {
            return Ok(count);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The decisions in the log.
fn decisions(store: &PgStore) -> Result<u64, BoxError> {
    let mut count = 0;
    let mut after = 0;
    loop {
        let page = store.read_audit(after, 10_000)?;
        let Some(last) = page.last() else {
            return Ok(count);
        };
        after = last.seq;
        count += page.iter().filter(|entry| entry.kind == "decision").count() as u64;
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let verdict = |met: bool| if met { "within" } else { "OVER" };
        let overhead = self.routed.saturating_sub(self.local);
        let lamps = self.devices * MEMBERS;
        writeln!(
            f,
            "{:<28}{:>10.1} s   ({MEMBERS} members of {} dk/2 lamps, {lamps} in all, each lamp given every member's address: from the first spawn until every member counted every other's lamps)",
            "fleet-scale/present",
            self.present.as_secs_f64(),
            self.devices
        )?;
        writeln!(
            f,
            "{:<28}{:>10} B   (the largest presence message sealed; beats {} B; budget {} B: {})",
            "fleet-scale/presence",
            self.largest_presence,
            self.largest_beat,
            PRESENCE_BUDGET,
            verdict(self.largest_presence <= PRESENCE_BUDGET)
        )?;
        writeln!(
            f,
            "{:<28}{:>10.3} ms  (median of {} calls to lamp 0 through the member holding it)",
            "fleet-scale/local",
            ms(self.local),
            self.calls
        )?;
        writeln!(
            f,
            "{:<28}{:>10.3} ms  (the same calls through another member, interleaved)",
            "fleet-scale/routed",
            ms(self.routed)
        )?;
        writeln!(
            f,
            "{:<28}{:>10.3} ms  (what routing adds, same run; budget {} ms: {})",
            "fleet-scale/overhead",
            ms(overhead),
            ms(ROUTED_BUDGET),
            verdict(overhead <= ROUTED_BUDGET)
        )?;
        writeln!(
            f,
            "{:<28}{:>10}     (a routed answer of {} KiB arrived whole: {})",
            "fleet-scale/large",
            if self.large_whole { "whole" } else { "BROKEN" },
            LARGE_ANSWER / 1024,
            verdict(self.large_whole)
        )?;
        writeln!(
            f,
            "{:<28}{:>10.1} s   (member m0 killed: its {} lamps calling again through the others, 50% {:.1} s, 99% {:.1} s; budget {} s: {})",
            "fleet-scale/moved",
            self.moved.all.as_secs_f64(),
            self.moved.devices,
            self.moved.p50.as_secs_f64(),
            self.moved.p99.as_secs_f64(),
            MOVED_BUDGET.as_secs(),
            verdict(self.moved.all <= MOVED_BUDGET)
        )?;
        let (asked, logged) = self.decisions;
        writeln!(
            f,
            "{:<28}{:>10}     (decisions made {asked}, in the log {logged}: {} lost or duplicated: {})",
            "fleet-scale/decisions",
            logged,
            asked.abs_diff(logged),
            verdict(asked == logged)
        )?;
        write!(
            f,
            "{:<28}{:>10}     ({})",
            "fleet-scale/verify",
            if self.verified.contains("intact") {
                "intact"
            } else {
                "BROKEN"
            },
            self.verified
        )
    }
}
