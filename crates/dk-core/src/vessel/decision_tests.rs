//! The decision record's audit entry, made through the schema, against the
//! JSON the vessel spelt by hand before it: the same text for every way a
//! call can end.

use serde_json::{Value, json};

use super::Decision;
use crate::adapter::{AllowanceUse, DecisionRecord};
use crate::by::By;
use crate::redact::SecretRedactor;
use crate::store::canonical_json;

/// The entry as the vessel wrote it by hand before the schema.
fn by_hand(record: &DecisionRecord<'_>) -> Value {
    let mut entry = json!({
        "tool": record.tool, "deviceId": record.device_id, "capability": record.capability,
        "allowed": record.allowed, "reason": record.reason, "agentId": record.agent_id,
        "sessionId": record.session_id, "rule": record.rule,
    });
    let map = entry.as_object_mut().unwrap();
    if let Some(yes) = record.person_answer {
        map.insert(
            "person".into(),
            json!(if yes { "approved" } else { "refused" }),
        );
    }
    match record.allowance {
        Some(AllowanceUse::Created(id)) => {
            map.insert("allowance".into(), json!({"id": id, "created": true}));
        }
        Some(AllowanceUse::Used(id)) => {
            map.insert("person".into(), json!("remembered"));
            map.insert("allowance".into(), json!({"id": id}));
        }
        None => {}
    }
    if record.by_person {
        map.insert("caller".into(), json!("person"));
    }
    if let Some(channel) = record.channel {
        map.insert("channel".into(), json!(channel.as_str()));
    }
    if let Some(by) = record.answered_by {
        map.insert("by".into(), serde_json::to_value(by).unwrap());
    }
    if let Some(input) = record.input {
        map.insert("input".into(), input.clone());
    }
    entry
}

#[track_caller]
fn check(record: &DecisionRecord<'_>) {
    let decision = Decision::of(record, 7);
    let event = decision.audit_event(&SecretRedactor::new());
    assert_eq!(event.kind, "decision");
    assert_eq!(event.at_ms, 7);
    assert_eq!(
        canonical_json(&event.entry),
        canonical_json(&by_hand(record))
    );
}

#[test]
fn every_decision_is_the_text_it_was() {
    let input = json!({"on": true, "brightness": 40});
    let console = By::console("ab12");
    let allowed = DecisionRecord {
        tool: "device__desk_lamp__set_light",
        device_id: Some("desk-lamp"),
        capability: Some("set_light"),
        allowed: true,
        reason: "allowed",
        agent_id: Some("kitchen"),
        session_id: Some("s-1"),
        rule: None,
        input: Some(&input),
        person_answer: None,
        by_person: false,
        allowance: None,
        channel: Some(dk_proto::Channel::Dk2),
        answered_by: None,
    };
    check(&allowed);
    check(&DecisionRecord {
        tool: "nope",
        device_id: None,
        capability: None,
        allowed: false,
        reason: "[8dk-deny] unknown tool \"nope\"",
        agent_id: None,
        session_id: None,
        input: None,
        channel: None,
        ..allowed.clone()
    });
    check(&DecisionRecord {
        rule: Some("night"),
        person_answer: Some(true),
        allowance: Some(AllowanceUse::Created(3)),
        answered_by: Some(&console),
        ..allowed.clone()
    });
    check(&DecisionRecord {
        allowed: false,
        reason: "[policy] the person said no",
        rule: Some("night"),
        person_answer: Some(false),
        answered_by: Some(&console),
        ..allowed.clone()
    });
    check(&DecisionRecord {
        person_answer: Some(true),
        allowance: Some(AllowanceUse::Used(3)),
        ..allowed.clone()
    });
    check(&DecisionRecord {
        agent_id: None,
        session_id: None,
        by_person: true,
        channel: Some(dk_proto::Channel::V1),
        ..allowed
    });
}
