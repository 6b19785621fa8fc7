//! Evaluation tests: decision tiers, the shadow hard-deny, and the index against a naive scan.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use proptest::prelude::*;

use serde_json::{Map, Value};

use super::*;

fn set(rules: &str) -> PolicySet {
    let text = format!("version: 1\npolicies:{rules}");
    PolicySet::from_yaml_str(&text).unwrap_or_else(|e| panic!("{text}\n{e}"))
}

/// Rules read in the zone `zone`.
fn set_in(zone: &str, rules: &str) -> PolicySet {
    let text = format!("version: 1\ntimezone: {zone}\npolicies:{rules}");
    PolicySet::from_yaml_str(&text).unwrap_or_else(|e| panic!("{text}\n{e}"))
}

fn lamp(agent_id: Option<&'static str>) -> DeviceUseContext<'static> {
    DeviceUseContext {
        agent_id,
        session_id: Some("s1"),
        device_id: "desk-lamp",
        capability: "set_light",
        capability_kind: "actuator",
    }
}

/// Evaluates a device_use call both ways; both must give `expected`.
#[track_caller]
fn check(rules: &PolicySet, ctx: &DeviceUseContext<'_>, expected: Decision<'_>) {
    assert_eq!(rules.evaluate_device_use(ctx), expected, "{ctx:?}");
    assert_eq!(rules.evaluate(DEVICE_USE, ctx), expected, "{ctx:?}");
}

const TIERS: &str = "
  - {name: allow-lamp, action: device_use, condition: deviceId equals desk-lamp, decision: allow, message: fine}
  - {name: ask-actuators, action: device_use, condition: capabilityKind equals actuator, decision: require_approval, message: ask first}
  - {name: no-helper, action: '*', condition: agentId equals helper, decision: block, message: not you}
  - {name: scoped-block, action: device_use, condition: deviceId starts_with desk, decision: block, message: scoped, agentScope: intern}
  - {name: off, action: device_use, condition: deviceId equals desk-lamp, decision: block, message: disabled, enabled: false}
  - {name: other-action, action: write_file, condition: path contains x, decision: block, message: other}
";

#[test]
fn tiers_and_scopes() {
    let rules = set(TIERS);
    let cases: Vec<(DeviceUseContext<'static>, Decision<'static>)> = vec![
        (
            lamp(Some("main")),
            Decision::RequireApproval {
                rule: "ask-actuators",
                reason: "[ask-actuators] ask first",
            },
        ),
        (
            lamp(Some("helper")),
            Decision::Block {
                rule: Some("no-helper"),
                reason: "[no-helper] not you",
            },
        ),
        (
            lamp(Some("intern")),
            Decision::Block {
                rule: Some("scoped-block"),
                reason: "[scoped-block] scoped",
            },
        ),
        (
            DeviceUseContext {
                capability_kind: "sensor",
                ..lamp(None)
            },
            Decision::Allow {
                rule: Some("allow-lamp"),
            },
        ),
        (
            DeviceUseContext {
                capability_kind: "sensor",
                device_id: "door",
                ..lamp(None)
            },
            Decision::Allow { rule: None },
        ),
        (
            lamp(Some(SHADOW_AGENT_ID)),
            Decision::Block {
                rule: None,
                reason: SHADOW_DENY_REASON,
            },
        ),
    ];
    for (ctx, expected) in cases {
        check(&rules, &ctx, expected);
    }
}

#[test]
fn shadow_is_refused_even_with_no_rules() {
    let empty = PolicySet::empty();
    let decision = empty.evaluate_device_use(&lamp(Some("__shadow__")));
    assert_eq!(decision.kind(), RuleDecision::Block);
    assert_eq!(decision.rule(), None);
    assert_eq!(decision.reason(), Some(SHADOW_DENY_REASON));
    // Only the exact id, only for device_use.
    assert!(
        PolicySet::empty()
            .evaluate_device_use(&lamp(Some("__SHADOW__")))
            .is_allowed()
    );
    let mut map = BTreeMap::new();
    map.insert("agentId".to_owned(), "__shadow__".to_owned());
    assert!(PolicySet::empty().evaluate("read_file", &map).is_allowed());
    assert!(!PolicySet::empty().evaluate(DEVICE_USE, &map).is_allowed());
}

#[test]
fn generic_contexts() {
    let rules = set(TIERS);
    let mut map = BTreeMap::new();
    map.insert("path".to_owned(), "/tmp/x".to_owned());
    assert_eq!(
        rules.evaluate("write_file", &map),
        Decision::Block {
            rule: Some("other-action"),
            reason: "[other-action] other",
        }
    );
    map.insert("agentId".to_owned(), "helper".to_owned());
    assert_eq!(rules.evaluate("read_file", &map).rule(), Some("no-helper"));
    let names: Vec<&str> = rules
        .matching_rules("write_file", &map)
        .iter()
        .map(|r| r.name())
        .collect();
    assert_eq!(names, ["no-helper", "other-action"]);
    let hash: std::collections::HashMap<String, String> = map.into_iter().collect();
    assert_eq!(rules.evaluate("read_file", &hash).rule(), Some("no-helper"));
}

#[test]
fn file_order_within_a_tier_across_index_lists() {
    let rules = set("
  - {name: by-capability, action: device_use, condition: capability equals SET_LIGHT, decision: block, message: a}
  - {name: by-device, action: device_use, condition: 'deviceId in [x, DESK-LAMP]', decision: block, message: b}
  - {name: fallback, action: device_use, condition: agentId equals main, decision: block, message: c}
");
    check(
        &rules,
        &lamp(Some("main")),
        Decision::Block {
            rule: Some("by-capability"),
            reason: "[by-capability] a",
        },
    );
    let rules = set("
  - {name: fallback, action: '*', condition: agentId equals main, decision: require_approval, message: c}
  - {name: by-device, action: device_use, condition: deviceId equals desk-lamp and capability equals set_light, decision: require_approval, message: b}
  - {name: never, action: write_file, condition: 'deviceId in []', decision: block, message: never}
");
    check(
        &rules,
        &lamp(Some("main")),
        Decision::RequireApproval {
            rule: "fallback",
            reason: "[fallback] c",
        },
    );
    check(
        &rules,
        &lamp(None),
        Decision::RequireApproval {
            rule: "by-device",
            reason: "[by-device] b",
        },
    );
}

#[test]
fn policy_set_is_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PolicySet>();
    assert_send_sync::<std::sync::Arc<PolicySet>>();
}

// ---- whole calls: input params and time ----

/// An instant given as UTC `YYYY-MM-DDTHH:MM:SSZ`.
fn utc(text: &str) -> SystemTime {
    let timestamp: jiff::Timestamp = text.parse().unwrap();
    SystemTime::try_from(timestamp).unwrap()
}

fn thermostat_input(json: &str) -> Map<String, Value> {
    serde_json::from_str(json).unwrap()
}

/// Decides a call to `device`/`capability` with `input` at `at`; the
/// deciding rule's name, if any rule decided.
#[track_caller]
fn check_call(
    rules: &PolicySet,
    (device_id, capability): (&str, &str),
    input: Option<&str>,
    at: &str,
    expected: Option<&str>,
) {
    let input = input.map(thermostat_input);
    let call = Call {
        device: DeviceUseContext {
            agent_id: Some("main"),
            session_id: None,
            device_id,
            capability,
            capability_kind: "actuator",
        },
        input: input.as_ref(),
        at: utc(at),
    };
    assert_eq!(
        rules.evaluate_call(&call).rule(),
        expected,
        "{device_id} {capability} {input:?} at {at}"
    );
    let listed: Vec<&str> = rules
        .matching_call_rules(&call)
        .iter()
        .map(|r| r.name())
        .collect();
    assert_eq!(listed.first().copied(), expected, "matching_call_rules");
}

const THERMOSTAT: &str = "
  - name: thermostat-range
    action: device_use
    condition: deviceId equals thermostat and capability equals set_target and (input.target > 25 or input.target < 15)
    decision: block
    message: out of range
  - {name: eco-only, action: device_use, condition: 'input.mode equals eco and input.boost equals true', decision: require_approval, message: eco boost}
  - {name: precise, action: device_use, condition: 'input.offset >= -3.5 and input.offset <= -3.5', decision: block, message: exact}
  - {name: huge, action: device_use, condition: 'input.count > 9007199254740992', decision: block, message: huge}
  - {name: quoted, action: device_use, condition: 'input.code equals \"25\"', decision: block, message: quoted}
  - {name: by-name, action: device_use, condition: 'input.label starts_with Living', decision: require_approval, message: name}
";

#[test]
fn input_conditions() {
    let rules = set(THERMOSTAT);
    let t = ("thermostat", "set_target");
    let noon = "2026-06-01T12:00:00Z";
    let cases: &[(Option<&str>, Option<&str>)] = &[
        (Some(r#"{"target": 26}"#), Some("thermostat-range")),
        (Some(r#"{"target": 25}"#), None),
        (Some(r#"{"target": 25.0001}"#), Some("thermostat-range")),
        (Some(r#"{"target": 15}"#), None),
        (Some(r#"{"target": 14.99}"#), Some("thermostat-range")),
        (Some(r#"{"target": -40}"#), Some("thermostat-range")),
        (Some(r#"{"target": 1e300}"#), Some("thermostat-range")),
        // A string is not a number: the clause is false.
        (Some(r#"{"target": "30"}"#), None),
        (Some(r#"{"target": true}"#), None),
        // A missing param makes the clause false; so does a missing input.
        (Some(r#"{"other": 30}"#), None),
        (None, None),
        (Some(r#"{"mode": "ECO", "boost": true}"#), Some("eco-only")),
        (Some(r#"{"mode": "eco", "boost": "true"}"#), None),
        (Some(r#"{"mode": "eco", "boost": false}"#), None),
        (Some(r#"{"offset": -3.5}"#), Some("precise")),
        (Some(r#"{"offset": -3.4}"#), None),
        (Some(r#"{"count": 9007199254740993}"#), Some("huge")),
        (Some(r#"{"count": 9007199254740992}"#), None),
        (Some(r#"{"code": "25"}"#), Some("quoted")),
        (Some(r#"{"code": 25}"#), None),
        (Some(r#"{"label": "living room"}"#), Some("by-name")),
        (Some(r#"{"label": 5}"#), None),
    ];
    for (input, expected) in cases {
        check_call(&rules, t, *input, noon, *expected);
    }
    // Another device: the range rule does not apply.
    check_call(
        &rules,
        ("lamp", "set_target"),
        Some(r#"{"target": 30}"#),
        noon,
        None,
    );
    // The old entry point has no input: every input clause is false.
    let ctx = DeviceUseContext {
        agent_id: None,
        session_id: None,
        device_id: "thermostat",
        capability: "set_target",
        capability_kind: "actuator",
    };
    assert_eq!(
        rules.evaluate_device_use(&ctx),
        Decision::Allow { rule: None }
    );
    // `not` of a clause on a missing param is true.
    let negated = set("
  - {name: no-target, action: device_use, condition: 'not (input.target > 0)', decision: block, message: m}
");
    check_call(&negated, t, Some("{}"), noon, Some("no-target"));
    check_call(&negated, t, Some(r#"{"target": 1}"#), noon, None);
}

const NIGHT_DOOR: &str = "
  - name: night-door
    action: device_use
    condition: deviceId equals front-door and capability equals unlock and time in 23:00..06:00
    decision: require_approval
    message: at night
  - {name: weekend, action: device_use, condition: 'deviceId equals garage and weekday in [sat, sun]', decision: block, message: weekend}
  - {name: spring-gap, action: device_use, condition: 'deviceId equals clock and time in 02:00..03:00', decision: block, message: gap}
";

#[test]
fn time_windows_wrap_midnight_with_half_open_bounds() {
    let rules = set_in("UTC", NIGHT_DOOR);
    let door = ("front-door", "unlock");
    let cases = [
        ("2026-06-01T22:59:59Z", None),
        ("2026-06-01T23:00:00Z", Some("night-door")),
        ("2026-06-02T00:00:00Z", Some("night-door")),
        ("2026-06-02T05:59:59Z", Some("night-door")),
        ("2026-06-02T06:00:00Z", None),
        ("2026-06-02T12:00:00Z", None),
    ];
    for (at, expected) in cases {
        check_call(&rules, door, None, at, expected);
    }
}

#[test]
fn time_is_read_in_the_files_zone_across_dst_changes() {
    let berlin = set_in("Europe/Berlin", NIGHT_DOOR);
    let door = ("front-door", "unlock");
    let clock = ("clock", "tick");
    let cases = [
        // Winter, CET (UTC+1): 22:00 UTC is 23:00 local.
        (door, "2026-03-28T21:59:59Z", None),
        (door, "2026-03-28T22:00:00Z", Some("night-door")),
        // The spring change, 2026-03-29 02:00 CET -> 03:00 CEST: 01:59:59
        // local is 00:59:59 UTC, the next second is 03:00 local.
        (clock, "2026-03-29T00:59:59Z", None),
        (clock, "2026-03-29T01:00:00Z", None),
        (door, "2026-03-29T03:59:59Z", Some("night-door")),
        // 06:00 CEST is 04:00 UTC.
        (door, "2026-03-29T04:00:00Z", None),
        // Summer, CEST (UTC+2): 21:00 UTC is 23:00 local.
        (door, "2026-03-29T20:59:59Z", None),
        (door, "2026-03-29T21:00:00Z", Some("night-door")),
        // The autumn change, 2026-10-25 03:00 CEST -> 02:00 CET: 02:00-03:00
        // local happens twice, and is in the window both times.
        (clock, "2026-10-24T23:59:59Z", None),
        (clock, "2026-10-25T00:00:00Z", Some("spring-gap")),
        (clock, "2026-10-25T00:59:59Z", Some("spring-gap")),
        (clock, "2026-10-25T01:00:00Z", Some("spring-gap")),
        (clock, "2026-10-25T01:59:59Z", Some("spring-gap")),
        (clock, "2026-10-25T02:00:00Z", None),
        // After it, CET again: 06:00 local is 05:00 UTC.
        (door, "2026-10-25T04:59:59Z", Some("night-door")),
        (door, "2026-10-25T05:00:00Z", None),
    ];
    for (call, at, expected) in cases {
        check_call(&berlin, call, None, at, expected);
    }
    let new_york = set_in("America/New_York", NIGHT_DOOR);
    let cases = [
        // EST (UTC-5) until 2026-03-08 02:00, then EDT (UTC-4).
        (door, "2026-03-08T04:00:00Z", Some("night-door")),
        (door, "2026-03-08T10:59:59Z", None),
        (door, "2026-03-08T09:59:59Z", Some("night-door")),
        (door, "2026-03-08T10:00:00Z", None),
        (clock, "2026-03-08T06:59:59Z", None),
        (clock, "2026-03-08T07:00:00Z", None),
        // EDT until 2026-11-01 02:00, then EST: 01:00-02:00 local twice.
        (door, "2026-11-01T03:00:00Z", Some("night-door")),
        (door, "2026-11-01T10:59:59Z", Some("night-door")),
        (door, "2026-11-01T11:00:00Z", None),
    ];
    for (call, at, expected) in cases {
        check_call(&new_york, call, None, at, expected);
    }
}

#[test]
fn weekdays_are_read_in_the_zone() {
    let garage = ("garage", "open");
    // Friday 2026-06-05 23:30 UTC is Saturday 01:30 in Berlin, Friday 19:30 in New York.
    let at = "2026-06-05T23:30:00Z";
    let berlin = set_in("Europe/Berlin", NIGHT_DOOR);
    check_call(&berlin, garage, None, at, Some("weekend"));
    let new_york = set_in("America/New_York", NIGHT_DOOR);
    check_call(&new_york, garage, None, at, None);
    // Sunday 2026-06-07 23:30 UTC: Monday in Berlin, still Sunday in New York.
    let at = "2026-06-07T23:30:00Z";
    check_call(&berlin, garage, None, at, None);
    check_call(&new_york, garage, None, at, Some("weekend"));
}

#[test]
fn the_local_zone_is_the_hosts_unless_the_file_names_one() {
    let garage = ("garage", "open");
    let at = "2026-06-05T23:30:00Z";
    let local = set(NIGHT_DOOR).with_local_zone("Europe/Berlin").unwrap();
    assert_eq!(local.time_zone(), Some("Europe/Berlin"));
    check_call(&local, garage, None, at, Some("weekend"));
    let local = set(NIGHT_DOOR).with_local_zone("America/New_York").unwrap();
    check_call(&local, garage, None, at, None);
    // The file's zone wins over the host's.
    let file = set_in("Europe/Berlin", NIGHT_DOOR)
        .with_local_zone("America/New_York")
        .unwrap();
    assert_eq!(file.time_zone(), Some("Europe/Berlin"));
    check_call(&file, garage, None, at, Some("weekend"));
    assert_eq!(
        set(NIGHT_DOOR)
            .with_local_zone("Nowhere/Else")
            .unwrap_err()
            .to_string(),
        "unknown time zone `Nowhere/Else` (write an IANA name such as `Europe/Berlin` or `UTC`)"
    );
    // Without an instant (the old entry points) time clauses are false.
    let ctx = DeviceUseContext {
        agent_id: None,
        session_id: None,
        device_id: "garage",
        capability: "open",
        capability_kind: "actuator",
    };
    assert!(local.evaluate_device_use(&ctx).is_allowed());
    assert!(local.evaluate(DEVICE_USE, &ctx).is_allowed());
}

// ---- properties: the index agrees with a naive scan ----

#[derive(Clone, Debug)]
struct GenRule {
    action: &'static str,
    decision: &'static str,
    condition: String,
    enabled: bool,
    scope: Option<&'static str>,
    /// `limit: N per 1h`, on device_use and `*` block and require_approval rules.
    limit: Option<u32>,
}

const DEVICES: [&str; 5] = ["lamp-1", "LAMP-1", "door", "ΣΑΣ", "σας"];
/// The device ids rules name: a device_use rule naming a value no device id
/// can be is refused, so the Unicode ones appear only in calls.
const RULE_DEVICES: [&str; 4] = ["lamp-1", "LAMP-1", "door", "Door"];
const CAPS: [&str; 3] = ["set_light", "Set_Light", "read"];
const AGENTS: [&str; 3] = ["main", "helper", "__shadow__"];
const NUMBERS: [&str; 7] = ["-3.5", "0", "15", "25", "25.0", "1e3", "9007199254740993"];
const CLOCKS: [&str; 7] = [
    "00:00", "02:00", "02:30", "03:00", "06:00", "23:00", "23:59",
];
const WEEKDAY_NAMES: [&str; 4] = ["mon", "Sat", "sun", "fri"];
const ZONES: [&str; 3] = ["Europe/Berlin", "America/New_York", "UTC"];

fn gen_clause() -> impl Strategy<Value = String> {
    let device = proptest::sample::select(&RULE_DEVICES[..]);
    let cap = proptest::sample::select(&CAPS[..]);
    let agent = proptest::sample::select(&AGENTS[..]);
    prop_oneof![
        device.prop_map(|d| format!("deviceId equals {d}")),
        cap.prop_map(|c| format!("capability equals {c}")),
        proptest::sample::subsequence(&RULE_DEVICES[..], 1..3)
            .prop_map(|d| format!("deviceId in [{}]", d.join(", "))),
        proptest::sample::subsequence(&CAPS[..], 1..3)
            .prop_map(|c| format!("capability in [{}]", c.join(", "))),
        agent.prop_map(|a| format!("agentId equals {a}")),
        Just("capabilityKind equals actuator".to_owned()),
        Just("deviceId starts_with LAMP".to_owned()),
        Just("sessionId equals \"\"".to_owned()),
    ]
}

/// Clauses only device calls have: input params, time windows, weekdays.
fn gen_call_clause() -> impl Strategy<Value = String> {
    let number = || proptest::sample::select(&NUMBERS[..]);
    let op = proptest::sample::select(&[">", ">=", "<", "<="][..]);
    let clock = || proptest::sample::select(&CLOCKS[..]);
    prop_oneof![
        2 => gen_clause(),
        1 => (op, number()).prop_map(|(op, n)| format!("input.target {op} {n}")),
        1 => number().prop_map(|n| format!("input.target equals {n}")),
        1 => Just("input.on equals true".to_owned()),
        1 => Just("input.mode in [eco, \"25\", 25]".to_owned()),
        1 => Just("input.mode starts_with EC".to_owned()),
        1 => (clock(), clock()).prop_map(|(a, b)| format!("time in {a}..{b}")),
        1 => proptest::sample::subsequence(&WEEKDAY_NAMES[..], 1..3)
            .prop_map(|d| format!("weekday in [{}]", d.join(", "))),
        1 => Just("weekday equals sun".to_owned()),
    ]
}

fn gen_condition(call: bool) -> impl Strategy<Value = String> {
    let clause = move || {
        if call {
            gen_call_clause().boxed()
        } else {
            gen_clause().boxed()
        }
    };
    let conj = move || prop::collection::vec(clause(), 1..4).prop_map(|c| c.join(" and "));
    prop_oneof![
        4 => conj(),
        1 => (conj(), conj()).prop_map(|(a, b)| format!("{a} or {b}")),
        1 => conj().prop_map(|a| format!("not ({a})")),
        1 => (clause(), conj()).prop_map(|(a, b)| format!("{a} and ({b} or agentId equals main)")),
    ]
}

fn gen_rule() -> impl Strategy<Value = GenRule> {
    (
        proptest::sample::select(&["device_use", "*", "write_file"][..]),
        proptest::sample::select(&["block", "require_approval", "allow"][..]),
        gen_condition(true),
        gen_condition(false),
        prop::bool::weighted(0.85),
        proptest::option::weighted(0.2, proptest::sample::select(&AGENTS[..])),
        proptest::option::weighted(0.25, 1u32..4),
    )
        .prop_map(
            |(action, decision, call_condition, condition, enabled, scope, limit)| GenRule {
                action,
                decision,
                // Other actions have no input and no instant: such clauses are refused there.
                condition: if action == "write_file" {
                    condition
                } else {
                    call_condition
                },
                enabled,
                scope,
                limit: limit.filter(|_| action != "write_file" && decision != "allow"),
            },
        )
}

fn render(rules: &[GenRule], zone: Option<&str>) -> String {
    let mut text = String::from("version: 1\n");
    if let Some(zone) = zone {
        let _ = writeln!(text, "timezone: {zone}");
    }
    text.push_str("policies:\n");
    if rules.is_empty() {
        text.push_str("  []\n");
    }
    for (i, rule) in rules.iter().enumerate() {
        let _ = write!(
            text,
            "  - name: r{i}\n    action: '{}'\n    condition: '{}'\n    decision: {}\n    message: m{i}\n    enabled: {}\n",
            rule.action, rule.condition, rule.decision, rule.enabled
        );
        if let Some(scope) = rule.scope {
            let _ = writeln!(text, "    agentScope: {scope}");
        }
        if let Some(limit) = rule.limit {
            let _ = writeln!(text, "    limit: {limit} per 1h");
        }
    }
    text
}

type GenCtx = (
    Option<&'static str>,
    &'static str,
    &'static str,
    &'static str,
);

fn gen_ctx() -> impl Strategy<Value = GenCtx> {
    (
        proptest::option::of(proptest::sample::select(&AGENTS[..])),
        proptest::sample::select(&DEVICES[..]),
        proptest::sample::select(&CAPS[..]),
        proptest::sample::select(&["actuator", "sensor"][..]),
    )
}

fn ctx_of((agent_id, device_id, capability, capability_kind): GenCtx) -> DeviceUseContext<'static> {
    DeviceUseContext {
        agent_id,
        session_id: None,
        device_id,
        capability,
        capability_kind,
    }
}

/// A call's input: some params, some missing, of several types.
fn gen_input() -> impl Strategy<Value = Option<Map<String, Value>>> {
    let target = prop_oneof![
        Just(serde_json::json!(-5)),
        Just(serde_json::json!(14.9)),
        Just(serde_json::json!(15)),
        Just(serde_json::json!(25)),
        Just(serde_json::json!(25.5)),
        Just(serde_json::json!(1000)),
        Just(serde_json::json!(9_007_199_254_740_993_u64)),
        Just(serde_json::json!("25")),
        Just(serde_json::json!(true)),
    ];
    let on = prop_oneof![
        Just(serde_json::json!(true)),
        Just(serde_json::json!(false)),
        Just(serde_json::json!("true"))
    ];
    let mode = prop_oneof![
        Just(serde_json::json!("eco")),
        Just(serde_json::json!("ECO-2")),
        Just(serde_json::json!("25")),
        Just(serde_json::json!(25))
    ];
    proptest::option::weighted(
        0.9,
        (
            proptest::option::of(target),
            proptest::option::of(on),
            proptest::option::of(mode),
        )
            .prop_map(|(target, on, mode)| {
                let mut map = Map::new();
                for (key, value) in [("target", target), ("on", on), ("mode", mode)] {
                    if let Some(value) = value {
                        map.insert(key.to_owned(), value);
                    }
                }
                map
            }),
    )
}

/// An instant in 2026, half of them within a day of a DST change in Berlin or New York.
fn gen_instant() -> impl Strategy<Value = SystemTime> {
    const YEAR_2026: u64 = 1_767_225_600;
    const CHANGES: [u64; 4] = [1_772_953_200, 1_774_746_000, 1_792_890_000, 1_793_602_800];
    prop_oneof![
        (0u64..365 * 86_400).prop_map(|s| YEAR_2026 + s),
        (proptest::sample::select(&CHANGES[..]), 0u64..2 * 86_400)
            .prop_map(|(change, s)| change + s - 86_400),
    ]
    .prop_map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s))
}

/// What a naive evaluator knows of a call.
struct NaiveCall<'a> {
    ctx: &'a DeviceUseContext<'a>,
    input: Option<&'a Map<String, Value>>,
    /// Minute of the day and weekday name, in the rules' zone.
    local: Option<(u32, &'static str)>,
    /// The calls each rule (by index) counted for the agent; none: no counts.
    counted: &'a [u32],
}

fn naive_local(at: SystemTime, zone: &str) -> (u32, &'static str) {
    let zoned = jiff::Timestamp::try_from(at).unwrap().in_tz(zone).unwrap();
    let minute = u32::try_from(i32::from(zoned.hour()) * 60 + i32::from(zoned.minute())).unwrap();
    let day = match zoned.weekday() {
        jiff::civil::Weekday::Monday => "mon",
        jiff::civil::Weekday::Tuesday => "tue",
        jiff::civil::Weekday::Wednesday => "wed",
        jiff::civil::Weekday::Thursday => "thu",
        jiff::civil::Weekday::Friday => "fri",
        jiff::civil::Weekday::Saturday => "sat",
        jiff::civil::Weekday::Sunday => "sun",
    };
    (minute, day)
}

/// The specification, read literally: scan every rule in file order, with
/// allocating lower-casing.
fn naive(rules: &[Rule], action: &str, call: &NaiveCall<'_>) -> Decision<'static> {
    let ctx = call.ctx;
    if action == DEVICE_USE && ctx.agent_id == Some(SHADOW_AGENT_ID) {
        return Decision::Block {
            rule: None,
            reason: SHADOW_DENY_REASON,
        };
    }
    let matching = |decision: RuleDecision| {
        rules.iter().enumerate().find_map(|(index, rule)| {
            let reached = rule
                .limit()
                .is_none_or(|limit| call.counted.get(index).copied().unwrap_or(0) >= limit.calls());
            (rule.decision() == decision
                && reached
                && rule.applies_to(action, ctx.agent_id)
                && naive_matches(&rule.condition().root, call))
            .then_some(rule)
        })
    };
    let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
    if let Some(rule) = matching(RuleDecision::Block) {
        return Decision::Block {
            rule: Some(leak(rule.name())),
            reason: leak(rule.reason()),
        };
    }
    if let Some(rule) = matching(RuleDecision::RequireApproval) {
        return Decision::RequireApproval {
            rule: leak(rule.name()),
            reason: leak(rule.reason()),
        };
    }
    Decision::Allow {
        rule: matching(RuleDecision::Allow).map(|r| leak(r.name())),
    }
}

fn naive_matches(expr: &crate::condition::Expr, call: &NaiveCall<'_>) -> bool {
    use crate::condition::{Expr, KnownField, Op};
    match expr {
        Expr::Not(inner) => !naive_matches(inner, call),
        Expr::And(items) => items.iter().all(|e| naive_matches(e, call)),
        Expr::Or(items) => items.iter().any(|e| naive_matches(e, call)),
        Expr::Clause(clause) if clause.field.known == KnownField::Input => {
            let param = clause.field.name.strip_prefix("input.").unwrap();
            match call.input.and_then(|input| input.get(param)) {
                Some(value) => naive_input(value, &clause.op),
                None => false,
            }
        }
        Expr::Clause(clause) => {
            if let Op::Window(window) = &clause.op {
                let Some((minute, _)) = call.local else {
                    return false;
                };
                // Walk the window minute by minute.
                let mut m = u32::from(window.start);
                let end = u32::from(window.end) % 1440;
                while m != end {
                    if m == minute {
                        return true;
                    }
                    m = (m + 1) % 1440;
                }
                return false;
            }
            let hay = match (clause.field.known, call.local) {
                (KnownField::Weekday, Some((_, day))) => day.to_owned(),
                _ => Context::get(call.ctx, &clause.field.name)
                    .unwrap_or("")
                    .to_lowercase(),
            };
            match &clause.op {
                Op::Equals(v) => hay == v.text.to_lowercase(),
                Op::Contains(v) => hay.contains(&v.text.to_lowercase()),
                Op::StartsWith(v) => hay.starts_with(&v.text.to_lowercase()),
                Op::EndsWith(v) => hay.ends_with(&v.text.to_lowercase()),
                Op::In(items) => items.iter().any(|i| i.text.to_lowercase() == hay),
                Op::Compare(..) | Op::Window(_) => false,
            }
        }
    }
}

fn naive_input(value: &Value, op: &crate::condition::Op) -> bool {
    use crate::condition::{Literal, Op};
    let text = |f: &dyn Fn(&str, &str) -> bool, v: &crate::condition::Value| {
        value
            .as_str()
            .is_some_and(|s| f(&s.to_lowercase(), &v.text.to_lowercase()))
    };
    let equals = |v: &crate::condition::Value| match &v.literal {
        Literal::Text => text(&|a, b| a == b, v),
        Literal::Bool(b) => value.as_bool() == Some(*b),
        Literal::Number(n) => match (value.as_u64(), n.text.parse::<u64>()) {
            (Some(a), Ok(b)) => a == b,
            _ => value.is_number() && value.as_f64() == n.text.parse::<f64>().ok(),
        },
    };
    match op {
        Op::Equals(v) => equals(v),
        Op::In(items) => items.iter().any(equals),
        Op::Contains(v) => text(&|a, b| a.contains(b), v),
        Op::StartsWith(v) => text(&|a, b| a.starts_with(b), v),
        Op::EndsWith(v) => text(&|a, b| a.ends_with(b), v),
        Op::Compare(comparison, n) => {
            let ordering = match (value.as_u64(), n.text.parse::<u64>()) {
                (Some(a), Ok(b)) => Some(a.cmp(&b)),
                _ => value
                    .as_f64()
                    .and_then(|a| a.partial_cmp(&n.text.parse::<f64>().unwrap())),
            };
            ordering.is_some_and(|o| match comparison.as_str() {
                ">" => o.is_gt(),
                ">=" => o.is_ge(),
                "<" => o.is_lt(),
                _ => o.is_le(),
            })
        }
        Op::Window(_) => false,
    }
}

fn rank(decision: &Decision<'_>) -> u8 {
    match decision {
        Decision::Allow { .. } => 0,
        Decision::RequireApproval { .. } => 1,
        Decision::Block { .. } => 2,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn index_agrees_with_naive_scan(
        rules in prop::collection::vec(gen_rule(), 0..30),
        file_zone in proptest::option::weighted(0.3, proptest::sample::select(&ZONES[..])),
        local_zone in proptest::sample::select(&ZONES[..]),
        calls in prop::collection::vec((gen_ctx(), gen_input(), gen_instant()), 8),
        counts in prop::collection::vec(0u32..4, 30),
    ) {
        let text = render(&rules, file_zone);
        let set = PolicySet::from_yaml_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{text}\n{e}")))?
            .with_local_zone(local_zone)
            .unwrap();
        let zone = file_zone.unwrap_or(local_zone);
        for (ctx, input, at) in calls {
            let ctx = ctx_of(ctx);
            let bare = NaiveCall { ctx: &ctx, input: None, local: None, counted: &[] };
            let expected = naive(set.rules(), DEVICE_USE, &bare);
            prop_assert_eq!(set.evaluate_device_use(&ctx), expected, "{}\n{:?}", text, ctx);
            prop_assert_eq!(set.evaluate(DEVICE_USE, &ctx), expected);
            prop_assert_eq!(set.evaluate("write_file", &ctx), naive(set.rules(), "write_file", &bare));
            let call = Call { device: ctx, input: input.as_ref(), at };
            let full = NaiveCall { ctx: &ctx, input: input.as_ref(), local: Some(naive_local(at, zone)), counted: &[] };
            prop_assert_eq!(set.evaluate_call(&call), naive(set.rules(), DEVICE_USE, &full), "{}\n{:?}", text, call);
            // With counts: each limited rule has made its count of calls for this agent.
            let mut log = crate::RateLog::default();
            for (rule, count) in set.rules().iter().zip(&counts) {
                if let Some(limit) = rule.limit() {
                    for _ in 0..*count {
                        log.record(rule.name(), ctx.agent_id.unwrap_or(""), limit, at).unwrap();
                    }
                }
            }
            let counted = NaiveCall { counted: &counts, ..full };
            let evaluation = set.evaluate_call_counted(&call, &log);
            prop_assert_eq!(evaluation.decision, naive(set.rules(), DEVICE_USE, &counted), "{}\n{:?} {:?}", text, call, counts);
            for rule in &evaluation.counted {
                let limit = rule.limit().unwrap();
                prop_assert!(counts[rule.index()] < limit.calls());
            }
        }
    }

    #[test]
    fn adding_a_block_rule_never_widens(
        rules in prop::collection::vec(gen_rule(), 0..20),
        extra in gen_rule(),
        position in 0usize..21,
        calls in prop::collection::vec((gen_ctx(), gen_input(), gen_instant()), 8),
    ) {
        let before = PolicySet::from_yaml_str(&render(&rules, Some("UTC"))).unwrap();
        let mut more = rules.clone();
        let block = GenRule { decision: "block", ..extra };
        more.insert(position.min(rules.len()), block);
        let after = PolicySet::from_yaml_str(&render(&more, Some("UTC"))).unwrap();
        for (ctx, input, at) in calls {
            let ctx = ctx_of(ctx);
            let (b, a) = (before.evaluate_device_use(&ctx), after.evaluate_device_use(&ctx));
            prop_assert!(rank(&a) >= rank(&b), "{:?} became {:?}", b, a);
            let call = Call { device: ctx, input: input.as_ref(), at };
            let (b, a) = (before.evaluate_call(&call), after.evaluate_call(&call));
            prop_assert!(rank(&a) >= rank(&b), "{:?} became {:?}", b, a);
        }
    }
}

const LIMITED: &str = "
  - {name: lamp-burst, action: device_use, condition: deviceId equals desk-lamp, decision: require_approval, message: slow down, limit: 2 per 1h}
  - {name: lamp-cap, action: device_use, condition: deviceId equals desk-lamp, decision: block, message: enough, limit: 4 per 1h}
  - {name: helper-ask, action: '*', condition: agentId equals helper, decision: require_approval, message: ask}
  - {name: guest-only, action: device_use, condition: capability equals set_light, decision: block, message: once, limit: 1 per 1m, agentScope: guest}
";

/// The decision as `<kind> <rule or ->`, and the names of the rules the
/// call counts against.
fn counted_names(
    rules: &PolicySet,
    ctx: &DeviceUseContext<'_>,
    counts: &crate::RateLog,
    at: std::time::SystemTime,
) -> (String, Vec<String>) {
    let call = Call {
        device: *ctx,
        input: None,
        at,
    };
    let evaluation = rules.evaluate_call_counted(&call, counts);
    let decision = &evaluation.decision;
    let shown = format!("{} {}", decision.kind(), decision.rule().unwrap_or("-"));
    let names = evaluation
        .counted
        .iter()
        .map(|r| r.name().to_owned())
        .collect();
    (shown, names)
}

/// A limited rule decides once its count is reached, per agent, in its tier
/// and in file order; until then the call counts against it.
#[test]
fn limited_rules_decide_once_reached() {
    use std::time::{Duration, UNIX_EPOCH};
    let rules = set(LIMITED);
    let mut log = crate::RateLog::default();
    let start = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let main = lamp(Some("main"));
    let mut seen = Vec::new();
    for minute in 0..6 {
        let at = start + Duration::from_secs(minute * 60);
        let (decision, counted) = counted_names(&rules, &main, &log, at);
        // The host records the call when it is made: here, every call that
        // is not blocked (as if the person said yes).
        if !decision.starts_with("block") {
            for name in &counted {
                let limit = rules
                    .rules()
                    .iter()
                    .find(|r| r.name() == name)
                    .and_then(Rule::limit)
                    .unwrap();
                log.record(name, "main", limit, at).unwrap();
            }
        }
        seen.push((decision, counted));
    }
    let expect = |decision: &str, counted: &[&str]| {
        (
            decision.to_owned(),
            counted.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        seen,
        [
            expect("allow -", &["lamp-burst", "lamp-cap"]),
            expect("allow -", &["lamp-burst", "lamp-cap"]),
            // Two calls made: lamp-burst now asks; lamp-cap still counts.
            expect("require_approval lamp-burst", &["lamp-cap"]),
            expect("require_approval lamp-burst", &["lamp-cap"]),
            // Four: lamp-cap blocks, whatever lamp-burst says.
            expect("block lamp-cap", &[]),
            expect("block lamp-cap", &[]),
        ]
    );
    // Another agent has its own counts; an hour later main's have gone.
    let (decision, counted) = counted_names(&rules, &lamp(Some("other")), &log, start);
    assert_eq!(decision, "allow -");
    assert_eq!(counted, ["lamp-burst", "lamp-cap"]);
    let later = start + Duration::from_secs(3_600 + 5 * 60);
    let (decision, _) = counted_names(&rules, &main, &log, later);
    assert_eq!(decision, "allow -");

    // An earlier reached rule and an indexed rule of the same tier: file
    // order decides.
    let helper = lamp(Some("helper"));
    log.record(
        "lamp-burst",
        "helper",
        rules.rules()[0].limit().unwrap(),
        start,
    )
    .unwrap();
    log.record(
        "lamp-burst",
        "helper",
        rules.rules()[0].limit().unwrap(),
        start,
    )
    .unwrap();
    let (decision, _) = counted_names(&rules, &helper, &log, start);
    assert_eq!(decision, "require_approval lamp-burst");
    let (decision, _) = counted_names(&rules, &helper, &crate::RateLog::default(), start);
    assert_eq!(decision, "require_approval helper-ask");

    // agentScope applies to limited rules too; a shadow agent is refused.
    let (decision, counted) = counted_names(&rules, &lamp(Some("guest")), &log, start);
    assert_eq!(decision, "allow -");
    assert_eq!(counted, ["lamp-burst", "lamp-cap", "guest-only"]);
    let (decision, counted) = counted_names(&rules, &lamp(Some(SHADOW_AGENT_ID)), &log, start);
    assert_eq!(decision, "block -");
    assert!(counted.is_empty());

    // Without counts, limited rules are passed over.
    assert_eq!(
        rules.evaluate_device_use(&main),
        Decision::Allow { rule: None }
    );
}
