//! Tests of rule reloading: a good file applies, a broken one changes nothing.

use std::sync::Mutex;

use dk_policy::{Decision, DeviceUseContext};
use futures::channel::mpsc;

use super::*;
use crate::vessel::Limits;

const ASK: &str = "version: 1\npolicies:\n  - name: ask\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: require_approval\n    message: ask first\n";
const BLOCK: &str = "version: 1\npolicies:\n  - name: block\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: block\n    message: no\n";
const BROKEN: &str = "version: 1\npolicies:\n  - name: block\n    action: device_use\n    condition: \"capabilityKnd equals actuator\"\n    decision: block\n    message: no\n";

fn decision_kind(vessel: &Vessel) -> &'static str {
    let policies = vessel.adapter().policies();
    let ctx = DeviceUseContext {
        agent_id: None,
        session_id: None,
        device_id: "lamp",
        capability: "set",
        capability_kind: "actuator",
    };
    match policies.evaluate_device_use(&ctx) {
        Decision::Allow { .. } => "allow",
        Decision::RequireApproval { .. } => "ask",
        Decision::Block { .. } => "block",
    }
}

/// A rule file's path in a directory of its own, removed when the
/// directory is dropped.
fn file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    (dir, path)
}

#[test]
fn a_good_file_applies_and_a_broken_one_changes_nothing() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let (_dir, path) = file();
    std::fs::write(&path, ASK).unwrap();
    assert_eq!(
        vessel.reload_policies(&path),
        Reloaded::Applied { rules: 1 }
    );
    assert_eq!(decision_kind(&vessel), "ask");
    std::fs::write(&path, BROKEN).unwrap();
    let Reloaded::Refused { errors } = vessel.reload_policies(&path) else {
        panic!("accepted a broken file")
    };
    assert!(errors.contains("capabilityKnd"), "{errors}");
    assert_eq!(decision_kind(&vessel), "ask", "the old rules stay in force");
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        vessel.reload_policies(&path),
        Reloaded::Refused { .. }
    ));
    assert_eq!(decision_kind(&vessel), "ask");
}

#[tokio::test(start_paused = true)]
async fn the_watcher_follows_the_file_and_requests() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let (_dir, path) = file();
    std::fs::write(&path, ASK).unwrap();
    let (ask_tx, ask_rx) = mpsc::unbounded::<()>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let watcher = tokio::spawn(watch_policy_file(
        Arc::clone(&vessel),
        path.clone(),
        FileStamp::of(&path),
        Duration::from_secs(1),
        ask_rx,
        move |r: &Reloaded| sink.lock().unwrap().push(r.clone()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    // Asked: reload even though the file did not change.
    ask_tx.unbounded_send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [Reloaded::Applied { rules: 1 }]
    );
    // A changed file is picked up at the next look.
    std::fs::write(&path, format!("{BLOCK}\n# changed\n")).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(decision_kind(&vessel), "block");
    std::fs::write(&path, BROKEN).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        seen.lock().unwrap().last(),
        Some(Reloaded::Refused { .. })
    ));
    assert_eq!(decision_kind(&vessel), "block");
    // The request side closing leaves the file watch running.
    drop(ask_tx);
    std::fs::write(&path, ASK).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(decision_kind(&vessel), "ask");
    stop_tx.send(()).unwrap();
    watcher.await.unwrap();
}
