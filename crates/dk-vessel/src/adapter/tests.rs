//! Tests of the adapter: tool definitions, the seven checks and their reasons, decision records.

use std::sync::Mutex;
use std::time::Duration;

use futures::FutureExt;
use serde_json::json;

use super::*;
use crate::link::{DeviceLink, InvokeResult};
use crate::registry::ConsentDecision;

fn lamp() -> Value {
    serde_json::from_str(include_str!(
        "../../../../fixtures/manifests/valid/desk-lamp.json"
    ))
    .unwrap()
}

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
        let answer = answer.clone();
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
                   "input":{"on":true,"brightness":30},"reason":"[ask-actuators] Lamp actions need a yes"})
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
    let f = fixture(&["set_light"], NO_RULES, Err("bulb broken".into())).await;
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

/// The lamp fixture with `limits` charged, on a hand clock.
async fn budgeted(limits: AgentRunLimits) -> (Fixture, Arc<std::sync::atomic::AtomicU64>) {
    let f = fixture(&["set_light", "read_light"], NO_RULES, ok_reply()).await;
    let (now, clock) = hand_clock();
    let adapter = f.adapter.with_run_limits(limits).with_run_clock(clock);
    (Fixture { adapter, ..f }, now)
}

async fn call_as(f: &Fixture, agent: Option<&str>, session: Option<&str>) -> ToolOutcome {
    let ctx = CallContext {
        agent_id: agent,
        session_id: session,
        ..CallContext::default()
    };
    f.adapter
        .execute("device__desk_lamp__set_light", json!({"on": true}), ctx)
        .await
}

const SPENT_3: &str =
    "[8dk-deny] run limit maxToolCalls of 3 exceeded: this session's run budget is spent";

#[tokio::test]
async fn the_budget_is_breached_one_past_the_limit_and_stays_breached() {
    let (f, _) = budgeted(tool_calls(3)).await;
    for _ in 0..3 {
        assert!(call_as(&f, Some("main"), Some("s1")).await.is_ok());
    }
    check_refused(&call_as(&f, Some("main"), Some("s1")).await, SPENT_3);
    check_refused(&call_as(&f, Some("main"), Some("s1")).await, SPENT_3);
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
async fn each_session_has_its_own_budget() {
    let (f, _) = budgeted(tool_calls(1)).await;
    assert!(call_as(&f, Some("main"), Some("s1")).await.is_ok());
    assert!(!call_as(&f, Some("main"), Some("s1")).await.is_ok());
    // Another session of the same agent, the same session name of another
    // agent, and the agent's calls without a session: each its own run.
    assert!(call_as(&f, Some("main"), Some("s2")).await.is_ok());
    assert!(call_as(&f, Some("other"), Some("s1")).await.is_ok());
    assert!(call_as(&f, Some("main"), None).await.is_ok());
    assert!(!call_as(&f, Some("main"), None).await.is_ok());
    assert!(!call_as(&f, Some("main"), Some("s2")).await.is_ok());
    assert_eq!(f.adapter.tracked_runs(), 4);
}

#[tokio::test]
async fn wall_time_is_breached_one_millisecond_past_the_limit() {
    let limits = AgentRunLimits {
        agent_level: RunLimitsLayer::new().with(dk_policy::RunLimit::MaxWallTimeMs, 1000),
        ..AgentRunLimits::default()
    };
    let (f, now) = budgeted(limits).await;
    set_time(&now, 5_000);
    assert!(call_as(&f, Some("main"), Some("s1")).await.is_ok());
    set_time(&now, 6_000);
    assert!(call_as(&f, Some("main"), Some("s1")).await.is_ok());
    set_time(&now, 6_001);
    check_refused(
        &call_as(&f, Some("main"), Some("s1")).await,
        "[8dk-deny] run limit maxWallTimeMs of 1000 exceeded: this session's run budget is spent",
    );
    // A session that starts now has its own clock.
    assert!(call_as(&f, Some("main"), Some("s2")).await.is_ok());
    assert_eq!(f.link.calls.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn only_calls_past_the_first_checks_are_charged_and_nobody_is_asked_over_budget() {
    let (f, _) = budgeted(tool_calls(1)).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let yes = approver(Ok(true), Arc::clone(&seen));
    let ctx = CallContext {
        agent_id: Some("main"),
        session_id: Some("s1"),
        approver: Some(&yes),
        ..CallContext::default()
    };
    // Refused at checks 1 to 4: nothing charged.
    for (tool, input) in [
        ("device__desk_lamp__nope", json!({})),
        ("device__desk_lamp__set_light", json!({"on": "yes"})),
    ] {
        let outcome = f.adapter.execute(tool, input, ctx).await;
        assert!(outcome.reason().unwrap().starts_with("[8dk-deny] "));
    }
    assert!(call_as(&f, Some("main"), Some("s1")).await.is_ok());
    // A rule now asks the person about the lamp: over budget, they are never
    // asked.
    let rules = "version: 1\npolicies:\n  - name: ask\n    action: device_use\n    condition: \"capability equals set_light\"\n    decision: require_approval\n    message: lamp needs a yes\n";
    f.adapter
        .set_policies(Arc::new(PolicySet::from_yaml_str(rules).unwrap()));
    let outcome = f
        .adapter
        .execute("device__desk_lamp__set_light", json!({"on": true}), ctx)
        .await;
    check_refused(
        &outcome,
        "[8dk-deny] run limit maxToolCalls of 1 exceeded: this session's run budget is spent",
    );
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn calls_without_an_agent_are_charged_only_when_the_host_asks() {
    let (f, _) = budgeted(tool_calls(1)).await;
    for _ in 0..3 {
        assert!(call_as(&f, None, Some("s1")).await.is_ok());
        assert!(call_as(&f, None, None).await.is_ok());
    }
    assert_eq!(f.adapter.tracked_runs(), 0);
    let (f, _) = budgeted(AgentRunLimits {
        charge_calls_without_agent: true,
        ..tool_calls(1)
    })
    .await;
    assert!(call_as(&f, None, Some("s1")).await.is_ok());
    assert!(!call_as(&f, None, Some("s1")).await.is_ok());
    assert!(call_as(&f, None, None).await.is_ok());
    // Without run limits nothing is charged at all.
    let plain = fixture(&["set_light"], NO_RULES, ok_reply()).await;
    for _ in 0..40 {
        assert!(call_as(&plain, Some("main"), Some("s1")).await.is_ok());
    }
}

#[tokio::test]
async fn a_run_level_layer_only_narrows_the_agent_level() {
    let mut limits = tool_calls(3);
    limits.per_agent.insert(
        "bulk".to_owned(),
        RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, 5),
    );
    let (f, _) = budgeted(limits).await;
    let narrow = RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, 1);
    let wide = RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, 200);
    let max = |budget: Option<RunLimits>| budget.unwrap().get(dk_policy::RunLimit::MaxToolCalls);
    assert_eq!(
        max(f
            .adapter
            .start_run(Some("main"), Some("a"), &narrow)
            .unwrap()),
        1
    );
    assert_eq!(
        max(f.adapter.start_run(Some("main"), Some("b"), &wide).unwrap()),
        3
    );
    assert_eq!(
        max(f.adapter.start_run(Some("bulk"), Some("c"), &wide).unwrap()),
        5
    );
    assert!(call_as(&f, Some("main"), Some("a")).await.is_ok());
    assert!(!call_as(&f, Some("main"), Some("a")).await.is_ok());
    for _ in 0..3 {
        assert!(call_as(&f, Some("main"), Some("b")).await.is_ok());
    }
    assert!(!call_as(&f, Some("main"), Some("b")).await.is_ok());
    // A layer out of range is refused, at start and in the configuration.
    let zero = RunLimitsLayer::new().with(dk_policy::RunLimit::MaxToolCalls, 0);
    assert!(f.adapter.start_run(Some("main"), Some("d"), &zero).is_err());
    let bad = AgentRunLimits {
        agent_level: zero,
        ..AgentRunLimits::default()
    };
    assert!(bad.check().is_err());
    assert!(AgentRunLimits::default().check().is_ok());
    let (f, _) = budgeted(bad).await;
    let outcome = call_as(&f, Some("main"), Some("s1")).await;
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
            call_as(&f, Some("main"), Some(&format!("s{i}")))
                .await
                .is_ok()
        );
        assert!(f.adapter.tracked_runs() <= 16);
    }
    // The most recent session is still tracked, and still spent.
    assert!(!call_as(&f, Some("main"), Some("s199")).await.is_ok());
    // Idle past the expiry, a session's next call starts a new run.
    set_time(&now, 199 + 60_000);
    assert!(call_as(&f, Some("main"), Some("s199")).await.is_ok());
    assert_eq!(f.adapter.tracked_runs(), 1);
}
