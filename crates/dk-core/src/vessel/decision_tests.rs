//! The decision record's audit entry, made through the schema, against the
//! JSON the vessel spelt by hand before it: the same text for every way a
//! call can end.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::Decision;
use crate::adapter::{AllowanceUse, DecisionRecord};
use crate::by::By;
use crate::redact::SecretRedactor;
use crate::redact::tests::{random_hex, vessel_knowing_tokens_by_hash};
use crate::store::{AuditText, Made, canonical_json};

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
    // What the writer commits: the text written straight from the record.
    let Made::Text(text) = decision.audit_made(&SecretRedactor::new()) else {
        panic!("a plain record goes the straight way");
    };
    assert_eq!(text, AuditText::of(&event).unwrap());
}

/// The writer's text of a decision, whichever way it was made.
fn text_of(made: Made) -> AuditText {
    match made {
        Made::Text(text) => text,
        Made::Event(event) => AuditText::of(&event).unwrap(),
    }
}

/// Texts for a record: plain, escaped, holding a secret, long enough to be
/// cut, hex runs the token lookup reads.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{1,12}",
        "[a-z \"\\\\\u{1}é]{0,10}s3cret[a-z]{0,4}",
        "[a-z]{0,3}approved",
        "[a-zé]{250,262}",
        "[0-9a-f]{64,70}",
        "\\PC{0,16}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The text the writer commits is the text of the decision's event,
    /// whatever the record holds and whatever secrets are known: the
    /// straight way when it can, the JSON way when a text must be cut or
    /// redaction would change a key or a named value.
    #[test]
    fn the_straight_text_is_the_events_text(
        texts in proptest::collection::vec(text(), 9),
        present in proptest::collection::vec(any::<bool>(), 6),
        (allowed, by_person) in (any::<bool>(), any::<bool>()),
        person_answer in proptest::option::of(any::<bool>()),
        allowance in proptest::option::of((any::<bool>(), 0u64..100)),
        secrets in prop_oneof![
            Just(vec![]),
            Just(vec!["s3cret"]),
            Just(vec!["s3cret", "evice"]),
            Just(vec!["approved"]),
            Just(vec!["onsol"]),
            Just(vec!["id"]),
        ],
        tokens in any::<bool>(),
    ) {
        let redactor = SecretRedactor::new();
        for secret in secrets {
            redactor.add_secret(secret);
        }
        if tokens {
            redactor.watch_tokens(
                &std::sync::Arc::new(crate::registry::DeviceRegistry::new()),
                &std::sync::Arc::new(crate::agents::AgentDirectory::new()),
            );
        }
        let t = |i: usize| texts.get(i).map_or("", String::as_str);
        let some = |i: usize| present.get(i).copied().unwrap_or(false).then(|| t(i));
        let input = json!({"on": true, "note": t(8)});
        let by = By::console(t(7));
        let record = DecisionRecord {
            tool: t(0),
            device_id: some(1),
            capability: some(2),
            allowed,
            reason: t(3),
            agent_id: some(4),
            session_id: some(5),
            rule: Some(t(6)),
            input: present.first().copied().unwrap_or(false).then_some(&input),
            person_answer,
            by_person,
            allowance: allowance.map(|(made, id)| {
                if made { AllowanceUse::Created(id) } else { AllowanceUse::Used(id) }
            }),
            channel: Some(dk_proto::Channel::Dk2),
            answered_by: person_answer.is_some().then_some(&by),
        };
        let decision = Decision::of(&record, 9);
        let event = decision.audit_event(&redactor);
        prop_assert_eq!(text_of(decision.audit_made(&redactor)), AuditText::of(&event).unwrap());
    }
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

/// A record whose texts are long hex runs, a paired device's token moved
/// across every one of them, so that the redactor's window budget runs out
/// partway through the record: the straight text spends it as the event's
/// does, and the token never shows.
#[tokio::test]
async fn the_straight_text_spends_the_window_budget_as_the_events_does() {
    let (vessel, token, _) = vessel_knowing_tokens_by_hash().await;
    let redactor = vessel.redactor();
    for at in 0..7 {
        let texts: Vec<String> = (0..7)
            .map(|i| {
                if i == at {
                    format!("{}{token}", random_hex(190))
                } else {
                    random_hex(256)
                }
            })
            .collect();
        let t = |i: usize| texts[i].as_str();
        let record = DecisionRecord {
            tool: t(0),
            device_id: Some(t(1)),
            capability: Some(t(2)),
            allowed: true,
            reason: t(3),
            agent_id: Some(t(4)),
            session_id: Some(t(5)),
            rule: Some(t(6)),
            input: None,
            person_answer: None,
            by_person: false,
            allowance: None,
            channel: None,
            answered_by: None,
        };
        let decision = Decision::of(&record, 3);
        let made = decision.audit_made(redactor);
        assert!(matches!(made, Made::Text(_)), "field {at}");
        let text = text_of(made);
        assert_eq!(
            text,
            AuditText::of(&decision.audit_event(redactor)).unwrap(),
            "field {at}"
        );
        assert!(!text.text().contains(&token), "field {at}");
    }
}
