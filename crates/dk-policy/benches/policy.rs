//! Policy benchmarks: `device_use` evaluation against growing rule files, and reading a file.
//!
//! Run with `cargo bench -p dk-policy`. Rules name `lamp-<i>` devices; the
//! call is for `front-door`, which no rule names, so an index that works
//! keeps evaluation flat as the file grows.

use std::fmt::Write as _;

use dk_policy::{DeviceUseContext, PolicySet};

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
