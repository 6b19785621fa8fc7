//! Bytes in a call's input (a `base64` param: a sound to play) reach the
//! device whole and the audit log only as their length and hash.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::store::{MemoryStore, Store, WriterOptions};

/// Keeps the input of the last call it was sent.
#[derive(Default)]
struct Keeps(Mutex<Option<Map<String, Value>>>);

impl crate::link::DeviceLink for Keeps {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        input: &'a Map<String, Value>,
        _: Duration,
    ) -> futures::future::BoxFuture<'a, crate::link::InvokeResult> {
        *self.0.lock().unwrap() = Some(input.clone());
        Box::pin(async { Ok(None) })
    }
}

#[tokio::test]
async fn a_base64_param_is_audited_as_its_length_and_hash() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let vessel = crate::Vessel::open_with_writer(
        Arc::clone(&store),
        dk_policy::PolicySet::empty(),
        crate::Limits::default(),
        WriterOptions::default(),
    )
    .unwrap();
    let manifest = json!({"id": "speaker", "name": "Speaker", "kind": "voice", "version": "1",
        "capabilities": [{"name": "play", "kind": "actuator", "description": "Play a sound.",
            "params": {"audio": {"type": "string", "required": true, "base64": true, "maxLength": 4000},
                       "label": {"type": "string"}}}]});
    vessel
        .registry()
        .pair(
            &manifest,
            |_| {},
            |_| async { Ok::<_, ()>(crate::registry::ConsentDecision::approve(["play"])) },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let link = Arc::new(Keeps::default());
    vessel.links().connect("speaker", link.clone());
    let sound = "UklGRiQAAABXQVZF".repeat(10);
    let outcome = vessel
        .adapter()
        .execute(
            "device__speaker__play",
            json!({"audio": sound, "label": "chime"}),
            crate::adapter::CallContext::default(),
        )
        .await;
    assert!(outcome.is_ok(), "{outcome:?}");
    // The device gets the bytes whole.
    let sent = link.0.lock().unwrap().clone().unwrap();
    assert_eq!(sent["audio"], sound.as_str());
    // The log, their length and hash, and the other params as they were.
    vessel.flush_audit().unwrap();
    let entries = store.read_audit(0, 100).unwrap();
    let decision = entries.iter().rev().find(|e| e.kind == "decision").unwrap();
    let text = decision.entry.to_string();
    assert!(!text.contains("UklGR"), "{text}");
    assert_eq!(
        decision.entry["input"],
        json!({"audio": {"bytes": 120, "sha256": crate::testing::rules::sha256(&sound)}, "label": "chime"})
    );
}
