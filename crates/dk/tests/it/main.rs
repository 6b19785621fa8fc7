//! The `dk` binary, run as a user runs it, on the shared fixtures.

#![cfg(test)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

mod agents;
mod approvals;
mod crash;
mod durable;
mod files;
mod mcp_bridge;
mod process;
mod prompt_pty;
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
    let request = loop {
        let out = person(&dir, &["pairings", "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        if let Some(first) = list.as_array().and_then(|l| l.first()).cloned() {
            break first;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
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

    let devices = loop {
        let out = person(&dir, &["devices", "--json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        if list[0]["connected"] == true {
            break list;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(devices[0]["grants"], json!(["read_light", "set_light"]));
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
        for _ in 0..1500 {
            let content = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            if content.matches(text).count() >= count {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!(
            "never saw {text:?} x{count} in {file}: {}",
            std::fs::read_to_string(dir.join(file)).unwrap_or_default()
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
