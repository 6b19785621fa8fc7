//! The vessel's decision records through the audit writer: calls faster
//! than a slow disk wait for room, and abandoned calls are still recorded.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::store::testing::FaultyStore;
use crate::store::{MemoryStore, SqliteStore, Store, WriterOptions};

/// Answers every call at once, or never.
struct Link {
    answers: bool,
    called: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl crate::link::DeviceLink for Link {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        _: &'a serde_json::Map<String, Value>,
        _: Duration,
    ) -> futures::future::BoxFuture<'a, crate::link::InvokeResult> {
        if let Some(called) = self.called.lock().unwrap().take() {
            let _ = called.send(());
        }
        let answers = self.answers;
        Box::pin(async move {
            if !answers {
                futures::future::pending::<()>().await;
            }
            Ok(None)
        })
    }
}

/// A vessel over `store` with its audit writer as `options` says, and the
/// desk lamp paired with `set_light` and `strobe` granted on `link`.
async fn vessel_with_lamp(
    store: Arc<dyn Store>,
    options: WriterOptions,
    link: Link,
) -> Arc<crate::Vessel> {
    let vessel = crate::Vessel::open_with_writer(
        store,
        dk_policy::PolicySet::empty(),
        crate::Limits::default(),
        options,
    )
    .unwrap();
    let manifest = dk_testkit::lamp();
    vessel
        .registry()
        .pair(
            &manifest,
            |_| {},
            |_| async {
                Ok::<_, ()>(crate::registry::ConsentDecision::approve([
                    "set_light",
                    "strobe",
                ]))
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    vessel.links().connect("desk-lamp", Arc::new(link));
    vessel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_faster_than_a_slow_disk_wait_for_room_and_every_decision_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    // A slow disk: every audit append takes 2 ms longer.
    let slow = FaultyStore::over(SqliteStore::open(&dir.path().join("dk.db")).unwrap());
    slow.pause_audit(Duration::from_millis(2));
    let store: Arc<dyn Store> = Arc::new(slow);
    // Four places for 400 calls at once: most of them wait for room.
    let options = WriterOptions {
        max_batch: 8,
        max_delay: Duration::from_millis(1),
        queue: 4,
        ..WriterOptions::default()
    };
    let link = Link {
        answers: true,
        called: Mutex::new(None),
    };
    let vessel = vessel_with_lamp(Arc::clone(&store), options, link).await;
    let calls: Vec<_> = (0..400)
        .map(|n| {
            let vessel = Arc::clone(&vessel);
            tokio::spawn(async move {
                let ctx = crate::adapter::CallContext {
                    session_id: Some(&format!("s{n}")),
                    ..crate::adapter::CallContext::default()
                };
                vessel
                    .adapter()
                    .execute(
                        "device__desk_lamp__set_light",
                        json!({"on": true, "brightness": n % 100}),
                        ctx,
                    )
                    .await
                    .is_ok()
            })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap());
    }
    vessel.flush_audit().unwrap();
    let decisions: Vec<String> = store
        .read_audit(0, 1000)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "decision")
        .map(|e| e.entry["sessionId"].as_str().unwrap().to_owned())
        .collect();
    let sessions: BTreeSet<String> = decisions.iter().cloned().collect();
    assert_eq!((decisions.len(), sessions.len()), (400, 400));
    assert_eq!(vessel.audit_dropped(), 0);
    assert!(store.verify_audit().unwrap().is_intact());
}

/// The last decision entry of `vessel`'s log, once flushed.
fn last_decision(vessel: &crate::Vessel) -> Value {
    vessel.flush_audit().unwrap();
    let entries = vessel.registry().store().read_audit(0, 1000).unwrap();
    let last = entries.iter().rev().find(|e| e.kind == "decision").unwrap();
    last.entry.clone()
}

#[tokio::test]
async fn a_call_abandoned_half_way_is_still_recorded() {
    use crate::adapter::{ApprovalError, ApprovalRequest, ApproverFn, CallContext};
    // Abandoned while the person is asked: the device was not reached.
    let (called, asked) = tokio::sync::oneshot::channel::<()>();
    let called = Mutex::new(Some(called));
    let approver = ApproverFn(move |_: ApprovalRequest| {
        if let Some(called) = called.lock().unwrap().take() {
            let _ = called.send(());
        }
        futures::future::pending::<Result<bool, ApprovalError>>()
    });
    let link = Link {
        answers: false,
        called: Mutex::new(None),
    };
    let vessel =
        vessel_with_lamp(Arc::new(MemoryStore::new()), WriterOptions::default(), link).await;
    let ctx = CallContext {
        approver: Some(&approver),
        ..CallContext::default()
    };
    let call = vessel
        .adapter()
        .execute("device__desk_lamp__strobe", json!({}), ctx);
    tokio::select! {
        _ = call => panic!("the person never answers"),
        _ = asked => {}
    }
    let entry = last_decision(&vessel);
    assert_eq!(
        (&entry["tool"], &entry["allowed"], &entry["reason"]),
        (
            &json!("device__desk_lamp__strobe"),
            &json!(false),
            &json!("abandoned by the caller before the device was reached")
        ),
    );

    // Abandoned while the device is called: it was reached.
    let (called, reached) = tokio::sync::oneshot::channel::<()>();
    let link = Link {
        answers: false,
        called: Mutex::new(Some(called)),
    };
    vessel.links().connect("desk-lamp", Arc::new(link));
    let call = vessel.adapter().execute(
        "device__desk_lamp__set_light",
        json!({"on": true}),
        CallContext::default(),
    );
    tokio::select! {
        _ = call => panic!("the device never answers"),
        _ = reached => {}
    }
    let entry = last_decision(&vessel);
    assert_eq!(
        (&entry["tool"], &entry["allowed"], &entry["reason"]),
        (
            &json!("device__desk_lamp__set_light"),
            &json!(true),
            &json!("abandoned by the caller while the device was called")
        ),
    );
    let decisions = vessel
        .registry()
        .store()
        .read_audit(0, 100)
        .unwrap()
        .iter()
        .filter(|e| e.kind == "decision")
        .count();
    assert_eq!(decisions, 2);
    // Both are counted as the actuators they called, not as calls of an
    // unknown kind, and recorded with their device's channel.
    use crate::metrics::{CallDecision, CallKind};
    let abandoned = |kind| vessel.metrics().calls(kind, CallDecision::Abandoned);
    assert_eq!(
        (
            abandoned(CallKind::Actuator),
            abandoned(CallKind::Unknown),
            abandoned(CallKind::Sensor)
        ),
        (2, 0, 0)
    );
    assert_eq!(entry["channel"], "v1", "{entry}");
}
