//! Tests of rule reloading: a good file applies, a broken one changes nothing.

use serde_json::json;

use super::*;
use crate::testing::rules::{ASK, BLOCK, BROKEN, decision_kind, sha256};
use crate::vessel::Limits;

/// The audit entries of `vessel` (committed first), as (kind, entry).
fn entries(vessel: &Vessel) -> Vec<(String, serde_json::Value)> {
    vessel.flush_audit().unwrap();
    vessel
        .registry()
        .store()
        .read_audit(0, 1000)
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.entry))
        .collect()
}

/// The host's reader: the file on disk, as dk-vessel reads it.
fn disk() -> RuleReader {
    Arc::new(dk_policy::read_rule_file)
}

/// The rule file at `path`, read from disk.
fn load(path: &Path) -> Result<RuleFile, PolicyFileError> {
    RuleFile::read(path, disk())
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
        vessel.reload_rules_from(&path, disk(), ReloadCause::Asked),
        Reloaded::Applied {
            rules: 1,
            sha256: sha256(ASK)
        }
    );
    assert_eq!(decision_kind(&vessel), "ask");
    std::fs::write(&path, BROKEN).unwrap();
    let Reloaded::Refused { errors } = vessel.reload_rules_from(&path, disk(), ReloadCause::Asked)
    else {
        panic!("accepted a broken file")
    };
    assert!(errors.contains("capabilityKnd"), "{errors}");
    assert_eq!(decision_kind(&vessel), "ask", "the old rules stay in force");
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        vessel.reload_rules_from(&path, disk(), ReloadCause::Asked),
        Reloaded::Refused { .. }
    ));
    assert_eq!(decision_kind(&vessel), "ask");
}

#[test]
fn every_reload_is_recorded_with_the_file_and_its_digest() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let (_dir, path) = file();
    let shown = path.display().to_string();
    // Rules from no file: nothing to reload.
    assert_eq!(vessel.reload_rules(ReloadCause::AdminApi), None);
    assert_eq!(
        vessel.rules_in_force(),
        RulesInForce {
            file: None,
            sha256: None,
            rules: 0
        }
    );
    std::fs::write(&path, ASK).unwrap();
    vessel.use_rule_file(load(&path).unwrap());
    let ask = RulesInForce {
        file: Some(shown.clone()),
        sha256: Some(sha256(ASK)),
        rules: 1,
    };
    assert_eq!(vessel.rules_in_force(), ask);
    assert_eq!(decision_kind(&vessel), "ask");

    // The same bytes, the file touched: nothing done, nothing recorded.
    assert_eq!(
        vessel.reload_rules_from(&path, disk(), ReloadCause::FileChanged),
        Reloaded::Unchanged
    );
    std::fs::write(&path, BROKEN).unwrap();
    let Some(Reloaded::Refused { errors }) = vessel.reload_rules(ReloadCause::AdminApi) else {
        panic!("a broken file was not refused")
    };
    assert_eq!(vessel.rules_in_force(), ask, "the old rules stay in force");
    std::fs::write(&path, BLOCK).unwrap();
    assert_eq!(
        vessel.reload_rules(ReloadCause::Asked),
        Some(Reloaded::Applied {
            rules: 1,
            sha256: sha256(BLOCK)
        })
    );
    assert_eq!(decision_kind(&vessel), "block");
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        vessel.reload_rules(ReloadCause::FileChanged),
        Some(Reloaded::Refused { .. })
    ));

    let recorded: Vec<_> = entries(&vessel)
        .into_iter()
        .filter(|(kind, _)| kind.starts_with("rules-"))
        .collect();
    let block = json!({"file": shown, "sha256": sha256(BLOCK), "rules": 1});
    assert_eq!(
        recorded,
        [
            (
                "rules-refused".to_owned(),
                json!({"file": shown, "sha256": sha256(BROKEN), "errors": errors,
                       "cause": "admin-api", "inForce": ask}),
            ),
            (
                "rules-reloaded".to_owned(),
                json!({"file": shown, "sha256": sha256(BLOCK), "rules": 1, "cause": "asked"}),
            ),
            (
                "rules-refused".to_owned(),
                json!({"file": shown, "sha256": null,
                       "errors": recorded_errors(&path), "cause": "file-changed",
                       "inForce": block}),
            ),
        ]
    );
}

/// What refusing a file that is gone says.
fn recorded_errors(path: &Path) -> String {
    load(path).unwrap_err().to_string()
}
