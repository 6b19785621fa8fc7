//! Tests of the refusals: each reads as 8DK's text, byte for byte.

use super::*;
use crate::ParamType;

#[track_caller]
fn check(refusal: Refusal, text: &str) {
    assert_eq!(refusal.to_string(), text);
    assert_eq!(refusal.by_policy(), text.starts_with("[policy] "), "{text}");
}

fn s(text: &str) -> String {
    text.to_owned()
}

#[test]
fn refusals_read_as_8dk_words_them() {
    let (device_id, capability) = (s("desk-lamp"), s("set_light"));
    let tool = s("device__desk_lamp__set_light");
    check(
        Refusal::NotADeviceTool { tool: s("shell") },
        r#"[8dk-deny] "shell" is not a device tool"#,
    );
    check(
        Refusal::NotPaired {
            device_id: device_id.clone(),
        },
        r#"[8dk-deny] device "desk-lamp" is not paired"#,
    );
    check(
        Refusal::NoCapability {
            device_id: device_id.clone(),
            capability: s("explode"),
        },
        r#"[8dk-deny] device "desk-lamp" has no capability "explode""#,
    );
    check(
        Refusal::NotGranted {
            device_id: device_id.clone(),
            capability: capability.clone(),
        },
        r#"[8dk-deny] capability "set_light" on "desk-lamp" is not granted"#,
    );
    check(
        Refusal::Blocked {
            reason: s("no lights at night"),
        },
        "[policy] no lights at night",
    );
    check(
        Refusal::Uncountable {
            why: s("the log is full"),
        },
        "[policy] a rule with a limit cannot count this call (the log is full)",
    );
    check(
        Refusal::Input(InputError::MissingRequired(s("on"))),
        r#"[8dk-deny] missing required "on""#,
    );
    check(
        Refusal::Input(InputError::WrongType {
            key: s("brightness"),
            ty: ParamType::Number,
        }),
        r#"[8dk-deny] "brightness" must be number"#,
    );
    check(
        Refusal::Input(InputError::NotAnObject),
        "[8dk-deny] input must be an object",
    );
    check(
        Refusal::AgentRate {
            calls_per_minute: 60,
            burst: 1,
            wait_ms: 1000,
        },
        "[8dk-deny] rate limit: this agent's device calls are limited to 60 a minute, in bursts of 1; calls are allowed again in 1000 ms",
    );
    check(
        Refusal::DeviceRate {
            device_id: device_id.clone(),
            calls_per_minute: 120,
            burst: 20,
            wait_ms: 500,
        },
        r#"[8dk-deny] rate limit: this agent's calls to device "desk-lamp" are limited to 120 a minute, in bursts of 20; calls to it are allowed again in 500 ms"#,
    );
    check(
        Refusal::RunBudgetSpent {
            limit: "maxToolCalls",
            maximum: 3,
            run: s("r1"),
        },
        r#"[8dk-deny] run limit maxToolCalls of 3 exceeded: the budget of run "r1" is spent"#,
    );
    check(
        Refusal::RunBudgetMisconfigured {
            why: s("maxToolCalls must be a positive safe integer at most 256"),
        },
        "[8dk-deny] the run budget is misconfigured: maxToolCalls must be a positive safe integer at most 256",
    );
    let asks = r#""set_light" on Desk lamp asks every time"#;
    check(
        Refusal::NoApprover { reason: s(asks) },
        r#"[policy] "set_light" on Desk lamp asks every time (no approver wired)"#,
    );
    check(
        Refusal::PersonSaidNo { reason: s(asks) },
        r#"[policy] the person said no: "set_light" on Desk lamp asks every time"#,
    );
    check(
        Refusal::NotAsked {
            why: s("prompt crashed"),
            reason: s(asks),
        },
        r#"[policy] the person was not asked (prompt crashed): "set_light" on Desk lamp asks every time"#,
    );
    check(
        Refusal::RevokedMeanwhile {
            device_id: device_id.clone(),
            capability,
        },
        r#"[8dk-deny] capability "set_light" on "desk-lamp" was revoked before the call"#,
    );
    check(
        Refusal::PairingChanged {
            device_id: device_id.clone(),
        },
        r#"[8dk-deny] device "desk-lamp" was unpaired or paired again before the call"#,
    );
    check(
        Refusal::AgentGone {
            agent: s("helper"),
            tool,
        },
        r#"[8dk-deny] agent "helper" was removed or may no longer call "device__desk_lamp__set_light": the call was not made"#,
    );
    check(
        Refusal::NotConnected { device_id },
        r#"[8dk-deny] device "desk-lamp" is not connected"#,
    );
    check(
        Refusal::CountsNotKept {
            why: s("disk full"),
        },
        "[8dk-deny] the counts of rules with a limit cannot be kept (disk full): the call was not made",
    );
    check(
        Refusal::AuditStopped,
        "[8dk-deny] the audit log has stopped: no call can be recorded",
    );
}

#[test]
fn refusals_before_the_checks_read_as_they_always_have() {
    check(
        Refusal::OutOfScope {
            tool: s("device__desk_lamp__set_light"),
            agent: s("narrow"),
        },
        r#"[8dk-deny] "device__desk_lamp__set_light" is not in the scope of agent "narrow""#,
    );
    check(
        Refusal::RunLimitsWithoutRun,
        r#"[8dk-deny] _meta "dk/runLimits" is given without "dk/run""#,
    );
    check(
        Refusal::BadRunId,
        r#"[8dk-deny] _meta "dk/run" must be a run id: 1 to 128 letters, digits, '.', '_', ':' or '-'"#,
    );
    check(
        Refusal::RunLimitNotEnforced { limit: "maxTurns" },
        r#"[8dk-deny] _meta "dk/runLimits": the vessel does not enforce maxTurns; only maxToolCalls and maxWallTimeMs"#,
    );
    check(
        Refusal::BadRunLimits {
            why: s("runLimits must be an object"),
        },
        r#"[8dk-deny] _meta "dk/runLimits": runLimits must be an object"#,
    );
}

#[test]
fn a_wait_is_said_in_words_and_rounded_up() {
    let cases = [
        (0, "1 ms"),
        (850, "850 ms"),
        (1_000, "1 s"),
        (1_001, "2 s"),
        (59_000, "59 s"),
        (60_000, "1 min"),
        (2_460_000, "41 min"),
        (2_459_001, "41 min"),
        (3_599_999, "60 min"),
        (3_600_000, "1 h"),
        (7_500_000, "2 h 5 min"),
        (86_399_000, "24 h"),
        (86_400_000, "1 d"),
        (97_200_000, "1 d 3 h"),
        (604_800_000, "7 d"),
    ];
    for (ms, words) in cases {
        assert_eq!(
            wait_in_words(std::time::Duration::from_millis(ms)),
            words,
            "{ms}"
        );
    }
}

#[test]
fn a_limited_rule_says_its_wait_in_words() {
    check(
        Refusal::RuleLimited {
            reason: s("three a night"),
            wait: std::time::Duration::from_millis(7_500_000),
        },
        "[policy] three a night; calls are allowed again in 2 h 5 min",
    );
}
