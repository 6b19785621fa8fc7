//! The reference lamp, defined with dk-device, paired in the registry and
//! called through the adapter over an in-process text link.

use std::sync::Arc;
use std::time::Duration;

use dk_core::{
    adapter::{ApprovalRequest, Approver, ApproverFn, CallContext, ToolOutcome},
    registry::DeviceRegistry,
};
use dk_device::samples::Lamp;
use dk_device::{Device, HandlerError};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify};

use crate::harness::Vessel;

const NO_RULES: &str = "version: 1\npolicies: []\n";
const SET: &str = "device__desk_lamp__set_light";
const READ: &str = "device__desk_lamp__read_light";
const STROBE: &str = "device__desk_lamp__strobe";

fn yes() -> impl Approver {
    ApproverFn(|_| async { Ok(true) })
}

#[track_caller]
fn refused(outcome: &ToolOutcome, expected: &str) {
    assert_eq!(
        outcome.reason(),
        Some(expected),
        "{}",
        serde_json::to_string(outcome).unwrap()
    );
}

#[tokio::test]
async fn the_lamp_end_to_end() {
    let mut vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel
        .pair(&lamp.device(), &["set_light", "read_light"])
        .await;
    vessel.connect(&lamp.device());
    let ctx = CallContext {
        agent_id: Some("main"),
        session_id: Some("s1"),
        ..CallContext::default()
    };

    let set = vessel
        .adapter
        .execute(SET, json!({"on": true, "brightness": 40}), ctx)
        .await;
    assert_eq!(
        serde_json::to_value(&set).unwrap(),
        json!({"ok": true, "result": {"on": true, "brightness": 40}})
    );
    // Brightness changes only when a number is given.
    let set = vessel.adapter.execute(SET, json!({"on": false}), ctx).await;
    assert_eq!(
        set.result_value(),
        Some(json!({"on": false, "brightness": 40}))
    );
    let read = vessel.adapter.execute(READ, json!({}), ctx).await;
    assert_eq!(
        read.result_value(),
        Some(json!({"on": false, "brightness": 40}))
    );

    assert_eq!(lamp.calls().len(), 3);
    let decisions = vessel.decisions.lock().unwrap().clone();
    assert_eq!(decisions.len(), 3);
    assert_eq!(
        decisions[0],
        json!({"tool": SET, "deviceId": "desk-lamp", "capability": "set_light", "allowed": true,
               "reason": "allowed", "agentId": "main", "sessionId": "s1", "rule": null})
    );
}

#[tokio::test]
async fn tool_list_follows_grants() {
    let vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel.pair(&lamp.device(), &[]).await;
    assert!(vessel.adapter.tool_definitions().is_empty());
    vessel.registry().grant("desk-lamp", "strobe").unwrap();
    vessel.registry().grant("desk-lamp", "read_light").unwrap();
    let names: Vec<String> = vessel
        .adapter
        .tool_definitions()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, [READ, STROBE]);
    vessel.registry().revoke("desk-lamp", "strobe").unwrap();
    let names: Vec<String> = vessel
        .adapter
        .tool_definitions()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, [READ]);
    vessel.registry().unpair("desk-lamp").unwrap();
    assert!(vessel.adapter.tool_definitions().is_empty());
}

#[tokio::test]
async fn grant_then_revoke() {
    let mut vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel.pair(&lamp.device(), &["read_light"]).await;
    vessel.connect(&lamp.device());
    let approver = yes();
    let ctx = CallContext {
        approver: Some(&approver),
        ..CallContext::default()
    };
    refused(
        &vessel.adapter.execute(STROBE, json!({}), ctx).await,
        "[8dk-deny] capability \"strobe\" on \"desk-lamp\" is not granted",
    );
    vessel.registry().grant("desk-lamp", "strobe").unwrap();
    let strobe = vessel.adapter.execute(STROBE, json!({}), ctx).await;
    assert_eq!(strobe.result_value(), Some(json!({"strobed": true})));
    vessel.registry().revoke("desk-lamp", "strobe").unwrap();
    refused(
        &vessel.adapter.execute(STROBE, json!({}), ctx).await,
        "[8dk-deny] capability \"strobe\" on \"desk-lamp\" is not granted",
    );
    assert_eq!(lamp.calls().len(), 1);
}

/// Holds every approval open until the test releases it, and keeps what it was asked.
struct Gate {
    asked: Arc<Notify>,
    release: Arc<Notify>,
    seen: Arc<Mutex<Vec<ApprovalRequest>>>,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            asked: Arc::new(Notify::new()),
            release: Arc::new(Notify::new()),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn approver(&self) -> impl Approver {
        let (asked, release, seen) = (
            Arc::clone(&self.asked),
            Arc::clone(&self.release),
            Arc::clone(&self.seen),
        );
        ApproverFn(move |request: ApprovalRequest| {
            let (asked, release, seen) =
                (Arc::clone(&asked), Arc::clone(&release), Arc::clone(&seen));
            async move {
                seen.lock().await.push(request);
                asked.notify_one();
                release.notified().await;
                Ok(true)
            }
        })
    }
}

/// Starts a strobe call, changes the registry while the person is being
/// asked, then says yes: the call must be refused with `expected`.
async fn change_during_approval(change: impl AsyncFnOnce(&Vessel, &Lamp), expected: &str) {
    let mut vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel.pair(&lamp.device(), &["strobe"]).await;
    vessel.connect(&lamp.device());
    let gate = Gate::new();
    let approver = gate.approver();
    let ctx = CallContext {
        approver: Some(&approver),
        ..CallContext::default()
    };
    let call = vessel.adapter.execute(STROBE, json!({}), ctx);
    let meddle = async {
        gate.asked.notified().await;
        change(&vessel, &lamp).await;
        gate.release.notify_one();
    };
    let (outcome, ()) = tokio::join!(call, meddle);
    refused(&outcome, expected);
    assert!(lamp.calls().is_empty(), "the device never saw the call");
    assert_eq!(gate.seen.lock().await.len(), 1);
}

#[tokio::test]
async fn revoke_unpair_and_pair_again_while_the_person_is_asked() {
    change_during_approval(
        async |v, _| v.registry().revoke("desk-lamp", "strobe").unwrap(),
        "[8dk-deny] capability \"strobe\" on \"desk-lamp\" was revoked before the call",
    )
    .await;
    change_during_approval(
        async |v, _| v.registry().unpair("desk-lamp").unwrap(),
        "[8dk-deny] device \"desk-lamp\" was unpaired or paired again before the call",
    )
    .await;
    change_during_approval(
        async |v, lamp| {
            v.pair(&lamp.device(), &["strobe"]).await;
        },
        "[8dk-deny] device \"desk-lamp\" was unpaired or paired again before the call",
    )
    .await;
}

#[tokio::test]
async fn rules_shadow_agents_and_confirm() {
    let rules = r#"
version: 1
policies:
  - name: no-lamp-at-night
    action: device_use
    condition: "deviceId equals desk-lamp and sessionId equals night"
    decision: block
    message: "the lamp sleeps at night"
  - name: ask-before-lamp-actions
    action: device_use
    condition: "deviceId equals desk-lamp and capabilityKind equals actuator"
    decision: require_approval
    message: "Lamp actions need a yes"
"#;
    let mut vessel = Vessel::new(rules);
    let lamp = Lamp::new();
    vessel
        .pair(&lamp.device(), &["set_light", "read_light", "strobe"])
        .await;
    vessel.connect(&lamp.device());
    let gate_free = yes();
    let ctx = CallContext {
        agent_id: Some("main"),
        approver: Some(&gate_free),
        ..CallContext::default()
    };

    let night = CallContext {
        session_id: Some("night"),
        ..ctx
    };
    refused(
        &vessel.adapter.execute(READ, json!({}), night).await,
        "[policy] [no-lamp-at-night] the lamp sleeps at night",
    );
    let shadow = CallContext {
        agent_id: Some("__shadow__"),
        ..ctx
    };
    let outcome = vessel.adapter.execute(READ, json!({}), shadow).await;
    assert!(
        outcome
            .reason()
            .unwrap()
            .starts_with("[policy] [shadow-deny] shadow/hedge candidate (scope __shadow__)")
    );

    let no_approver = CallContext {
        approver: None,
        ..ctx
    };
    refused(
        &vessel
            .adapter
            .execute(SET, json!({"on": true}), no_approver)
            .await,
        "[policy] [ask-before-lamp-actions] Lamp actions need a yes (no approver wired)",
    );
    let no = ApproverFn(|_| async { Ok(false) });
    refused(
        &vessel
            .adapter
            .execute(
                STROBE,
                json!({}),
                CallContext {
                    approver: Some(&no),
                    ..ctx
                },
            )
            .await,
        "[policy] the person said no: [ask-before-lamp-actions] Lamp actions need a yes",
    );
    assert!(
        vessel
            .adapter
            .execute(SET, json!({"on": true}), ctx)
            .await
            .is_ok()
    );
    assert!(vessel.adapter.execute(READ, json!({}), ctx).await.is_ok());
    assert_eq!(lamp.calls().len(), 2);

    let decisions = vessel.decisions.lock().unwrap().clone();
    let rules_named: Vec<Value> = decisions.iter().map(|d| d["rule"].clone()).collect();
    assert_eq!(
        rules_named,
        [
            json!("no-lamp-at-night"),
            Value::Null,
            json!("ask-before-lamp-actions"),
            json!("ask-before-lamp-actions"),
            json!("ask-before-lamp-actions"),
            Value::Null
        ]
    );
}

#[tokio::test]
async fn bad_input_never_reaches_the_person_or_the_device() {
    let mut vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel.pair(&lamp.device(), &["set_light", "strobe"]).await;
    vessel.connect(&lamp.device());
    let gate = Gate::new();
    let approver = gate.approver();
    let ctx = CallContext {
        approver: Some(&approver),
        ..CallContext::default()
    };
    for (tool, input, expected) in [
        (
            SET,
            json!({"on": "yes"}),
            "[8dk-deny] \"on\" must be boolean",
        ),
        (
            SET,
            json!({"brightness": 10}),
            "[8dk-deny] missing required \"on\"",
        ),
        (
            SET,
            json!({"on": true, "__proto__": {}}),
            "[8dk-deny] unknown param \"__proto__\"",
        ),
        (
            STROBE,
            json!({"rate": 10}),
            "[8dk-deny] unknown param \"rate\"",
        ),
        (STROBE, json!(null), "[8dk-deny] input must be an object"),
    ] {
        refused(&vessel.adapter.execute(tool, input, ctx).await, expected);
    }
    assert!(gate.seen.lock().await.is_empty());
    assert!(lamp.calls().is_empty());
}

/// A device with a broken bulb and a capability that never answers.
fn broken_lamp() -> Device {
    Device::define(&json!({
        "id": "broken-lamp", "name": "Broken lamp", "kind": "lamp", "version": "0.0.1",
        "capabilities": [
            {"name": "set_light", "kind": "actuator", "description": "Fails.", "params": {"on": {"type": "boolean"}}},
            {"name": "read_light", "kind": "sensor", "description": "Never answers."}
        ]
    }))
    .handler("set_light", |_| async { Err::<Value, _>(HandlerError::from("bulb is broken")) })
    .handler("read_light", |_| std::future::pending())
    .build()
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn device_errors_timeouts_and_absent_devices() {
    let mut vessel = Vessel::new(NO_RULES);
    let device = broken_lamp();
    vessel.pair(&device, &["set_light", "read_light"]).await;
    let ctx = CallContext {
        timeout: Some(Duration::from_millis(250)),
        ..CallContext::default()
    };
    refused(
        &vessel
            .adapter
            .execute("device__broken_lamp__set_light", json!({}), ctx)
            .await,
        "[8dk-deny] device \"broken-lamp\" is not connected",
    );
    vessel.connect(&device);
    refused(
        &vessel
            .adapter
            .execute("device__broken_lamp__set_light", json!({"on": true}), ctx)
            .await,
        "device error: bulb is broken",
    );
    refused(
        &vessel
            .adapter
            .execute("device__broken_lamp__read_light", json!({}), ctx)
            .await,
        "device error: device did not answer within 250ms",
    );
    let decisions = vessel.decisions.lock().unwrap().clone();
    let allowed: Vec<bool> = decisions
        .iter()
        .map(|d| d["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(
        allowed,
        [false, true, true],
        "device failures are recorded as allowed"
    );
}

#[tokio::test]
async fn a_lost_connection_fails_calls_and_later_calls_see_no_device() {
    let mut vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel.pair(&lamp.device(), &["read_light"]).await;
    let mut connection = vessel.connect(&lamp.device());
    assert!(
        vessel
            .adapter
            .execute(READ, json!({}), CallContext::default())
            .await
            .is_ok()
    );
    connection.drop_line();
    // Once the pump sees the line go, the link is removed.
    dk_testkit::eventually("the lamp's link removed", || {
        !vessel.adapter.links().is_connected("desk-lamp")
    })
    .await;
    refused(
        &vessel
            .adapter
            .execute(READ, json!({}), CallContext::default())
            .await,
        "[8dk-deny] device \"desk-lamp\" is not connected",
    );
}

#[tokio::test]
async fn a_registry_is_shared_safely_across_tasks() {
    // Many concurrent calls on a multi-task runtime each get exactly one answer and one decision.
    let mut vessel = Vessel::new(NO_RULES);
    let lamp = Lamp::new();
    vessel.pair(&lamp.device(), &["set_light"]).await;
    vessel.connect(&lamp.device());
    let vessel = Arc::new(vessel);
    let calls = (0..50).map(|i| {
        let vessel = Arc::clone(&vessel);
        async move {
            vessel
                .adapter
                .execute(
                    SET,
                    json!({"on": i % 2 == 0, "brightness": i}),
                    CallContext::default(),
                )
                .await
        }
    });
    let outcomes = futures::future::join_all(calls).await;
    assert!(outcomes.iter().all(ToolOutcome::is_ok));
    assert_eq!(lamp.calls().len(), 50);
    assert_eq!(vessel.decisions.lock().unwrap().len(), 50);
    let _: &DeviceRegistry = vessel.registry();
}
