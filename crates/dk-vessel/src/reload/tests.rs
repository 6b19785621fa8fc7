//! Tests of the rule file's watch: a change of the file and a request each
//! reload it, and the watch outlives the request side.

use std::sync::Mutex;

use dk_policy::PolicySet;
use futures::channel::mpsc;

use super::*;
use crate::Limits;
use dk_core::testing::rules::{ASK, BLOCK, BROKEN, decision_kind, sha256};

/// A rule file's path in a directory of its own, removed when the
/// directory is dropped.
fn file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    (dir, path)
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
        [Reloaded::Applied {
            rules: 1,
            sha256: sha256(ASK)
        }]
    );
    // A changed file is picked up at the next look.
    std::fs::write(&path, format!("{BLOCK}\n# changed\n")).unwrap();
    // The paused clock past the next look (every second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(decision_kind(&vessel), "block");
    std::fs::write(&path, BROKEN).unwrap();
    // The paused clock past the next look (every second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        seen.lock().unwrap().last(),
        Some(Reloaded::Refused { .. })
    ));
    assert_eq!(decision_kind(&vessel), "block");
    // The request side closing leaves the file watch running.
    drop(ask_tx);
    std::fs::write(&path, ASK).unwrap();
    // The paused clock past the next look (every second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(decision_kind(&vessel), "ask");
    stop_tx.send(()).unwrap();
    watcher.await.unwrap();
}
