//! dk's `device_use` rules: rule files, the condition language, and evaluation.
//!
//! A person's grant is the yes; rules only narrow it. A rule file (8gent's
//! `policies.yaml` format) is read with [`PolicySet::from_yaml_str`] or
//! [`PolicySet::load`]; a file with any error is refused whole, with every
//! error reported ([`PolicyFileError`]), so a typo can never silently drop a
//! block. [`PolicySet::evaluate_device_use`] then decides each device call:
//! a shadow agent is always refused, the first matching `block` rule wins,
//! else the first matching `require_approval`, else [`Decision::Allow`].
//!
//! ```
//! use dk_policy::{Decision, DeviceUseContext, PolicySet};
//!
//! let rules = PolicySet::from_yaml_str(
//!     r#"
//! version: 1
//! policies:
//!   - name: ask-before-lamp-actions
//!     action: device_use
//!     condition: "deviceId equals desk-lamp and capabilityKind equals actuator"
//!     decision: require_approval
//!     message: "Lamp actions need a yes"
//! "#,
//! )?;
//! let call = DeviceUseContext {
//!     agent_id: Some("main"),
//!     session_id: None,
//!     device_id: "desk-lamp",
//!     capability: "set_light",
//!     capability_kind: "actuator",
//! };
//! assert_eq!(
//!     rules.evaluate_device_use(&call),
//!     Decision::RequireApproval {
//!         rule: "ask-before-lamp-actions",
//!         reason: "[ask-before-lamp-actions] Lamp actions need a yes",
//!     }
//! );
//! # Ok::<(), dk_policy::PolicyFileError>(())
//! ```
//!
//! The [admission contract](admit) for streaming devices (voice satellites,
//! desktop-control bridges) lives here too: resolving a device-class policy,
//! admitting a connection, bounding stream chunks, redacting telemetry
//! ([`Redactor`]), run limits ([`RunTracker`]) and the six-case conformance
//! run ([`run_device_policy_conformance`]).
//!
//! No input, rule file or condition text, can make this crate panic: sizes,
//! rule counts, YAML alias expansion and condition nesting are all bounded
//! (see the `MAX_*` constants), and the crate denies `unwrap`, `expect`,
//! `panic!` and slice indexing outside tests. It does no IO beyond reading
//! the file [`PolicySet::load`] is given.

#![forbid(unsafe_code)]

mod admission;
mod condition;
mod error;
mod eval;
mod file;
mod lint;
mod lower;
mod rate;
mod rule;
mod time;

#[doc(hidden)]
pub use admission::fuzz_admission;
pub use admission::{
    AdmissionCode, AdmissionError, AdmissionRequest, Admitted, CONFORMANCE_CASES, ChunkVerdict,
    ConformanceFailure, DEFAULT_MAX_CHUNK_BYTES, DEFAULT_MAX_CONCURRENT_SESSIONS, DROPPED_OVERSIZE,
    DeviceAdapter, DeviceClass, DeviceConfig, DisabledReason, HARD_MAX_CHUNK_BYTES,
    HARD_MAX_CONCURRENT_SESSIONS, InputError, MAX_DEPTH_MARKER, MAX_SAFE_INTEGER,
    MAX_TELEMETRY_DEPTH, REDACTED, RawDevicePolicy, RawStreamLimits, Redactor, ResolveOptions,
    ResolvedPolicy, RunLimit, RunLimitBreach, RunLimits, RunLimitsLayer, RunTracker, accept_chunk,
    admit, narrow, redact_telemetry, resolve, run_device_policy_conformance,
};
pub use condition::{
    Condition, Context, DEVICE_USE_FIELDS, MAX_CONDITION_LENGTH, MAX_CONTAINS_LENGTH, MAX_NESTING,
};
pub use error::{ConditionError, ConditionErrors, Location, PolicyError, PolicyFileError};
pub use eval::{
    Call, Decision, DeviceUseContext, Evaluation, PolicySet, SHADOW_AGENT_ID, SHADOW_DENY_REASON,
};
pub use file::{MAX_FILE_BYTES, MAX_RULES, MAX_SCALAR_BYTES, MAX_YAML_NODES, read_rule_file};
pub use lint::{
    DeclaredParams, InputType, LintKind, LintOptions, LintWarning, MAX_LOCATED_WARNINGS, lint,
    lint_with, lint_yaml_str, lint_yaml_str_with,
};
pub use rate::{
    DEFAULT_RATE_LOG_KEYS, MAX_LIMIT_CALLS, MAX_LIMIT_WINDOW, NoCounts, RateCounts, RateLimit,
    RateLimitError, RateLog, RateLogFull,
};
pub use rule::{DEVICE_USE, Rule, RuleDecision};
pub use time::{InstantError, WEEKDAYS, ZoneError};

/// Fuzzing hook: parses arbitrary bytes as a condition, prints and parses
/// again. Never panics.
#[doc(hidden)]
pub fn fuzz_condition(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(condition) = Condition::parse(&text) {
        let printed = condition.to_string();
        let _again = Condition::parse(&printed);
        let ctx = DeviceUseContext {
            agent_id: Some(&text),
            session_id: None,
            device_id: &text,
            capability: &printed,
            capability_kind: "actuator",
        };
        let _ = condition.matches(&ctx);
        // The same text as a rule file's condition, evaluated as a whole call.
        let rule = format!(
            "version: 1\ntimezone: Europe/Berlin\npolicies:\n  - name: r\n    action: device_use\n    condition: {}\n    decision: block\n    message: m\n",
            serde_json::Value::String(text.into_owned())
        );
        if let Ok(set) = PolicySet::from_yaml_str(&rule) {
            evaluate_sample_calls(&set);
        }
    }
}

/// Evaluates a few whole calls (inputs of every type, instants on both
/// sides of a DST change) against `set`.
fn evaluate_sample_calls(set: &PolicySet) {
    let inputs = [
        serde_json::json!({"target": 26, "on": true, "mode": "eco"}),
        serde_json::json!({"target": -3.5, "on": "true", "mode": 25}),
        serde_json::json!({"target": u64::MAX}),
    ];
    let ctx = DeviceUseContext {
        agent_id: Some("agent"),
        session_id: Some("session"),
        device_id: "desk-lamp",
        capability: "set_light",
        capability_kind: "actuator",
    };
    for (i, input) in inputs.iter().enumerate() {
        let seconds = [1_774_746_000_u64, 1_792_890_000, 0];
        let at = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(seconds.get(i).copied().unwrap_or(0));
        let call = Call {
            device: ctx,
            input: input.as_object(),
            at,
        };
        let _ = set.evaluate_call(&call);
        let _ = set.matching_call_rules(&call);
        // Every limited rule reached, for the agent, at that instant.
        let mut counts = RateLog::default();
        for rule in set.rules() {
            if let Some(limit) = rule.limit() {
                for _ in 0..limit.calls().min(64) {
                    let _ = counts.record(rule.name(), "agent", limit, at);
                }
            }
        }
        let _ = set.evaluate_call_counted(&call, &counts);
        let _ = set.evaluate_call_counted(&call, &NoCounts);
    }
}

/// Fuzzing hook: reads arbitrary bytes as a rule file and evaluates a call.
/// Never panics.
#[doc(hidden)]
pub fn fuzz_policy_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match PolicySet::from_yaml_str(&text) {
        Ok(set) => {
            let ctx = DeviceUseContext {
                agent_id: Some("agent"),
                session_id: Some("session"),
                device_id: "desk-lamp",
                capability: "set_light",
                capability_kind: "actuator",
            };
            let _ = set.evaluate_device_use(&ctx);
            let _ = set.evaluate(DEVICE_USE, &ctx);
            evaluate_sample_calls(&set);
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
}
