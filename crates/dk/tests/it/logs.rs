//! `dk vessel --log-format json` at `DK_LOG=trace`, the most it says: a v1
//! device and a dk/2 device pair, calls are made through the admin API and
//! over MCP by an agent, a grant is revoked. Every line it writes on
//! standard error is a JSON object with a timestamp, a level, a target and
//! a message; each audit entry is an event with the entry's own field
//! names; and no secret is anywhere in the output: not the admin token, a
//! device token, the agent's credential, a pairing code, the vessel's or the
//! device's dk/2 key, nor the text an input carried.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_device::{ClientOptions, run_client};
use serde_json::{Map, Value, json};

use crate::durable::{DeviceRun, approve, call, connected, forms, notepad, token_in};
use crate::mcp_bridge::{Bridge, initialize};
use crate::person;
use crate::process::{Running, Scratch, audit_entries, succeeded};

/// The text a call carries that must never be logged. dk's manifests have
/// no way to mark a param secret, so no input is written to a log at all.
const SECRET_INPUT: &str = "correct-horse-battery-staple-7319";

/// Whether `text` holds `code` with no digit right before or after it.
fn holds_code(text: &str, code: &str) -> bool {
    text.match_indices(code).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + code.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_digit()) && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_at_trace_hold_every_event_and_no_secret() {
    let scratch = Scratch::new("logs");
    let dir = scratch.data_dir();
    let vessel = Running::start_env(
        &scratch,
        &["--log-format", "json"],
        &[("DK_LOG", "trace"), ("DK_LOG_FORMAT", "text")],
    );
    let admin = vessel.admin(&scratch);

    // A v1 device with a token, and a dk/2 device with a key of its own.
    let pad_token = scratch.device_token_file("notepad");
    let pad = DeviceRun::spawn(notepad(), &vessel.url(), &pad_token);
    approve(&dir, "notepad", "write_note").await;
    let lamp_key = scratch.root().join("desk-lamp.key");
    let lamp_codes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&lamp_codes);
    let options = ClientOptions::new(vessel.url())
        .key_file(&lamp_key)
        .on_code(move |code| seen.lock().unwrap().push(code.to_owned()))
        .backoff(Duration::from_millis(20), Duration::from_millis(100));
    let (stop_lamp, lamp_stopped) = tokio::sync::oneshot::channel::<()>();
    let lamp = tokio::spawn(async move {
        let lamp = dk_device::samples::lamp();
        run_client(&lamp, options, async move {
            let _ = lamp_stopped.await;
        })
        .await
    });
    approve(&dir, "desk-lamp", "read_light,set_light").await;
    connected(&dir, &["notepad", "desk-lamp"]).await;

    // Calls through the admin API: the secret input, a lamp call, a refusal.
    let outcome = call(
        &admin,
        "device__notepad__write_note",
        json!({"text": SECRET_INPUT}),
    )
    .await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    let outcome = call(&admin, "device__desk_lamp__set_light", json!({"on": true})).await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    let refused = call(&admin, "device__desk_lamp__strobe", json!({})).await;
    assert_eq!(refused["ok"], false, "{refused}");

    // An agent over MCP, with its credential, the secret input again.
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "main", "scope": ["notepad", "desk-lamp"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    let credential = added.body["credential"].as_str().unwrap().to_owned();
    let mut agent = Bridge::over_socket(&scratch, Some(&credential));
    initialize(&mut agent);
    let answer = agent.request(
        2,
        "tools/call",
        json!({"name": "device__notepad__write_note", "arguments": {"text": SECRET_INPUT}}),
    );
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    let (code, said) = agent.finish();
    assert_eq!(code, Some(0), "{said}");

    // A grant change, then a clean stop, which flushes the audit log.
    succeeded(&person(
        &dir,
        &["devices", "revoke", "desk-lamp", "set_light"],
    ));
    let pad_secret = token_in(&pad_token).await;
    let codes: Vec<String> = pad
        .codes()
        .into_iter()
        .chain(lamp_codes.lock().unwrap().iter().cloned())
        .collect();
    assert_eq!(codes.len(), 2, "{codes:?}");
    vessel.terminate();
    let _ = pad.stop().await;
    let _ = stop_lamp.send(());
    let _ = lamp.await;

    let text = std::fs::read_to_string(
        scratch
            .root()
            .read_dir()
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|path| path.extension().is_some_and(|ext| ext == "err"))
            .unwrap(),
    )
    .unwrap();

    // Every line an object with the four fields; the audit entries among them.
    let mut events: Vec<Map<String, Value>> = Vec::new();
    for line in text.lines() {
        let Ok(Value::Object(event)) = serde_json::from_str::<Value>(line) else {
            panic!("not a JSON object: {line}");
        };
        for field in ["timestamp", "level", "target", "message"] {
            assert!(event[field].is_string(), "no {field}: {line}");
        }
        events.push(event);
    }
    // rmcp and the vessel's connections say things at DEBUG and below.
    assert!(
        events.iter().any(|e| e["level"] == "DEBUG"),
        "nothing below info"
    );
    let logged: Vec<&Map<String, Value>> = events
        .iter()
        .filter(|e| e["target"] == "dk_store::audit" && e["message"] == "audit entry")
        .collect();
    let entries = audit_entries(&dir, 1000);
    let fields = [
        "deviceId",
        "agentId",
        "capability",
        "tool",
        "allowed",
        "reason",
        "rule",
        "channel",
        "sessionId",
    ];
    for entry in &entries {
        let event = logged
            .iter()
            .find(|e| e["seq"] == entry["seq"])
            .unwrap_or_else(|| panic!("no log event for {entry}"));
        assert_eq!(event["kind"], entry["kind"], "{entry}");
        for field in fields {
            let value = &entry["entry"][field];
            let expected = (value.is_string() || value.is_boolean()).then_some(value);
            assert_eq!(event.get(field), expected, "{field} of {entry}");
        }
    }
    let kinds: Vec<&str> = entries.iter().filter_map(|e| e["kind"].as_str()).collect();
    for kind in ["paired", "decision", "revoked", "agent"] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }

    // No secret, in any of its forms; no pairing code standing alone (a
    // timestamp's digits aside).
    let admin_secret = scratch.admin_token().expose().to_owned();
    let vessel_key = std::fs::read_to_string(scratch.home().join("vessel.key")).unwrap();
    let lamp_key = std::fs::read_to_string(&lamp_key).unwrap();
    let secrets = [
        ("the admin token", admin_secret.as_str()),
        ("the notepad's token", pad_secret.as_str()),
        ("the agent's credential", credential.as_str()),
        ("the vessel's dk/2 key", vessel_key.trim()),
        ("the lamp's dk/2 key", lamp_key.trim()),
        ("the secret input", SECRET_INPUT),
    ];
    for (name, secret) in secrets {
        assert!(secret.len() >= 32, "{name}: {secret:?}");
        for (form, bytes) in forms(secret) {
            let found = text
                .lines()
                .find(|line| line.as_bytes().windows(bytes.len()).any(|w| w == bytes));
            assert_eq!(found, None, "{name} ({form}) is in the log");
        }
    }
    for mut event in events {
        event.remove("timestamp");
        let line = Value::Object(event).to_string();
        for code in &codes {
            assert!(!holds_code(&line, code), "the pairing code {code}: {line}");
        }
    }
}
