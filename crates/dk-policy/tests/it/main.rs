//! dk-policy integration tests: the shared fixtures, and no rule file makes it panic.
#![cfg(test)]

use std::path::{Path, PathBuf};

use dk_policy::{Condition, DEVICE_USE, DeviceUseContext, PolicySet};
use proptest::prelude::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    out.sort();
    out
}

/// Every good rule file loads.
#[test]
fn good_policy_fixtures_load() {
    let good = files(&fixtures().join("policies/good"), "yaml");
    assert!(!good.is_empty());
    for path in good {
        let set = PolicySet::load(&path).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()));
        for rule in set.rules() {
            // The printed condition parses back to the same condition.
            let printed = rule.condition().to_string();
            assert_eq!(
                &Condition::parse(&printed).unwrap(),
                rule.condition(),
                "{printed}"
            );
        }
    }
}

/// Every bad rule file is refused with exactly the errors in the `.expected`
/// file next to it, one a line.
#[test]
fn bad_policy_fixtures_are_refused_with_their_errors() {
    let bad = files(&fixtures().join("policies/bad"), "yaml");
    assert!(!bad.is_empty());
    for path in bad {
        let expected_path = path.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let error = match PolicySet::load(&path) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(error) => error,
        };
        assert_eq!(error.to_string(), expected.trim_end(), "{}", path.display());
    }
}

/// `fixtures/conditions/ok.txt`: condition, tab, how it prints.
/// `fixtures/conditions/err.txt`: condition, tab, its first error.
#[test]
fn condition_fixtures() {
    let dir = fixtures().join("conditions");
    let ok = std::fs::read_to_string(dir.join("ok.txt")).unwrap();
    for line in ok.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (text, printed) = line.split_once('\t').unwrap();
        let condition = Condition::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(condition.to_string(), printed, "{text:?}");
    }
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap();
    for line in err.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (text, message) = line.split_once('\t').unwrap();
        let errors = Condition::parse(text).unwrap_err();
        assert_eq!(errors.errors()[0].message(), message, "{text:?}");
    }
}

#[test]
fn unreadable_files_are_errors() {
    let missing = fixtures().join("policies/no-such-file.yaml");
    let error = PolicySet::load(&missing).unwrap_err().to_string();
    assert!(error.starts_with("cannot read `"), "{error}");
}

#[test]
fn a_loaded_file_decides() {
    let set = PolicySet::load(&fixtures().join("policies/good/8gent-style.yaml")).unwrap();
    let door = DeviceUseContext {
        agent_id: Some("helper"),
        session_id: None,
        device_id: "front-door-1",
        capability: "UNLOCK",
        capability_kind: "actuator",
    };
    assert_eq!(
        set.evaluate_device_use(&door).rule(),
        Some("no-door-unlock-at-night-for-helpers")
    );
    let main = DeviceUseContext {
        agent_id: Some("main"),
        ..door
    };
    assert!(set.evaluate(DEVICE_USE, &main).is_allowed());
}

const VALID: &str = "version: 1
policies:
  - name: ask-before-lamp-actions
    action: device_use
    condition: \"deviceId equals desk-lamp and capabilityKind equals actuator\"
    decision: require_approval
    message: \"Lamp actions need a yes\"
    enabled: true
    agentScope: main
";

const PIECES: [&str; 24] = [
    "\n",
    "  ",
    "- ",
    ": ",
    "version",
    "policies",
    "name",
    "action",
    "condition",
    "decision",
    "message",
    "[",
    "]",
    "{",
    "}",
    "&a ",
    "*a",
    "!t ",
    "\"",
    "'",
    "#",
    "device_use",
    "deviceId equals x",
    "---\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn any_text_is_safe(text in ".{0,400}") {
        dk_policy::fuzz_policy_file(text.as_bytes());
    }

    #[test]
    fn any_bytes_are_safe(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        dk_policy::fuzz_policy_file(&bytes);
    }

    /// A valid file with pieces cut out and YAML pieces put in.
    #[test]
    fn near_valid_files_are_safe(
        edits in prop::collection::vec((0usize..VALID.len(), 0usize..8, proptest::sample::select(&PIECES[..])), 1..6),
    ) {
        let mut text = VALID.to_owned();
        for (at, cut, piece) in edits {
            let mut at = at.min(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = (at + cut).min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.replace_range(at..end, piece);
        }
        dk_policy::fuzz_policy_file(text.as_bytes());
    }
}
