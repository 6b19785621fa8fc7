//! Benchmarks of the wire types: frame parsing, manifest validation and
//! digest, input checks, tool names. Run with `cargo xtask bench` (or
//! `cargo bench -p dk-proto`).

use std::hint::black_box;

use dk_proto::{DeviceFrame, check_input, parse_tool_name, validate_manifest};
use serde_json::Value;

fn main() {
    divan::main();
}

/// A `device:result` of about 200 bytes, as a lamp answers `set_light`.
const RESULT_200: &str = r#"{"type":"device:result","callId":"5b0c7c2e-4f1d-4a63-9d55-8f0d2e1e9c11","ok":true,"result":{"on":true,"brightness":40,"colour":"warm white","note":"set by the agent at the person's request, 21:04"}}"#;

use dk_testkit::LAMP_JSON as LAMP;

#[divan::bench(sample_count = 200, sample_size = 200)]
fn parse_result_frame_200b(bencher: divan::Bencher) {
    assert!(
        (190..=210).contains(&RESULT_200.len()),
        "{}",
        RESULT_200.len()
    );
    bencher.bench(|| {
        let frame = DeviceFrame::parse(black_box(RESULT_200.as_bytes()));
        black_box(frame.is_ok())
    });
}

#[divan::bench(sample_count = 200, sample_size = 200)]
fn validate_and_digest_lamp(bencher: divan::Bencher) {
    let lamp: Value = serde_json::from_str(LAMP).unwrap_or_default();
    bencher.bench(|| {
        let manifest = validate_manifest(black_box(&lamp));
        black_box(manifest.map(|m| m.digest()).is_ok())
    });
}

#[divan::bench(sample_count = 200, sample_size = 200)]
fn check_lamp_input(bencher: divan::Bencher) {
    let lamp: Value = serde_json::from_str(LAMP).unwrap_or_default();
    let Ok(manifest) = validate_manifest(&lamp) else {
        return;
    };
    let Some(cap) = manifest.capability("set_light") else {
        return;
    };
    let input = serde_json::json!({"on": true, "brightness": 40});
    bencher.bench(|| black_box(check_input(cap, black_box(&input)).is_ok()));
}

#[divan::bench(sample_count = 200, sample_size = 200)]
fn parse_tool_name_lamp(bencher: divan::Bencher) {
    bencher.bench(|| black_box(parse_tool_name(black_box("device__desk_lamp__set_light"))));
}

/// Baseline: the same frame into a `serde_json::Value` tree.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn baseline_result_frame_into_value(bencher: divan::Bencher) {
    bencher.bench(|| black_box(serde_json::from_str::<Value>(black_box(RESULT_200)).is_ok()));
}

/// Baseline: serde_json only skimming the same frame, building nothing.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn baseline_result_frame_skimmed(bencher: divan::Bencher) {
    bencher.bench(|| {
        black_box(serde_json::from_str::<serde::de::IgnoredAny>(black_box(RESULT_200)).is_ok())
    });
}

/// A manifest of 4 capabilities of 16 number params each (64 params), with
/// every param bounded (`minimum`, `maximum`, `integer`, `unit`) and the
/// dk extension opted in when `bounded`; plain 8DK params otherwise.
fn sixty_four_params(bounded: bool) -> Value {
    let param = |i: usize| {
        if bounded {
            serde_json::json!({"type": "number", "description": format!("setting {i}"),
                "required": i.is_multiple_of(2), "minimum": 0, "maximum": 100 + i, "integer": true, "unit": "%"})
        } else {
            serde_json::json!({"type": "number", "description": format!("setting {i}"),
                "required": i.is_multiple_of(2)})
        }
    };
    let capabilities: Vec<Value> = (0..4)
        .map(|c| {
            let params: serde_json::Map<String, Value> =
                (0..16).map(|i| (format!("p{i}"), param(i))).collect();
            serde_json::json!({"name": format!("set_group_{c}"), "kind": "actuator",
                "description": "Sets a group of settings.", "params": params})
        })
        .collect();
    let mut manifest = serde_json::json!({"id": "mixer", "name": "Mixer", "kind": "mixer",
        "version": "1.0.0", "capabilities": capabilities});
    if let (true, Some(map)) = (bounded, manifest.as_object_mut()) {
        map.insert("dk".to_owned(), serde_json::json!(1));
    }
    manifest
}

/// Baseline for the next: 64 params as 8DK declares them.
#[divan::bench(sample_count = 200, sample_size = 20)]
fn validate_and_digest_64_plain_params(bencher: divan::Bencher) {
    let manifest = sixty_four_params(false);
    bencher.bench(|| {
        black_box(
            validate_manifest(black_box(&manifest))
                .map(|m| m.digest())
                .is_ok(),
        )
    });
}

/// The same 64 params, each bounded, the dk extension opted in (its digest
/// is of the stored JSON, every bound in it).
#[divan::bench(sample_count = 200, sample_size = 20)]
fn validate_and_digest_64_bounded_params(bencher: divan::Bencher) {
    let manifest = sixty_four_params(true);
    assert!(validate_manifest(&manifest).is_ok_and(|m| m.extended()));
    bencher.bench(|| {
        black_box(
            validate_manifest(black_box(&manifest))
                .map(|m| m.digest())
                .is_ok(),
        )
    });
}
