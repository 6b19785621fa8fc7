//! A fleet at its seams, over three real `dk vessel` members, a real
//! PostgreSQL and a real `nats-server`, with devices (dk-device's sample
//! lamp and lock, in this process, so what reaches them is counted) and an
//! outsider on the NATS server recording and sending again what members
//! say:
//!
//! - a yes given to a prompt a member showed before the member that
//!   raised it restarted never answers the restarted member's new prompt
//!   of the same number, and an answer recorded before the restart, sent
//!   again after it, does nothing;
//! - a routed call recorded before its holder restarted, sent again after,
//!   does not reach the device;
//! - a member stopped cleanly is forgotten at once, whoever else listens
//!   on the server;
//! - a device's answer of 300 KiB crosses the fleet whole;
//! - an answer given while the member that raised the prompt is paused is
//!   either taken or the person is told it was not, and a "not taken" is
//!   never applied later.
//!
//! Without PostgreSQL or nats-server the tests say so and pass, unless
//! `DK_REQUIRE_PEERS` is set.

use std::path::Path;
use std::time::Duration;

use dk_device::{ClientOptions, Device, run_client};
use dk_http::AdminClient;
use dk_testkit::nats::Nats;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::members::{Member, servers, stop};
use crate::process::{PATIENCE, devices, eventually};

const STROBE: &str = "device__desk_lamp__strobe";
const SET_LIGHT: &str = "device__desk_lamp__set_light";
const READ_LIGHT: &str = "device__desk_lamp__read_light";
const UNLOCK: &str = "device__front_door__unlock";

/// A device served by this process: stopped when dropped.
struct Served {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Served {
    /// Serves `device` to the member at `url` only, its key in `key_file`.
    fn start(device: Device, url: &str, key_file: &Path) -> Served {
        let options = ClientOptions::new(url)
            .key_file(key_file)
            .backoff(Duration::from_millis(20), Duration::from_millis(200));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = run_client(&device, options, async move {
                let _ = stopped.await;
            })
            .await;
        });
        Served {
            stop: Some(stop),
            task,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// A member whose device port stays the same across restarts, so devices
/// that know only it come back to it: the port the vessel picked at its
/// first start.
fn member_on_a_port(name: &str, nats: &Nats, store: &str, rules: &str) -> (Member, String) {
    let member = Member::start_full(name, nats, store, rules, &["--listen", "127.0.0.1:0"]);
    let listen = member.vessel.as_ref().unwrap().devices.to_string();
    (member, listen)
}

/// Kills `member` (SIGKILL) and starts it again on the same home and port.
fn kill_and_restart(member: &mut Member, nats: &Nats, store: &str, rules: &str, listen: &str) {
    if let Some(vessel) = member.vessel.take() {
        vessel.kill();
    }
    member.vessel = Some(Member::run_vessel(
        &member.scratch,
        &member.name,
        nats,
        store,
        rules,
        &["--listen", listen],
    ));
}

/// Pairs `device_id` through `member` granting `grant`, and waits until
/// every member in `all` knows it and it is connected to `member`.
async fn pair(member: &Member, all: &[&Member], device_id: &str, grant: &[&str]) {
    crate::process::approve_when_asked(&member.admin(), device_id, grant).await;
    for other in all {
        let admin = other.admin();
        eventually("the pairing known to every member", || async {
            let held = devices(&admin).await;
            let device = held.iter().find(|d| d["id"] == device_id)?;
            let here = other.name == member.name;
            let reached = if here {
                device["connected"] == true
            } else {
                device["heldBy"] == member.name.as_str()
            };
            let mut granted: Vec<&str> = device["grants"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let mut wanted = grant.to_vec();
            granted.sort_unstable();
            wanted.sort_unstable();
            (granted == wanted && reached).then_some(())
        })
        .await;
    }
}

/// Adds the agent `helper`, for the lamp and the lock, through `admin`,
/// and waits until every member in `all` knows it; its credential.
async fn add_helper(admin: &AdminClient, all: &[&Member]) -> String {
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "helper", "scope": ["desk-lamp", "front-door"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    for member in all {
        let other = member.admin();
        eventually("the agent known to every member", || async {
            let agents = other.get("/v1/agents").await.unwrap().body;
            agents
                .as_array()?
                .iter()
                .any(|agent| agent["name"] == "helper")
                .then_some(())
        })
        .await;
    }
    added.body["credential"].as_str().unwrap().to_owned()
}

/// The approval waiting on `admin` for `tool`, once there is one: its id
/// there.
async fn waiting_for(admin: &AdminClient, tool: &str) -> u64 {
    eventually(&format!("an approval of {tool}"), || async {
        let pending = admin.get("/v1/pending").await.unwrap().body;
        pending
            .as_array()?
            .iter()
            .find(|p| p["kind"] == "approval" && p["request"]["tool"] == tool)
            .and_then(|p| p["id"].as_u64())
    })
    .await
}

/// The ids of the approvals waiting on `admin`.
async fn approvals(admin: &AdminClient) -> Vec<(u64, String)> {
    let pending = admin.get("/v1/pending").await.unwrap().body;
    pending
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "approval")
        .map(|p| {
            (
                p["id"].as_u64().unwrap(),
                p["request"]["tool"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The member's fleet state, from `GET /v1/status`.
async fn fleet_status(member: &Member) -> Value {
    let status = member.admin().get("/v1/status").await.unwrap().body;
    status["fleet"].clone()
}

/// Sends what `recorded` holds again, as it was, on its subject.
async fn send_again(outsider: &async_nats::Client, recorded: &async_nats::Message) {
    match &recorded.reply {
        Some(reply) => outsider
            .publish_with_reply(
                recorded.subject.clone(),
                reply.clone(),
                recorded.payload.clone(),
            )
            .await
            .unwrap(),
        None => outsider
            .publish(recorded.subject.clone(), recorded.payload.clone())
            .await
            .unwrap(),
    }
    outsider.flush().await.unwrap();
}

/// Connects an outsider (no fleet key) to the server, recording `subject`
/// from the moment the server holds the subscription.
async fn record(nats: &Nats, subject: &str) -> (async_nats::Client, async_nats::Subscriber) {
    let outsider = async_nats::connect(nats.url()).await.unwrap();
    let recorded = outsider.subscribe(subject.to_owned()).await.unwrap();
    // A flush only writes the subscription out; the server reads one
    // connection in order, so once the outsider hears its own probe, sent
    // after it, the subscription is in force for everyone's messages.
    let inbox = outsider.new_inbox();
    let mut probe = outsider.subscribe(inbox.clone()).await.unwrap();
    outsider.publish(inbox, "probe".into()).await.unwrap();
    outsider.flush().await.unwrap();
    next(&mut probe).await;
    (outsider, recorded)
}

/// The next message recorded.
async fn next(recorded: &mut async_nats::Subscriber) -> async_nats::Message {
    tokio::time::timeout(PATIENCE, recorded.next())
        .await
        .expect("nothing recorded in time")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_the_person_said_to_a_restarted_member_answers_its_new_prompts() {
    let test = "nothing_the_person_said_to_a_restarted_member_answers_its_new_prompts";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let rules = crate::approvals::lamp_rules();
    let m1 = Member::start_with("m1", &nats, &store, &rules);
    let m2 = Member::start_with("m2", &nats, &store, &rules);
    let (mut m3, listen) = member_on_a_port("m3", &nats, &store, &rules);
    let all = [&m1, &m2, &m3];
    let lamp = dk_device::samples::Lamp::new();
    let lock = dk_device::samples::Lock::new();
    let url = m3.vessel().url();
    let _lamp = Served::start(lamp.device(), &url, &m3.scratch.root().join("lamp.key"));
    pair(&m3, &all, "desk-lamp", &["set_light", "strobe"]).await;
    let _lock = Served::start(lock.device(), &url, &m3.scratch.root().join("lock.key"));
    pair(&m3, &all, "front-door", &["read_lock", "lock", "unlock"]).await;
    let credential = add_helper(&m3.admin(), &all).await;
    let (outsider, mut recorded) = record(&nats, "dk.fleet.request.m3").await;

    // An agent on m3 asks to strobe the lamp: the prompt is shown on m2,
    // and the person allows it there; the answer is recorded on its way.
    let mut agent = crate::approvals::Agent::start(&m3.scratch, &credential);
    agent.call(2, STROBE, json!({}));
    let stale = waiting_for(&m2.admin(), STROBE).await;
    let allowed = m2.run(&["approvals", "allow", &stale.to_string()]);
    assert!(allowed.contains("allowed once"), "{allowed}");
    let answer = agent.answer(2);
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let captured = next(&mut recorded).await;
    assert_eq!(lamp.calls().len(), 1);

    // A second strobe is asked, and shown on m2; then m3 is killed and
    // started again: the same prompt numbers again, a new incarnation.
    agent.call(3, STROBE, json!({}));
    let shown = waiting_for(&m2.admin(), STROBE).await;
    drop(agent);
    let before = fleet_status(&m3).await["incarnation"].clone();
    kill_and_restart(&mut m3, &nats, &store, &rules, &listen);
    eventually("m2 hears m3's new incarnation", || async {
        let now = fleet_status(&m2).await;
        let m3 = now["members"]
            .as_array()?
            .iter()
            .find(|m| m["member"] == "m3")?
            .clone();
        (m3["incarnation"] != before).then_some(())
    })
    .await;
    eventually("the lock back on m3", || async {
        devices(&m3.admin())
            .await
            .iter()
            .any(|d| d["id"] == "front-door" && d["connected"] == true)
            .then_some(())
    })
    .await;

    // The restarted m3 raises a new prompt: unlock the door.
    let mut agent = crate::approvals::Agent::start(&m3.scratch, &credential);
    agent.call(2, UNLOCK, json!({}));
    let door = waiting_for(&m3.admin(), UNLOCK).await;
    let door_on_m2 = waiting_for(&m2.admin(), UNLOCK).await;
    assert_ne!(door_on_m2, shown);

    // The answer recorded before the restart, sent again: refused by the
    // new incarnation, counted as stale, and the door stays locked.
    let stale_before = fleet_status(&m3).await["dropped"]["stale"]
        .as_u64()
        .unwrap();
    send_again(&outsider, &captured).await;
    eventually("the recorded answer counted stale", || async {
        let stale = fleet_status(&m3).await["dropped"]["stale"].as_u64()?;
        (stale > stale_before).then_some(())
    })
    .await;

    // The person says yes to the prompt m2 showed before the restart (the
    // strobe): not taken, and said so.
    let out = m2.scratch.run(&["approvals", "allow", &shown.to_string()]);
    assert!(!out.status.success(), "{out:?}");
    // The door's prompt is still open, on m3 and on m2, and the door locked.
    assert!(
        approvals(&m3.admin())
            .await
            .contains(&(door, UNLOCK.to_owned()))
    );
    assert!(
        approvals(&m2.admin())
            .await
            .contains(&(door_on_m2, UNLOCK.to_owned()))
    );
    assert!(lock.state().locked);
    assert!(lock.calls().iter().all(|(name, _)| name != "unlock"));
    // Refused on m2 (the mirror of m3's prompt): closed everywhere.
    let refused = m2.run(&["approvals", "deny", &door_on_m2.to_string()]);
    assert!(refused.contains("refused"), "{refused}");
    let answer = agent.answer(2);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(lock.state().locked);
    drop(agent);
    drop(outsider);
    stop([m1, m2, m3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_call_sent_again_after_its_holder_restarted_does_not_run() {
    let test = "a_routed_call_sent_again_after_its_holder_restarted_does_not_run";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let no_rules = no_rules();
    let (mut m1, listen) = member_on_a_port("m1", &nats, &store, &no_rules);
    let m2 = Member::start_with("m2", &nats, &store, &no_rules);
    let lamp = dk_device::samples::Lamp::new();
    let _lamp = Served::start(
        lamp.device(),
        &m1.vessel().url(),
        &m1.scratch.root().join("lamp.key"),
    );
    pair(&m1, &[&m1, &m2], "desk-lamp", &["read_light", "set_light"]).await;
    let (outsider, mut recorded) = record(&nats, "dk.fleet.request.m1").await;

    // Two calls through m2, carried to m1: brightness 40, then 10.
    let on =
        |brightness| json!({"tool": SET_LIGHT, "input": {"on": true, "brightness": brightness}});
    let answer = m2.admin().post("/v1/tools/call", &on(40)).await.unwrap();
    assert_eq!(answer.body["ok"], true, "{answer:?}");
    let first = next(&mut recorded).await;
    let answer = m2.admin().post("/v1/tools/call", &on(10)).await.unwrap();
    assert_eq!(answer.body["ok"], true, "{answer:?}");
    assert_eq!(lamp.calls().len(), 2);

    // m1 restarts; the lamp comes back to it.
    kill_and_restart(&mut m1, &nats, &store, &no_rules, &listen);
    eventually("the lamp back on m1, seen from m2", || async {
        devices(&m2.admin())
            .await
            .iter()
            .any(|d| d["id"] == "desk-lamp" && d["heldBy"] == "m1")
            .then_some(())
    })
    .await;
    let stale_before = fleet_status(&m1).await["dropped"]["stale"]
        .as_u64()
        .unwrap();
    // The first call, recorded, sent again: refused, and the lamp untouched.
    send_again(&outsider, &first).await;
    eventually("the recorded call counted stale", || async {
        let stale = fleet_status(&m1).await["dropped"]["stale"].as_u64()?;
        (stale > stale_before).then_some(())
    })
    .await;
    let read = m2
        .admin()
        .post("/v1/tools/call", &json!({"tool": READ_LIGHT, "input": {}}))
        .await
        .unwrap();
    assert_eq!(read.body["result"]["brightness"], 10, "{read:?}");
    let set: Vec<_> = lamp
        .calls()
        .into_iter()
        .filter(|(name, _)| name == "set_light")
        .collect();
    assert_eq!(set.len(), 2, "{set:?}");
    // What the operator sees: where the lamp is, from m2; the member, its
    // peer and the stale message counted, from m1.
    let listed = m2.run(&["devices"]);
    assert!(listed.contains("held by m1"), "{listed}");
    let status = m1.run(&["status"]);
    assert!(status.contains("fleet member         m1 (run "), "{status}");
    assert!(status.contains("member m2"), "{status}");
    assert!(status.contains("stale"), "{status}");
    drop(outsider);
    stop([m1, m2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stopped_cleanly_is_forgotten_at_once() {
    let test = "a_member_stopped_cleanly_is_forgotten_at_once";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let no_rules = no_rules();
    // Someone listening to everything: NATS never says "no responders".
    let (_outsider, _everything) = record(&nats, ">").await;
    let m1 = Member::start_with("m1", &nats, &store, &no_rules);
    let m2 = Member::start_with("m2", &nats, &store, &no_rules);
    let lamp = dk_device::samples::Lamp::new();
    let _lamp = Served::start(
        lamp.device(),
        &m1.vessel().url(),
        &m1.scratch.root().join("lamp.key"),
    );
    pair(&m1, &[&m1, &m2], "desk-lamp", &["read_light"]).await;

    // m1 stops cleanly: m2 forgets it, and the lamp it held, at once; a
    // call for the lamp is refused as not connected (not left waiting for
    // a member that is gone).
    let Member { vessel, .. } = m1;
    vessel.unwrap().terminate();
    eventually("m2 hears m1's goodbye", || async {
        let status = fleet_status(&m2).await;
        let gone = status["departed"]
            .as_array()?
            .iter()
            .find(|d| d["member"] == "m1")?
            .clone();
        assert_eq!(gone["goodbye"], true, "m1 went silent: {status}");
        status["members"].as_array()?.is_empty().then_some(())
    })
    .await;
    let read = m2
        .admin()
        .post("/v1/tools/call", &json!({"tool": READ_LIGHT, "input": {}}))
        .await
        .unwrap();
    assert_eq!(read.body["ok"], false, "{read:?}");
    let reason = read.body["reason"].as_str().unwrap();
    assert!(reason.contains("is not connected"), "{reason}");
    stop([m2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_answer_of_300_kib_arrives_whole() {
    let test = "a_routed_answer_of_300_kib_arrives_whole";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let no_rules = no_rules();
    let m1 = Member::start_with("m1", &nats, &store, &no_rules);
    let m2 = Member::start_with("m2", &nats, &store, &no_rules);
    // A camera whose snapshot is 300 KiB of text.
    let snapshot: String = (0..300 * 1024)
        .map(|i| char::from(b'a' + u8::try_from(i % 26).unwrap()))
        .collect();
    let sent = snapshot.clone();
    let camera = Device::define(&json!({
        "id": "camera", "name": "Camera", "kind": "camera", "version": "1.0.0",
        "capabilities": [{"name": "snapshot", "kind": "sensor", "description": "A snapshot."}]
    }))
    .handler("snapshot", move |_| {
        let sent = sent.clone();
        async move { Ok(json!({"image": sent})) }
    })
    .build()
    .unwrap();
    let _camera = Served::start(
        camera,
        &m1.vessel().url(),
        &m1.scratch.root().join("camera.key"),
    );
    pair(&m1, &[&m1, &m2], "camera", &["snapshot"]).await;
    let answer = m2
        .admin()
        .post(
            "/v1/tools/call",
            &json!({"tool": "device__camera__snapshot", "input": {}}),
        )
        .await
        .unwrap();
    assert_eq!(answer.body["ok"], true, "{}", answer.body["reason"]);
    assert_eq!(
        answer.body["result"]["image"].as_str(),
        Some(snapshot.as_str())
    );
    stop([m1, m2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_paused_member_is_taken_or_said_not_taken_and_never_late() {
    let test = "an_answer_to_a_paused_member_is_taken_or_said_not_taken_and_never_late";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let rules = crate::approvals::lamp_rules();
    let m2 = Member::start_with("m2", &nats, &store, &rules);
    let m3 = Member::start_with("m3", &nats, &store, &rules);
    let lock = dk_device::samples::Lock::new();
    let _lock = Served::start(
        lock.device(),
        &m3.vessel().url(),
        &m3.scratch.root().join("lock.key"),
    );
    pair(&m3, &[&m2, &m3], "front-door", &["read_lock", "unlock"]).await;
    let credential = add_helper(&m3.admin(), &[&m2, &m3]).await;
    let mut agent = crate::approvals::Agent::start(&m3.scratch, &credential);
    agent.call(2, UNLOCK, json!({}));
    waiting_for(&m3.admin(), UNLOCK).await;
    let on_m2 = waiting_for(&m2.admin(), UNLOCK).await;

    // m3 pauses (a long GC pause, a frozen VM); the person says yes on m2.
    let pid = m3.vessel().child.as_ref().unwrap().id().to_string();
    signal("-STOP", &pid);
    let said = m2
        .admin()
        .post(
            &format!("/v1/pending/{on_m2}/approval"),
            &json!({"approved": true}),
        )
        .await
        .unwrap();
    // Not taken, and said so: the paused member did not confirm it.
    assert_eq!(said.status, 409, "{said:?}");
    signal("-CONT", &pid);

    // m3 comes back: the answer it was sent while paused is not applied
    // late, its prompt is still open, and m2 shows it again.
    let on_m2 = waiting_for(&m2.admin(), UNLOCK).await;
    assert!(!approvals(&m3.admin()).await.is_empty());
    assert!(lock.state().locked);
    assert!(lock.calls().iter().all(|(name, _)| name != "unlock"));
    eventually("the late answer counted stale on m3", || async {
        let stale = fleet_status(&m3).await["dropped"]["stale"].as_u64()?;
        (stale >= 1).then_some(())
    })
    .await;

    // Paused again, and woken while the person's answer is on its way (a
    // pause shorter than the answer's time): the answer is taken, and the
    // person is told so.
    let (_outsider, mut sent_to_m3) = record(&nats, "dk.fleet.request.m3").await;
    signal("-STOP", &pid);
    let admin = m2.admin();
    let answering = tokio::spawn(async move {
        admin
            .post(
                &format!("/v1/pending/{on_m2}/approval"),
                &json!({"approved": false}),
            )
            .await
            .unwrap()
    });
    // m3 wakes once the answer is on its way to it, and reads it then.
    next(&mut sent_to_m3).await;
    signal("-CONT", &pid);
    let said = answering.await.unwrap();
    assert_eq!(said.status, 204, "{said:?}");
    let answer = agent.answer(2);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(lock.state().locked);
    drop(agent);
    stop([m2, m3]);
}

/// The rule file with no rules.
fn no_rules() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/policies/good/empty.yaml")
        .to_str()
        .unwrap()
        .to_owned()
}

/// Sends `signal` to the process `pid`.
fn signal(signal: &str, pid: &str) {
    assert!(
        std::process::Command::new("kill")
            .args([signal, pid])
            .status()
            .unwrap()
            .success()
    );
}
