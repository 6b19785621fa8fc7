//! The C thermostat (`examples/c/thermostat.c` on `libdk_device.a` and the
//! runner it shares with the lamp, built by `cargo xtask firmware`)
//! against a real `dk vessel` whose rule asks the person before every
//! thermostat action: the pairing request shows the range its manifest
//! declares and its event; 35 °C is refused by the vessel, naming the
//! bound, before the person is asked and before the C handler; 22 °C,
//! once the person says yes, reaches the handler and its answer comes
//! back; the temperature it then reports as `temperature_changed`
//! reaches the vessel and an agent reads it; SIGTERM ends it with exit 0
//! and the library's heap back to zero. The same again under valgrind,
//! which must find no error and no leak.
//!
//! Without libwebsockets' development files or valgrind the tests say so
//! and pass, unless `DK_REQUIRE_PEERS` is set.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::approvals::{Agent, approve_the_waiting_call};
use crate::bounds::ASK;
use crate::c_device::{CDevice, VALGRIND, libwebsockets_or_skip, stats, valgrind_or_skip};
use crate::process::{Scratch, approve_consent, consent_id, eventually, wait_connected};

const SET_TARGET: &str = "device__hall_thermostat__set_target";
const EVENTS: &str = "dk://devices/hall-thermostat/events";

/// The whole story, the thermostat run through `runner` (nothing, or
/// valgrind).
async fn scenario(runner: &[&str]) {
    let scratch = Scratch::new("c-thermostat");
    let rules = scratch.root().join("thermostat.yaml");
    std::fs::write(&rules, ASK).unwrap();
    let (vessel, _) = crate::agents::start_with(&scratch, &["--policies", rules.to_str().unwrap()]);
    let admin = vessel.admin(&scratch);
    let stats_file = scratch.root().join("thermostat.stats");
    let thermostat = CDevice::start(
        "thermostat",
        runner,
        &vessel.url(),
        &scratch.root().join("hall-thermostat.dk2"),
        &stats_file,
        scratch.root().join("thermostat.err"),
        &[],
    );

    // The person compares the code and is shown the range and the event.
    let code = thermostat.wait_for("pairing code: ");
    let id = eventually("the thermostat's pairing request", || {
        consent_id(&admin, "hall-thermostat")
    })
    .await;
    let pending = admin.get("/v1/pending").await.unwrap().body;
    let request = &pending
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap()["request"];
    assert_eq!(request["code"], code.as_str(), "{request}");
    assert_eq!(request["channel"], "dk/2", "{request}");
    let set = request["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "set_target")
        .unwrap();
    assert_eq!(set["params"][0]["name"], "celsius", "{set}");
    assert_eq!(set["params"][0]["bounds"], "from 5 to 30 °C", "{set}");
    assert_eq!(
        request["events"][0]["name"], "temperature_changed",
        "{request}"
    );
    approve_consent(&admin, id, &["set_target", "temperature_changed"]).await;
    wait_connected(&admin, "hall-thermostat").await;
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "c-thermostat", "scope": ["hall-thermostat"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    let mut agent = Agent::start(&scratch, added.body["credential"].as_str().unwrap());

    // 35 °C: refused at the input check, naming the bound, before the
    // person is asked.
    agent.call(2, SET_TARGET, json!({"celsius": 35}));
    let refused = agent.answer(2);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let text = refused["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("\"celsius\" must be at most 30 °C"), "{text}");
    assert_eq!(
        admin.get("/v1/pending").await.unwrap().body,
        json!([]),
        "the person was asked"
    );

    // 22 °C: the person is asked, and a yes reaches the C handler, whose
    // first `target:` line is this call's: 35 never reached it.
    agent.call(3, SET_TARGET, json!({"celsius": 22, "mode": "heat"}));
    approve_the_waiting_call(&admin).await;
    let done = agent.answer(3);
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(
        done["result"]["structuredContent"],
        json!({"current": 20, "target": 22, "mode": "heat"}),
        "{done}"
    );
    assert_eq!(thermostat.wait_for("target: "), "22 heat");

    // The temperature moves toward 22 and goes out as the declared event,
    // which reaches the vessel: the agent reads it in the device's events.
    assert_eq!(thermostat.wait_for("temperature: "), "20.5");
    let agent = Mutex::new(agent);
    let next = AtomicU64::new(4);
    let events = eventually("the declared event at the vessel", || async {
        let id = next.fetch_add(1, Ordering::Relaxed);
        let mut agent = agent.lock().unwrap();
        agent.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "resources/read",
            "params": {"uri": EVENTS}}),
        );
        let read = agent.answer(id);
        let text = read["result"]["contents"][0]["text"].as_str()?.to_owned();
        text.contains("temperature_changed").then_some(text)
    })
    .await;
    let events: Value = serde_json::from_str(&events).unwrap();
    assert!(events.to_string().contains("\"current\":20.5"), "{events}");

    let (code, said) = thermostat.terminate();
    assert_eq!(code, Some(0), "the thermostat's exit on SIGTERM: {said}");
    let counted = stats(&stats_file);
    assert_eq!(counted["heap_at_exit_bytes"], 0, "{counted:?}");
    drop(vessel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_thermostat_declares_its_range_and_event_and_35_never_reaches_its_handler() {
    if !libwebsockets_or_skip("c_thermostat") {
        return;
    }
    scenario(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_thermostat_under_valgrind_has_no_memory_error_and_no_leak() {
    if !libwebsockets_or_skip("c_thermostat under valgrind")
        || !valgrind_or_skip("c_thermostat under valgrind")
    {
        return;
    }
    scenario(VALGRIND).await;
}
