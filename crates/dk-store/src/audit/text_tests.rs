//! Property tests: a decision's text written straight from its record is its event's text.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::AuditText;
use crate::AuditEvent;
use crate::entry::{AllowanceRef, By, Caller, Decision, Entry, FrontEnd, PersonAnswer};

/// Texts JSON escapes, and texts it leaves alone.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_-]{0,16}",
        "\\PC{0,24}",
        "[\"\\\\\u{0}-\u{1f}\u{7f}é€😀]{0,8}",
    ]
}

/// An input: small, or (now and then) too large for any entry.
fn input() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    prop_oneof![
        8 => leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((text(), inner), 0..6)
                    .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
            ]
        }),
        1 => (1usize..80).prop_map(|n| Value::Array(vec![Value::String("x".repeat(1_000)); n])),
    ]
}

fn decision() -> impl Strategy<Value = Decision> {
    let person = prop_oneof![
        Just(None),
        Just(Some(PersonAnswer::Approved)),
        Just(Some(PersonAnswer::Refused)),
        Just(Some(PersonAnswer::Remembered)),
    ];
    let allowance = proptest::option::of((any::<u64>(), any::<bool>()))
        .prop_map(|a| a.map(|(id, created)| AllowanceRef { id, created }));
    let front_end = prop_oneof![
        Just(FrontEnd::Terminal),
        Just(FrontEnd::AdminApi),
        Just(FrontEnd::Console),
    ];
    let by = proptest::option::of((front_end, proptest::option::of(text())))
        .prop_map(|by| by.map(|(front_end, session)| By { front_end, session }));
    (
        (
            text(),
            proptest::option::of(text()),
            proptest::option::of(text()),
            any::<bool>(),
            text(),
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
        ),
        (
            person,
            allowance,
            any::<bool>(),
            proptest::option::of(text()),
            by,
            proptest::option::of(input()),
        ),
    )
        .prop_map(
            |(
                (tool, device_id, capability, allowed, reason, agent_id, session_id, rule),
                (person, allowance, caller, channel, by, input),
            )| Decision {
                tool,
                device_id,
                capability,
                allowed,
                reason,
                agent_id,
                session_id,
                rule,
                person,
                allowance,
                caller: caller.then_some(Caller::Person),
                channel,
                by,
                input,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A decision's text written straight from its record is the text
    /// of its event: the same canonical JSON, the same columns, the
    /// same refusal when too large.
    #[test]
    fn a_decision_written_straight_is_its_events_text(
        decision in decision(),
        at_ms in prop_oneof![0u64..=u64::from(u32::MAX), Just(u64::MAX)],
    ) {
        let straight = AuditText::decision(at_ms, &decision);
        let event = AuditEvent::of(&Entry::Decision(decision), at_ms);
        prop_assert_eq!(straight, AuditText::of(&event));
    }
}

proptest! {
    /// A store without a text path of its own appends what the text
    /// reads back into: the same text, every number exact.
    #[test]
    fn numbers_read_back_exactly(x in any::<f64>(), n in any::<i64>(), u in any::<u64>()) {
        let event = AuditEvent {
            at_ms: 1,
            kind: "note".to_owned(),
            entry: serde_json::json!({"x": x, "n": n, "u": u, "deep": [[x]]}),
        };
        let text = AuditText::of(&event).unwrap();
        prop_assert_eq!(AuditText::of(&text.to_event()).unwrap(), text);
    }
}

/// The round trip a store without its own text path takes.
#[test]
fn a_text_reads_back_into_its_event() {
    let event = AuditEvent {
        at_ms: 42,
        kind: "note".to_owned(),
        entry: serde_json::json!({"deviceId": "lamp", "z": [1, 2.5, "é\"\u{1}"], "a": null}),
    };
    let text = AuditText::of(&event).unwrap();
    assert_eq!(text.device_id(), Some("lamp"));
    assert_eq!(text.agent_id(), None);
    assert_eq!(text.allowed(), None);
    assert_eq!(text.to_event(), event);
}
