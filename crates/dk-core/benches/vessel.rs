//! Benchmarks of the call path: `execute` of an allowed call over a link that
//! answers at once without serialising, with no rules and with 1,000 rules
//! that do not name the device; and `authenticate` with the manifest. Run
//! with `cargo xtask bench` (or `cargo bench -p dk-core`).

mod common;

use std::hint::black_box;
use std::sync::Arc;

use dk_core::{
    adapter::{CallContext, DeviceToolAdapter},
    link::Links,
    registry::DeviceRegistry,
};
use dk_policy::PolicySet;
use futures::FutureExt;
use serde_json::{Value, json};

use common::LAMP;

fn main() {
    divan::main();
}

/// `count` block / require_approval / allow rules, none naming `desk-lamp`.
fn rules(count: usize) -> String {
    let mut text = String::from("version: 1\npolicies:\n");
    let decisions = ["block", "require_approval", "allow"];
    for i in 0..count {
        let decision = decisions.get(i % 3).copied().unwrap_or("block");
        text.push_str(&format!(
            "  - name: rule-{i}\n    action: device_use\n    condition: \"deviceId equals lamp-{i} and capabilityKind equals actuator\"\n    decision: {decision}\n    message: rule {i}\n"
        ));
    }
    text
}

fn paired(rule_count: usize) -> Option<(DeviceToolAdapter, String)> {
    let registry = Arc::new(DeviceRegistry::new());
    let links = Arc::new(Links::new());
    let paired = common::pair_instant_lamp(&registry, &links).ok()?;
    let policies = match rule_count {
        0 => PolicySet::empty(),
        n => PolicySet::from_yaml_str(&rules(n)).ok()?,
    };
    let adapter = DeviceToolAdapter::new(registry, links).with_policies(Arc::new(policies));
    Some((adapter, paired.token.expose().to_owned()))
}

#[divan::bench(args = [0, 1000], sample_count = 200, sample_size = 200)]
fn execute_allowed_call(bencher: divan::Bencher, rule_count: usize) {
    let Some((adapter, _)) = paired(rule_count) else {
        return;
    };
    let ctx = CallContext {
        agent_id: Some("main"),
        session_id: Some("s1"),
        ..CallContext::default()
    };
    bencher
        .with_inputs(|| json!({"on": true, "brightness": 40}))
        .bench_local_values(|input| {
            let outcome = adapter
                .execute(black_box("device__desk_lamp__set_light"), input, ctx)
                .now_or_never();
            black_box(outcome.is_some_and(|o| o.is_ok()))
        });
}

#[divan::bench(sample_count = 200, sample_size = 200)]
fn authenticate_with_manifest(bencher: divan::Bencher) {
    let Some((adapter, token)) = paired(0) else {
        return;
    };
    let manifest: Value = serde_json::from_str(LAMP).unwrap_or_default();
    bencher.bench_local(|| {
        let auth = adapter.registry().authenticate(
            black_box("desk-lamp"),
            black_box(&token),
            Some(black_box(&manifest)),
        );
        black_box(auth.is_ok())
    });
}
