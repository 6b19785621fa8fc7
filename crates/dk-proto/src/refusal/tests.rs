//! Tests of the refusals: each reads as 8DK's text, byte for byte.

use super::*;
use crate::ParamType;

#[track_caller]
fn check(refusal: Refusal, text: &str) {
    assert_eq!(refusal.to_string(), text);
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
    let metered = "[8dk-deny] rate limit: this agent's device calls are limited to 6 per minute";
    check(Refusal::Metered(s(metered)), metered);
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
