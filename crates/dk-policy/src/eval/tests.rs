//! Evaluation tests: decision tiers, the shadow hard-deny, and the index against a naive scan.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use proptest::prelude::*;

use super::*;

fn set(rules: &str) -> PolicySet {
    let text = format!("version: 1\npolicies:{rules}");
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
  - {name: never, action: device_use, condition: 'deviceId in []', decision: block, message: never}
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

// ---- properties: the index agrees with a naive scan ----

#[derive(Clone, Debug)]
struct GenRule {
    action: &'static str,
    decision: &'static str,
    condition: String,
    enabled: bool,
    scope: Option<&'static str>,
}

const DEVICES: [&str; 5] = ["lamp-1", "LAMP-1", "door", "ΣΑΣ", "σας"];
/// The device ids rules name: a device_use rule naming a value no device id
/// can be is refused, so the Unicode ones appear only in calls.
const RULE_DEVICES: [&str; 4] = ["lamp-1", "LAMP-1", "door", "Door"];
const CAPS: [&str; 3] = ["set_light", "Set_Light", "read"];
const AGENTS: [&str; 3] = ["main", "helper", "__shadow__"];

fn gen_clause() -> impl Strategy<Value = String> {
    let device = proptest::sample::select(&RULE_DEVICES[..]);
    let cap = proptest::sample::select(&CAPS[..]);
    let agent = proptest::sample::select(&AGENTS[..]);
    prop_oneof![
        device.prop_map(|d| format!("deviceId equals {d}")),
        cap.prop_map(|c| format!("capability equals {c}")),
        proptest::sample::subsequence(&RULE_DEVICES[..], 0..3)
            .prop_map(|d| format!("deviceId in [{}]", d.join(", "))),
        proptest::sample::subsequence(&CAPS[..], 0..3)
            .prop_map(|c| format!("capability in [{}]", c.join(", "))),
        agent.prop_map(|a| format!("agentId equals {a}")),
        Just("capabilityKind equals actuator".to_owned()),
        Just("deviceId starts_with LAMP".to_owned()),
        Just("sessionId equals \"\"".to_owned()),
    ]
}

fn gen_condition() -> impl Strategy<Value = String> {
    let conj = || prop::collection::vec(gen_clause(), 1..4).prop_map(|c| c.join(" and "));
    prop_oneof![
        4 => conj(),
        1 => (conj(), conj()).prop_map(|(a, b)| format!("{a} or {b}")),
        1 => conj().prop_map(|a| format!("not ({a})")),
        1 => (gen_clause(), conj()).prop_map(|(a, b)| format!("{a} and ({b} or agentId equals main)")),
    ]
}

fn gen_rule() -> impl Strategy<Value = GenRule> {
    (
        proptest::sample::select(&["device_use", "*", "write_file"][..]),
        proptest::sample::select(&["block", "require_approval", "allow"][..]),
        gen_condition(),
        prop::bool::weighted(0.85),
        proptest::option::weighted(0.2, proptest::sample::select(&AGENTS[..])),
    )
        .prop_map(|(action, decision, condition, enabled, scope)| GenRule {
            action,
            decision,
            condition,
            enabled,
            scope,
        })
}

fn render(rules: &[GenRule]) -> String {
    let mut text = String::from("version: 1\npolicies:\n");
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
    }
    text
}

fn gen_ctx() -> impl Strategy<
    Value = (
        Option<&'static str>,
        &'static str,
        &'static str,
        &'static str,
    ),
> {
    (
        proptest::option::of(proptest::sample::select(&AGENTS[..])),
        proptest::sample::select(&DEVICES[..]),
        proptest::sample::select(&CAPS[..]),
        proptest::sample::select(&["actuator", "sensor"][..]),
    )
}

/// The specification, read literally: scan every rule in file order, with
/// allocating lower-casing.
fn naive(rules: &[Rule], action: &str, ctx: &DeviceUseContext<'_>) -> Decision<'static> {
    if action == DEVICE_USE && ctx.agent_id == Some(SHADOW_AGENT_ID) {
        return Decision::Block {
            rule: None,
            reason: SHADOW_DENY_REASON,
        };
    }
    let matching = |decision: RuleDecision| {
        rules.iter().find(|rule| {
            rule.decision() == decision
                && rule.applies_to(action, ctx.agent_id)
                && naive_matches(&rule.condition().root, ctx)
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

fn naive_matches(expr: &crate::condition::Expr, ctx: &DeviceUseContext<'_>) -> bool {
    use crate::condition::{Expr, Op};
    match expr {
        Expr::Not(inner) => !naive_matches(inner, ctx),
        Expr::And(items) => items.iter().all(|e| naive_matches(e, ctx)),
        Expr::Or(items) => items.iter().any(|e| naive_matches(e, ctx)),
        Expr::Clause(clause) => {
            let hay = Context::get(ctx, &clause.field.name)
                .unwrap_or("")
                .to_lowercase();
            match &clause.op {
                Op::Equals(v) => hay == v.text.to_lowercase(),
                Op::Contains(v) => hay.contains(&v.text.to_lowercase()),
                Op::StartsWith(v) => hay.starts_with(&v.text.to_lowercase()),
                Op::EndsWith(v) => hay.ends_with(&v.text.to_lowercase()),
                Op::In(items) => items.iter().any(|i| i.text.to_lowercase() == hay),
            }
        }
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
        ctxs in prop::collection::vec(gen_ctx(), 8),
    ) {
        let text = render(&rules);
        let set = PolicySet::from_yaml_str(&text).map_err(|e| TestCaseError::fail(format!("{text}\n{e}")))?;
        for (agent_id, device_id, capability, capability_kind) in ctxs {
            let ctx = DeviceUseContext { agent_id, session_id: None, device_id, capability, capability_kind };
            let expected = naive(set.rules(), DEVICE_USE, &ctx);
            prop_assert_eq!(set.evaluate_device_use(&ctx), expected, "{}\n{:?}", text, ctx);
            prop_assert_eq!(set.evaluate(DEVICE_USE, &ctx), expected);
            prop_assert_eq!(set.evaluate("write_file", &ctx), naive(set.rules(), "write_file", &ctx));
        }
    }

    #[test]
    fn adding_a_block_rule_never_widens(
        rules in prop::collection::vec(gen_rule(), 0..20),
        extra in gen_rule(),
        position in 0usize..21,
        ctxs in prop::collection::vec(gen_ctx(), 8),
    ) {
        let before = PolicySet::from_yaml_str(&render(&rules)).unwrap();
        let mut more = rules.clone();
        let block = GenRule { decision: "block", ..extra };
        more.insert(position.min(rules.len()), block);
        let after = PolicySet::from_yaml_str(&render(&more)).unwrap();
        for (agent_id, device_id, capability, capability_kind) in ctxs {
            let ctx = DeviceUseContext { agent_id, session_id: None, device_id, capability, capability_kind };
            let (b, a) = (before.evaluate_device_use(&ctx), after.evaluate_device_use(&ctx));
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
    let evaluation = rules.evaluate_device_use_counted(ctx, counts, at);
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
