//! Property tests: cutting an entry in place is the same as cutting a copy, redactions included.

use proptest::prelude::*;
use serde_json::{Map, Value};

use super::{MAX_AUDIT_DEPTH, cut_for_audit_in_place, cut_for_audit_with};

/// JSON with short and long strings, some holding `SECRET`, keys
/// among them, wide and deep enough to reach every cut.
fn json() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        "[a-zé ]{0,12}",
        "[a-z]{0,5}SECRET[a-z]{0,5}",
        "[a-zé]{250,300}",
        "[a-z]{240,260}SECRET[a-z]{0,9}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        text.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(MAX_AUDIT_DEPTH as u32 + 2, 400, 70, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..70).prop_map(Value::Array),
            proptest::collection::vec((text.clone(), inner), 0..70)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// In place or as a copy, the same value, with the same texts given
    /// to `redact` in the same order (a redactor with a budget, as the
    /// vessel's is, would otherwise differ).
    #[test]
    fn in_place_is_the_copy(value in json(), budget in 0usize..40) {
        let redact = |seen: &mut Vec<String>, text: &str| {
            seen.push(text.to_owned());
            (seen.len() <= budget && text.contains("SECRET"))
                .then(|| text.replace("SECRET", "[REDACTED]"))
        };
        let mut copied_seen = Vec::new();
        let copied = cut_for_audit_with(&value, 5, &mut |text: &str| {
            redact(&mut copied_seen, text).unwrap_or_else(|| text.to_owned())
        });
        let mut in_place = value.clone();
        let mut in_place_seen = Vec::new();
        cut_for_audit_in_place(&mut in_place, 5, &mut |text: &str| {
            redact(&mut in_place_seen, text)
        });
        prop_assert_eq!(&in_place, &copied);
        prop_assert_eq!(in_place_seen, copied_seen);
        // Key order too (objects keep insertion order).
        prop_assert_eq!(in_place.to_string(), copied.to_string());
    }
}
