//! Tests of the input checks: 8DK's messages and order, and random inputs.

use serde_json::{Value, json};

use super::*;
use crate::validate_manifest;

fn capability(params: Value) -> crate::Capability {
    let m = json!({"id":"t","name":"T","kind":"t","version":"1","capabilities":[
        {"name":"c","kind":"actuator","description":"d","params":params}]});
    validate_manifest(&m).unwrap().capabilities()[0].clone()
}

#[track_caller]
fn check(params: &Value, input: &str, expected: Result<(), &str>) {
    let cap = capability(params.clone());
    let input: Value = serde_json::from_str(input).unwrap();
    let got = check_input(&cap, &input).map_err(|e| e.to_string());
    assert_eq!(got, expected.map_err(str::to_owned), "{input}");
}

#[test]
fn lamp_inputs() {
    let lamp = json!({"on":{"type":"boolean","required":true},"brightness":{"type":"number"}});
    let p = &lamp;
    check(p, r#"{"on":true}"#, Ok(()));
    check(p, r#"{"on":false,"brightness":50}"#, Ok(()));
    check(p, r#"{"brightness":1e308,"on":true}"#, Ok(()));
    check(p, r#"{"on":true,"brightness":-0.5}"#, Ok(()));
    check(p, "[]", Err("input must be an object"));
    check(p, "null", Err("input must be an object"));
    check(p, r#""on""#, Err("input must be an object"));
    check(p, "5", Err("input must be an object"));
    check(p, r#"{"on":true,"x":1}"#, Err(r#"unknown param "x""#));
    check(p, r#"{"x":1,"on":"no"}"#, Err(r#"unknown param "x""#));
    check(
        p,
        r#"{"on":true,"constructor":1}"#,
        Err(r#"unknown param "constructor""#),
    );
    check(
        p,
        r#"{"on":true,"toString":1}"#,
        Err(r#"unknown param "toString""#),
    );
    check(
        p,
        r#"{"__proto__":{}}"#,
        Err(r#"unknown param "__proto__""#),
    );
    check(p, r#"{"on":true,"b":2,"5":1}"#, Err(r#"unknown param "5""#));
    check(p, r#"{"b":1,"10":1,"2":1}"#, Err(r#"unknown param "2""#));
    check(p, r#"{"b":1,"01":1}"#, Err(r#"unknown param "b""#));
    let long = "k".repeat(70);
    let cut = "k".repeat(64);
    check(
        p,
        &format!(r#"{{"{long}":1}}"#),
        Err(&format!(r#"unknown param "{cut}""#)),
    );
    check(p, "{}", Err(r#"missing required "on""#));
    check(p, r#"{"brightness":"x"}"#, Err(r#"missing required "on""#));
    check(p, r#"{"on":"yes"}"#, Err(r#""on" must be boolean"#));
    check(p, r#"{"on":null}"#, Err(r#""on" must be boolean"#));
    check(p, r#"{"on":1}"#, Err(r#""on" must be boolean"#));
    check(
        p,
        r#"{"on":true,"brightness":"5"}"#,
        Err(r#""brightness" must be number"#),
    );
    check(
        p,
        r#"{"on":true,"brightness":null}"#,
        Err(r#""brightness" must be number"#),
    );
    check(
        p,
        r#"{"on":true,"brightness":[1]}"#,
        Err(r#""brightness" must be number"#),
    );
}

#[test]
fn other_shapes() {
    let none = json!(null);
    check(&none, "{}", Ok(()));
    check(&none, r#"{"a":1}"#, Err(r#"unknown param "a""#));
    let text = json!({"mode":{"type":"string"}, "level":{"type":"number","required":true}});
    check(&text, r#"{"level":1,"mode":"auto"}"#, Ok(()));
    check(&text, r#"{"mode":5}"#, Err(r#""mode" must be string"#));
    check(
        &text,
        r#"{"mode":"x","level":{}}"#,
        Err(r#""level" must be number"#),
    );
    check(&text, r#"{"mode":"x"}"#, Err(r#"missing required "level""#));
}

mod never_panics {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::check_input;
    use super::capability;

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<f64>().prop_map(|f| json!(f)),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![
                            "on".boxed(),
                            "brightness".boxed(),
                            "[0-9]{1,3}".boxed(),
                            ".{0,70}".boxed()
                        ],
                        inner
                    ),
                    0..5
                )
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn input_checks_never_panic(input in arb_json()) {
            let cap = capability(json!({"on":{"type":"boolean","required":true},"brightness":{"type":"number"},"label":{"type":"string"}}));
            if check_input(&cap, &input).is_ok() {
                // Whatever passes is an object holding only declared params of the right type.
                let map = input.as_object().unwrap();
                prop_assert!(map.get("on").is_some_and(Value::is_boolean));
                prop_assert!(map.keys().all(|k| ["on", "brightness", "label"].contains(&k.as_str())));
            }
        }
    }
}

#[test]
fn string_values_are_checked_like_manifest_text() {
    let p = json!({"label": {"type": "string"}, "short": {"type": "string", "maxLength": 4}});
    let at_cap = "x".repeat(1000);
    let past_cap = "x".repeat(1001);
    check(&p, &format!(r#"{{"label":"{at_cap}"}}"#), Ok(()));
    check(
        &p,
        &format!(r#"{{"label":"{past_cap}"}}"#),
        Err(r#""label" must be at most 1000 characters"#),
    );
    // UTF-16 units: an emoji counts 2.
    let emoji_at_cap = format!("{}\u{1F600}", "x".repeat(998));
    let emoji_past_cap = format!("{}\u{1F600}", "x".repeat(999));
    check(
        &p,
        &serde_json::to_string(&json!({"label": emoji_at_cap})).unwrap(),
        Ok(()),
    );
    check(
        &p,
        &serde_json::to_string(&json!({"label": emoji_past_cap})).unwrap(),
        Err(r#""label" must be at most 1000 characters"#),
    );
    check(&p, r#"{"short":"abcd"}"#, Ok(()));
    check(
        &p,
        r#"{"short":"abcde"}"#,
        Err(r#""short" must be at most 4 characters"#),
    );
    for bad in [
        "a\nb",
        "a\u{1b}[31mb",
        "a\u{202e}b",
        "a\u{200b}b",
        "a\u{E0041}b",
        "a\u{0}b",
        "a\u{17B4}b",
        "a\u{180F}b",
        "a\u{FFF0}b",
        "a\u{E0FFF}b",
        "a\u{2800}b",
        "a\u{FDD0}b",
        "a\u{10FFFF}b",
        "a\u{0378}b",
    ] {
        check(
            &p,
            &serde_json::to_string(&json!({"label": bad})).unwrap(),
            Err(r#""label" contains control, escape, invisible or bidirectional characters"#),
        );
    }
    // A multiline param takes new lines and tabs, and nothing else more.
    let lines = json!({"text": {"type": "string", "multiline": true}});
    check(
        &lines,
        &serde_json::to_string(&json!({"text": "line\n\tindented\n"})).unwrap(),
        Ok(()),
    );
    for bad in ["a\rb", "a\u{1b}b", "a\u{202e}b", "a\u{0}b", "a\u{b}b"] {
        check(
            &lines,
            &serde_json::to_string(&json!({"text": bad})).unwrap(),
            Err(r#""text" contains control, escape, invisible or bidirectional characters"#),
        );
    }
    // A base64 param takes standard base64 with its padding, and may be
    // longer than other strings.
    let bytes = json!({"audio": {"type": "string", "base64": true, "maxLength": 4000}});
    for good in ["", "UklGRg==", "AAAA", "ab+/", "YQ=="] {
        check(
            &bytes,
            &serde_json::to_string(&json!({"audio": good})).unwrap(),
            Ok(()),
        );
    }
    check(
        &bytes,
        &serde_json::to_string(&json!({"audio": "A".repeat(2000)})).unwrap(),
        Ok(()),
    );
    for bad in ["YQ", "Y===", "a-b_", "YQ==YQ==x", "YQ= =", "é===", "=AAA"] {
        check(
            &bytes,
            &serde_json::to_string(&json!({"audio": bad})).unwrap(),
            Err(r#""audio" must be standard base64"#),
        );
    }
    for good in ["", "Küche 台灯 😀", "a\u{A0}b", "“quoted”"] {
        check(
            &p,
            &serde_json::to_string(&json!({"label": good})).unwrap(),
            Ok(()),
        );
    }
}

fn thermostat_target() -> crate::Capability {
    let manifest = validate_manifest(&json!({
        "dk": 1, "id": "thermostat", "name": "T", "kind": "thermostat", "version": "1",
        "capabilities": [{"name": "set_target", "kind": "actuator", "description": "Sets it",
            "params": {
                "celsius": {"type": "number", "required": true, "minimum": 10, "maximum": 30, "unit": "°C"},
                "mode": {"type": "string", "enum": ["heat", "cool"]},
                "steps": {"type": "number", "integer": true, "enum": [1, 2, 3]},
                "label": {"type": "string", "minLength": 2}
            }}]
    }))
    .unwrap();
    manifest.capabilities()[0].clone()
}

#[test]
fn declared_bounds_are_kept_and_refusals_name_the_bound() {
    let target = thermostat_target();
    let check = |input: Value| check_input(&target, &input).map_err(|e| e.to_string());
    assert_eq!(check(json!({"celsius": 21.5})), Ok(()));
    assert_eq!(
        check(json!({"celsius": 10, "mode": "cool", "steps": 2.0, "label": "hi"})),
        Ok(())
    );
    for (input, expected) in [
        (json!({"celsius": 35}), "\"celsius\" must be at most 30 °C"),
        (
            json!({"celsius": 9.99}),
            "\"celsius\" must be at least 10 °C",
        ),
        (
            json!({"celsius": 20, "mode": "fan"}),
            "\"mode\" must be one of \"heat\", \"cool\"",
        ),
        (
            json!({"celsius": 20, "steps": 1.5}),
            "\"steps\" must be a whole number",
        ),
        (
            json!({"celsius": 20, "steps": 4}),
            "\"steps\" must be one of 1, 2, 3",
        ),
        (
            json!({"celsius": 20, "label": "x"}),
            "\"label\" must be at least 2 characters",
        ),
        // The type is checked before the bounds.
        (json!({"celsius": "35"}), "\"celsius\" must be number"),
    ] {
        assert_eq!(check(input.clone()), Err(expected.to_owned()), "{input}");
    }
}

#[test]
fn the_copy_kept_for_input_checks_checks_as_the_capability_does() {
    let target = thermostat_target();
    let copy = target.for_input_checks();
    assert_eq!(copy.name(), "set_target");
    assert_eq!(copy.description(), "");
    assert!(copy.params().iter().all(|p| p.description().is_none()));
    for input in [
        json!({"celsius": 21.5}),
        json!({"celsius": 35}),
        json!({"celsius": 20, "mode": "fan"}),
        json!({"celsius": 20, "steps": 1.5}),
        json!({"celsius": 20, "label": "x"}),
        json!({"celsius": 20, "other": 1}),
        json!({"mode": "heat"}),
    ] {
        assert_eq!(
            check_input(&copy, &input).map_err(|e| e.to_string()),
            check_input(&target, &input).map_err(|e| e.to_string()),
            "{input}"
        );
    }
}

#[test]
fn a_declared_event_checks_its_data() {
    let manifest = validate_manifest(&json!({
        "dk": 1, "id": "thermostat", "name": "T", "kind": "thermostat", "version": "1",
        "capabilities": [{"name": "read", "kind": "sensor", "description": "Reads"}],
        "events": [{"name": "changed", "description": "Changed",
            "params": {"celsius": {"type": "number", "required": true, "maximum": 60}}}]
    }))
    .unwrap();
    let event = manifest.event("changed").unwrap();
    assert_eq!(check_event(event, &json!({"celsius": 21})), Ok(()));
    assert!(check_event(event, &json!({"celsius": 61})).is_err());
    assert!(check_event(event, &json!({})).is_err());
    assert!(check_event(event, &json!({"celsius": 1, "x": 1})).is_err());
}

#[test]
fn a_declared_input_schema_takes_nested_input_within_depth_and_plain_text() {
    let manifest = validate_manifest(&json!({
        "dk": 1, "id": "files", "name": "Files", "kind": "mcp", "version": "1",
        "capabilities": [{"name": "write_file", "kind": "actuator", "description": "Writes",
            "inputSchema": {"type": "object"}}]
    }))
    .unwrap();
    let write = &manifest.capabilities()[0];
    assert_eq!(
        check_input(
            write,
            &json!({"path": "/a", "content": "line\n\tline", "opts": {"mode": [1, 2]}})
        ),
        Ok(())
    );
    let mut deep = json!(1);
    for _ in 0..MAX_DEPTH + 1 {
        deep = json!([deep]);
    }
    assert_eq!(
        check_input(write, &json!({"x": deep})),
        Err(InputError::TooDeep)
    );
    assert_eq!(
        check_input(write, &json!({"x": {"y": "a\u{202e}b"}})),
        Err(InputError::UnsafeString("x".to_owned()))
    );
    assert_eq!(
        check_input(write, &json!([1])),
        Err(InputError::NotAnObject)
    );
}
