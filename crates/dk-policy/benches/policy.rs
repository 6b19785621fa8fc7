//! Policy benchmarks: `device_use` evaluation against growing rule files, and reading a file.
//!
//! Run with `cargo bench -p dk-policy`. Rules name `lamp-<i>` devices; the
//! call is for `front-door`, which no rule names, so an index that works
//! keeps evaluation flat as the file grows. Whole calls (`evaluate_call`)
//! are measured against rules that also read the input and the time.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dk_policy::{Call, DeviceUseContext, PolicySet, RateLog};

fn main() {
    divan::main();
}

fn rules_text(count: usize) -> String {
    let mut text = String::from("version: 1\npolicies:\n");
    for i in 0..count {
        let decision = match i % 3 {
            0 => "block",
            1 => "require_approval",
            _ => "allow",
        };
        let _ = write!(
            text,
            "  - name: rule-{i}\n    action: device_use\n    condition: \"deviceId equals lamp-{i} and capabilityKind equals actuator\"\n    decision: {decision}\n    message: \"rule {i}\"\n"
        );
    }
    if count == 0 {
        text.push_str("  []\n");
    }
    text
}

#[expect(
    clippy::panic,
    reason = "a benchmark whose rule file does not load must stop"
)]
fn rules(count: usize) -> PolicySet {
    PolicySet::from_yaml_str(&rules_text(count)).unwrap_or_else(|e| panic!("{e}"))
}

const UNNAMED: DeviceUseContext<'static> = DeviceUseContext {
    agent_id: Some("main"),
    session_id: Some("session-1"),
    device_id: "front-door",
    capability: "unlock",
    capability_kind: "actuator",
};

/// No rule names the device.
#[divan::bench(args = [10, 100, 1_000, 10_000])]
fn evaluate_device_use_no_match(bencher: divan::Bencher, count: usize) {
    let set = rules(count);
    bencher.bench_local(|| {
        set.evaluate_device_use(divan::black_box(&UNNAMED))
            .is_allowed()
    });
}

/// A rule names the device (in mixed case) and matches.
#[divan::bench(args = [10, 100, 1_000, 10_000])]
fn evaluate_device_use_match(bencher: divan::Bencher, count: usize) {
    let set = rules(count);
    let device = format!("LAMP-{}", count / 2);
    let ctx = DeviceUseContext {
        device_id: &device,
        ..UNNAMED
    };
    bencher.bench_local(|| set.evaluate_device_use(divan::black_box(&ctx)).is_allowed());
}

/// Reading and compiling a rule file.
#[divan::bench(args = [1_000])]
fn parse_file(bencher: divan::Bencher, count: usize) {
    let text = rules_text(count);
    bencher
        .bench_local(|| PolicySet::from_yaml_str(divan::black_box(&text)).map(|s| s.rules().len()));
}

/// Rules that also read the input and the time: `deviceId equals
/// thermostat-<i> and input.target > 25 and time in 23:00..06:00`, every
/// third one with a weekday. The call names one of them (and matches it).
fn call_rules_text(count: usize) -> String {
    let mut text = String::from("version: 1\ntimezone: Europe/Berlin\npolicies:\n");
    for i in 0..count {
        let weekday = if i % 3 == 0 {
            " and weekday in [mon, tue, wed, thu, fri, sat, sun]"
        } else {
            ""
        };
        let _ = write!(
            text,
            "  - name: rule-{i}\n    action: device_use\n    condition: \"deviceId equals thermostat-{i} and input.target > 25 and time in 23:00..06:00{weekday}\"\n    decision: block\n    message: \"rule {i}\"\n"
        );
    }
    text
}

#[expect(
    clippy::panic,
    reason = "a benchmark whose rule file does not load must stop"
)]
fn load(text: &str) -> PolicySet {
    PolicySet::from_yaml_str(text).unwrap_or_else(|e| panic!("{e}"))
}

/// 01:00 in Berlin on a winter night.
fn night() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_767_229_200)
}

/// A whole call against rules with input and time conditions: 10 vs 1,000 rules.
#[divan::bench(args = [10, 1_000])]
fn evaluate_call_input_and_time(bencher: divan::Bencher, count: usize) {
    let set = load(&call_rules_text(count));
    let device = format!("thermostat-{}", count / 2);
    let input = serde_json::json!({"target": 27});
    let call = Call {
        device: DeviceUseContext {
            device_id: &device,
            capability: "set_target",
            ..UNNAMED
        },
        input: input.as_object(),
        at: night(),
    };
    bencher.bench_local(|| set.evaluate_call(divan::black_box(&call)).is_allowed());
}

/// The cost of one input condition: a matching rule without, then with,
/// `input.target > 25`.
#[divan::bench(args = ["without", "with"])]
fn evaluate_call_one_input_condition(bencher: divan::Bencher, clause: &str) {
    let extra = if clause == "with" {
        " and input.target > 25"
    } else {
        ""
    };
    let set = load(&format!(
        "version: 1\npolicies:\n  - name: r\n    action: device_use\n    condition: \"deviceId equals thermostat and capability equals set_target{extra}\"\n    decision: block\n    message: m\n"
    ));
    let input = serde_json::json!({"mode": "heat", "target": 27});
    let call = Call {
        device: DeviceUseContext {
            device_id: "thermostat",
            capability: "set_target",
            ..UNNAMED
        },
        input: input.as_object(),
        at: night(),
    };
    bencher.bench_local(|| set.evaluate_call(divan::black_box(&call)).is_allowed());
}

/// Rules with a `limit` stay out of the index and are checked one by one
/// against the counts: 1,000 indexed rules plus 0 or 8 limited ones on the
/// thermostat, the first of them reached for the calling agent.
#[divan::bench(args = [0, 8])]
fn evaluate_call_counted(bencher: divan::Bencher, limited: usize) {
    let mut text = call_rules_text(1_000);
    for i in 0..limited {
        let _ = write!(
            text,
            "  - name: limit-{i}\n    action: device_use\n    condition: \"deviceId equals thermostat and capability equals set_target\"\n    decision: require_approval\n    limit: 3 per 1h\n    message: \"limit {i}\"\n"
        );
    }
    let set = load(&text);
    let mut counts = RateLog::default();
    if let Some(limit) = set.rules().iter().find_map(|r| r.limit()) {
        for _ in 0..3 {
            let _ = counts.record("limit-0", "main", limit, night());
        }
    }
    let input = serde_json::json!({"target": 21});
    let call = Call {
        device: DeviceUseContext {
            device_id: "thermostat",
            capability: "set_target",
            ..UNNAMED
        },
        input: input.as_object(),
        at: night(),
    };
    bencher.bench_local(|| {
        set.evaluate_call_counted(divan::black_box(&call), &counts)
            .decision
            .is_allowed()
    });
}
