//! `dk vessel --log-format json` at `DK_LOG=debug`: the fields of dk's own
//! events are plain values a log collector can match on, never Rust's
//! debug text. A device's connection that the vessel closes (it is
//! unpaired) is logged with the device's id, the close code and the reason
//! each a field of its own.

use std::path::Path;

use serde_json::{Map, Value};

use crate::durable::{DeviceRun, approve, connected};
use crate::person;
use crate::process::{Running, Scratch, eventually, succeeded};

/// The JSON events a vessel wrote so far on standard error, to `log`.
pub(crate) fn events(log: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(event)) => Some(event),
            _ => None,
        })
        .collect()
}

/// What Rust's debug formatting of an `Option`, a struct or an error chain
/// looks like.
pub(crate) fn debug_text(value: &str) -> bool {
    value.starts_with("Some(") || value.contains(" { ") || value.contains("Cause(")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_fields_are_plain_values() {
    let scratch = Scratch::new("log-fields");
    let dir = scratch.data_dir();
    let vessel = Running::start_env(&scratch, &["--log-format", "json"], &[("DK_LOG", "debug")]);
    let log = vessel.stdout.with_extension("err");
    let token = scratch.device_token_file("desk-lamp");
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &token);
    approve(&dir, "desk-lamp", "read_light").await;
    connected(&dir, &["desk-lamp"]).await;

    // Unpaired, the lamp is told so and its connection closed.
    succeeded(&person(&dir, &["devices", "unpair", "desk-lamp"]));
    let ended = eventually("the lamp's connection logged as ended", || async {
        events(&log)
            .into_iter()
            .find(|e| e["message"] == "device connection ended")
    })
    .await;
    assert_eq!(ended["device"], "desk-lamp", "{ended:?}");
    assert!(ended["close_code"].is_u64(), "{ended:?}");
    assert!(ended["close_reason"].is_string(), "{ended:?}");
    let _ = lamp.stop().await;
    vessel.terminate();

    // No field of dk's own events holds debug text (rmcp's are its own).
    let all = events(&log);
    assert!(!all.is_empty());
    for event in all
        .iter()
        .filter(|e| e["target"].as_str().is_some_and(|t| t.starts_with("dk")))
    {
        for (name, value) in event {
            if let Some(text) = value.as_str().filter(|_| name != "message") {
                assert!(!debug_text(text), "{name} in {event:?}");
            }
        }
    }
}
