//! Tests of defining devices and invoking their handlers.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{DefineError, Device, DeviceBuilder, HandlerError};

/// A valid manifest declaring `capabilities`, all actuators.
fn manifest(capabilities: &[&str]) -> Value {
    let capabilities: Vec<Value> = capabilities
        .iter()
        .map(|name| json!({"name": name, "kind": "actuator", "description": "Does a thing."}))
        .collect();
    json!({"id": "test-device", "name": "Test device", "kind": "test", "version": "1.0.0",
           "capabilities": capabilities})
}

/// `builder` with a handler answering `{"called": name}` for each of `names`.
fn with_handlers(mut builder: DeviceBuilder, names: &[&str]) -> DeviceBuilder {
    for name in names {
        let answer = json!({"called": name});
        builder = builder.handler(name, move |_input| {
            let answer = answer.clone();
            async move { Ok(answer) }
        });
    }
    builder
}

fn input(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("test input must be an object, got {other}"),
    }
}

#[track_caller]
fn check_define(manifest: Value, handlers: &[&str], expected: Result<(), &str>) {
    let built = with_handlers(Device::define(&manifest), handlers).build();
    match (built, expected) {
        (Ok(_), Ok(())) => {}
        (Err(error), Err(message)) => assert_eq!(error.to_string(), message),
        (Ok(_), Err(message)) => panic!("defined, expected `{message}`"),
        (Err(error), Ok(())) => panic!("expected a device, got `{error}`"),
    }
}

#[test]
fn define_checks_manifest_then_handlers_in_8dk_order() {
    let abc = manifest(&["alpha", "beta", "gamma"]);
    check_define(abc.clone(), &["alpha", "beta", "gamma"], Ok(()));
    check_define(abc.clone(), &["gamma", "alpha", "beta"], Ok(()));
    check_define(
        abc.clone(),
        &["alpha", "gamma"],
        Err("no handler for capability \"beta\""),
    );
    check_define(abc.clone(), &[], Err("no handler for capability \"alpha\""));
    check_define(
        abc.clone(),
        &["alpha", "beta", "gamma", "delta", "omega"],
        Err("handler given for no capability named \"delta\""),
    );
    // A missing handler is reported before an extra one, as 8DK does.
    check_define(
        abc.clone(),
        &["alpha", "delta", "gamma"],
        Err("no handler for capability \"beta\""),
    );
    check_define(
        abc.clone(),
        &["alpha", "beta", "gamma", "beta"],
        Err("handler given twice for capability \"beta\""),
    );
    check_define(
        json!("desk-lamp"),
        &["alpha"],
        Err("invalid manifest: manifest must be an object"),
    );
    // An array is an object to 8DK's first check; its id is then missing.
    check_define(
        json!([]),
        &[],
        Err("invalid manifest: manifest id must be a non-empty string of at most 24 characters"),
    );
    check_define(
        json!({"id": "Not Valid", "capabilities": []}),
        &[],
        Err("invalid manifest: manifest id \"Not Valid\" must be lower case words joined by \"-\""),
    );
    check_define(
        json!({"id": "no-caps", "name": "x", "kind": "x", "version": "1", "capabilities": []}),
        &[],
        Err("invalid manifest: manifest must declare at least one capability"),
    );
    check_define(
        manifest(&["a__b"]),
        &["a__b"],
        Err("invalid manifest: capability name \"a__b\" must be lower snake case without \"__\""),
    );
}

#[test]
fn define_errors_are_specific() {
    let built = with_handlers(Device::define(&manifest(&["alpha"])), &["beta"]).build();
    assert!(matches!(built, Err(DefineError::MissingHandler(name)) if name == "alpha"));
    let built = with_handlers(Device::define(&manifest(&["alpha"])), &["alpha", "beta"]).build();
    assert!(matches!(built, Err(DefineError::UnknownHandler(name)) if name == "beta"));
    let built = with_handlers(Device::define(&manifest(&["alpha"])), &["alpha", "alpha"]).build();
    assert!(matches!(built, Err(DefineError::DuplicateHandler(name)) if name == "alpha"));
    let built = Device::define(&json!(null)).build();
    assert!(matches!(built, Err(DefineError::InvalidManifest(_))));
}

#[test]
fn define_validated_takes_a_checked_manifest() {
    let manifest = dk_proto::validate_manifest(&manifest(&["alpha"])).unwrap();
    let device = with_handlers(Device::define_validated(manifest.clone()), &["alpha"])
        .build()
        .unwrap();
    assert_eq!(device.manifest(), &manifest);
    assert_eq!(
        format!("{device:?}"),
        "Device { id: \"test-device\", capabilities: [\"alpha\"] }"
    );
}

#[test]
fn handler_error_is_its_message() {
    assert_eq!(HandlerError::from("too dark").to_string(), "too dark");
    assert_eq!(HandlerError::from(String::from("x")).message(), "x");
    assert_eq!(HandlerError::new("y"), HandlerError::from("y"));
}

/// A device with one capability of each outcome.
fn outcomes() -> Device {
    Device::define(&manifest(&["echo", "fail", "explode", "explode_later"]))
        .handler("echo", |input| async move { Ok(Value::Object(input)) })
        .handler("fail", |_input| async move {
            Err(HandlerError::from("the bulb is broken"))
        })
        .handler(
            "explode",
            |_input| -> std::future::Ready<Result<Value, HandlerError>> {
                panic!("exploded before the future")
            },
        )
        .handler("explode_later", |_input| async move {
            tokio::task::yield_now().await;
            panic!("exploded while running")
        })
        .build()
        .unwrap()
}

#[track_caller]
fn check_invoke(device: &Device, capability: &str, given: Value, expected: Result<Value, &str>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = runtime
        .block_on(device.invoke(capability, input(given)))
        .map_err(|e| e.to_string());
    assert_eq!(answer, expected.map_err(str::to_owned), "{capability}");
}

#[test]
fn invoke_answers_result_error_unknown_and_panic() {
    let device = outcomes();
    check_invoke(&device, "echo", json!({"a": 1}), Ok(json!({"a": 1})));
    check_invoke(&device, "fail", json!({}), Err("the bulb is broken"));
    check_invoke(
        &device,
        "missing",
        json!({}),
        Err("unknown capability \"missing\""),
    );
    // Handlers are looked up as given: no prefix or case folding.
    check_invoke(
        &device,
        "ECHO",
        json!({}),
        Err("unknown capability \"ECHO\""),
    );
    check_invoke(&device, "", json!({}), Err("unknown capability \"\""));
    check_invoke(
        &device,
        "explode",
        json!({}),
        Err("handler for \"explode\" panicked"),
    );
    check_invoke(
        &device,
        "explode_later",
        json!({}),
        Err("handler for \"explode_later\" panicked"),
    );
    // The device still answers after its handlers panicked.
    check_invoke(&device, "echo", json!({"b": true}), Ok(json!({"b": true})));
}

#[derive(Debug, Deserialize)]
struct Dim {
    level: u8,
    #[serde(default)]
    fade: bool,
}

#[derive(Debug, Serialize)]
struct Dimmed {
    level: u8,
    fade: bool,
}

fn typed() -> Device {
    Device::define(&manifest(&["dim", "odd_result"]))
        .typed_handler("dim", |dim: Dim| async move {
            if dim.level > 100 {
                return Err(HandlerError::from("level must be at most 100"));
            }
            Ok(Dimmed {
                level: dim.level,
                fade: dim.fade,
            })
        })
        .typed_handler("odd_result", |_: Map<String, Value>| async move {
            // Maps with non-string keys have no JSON form.
            Ok::<_, HandlerError>(HashMap::from([((1, 2), 3)]))
        })
        .build()
        .unwrap()
}

#[test]
fn typed_handlers_decode_input_and_encode_output() {
    let device = typed();
    check_invoke(
        &device,
        "dim",
        json!({"level": 40}),
        Ok(json!({"level": 40, "fade": false})),
    );
    check_invoke(
        &device,
        "dim",
        json!({"level": 40, "fade": true}),
        Ok(json!({"level": 40, "fade": true})),
    );
    check_invoke(
        &device,
        "dim",
        json!({"level": 101}),
        Err("level must be at most 100"),
    );
    check_invoke(
        &device,
        "dim",
        json!({}),
        Err("invalid input for \"dim\": missing field `level`"),
    );
    check_invoke(
        &device,
        "dim",
        json!({"level": "bright"}),
        Err("invalid input for \"dim\": invalid type: string \"bright\", expected u8"),
    );
    check_invoke(
        &device,
        "dim",
        json!({"level": 300}),
        Err("invalid input for \"dim\": invalid value: integer `300`, expected u8"),
    );
    check_invoke(
        &device,
        "odd_result",
        json!({}),
        Err("result of \"odd_result\" is not JSON: key must be a string"),
    );
}
