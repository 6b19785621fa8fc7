//! Tests of the adapter: tool definitions, the seven checks and their reasons, decision records.

use std::sync::Mutex;
use std::time::Duration;

use dk_testkit::lamp;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::json;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::*;
use crate::link::{DeviceLink, InvokeResult};
use crate::registry::ConsentDecision;

/// A link that records what reached the device and answers with a fixed reply.
struct Recorder {
    calls: Mutex<Vec<(String, Value)>>,
    reply: InvokeResult,
}

impl DeviceLink for Recorder {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        self.calls
            .lock()
            .unwrap()
            .push((capability.to_owned(), Value::Object(input.clone())));
        let reply = self.reply.clone();
        async move { reply }.boxed()
    }
}

struct Fixture {
    adapter: DeviceToolAdapter,
    link: Arc<Recorder>,
    decisions: Arc<Mutex<Vec<String>>>,
}

async fn fixture(grants: &[&str], rules: &str, reply: InvokeResult) -> Fixture {
    let registry = Arc::new(DeviceRegistry::new());
    let decision = ConsentDecision::approve(grants.iter().copied());
    registry
        .pair(
            &lamp(),
            |_| {},
            |_| async move { Ok::<_, ()>(decision) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    let links = Arc::new(Links::new());
    let link = Arc::new(Recorder {
        calls: Mutex::new(vec![]),
        reply,
    });
    links.connect("desk-lamp", Arc::clone(&link) as Arc<dyn DeviceLink>);
    let decisions = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&decisions);
    let adapter = DeviceToolAdapter::new(registry, links)
        .with_policies(Arc::new(PolicySet::from_yaml_str(rules).unwrap()))
        .with_decision_hook(Arc::new(move |d: &DecisionRecord<'_>| {
            sink.lock().unwrap().push(serde_json::to_string(d).unwrap());
        }));
    Fixture {
        adapter,
        link,
        decisions,
    }
}

const NO_RULES: &str = "version: 1\npolicies: []\n";

fn ok_reply() -> InvokeResult {
    Ok(Some(
        RawValue::from_string(r#"{"on":true,"brightness":0}"#.to_owned()).unwrap(),
    ))
}

fn approver(answer: Result<bool, String>, seen: Arc<Mutex<Vec<ApprovalRequest>>>) -> impl Approver {
    ApproverFn(move |request: ApprovalRequest| {
        seen.lock().unwrap().push(request);
        let answer = answer.clone().map_err(ApprovalError::Unreachable);
        async move { answer }
    })
}

#[tokio::test]
async fn tool_definitions_have_the_v1_shape_and_only_granted_capabilities() {
    let f = fixture(&["set_light", "read_light"], NO_RULES, ok_reply()).await;
    let tools = serde_json::to_value(f.adapter.tool_definitions()).unwrap();
    assert_eq!(
        tools,
        json!([
            {"type":"function","function":{"name":"device__desk_lamp__read_light",
              "description":"[DEVICE Desk lamp (lamp) sensor] Read whether the lamp is on and its brightness (0-100).",
              "parameters":{"type":"object","properties":{},"required":[],"additionalProperties":false}}},
            {"type":"function","function":{"name":"device__desk_lamp__set_light",
              "description":"[DEVICE Desk lamp (lamp) actuator] Turn the lamp on or off and set its brightness.",
              "parameters":{"type":"object","properties":{"on":{"type":"boolean","description":"true for on"},
                "brightness":{"type":"number","description":"0-100"}},"required":["on"],"additionalProperties":false}}}
        ])
    );
    // Key order too: hosts compare the text.
    assert!(serde_json::to_string(&f.adapter.tool_definitions()[1]).unwrap().starts_with(
        r#"{"type":"function","function":{"name":"device__desk_lamp__set_light","description":"#
    ));
    let none = fixture(&[], NO_RULES, ok_reply()).await;
    assert!(none.adapter.tool_definitions().is_empty());
}

#[tokio::test]
async fn an_allowed_call_reaches_the_device_and_is_recorded() {
    let f = fixture(&["set_light"], NO_RULES, ok_reply()).await;
    let ctx = CallContext {
        agent_id: Some("main"),
        session_id: Some("s1"),
        ..CallContext::default()
    };
    let outcome = f
        .adapter
        .execute("device__desk_lamp__set_light", json!({"on": true}), ctx)
        .await;
    assert_eq!(
        serde_json::to_string(&outcome).unwrap(),
        r#"{"ok":true,"result":{"on":true,"brightness":0}}"#
    );
    assert_eq!(
        *f.link.calls.lock().unwrap(),
        [("set_light".to_owned(), json!({"on": true}))]
    );
    assert_eq!(
        *f.decisions.lock().unwrap(),
        [
            r#"{"tool":"device__desk_lamp__set_light","deviceId":"desk-lamp","capability":"set_light","allowed":true,"reason":"allowed","agentId":"main","sessionId":"s1","rule":null}"#
        ]
    );
}

#[track_caller]
fn check_refused(outcome: &ToolOutcome, expected: &str) {
    assert_eq!(outcome.reason(), Some(expected));
}

#[tokio::test]
async fn refusals_before_anyone_is_asked() {
    let rules = "version: 1\npolicies:\n  - name: no-strobe-for-guests\n    action: device_use\n    condition: \"capability equals read_light and agentId equals guest\"\n    decision: block\n    message: guests may not read\n";
    let f = fixture(&["set_light", "read_light"], rules, ok_reply()).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let yes = approver(Ok(true), Arc::clone(&seen));
    let ctx = CallContext {
        approver: Some(&yes),
        ..CallContext::default()
    };
    let guest = CallContext {
        agent_id: Some("guest"),
        ..ctx
    };
    let shadow = CallContext {
        agent_id: Some("__shadow__"),
        ..ctx
    };
    let cases: Vec<(&str, Value, CallContext<'_>, &str)> = vec![
        (
            "set_light",
            json!({"on": true}),
            ctx,
            "[8dk-deny] \"set_light\" is not a device tool",
        ),
        (
            "device__desk_lamp__",
            json!({}),
            ctx,
            "[8dk-deny] \"device__desk_lamp__\" is not a device tool",
        ),
        (
            "device__hall_lamp__set_light",
            json!({"on": true}),
            ctx,
            "[8dk-deny] device \"hall-lamp\" is not paired",
        ),
        (
            "device__desk_lamp__fly",
            json!({}),
            ctx,
            "[8dk-deny] device \"desk-lamp\" has no capability \"fly\"",
        ),
        (
            "device__desk_lamp__strobe",
            json!({}),
            ctx,
            "[8dk-deny] capability \"strobe\" on \"desk-lamp\" is not granted",
        ),
        // Policy comes before input checks.
        (
            "device__desk_lamp__read_light",
            json!({"bogus": 1}),
            guest,
            "[policy] [no-strobe-for-guests] guests may not read",
        ),
        (
            "device__desk_lamp__set_light",
            json!("on"),
            shadow,
            "[policy] [shadow-deny] shadow/hedge candidate (scope __shadow__) attempted side-effecting action \"device_use\". Shadow candidates run text/plan-only; only the chosen winner re-executes side effects under the normal policy path.",
        ),
        (
            "device__desk_lamp__set_light",
            json!([]),
            ctx,
            "[8dk-deny] input must be an object",
        ),
        (
            "device__desk_lamp__set_light",
            json!({"on": "yes"}),
            ctx,
            "[8dk-deny] \"on\" must be boolean",
        ),
        (
            "device__desk_lamp__set_light",
            json!({}),
            ctx,
            "[8dk-deny] missing required \"on\"",
        ),
        (
            "device__desk_lamp__set_light",
            json!({"on": true, "colour": "red"}),
            ctx,
            "[8dk-deny] unknown param \"colour\"",
        ),
    ];
    let count = cases.len();
    for (tool, input, ctx, expected) in cases {
        check_refused(&f.adapter.execute(tool, input, ctx).await, expected);
    }
    assert!(
        f.link.calls.lock().unwrap().is_empty(),
        "nothing reached the device"
    );
    assert!(seen.lock().unwrap().is_empty(), "nobody was asked");
    let decisions = f.decisions.lock().unwrap();
    assert_eq!(decisions.len(), count, "one decision per call");
    assert!(decisions.iter().all(|d| d.contains(r#""allowed":false"#)));
    assert!(decisions[0].contains(r#""deviceId":null"#));
    assert!(decisions[5].contains(r#""rule":"no-strobe-for-guests""#));
    assert!(decisions[6].contains(r#""rule":null"#));
}

#[tokio::test]
async fn approvals() {
    let rules = "version: 1\npolicies:\n  - name: ask-actuators\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: require_approval\n    message: Lamp actions need a yes\n";
    let f = fixture(&["set_light", "strobe", "read_light"], rules, ok_reply()).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let yes = approver(Ok(true), Arc::clone(&seen));
    let no = approver(Ok(false), Arc::clone(&seen));
    let broken = approver(Err("prompt crashed".into()), Arc::clone(&seen));
    let with = |a: &'static str| a;
    let _ = with;

    let ctx = CallContext {
        approver: Some(&yes),
        ..CallContext::default()
    };
    let outcome = f
        .adapter
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": true, "brightness": 30}),
            ctx,
        )
        .await;
    assert!(outcome.is_ok());
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            serde_json::to_value(&seen[0]).unwrap(),
            json!({"tool":"device__desk_lamp__set_light","deviceId":"desk-lamp","capability":"set_light",
                   "input":{"on":true,"brightness":30},"reason":"[ask-actuators] Lamp actions need a yes","channel":"v1"})
        );
    }
    // A rule asks once; a confirm capability is not asked a second time.
    f.adapter
        .execute("device__desk_lamp__strobe", json!({}), ctx)
        .await;
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(
        seen.lock().unwrap()[1].reason,
        "[ask-actuators] Lamp actions need a yes"
    );
    // Sensors are not asked.
    f.adapter
        .execute("device__desk_lamp__read_light", json!({}), ctx)
        .await;
    assert_eq!(seen.lock().unwrap().len(), 2);

    let refusals = [
        (
            CallContext::default(),
            "[policy] [ask-actuators] Lamp actions need a yes (no approver wired)",
        ),
        (
            CallContext {
                approver: Some(&no),
                ..ctx
            },
            "[policy] the person said no: [ask-actuators] Lamp actions need a yes",
        ),
        (
            CallContext {
                approver: Some(&broken),
                ..ctx
            },
            "[policy] the person was not asked (prompt crashed): [ask-actuators] Lamp actions need a yes",
        ),
    ];
    for (ctx, expected) in refusals {
        check_refused(
            &f.adapter
                .execute("device__desk_lamp__set_light", json!({"on": false}), ctx)
                .await,
            expected,
        );
    }
    assert_eq!(f.link.calls.lock().unwrap().len(), 3);
    assert!(f.decisions.lock().unwrap()[3].contains(r#""rule":"ask-actuators""#));
}

#[tokio::test]
async fn confirm_capabilities_ask_every_time() {
    let f = fixture(&["strobe"], NO_RULES, ok_reply()).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let no = approver(Ok(false), Arc::clone(&seen));
    let ctx = CallContext {
        approver: Some(&no),
        ..CallContext::default()
    };
    check_refused(
        &f.adapter
            .execute("device__desk_lamp__strobe", json!({}), ctx)
            .await,
        "[policy] the person said no: \"strobe\" on Desk lamp asks every time",
    );
    check_refused(
        &f.adapter
            .execute(
                "device__desk_lamp__strobe",
                json!({}),
                CallContext::default(),
            )
            .await,
        "[policy] \"strobe\" on Desk lamp asks every time (no approver wired)",
    );
}

/// An approver that changes the registry while the person "thinks".
async fn during_approval(change: impl Fn(&DeviceRegistry) + Send + Sync + 'static, expected: &str) {
    let f = fixture(&["strobe", "set_light"], NO_RULES, ok_reply()).await;
    let registry = Arc::clone(f.adapter.registry());
    let change = Arc::new(change);
    let approver = ApproverFn(move |_request: ApprovalRequest| {
        change(&registry);
        async { Ok(true) }
    });
    let ctx = CallContext {
        approver: Some(&approver),
        ..CallContext::default()
    };
    check_refused(
        &f.adapter
            .execute("device__desk_lamp__strobe", json!({}), ctx)
            .await,
        expected,
    );
    assert!(f.link.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn state_is_read_again_after_the_wait() {
    during_approval(
        |r| r.revoke("desk-lamp", "strobe").unwrap(),
        "[8dk-deny] capability \"strobe\" on \"desk-lamp\" was revoked before the call",
    )
    .await;
    during_approval(
        |r| r.unpair("desk-lamp").unwrap(),
        "[8dk-deny] device \"desk-lamp\" was unpaired or paired again before the call",
    )
    .await;
    during_approval(
        |r| {
            let manifest = lamp();
            let pairing = r.pair(
                &manifest,
                |_| {},
                |_| async { Ok::<_, ()>(ConsentDecision::approve(["strobe"])) },
                Duration::from_secs(1),
            );
            futures::executor::block_on(pairing).unwrap();
        },
        "[8dk-deny] device \"desk-lamp\" was unpaired or paired again before the call",
    )
    .await;
}

#[tokio::test]
async fn link_failures() {
    let f = fixture(
        &["set_light"],
        NO_RULES,
        Err(dk_proto::InvokeError::Device("bulb broken".into())),
    )
    .await;
    let outcome = f
        .adapter
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": true}),
            CallContext::default(),
        )
        .await;
    check_refused(&outcome, "device error: bulb broken");
    assert!(
        f.decisions.lock().unwrap()[0]
            .contains(r#""allowed":true,"reason":"device error: bulb broken""#)
    );

    let f = fixture(&["set_light"], NO_RULES, ok_reply()).await;
    let link: Arc<dyn DeviceLink> = f.adapter.links().get("desk-lamp").unwrap();
    f.adapter.links().disconnect("desk-lamp", &link);
    let outcome = f
        .adapter
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": true}),
            CallContext::default(),
        )
        .await;
    check_refused(&outcome, "[8dk-deny] device \"desk-lamp\" is not connected");
    assert!(f.decisions.lock().unwrap()[0].contains(r#""allowed":false"#));
}

// ------------------------------------------------------------- run budgets

/// A clock the test moves by hand, in milliseconds.
fn hand_clock() -> (Arc<std::sync::atomic::AtomicU64>, RunClock) {
    let now = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let read = Arc::clone(&now);
    (
        now,
        Arc::new(move || read.load(std::sync::atomic::Ordering::SeqCst)),
    )
}

fn set_time(clock: &std::sync::atomic::AtomicU64, ms: u64) {
    clock.store(ms, std::sync::atomic::Ordering::SeqCst);
}

fn tool_calls(max: u64) -> AgentRunLimits {
    AgentRunLimits {
        agent_level: RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, max),
        ..AgentRunLimits::default()
    }
}

/// The lamp fixture with `limits` charged, on a hand clock, no rate limits.
async fn budgeted(limits: AgentRunLimits) -> (Fixture, Arc<std::sync::atomic::AtomicU64>) {
    let f = fixture(&["set_light", "read_light"], NO_RULES, ok_reply()).await;
    let (now, clock) = hand_clock();
    let adapter = f.adapter.with_run_limits(limits).with_run_clock(clock);
    (Fixture { adapter, ..f }, now)
}

/// `set_light` as `agent`, in `run` (if any).
async fn call_in(f: &Fixture, agent: Option<&str>, run: Option<RunRef<'_>>) -> ToolOutcome {
    let ctx = CallContext {
        agent_id: agent,
        session_id: Some("s1"),
        run,
        ..CallContext::default()
    };
    f.adapter
        .execute("device__desk_lamp__set_light", json!({"on": true}), ctx)
        .await
}

async fn call_as(f: &Fixture, agent: Option<&str>, run: Option<&str>) -> ToolOutcome {
    call_in(f, agent, run.map(RunRef::new)).await
}

const SPENT_3: &str =
    "[8dk-deny] run limit maxToolCalls of 3 exceeded: the budget of run \"r1\" is spent";

#[tokio::test]
async fn the_budget_is_breached_one_past_the_limit_and_stays_breached() {
    let (f, _) = budgeted(tool_calls(3)).await;
    for _ in 0..3 {
        assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    }
    check_refused(&call_as(&f, Some("main"), Some("r1")).await, SPENT_3);
    check_refused(&call_as(&f, Some("main"), Some("r1")).await, SPENT_3);
    // The device saw exactly the three calls within budget.
    assert_eq!(f.link.calls.lock().unwrap().len(), 3);
    // Each refusal is one decision record, with the reason the agent saw.
    let decisions = f.decisions.lock().unwrap();
    assert_eq!(decisions.len(), 5);
    let refused: Value = serde_json::from_str(&decisions[3]).unwrap();
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["reason"], SPENT_3);
    assert_eq!(refused["agentId"], "main");
    assert_eq!(refused["sessionId"], "s1");
}

#[tokio::test]
async fn each_run_has_its_own_budget_and_a_call_without_a_run_is_charged_to_none() {
    let (f, _) = budgeted(tool_calls(1)).await;
    assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    assert!(!call_as(&f, Some("main"), Some("r1")).await.is_ok());
    // Another run of the same agent and the same run id of another agent:
    // each its own budget.
    assert!(call_as(&f, Some("main"), Some("r2")).await.is_ok());
    assert!(call_as(&f, Some("other"), Some("r1")).await.is_ok());
    assert!(!call_as(&f, Some("main"), Some("r2")).await.is_ok());
    assert_eq!(f.adapter.tracked_runs(), 3);
    // Calls that name no run are charged to none: far past any budget, the
    // 33rd and the 100th go through like the first.
    for _ in 0..100 {
        assert!(call_as(&f, Some("main"), None).await.is_ok());
    }
    assert_eq!(f.adapter.tracked_runs(), 3);
    // A run named by a call without an agent is charged all the same.
    assert!(call_as(&f, None, Some("host-run")).await.is_ok());
    assert!(!call_as(&f, None, Some("host-run")).await.is_ok());
    // Without run limits no run is charged at all.
    let plain = fixture(&["set_light"], NO_RULES, ok_reply()).await;
    for _ in 0..40 {
        assert!(call_as(&plain, Some("main"), Some("r1")).await.is_ok());
    }
}

#[tokio::test]
async fn wall_time_is_breached_one_millisecond_past_the_limit() {
    let limits = AgentRunLimits {
        agent_level: RunLimitsLayer::new().with(dk_policy::RunLimit::MaxWallTimeMs, 1000),
        ..AgentRunLimits::default()
    };
    let (f, now) = budgeted(limits).await;
    set_time(&now, 5_000);
    assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    set_time(&now, 6_000);
    assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    set_time(&now, 6_001);
    check_refused(
        &call_as(&f, Some("main"), Some("r1")).await,
        "[8dk-deny] run limit maxWallTimeMs of 1000 exceeded: the budget of run \"r1\" is spent",
    );
    // A run that starts now has its own clock.
    assert!(call_as(&f, Some("main"), Some("r2")).await.is_ok());
    assert_eq!(f.link.calls.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn only_calls_past_the_first_checks_are_charged_and_nobody_is_asked_over_budget() {
    let (f, _) = budgeted(tool_calls(1)).await;
    let f = Fixture {
        adapter: f.adapter.with_rate_limits(AgentRateLimits {
            overall: Some(rate(60, 1)),
            per_device: None,
            ..AgentRateLimits::default()
        }),
        ..f
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let yes = approver(Ok(true), Arc::clone(&seen));
    let ctx = CallContext {
        agent_id: Some("main"),
        approver: Some(&yes),
        run: Some(RunRef::new("r1")),
        ..CallContext::default()
    };
    // Refused at checks 1 to 4: nothing charged, to the run or the rate.
    for (tool, input) in [
        ("device__desk_lamp__nope", json!({})),
        ("device__desk_lamp__set_light", json!({"on": "yes"})),
    ] {
        let outcome = f.adapter.execute(tool, input, ctx).await;
        assert!(outcome.reason().unwrap().starts_with("[8dk-deny] "));
    }
    assert_eq!(f.adapter.tracked_runs(), 0);
    assert_eq!(f.adapter.tracked_rate_buckets(), 0);
    assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    assert!(call_as(&f, None, Some("r1")).await.is_ok());
    // A rule now asks the person about the lamp: over the rate (the agent
    // "main") or over budget (the run "r1" of calls without an agent), they
    // are never asked.
    let rules = "version: 1\npolicies:\n  - name: ask\n    action: device_use\n    condition: \"capability equals set_light\"\n    decision: require_approval\n    message: lamp needs a yes\n";
    f.adapter
        .set_policies(Arc::new(PolicySet::from_yaml_str(rules).unwrap()));
    for (agent, expected) in [
        (
            Some("main"),
            "[8dk-deny] rate limit: this agent's device calls are limited to 60 a minute, in bursts of 1; calls are allowed again in 1000 ms",
        ),
        (
            None,
            "[8dk-deny] run limit maxToolCalls of 1 exceeded: the budget of run \"r1\" is spent",
        ),
    ] {
        let ctx = CallContext {
            agent_id: agent,
            ..ctx
        };
        let outcome = f
            .adapter
            .execute("device__desk_lamp__set_light", json!({"on": true}), ctx)
            .await;
        check_refused(&outcome, expected);
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_run_level_layer_only_narrows_the_agent_level() {
    let mut limits = tool_calls(3);
    limits.per_agent.insert(
        "bulk".to_owned(),
        RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, 5),
    );
    let (f, _) = budgeted(limits).await;
    let calls = |n| RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, n);
    let max = |budget: Option<RunLimits>| budget.unwrap().get(dk_policy::RunLimit::MaxToolCalls);
    assert_eq!(
        max(f.adapter.start_run(Some("main"), "a", &calls(1)).unwrap()),
        1
    );
    assert_eq!(
        max(f.adapter.start_run(Some("main"), "b", &calls(200)).unwrap()),
        3
    );
    assert_eq!(
        max(f.adapter.start_run(Some("bulk"), "c", &calls(200)).unwrap()),
        5
    );
    assert!(call_as(&f, Some("main"), Some("a")).await.is_ok());
    assert!(!call_as(&f, Some("main"), Some("a")).await.is_ok());
    for _ in 0..3 {
        assert!(call_as(&f, Some("main"), Some("b")).await.is_ok());
    }
    assert!(!call_as(&f, Some("main"), Some("b")).await.is_ok());
    // A call's own layer narrows its run from that call on, keeping the
    // count; a wider one changes nothing.
    let run = |n| Some(RunRef::new("d").with_limits(calls(n)));
    assert!(call_in(&f, Some("main"), run(200)).await.is_ok());
    assert!(call_in(&f, Some("main"), run(2)).await.is_ok());
    check_refused(
        &call_in(&f, Some("main"), run(200)).await,
        "[8dk-deny] run limit maxToolCalls of 2 exceeded: the budget of run \"d\" is spent",
    );
    // Narrowed below what a run has already made, it is spent at once.
    for _ in 0..3 {
        assert!(call_as(&f, Some("main"), Some("e")).await.is_ok());
    }
    check_refused(
        &call_in(
            &f,
            Some("main"),
            Some(RunRef::new("e").with_limits(calls(1))),
        )
        .await,
        "[8dk-deny] run limit maxToolCalls of 1 exceeded: the budget of run \"e\" is spent",
    );
    // Starting a run again starts it afresh.
    f.adapter.start_run(Some("main"), "a", &calls(1)).unwrap();
    assert!(call_as(&f, Some("main"), Some("a")).await.is_ok());
    // A layer out of range is refused, at start and in the configuration.
    let zero = calls(0);
    assert!(f.adapter.start_run(Some("main"), "f", &zero).is_err());
    let bad = AgentRunLimits {
        agent_level: zero,
        ..AgentRunLimits::default()
    };
    assert!(bad.check().is_err());
    assert!(AgentRunLimits::default().check().is_ok());
    let (f, _) = budgeted(bad).await;
    let outcome = call_as(&f, Some("main"), Some("r1")).await;
    assert!(
        outcome
            .reason()
            .unwrap()
            .starts_with("[8dk-deny] the run budget is misconfigured: "),
        "{outcome:?}"
    );
    assert!(f.link.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn idle_runs_are_forgotten_and_the_count_stays_bounded() {
    let limits = AgentRunLimits {
        max_tracked_runs: 16,
        idle_expiry: Duration::from_secs(60),
        ..tool_calls(1)
    };
    let (f, now) = budgeted(limits).await;
    for i in 0..200 {
        set_time(&now, i);
        assert!(
            call_as(&f, Some("main"), Some(&format!("r{i}")))
                .await
                .is_ok()
        );
        assert!(f.adapter.tracked_runs() <= 16);
    }
    // The most recent run is still tracked, and still spent.
    assert!(!call_as(&f, Some("main"), Some("r199")).await.is_ok());
    // Idle past the expiry, a call naming the run starts it afresh.
    set_time(&now, 199 + 60_000);
    assert!(call_as(&f, Some("main"), Some("r199")).await.is_ok());
    assert_eq!(f.adapter.tracked_runs(), 1);
    // By default a run is kept as long as its longest possible wall time.
    assert_eq!(
        AgentRunLimits::default().idle_expiry,
        Duration::from_millis(dk_policy::RunLimit::MaxWallTimeMs.hard_cap())
    );
}

// ------------------------------------------------------------- rate limits

fn rate(calls_per_minute: u32, burst: u32) -> RateLimit {
    RateLimit {
        calls_per_minute: std::num::NonZeroU32::new(calls_per_minute).unwrap(),
        burst: std::num::NonZeroU32::new(burst).unwrap(),
    }
}

/// The lamp fixture with `limits` charged, on a hand clock, no run limits.
async fn rated(limits: AgentRateLimits) -> (Fixture, Arc<std::sync::atomic::AtomicU64>) {
    let f = fixture(&["set_light", "read_light"], NO_RULES, ok_reply()).await;
    let (now, clock) = hand_clock();
    let adapter = f.adapter.with_rate_limits(limits).with_run_clock(clock);
    (Fixture { adapter, ..f }, now)
}

/// Pairs and connects the hall thermostat beside the lamp, every capability
/// granted.
async fn add_thermostat(f: &Fixture) {
    let manifest: Value = serde_json::from_str(include_str!(
        "../../../../fixtures/manifests/valid/hall-thermostat.json"
    ))
    .unwrap();
    let decision = ConsentDecision::approve(["read_temperature", "set_target"]);
    f.adapter
        .registry()
        .pair(
            &manifest,
            |_| {},
            |_| async move { Ok::<_, ()>(decision) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    f.adapter.links().connect(
        "hall-thermostat",
        Arc::new(Recorder {
            calls: Mutex::new(vec![]),
            reply: ok_reply(),
        }),
    );
}

async fn read_thermostat(f: &Fixture, agent: &str) -> ToolOutcome {
    let ctx = CallContext {
        agent_id: Some(agent),
        ..CallContext::default()
    };
    f.adapter
        .execute("device__hall_thermostat__read_temperature", json!({}), ctx)
        .await
}

#[tokio::test]
async fn a_steady_agent_never_meets_the_default_rate() {
    let (f, now) = rated(AgentRateLimits::default()).await;
    add_thermostat(&f).await;
    // A thermostat read every second for three hours, its timing off by up
    // to a fifth of a second either way, and the lamp every 30 s: 10,800
    // and 360 calls, none refused.
    let mut refused = 0;
    for second in 0..10_800_u64 {
        let jitter = [0, 200, 400, 100, 300][(second % 5) as usize];
        set_time(&now, second * 1000 + jitter);
        refused += usize::from(!read_thermostat(&f, "main").await.is_ok());
        if second % 30 == 0 {
            refused += usize::from(!call_as(&f, Some("main"), None).await.is_ok());
        }
    }
    assert_eq!(refused, 0);
}

#[tokio::test]
async fn a_loop_is_refused_once_its_burst_is_spent_and_told_when_to_come_back() {
    let (f, now) = rated(AgentRateLimits::default()).await;
    set_time(&now, 1_000_000);
    // As fast as it can: the clock does not move between calls.
    for _ in 0..20 {
        assert!(call_as(&f, Some("main"), None).await.is_ok());
    }
    let refusal = "[8dk-deny] rate limit: this agent's calls to device \"desk-lamp\" are limited to 120 a minute, in bursts of 20; calls to it are allowed again in 500 ms";
    check_refused(&call_as(&f, Some("main"), None).await, refusal);
    check_refused(&call_as(&f, Some("main"), None).await, refusal);
    set_time(&now, 1_000_499);
    check_refused(
        &call_as(&f, Some("main"), None).await,
        "[8dk-deny] rate limit: this agent's calls to device \"desk-lamp\" are limited to 120 a minute, in bursts of 20; calls to it are allowed again in 1 ms",
    );
    // At the time it was told, exactly one call more.
    set_time(&now, 1_000_500);
    assert!(call_as(&f, Some("main"), None).await.is_ok());
    check_refused(&call_as(&f, Some("main"), None).await, refusal);
    // The device saw only the calls allowed; each refusal is one record.
    assert_eq!(f.link.calls.lock().unwrap().len(), 21);
    let decisions = f.decisions.lock().unwrap().clone();
    assert_eq!(decisions.len(), 25);
    let refused: Value = serde_json::from_str(&decisions[20]).unwrap();
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["reason"], refusal);
    assert_eq!(refused["agentId"], "main");
    // Another agent has buckets of its own.
    assert!(call_as(&f, Some("other"), None).await.is_ok());
}

#[tokio::test]
async fn the_overall_rate_spans_devices_and_a_refusal_takes_from_neither_bucket() {
    let (f, now) = rated(AgentRateLimits {
        overall: Some(rate(30, 3)),
        per_device: Some(rate(60, 2)),
        ..AgentRateLimits::default()
    })
    .await;
    add_thermostat(&f).await;
    let lamp_empty = "[8dk-deny] rate limit: this agent's calls to device \"desk-lamp\" are limited to 60 a minute, in bursts of 2; calls to it are allowed again in 1000 ms";
    let overall_empty = |wait: u64| {
        format!(
            "[8dk-deny] rate limit: this agent's device calls are limited to 30 a minute, in bursts of 3; calls are allowed again in {wait} ms"
        )
    };
    assert!(call_as(&f, Some("main"), None).await.is_ok());
    assert!(call_as(&f, Some("main"), None).await.is_ok());
    // The lamp's bucket is empty; the refusal takes nothing from the
    // agent's overall bucket, so the thermostat still gets its call.
    check_refused(&call_as(&f, Some("main"), None).await, lamp_empty);
    assert!(read_thermostat(&f, "main").await.is_ok());
    // Now both buckets are empty: the one that waits longest is named.
    check_refused(&call_as(&f, Some("main"), None).await, &overall_empty(2000));
    check_refused(&read_thermostat(&f, "main").await, &overall_empty(2000));
    set_time(&now, 1000);
    check_refused(&call_as(&f, Some("main"), None).await, &overall_empty(1000));
    set_time(&now, 2000);
    assert!(read_thermostat(&f, "main").await.is_ok());
    // No limit at all for a bucket that is off.
    let (f, _) = rated(AgentRateLimits {
        overall: None,
        per_device: None,
        ..AgentRateLimits::default()
    })
    .await;
    for _ in 0..100 {
        assert!(call_as(&f, Some("main"), None).await.is_ok());
    }
    assert_eq!(f.adapter.tracked_rate_buckets(), 0);
}

#[tokio::test]
async fn a_call_refused_for_its_rate_is_not_charged_to_its_run() {
    let f = fixture(&["set_light"], NO_RULES, ok_reply()).await;
    let (now, clock) = hand_clock();
    let f = Fixture {
        adapter: f
            .adapter
            .with_rate_limits(AgentRateLimits {
                overall: Some(rate(60, 2)),
                per_device: None,
                ..AgentRateLimits::default()
            })
            .with_run_limits(tool_calls(3))
            .with_run_clock(clock),
        ..f
    };
    for _ in 0..2 {
        assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    }
    for _ in 0..5 {
        let outcome = call_as(&f, Some("main"), Some("r1")).await;
        assert!(
            outcome.reason().unwrap().contains("rate limit"),
            "{outcome:?}"
        );
    }
    set_time(&now, 60_000);
    assert!(call_as(&f, Some("main"), Some("r1")).await.is_ok());
    check_refused(&call_as(&f, Some("main"), Some("r1")).await, SPENT_3);
}

#[tokio::test]
async fn calls_without_an_agent_are_not_rate_limited() {
    let (f, _) = rated(AgentRateLimits {
        overall: Some(rate(1, 1)),
        per_device: Some(rate(1, 1)),
        ..AgentRateLimits::default()
    })
    .await;
    for _ in 0..50 {
        assert!(call_as(&f, None, None).await.is_ok());
    }
    assert_eq!(f.adapter.tracked_rate_buckets(), 0);
    assert!(call_as(&f, Some("main"), None).await.is_ok());
    assert!(!call_as(&f, Some("main"), None).await.is_ok());
}

#[tokio::test]
async fn full_buckets_are_forgotten_and_the_count_stays_bounded() {
    let (f, now) = rated(AgentRateLimits {
        max_tracked: 16,
        ..AgentRateLimits::default()
    })
    .await;
    // 200 agents, one call each: two buckets each, never more than 16 kept.
    for i in 0..200 {
        set_time(&now, i);
        assert!(call_as(&f, Some(&format!("agent-{i}")), None).await.is_ok());
        assert!(f.adapter.tracked_rate_buckets() <= 16);
    }
    // An agent kept refused is the last to be dropped: it stays refused
    // while others come and go.
    for _ in 0..20 {
        assert!(call_as(&f, Some("loop"), None).await.is_ok());
    }
    for i in 200..400 {
        set_time(&now, i);
        assert!(!call_as(&f, Some("loop"), None).await.is_ok());
        assert!(call_as(&f, Some(&format!("agent-{i}")), None).await.is_ok());
        assert!(f.adapter.tracked_rate_buckets() <= 16);
    }
    // Once every bucket is full again, none is kept.
    set_time(&now, 400 + 60_000);
    assert!(call_as(&f, Some("last"), None).await.is_ok());
    assert_eq!(f.adapter.tracked_rate_buckets(), 2);
}

#[tokio::test]
async fn input_that_breaks_a_declared_schema_is_refused_before_the_person_is_asked() {
    let registry = Arc::new(DeviceRegistry::new());
    let manifest = json!({
        "dk": 1, "id": "files", "name": "Files", "kind": "mcp-server", "version": "1",
        "capabilities": [{
            "name": "write_file", "kind": "actuator", "confirm": true,
            "description": "Write a file.",
            "inputSchema": {
                "type": "object",
                "properties": {"path": {"type": "string", "pattern": "^/srv/"}, "content": {"type": "string"}},
                "required": ["path", "content"],
                "additionalProperties": false,
            },
        }],
    });
    registry
        .pair(
            &manifest,
            |_| {},
            |_| async move { Ok::<_, ()>(ConsentDecision::approve(["write_file"])) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    let links = Arc::new(Links::new());
    let link = Arc::new(Recorder {
        calls: Mutex::new(vec![]),
        reply: ok_reply(),
    });
    links.connect("files", Arc::clone(&link) as Arc<dyn DeviceLink>);
    let adapter = DeviceToolAdapter::new(registry, links)
        .with_policies(Arc::new(PolicySet::from_yaml_str(NO_RULES).unwrap()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let yes = approver(Ok(true), Arc::clone(&seen));
    let call = |input: Value| {
        let ctx = CallContext {
            approver: Some(&yes),
            ..CallContext::default()
        };
        adapter.execute("device__files__write_file", input, ctx)
    };
    check_refused(
        &call(json!({"path": "/etc/passwd", "content": "x"})).await,
        "[8dk-deny] input does not match the capability's inputSchema: at /path: value does not match \"^/srv/\"",
    );
    let missing = call(json!({"path": "/srv/a"})).await;
    let ToolOutcome::Refused { reason } = &missing else {
        panic!("{missing:?}");
    };
    assert!(
        reason.contains("\"content\" is a required property"),
        "{reason}"
    );
    assert!(seen.lock().unwrap().is_empty(), "the person was asked");
    assert!(
        link.calls.lock().unwrap().is_empty(),
        "the device was reached"
    );
    let ok = call(json!({"path": "/srv/a", "content": "x"})).await;
    assert!(matches!(ok, ToolOutcome::Ok { .. }), "{ok:?}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(link.calls.lock().unwrap().len(), 1);
}
