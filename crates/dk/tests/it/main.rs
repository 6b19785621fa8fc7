//! The `dk` binary, run as a user runs it, on the shared fixtures.

#![cfg(test)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

mod agents;
mod approvals;
mod audit_reading;
mod backup;
mod backup_words;
mod bounds;
mod bridge_mcp;
mod bridge_mqtt;
mod c_device;
mod c_lamp;
mod c_thermostat;
mod console;
mod crash;
mod desktop;
mod desktop_no_display;
mod device_files;
mod durable;
mod files;
mod fleet;
mod fleet_seams;
mod frozen_store;
mod full_disk;
mod log_fields;
mod logs;
mod mcp_bridge;
mod members;
mod network;
mod postgres;
mod process;
mod prometheus;
mod prompt_pty;
mod service;
mod slow_http;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// `dk ARGS` with a `DK_HOME` of its own, removed after it.
fn dk(args: &[&str]) -> Output {
    let home = tempfile::TempDir::new().unwrap();
    Command::new(env!("CARGO_BIN_EXE_dk"))
        .args(args)
        .env("DK_HOME", home.path())
        .output()
        .unwrap()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.to_string_lossy().ends_with(ext) && !p.to_string_lossy().ends_with(".canonical.json")
        })
        .collect();
    paths.sort();
    paths
}

#[track_caller]
fn check_json(args: &[&str], code: i32, expected: Value) {
    let out = dk(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, expected, "{args:?}");
}

#[test]
fn manifest_check_gives_8dk_digests_and_messages() {
    for path in files(&fixtures().join("manifests/valid"), ".json") {
        let digest = std::fs::read_to_string(path.with_extension("digest")).unwrap();
        check_json(
            &["manifest", "check", "--json", path.to_str().unwrap()],
            0,
            json!({"valid": true, "digest": digest.trim()}),
        );
    }
    for path in files(&fixtures().join("manifests/invalid"), ".json") {
        let error = std::fs::read_to_string(path.with_extension("error")).unwrap();
        check_json(
            &["manifest", "check", "--json", path.to_str().unwrap()],
            1,
            json!({"valid": false, "error": error.trim_end_matches('\n')}),
        );
    }
    let out = dk(&["manifest", "check", "/nonexistent/lamp.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("invalid: cannot read"));
}

#[test]
fn plain_output_escapes_what_could_drive_a_terminal() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("evil.json");
    let manifest = json!({"id":"lamp","name":"n","kind":"k","version":"1","capabilities":[
        {"name":"c","kind":"actuator","description":"d","params":{"x\u{1b}[2J":{"type":"string"}}}]});
    std::fs::write(&path, manifest.to_string()).unwrap();
    let out = dk(&["manifest", "check", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("\\u{1b}"), "{text:?}");
}

#[test]
fn policy_check_refuses_broken_files_whole() {
    for path in files(&fixtures().join("policies/good"), ".yaml") {
        let out = dk(&["policy", "check", path.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let bad = files(&fixtures().join("policies/bad"), ".yaml");
    assert!(!bad.is_empty());
    for path in bad {
        let out = dk(&["policy", "check", "--json", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{}", path.display());
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["valid"], json!(false));
        assert!(!got["errors"].as_array().unwrap().is_empty());
    }
}

#[test]
fn policy_lint_warns_and_denies_on_request() {
    let cases = files(&fixtures().join("policies/lint"), ".yaml");
    assert!(!cases.is_empty());
    for path in cases {
        let file = path.to_str().unwrap();
        let expected = std::fs::read_to_string(path.with_extension("expected")).unwrap();
        let refused = expected.starts_with("error:");
        let warned = expected.starts_with("warning:");
        let out = dk(&["policy", "lint", file]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{file}");
        assert_eq!(out.status.code(), Some(i32::from(refused)), "{file}");
        let out = dk(&["policy", "lint", "--deny-warnings", "--json", file]);
        assert_eq!(
            out.status.code(),
            Some(i32::from(refused || warned)),
            "{file}"
        );
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["valid"], json!(!refused), "{file}");
        if !refused {
            let lines = expected
                .lines()
                .filter(|l| l.starts_with("warning:"))
                .count();
            assert_eq!(got["warnings"].as_array().unwrap().len(), lines, "{file}");
        }
    }
}

#[test]
fn policy_explain_names_the_rule() {
    let file = fixtures().join("policies/good/lamp-approval.yaml");
    let file = file.to_str().unwrap();
    let actuator = r#"{"deviceId":"desk-lamp","capability":"set_light","capabilityKind":"actuator","agentId":"main"}"#;
    let out = dk(&["policy", "explain", file, "--context", actuator, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["decision"], json!("require_approval"));
    assert!(got["rule"].is_string() && got["reason"].as_str().unwrap().starts_with('['));

    let shadow = r#"{"deviceId":"desk-lamp","capability":"read_light","capabilityKind":"sensor","agentId":"__shadow__"}"#;
    let out = dk(&["policy", "explain", file, "--context", shadow, "--json"]);
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (got["decision"].as_str(), got["rule"].is_null()),
        (Some("block"), true)
    );
    assert!(got["reason"].as_str().unwrap().starts_with("[shadow-deny]"));

    let nobody = r#"{"deviceId":"hall-thermostat","capability":"read_temperature","capabilityKind":"sensor","agentId":"main"}"#;
    check_json(
        &["policy", "explain", file, "--context", nobody, "--json"],
        0,
        json!({"decision": "allow", "rule": null, "reason": null}),
    );
    for bad in ["[1]", "{\"deviceId\": 5}", "not json"] {
        assert_eq!(
            dk(&["policy", "explain", file, "--context", bad])
                .status
                .code(),
            Some(1),
            "{bad}"
        );
    }
    // A misspelt key would read as missing and answer `allow`.
    let fields = "use deviceId, capability, capabilityKind, agentId, sessionId";
    let cases = [
        (
            r#"{"deviceId":"desk-lamp","capabilty":"set_light","capabilityKind":"actuator"}"#,
            format!(
                "error: --context key `capabilty` is not a field of a device_use call: {fields}\n"
            ),
        ),
        (
            r#"{"deviceID":"desk-lamp"}"#,
            format!(
                "error: --context key `deviceID` is not a field of a device_use call: {fields}\n"
            ),
        ),
    ];
    for (context, message) in cases {
        let out = dk(&["policy", "explain", file, "--context", context]);
        assert_eq!(out.status.code(), Some(1), "{context}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), message, "{context}");
    }
    // Another action's context keys are its own.
    check_json(
        &[
            "policy",
            "explain",
            file,
            "--action",
            "write_file",
            "--context",
            r#"{"path":"/tmp/x"}"#,
            "--json",
        ],
        0,
        json!({"decision": "allow", "rule": null, "reason": null}),
    );
}

#[test]
fn tools_prints_the_v1_definitions() {
    let lamp = fixtures().join("manifests/valid/desk-lamp.json");
    let out = dk(&[
        "tools",
        "--manifest",
        lamp.to_str().unwrap(),
        "--grant",
        "set_light,strobe",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let tools: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["device__desk_lamp__set_light", "device__desk_lamp__strobe"]
    );
    assert_eq!(
        tools[0]["function"]["parameters"]["required"],
        json!(["on"])
    );
    let out = dk(&[
        "tools",
        "--manifest",
        lamp.to_str().unwrap(),
        "--grant",
        "fly",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: grant names unknown capability: fly"
    );
    let none = dk(&["tools", "--manifest", lamp.to_str().unwrap()]);
    assert_eq!(
        serde_json::from_slice::<Value>(&none.stdout).unwrap(),
        json!([])
    );
}

/// `dk ARGS` for the person, with the `DK_HOME` whose vessel's data
/// directory is `data_dir`, run from elsewhere.
fn person(data_dir: &Path, args: &[&str]) -> Output {
    let home = data_dir.parent().unwrap();
    Command::new(env!("CARGO_BIN_EXE_dk"))
        .args(args)
        .env("DK_HOME", home)
        .current_dir(home.parent().unwrap())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_process_and_the_persons_commands() {
    let scratch = process::Scratch::new("commands");
    let vessel = process::Running::start(&scratch);
    let url = vessel.url();
    let dir = scratch.data_dir();
    let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = std::sync::Arc::clone(&shown);
    let options = dk_device::ClientOptions::new(url)
        .on_code(move |code| *seen.lock().unwrap() = code.to_owned())
        .backoff(
            std::time::Duration::from_millis(20),
            std::time::Duration::from_millis(100),
        );
    let lamp = dk_device::samples::lamp();
    let client =
        tokio::spawn(
            async move { dk_device::run_client(&lamp, options, std::future::pending()).await },
        );

    // The person lists the request and checks the code the device shows.
    let request = process::eventually("the lamp's pairing request", || async {
        let out = person(&dir, &["pairings", "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        list.as_array().and_then(|l| l.first()).cloned()
    })
    .await;
    assert_eq!(request["request"]["deviceId"], "desk-lamp");
    assert_eq!(
        request["request"]["code"].as_str(),
        Some(shown.lock().unwrap().as_str())
    );
    let plain = String::from_utf8(person(&dir, &["pairings"]).stdout).unwrap();
    assert!(
        plain.contains("desk-lamp") && plain.contains("asks every time"),
        "{plain}"
    );

    let id = request["id"].to_string();
    let out = person(
        &dir,
        &[
            "pairings",
            "approve",
            &id,
            "--grant",
            "set_light,read_light",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let devices = process::eventually("the lamp connected", || async {
        let out = person(&dir, &["devices", "--json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        (list[0]["connected"] == true).then_some(list)
    })
    .await;
    assert_eq!(devices[0]["grants"], json!(["read_light", "set_light"]));
    // Each capability with its params: what a rule's `input.` may name.
    let listed = String::from_utf8(person(&dir, &["devices"]).stdout).unwrap();
    let capabilities: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(
        capabilities,
        [
            "  read_light (sensor): no params",
            "  set_light (actuator): on (boolean, required: true for on), brightness (number: 0-100)",
            "  strobe (actuator, asks every time): no params",
        ],
        "{listed}"
    );
    assert_eq!(
        devices[0]["capabilities"][1]["params"][0],
        json!({"name": "on", "type": "boolean", "required": true, "description": "true for on"})
    );
    assert_eq!(
        person(&dir, &["devices", "revoke", "desk-lamp", "set_light"])
            .status
            .code(),
        Some(0)
    );
    let out = person(&dir, &["devices", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()[0]["grants"],
        json!(["read_light"])
    );
    let refused = person(&dir, &["devices", "grant", "desk-lamp", "fly"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("has no capability \"fly\""));
    assert_eq!(person(&dir, &["approvals"]).status.code(), Some(0));

    // Unpairing ends the device's session for good.
    assert_eq!(
        person(&dir, &["devices", "unpair", "desk-lamp"])
            .status
            .code(),
        Some(0)
    );
    let ended = client.await.unwrap();
    assert!(
        matches!(ended, Err(dk_device::ClientError::Unpaired)),
        "{ended:?}"
    );
    drop(vessel);
    // No running vessel: a clear error, not a hang.
    let out = person(&dir, &["pairings"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn demo_runs_to_the_end() {
    let out = dk(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "pairing code",
        "over dk/2 I computed the pairing code myself",
        "encrypted (dk/2)",
        "the vessel's key is pinned",
        "demo approver",
        "\"ok\":true",
        "is not granted",
        "asks every time",
        "was revoked",
        "[audit]",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn a_running_vessel_reloads_its_rules_and_refuses_a_broken_file() {
    let scratch = tempfile::TempDir::new().unwrap();
    let dir = scratch.path();
    let rules = dir.join("rules.yaml");
    let good = "version: 1\npolicies:\n  - name: ask\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: require_approval\n    message: ask first\n";
    std::fs::write(&rules, good).unwrap();
    let log = dir.join("vessel.log");
    let child = Command::new(env!("CARGO_BIN_EXE_dk"))
        .args([
            "vessel",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--no-prompt",
            "--policies",
        ])
        .arg(&rules)
        .env("DK_HOME", dir.join("home"))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("vessel.err")).unwrap())
        .spawn()
        .unwrap();
    let vessel = process::Running {
        child: Some(child),
        devices: "127.0.0.1:1".parse().unwrap(),
        admin: "127.0.0.1:1".parse().unwrap(),
        mcp: None,
        stdout: log.clone(),
    };
    let wait_for = |file: &str, text: &str, count: usize| {
        // Generous: a loaded machine may take seconds to start a debug build.
        dk_testkit::eventually_blocking_within(
            &format!("{text:?} x{count} in {file}"),
            dk_testkit::PATIENCE * 3 / 2,
            || {
                let content = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
                content.matches(text).count() >= count
            },
        );
    };
    wait_for("vessel.log", "device_use rules     1", 1);
    // A changed, broken file is refused loudly; the rules stay.
    // Whole files, as an editor saves them: written aside, then renamed.
    let replace = |text: &str| {
        let aside = dir.join("rules.yaml.new");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &rules).unwrap();
    };
    replace("version: 1\npolicies:\n  - name: oops\n    action: device_use\n");
    wait_for("vessel.err", "REFUSED", 1);
    wait_for("vessel.err", "missing `condition`", 1);
    // A good file again, and a SIGHUP: both reload.
    replace(&format!(
        "{good}  - name: two\n    action: device_use\n    condition: \"deviceId equals x\"\n    decision: block\n    message: no\n"
    ));
    wait_for("vessel.log", "reloaded: 2 rules in force", 1);
    let pid = vessel.child.as_ref().unwrap().id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for("vessel.log", "reloaded: 2 rules in force", 2);
    drop(vessel);
}

#[test]
fn policy_conformance_runs_the_six_cases() {
    let good = fixtures().join("admission/good");
    let mut ran = 0;
    for path in files(&good, ".json") {
        let out = dk(&["policy", "conformance", "--json", path.to_str().unwrap()]);
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        match out.status.code() {
            Some(0) => assert_eq!(
                got["passed"],
                json!([
                    "denial-by-default",
                    "approval-gate",
                    "session-budget",
                    "run-accounting",
                    "stream-bounds",
                    "redaction"
                ])
            ),
            Some(1) => assert!(
                got["failed"].is_string()
                    && got["code"]
                        .as_str()
                        .unwrap()
                        .starts_with("ERR_PRISM_DEVICE_"),
                "{got}"
            ),
            other => panic!("{other:?}"),
        }
        ran += 1;
    }
    assert!(ran >= 3);
    // An empty sandbox cannot pass the approval gate.
    let dir = tempfile::TempDir::new().unwrap();
    let config = dir.path().join("voice.json");
    std::fs::write(
        &config,
        json!({"kind": "voice", "policy": {"enabled": true, "sandbox": ""}}).to_string(),
    )
    .unwrap();
    let out = dk(&["policy", "conformance", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("FAILED  approval-gate (ERR_PRISM_DEVICE_APPROVAL)")
    );
    let bad = dk(&[
        "policy",
        "conformance",
        fixtures()
            .join("admission/bad/kind-misspelt.json")
            .to_str()
            .unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(1));
}

/// Every `NAME.cases.yaml` of the fixtures holds for `NAME.yaml`; every
/// `NAME.wrong.cases.yaml` fails, and says which cases and how.
#[test]
fn policy_test_runs_tables_of_cases() {
    let dir = fixtures().join("policies/cases");
    let mut ran = 0;
    for cases in files(&dir, ".cases.yaml") {
        let name = cases.file_name().unwrap().to_string_lossy().into_owned();
        let wrong = name.ends_with(".wrong.cases.yaml");
        let stem = name
            .trim_end_matches(".cases.yaml")
            .trim_end_matches(".wrong");
        let rules = dir.join(format!("{stem}.yaml"));
        let out = dk(&[
            "policy",
            "test",
            rules.to_str().unwrap(),
            cases.to_str().unwrap(),
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let summary = stdout.lines().last().unwrap_or_default().to_owned();
        if wrong {
            assert_eq!(out.status.code(), Some(1), "{name}: {stdout}");
            assert!(stdout.lines().any(|l| l.starts_with("FAIL  ")), "{name}");
            assert!(!summary.ends_with(" 0 failed"), "{name}: {summary}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{name}: {stdout}");
            assert!(summary.ends_with(" 0 failed"), "{name}: {summary}");
            assert!(!stdout.contains("FAIL"), "{name}: {stdout}");
        }
        ran += 1;
    }
    assert!(ran >= 2, "{ran}");

    let rules = dir.join("front-door.yaml");
    let rules = rules.to_str().unwrap();
    let wrong = dir.join("front-door.wrong.cases.yaml");
    let out = dk(&["policy", "test", rules, wrong.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "FAIL  the fourth unlock of the hour goes through: expected allow, got require_approval by `unlocks-per-hour`\n\
         FAIL  a guest is asked: expected block by `unlocks-per-hour`, got block by `no-guest-unlocks`\n\
         ok    the first unlock goes through: allow (no rule)\n\
         1 passed, 2 failed\n"
    );
    let out = dk(&["policy", "test", rules, wrong.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (got["passed"].clone(), got["failed"].clone()),
        (json!(1), json!(2))
    );
    assert_eq!(
        got["cases"][1],
        json!({"name": "a guest is asked", "passed": false,
               "expected": {"decision": "block", "rule": "unlocks-per-hour"},
               "got": {"decision": "block", "rule": "no-guest-unlocks",
                       "reason": "[no-guest-unlocks] Guests cannot unlock the front door"}})
    );

    // A cases file with any error is refused whole, saying what is wrong.
    let lock = "{deviceId: front-door, capability: unlock, capabilityKind: actuator}";
    let bad = [
        (
            format!("cases:\n  - name: a\n    context: {lock}\n    expect: allow\n    colour: red\n"),
            "unknown field `colour`",
        ),
        (
            format!("cases:\n  - name: a\n    context: {lock}\n"),
            "missing field `expect`",
        ),
        (
            format!("cases:\n  - name: a\n    context: {lock}\n    expect: allowed\n"),
            "unknown variant `allowed`",
        ),
        (
            "cases:\n  - name: a\n    context: {deviceId: front-door, capabilty: unlock, capabilityKind: actuator}\n    expect: allow\n".to_owned(),
            "cases[0] `a`: context key `capabilty` is not a field of a device_use call",
        ),
        (
            "cases:\n  - name: a\n    context: {deviceId: front-door, capabilityKind: actuator}\n    expect: allow\n".to_owned(),
            "cases[0] `a`: the context needs `capability`",
        ),
        (
            format!("cases:\n  - name: a\n    context: {lock}\n    expect: allow\n    at: midnight\n"),
            "cases[0] `a`: `at`: `midnight` is not a date and time",
        ),
        (
            format!("cases:\n  - name: a\n    context: {lock}\n    expect: allow\n    input: [1]\n"),
            "invalid type: sequence, expected a map",
        ),
        (
            format!("cases:\n  - name: a\n    context: {lock}\n    expect: allow\n    counted: {{no-guest-unlocks: 1}}\n"),
            "cases[0] `a`: `counted` names `no-guest-unlocks`, which is not a rule with a limit",
        ),
    ];
    let scratch = tempfile::TempDir::new().unwrap();
    for (text, expected) in bad {
        let path = scratch.path().join("bad.cases.yaml");
        std::fs::write(&path, &text).unwrap();
        let out = dk(&["policy", "test", rules, path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(out.stdout.is_empty(), "{text}");
        assert!(stderr.contains(expected), "{text}\n{stderr}");
    }
}

/// `--input` and `--at` give `input.` and time conditions what they read.
#[test]
fn policy_explain_reads_input_and_time() {
    let file = fixtures().join("policies/good/night-door-and-thermostat.yaml");
    let file = file.to_str().unwrap();
    let thermostat = r#"{"deviceId":"hall-thermostat","capability":"set_target","capabilityKind":"actuator","agentId":"main"}"#;
    let door = r#"{"deviceId":"front-door","capability":"unlock","capabilityKind":"actuator","agentId":"main"}"#;
    let explain = |context: &str, extra: &[&str]| {
        let mut args = vec!["policy", "explain", file, "--context", context, "--json"];
        args.extend_from_slice(extra);
        let out = dk(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            got["decision"].as_str().unwrap().to_owned(),
            got["rule"].as_str().map(str::to_owned),
        )
    };
    let decided =
        |decision: &str, rule: Option<&str>| (decision.to_owned(), rule.map(str::to_owned));
    assert_eq!(
        explain(thermostat, &["--input", r#"{"celsius": 26}"#]),
        decided("block", Some("thermostat-range"))
    );
    assert_eq!(
        explain(thermostat, &["--input", r#"{"celsius": 20}"#]),
        decided("allow", None)
    );
    // Without --input the call carries no celsius: the range does not match.
    assert_eq!(explain(thermostat, &[]), decided("allow", None));
    // The file's zone is Europe/Berlin.
    let night = ["--at", "2026-12-01T23:30:00"];
    assert_eq!(
        explain(door, &night),
        decided("require_approval", Some("night-door"))
    );
    assert_eq!(
        explain(door, &["--at", "2026-12-01T21:30:00Z"]),
        decided("allow", None)
    );
    assert_eq!(
        explain(door, &["--at", "2026-07-01T21:30:00Z"]),
        decided("require_approval", Some("night-door"))
    );
    let refused = [
        (
            vec!["--input", "[1]"],
            "error: --input must be a JSON object\n",
        ),
        (vec!["--input", "{"], "error: --input is not JSON"),
        (
            vec!["--at", "tonight"],
            "error: --at `tonight` is not a date and time",
        ),
        (
            vec!["--action", "write_file", "--at", "2026-12-01T23:30:00"],
            "error: --input and --at describe a device call: they need --action device_use\n",
        ),
    ];
    for (extra, message) in refused {
        let context = if extra.contains(&"write_file") {
            r#"{"path":"x"}"#
        } else {
            door
        };
        let mut args = vec!["policy", "explain", file, "--context", context];
        args.extend_from_slice(&extra);
        let out = dk(&args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with(message), "{extra:?}: {stderr}");
    }
}

/// `--manifests DIR` and `--paired` tell lint which params exist.
#[test]
fn policy_lint_knows_declared_params() {
    let rules = fixtures().join("policies/params/thermostat.yaml");
    let rules = rules.to_str().unwrap();
    let manifests = fixtures().join("manifests/valid");
    let warnings = "warning: line 11: policies[1] `misnamed`: `input.target`: no capability `set_target` declares a param `target` (declared: `celsius`, `mode`), so the clause is always false\n\
                    warning: line 16: policies[2] `mode-as-number`: `input.mode` is compared with a number, but it is declared a string, so the clause is always false\n\
                    2 warning(s)\n";
    // Without them lint cannot know.
    let out = dk(&["policy", "lint", rules]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0 warning(s)\n");
    let out = dk(&[
        "policy",
        "lint",
        "--deny-warnings",
        "--manifests",
        manifests.to_str().unwrap(),
        rules,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), warnings);

    // The devices paired with a vessel: its database, written by dk-vessel.
    let data = tempfile::TempDir::new().unwrap();
    {
        let store = dk_store::SqliteStore::open(&data.path().join("vessel.db")).unwrap();
        let text = std::fs::read_to_string(manifests.join("hall-thermostat.json")).unwrap();
        let manifest = dk_proto::validate_manifest_json(&text).unwrap();
        let pairing = dk_store::StoredPairing {
            device_id: manifest.id().to_owned(),
            manifest_json: manifest.to_stored_json(),
            digest: manifest.digest(),
            token_hash: [7; 32],
            device_key: None,
            grants: vec!["set_target".to_owned()],
            generation: 1,
            paired_at_ms: 1,
        };
        let audit = dk_store::AuditEvent {
            at_ms: 1,
            kind: "paired".to_owned(),
            entry: json!({"deviceId": manifest.id()}),
        };
        dk_store::Store::put_pairing(&store, &pairing, &audit).unwrap();
    }
    let data_dir = data.path().to_str().unwrap();
    let out = dk(&["policy", "lint", "--paired", "--data-dir", data_dir, rules]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), warnings);

    // Typos in a device id or a capability, checked against the devices
    // paired: rules that would pass `check` and never fire.
    let typos = fixtures().join("policies/params/typos.yaml");
    let out = dk(&[
        "policy",
        "lint",
        "--paired",
        "--data-dir",
        data_dir,
        typos.to_str().unwrap(),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "warning: line 5: policies[0] `too-warm`: `deviceId` `hall-thermostate`: no device has this id (devices: `hall-thermostat`), so the clause never holds for it\n\
         warning: line 10: policies[1] `too-cold`: `capability` `set_targt`: device `hall-thermostat` has no such capability (capabilities: `read_temperature`, `set_target`), so the clause never holds for it\n\
         warning: line 10: policies[1] `too-cold`: `input.celsius`: no capability `set_targt` declares a param `celsius` (declared: none), so the clause is always false\n\
         3 warning(s)\n"
    );
    assert_eq!(
        dk(&["policy", "check", typos.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );

    let refused = [
        (
            vec!["--manifests", "/nonexistent-dk-dir"],
            "error: cannot read `/nonexistent-dk-dir`",
        ),
        (
            vec!["--paired", "--data-dir", "/nonexistent-dk-dir"],
            "error: no vessel database at `/nonexistent-dk-dir/vessel.db`",
        ),
    ];
    for (extra, message) in refused {
        let mut args = vec!["policy", "lint"];
        args.extend_from_slice(&extra);
        args.push(rules);
        let out = dk(&args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).starts_with(message),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let invalid = fixtures().join("manifests/invalid");
    let out = dk(&[
        "policy",
        "lint",
        "--manifests",
        invalid.to_str().unwrap(),
        rules,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a valid manifest"));
}

/// `dk policy reload` makes a running vessel read its rule file again; the
/// audit log records each start, stop and reload with the rule file and the
/// SHA-256 of what was read, a refused file too, and still verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_reload_on_command_and_the_log_says_which_were_in_force() {
    use sha2::{Digest, Sha256};
    let digest = |text: &str| {
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let scratch = process::Scratch::new("reload");
    let rules = scratch.root().join("rules.yaml");
    let shown = rules.to_str().unwrap().to_owned();
    let one = "version: 1\npolicies:\n  - name: ask\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: require_approval\n    message: ask first\n";
    let two = format!(
        "{one}  - name: two\n    action: device_use\n    condition: \"deviceId equals x\"\n    decision: block\n    message: no\n"
    );
    let broken = "version: 1\npolicies:\n  - name: oops\n    action: device_use\n";
    // Whole files, as an editor saves them: written aside, then renamed.
    let replace = |text: &str| {
        let aside = scratch.root().join("rules.yaml.new");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &rules).unwrap();
    };
    replace(one);
    let vessel = process::Running::start_with(&scratch, &["--policies", &shown]);
    let out = scratch.run(&["policy", "reload"]);
    assert_eq!(
        process::succeeded(&out),
        format!(
            "reloaded `{shown}`: 1 rules in force (sha256 {})\n",
            digest(one)
        )
    );
    let status = process::succeeded(&scratch.run(&["status"]));
    assert!(
        status.contains(&format!(
            "device_use rules     1 from {shown} (sha256 {})",
            digest(one)
        )),
        "{status}"
    );

    replace(broken);
    let out = scratch.run(&["policy", "reload"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("the rule file `{shown}` is refused:"))
            && said.contains("missing `condition`")
            && said.contains(&format!(
                "error: the rules in force stay: `{shown}` as it was (sha256 {})",
                digest(one)
            )),
        "{said}"
    );
    replace(&two);
    let out = scratch.run(&["policy", "reload", "--json"]);
    let answer: Value = serde_json::from_str(&process::succeeded(&out)).unwrap();
    assert_eq!(
        answer,
        json!({"reloaded": true, "file": shown, "sha256": digest(&two), "rules": 2})
    );
    vessel.interrupt();

    let log = process::audit_entries(&scratch.data_dir(), 1000);
    let of = |kind: &str| -> Vec<Value> {
        log.iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| e["entry"].clone())
            .collect()
    };
    let started = of("vessel-started");
    assert_eq!(started.len(), 1, "{log:?}");
    assert_eq!(
        started[0]["rules"],
        json!({"file": shown, "sha256": digest(one), "rules": 1})
    );
    let reloaded = of("rules-reloaded");
    let asked: Vec<&Value> = reloaded
        .iter()
        .filter(|e| e["cause"] == "admin-api")
        .collect();
    assert_eq!(
        asked,
        [
            &json!({"file": shown, "sha256": digest(one), "rules": 1, "cause": "admin-api"}),
            &json!({"file": shown, "sha256": digest(&two), "rules": 2, "cause": "admin-api"}),
        ]
    );
    // The broken file was refused (by the command, and perhaps first by the
    // file watch), the rules read first staying in force.
    let refused = of("rules-refused");
    let by_command = refused
        .iter()
        .find(|e| e["cause"] == "admin-api" && e["sha256"] == json!(digest(broken)))
        .unwrap_or_else(|| panic!("{refused:?}"));
    assert_eq!(
        by_command["inForce"],
        json!({"file": shown, "sha256": digest(one), "rules": 1})
    );
    assert!(
        by_command["errors"]
            .as_str()
            .unwrap()
            .contains("missing `condition`")
    );
    assert_eq!(
        of("vessel-stopped"),
        [json!({"rules": {"file": shown, "sha256": digest(&two), "rules": 2}})]
    );
    let verified = process::audit(&scratch.data_dir(), &["verify"]);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );

    // A vessel started without a rule file has none to reload.
    let bare = process::Scratch::new("reload-none");
    let vessel = process::Running::start(&bare);
    let out = bare.run(&["policy", "reload"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("come from no file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(vessel);
}

/// POLICY.md's thermostat example, copied as it is, names the simulated
/// thermostat's real id and param: lint against the bundled manifests finds
/// nothing, and it refuses 26 degrees.
#[test]
fn the_policy_docs_thermostat_example_fires_on_the_simulator() {
    let doc = std::fs::read_to_string(fixtures().join("../docs/POLICY.md")).unwrap();
    let start = doc.find("  - name: thermostat-range").unwrap();
    let end = start + doc[start..].find("```").unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        format!("version: 1\npolicies:\n{}", &doc[start..end]),
    )
    .unwrap();
    let rules = rules.to_str().unwrap();
    let manifests = fixtures().join("manifests/valid");
    let out = dk(&[
        "policy",
        "lint",
        "--deny-warnings",
        "--manifests",
        manifests.to_str().unwrap(),
        rules,
    ]);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "0 warning(s)\n")
    );
    let context = r#"{"deviceId":"hall-thermostat","capability":"set_target","capabilityKind":"actuator","agentId":"main"}"#;
    check_json(
        &[
            "policy",
            "explain",
            rules,
            "--context",
            context,
            "--input",
            r#"{"celsius": 26}"#,
            "--json",
        ],
        0,
        json!({"decision": "block", "rule": "thermostat-range",
               "reason": "[thermostat-range] Keep the thermostat between 15 and 25"}),
    );
}
