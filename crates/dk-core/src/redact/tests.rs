//! Tests of the redactor: secrets known in clear and by hash, JSON, raw
//! event data, log lines, and a vessel's outputs (audit, events, admin API,
//! logs) with secrets planted in a device token, an event and a log line.

use dk_policy::PolicySet;
use dk_testkit::{LogBuffer, lamp};
use serde_json::json;

use super::*;
use crate::adapter::CallContext;
use crate::agents::{AgentRole, AgentScope};
use crate::testing::Peer;
use crate::vessel::{Limits, Vessel};

#[track_caller]
fn check_str(redactor: &SecretRedactor, input: &str, expected: &str) {
    assert_eq!(redactor.redact_str(input), expected);
}

#[test]
fn secrets_known_in_clear_are_replaced_wherever_they_occur() {
    let r = SecretRedactor::new();
    check_str(&r, "nothing to hide", "nothing to hide");
    r.add_secret("s3cret");
    r.add_secret("");
    r.add_secret("s3cret");
    check_str(
        &r,
        "a s3cret and s3crets3cret",
        "a [REDACTED] and [REDACTED][REDACTED]",
    );
    // A clone shares its secrets, both ways.
    let clone = r.clone();
    clone.add_secret("hunter2");
    check_str(&r, "hunter2", "[REDACTED]");
    assert!(!format!("{r:?}").contains("s3cret"));
    let value = json!({"s3cret": ["x s3cret", {"deep": "hunter2"}], "n": 1, "ok": true});
    assert_eq!(
        r.redact_json(&value),
        json!({"[REDACTED]": ["x [REDACTED]", {"deep": "[REDACTED]"}], "n": 1, "ok": true})
    );
}

#[test]
fn json_deeper_than_the_cap_is_cut_at_the_marker() {
    let r = SecretRedactor::new();
    let mut value = json!("bottom");
    for _ in 0..40 {
        value = json!([value]);
    }
    let out = r.redact_json(&value).to_string();
    assert!(out.contains(MAX_DEPTH_MARKER), "{out}");
    assert!(!out.contains("bottom"));
    let mut shallow = json!("bottom");
    for _ in 0..MAX_TELEMETRY_DEPTH {
        shallow = json!([shallow]);
    }
    assert_eq!(r.redact_json(&shallow), shallow);
}

#[test]
fn without_token_hashes_hex_is_never_touched() {
    let r = SecretRedactor::new();
    for len in [64, 192, 194, 5_000] {
        let run = "ab".repeat(len / 2);
        check_str(&r, &format!("blob {run}."), &format!("blob {run}."));
    }
}

#[test]
fn raw_json_is_passed_on_untouched_unless_it_holds_a_secret() {
    let r = SecretRedactor::new();
    r.add_secret("s3cret");
    let clean = RawValue::from_string(r#"{"on":true,"note":"fine"}"#.to_owned()).unwrap();
    assert!(r.redact_raw(&clean).is_none());
    let plain = RawValue::from_string(r#"{"note":"my s3cret","s3cret":1}"#.to_owned()).unwrap();
    assert_eq!(
        r.redact_raw(&plain).unwrap().get(),
        r#"{"note":"my [REDACTED]","[REDACTED]":1}"#
    );
    // Written with escapes, it is still found.
    let escaped = RawValue::from_string(r#"{"note":"my s\u0033cret"}"#.to_owned()).unwrap();
    assert_eq!(
        r.redact_raw(&escaped).unwrap().get(),
        r#"{"note":"my [REDACTED]"}"#
    );
    let escaped_clean = RawValue::from_string(r#"{"note":"a \"quote\""}"#.to_owned()).unwrap();
    assert!(r.redact_raw(&escaped_clean).is_none());
    // Too deep: cut at the marker even without a secret.
    let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    let deep = RawValue::from_string(deep).unwrap();
    assert!(
        r.redact_raw(&deep)
            .unwrap()
            .get()
            .contains(MAX_DEPTH_MARKER)
    );
}

#[test]
fn the_writer_redacts_whole_lines_even_when_a_secret_is_split_across_writes() {
    let r = SecretRedactor::new();
    r.add_secret("s3cret");
    let mut writer = r.writer(Vec::new());
    writer.write_all(b"one s3").unwrap();
    writer.write_all(b"cret\ntwo s3cr").unwrap();
    writer.write_all(b"et and a half").unwrap();
    let out = writer.into_inner().unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "one [REDACTED]\ntwo [REDACTED] and a half"
    );
    // What is held is written when the writer is dropped.
    let sink = LogBuffer::default();
    {
        let mut writer = r.writer(sink.clone());
        writer.write_all(b"last s3cret").unwrap();
    }
    assert_eq!(sink.bytes(), b"last [REDACTED]");
}

// --------------------------------------------------------- a whole vessel

#[tokio::test]
async fn tokens_known_only_by_hash_are_found_after_a_restart() {
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::MemoryStore::new());
    let first = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    let (_peer, device_token) = Peer::pair(&first, lamp(), &["set_light"]).await;
    let (_, agent) = first
        .add_agent("main", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let agent = agent.expose().to_owned();
    drop(first);
    let vessel = Vessel::open(store, PolicySet::empty(), Limits::default()).unwrap();
    let text = format!("{device_token} and {agent}, glued: a{device_token}b");
    let out = vessel.redactor().redact_str(&text).into_owned();
    assert_eq!(out, "[REDACTED] and dka_[REDACTED], glued: a[REDACTED]b");
    // A log writer made from the vessel's redactor, too.
    let mut writer = vessel.redactor().writer(Vec::new());
    writer
        .write_all(format!("token={device_token}\n").as_bytes())
        .unwrap();
    assert_eq!(writer.into_inner().unwrap(), b"token=[REDACTED]\n");
    // And nothing else is touched.
    let other = "0123456789abcdef".repeat(4);
    assert_eq!(vessel.redactor().redact_str(&other), other.as_str());
}

/// A vessel whose device token and agent credential are known only by
/// their hashes (opened again on the store that paired them), with both.
pub(crate) async fn vessel_knowing_tokens_by_hash() -> (Arc<Vessel>, String, String) {
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::MemoryStore::new());
    let first = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    let (_peer, device_token) = Peer::pair(&first, lamp(), &["set_light"]).await;
    let (_, agent) = first
        .add_agent("main", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let agent = agent.expose().to_owned();
    drop(first);
    let vessel = Vessel::open(store, PolicySet::empty(), Limits::default()).unwrap();
    (vessel, device_token, agent)
}

/// Random lower-case hex, `len` characters: no secret.
pub(crate) fn random_hex(len: usize) -> String {
    (0..len)
        .map(|_| char::from(b"0123456789abcdef"[rand::random_range(0..16)]))
        .collect()
}

/// What the redactor makes of a hex run longer than one call's budget:
/// the part its windows covered, then a cut saying how much is left out.
fn past_budget(run: &str) -> String {
    let kept = run.get(..MAX_HASHED_WINDOWS).unwrap();
    let cut = run.len() - MAX_HASHED_WINDOWS;
    format!("{kept}[cut: {cut} hex characters past the redaction budget]")
}

#[tokio::test]
async fn only_hex_that_is_a_token_is_replaced() {
    let (vessel, token, agent) = vessel_knowing_tokens_by_hash().await;
    let hex = agent.trim_start_matches(AGENT_CREDENTIAL_PREFIX);
    let (a, b) = (random_hex(64), random_hex(300));
    // One window more than a call hashes.
    let over = random_hex(MAX_HASHED_WINDOWS + 64);
    let over_then_token = format!("{}{token}", random_hex(MAX_HASHED_WINDOWS));
    let cases: Vec<(String, String)> = vec![
        // No secret, however long, is kept as it is.
        (a.clone(), a.clone()),
        (format!("sha256:{b}"), format!("sha256:{b}")),
        // Tokens, alone, glued to more hex, inside random runs, after dka_.
        (token.clone(), REDACTED.to_owned()),
        (format!("00ff{token}beef"), "00ff[REDACTED]beef".to_owned()),
        (format!("{a}{token}{a}"), format!("{a}[REDACTED]{a}")),
        (agent.clone(), "dka_[REDACTED]".to_owned()),
        (format!("{a}{hex}"), format!("{a}[REDACTED]")),
        (format!("{token}{hex}"), "[REDACTED][REDACTED]".to_owned()),
        // Past the budget the rest of a run is cut, saying how much: not
        // kept unchecked, not passed off as a secret.
        (over.clone(), past_budget(&over)),
        (over_then_token.clone(), past_budget(&over_then_token)),
    ];
    for (input, expected) in cases {
        assert_eq!(vessel.redactor().redact_str(&input), expected, "{input}");
    }
}

#[tokio::test]
async fn one_call_hashes_a_bounded_number_of_windows_then_cuts_what_is_left() {
    let (vessel, token, _) = vessel_knowing_tokens_by_hash().await;
    let digest = random_hex(64);
    let mut parts = vec![digest.as_str(); MAX_HASHED_WINDOWS];
    parts.extend([token.as_str(), digest.as_str()]);
    let out = vessel.redactor().redact_str(&parts.join(" ")).into_owned();
    // Neither the token after the budget nor the digest is shown: both are
    // cut, each saying how much.
    let cut = "[cut: 64 hex characters past the redaction budget]";
    let mut expected = vec![digest.as_str(); MAX_HASHED_WINDOWS];
    expected.extend([cut, cut]);
    assert_eq!(out, expected.join(" "));
    // The budget is per call: the next call starts afresh.
    assert_eq!(vessel.redactor().redact_str(&token), REDACTED);
    assert_eq!(vessel.redactor().redact_str(&digest), digest.as_str());
}

/// The input of the vessel's last decision entry, once `input` was called.
async fn audited_input(vessel: &Vessel, input: Value) -> Value {
    vessel
        .adapter()
        .execute("device__desk_lamp__x", input, CallContext::default())
        .await;
    vessel.flush_audit().unwrap();
    let entries = vessel.registry().store().read_audit(0, 1000).unwrap();
    let last = entries.iter().rev().find(|e| e.kind == "decision").unwrap();
    last.entry["input"].clone()
}

#[tokio::test]
async fn an_agent_cannot_keep_its_input_out_of_the_log_and_no_secret_gets_in() {
    let (vessel, token, agent) = vessel_knowing_tokens_by_hash().await;
    let hex = agent.trim_start_matches(AGENT_CREDENTIAL_PREFIX);
    let key = random_hex(64);
    let long = random_hex(200);
    // A token across the 256-character cut, and one starting past it:
    // neither reaches the entry, not even in part.
    let across = format!("{}{token}{}", random_hex(230), random_hex(100));
    let late = format!("{}{token}", random_hex(300));
    let input = json!({
        "key": key, "long": long, "token": format!("t={token}"), "agent": agent,
        "glued": format!("{key}{hex}"), "across": across, "late": late,
    });
    let logged = audited_input(&vessel, input).await;
    let text = logged.to_string();
    for (field, expected) in [
        ("key", key.clone()),
        ("long", long.clone()),
        ("token", "t=[REDACTED]".to_owned()),
        ("agent", "dka_[REDACTED]".to_owned()),
        ("glued", format!("{key}[REDACTED]")),
        (
            "across",
            format!(
                "{}[REDACTED][cut: 138 more characters]",
                across.get(..230).unwrap()
            ),
        ),
        (
            "late",
            format!("{}[cut: 108 more characters]", late.get(..256).unwrap()),
        ),
    ] {
        assert_eq!(logged[field], json!(expected), "{field}: {text}");
    }
    for part in [token.get(..16).unwrap(), hex.get(..16).unwrap()] {
        assert!(!text.contains(part), "part of a secret: {text}");
    }
}

#[tokio::test]
async fn an_input_too_large_for_one_entry_still_leaves_its_decision() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    // 64 x 64 strings cut to 256 characters: about 1 MiB in the log's form.
    let row: Vec<String> = (0..64).map(|_| "x".repeat(300)).collect();
    let logged = audited_input(&vessel, json!({ "rows": vec![row; 64] })).await;
    let marker = logged.as_str().unwrap();
    assert!(
        marker.starts_with("[cut: the input takes ") && marker.ends_with("too many for one entry]"),
        "{marker}"
    );
}

#[test]
fn redaction_hides_secrets_and_cuts_long_values() {
    let token = "f00dfeedf00dfeedf00dfeed";
    let input = json!({
        "text": format!("my token is {token}"),
        token: 1,
        "long": "y".repeat(dk_store::MAX_AUDIT_STRING + 10),
        "list": (0..dk_store::MAX_AUDIT_ITEMS + 3).collect::<Vec<_>>(),
        "deep": [[[[[[[[[["bottom"]]]]]]]]]],
        "ok": 3.5,
    });
    let out = redact_for_audit(&input, &[token, ""]);
    assert_eq!(out["text"], "my token is [REDACTED]");
    assert_eq!(out["[REDACTED]"], 1);
    assert!(!out.to_string().contains(token));
    let long = out["long"].as_str().unwrap();
    assert!(long.starts_with(&"y".repeat(dk_store::MAX_AUDIT_STRING)));
    assert!(long.ends_with("[cut: 10 more characters]"), "{long}");
    let list = out["list"].as_array().unwrap();
    assert_eq!(list.len(), dk_store::MAX_AUDIT_ITEMS + 1);
    assert_eq!(list[dk_store::MAX_AUDIT_ITEMS], "[cut: 3 more items]");
    assert!(out["deep"].to_string().contains("[cut: nested too deep]"));
    assert!(!out["deep"].to_string().contains("bottom"));
    assert_eq!(out["ok"], 3.5);
}

/// A decision's record redacted where it stands is what the copy gives,
/// tokens known by hash, secrets in keys, long and over-budget values
/// included.
#[tokio::test]
async fn redacting_in_place_gives_what_the_copy_gives() {
    let (vessel, token, agent) = vessel_knowing_tokens_by_hash().await;
    let long = format!("{}{token}{}", "x".repeat(250), random_hex(40));
    let over = random_hex(MAX_HASHED_WINDOWS + 64);
    let record = json!({
        "tool": "device__desk_lamp__set_light",
        "reason": format!("agent {agent} asked"),
        token.clone(): "a key that is a token",
        "long": long,
        "over": over,
        "items": (0..70).map(|i| format!("{i}{token}")).collect::<Vec<_>>(),
        "deep": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": token.clone()}}}}}}}}},
        "plain": 7,
    });
    let copied = vessel.redactor().redact_for_audit(&record);
    let in_place = vessel.redactor().redact_owned_for_audit(record.clone());
    assert_eq!(in_place.to_string(), copied.to_string());
    assert!(!in_place.to_string().contains(&token));
    assert_ne!(in_place, record);
}
