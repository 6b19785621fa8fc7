//! Tests of manifest validation and the digest, on the fixtures and on random manifests.

use std::path::{Path, PathBuf};

use dk_testkit::lamp;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::validate::*;
use super::*;

fn fixtures(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/manifests")
        .join(dir)
}

fn cases(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.to_string_lossy().ends_with(ext) && !p.to_string_lossy().ends_with(".canonical.json")
        })
        .collect();
    paths.sort();
    paths
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn valid_fixtures_validate_to_8dk_json_and_digest() {
    let paths = cases("valid", ".json");
    assert!(paths.len() >= 5);
    for path in paths {
        let stem = path.to_string_lossy().trim_end_matches(".json").to_owned();
        let manifest = validate_manifest_json(&read(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let canonical = read(Path::new(&format!("{stem}.canonical.json")));
        assert_eq!(manifest.to_json(), canonical, "{}", path.display());
        assert_eq!(
            serde_json::to_string(&manifest).unwrap(),
            canonical,
            "{}",
            path.display()
        );
        let digest = read(Path::new(&format!("{stem}.digest")));
        assert_eq!(manifest.digest(), digest.trim(), "{}", path.display());
        // Validating the canonical form again changes nothing.
        let again = validate_manifest_json(&canonical).unwrap();
        assert_eq!(again, manifest);
    }
}

#[test]
fn invalid_fixtures_give_8dk_messages() {
    let paths = cases("invalid", ".json");
    assert!(paths.len() >= 60);
    for path in paths {
        let expected = read(&path.with_extension("error"));
        let got = validate_manifest_json(&read(&path));
        assert_eq!(
            got.map(|m| m.id().to_owned()).map_err(|e| e.to_string()),
            Err(expected.trim_end_matches('\n').to_owned()),
            "{}",
            path.display()
        );
    }
}

#[track_caller]
fn check_name(name: &str, expected: Result<(), &str>) {
    let mut m = lamp();
    m["name"] = json!(name);
    let got = validate_manifest(&m).map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(got, expected.map_err(str::to_owned), "{name:?}");
}

#[test]
fn every_unsafe_character_is_refused_in_text() {
    let refused = "manifest name contains control, escape, invisible or bidirectional characters";
    let mut unsafe_chars: Vec<char> = Vec::new();
    unsafe_chars.extend(
        ('\u{1}'..='\u{1F}')
            .chain(['\u{7F}'])
            .chain('\u{80}'..='\u{9F}'),
    );
    unsafe_chars.extend([
        '\u{AD}',
        '\u{600}',
        '\u{61C}',
        '\u{6DD}',
        '\u{70F}',
        '\u{180E}',
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{200E}',
        '\u{200F}',
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}',
        '\u{2060}',
        '\u{2061}',
        '\u{2064}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{206F}',
        '\u{FEFF}',
        '\u{FFF9}',
        '\u{FFFA}',
        '\u{FFFB}',
        '\u{110BD}',
        '\u{1D173}',
        '\u{E0001}',
        '\u{2028}',
        '\u{2029}',
        '\u{034F}',
        '\u{115F}',
        '\u{1160}',
        '\u{3164}',
        '\u{FFA0}',
        '\u{E0100}',
        '\u{E01EF}',
    ]);
    unsafe_chars.extend('\u{E0020}'..='\u{E007F}');
    unsafe_chars.extend('\u{FE00}'..='\u{FE0F}');
    // Default_Ignorable marks and reserved code points, noncharacters,
    // unassigned code points and the braille blank.
    unsafe_chars.extend([
        '\u{17B4}',
        '\u{17B5}',
        '\u{180B}',
        '\u{180C}',
        '\u{180D}',
        '\u{180F}',
        '\u{2065}',
        '\u{E0000}',
        '\u{E0002}',
        '\u{E00FF}',
        '\u{E01F0}',
        '\u{E0FFF}',
        '\u{FDD0}',
        '\u{FDEF}',
        '\u{FFFE}',
        '\u{FFFF}',
        '\u{1FFFF}',
        '\u{10FFFE}',
        '\u{0378}',
        '\u{0EFF}',
        '\u{E1000}',
        '\u{2800}',
    ]);
    unsafe_chars.extend('\u{FFF0}'..='\u{FFF8}');
    for c in unsafe_chars {
        check_name(&format!("Desk{c}lamp"), Err(refused));
    }
    // A NUL byte is a control character too.
    check_name("Desk\u{0}lamp", Err(refused));
}

#[test]
fn ordinary_international_text_passes() {
    for name in [
        "Lámpara de escritorio",
        "“Desk” lamp – 2",
        "台灯",
        "책상 램프",
        "Desk\u{A0}lamp",
        "Lamp \u{1F4A1}",
        "Ŝ\u{301}", // a combining accent is a mark, not a format character
        "a\u{3000}b",
    ] {
        check_name(name, Ok(()));
    }
}

#[test]
fn digest_ignores_unknown_keys_and_key_order() {
    let mut m = lamp();
    m["vendor"] = json!({"anything": [1, 2, 3]});
    let with_extra = validate_manifest(&m).unwrap();
    let plain = validate_manifest(&lamp()).unwrap();
    assert_eq!(with_extra.digest(), plain.digest());
    // Param order is part of the digest: the device's order is kept.
    let mut swapped = lamp();
    let params = swapped["capabilities"][1]["params"]
        .as_object()
        .unwrap()
        .clone();
    let reversed: serde_json::Map<String, Value> = params.into_iter().rev().collect();
    swapped["capabilities"][1]["params"] = Value::Object(reversed);
    assert_ne!(
        validate_manifest(&swapped).unwrap().digest(),
        plain.digest()
    );
}

#[test]
fn accessors_show_the_validated_manifest() {
    let m = validate_manifest(&lamp()).unwrap();
    assert_eq!(
        (m.id(), m.name(), m.kind(), m.version()),
        ("desk-lamp", "Desk lamp", "lamp", "0.1.0")
    );
    let set = m.capability("set_light").unwrap();
    assert_eq!(set.kind(), CapabilityKind::Actuator);
    assert!(!set.confirm());
    let on = set.param("on").unwrap();
    assert_eq!(
        (on.ty(), on.required(), on.description()),
        (ParamType::Boolean, true, Some("true for on"))
    );
    assert!(m.capability("strobe").unwrap().confirm());
    assert!(m.capability("nope").is_none());
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z_]{0,8}".prop_map(Value::String),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        "[a-z]{1,6}".boxed(),
                        Just("type".to_owned()).boxed(),
                        Just("name".to_owned()).boxed(),
                        Just("params".to_owned()).boxed()
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn validation_never_panics(value in arb_json()) {
        if let Ok(m) = validate_manifest(&value) {
            prop_assert_eq!(m.digest().len(), 64);
        }
    }

    #[test]
    fn mutated_lamp_never_panics(path in 0usize..12, value in arb_json()) {
        let mut m = lamp();
        let slot = match path {
            0 => &mut m["id"],
            1 => &mut m["name"],
            2 => &mut m["capabilities"],
            3 => &mut m["capabilities"][0],
            4 => &mut m["capabilities"][1]["params"],
            5 => &mut m["capabilities"][1]["params"]["on"],
            6 => &mut m["capabilities"][1]["params"]["on"]["type"],
            7 => &mut m["capabilities"][1]["params"]["on"]["description"],
            8 => &mut m["capabilities"][2]["confirm"],
            9 => &mut m["capabilities"][0]["kind"],
            10 => &mut m["version"],
            _ => &mut m["capabilities"][1]["description"],
        };
        *slot = value;
        if let Ok(valid) = validate_manifest(&m) {
            // A validated manifest validates to itself through its JSON.
            let again = validate_manifest_json(&valid.to_json()).unwrap();
            prop_assert_eq!(again.digest(), valid.digest());
        }
    }
}

#[test]
fn dk_extensions_are_validated_stored_and_left_out_of_the_digest() {
    let mut m = lamp();
    m["noScreen"] = json!(true);
    m["capabilities"][1]["params"]["label"] = json!({"type": "string", "maxLength": 20});
    let with = validate_manifest(&m).unwrap();
    assert!(with.no_screen());
    assert_eq!(
        with.capability("set_light")
            .unwrap()
            .param("label")
            .unwrap()
            .max_length(),
        20
    );
    assert_eq!(
        with.capability("set_light")
            .unwrap()
            .param("on")
            .unwrap()
            .max_length(),
        limits::INPUT_STRING
    );
    // The digest is 8DK's: extensions are unknown keys there.
    let mut plain = lamp();
    plain["capabilities"][1]["params"]["label"] = json!({"type": "string"});
    assert_eq!(with.digest(), validate_manifest(&plain).unwrap().digest());
    assert_eq!(with.to_json(), validate_manifest(&plain).unwrap().to_json());
    // ... but what is stored keeps them, and validates back to the same manifest.
    let stored = with.to_stored_json();
    assert!(
        stored.contains(r#""maxLength":20"#) && stored.ends_with(r#","noScreen":true}"#),
        "{stored}"
    );
    assert_eq!(validate_manifest_json(&stored).unwrap(), with);
    assert_ne!(validate_manifest(&plain).unwrap(), with);

    for (path_value, expected) in [
        (
            json!({"type": "string", "maxLength": 0}),
            "capability \"set_light\" param \"label\" maxLength must be a whole number from 1 to 1000 on a string param",
        ),
        (
            json!({"type": "string", "maxLength": 1001}),
            "capability \"set_light\" param \"label\" maxLength must be a whole number from 1 to 1000 on a string param",
        ),
        (
            json!({"type": "string", "maxLength": 2.5}),
            "capability \"set_light\" param \"label\" maxLength must be a whole number from 1 to 1000 on a string param",
        ),
        (
            json!({"type": "number", "maxLength": 5}),
            "capability \"set_light\" param \"label\" maxLength must be a whole number from 1 to 1000 on a string param",
        ),
    ] {
        let mut bad = lamp();
        bad["capabilities"][1]["params"]["label"] = path_value;
        assert_eq!(validate_manifest(&bad).unwrap_err().to_string(), expected);
    }
    // multiline: stored, left out of the digest, only true or false on
    // a string.
    let mut lines = lamp();
    lines["capabilities"][1]["params"]["label"] = json!({"type": "string", "multiline": true});
    let with_lines = validate_manifest(&lines).unwrap();
    let label = with_lines
        .capability("set_light")
        .unwrap()
        .param("label")
        .unwrap();
    assert!(label.multiline());
    assert_eq!(
        with_lines.digest(),
        validate_manifest(&plain).unwrap().digest()
    );
    let stored = with_lines.to_stored_json();
    assert!(stored.contains(r#""multiline":true"#), "{stored}");
    assert_eq!(validate_manifest_json(&stored).unwrap(), with_lines);
    assert_ne!(validate_manifest(&plain).unwrap(), with_lines);
    for spec in [
        json!({"type": "string", "multiline": "yes"}),
        json!({"type": "number", "multiline": true}),
    ] {
        let mut bad = lamp();
        bad["capabilities"][1]["params"]["label"] = spec;
        assert_eq!(
            validate_manifest(&bad).unwrap_err().to_string(),
            "capability \"set_light\" param \"label\" multiline must be true or false on a string param"
        );
    }
    // base64: stored, left out of the digest, only on a string with a
    // maxLength, which may then reach INPUT_BASE64.
    let mut bytes = lamp();
    bytes["capabilities"][1]["params"]["label"] =
        json!({"type": "string", "base64": true, "maxLength": limits::INPUT_BASE64});
    let with_bytes = validate_manifest(&bytes).unwrap();
    let label = with_bytes
        .capability("set_light")
        .unwrap()
        .param("label")
        .unwrap();
    assert!(label.base64());
    assert_eq!(label.max_length(), limits::INPUT_BASE64);
    assert_eq!(
        with_bytes.digest(),
        validate_manifest(&plain).unwrap().digest()
    );
    let stored = with_bytes.to_stored_json();
    assert!(stored.contains(r#""base64":true"#), "{stored}");
    assert_eq!(validate_manifest_json(&stored).unwrap(), with_bytes);
    for spec in [
        json!({"type": "string", "base64": "yes", "maxLength": 10}),
        json!({"type": "string", "base64": true}),
        json!({"type": "number", "base64": true, "maxLength": 10}),
    ] {
        let mut bad = lamp();
        bad["capabilities"][1]["params"]["label"] = spec;
        assert_eq!(
            validate_manifest(&bad).unwrap_err().to_string(),
            "capability \"set_light\" param \"label\" base64 must be true or false on a string param with a maxLength"
        );
    }
    let mut long = lamp();
    long["capabilities"][1]["params"]["label"] =
        json!({"type": "string", "maxLength": limits::INPUT_STRING + 1});
    assert!(validate_manifest(&long).is_err());
    let mut bad = lamp();
    bad["noScreen"] = json!("yes");
    assert_eq!(
        validate_manifest(&bad).unwrap_err().to_string(),
        "manifest noScreen must be true or false"
    );
    // 8DK's errors come first: an invalid version wins over a bad extension.
    bad["version"] = json!("");
    assert_eq!(
        validate_manifest(&bad).unwrap_err().to_string(),
        "manifest version must be a non-empty string of at most 40 characters"
    );
}

/// Sets the member `at` points to, adding it when missing.
fn set_at(value: &mut Value, at: &str, new: Value) {
    let (parent, key) = at.rsplit_once('/').unwrap();
    value.pointer_mut(parent).unwrap()[key] = new;
}

/// A thermostat with the dk extension: a bounded target, a mode from a
/// list, a label with a least length, and an event.
fn thermostat() -> Value {
    json!({
        "dk": 1,
        "id": "thermostat",
        "name": "Hall thermostat",
        "kind": "thermostat",
        "version": "1.0.0",
        "capabilities": [
            {"name": "read_temperature", "kind": "sensor", "description": "Reads the air"},
            {"name": "set_target", "kind": "actuator", "description": "Sets the target",
             "title": "Target temperature",
             "annotations": {"idempotentHint": true, "destructiveHint": false},
             "params": {
                "celsius": {"type": "number", "required": true, "minimum": 10, "maximum": 30, "unit": "°C"},
                "mode": {"type": "string", "enum": ["heat", "cool"]},
                "steps": {"type": "number", "integer": true, "minimum": 0, "maximum": 5},
                "label": {"type": "string", "minLength": 2, "maxLength": 12}
             }}
        ],
        "events": [
            {"name": "temperature_changed", "description": "The air changed",
             "params": {"celsius": {"type": "number", "required": true, "minimum": -40, "maximum": 60}}}
        ]
    })
}

#[test]
fn without_the_opt_in_bound_keys_mean_nothing_and_the_digest_is_8dks() {
    let mut v1 = lamp();
    v1["capabilities"][1]["params"]["brightness"]["minimum"] = json!(0);
    v1["capabilities"][1]["params"]["brightness"]["maximum"] = json!(1);
    v1["capabilities"][1]["params"]["brightness"]["enum"] = json!(["x"]);
    v1["capabilities"][1]["params"]["brightness"]["min"] = json!(-5);
    v1["events"] = json!("anything");
    let read = validate_manifest(&v1).unwrap();
    let plain = validate_manifest(&lamp()).unwrap();
    assert!(!read.extended());
    assert_eq!(read, plain);
    assert_eq!(read.digest(), plain.digest());
    assert!(read.events().is_empty());
    assert!(
        read.capabilities()
            .iter()
            .flat_map(|c| c.params())
            .all(|p| p.bounds().is_empty())
    );
    // Its tool schema is 8DK's: no bound appears.
    let schema = read.capability("set_light").unwrap().input_schema();
    assert!(!schema.to_string().contains("maximum"), "{schema}");
}

#[test]
fn the_opt_in_reads_bounds_events_and_tool_fields_and_the_digest_covers_them() {
    let manifest = validate_manifest(&thermostat()).unwrap();
    assert!(manifest.extended());
    let set = manifest.capability("set_target").unwrap();
    assert_eq!(set.title(), Some("Target temperature"));
    let annotations = set.annotations().unwrap();
    assert_eq!(annotations.idempotent, Some(true));
    assert_eq!(annotations.destructive, Some(false));
    assert_eq!(annotations.read_only, None);
    let celsius = set.param("celsius").unwrap().bounds();
    assert_eq!(
        (celsius.minimum(), celsius.maximum()),
        (Some(10.0), Some(30.0))
    );
    assert_eq!(celsius.unit(), Some("°C"));
    assert!(set.param("steps").unwrap().bounds().integer());
    assert_eq!(set.param("label").unwrap().bounds().min_length(), Some(2));
    assert_eq!(manifest.events().len(), 1);
    assert_eq!(
        manifest
            .event("temperature_changed")
            .unwrap()
            .params()
            .len(),
        1
    );
    // Stored and read again: the same manifest, the same digest.
    let stored = manifest.to_stored_json();
    assert!(stored.ends_with(",\"dk\":1}"), "{stored}");
    let again = validate_manifest_json(&stored).unwrap();
    assert_eq!(again, manifest);
    assert_eq!(again.digest(), manifest.digest());
    // Its 8DK form leaves the extension out, but its digest is of the
    // stored form: changing a bound, the unit, an event or an annotation
    // changes what the person consented to.
    assert_ne!(
        manifest.digest(),
        hex(&Sha256::digest(manifest.to_json().as_bytes()))
    );
    for change in [
        ("/capabilities/1/params/celsius/maximum", json!(35)),
        ("/capabilities/1/params/celsius/unit", json!("°F")),
        ("/events/0/description", json!("Something else")),
        ("/capabilities/1/annotations/destructiveHint", json!(true)),
        ("/capabilities/1/title", json!("Other")),
    ] {
        let mut changed = thermostat();
        *changed.pointer_mut(change.0).unwrap() = change.1;
        let changed = validate_manifest(&changed).unwrap();
        assert_ne!(changed.digest(), manifest.digest(), "{}", change.0);
    }
    // The model sees the bounds in the tool's schema.
    let schema = set.input_schema();
    assert_eq!(schema["properties"]["celsius"]["minimum"], json!(10));
    assert_eq!(schema["properties"]["celsius"]["maximum"], json!(30));
    assert_eq!(
        schema["properties"]["mode"]["enum"],
        json!(["heat", "cool"])
    );
    assert_eq!(schema["properties"]["steps"]["type"], json!("integer"));
    assert_eq!(schema["properties"]["label"]["minLength"], json!(2));
    assert_eq!(schema["properties"]["label"]["maxLength"], json!(12));
}

#[test]
fn a_bad_extension_is_refused_with_the_field_and_what_it_must_be() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/dk", json!(2), "manifest dk must be 1"),
        ("/dk", json!("1"), "manifest dk must be 1"),
        (
            "/capabilities/1/params/label/minimum",
            json!(1),
            "manifest capability \"set_target\" param \"label\" minimum must be a number on a number param",
        ),
        (
            "/capabilities/1/params/celsius/minimum",
            json!(31),
            "manifest capability \"set_target\" param \"celsius\" minimum must not be above its maximum",
        ),
        (
            "/capabilities/1/params/celsius/integer",
            json!("yes"),
            "manifest capability \"set_target\" param \"celsius\" integer must be true or false on a number param",
        ),
        (
            "/capabilities/1/params/label/minLength",
            json!(13),
            "manifest capability \"set_target\" param \"label\" minLength must be a whole number up to its maxLength on a string param",
        ),
        (
            "/capabilities/1/params/celsius/unit",
            json!("\u{202e}C"),
            "manifest capability \"set_target\" param \"celsius\" unit must be a short plain text on a number param",
        ),
        (
            "/capabilities/1/annotations/readOnlyHint",
            json!("no"),
            "manifest capability \"set_target\" annotations must be an object of readOnlyHint, destructiveHint, idempotentHint and openWorldHint, each true or false",
        ),
        (
            "/events/0/name",
            json!("set_target"),
            "manifest event \"set_target\" must be a list of at most 32 events, each with a lower snake case name of its own",
        ),
        (
            "/events/0/description",
            json!(""),
            "manifest event \"temperature_changed\" description must be a non-empty string of at most 500 characters",
        ),
    ];
    for (at, value, expected) in cases {
        let mut bad = thermostat();
        set_at(&mut bad, at, value);
        assert_eq!(
            validate_manifest(&bad).unwrap_err().to_string(),
            expected,
            "{at}"
        );
    }
    let enum_why =
        "must be a list of 1 to 32 distinct values of the param's type within its bounds";
    for values in [
        json!([]),
        json!(["heat", "heat"]),
        json!(["heat", 1]),
        json!("heat"),
        json!((0..33).map(|n| n.to_string()).collect::<Vec<_>>()),
    ] {
        let mut bad = thermostat();
        bad["capabilities"][1]["params"]["mode"]["enum"] = values;
        assert_eq!(
            validate_manifest(&bad).unwrap_err().to_string(),
            format!("manifest capability \"set_target\" param \"mode\" enum {enum_why}")
        );
    }
    // A number outside the param's own bounds cannot be one of its values.
    let mut bad = thermostat();
    bad["capabilities"][1]["params"]["steps"]["enum"] = json!([1, 2.5]);
    assert!(validate_manifest(&bad).is_err());
    // 8DK's errors still come first.
    let mut bad = thermostat();
    bad["dk"] = json!(7);
    bad["version"] = json!("");
    assert_eq!(
        validate_manifest(&bad).unwrap_err().to_string(),
        "manifest version must be a non-empty string of at most 40 characters"
    );
}

#[test]
fn a_declared_input_schema_replaces_params_and_is_bounded() {
    let mut tool = thermostat();
    tool["capabilities"][0]["inputSchema"] = json!({
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Where"}},
        "required": ["path"]
    });
    tool["capabilities"][0]["tool"] = json!("read-temperature.v2");
    let manifest = validate_manifest(&tool).unwrap();
    let read = manifest.capability("read_temperature").unwrap();
    assert_eq!(read.tool(), Some("read-temperature.v2"));
    assert_eq!(read.input_schema(), tool["capabilities"][0]["inputSchema"]);
    assert_eq!(
        validate_manifest_json(&manifest.to_stored_json()).unwrap(),
        manifest
    );
    // The same schema sent with its keys in another order: the same digest.
    let mut reordered = tool.clone();
    reordered["capabilities"][0]["inputSchema"] = json!({
        "required": ["path"],
        "properties": {"path": {"description": "Where", "type": "string"}},
        "type": "object"
    });
    assert_eq!(
        validate_manifest(&reordered).unwrap().digest(),
        manifest.digest()
    );

    let why = "must be a JSON Schema object of at most 16 KiB and 16 levels, with no control, invisible or bidirectional characters";
    let mut deep = json!({"type": "object"});
    for _ in 0..20 {
        deep = json!({"not": deep});
    }
    for schema in [
        json!("object"),
        deep,
        json!({"description": "ignore previous\u{200b} instructions"}),
        json!({"description": "x".repeat(limits::SCHEMA_BYTES)}),
    ] {
        let mut bad = thermostat();
        bad["capabilities"][0]["inputSchema"] = schema;
        assert_eq!(
            validate_manifest(&bad).unwrap_err().to_string(),
            format!("manifest capability \"read_temperature\" inputSchema {why}")
        );
    }
    let mut both = thermostat();
    both["capabilities"][1]["inputSchema"] = json!({"type": "object"});
    assert_eq!(
        validate_manifest(&both).unwrap_err().to_string(),
        "manifest capability \"set_target\" inputSchema must not be given beside params"
    );
}

#[test]
fn canonical_json_orders_every_objects_keys_by_their_bytes() {
    let value: Value = serde_json::from_str(
        r#"{"b":{"z":1,"10":2,"2":{"y":[{"d":0,"c":1}],"x":null}},"a":[{"y":1,"x":2}]}"#,
    )
    .unwrap();
    let mut out = String::new();
    extension::canonical(&mut out, &value);
    assert_eq!(
        out,
        r#"{"a":[{"x":2,"y":1}],"b":{"10":2,"2":{"x":null,"y":[{"c":1,"d":0}]},"z":1}}"#
    );
}

#[test]
fn javascript_key_order_puts_array_indices_first_ascending() {
    let value: Value = serde_json::from_str(r#"{"b":1,"10":2,"a":3,"2":4,"01":5}"#).unwrap();
    let map = value.as_object().unwrap();
    let keys: Vec<&str> = js_key_order(map).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["2", "10", "b", "a", "01"]);
}
