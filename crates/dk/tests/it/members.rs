//! Three `dk vessel` processes run as one fleet, on a real PostgreSQL and a
//! real `nats-server` (dk-testkit's): a lamp pairs through the first, its
//! pairing is answered on the second, an agent on the second calls it, the
//! approval that call needs is answered on the third; then the first is
//! killed with SIGKILL, the lamp moves to another member by itself, and
//! the agent's calls succeed again. Every call leaves exactly one decision
//! in the shared log, and `dk audit verify --store` finds the chain intact.
//!
//! Without PostgreSQL or nats-server the test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set.

use std::time::Instant;

use dk_http::AdminClient;
use dk_testkit::nats::{Nats, nats_or_skip};
use dk_testkit::postgres::PgServer;
use serde_json::{Value, json};

use crate::approvals::{Agent, Lamp, approval_id, lamp_rules};
use crate::process::{Running, Scratch, devices, eventually, succeeded};

const SET_LIGHT: &str = "device__desk_lamp__set_light";

/// The simulated lamp, connecting to `first` and moving on to `others`.
fn lamp(first: &Member, others: &[&Member]) -> Lamp {
    let also_at: Vec<String> = others.iter().map(|o| o.vessel().url()).collect();
    Lamp::simulate(
        &first.vessel().url(),
        &also_at,
        &first.scratch.root().join("desk-lamp.key"),
    )
}

/// A member of the fleet: its scratch home and its running vessel.
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) vessel: Option<Running>,
    /// Last: fields drop in order, so the vessel is gone before its
    /// folder is removed.
    pub(crate) scratch: Scratch,
}

impl Member {
    pub(crate) fn start(name: &str, nats: &Nats, store: &str) -> Member {
        Member::start_with(name, nats, store, &lamp_rules())
    }

    pub(crate) fn start_with(name: &str, nats: &Nats, store: &str, rules: &str) -> Member {
        Member::start_full(name, nats, store, rules, &[])
    }

    pub(crate) fn start_full(
        name: &str,
        nats: &Nats,
        store: &str,
        rules: &str,
        extra: &[&str],
    ) -> Member {
        let scratch = Scratch::new(&format!("fleet-{name}"));
        let vessel = Member::run_vessel(&scratch, name, nats, store, rules, extra);
        Member {
            name: name.to_owned(),
            scratch,
            vessel: Some(vessel),
        }
    }

    /// Stops the member's vessel and starts it again on the same home.
    pub(crate) fn restart(&mut self, nats: &Nats, store: &str, rules: &str) {
        if let Some(vessel) = self.vessel.take() {
            vessel.interrupt();
        }
        self.vessel = Some(Member::run_vessel(
            &self.scratch,
            &self.name,
            nats,
            store,
            rules,
            &[],
        ));
    }

    pub(crate) fn run_vessel(
        scratch: &Scratch,
        name: &str,
        nats: &Nats,
        store: &str,
        rules: &str,
        extra: &[&str],
    ) -> Running {
        let key = nats.key_file();
        let args = [
            "--mcp-listen",
            "127.0.0.1:0",
            "--fleet",
            &nats.url(),
            "--fleet-key",
            key.to_str().unwrap(),
            "--fleet-member",
            name,
            "--policies",
            rules,
        ];
        let args = [&args[..], extra].concat();
        Running::start_env(scratch, &args, &[("DK_STORE", store)])
    }

    pub(crate) fn vessel(&self) -> &Running {
        self.vessel.as_ref().unwrap()
    }

    pub(crate) fn admin(&self) -> AdminClient {
        self.vessel().admin(&self.scratch)
    }

    pub(crate) fn run(&self, args: &[&str]) -> String {
        succeeded(&self.scratch.run(args))
    }
}

/// The shared PostgreSQL and a `nats-server` of the test's own, or `None`
/// (said) when either is not installed.
pub(crate) fn servers(test: &str) -> Option<(&'static PgServer, Nats)> {
    let pg = PgServer::shared(test)?;
    Some((pg, Nats::start(nats_or_skip(test)?, "")))
}

/// Stops every member still running, cleanly.
pub(crate) fn stop(members: impl IntoIterator<Item = Member>) {
    for member in members {
        if let Some(vessel) = member.vessel {
            vessel.interrupt();
        }
    }
}

/// The decisions in the shared log, oldest first.
pub(crate) fn decisions(owner: &Member, store: &str) -> Vec<Value> {
    let out = owner.run(&["audit", "tail", "--store", store, "--json", "-n", "100000"]);
    out.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|entry| entry["kind"] == "decision")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_vessels_run_as_one_and_carry_on_when_one_is_killed() {
    let test = "three_vessels_run_as_one_and_carry_on_when_one_is_killed";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let mut a = Member::start("a", &nats, &store);
    let b = Member::start("b", &nats, &store);
    let c = Member::start("c", &nats, &store);

    // The lamp knows every member; it pairs with the first, and the person
    // answers its pairing on the second.
    let lamp = lamp(&a, &[&b, &c]);
    crate::process::approve_when_asked(&b.admin(), "desk-lamp", &["set_light", "strobe"]).await;
    let (admin_a, admin_b, admin_c) = (a.admin(), b.admin(), c.admin());
    eventually("the lamp connected to the first member", || async {
        devices(&admin_a)
            .await
            .first()
            .is_some_and(|d| d["connected"] == true)
            .then_some(())
    })
    .await;
    // Every member knows the pairing and its grants.
    for admin in [&admin_b, &admin_c] {
        eventually("the pairing known to every member", || async {
            devices(admin)
                .await
                .first()
                .is_some_and(|d| d["grants"] == json!(["set_light", "strobe"]))
                .then_some(())
        })
        .await;
    }

    // An agent added on the third member calls through the second.
    let credential = add_helper(&admin_c, &[&admin_b]).await;
    // The lamp is connected to the first member only: the second reaches
    // it through the first.
    assert_eq!(devices(&admin_a).await[0]["connected"], true);
    assert_eq!(devices(&admin_b).await[0]["connected"], false);
    eventually("the second member sees where the lamp is", || async {
        (devices(&admin_b).await[0]["heldBy"] == "a").then_some(())
    })
    .await;
    let mut agent = Agent::start(&b.scratch, &credential);
    let mut calls = 0;

    // The call needs a yes: asked on the second member, shown on all
    // three, answered on the third, remembered for the same arguments.
    let on = json!({"on": true, "brightness": 40});
    agent.call(2, SET_LIGHT, on.clone());
    calls += 1;
    let id = approval_id(&admin_c).await.to_string();
    assert!(approval_id(&admin_a).await > 0);
    let allowed = c.run(&["approvals", "allow", &id, "--remember", "args"]);
    assert!(allowed.contains("allowed"), "{allowed}");
    let answer = agent.answer(2);
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    // The prompt closed on every member.
    listing_everywhere(&[&admin_a, &admin_b, &admin_c], "/v1/pending", 0).await;
    // Remembered where it was decided: the same call is not asked again.
    agent.call(3, SET_LIGHT, on.clone());
    calls += 1;
    let answer = agent.answer(3);
    assert_ne!(answer["result"]["isError"], true, "{answer}");

    // The yes remembered on the second member holds on the first too: the
    // same agent calling through it is not asked.
    listing_everywhere(&[&admin_a, &admin_c], "/v1/approvals/remembered", 1).await;
    let mut agent_on_a = Agent::start(&a.scratch, &credential);
    agent_on_a.call(2, SET_LIGHT, on.clone());
    calls += 1;
    let answer = agent_on_a.answer(2);
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    // Revoked on the third member, it ends everywhere: the agent on the
    // second is asked again.
    let copy = admin_c.get("/v1/approvals/remembered").await.unwrap().body[0]["id"]
        .as_u64()
        .unwrap();
    let revoked = admin_c
        .delete(&format!("/v1/approvals/remembered/{copy}"))
        .await
        .unwrap();
    assert!(revoked.status < 300, "{revoked:?}");
    listing_everywhere(&[&admin_a, &admin_b], "/v1/approvals/remembered", 0).await;
    agent.call(4, SET_LIGHT, on.clone());
    calls += 1;
    let asked = approval_id(&admin_b).await.to_string();
    let allowed = b.run(&["approvals", "allow", &asked, "--remember", "args"]);
    assert!(allowed.contains("allowed"), "{allowed}");
    let answer = agent.answer(4);
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    drop(agent_on_a);

    // A grant revoked on the third member leaves the agent's tools on the
    // second.
    let revoked = admin_c
        .delete("/v1/devices/desk-lamp/grants/strobe")
        .await
        .unwrap();
    assert!(revoked.status < 300, "{revoked:?}");
    let mut list_id = 100;
    eventually("the agent's tools without strobe", || {
        list_id += 1;
        agent.send(&json!({"jsonrpc": "2.0", "id": list_id, "method": "tools/list"}));
        let tools = agent.answer(list_id);
        let names: Vec<String> = tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        let done = names.iter().any(|n| n == SET_LIGHT)
            && !names.iter().any(|n| n == "device__desk_lamp__strobe");
        async move { done.then_some(()) }
    })
    .await;

    // The first member dies: the lamp moves on by itself, and the agent's
    // calls succeed again.
    a.vessel.take().unwrap().kill();
    let mut next_id = 10;
    let mut made = 0;
    dk_testkit::eventually("the agent's calls succeeding again", || {
        agent.call(next_id, SET_LIGHT, on.clone());
        made += 1;
        let answer = agent.answer(next_id);
        next_id += 1;
        answer["result"]["isError"] != true
    })
    .await;
    calls += made;

    // One decision per call, none lost and none twice, and the chain
    // verifies.
    let made = eventually("every decision committed", || async {
        let made = decisions(&b, &store);
        (made.len() == calls).then_some(made)
    })
    .await;
    let allowed = made
        .iter()
        .filter(|d| d["entry"]["allowed"] == true)
        .count();
    assert!(allowed >= 5, "{made:?}");
    // Each allowance was recorded once, by the member that decided the
    // call, however many members kept it: two made, one revoked.
    let all = b.run(&["audit", "tail", "--store", &store, "--json", "-n", "100000"]);
    let kinds: Vec<String> = all
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let count = |kind: &str| kinds.iter().filter(|k| *k == kind).count();
    assert_eq!(count("allowance-created"), 2, "{kinds:?}");
    assert_eq!(count("allowance-revoked"), 1, "{kinds:?}");
    let verified = b.run(&["audit", "verify", "--store", &store]);
    assert!(verified.contains("intact"), "{verified}");

    drop(agent);
    drop(lamp);
    stop([b, c]);
    drop(nats);
}

/// Adds the agent `helper` (the lamp in its scope) through `admin` and
/// waits until each of `others` knows it; its credential.
async fn add_helper(admin: &AdminClient, others: &[&AdminClient]) -> String {
    let credential = crate::approvals::add_helper(admin).await;
    for other in others {
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
    credential
}

/// A rule file in `scratch`'s directory.
pub(crate) fn rules(scratch: &Scratch, yaml: &str) -> String {
    let path = scratch.root().join("rules.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The admin API's answer to a call of `tool`.
/// Waits until the admin API's list at `path` holds `count` items on every
/// member in `admins`.
pub(crate) async fn listing_everywhere(admins: &[&AdminClient], path: &str, count: usize) {
    for admin in admins {
        eventually(
            &format!("{count} item(s) at {path} on every member"),
            || async {
                let list = admin.get(path).await.unwrap().body;
                (list.as_array()?.len() == count).then_some(())
            },
        )
        .await;
    }
}

pub(crate) async fn call(admin: &AdminClient, tool: &str) -> Value {
    let answer = admin
        .post("/v1/tools/call", &json!({"tool": tool, "input": {}}))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

/// Pairs the lamp through `first` (answered there) with `grant`, and waits
/// until every member knows the pairing.
async fn pair_lamp(first: &Member, others: &[&Member], grant: &[&str]) -> Lamp {
    let lamp = lamp(first, others);
    crate::process::approve_when_asked(&first.admin(), "desk-lamp", grant).await;
    for member in std::iter::once(first).chain(others.iter().copied()) {
        let admin = member.admin();
        eventually("the pairing known to every member", || async {
            devices(&admin)
                .await
                .first()
                .is_some_and(|d| d["grants"] == json!(grant))
                .then_some(())
        })
        .await;
    }
    eventually("the lamp connected", || async {
        devices(&first.admin())
            .await
            .first()
            .is_some_and(|d| d["connected"] == true)
            .then_some(())
    })
    .await;
    let name = first.name.clone();
    for other in others {
        let admin = other.admin();
        eventually("the lamp's member known to the others", || async {
            devices(&admin)
                .await
                .first()
                .is_some_and(|d| d["heldBy"] == name.as_str())
                .then_some(())
        })
        .await;
    }
    lamp
}

const READ_LIGHT: &str = "device__desk_lamp__read_light";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_holds_across_the_fleet() {
    let test = "a_limit_holds_across_the_fleet";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let holder = Scratch::new("fleet-rules");
    let limited = rules(
        &holder,
        "version: 1\npolicies:\n  - name: three-reads\n    action: device_use\n    \
         condition: \"capability equals read_light\"\n    decision: block\n    \
         message: \"three reads an hour\"\n    limit: 3 per 1h\n",
    );
    let members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .map(|name| Member::start_with(name, &nats, &store, &limited))
        .collect();
    let _lamp = pair_lamp(&members[0], &[&members[1], &members[2]], &["read_light"]).await;

    // Thirty calls at once, ten through each member: exactly three pass.
    let admins: Vec<AdminClient> = members.iter().map(Member::admin).collect();
    let calls = (0..30).map(|i| {
        let admin = &admins[i % 3];
        async move { call(admin, READ_LIGHT).await }
    });
    let answers = futures::future::join_all(calls).await;
    let passed = answers.iter().filter(|a| a["ok"] == true).count();
    assert_eq!(passed, 3, "{answers:?}");
    for refused in answers.iter().filter(|a| a["ok"] != true) {
        let reason = refused["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("three reads an hour"), "{refused}");
    }
    stop(members);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nats_down_local_calls_work_routed_ones_fail_at_once_and_all_comes_back() {
    let test = "with_nats_down_local_calls_work_routed_ones_fail_at_once_and_all_comes_back";
    let Some((pg, mut nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let holder = Scratch::new("fleet-open");
    let open = rules(&holder, "version: 1\npolicies: []\n");
    let a = Member::start_with("a", &nats, &store, &open);
    let b = Member::start_with("b", &nats, &store, &open);
    let _lamp = pair_lamp(&a, &[&b], &["read_light"]).await;
    let (admin_a, admin_b) = (a.admin(), b.admin());
    let routed = call(&admin_b, READ_LIGHT).await;
    assert_eq!(routed["ok"], true, "{routed}");

    nats.stop();
    let down = Instant::now();
    let refused = eventually("a routed call refused", || async {
        let answer = call(&admin_b, READ_LIGHT).await;
        (answer["ok"] != true).then_some(answer)
    })
    .await;
    let took = down.elapsed();
    let reason = refused["reason"].as_str().unwrap();
    assert!(reason.contains("NATS connection is down"), "{refused}");
    let started = Instant::now();
    let again = call(&admin_b, READ_LIGHT).await;
    let answered_in = started.elapsed();
    let again_reason = again["reason"].as_str().unwrap();
    assert!(again_reason.contains("NATS connection is down"), "{again}");
    println!(
        "NATS down: a routed call refused {} ms after the kill, the next in {} ms",
        took.as_millis(),
        answered_in.as_millis()
    );
    let local = call(&admin_a, READ_LIGHT).await;
    assert_eq!(local["ok"], true, "{local}");

    nats.resume();
    eventually("routed calls again", || async {
        (call(&admin_b, READ_LIGHT).await["ok"] == true).then_some(())
    })
    .await;

    // Each member keeps its own admin token across restarts, whatever the
    // others' are.
    let mut a = a;
    let before = std::fs::read_to_string(a.scratch.admin_token_file()).unwrap();
    a.restart(&nats, &store, &open);
    let after = std::fs::read_to_string(a.scratch.admin_token_file()).unwrap();
    assert_eq!(before, after, "the member's admin token was replaced");
    stop([a, b]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_down_the_fleet_fails_closed_and_recovers() {
    let test = "with_postgres_down_the_fleet_fails_closed_and_recovers";
    let Some(pg) = PgServer::start(test) else {
        return;
    };
    let Some(nats) = nats_or_skip(test) else {
        return;
    };
    let nats = Nats::start(nats, "");
    let store = pg.database();
    let holder = Scratch::new("fleet-pg-down");
    let open = rules(&holder, "version: 1\npolicies: []\n");
    let a = Member::start_with("a", &nats, &store, &open);
    let b = Member::start_with("b", &nats, &store, &open);
    let _lamp = pair_lamp(&a, &[&b], &["read_light"]).await;
    let (admin_a, admin_b) = (a.admin(), b.admin());
    assert_eq!(call(&admin_b, READ_LIGHT).await["ok"], true);

    pg.stop();
    // No call without its record, through either member.
    for admin in [&admin_a, &admin_b] {
        let refused = eventually("a call refused", || async {
            let answer = call(admin, READ_LIGHT).await;
            (answer["ok"] != true).then_some(answer)
        })
        .await;
        println!("PostgreSQL down, a call: {refused}");
    }
    // No grant either: refused with the store's error, nothing changed.
    let grant = admin_a
        .put("/v1/devices/desk-lamp/grants/set_light")
        .await
        .unwrap();
    assert!(grant.status >= 500, "{grant:?}");
    println!("PostgreSQL down, a grant: {} {}", grant.status, grant.body);
    assert_eq!(devices(&admin_b).await[0]["grants"], json!(["read_light"]));

    pg.restart();
    for admin in [&admin_a, &admin_b] {
        eventually("calls again", || async {
            (call(admin, READ_LIGHT).await["ok"] == true).then_some(())
        })
        .await;
    }
    // Every call made has its record, and the chain verifies.
    let verified = b.run(&["audit", "verify", "--store", &store]);
    assert!(verified.contains("intact"), "{verified}");
    stop([a, b]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_rate_holds_across_the_fleet() {
    let test = "an_agents_rate_holds_across_the_fleet";
    let Some((pg, nats)) = servers(test) else {
        return;
    };
    let store = pg.database();
    let holder = Scratch::new("fleet-rate");
    let open = rules(&holder, "version: 1\npolicies: []\n");
    let config = holder.root().join("vessel.toml");
    std::fs::write(
        &config,
        "[rateLimits]\ncallsPerMinute = 1\nburst = 3\nperDeviceCallsPerMinute = 0\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .map(|name| Member::start_full(name, &nats, &store, &open, &["--config", &config]))
        .collect();
    let _lamp = pair_lamp(&members[0], &[&members[1], &members[2]], &["read_light"]).await;
    let admins: Vec<AdminClient> = members.iter().map(Member::admin).collect();
    let others: Vec<&AdminClient> = admins.iter().skip(1).collect();
    let credential = add_helper(&admins[0], &others).await;
    // The same agent through each of the three members, three calls each:
    // its burst of three is spent once, fleet-wide.
    let mut agents: Vec<Agent> = members
        .iter()
        .map(|member| Agent::start(&member.scratch, &credential))
        .collect();
    let mut passed = 0;
    let mut refused = Vec::new();
    for round in 0..3 {
        for agent in &mut agents {
            let id = 10 + round;
            agent.call(id, READ_LIGHT, json!({}));
            let answer = agent.answer(id);
            if answer["result"]["isError"] == true {
                refused.push(answer);
            } else {
                passed += 1;
            }
        }
    }
    assert_eq!(passed, 3, "{refused:?}");
    for answer in &refused {
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains("rate limit"), "{answer}");
    }
    drop(agents);
    stop(members);
}
