//! Admission tests: the admission table in order, every default and cap at its edges, stream
//! bounds, redaction, run limits, the conformance run, the fixtures, and property tests.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const MIB: u64 = 1024 * 1024;

fn raw(policy: Value) -> RawDevicePolicy {
    RawDevicePolicy::from_json(&policy).unwrap_or_else(|e| panic!("{policy}: {e}"))
}

fn resolved(kind: DeviceClass, policy: Value) -> ResolvedPolicy {
    resolve(kind, &raw(policy.clone()), &ResolveOptions::default())
        .unwrap_or_else(|e| panic!("{policy}: {e}"))
}

/// An error as the contract states it: code string and message.
fn stated(error: &AdmissionError) -> (&'static str, String) {
    (error.code().as_str(), error.to_string())
}

/// A policy that admits an approved request with no active session.
fn open() -> Value {
    json!({"enabled": true, "sandbox": "sandbox-a", "runLimits": {}})
}

fn with(mut base: Value, patch: Value) -> Value {
    if let (Some(base), Value::Object(patch)) = (base.as_object_mut(), patch) {
        for (key, value) in patch {
            base.insert(key, value);
        }
    }
    base
}

// ---- device classes ---------------------------------------------------------------------

#[track_caller]
fn check_kind(text: &str, expected: Option<DeviceClass>) {
    match (DeviceClass::parse(text), expected) {
        (Ok(kind), Some(expected)) => {
            assert_eq!(kind, expected);
            assert_eq!(kind.to_string(), text);
            assert_eq!(text.parse::<DeviceClass>(), Ok(kind));
        }
        (Err(error), None) => assert_eq!(
            stated(&error),
            (
                "ERR_PRISM_DEVICE_INPUT",
                "device kind must be 'voice' or 'desktop-control'".to_owned()
            )
        ),
        (outcome, expected) => panic!("{text:?}: {outcome:?}, expected {expected:?}"),
    }
}

#[test]
fn device_kinds() {
    check_kind("voice", Some(DeviceClass::Voice));
    check_kind("desktop-control", Some(DeviceClass::DesktopControl));
    for bad in [
        "",
        "Voice",
        "VOICE",
        " voice",
        "voice ",
        "desktop_control",
        "desktop",
        "lamp",
    ] {
        check_kind(bad, None);
    }
}

#[test]
fn codes_print_their_strings() {
    let strings: Vec<String> = AdmissionCode::ALL.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        strings,
        [
            "ERR_PRISM_DEVICE_DISABLED",
            "ERR_PRISM_DEVICE_APPROVAL",
            "ERR_PRISM_DEVICE_SESSIONS",
            "ERR_PRISM_DEVICE_CHUNK",
            "ERR_PRISM_DEVICE_RUN_LIMITS",
            "ERR_PRISM_DEVICE_INPUT",
        ]
    );
}

// ---- resolution: defaults and caps --------------------------------------------------------

/// Resolves `policy` (with `options`) as a voice device; expects the two caps or an error.
#[track_caller]
fn check_resolve(policy: Value, options: &ResolveOptions, expected: Result<(u64, u64), &str>) {
    let outcome = RawDevicePolicy::from_json(&policy)
        .and_then(|raw| resolve(DeviceClass::Voice, &raw, options));
    match (outcome, expected) {
        (Ok(policy), Ok(caps)) => assert_eq!(
            (policy.max_chunk_bytes(), policy.max_concurrent_sessions()),
            caps
        ),
        (Err(error), Err(message)) => {
            assert_eq!(
                stated(&error),
                ("ERR_PRISM_DEVICE_INPUT", message.to_owned())
            );
        }
        (outcome, expected) => panic!("{policy}: {outcome:?}, expected {expected:?}"),
    }
}

const CHUNK_ERROR: &str = "maxChunkBytes must be a positive safe integer at most 8388608";
const SESSIONS_ERROR: &str = "maxConcurrentSessions must be a positive safe integer at most 4";

#[test]
fn max_chunk_bytes_default_and_cap() {
    let none = ResolveOptions::default();
    let chunk = |value: Value| json!({"limits": {"maxChunkBytes": value}});
    check_resolve(json!({}), &none, Ok((MIB, 1)));
    check_resolve(json!({"limits": {}}), &none, Ok((MIB, 1)));
    check_resolve(chunk(json!(null)), &none, Ok((MIB, 1)));
    check_resolve(chunk(json!(1)), &none, Ok((1, 1)));
    check_resolve(chunk(json!(8 * MIB)), &none, Ok((8 * MIB, 1)));
    check_resolve(chunk(json!(4096.0)), &none, Ok((4096, 1)));
    for bad in [
        json!(0),
        json!(8 * MIB + 1),
        json!(1.5),
        json!(-1),
        json!(-0.5),
        json!("big"),
        json!("1024"),
        json!(true),
        json!([1]),
        json!({"n": 1}),
        json!(u64::MAX),
        json!(1e300),
    ] {
        check_resolve(chunk(bad), &none, Err(CHUNK_ERROR));
    }
}

#[test]
fn max_concurrent_sessions_default_and_cap() {
    let none = ResolveOptions::default();
    let sessions = |value: Value| json!({"limits": {"maxConcurrentSessions": value}});
    check_resolve(sessions(json!(null)), &none, Ok((MIB, 1)));
    for ok in 1..=4 {
        check_resolve(sessions(json!(ok)), &none, Ok((MIB, ok)));
    }
    for bad in [
        json!(0),
        json!(5),
        json!(-1),
        json!(2.5),
        json!("2"),
        json!(false),
    ] {
        check_resolve(sessions(bad), &none, Err(SESSIONS_ERROR));
    }
    // maxChunkBytes is checked first.
    check_resolve(
        json!({"limits": {"maxChunkBytes": 0, "maxConcurrentSessions": 0}}),
        &none,
        Err(CHUNK_ERROR),
    );
}

#[test]
fn options_take_precedence_over_the_configured_limits() {
    let configured = json!({"limits": {"maxChunkBytes": 4096, "maxConcurrentSessions": 2}});
    let chunk = |bytes| ResolveOptions {
        max_chunk_bytes: Some(bytes),
        ..ResolveOptions::default()
    };
    let sessions = |n| ResolveOptions {
        max_concurrent_sessions: Some(n),
        ..ResolveOptions::default()
    };
    check_resolve(configured.clone(), &chunk(1), Ok((1, 2)));
    check_resolve(configured.clone(), &chunk(8 * MIB), Ok((8 * MIB, 2)));
    check_resolve(configured.clone(), &chunk(0), Err(CHUNK_ERROR));
    check_resolve(configured.clone(), &chunk(8 * MIB + 1), Err(CHUNK_ERROR));
    check_resolve(configured.clone(), &sessions(4), Ok((4096, 4)));
    check_resolve(configured.clone(), &sessions(5), Err(SESSIONS_ERROR));
    // A value given replaces the configured one, which is then not read.
    check_resolve(
        json!({"limits": {"maxChunkBytes": "big"}}),
        &chunk(10),
        Ok((10, 1)),
    );

    let configured_limits = json!({"runLimits": {"maxToolCalls": 10}});
    let given =
        RunLimits::from_layer(&RunLimitsLayer::new().with(RunLimit::MaxToolCalls, 3)).unwrap();
    let policy = resolve(
        DeviceClass::Voice,
        &raw(configured_limits),
        &ResolveOptions {
            run_limits: Some(given),
            ..ResolveOptions::default()
        },
    )
    .unwrap();
    assert_eq!(policy.run_limits(), Some(&given));
    let policy = resolve(
        DeviceClass::Voice,
        &raw(json!({"runLimits": {"maxTurns": 999}})),
        &ResolveOptions {
            run_limits: Some(given),
            ..ResolveOptions::default()
        },
    )
    .unwrap();
    assert_eq!(policy.run_limits(), Some(&given));
}

#[test]
fn flags_resolve_to_the_safe_side() {
    for (value, enabled) in [
        (json!(true), true),
        (json!(false), false),
        (json!(null), false),
        (json!("true"), false),
        (json!(1), false),
        (json!([true]), false),
        (json!({}), false),
    ] {
        let policy = resolved(DeviceClass::Voice, json!({"enabled": value}));
        assert_eq!(policy.enabled(), enabled, "enabled: {value}");
    }
    assert!(!resolved(DeviceClass::Voice, json!({})).enabled());
    for (value, required) in [
        (json!(false), false),
        (json!(true), true),
        (json!(null), true),
        (json!("false"), true),
        (json!(0), true),
        (json!([]), true),
    ] {
        let policy = resolved(DeviceClass::Voice, json!({"requireApproval": value}));
        assert_eq!(
            policy.requires_approval(),
            required,
            "requireApproval: {value}"
        );
    }
    assert!(resolved(DeviceClass::Voice, json!({})).requires_approval());
}

#[test]
fn sandbox_and_network_ids() {
    let policy = resolved(
        DeviceClass::DesktopControl,
        json!({"sandbox": "sb", "network": "egress-strict"}),
    );
    assert_eq!(policy.kind(), DeviceClass::DesktopControl);
    assert_eq!(policy.sandbox(), Some("sb"));
    assert_eq!(policy.network(), Some("egress-strict"));
    let empty = resolved(DeviceClass::Voice, json!({"sandbox": "", "network": ""}));
    assert_eq!((empty.sandbox(), empty.network()), (None, None));
    let null = resolved(
        DeviceClass::Voice,
        json!({"sandbox": null, "network": null}),
    );
    assert_eq!((null.sandbox(), null.network()), (None, None));
    check_resolve(
        json!({"sandbox": 7}),
        &ResolveOptions::default(),
        Err("sandbox must be a string"),
    );
    check_resolve(
        json!({"sandbox": true}),
        &ResolveOptions::default(),
        Err("sandbox must be a string"),
    );
    check_resolve(
        json!({"network": ["a"]}),
        &ResolveOptions::default(),
        Err("network must be a string"),
    );
}

#[test]
fn malformed_policies() {
    let none = ResolveOptions::default();
    for (policy, message) in [
        (json!([]), "device policy is malformed: expected an object"),
        (
            json!([true, true, "sb", null, null, {}]),
            "device policy is malformed: expected an object",
        ),
        (
            json!("voice"),
            "device policy is malformed: expected an object",
        ),
        (
            json!(null),
            "device policy is malformed: expected an object",
        ),
        (
            json!({"enable": true}),
            "device policy is malformed: unknown field `enable`",
        ),
        (
            json!({"kind": "voice"}),
            "device policy is malformed: unknown field `kind`",
        ),
        (
            json!({"limits": {"maxChunkByte": 1}}),
            "device policy is malformed: unknown field `limits.maxChunkByte`",
        ),
        (json!({"limits": 5}), "limits must be an object"),
        (json!({"limits": [1, 1]}), "limits must be an object"),
        (json!({"runLimits": 5}), "runLimits must be an object"),
        (
            json!({"runLimits": {"maxTurns": 65}}),
            "maxTurns must be a positive safe integer at most 64",
        ),
        (
            json!({"runLimits": {"maxCost": 1}}),
            "unknown run limit `maxCost`",
        ),
    ] {
        check_resolve(policy, &none, Err(message));
    }
    // `null` everywhere is absent.
    check_resolve(
        json!({"limits": null, "runLimits": null, "enabled": null}),
        &none,
        Ok((MIB, 1)),
    );
}

#[test]
fn policies_deserialise_through_serde() {
    let policy: RawDevicePolicy = serde_json::from_str(
        r#"{"enabled": true, "sandbox": "sb", "limits": {"maxChunkBytes": 2048}}"#,
    )
    .unwrap();
    assert_eq!(policy.enabled, Some(json!(true)));
    assert_eq!(
        policy.limits.and_then(|l| l.max_chunk_bytes),
        Some(json!(2048))
    );
    for bad in [r#"[true]"#, r#"{"limits": [1]}"#, r#"{"nope": 1}"#] {
        let error = serde_json::from_str::<RawDevicePolicy>(bad).unwrap_err();
        assert!(
            error.to_string().contains("must be") || error.to_string().contains("malformed"),
            "{bad}: {error}"
        );
    }
}

// ---- admission ----------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Request {
    approved: bool,
    sessions: f64,
    run_limits: bool,
}

const APPROVED: Request = Request {
    approved: true,
    sessions: 0.0,
    run_limits: true,
};

/// Admits `request` against `policy` (voice unless told); expects admission or (code, message).
#[track_caller]
fn check_admit(
    kind: DeviceClass,
    policy: Value,
    request: Request,
    expected: Result<(), (&str, &str)>,
) {
    let policy_value = policy.clone();
    let policy = resolved(kind, policy);
    let session = RunLimits::default();
    let outcome = admit(
        &policy,
        AdmissionRequest {
            approved: request.approved,
            active_sessions: request.sessions,
            run_limits: request.run_limits.then_some(&session),
        },
    );
    match (outcome, expected) {
        (Ok(admitted), Ok(())) => assert_eq!(admitted.kind(), kind),
        (Err(error), Err((code, message))) => {
            assert_eq!(
                stated(&error),
                (code, message.to_owned()),
                "{policy_value} {request:?}"
            );
        }
        (outcome, expected) => {
            panic!("{policy_value} {request:?}: {outcome:?}, expected {expected:?}")
        }
    }
}

#[test]
fn admission_table_in_order() {
    let voice = DeviceClass::Voice;
    let no_limits = Request {
        run_limits: false,
        ..APPROVED
    };
    // Row 1: not enabled.
    for enabled in [json!(false), json!(null), json!("true"), json!(1)] {
        check_admit(
            voice,
            with(open(), json!({"enabled": enabled})),
            APPROVED,
            Err((
                "ERR_PRISM_DEVICE_DISABLED",
                "voice device is disabled by default",
            )),
        );
    }
    check_admit(
        voice,
        json!({"sandbox": "sb"}),
        APPROVED,
        Err((
            "ERR_PRISM_DEVICE_DISABLED",
            "voice device is disabled by default",
        )),
    );
    // Row 2: no sandbox.
    for sandbox in [json!(null), json!("")] {
        check_admit(
            voice,
            with(open(), json!({"sandbox": sandbox})),
            APPROVED,
            Err((
                "ERR_PRISM_DEVICE_DISABLED",
                "voice device requires an explicit sandbox",
            )),
        );
    }
    // Row 3: approval required and not approved.
    let unapproved = Request {
        approved: false,
        ..APPROVED
    };
    for require in [json!(null), json!(true), json!("false"), json!(0)] {
        check_admit(
            voice,
            with(open(), json!({"requireApproval": require})),
            unapproved,
            Err((
                "ERR_PRISM_DEVICE_APPROVAL",
                "voice device side effect requires approval",
            )),
        );
    }
    check_admit(
        voice,
        with(open(), json!({"requireApproval": false})),
        unapproved,
        Ok(()),
    );
    // Row 4: activeSessions not a non-negative safe integer.
    for sessions in [
        -1.0,
        -0.5,
        0.5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        9_007_199_254_740_992.0,
    ] {
        check_admit(
            voice,
            open(),
            Request {
                sessions,
                ..APPROVED
            },
            Err((
                "ERR_PRISM_DEVICE_INPUT",
                "activeSessions must be a non-negative safe integer",
            )),
        );
    }
    check_admit(
        voice,
        open(),
        Request {
            sessions: -0.0,
            ..APPROVED
        },
        Ok(()),
    );
    // Row 5: at or over the session cap.
    for sessions in [1.0, 2.0, 9_007_199_254_740_991.0] {
        check_admit(
            voice,
            open(),
            Request {
                sessions,
                ..APPROVED
            },
            Err((
                "ERR_PRISM_DEVICE_SESSIONS",
                "concurrent voice sessions capped at 1",
            )),
        );
    }
    // Row 6: no run limits, from the policy or the request.
    check_admit(
        voice,
        json!({"enabled": true, "sandbox": "sb"}),
        no_limits,
        Err((
            "ERR_PRISM_DEVICE_RUN_LIMITS",
            "voice device must consume shared RunLimits",
        )),
    );
    check_admit(
        voice,
        json!({"enabled": true, "sandbox": "sb"}),
        APPROVED,
        Ok(()),
    );
    check_admit(voice, open(), no_limits, Ok(()));
    check_admit(voice, open(), APPROVED, Ok(()));
}

#[test]
fn session_budget_at_every_cap() {
    for cap in 1..=4u64 {
        let policy = with(open(), json!({"limits": {"maxConcurrentSessions": cap}}));
        for active in 0..=5u64 {
            let request = Request {
                sessions: active as f64,
                ..APPROVED
            };
            let message = format!("concurrent desktop-control sessions capped at {cap}");
            let expected = if active < cap {
                Ok(())
            } else {
                Err(("ERR_PRISM_DEVICE_SESSIONS", message.as_str()))
            };
            check_admit(
                DeviceClass::DesktopControl,
                policy.clone(),
                request,
                expected,
            );
        }
    }
}

#[test]
fn first_failure_wins() {
    let desktop = DeviceClass::DesktopControl;
    let everything_wrong = Request {
        approved: false,
        sessions: -1.0,
        run_limits: false,
    };
    let no_limits = json!({"limits": {"maxConcurrentSessions": 1}});
    let disabled = (
        "ERR_PRISM_DEVICE_DISABLED",
        "desktop-control device is disabled by default",
    );
    let sandbox = (
        "ERR_PRISM_DEVICE_DISABLED",
        "desktop-control device requires an explicit sandbox",
    );
    let approval = (
        "ERR_PRISM_DEVICE_APPROVAL",
        "desktop-control device side effect requires approval",
    );
    let input = (
        "ERR_PRISM_DEVICE_INPUT",
        "activeSessions must be a non-negative safe integer",
    );
    let sessions = (
        "ERR_PRISM_DEVICE_SESSIONS",
        "concurrent desktop-control sessions capped at 1",
    );
    let limits = (
        "ERR_PRISM_DEVICE_RUN_LIMITS",
        "desktop-control device must consume shared RunLimits",
    );
    check_admit(desktop, no_limits.clone(), everything_wrong, Err(disabled));
    let enabled = with(no_limits.clone(), json!({"enabled": true}));
    check_admit(desktop, enabled.clone(), everything_wrong, Err(sandbox));
    let sandboxed = with(enabled, json!({"sandbox": "sb"}));
    check_admit(desktop, sandboxed.clone(), everything_wrong, Err(approval));
    let approved = Request {
        approved: true,
        ..everything_wrong
    };
    check_admit(desktop, sandboxed.clone(), approved, Err(input));
    let at_cap = Request {
        sessions: 1.0,
        ..approved
    };
    check_admit(desktop, sandboxed.clone(), at_cap, Err(sessions));
    let under_cap = Request {
        sessions: 0.0,
        ..approved
    };
    check_admit(desktop, sandboxed.clone(), under_cap, Err(limits));
    check_admit(
        desktop,
        sandboxed,
        Request {
            run_limits: true,
            ..under_cap
        },
        Ok(()),
    );
}

#[test]
fn admitted_budget_is_the_narrower_of_policy_and_session() {
    let policy = resolved(
        DeviceClass::Voice,
        with(
            open(),
            json!({"runLimits": {"maxToolCalls": 10, "maxTurns": 50}}),
        ),
    );
    let session =
        RunLimits::from_layer(&RunLimitsLayer::new().with(RunLimit::MaxToolCalls, 100)).unwrap();
    let admitted = admit(
        &policy,
        AdmissionRequest {
            approved: true,
            active_sessions: 0.0,
            run_limits: Some(&session),
        },
    )
    .unwrap();
    assert_eq!(admitted.run_limits().get(RunLimit::MaxToolCalls), 10);
    assert_eq!(admitted.run_limits().get(RunLimit::MaxTurns), 16);
    assert_eq!(admitted.run_limits().get(RunLimit::MaxWallTimeMs), 120_000);
}

// ---- stream chunks ------------------------------------------------------------------------

/// Offers a chunk of `bytes` under a cap of `cap`; expects accepted (true/false, with size) or the CHUNK error.
#[track_caller]
fn check_chunk(cap: u64, bytes: f64, expected: Option<(bool, u64)>) {
    let policy = resolved(
        DeviceClass::Voice,
        json!({"limits": {"maxChunkBytes": cap}}),
    );
    match (accept_chunk(&policy, bytes), expected) {
        (Ok(verdict), Some((accepted, size))) => {
            assert_eq!(
                (verdict.accepted(), verdict.bytes()),
                (accepted, size),
                "{bytes}"
            );
            let marker = (!accepted).then_some("dropped_oversize");
            assert_eq!(verdict.marker(), marker);
            let shape = match marker {
                None => json!({"accepted": true, "bytes": size}),
                Some(marker) => json!({"accepted": false, "bytes": size, "marker": marker}),
            };
            assert_eq!(serde_json::to_value(verdict).unwrap(), shape);
        }
        (Err(error), None) => assert_eq!(
            stated(&error),
            (
                "ERR_PRISM_DEVICE_CHUNK",
                "chunk bytes must be a non-negative safe integer".to_owned()
            )
        ),
        (outcome, expected) => panic!("{bytes}: {outcome:?}, expected {expected:?}"),
    }
}

#[test]
fn chunk_bounds() {
    for cap in [1, 4096, MIB, 8 * MIB] {
        check_chunk(cap, 0.0, Some((true, 0)));
        check_chunk(cap, -0.0, Some((true, 0)));
        check_chunk(cap, (cap - 1) as f64, Some((true, cap - 1)));
        check_chunk(cap, cap as f64, Some((true, cap)));
        check_chunk(cap, (cap + 1) as f64, Some((false, cap + 1)));
        check_chunk(cap, 9_000_000.0, Some((false, 9_000_000)));
        check_chunk(
            cap,
            MAX_SAFE_INTEGER as f64,
            Some((false, MAX_SAFE_INTEGER)),
        );
        for bad in [
            -1.0,
            -0.5,
            0.5,
            (cap as f64) + 0.5,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            9_007_199_254_740_992.0,
            1e300,
            f64::MIN,
        ] {
            check_chunk(cap, bad, None);
        }
    }
}

// ---- redaction ----------------------------------------------------------------------------

#[track_caller]
fn check_redact(secrets: &[&str], text: &str, expected: &str) {
    let redactor = Redactor::new(secrets);
    let out = redactor.redact_str(text);
    assert_eq!(out, expected, "{secrets:?} {text:?}");
    assert_eq!(matches!(out, Cow::Borrowed(_)), text == expected);
}

#[test]
fn redaction_in_strings() {
    check_redact(&["tok"], "", "");
    check_redact(&["tok"], "nothing here", "nothing here");
    check_redact(&["tok"], "tok", "[REDACTED]");
    check_redact(&["tok"], "a tok b", "a [REDACTED] b");
    check_redact(&["tok"], "tok tok", "[REDACTED] [REDACTED]");
    check_redact(&["tok"], "toktok", "[REDACTED][REDACTED]");
    check_redact(&["tok"], "to", "to");
    check_redact(&["tok"], "ttok", "t[REDACTED]");
    // Longest first: the longer secret is not left half shown.
    check_redact(&["ab", "abc"], "abcd", "[REDACTED]d");
    check_redact(&["abc", "ab"], "ab abc", "[REDACTED] [REDACTED]");
    // Overlapping occurrences become one marker, no byte of either left.
    check_redact(&["abc", "cde"], "xabcdex", "x[REDACTED]x");
    check_redact(&["aa"], "aaa", "[REDACTED]");
    check_redact(&["aa"], "aaaa", "[REDACTED]");
    check_redact(&["bc", "abcd"], "abcde", "[REDACTED]e");
    // Duplicates and empty secrets.
    check_redact(&["tok", "tok", ""], "tok", "[REDACTED]");
    check_redact(&[""], "anything", "anything");
    check_redact(&[], "anything", "anything");
    // Not ASCII.
    check_redact(&["ключ"], "мой ключ!", "мой [REDACTED]!");
    check_redact(&["é"], "café é", "caf[REDACTED] [REDACTED]");
    check_redact(&["🔑"], "a🔑b🔑", "a[REDACTED]b[REDACTED]");
}

#[test]
fn redactor_facts() {
    let redactor = Redactor::new(["device-token", "admin-token", "", "device-token"]);
    assert_eq!(redactor.len(), 2);
    assert!(!redactor.is_empty());
    assert!(Redactor::new([""]).is_empty());
    assert!(Redactor::default().is_empty());
    let debug = format!("{redactor:?}");
    assert!(!debug.contains("token"), "{debug}");
}

/// `leaf` inside `depth` containers, arrays and objects by turns from the outside.
fn nest(depth: usize, leaf: Value) -> Value {
    (0..depth).rev().fold(leaf, |inner, i| {
        if i % 2 == 0 {
            json!([inner])
        } else {
            json!({"k": inner})
        }
    })
}

#[test]
fn redaction_in_json() {
    let redactor = Redactor::new(["s3cr3t", "agent-tok"]);
    let telemetry = json!({
        "event": "stream.open s3cr3t",
        "s3cr3t": "in a key",
        "prefix-agent-tok-suffix": {"agent-tok": ["x", "s3cr3ts3cr3t", 1, true, null, 2.5]},
        "count": 3,
        "clean": {"a": ["b", {"c": "d"}]},
    });
    assert_eq!(
        redactor.redact_json(&telemetry),
        json!({
            "event": "stream.open [REDACTED]",
            "[REDACTED]": "in a key",
            "prefix-[REDACTED]-suffix": {"[REDACTED]": ["x", "[REDACTED][REDACTED]", 1, true, null, 2.5]},
            "count": 3,
            "clean": {"a": ["b", {"c": "d"}]},
        })
    );
    // Two keys that redact alike: the later member wins.
    assert_eq!(
        redactor.redact_json(&json!({"s3cr3t": 1, "agent-tok": 2})),
        json!({"[REDACTED]": 2})
    );
    // Scalars at the top.
    assert_eq!(redactor.redact_json(&json!("s3cr3t")), json!("[REDACTED]"));
    assert_eq!(redactor.redact_json(&json!(7)), json!(7));
}

#[test]
fn redaction_depth_cap() {
    let redactor = Redactor::new(["s3cr3t"]);
    assert_eq!(MAX_TELEMETRY_DEPTH, 32);
    // A leaf inside 32 containers is at depth 32: kept (and redacted).
    assert_eq!(
        redactor.redact_json(&nest(32, json!("s3cr3t"))),
        nest(32, json!("[REDACTED]"))
    );
    assert_eq!(
        redactor.redact_json(&nest(32, json!(1))),
        nest(32, json!(1))
    );
    // Inside 33, it is at depth 33: replaced, whatever it was.
    for leaf in [
        json!("s3cr3t"),
        json!(1),
        json!(null),
        json!([]),
        json!({"s3cr3t": 1}),
    ] {
        assert_eq!(
            redactor.redact_json(&nest(33, leaf)),
            nest(33, json!("[MaxDepth]"))
        );
    }
    assert_eq!(
        redactor.redact_json(&nest(100, json!("x"))),
        nest(33, json!("[MaxDepth]"))
    );
    // An empty redactor still caps the depth.
    assert_eq!(
        Redactor::default().redact_json(&nest(34, json!("x"))),
        nest(33, json!("[MaxDepth]"))
    );
}

#[test]
fn without_a_redactor_telemetry_passes_unchanged() {
    for telemetry in [
        json!({"token": "s3cr3t", "s3cr3t": 1}),
        nest(100, json!("s3cr3t")),
        json!("s3cr3t"),
        json!(null),
    ] {
        assert_eq!(redact_telemetry(None, &telemetry), telemetry);
    }
    let redactor = Redactor::new(["s3cr3t"]);
    assert_eq!(
        redact_telemetry(Some(&redactor), &json!({"s3cr3t": "s3cr3t"})),
        json!({"[REDACTED]": "[REDACTED]"})
    );
}

// ---- run limits ---------------------------------------------------------------------------

#[test]
fn run_limit_defaults_and_caps() {
    let table: Vec<(&str, u64, u64)> = RunLimit::ALL
        .iter()
        .map(|l| (l.name(), l.default_value(), l.hard_cap()))
        .collect();
    assert_eq!(
        table,
        [
            ("maxTurns", 16, 64),
            ("maxProviderAttempts", 24, 256),
            ("maxToolRounds", 8, 64),
            ("maxToolCalls", 32, 256),
            ("maxWallTimeMs", 120_000, 1_800_000),
            ("maxRequestBytes", 8 * MIB, 64 * MIB),
            ("maxResponseBytes", 8 * MIB, 64 * MIB),
            ("maxInputTokens", 40_000, 1_000_000),
            ("maxOutputTokens", 10_000, 250_000),
            ("maxTotalTokens", 50_000, 1_000_000),
        ]
    );
    let defaults = RunLimits::default();
    for limit in RunLimit::ALL {
        assert_eq!(defaults.get(limit), limit.default_value());
        assert_eq!(RunLimit::from_name(limit.name()), Some(limit));
        assert_eq!(limit.to_string(), limit.name());
    }
    assert_eq!(RunLimit::from_name("maxCost"), None);
}

#[track_caller]
fn check_layer(layer: Value, expected: Result<&[(RunLimit, u64)], &str>) {
    let outcome = RunLimitsLayer::from_json(&layer).and_then(|l| RunLimits::from_layer(&l));
    match (outcome, expected) {
        (Ok(limits), Ok(set)) => {
            for limit in RunLimit::ALL {
                let want = set
                    .iter()
                    .find(|(l, _)| *l == limit)
                    .map_or(limit.default_value(), |(_, v)| *v);
                assert_eq!(limits.get(limit), want, "{layer} {limit}");
            }
        }
        (Err(error), Err(message)) => assert_eq!(error.to_string(), message),
        (outcome, expected) => panic!("{layer}: {outcome:?}, expected {expected:?}"),
    }
}

#[test]
fn run_limit_layers_at_and_past_each_cap() {
    check_layer(json!({}), Ok(&[]));
    check_layer(json!({"maxTurns": null}), Ok(&[]));
    for limit in RunLimit::ALL {
        let name = limit.name();
        let cap = limit.hard_cap();
        let message = format!("{name} must be a positive safe integer at most {cap}");
        check_layer(json!({ name: 1 }), Ok(&[(limit, 1)]));
        check_layer(json!({ name: cap }), Ok(&[(limit, cap)]));
        check_layer(json!({ name: cap as f64 }), Ok(&[(limit, cap)]));
        for bad in [
            json!(0),
            json!(cap + 1),
            json!(-1),
            json!(1.5),
            json!("8"),
            json!(true),
            json!(f64::MAX),
        ] {
            check_layer(json!({ name: bad }), Err(&message));
        }
    }
    check_layer(
        json!({"maxTurns": 8, "maxToolCalls": 50}),
        Ok(&[(RunLimit::MaxTurns, 8), (RunLimit::MaxToolCalls, 50)]),
    );
    check_layer(json!({"maxTurn": 8}), Err("unknown run limit `maxTurn`"));
    check_layer(json!([8]), Err("runLimits must be an object"));
    check_layer(json!(null), Err("runLimits must be an object"));
}

#[test]
fn run_level_layers_only_narrow() {
    let calls = |n| RunLimitsLayer::new().with(RunLimit::MaxToolCalls, n);
    let get = |limits: Result<RunLimits, InputError>| limits.unwrap().get(RunLimit::MaxToolCalls);
    // Narrower run layer: taken.
    assert_eq!(get(narrow(Some(&calls(100)), Some(&calls(10)))), 10);
    // Wider run layer: clamped to the agent's.
    assert_eq!(get(narrow(Some(&calls(10)), Some(&calls(100)))), 10);
    // An agent layer that does not set the limit: the default stands in for it.
    assert_eq!(
        get(narrow(Some(&RunLimitsLayer::new()), Some(&calls(100)))),
        32
    );
    assert_eq!(
        get(narrow(Some(&RunLimitsLayer::new()), Some(&calls(5)))),
        5
    );
    // A run layer alone replaces the default, up to the cap.
    assert_eq!(get(narrow(None, Some(&calls(100)))), 100);
    assert_eq!(get(narrow(Some(&calls(100)), None)), 100);
    assert_eq!(narrow(None, None), Ok(RunLimits::default()));
    // Either layer out of range is refused, not clamped.
    let over = InputError::RunLimit {
        limit: RunLimit::MaxToolCalls,
    };
    assert_eq!(
        narrow(Some(&calls(257)), Some(&calls(1))),
        Err(over.clone())
    );
    assert_eq!(
        narrow(Some(&calls(10)), Some(&calls(257))),
        Err(over.clone())
    );
    assert_eq!(narrow(None, Some(&calls(0))), Err(over));
    // narrowed_by never widens either side.
    let a = RunLimits::from_layer(&calls(10).with(RunLimit::MaxTurns, 60)).unwrap();
    let b = RunLimits::from_layer(&calls(20).with(RunLimit::MaxTurns, 4)).unwrap();
    let both = a.narrowed_by(&b);
    assert_eq!(
        (
            both.get(RunLimit::MaxToolCalls),
            both.get(RunLimit::MaxTurns)
        ),
        (10, 4)
    );
    assert_eq!(b.narrowed_by(&a), both);
}

#[test]
fn every_counting_limit_allows_reaching_it_and_refuses_going_past() {
    for limit in RunLimit::ALL {
        let maximum = limit.hard_cap().min(1000);
        let limits = RunLimits::from_layer(&RunLimitsLayer::new().with(limit, maximum)).unwrap();
        let mut tracker = RunTracker::new(limits, 0);
        if limit.is_per_frame() {
            // Each frame on its own: many frames at the limit pass.
            for _ in 0..3 {
                assert_eq!(tracker.charge(limit, maximum), Ok(()), "{limit}");
            }
            assert_eq!(tracker.count(limit), 3 * maximum);
            let breach = tracker.charge(limit, maximum + 1).unwrap_err();
            assert_eq!(
                (breach.limit, breach.maximum, breach.observed),
                (limit, maximum, maximum + 1)
            );
        } else {
            assert_eq!(tracker.charge(limit, maximum - 1), Ok(()), "{limit}");
            assert_eq!(tracker.charge(limit, 1), Ok(()), "{limit}");
            assert_eq!(tracker.charge(limit, 0), Ok(()), "{limit}");
            let breach = tracker.charge(limit, 1).unwrap_err();
            assert_eq!(
                (breach.limit, breach.maximum, breach.observed),
                (limit, maximum, maximum + 1)
            );
        }
        assert_eq!(
            tracker.breach().map(|b| b.to_string()),
            Some(format!("run limit {} of {maximum} exceeded", limit.name()))
        );
    }
}

#[test]
fn tool_calls_are_charged_one_by_one() {
    let mut tracker = RunTracker::new(RunLimits::default(), 1_000);
    for _ in 0..32 {
        assert_eq!(tracker.charge_tool_call(), Ok(()));
    }
    let breach = tracker.charge_tool_call().unwrap_err();
    assert_eq!(breach.to_string(), "run limit maxToolCalls of 32 exceeded");
    assert_eq!(tracker.count(RunLimit::MaxToolCalls), 33);

    let mut tracker = RunTracker::new(RunLimits::default(), 0);
    for _ in 0..16 {
        tracker.charge_turn().unwrap();
    }
    for _ in 0..8 {
        tracker.charge_tool_round().unwrap();
    }
    for _ in 0..24 {
        tracker.charge_provider_attempt().unwrap();
    }
    assert_eq!(
        tracker.charge_tool_round().unwrap_err().to_string(),
        "run limit maxToolRounds of 8 exceeded"
    );
}

#[test]
fn only_the_first_breach_is_reported() {
    let mut tracker = RunTracker::new(RunLimits::default(), 0);
    // Input and total both go past: input is charged first and reported.
    let first = tracker.charge_usage(40_001, 20_000).unwrap_err();
    assert_eq!(
        first.to_string(),
        "run limit maxInputTokens of 40000 exceeded"
    );
    assert_eq!(tracker.count(RunLimit::MaxOutputTokens), 0);
    // The tracker is spent: later charges are refused with the same breach and not counted.
    assert_eq!(tracker.charge_tool_call(), Err(first));
    assert_eq!(tracker.charge_response_bytes(10 * MIB), Err(first));
    assert_eq!(tracker.check_wall_time(10_000_000), Err(first));
    assert_eq!(tracker.count(RunLimit::MaxToolCalls), 0);
    assert_eq!(tracker.breach(), Some(first));

    let total =
        RunLimits::from_layer(&RunLimitsLayer::new().with(RunLimit::MaxTotalTokens, 100)).unwrap();
    let mut tracker = RunTracker::new(total, 0);
    tracker.charge_usage(60, 40).unwrap();
    assert_eq!(
        tracker.charge_usage(0, 1).unwrap_err().to_string(),
        "run limit maxTotalTokens of 100 exceeded"
    );
    assert_eq!(tracker.count(RunLimit::MaxOutputTokens), 41);
    assert_eq!(tracker.count(RunLimit::MaxTotalTokens), 101);

    let mut tracker = RunTracker::new(RunLimits::default(), 0);
    tracker.charge_request_bytes(8 * MIB).unwrap();
    assert_eq!(
        tracker
            .charge_request_bytes(8 * MIB + 1)
            .unwrap_err()
            .to_string(),
        "run limit maxRequestBytes of 8388608 exceeded"
    );
    // Overflowing counts saturate and breach, never wrap.
    let mut tracker = RunTracker::new(RunLimits::default(), 0);
    tracker.charge(RunLimit::MaxToolCalls, 1).unwrap();
    assert_eq!(
        tracker
            .charge(RunLimit::MaxToolCalls, u64::MAX)
            .unwrap_err()
            .observed,
        u64::MAX
    );
}

#[test]
fn wall_time_from_a_clock_passed_in() {
    let mut tracker = RunTracker::new(RunLimits::default(), 5_000);
    assert_eq!(tracker.check_wall_time(0), Ok(()));
    assert_eq!(tracker.count(RunLimit::MaxWallTimeMs), 0);
    assert_eq!(tracker.check_wall_time(5_000 + 60_000), Ok(()));
    assert_eq!(tracker.check_wall_time(5_000 + 120_000), Ok(()));
    assert_eq!(tracker.count(RunLimit::MaxWallTimeMs), 120_000);
    let breach = tracker.check_wall_time(5_000 + 120_001).unwrap_err();
    assert_eq!(
        breach.to_string(),
        "run limit maxWallTimeMs of 120000 exceeded"
    );
    assert_eq!(breach.observed, 120_001);
    assert_eq!(tracker.limits(), &RunLimits::default());
}

// ---- conformance --------------------------------------------------------------------------

fn config(kind: DeviceClass, policy: Value) -> DeviceConfig {
    DeviceConfig {
        kind,
        policy: raw(policy),
    }
}

#[test]
fn conforming_configurations_pass_every_case_in_order() {
    let options = ResolveOptions::default();
    for kind in DeviceClass::ALL {
        for policy in [
            json!({}),
            json!({"enabled": true, "sandbox": "sb"}),
            json!({"requireApproval": false, "network": "egress"}),
            json!({"limits": {"maxChunkBytes": 1, "maxConcurrentSessions": 4}}),
            json!({"limits": {"maxChunkBytes": 8 * MIB}, "runLimits": {"maxToolCalls": 1}}),
        ] {
            assert_eq!(
                run_device_policy_conformance(&config(kind, policy.clone()), &options),
                Ok(CONFORMANCE_CASES.to_vec()),
                "{kind} {policy}"
            );
        }
    }
    assert_eq!(
        CONFORMANCE_CASES,
        [
            "denial-by-default",
            "approval-gate",
            "session-budget",
            "run-accounting",
            "stream-bounds",
            "redaction"
        ]
    );
    let given = ResolveOptions {
        max_chunk_bytes: Some(2),
        max_concurrent_sessions: Some(3),
        run_limits: Some(RunLimits::default()),
    };
    assert_eq!(
        run_device_policy_conformance(&config(DeviceClass::Voice, json!({})), &given),
        Ok(CONFORMANCE_CASES.to_vec())
    );
}

/// One way an adapter's gate can be wrong.
#[derive(Clone, Copy, Debug)]
enum Fault {
    AdmitsWhenDisabled,
    ApprovesItself,
    IgnoresSessions,
    BringsItsOwnRunLimits,
    ForwardsOversize,
    DropsAtTheCap,
    LeaksSecrets,
    RedactsWithoutRedactor,
}

struct Faulty {
    config: DeviceConfig,
    fault: Fault,
    open: ResolvedPolicy,
}

impl DeviceAdapter for Faulty {
    fn kind(&self) -> DeviceClass {
        self.config.kind
    }

    fn policy(&self) -> &RawDevicePolicy {
        &self.config.policy
    }

    fn admit(
        &self,
        policy: &ResolvedPolicy,
        request: AdmissionRequest<'_>,
    ) -> Result<Admitted, AdmissionError> {
        let session = RunLimits::default();
        match self.fault {
            Fault::AdmitsWhenDisabled => admit(&self.open, request),
            Fault::ApprovesItself => admit(
                policy,
                AdmissionRequest {
                    approved: true,
                    ..request
                },
            ),
            Fault::IgnoresSessions => admit(
                policy,
                AdmissionRequest {
                    active_sessions: 0.0,
                    ..request
                },
            ),
            Fault::BringsItsOwnRunLimits => admit(
                policy,
                AdmissionRequest {
                    run_limits: Some(&session),
                    ..request
                },
            ),
            _ => admit(policy, request),
        }
    }

    fn accept_chunk(
        &self,
        policy: &ResolvedPolicy,
        bytes: f64,
    ) -> Result<ChunkVerdict, AdmissionError> {
        let verdict = accept_chunk(policy, bytes)?;
        Ok(match self.fault {
            Fault::ForwardsOversize => ChunkVerdict::Accepted {
                bytes: verdict.bytes(),
            },
            Fault::DropsAtTheCap if verdict.bytes() >= policy.max_chunk_bytes() => {
                ChunkVerdict::DroppedOversize {
                    bytes: verdict.bytes(),
                }
            }
            _ => verdict,
        })
    }

    fn redact_telemetry(&self, redactor: Option<&Redactor>, telemetry: &Value) -> Value {
        match self.fault {
            Fault::LeaksSecrets => telemetry.clone(),
            Fault::RedactsWithoutRedactor => Redactor::new(["ok"]).redact_json(telemetry),
            _ => redact_telemetry(redactor, telemetry),
        }
    }
}

#[track_caller]
fn check_conformance_fails(
    adapter: &dyn DeviceAdapter,
    options: &ResolveOptions,
    case: &str,
    code: AdmissionCode,
    reason: &str,
) {
    let failure = run_device_policy_conformance(adapter, options).unwrap_err();
    assert_eq!(
        (failure.case, failure.code, failure.reason.as_str()),
        (case, code, reason)
    );
    assert_eq!(
        failure.to_string(),
        format!(
            "conformance case {case} failed with {}: {reason}",
            code.as_str()
        )
    );
}

#[test]
fn each_conformance_case_fails_a_faulty_adapter_with_its_code() {
    let options = ResolveOptions::default();
    let open = resolved(
        DeviceClass::Voice,
        json!({"enabled": true, "sandbox": "sb", "requireApproval": false, "runLimits": {}}),
    );
    let faulty = |fault| Faulty {
        config: config(DeviceClass::Voice, json!({"sandbox": "sb"})),
        fault,
        open: open.clone(),
    };
    for (fault, case, code, reason) in [
        (
            Fault::AdmitsWhenDisabled,
            "denial-by-default",
            AdmissionCode::Disabled,
            "a disabled device was admitted",
        ),
        (
            Fault::ApprovesItself,
            "approval-gate",
            AdmissionCode::Approval,
            "an unapproved side effect was admitted",
        ),
        (
            Fault::IgnoresSessions,
            "session-budget",
            AdmissionCode::Sessions,
            "a session over the cap was admitted",
        ),
        (
            Fault::BringsItsOwnRunLimits,
            "run-accounting",
            AdmissionCode::RunLimits,
            "a session without run limits was admitted",
        ),
        (
            Fault::ForwardsOversize,
            "stream-bounds",
            AdmissionCode::Chunk,
            "an oversize chunk of 1048577 bytes was not dropped",
        ),
        (
            Fault::DropsAtTheCap,
            "stream-bounds",
            AdmissionCode::Chunk,
            "a chunk of exactly 1048576 bytes was not accepted",
        ),
        (
            Fault::LeaksSecrets,
            "redaction",
            AdmissionCode::Input,
            "a secret survived telemetry redaction",
        ),
        (
            Fault::RedactsWithoutRedactor,
            "redaction",
            AdmissionCode::Input,
            "telemetry changed without a redactor",
        ),
    ] {
        check_conformance_fails(&faulty(fault), &options, case, code, reason);
    }
}

#[test]
fn configurations_that_fail_conformance() {
    let options = ResolveOptions::default();
    let voice = |policy| config(DeviceClass::Voice, policy);
    // An empty sandbox stays empty: the approval gate meets DISABLED, not APPROVAL.
    check_conformance_fails(
        &voice(json!({"sandbox": ""})),
        &options,
        "approval-gate",
        AdmissionCode::Approval,
        "an unapproved side effect was refused with ERR_PRISM_DEVICE_DISABLED (voice device requires an explicit sandbox), not ERR_PRISM_DEVICE_APPROVAL",
    );
    // A policy that does not resolve fails the first case with INPUT.
    check_conformance_fails(
        &voice(json!({"limits": {"maxChunkBytes": 0}})),
        &options,
        "denial-by-default",
        AdmissionCode::Input,
        CHUNK_ERROR,
    );
    check_conformance_fails(
        &voice(json!({"sandbox": 5})),
        &options,
        "denial-by-default",
        AdmissionCode::Input,
        "sandbox must be a string",
    );
    check_conformance_fails(
        &voice(json!({})),
        &ResolveOptions {
            max_concurrent_sessions: Some(5),
            ..ResolveOptions::default()
        },
        "denial-by-default",
        AdmissionCode::Input,
        SESSIONS_ERROR,
    );
    // A bad run-limit layer: the policy as configured does not resolve.
    check_conformance_fails(
        &voice(json!({"runLimits": {"maxTurns": 0}})),
        &options,
        "denial-by-default",
        AdmissionCode::Input,
        "maxTurns must be a positive safe integer at most 64",
    );
}

// ---- fixtures -----------------------------------------------------------------------------

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/admission")
        .join(kind);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "{}", dir.display());
    out
}

fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `good/*.json`: `kind`, `policy`, and `expect` (`maxChunkBytes`, `maxConcurrentSessions`,
/// and `admit`: `"ok"` or the `{code, message}` of an unapproved request with no active session
/// and no session budget),
/// and, when the conformance run fails, its `conformance` `{case, code}`; else it passes.
#[test]
fn good_fixtures() {
    for path in fixtures("good") {
        let doc = read(&path);
        let name = path.display();
        let kind = DeviceClass::parse(doc["kind"].as_str().unwrap()).unwrap();
        let raw =
            RawDevicePolicy::from_json(&doc["policy"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let policy = resolve(kind, &raw, &ResolveOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let expect = &doc["expect"];
        assert_eq!(
            Some(policy.max_chunk_bytes()),
            expect["maxChunkBytes"].as_u64(),
            "{name}"
        );
        assert_eq!(
            Some(policy.max_concurrent_sessions()),
            expect["maxConcurrentSessions"].as_u64(),
            "{name}"
        );
        let outcome = admit(
            &policy,
            AdmissionRequest {
                approved: false,
                active_sessions: 0.0,
                run_limits: None,
            },
        );
        match (&outcome, &expect["admit"]) {
            (Ok(_), Value::String(ok)) if ok == "ok" => {}
            (Err(error), Value::Object(want)) => assert_eq!(
                (json!(error.code().as_str()), json!(error.to_string())),
                (want["code"].clone(), want["message"].clone()),
                "{name}"
            ),
            (outcome, want) => panic!("{name}: {outcome:?}, expected {want}"),
        }
        let adapter = DeviceConfig { kind, policy: raw };
        let conformance = run_device_policy_conformance(&adapter, &ResolveOptions::default());
        match (conformance, doc.get("conformance")) {
            (Ok(passed), None) => assert_eq!(passed, CONFORMANCE_CASES.to_vec(), "{name}"),
            (Err(failure), Some(want)) => assert_eq!(
                (json!(failure.case), json!(failure.code.as_str())),
                (want["case"].clone(), want["code"].clone()),
                "{name}"
            ),
            (outcome, want) => panic!("{name}: {outcome:?}, expected {want:?}"),
        }
    }
}

/// `bad/*.json`: `kind`, `policy`, and the `error` (`code`, `message`) it is refused with.
#[test]
fn bad_fixtures() {
    for path in fixtures("bad") {
        let doc = read(&path);
        let name = path.display();
        let outcome = doc["kind"]
            .as_str()
            .map_or(
                Err(AdmissionError::Input(InputError::UnknownKind)),
                DeviceClass::parse,
            )
            .and_then(|kind| {
                let raw = RawDevicePolicy::from_json(&doc["policy"])?;
                resolve(kind, &raw, &ResolveOptions::default())
            });
        let error = outcome.err().unwrap_or_else(|| panic!("{name} resolved"));
        assert_eq!(json!(error.code().as_str()), doc["error"]["code"], "{name}");
        assert_eq!(json!(error.to_string()), doc["error"]["message"], "{name}");
    }
}

// ---- properties ---------------------------------------------------------------------------

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just(0.0),
            Just(1.0),
            Just(4.0),
            Just(1.5),
            Just(-1.0),
            Just(8_388_608.0),
            Just(8_388_609.0)
        ]
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
        prop_oneof![Just("voice"), Just("desktop-control"), Just(""), Just("sb")]
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("enabled".to_owned()),
        Just("requireApproval".to_owned()),
        Just("sandbox".to_owned()),
        Just("network".to_owned()),
        Just("limits".to_owned()),
        Just("maxChunkBytes".to_owned()),
        Just("maxConcurrentSessions".to_owned()),
        Just("runLimits".to_owned()),
        Just("maxTurns".to_owned()),
        Just("maxToolCalls".to_owned()),
        "[a-z]{1,6}",
    ]
}

/// A policy-shaped object whose every field holds an arbitrary value.
fn policy_json() -> impl Strategy<Value = Value> {
    (
        prop::option::of(any_json()),
        prop::option::of(any_json()),
        prop::option::of(any_json()),
        prop::option::of(any_json()),
        prop::option::of((prop::option::of(any_json()), prop::option::of(any_json()))),
        prop::option::of(any_json()),
    )
        .prop_map(
            |(enabled, approval, sandbox, network, limits, run_limits)| {
                let mut out = serde_json::Map::new();
                let mut put = |key: &str, value: Option<Value>| {
                    if let Some(value) = value {
                        out.insert(key.to_owned(), value);
                    }
                };
                put("enabled", enabled);
                put("requireApproval", approval);
                put("sandbox", sandbox);
                put("network", network);
                put(
                    "limits",
                    limits.map(|(chunk, sessions)| {
                        let mut limits = serde_json::Map::new();
                        if let Some(chunk) = chunk {
                            limits.insert("maxChunkBytes".to_owned(), chunk);
                        }
                        if let Some(sessions) = sessions {
                            limits.insert("maxConcurrentSessions".to_owned(), sessions);
                        }
                        Value::Object(limits)
                    }),
                );
                put("runLimits", run_limits);
                Value::Object(out)
            },
        )
}

/// The contract's admission as a plain list of checks, straight from the spec's table.
fn model_admission(
    policy: &ResolvedPolicy,
    approved: bool,
    sessions: f64,
    has_limits: bool,
) -> Option<AdmissionCode> {
    let checks = [
        (!policy.enabled(), AdmissionCode::Disabled),
        (policy.sandbox().is_none(), AdmissionCode::Disabled),
        (
            policy.requires_approval() && !approved,
            AdmissionCode::Approval,
        ),
        (
            !(sessions.is_finite()
                && sessions.fract() == 0.0
                && (0.0..=9_007_199_254_740_991.0).contains(&sessions)),
            AdmissionCode::Input,
        ),
        (
            sessions >= policy.max_concurrent_sessions() as f64,
            AdmissionCode::Sessions,
        ),
        (
            !has_limits && policy.run_limits().is_none(),
            AdmissionCode::RunLimits,
        ),
    ];
    checks
        .into_iter()
        .find(|(failed, _)| *failed)
        .map(|(_, code)| code)
}

fn sessions_count() -> impl Strategy<Value = f64> {
    prop_oneof![
        (0u8..6).prop_map(f64::from),
        any::<f64>(),
        Just(f64::NAN),
        Just(-0.0),
        Just(0.5),
        Just(-1.0),
    ]
}

/// Random text over `abcxyz` with secrets (over `abc`) planted in it.
fn text_with_secrets() -> impl Strategy<Value = (Vec<String>, String)> {
    (
        prop::collection::vec("[abc]{1,5}", 1..6),
        prop::collection::vec(("[abcxyz]{0,4}", any::<prop::sample::Index>()), 0..8),
    )
        .prop_map(|(secrets, pieces)| {
            let mut text = String::new();
            for (filler, index) in pieces {
                text.push_str(&filler);
                text.push_str(index.get::<String>(&secrets));
            }
            (secrets, text)
        })
}

/// Redaction done the slow way: mark every occurrence, merge the overlapping ones.
fn model_redact(secrets: &[String], text: &str) -> String {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for start in 0..text.len() {
        for secret in secrets.iter().filter(|s| !s.is_empty()) {
            if text[start..].starts_with(secret.as_str()) {
                spans.push((start, start + secret.len()));
            }
        }
    }
    spans.sort();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start < last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let mut out = String::new();
    let mut at = 0;
    for (start, end) in merged {
        out.push_str(&text[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

proptest! {
    #[test]
    fn resolve_and_admit_never_panic_on_arbitrary_json(
        doc in prop_oneof![any_json(), policy_json()],
        approved in any::<bool>(),
        sessions in sessions_count(),
        chunk in any::<f64>(),
        with_limits in any::<bool>(),
    ) {
        let session = RunLimits::default();
        for kind in DeviceClass::ALL {
            let Ok(raw) = RawDevicePolicy::from_json(&doc) else { continue };
            let Ok(policy) = resolve(kind, &raw, &ResolveOptions::default()) else { continue };
            prop_assert!((1..=HARD_MAX_CHUNK_BYTES).contains(&policy.max_chunk_bytes()));
            prop_assert!((1..=HARD_MAX_CONCURRENT_SESSIONS).contains(&policy.max_concurrent_sessions()));
            let request = AdmissionRequest {
                approved,
                active_sessions: sessions,
                run_limits: with_limits.then_some(&session),
            };
            let outcome = admit(&policy, request).err().map(|e| e.code());
            prop_assert_eq!(outcome, model_admission(&policy, approved, sessions, with_limits));
            if let Ok(verdict) = accept_chunk(&policy, chunk) {
                prop_assert_eq!(verdict.accepted(), verdict.bytes() <= policy.max_chunk_bytes());
                prop_assert_eq!(verdict.bytes() as f64, chunk);
            }
        }
        fuzz_admission(doc.to_string().as_bytes());
    }

    #[test]
    fn fuzz_hook_never_panics(data in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzz_admission(&data);
    }

    #[test]
    fn redaction_removes_every_secret((secrets, text) in text_with_secrets()) {
        let redactor = Redactor::new(&secrets);
        let out = redactor.redact_str(&text);
        for secret in &secrets {
            prop_assert!(!out.contains(secret.as_str()), "{secret:?} in {out:?}");
        }
        let model = model_redact(&secrets, &text);
        prop_assert_eq!(out.as_ref(), model.as_str());
        // The same text as a key and inside nested values.
        let telemetry = json!({ text.clone(): [text.clone(), {"k": text.clone()}] });
        let redacted = redactor.redact_json(&telemetry).to_string();
        for secret in &secrets {
            prop_assert!(!redacted.contains(secret.as_str()), "{secret:?} in {redacted}");
        }
    }

    #[test]
    fn text_without_secrets_is_unchanged(
        secrets in prop::collection::vec("[abc]{1,5}", 0..6),
        text in "[xyz ]{0,40}",
    ) {
        let redactor = Redactor::new(&secrets);
        prop_assert!(matches!(redactor.redact_str(&text), Cow::Borrowed(t) if t == text));
        let telemetry = json!({ text.clone(): [text.clone(), 1, null] });
        prop_assert_eq!(redactor.redact_json(&telemetry), telemetry);
    }

    #[test]
    fn narrowing_never_widens(
        agent in prop::collection::vec(prop::option::of(1u64..=300), 10),
        run in prop::collection::vec(prop::option::of(1u64..=300), 10),
    ) {
        let layer = |values: &[Option<u64>]| {
            let mut layer = RunLimitsLayer::new();
            for (limit, value) in RunLimit::ALL.into_iter().zip(values) {
                layer.set(limit, value.map(|v| v.min(limit.hard_cap())));
            }
            layer
        };
        let (agent, run) = (layer(&agent), layer(&run));
        let agent_alone = narrow(Some(&agent), None).unwrap();
        let both = narrow(Some(&agent), Some(&run)).unwrap();
        for limit in RunLimit::ALL {
            prop_assert!(both.get(limit) <= agent_alone.get(limit));
            if let Some(asked) = run.get(limit) {
                prop_assert!(both.get(limit) <= asked);
            }
        }
    }
}
