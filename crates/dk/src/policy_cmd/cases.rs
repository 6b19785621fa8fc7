//! `dk policy test FILE CASES`: runs a table of calls against a rule file
//! and says, case by case, whether the decision and the deciding rule are
//! the ones expected; exits 1 on any mismatch, so rules can be kept under
//! test.
//!
//! A cases file is YAML, read strictly (an unknown key, a missing key or a
//! wrong type refuses the whole file):
//!
//! ```yaml
//! cases:
//!   - name: the lamp asks
//!     context: {deviceId: desk-lamp, capability: set_light, capabilityKind: actuator, agentId: main}
//!     expect: require_approval      # block, require_approval or allow
//!     rule: ask-before-lamp-actions # optional: the deciding rule, or null for none
//!     input: {brightness: 80}       # optional: the call's input
//!     at: 2026-12-01T23:30:00       # optional: when (in the rules' zone, or with an offset); default now
//!     counted: {lamp-burst: 2}      # optional: calls this agent already made that a limited rule counted
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use dk_policy::{Call, DEVICE_USE_FIELDS, DeviceUseContext, PolicySet, RateLog, RuleDecision};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};

use crate::input::{print_json, printable, read_text};

/// The most cases one file may hold.
const MAX_CASES: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    context: BTreeMap<String, String>,
    expect: Expected,
    #[serde(default, deserialize_with = "present")]
    rule: Option<Option<String>>,
    #[serde(default)]
    input: Option<Map<String, Value>>,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    counted: BTreeMap<String, u32>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Expected {
    Block,
    RequireApproval,
    Allow,
}

impl Expected {
    fn decision(self) -> RuleDecision {
        match self {
            Expected::Block => RuleDecision::Block,
            Expected::RequireApproval => RuleDecision::RequireApproval,
            Expected::Allow => RuleDecision::Allow,
        }
    }
}

/// A key written with `null` is `Some(None)`; an absent one stays `None`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// One case's outcome.
struct Outcome {
    name: String,
    expected: (RuleDecision, Option<Option<String>>),
    got: (RuleDecision, Option<String>, Option<String>),
}

impl Outcome {
    fn passed(&self) -> bool {
        let (decision, rule) = &self.expected;
        *decision == self.got.0 && rule.as_ref().is_none_or(|rule| *rule == self.got.1)
    }
}

/// Reads the cases file, refusing it whole on any error.
fn read_cases(file: &Path) -> Result<Vec<Case>, String> {
    let text = read_text(file)?;
    let cases: CaseFile =
        yaml_serde::from_str(&text).map_err(|e| format!("`{}`: {e}", file.display()))?;
    if cases.cases.len() > MAX_CASES {
        return Err(format!("more than {MAX_CASES} cases"));
    }
    for (index, case) in cases.cases.iter().enumerate() {
        if let Some(key) = case
            .context
            .keys()
            .find(|k| !DEVICE_USE_FIELDS.contains(&k.as_str()))
        {
            return Err(format!(
                "cases[{index}] `{}`: context key `{}` is not a field of a device_use call: use {}",
                printable(&case.name),
                printable(key),
                DEVICE_USE_FIELDS.join(", ")
            ));
        }
        for needed in ["deviceId", "capability", "capabilityKind"] {
            if !case.context.contains_key(needed) {
                return Err(format!(
                    "cases[{index}] `{}`: the context needs `{needed}`",
                    printable(&case.name)
                ));
            }
        }
    }
    Ok(cases.cases)
}

/// Decides one case.
fn run_case(set: &PolicySet, case: &Case) -> Result<Outcome, String> {
    let field = |name: &str| case.context.get(name).map(String::as_str);
    let ctx = DeviceUseContext {
        agent_id: field("agentId"),
        session_id: field("sessionId"),
        device_id: field("deviceId").unwrap_or(""),
        capability: field("capability").unwrap_or(""),
        capability_kind: field("capabilityKind").unwrap_or(""),
    };
    let at = match &case.at {
        Some(at) => set.instant(at).map_err(|e| format!("`at`: {e}"))?,
        None => SystemTime::now(),
    };
    let mut counts = RateLog::default();
    for (rule_name, calls) in &case.counted {
        let Some(limit) = set
            .rules()
            .iter()
            .find(|r| r.name() == rule_name)
            .and_then(|r| r.limit())
        else {
            return Err(format!(
                "`counted` names `{}`, which is not a rule with a limit",
                printable(rule_name)
            ));
        };
        for _ in 0..(*calls).min(limit.calls()) {
            counts
                .record(rule_name, ctx.agent_id.unwrap_or(""), limit, at)
                .map_err(|e| e.to_string())?;
        }
    }
    let call = Call {
        device: ctx,
        input: case.input.as_ref(),
        at,
    };
    let decision = set.evaluate_call_counted(&call, &counts).decision;
    Ok(Outcome {
        name: case.name.clone(),
        expected: (case.expect.decision(), case.rule.clone()),
        got: (
            decision.kind(),
            decision.rule().map(str::to_owned),
            decision.reason().map(str::to_owned),
        ),
    })
}

fn shown(decision: RuleDecision, rule: Option<&str>) -> String {
    match rule {
        Some(rule) => format!("{decision} by `{}`", printable(rule)),
        None => format!("{decision} (no rule)"),
    }
}

/// Runs `dk policy test`.
pub fn test(file: &Path, cases: &Path, json: bool) -> ExitCode {
    let set = match super::load(file) {
        Ok(set) => set,
        Err(error) => {
            for line in error.lines() {
                eprintln!("error: {}", printable(&line));
            }
            return ExitCode::FAILURE;
        }
    };
    let outcomes = read_cases(cases).and_then(|cases| {
        cases
            .iter()
            .enumerate()
            .map(|(index, case)| {
                run_case(&set, case)
                    .map_err(|e| format!("cases[{index}] `{}`: {e}", printable(&case.name)))
            })
            .collect::<Result<Vec<_>, _>>()
    });
    let outcomes = match outcomes {
        Ok(outcomes) => outcomes,
        Err(error) => {
            eprintln!("error: {}", printable(&error));
            return ExitCode::FAILURE;
        }
    };
    let failed = outcomes.iter().filter(|o| !o.passed()).count();
    if json {
        let list: Vec<Value> = outcomes
            .iter()
            .map(|o| {
                let mut expected = json!({"decision": o.expected.0.as_str()});
                if let (Some(rule), Value::Object(map)) = (&o.expected.1, &mut expected) {
                    map.insert("rule".into(), json!(rule));
                }
                json!({
                    "name": o.name,
                    "passed": o.passed(),
                    "expected": expected,
                    "got": {"decision": o.got.0.as_str(), "rule": o.got.1, "reason": o.got.2},
                })
            })
            .collect();
        print_json(&json!({"passed": outcomes.len() - failed, "failed": failed, "cases": list}));
    } else {
        for o in &outcomes {
            let got = shown(o.got.0, o.got.1.as_deref());
            if o.passed() {
                println!("ok    {}: {got}", printable(&o.name));
            } else {
                let expected = match &o.expected.1 {
                    Some(rule) => shown(o.expected.0, rule.as_deref()),
                    None => o.expected.0.to_string(),
                };
                println!(
                    "FAIL  {}: expected {expected}, got {got}",
                    printable(&o.name)
                );
            }
        }
        println!("{} passed, {failed} failed", outcomes.len() - failed);
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
