//! The schema against the entries the vessel wrote before it existed: each
//! kind built the old way (`json!`, as the writers spelt it) and from its
//! type gives the same canonical text, and every entry of a log written by
//! that vessel reads back to the same text.

use serde_json::{Value, json};

use super::*;
use crate::canonical_json;

/// `typed` serializes to exactly the text `old` (an entry as the vessel
/// wrote it by hand) has, and reads back to itself.
#[track_caller]
fn check(typed: impl Into<Entry>, kind: &str, old: Value) {
    let typed = typed.into();
    assert_eq!(typed.kind(), kind);
    assert_eq!(canonical_json(&typed.to_value()), canonical_json(&old));
    assert_eq!(Entry::read(kind, &old).unwrap(), typed);
}

fn console() -> By {
    By::console("s-1")
}

fn rules() -> RulesInForce {
    RulesInForce {
        file: Some("/etc/dk/rules.yaml".to_owned()),
        sha256: Some("ab".repeat(32)),
        rules: 2,
    }
}

#[test]
fn a_decision_is_the_text_it_was() {
    let plain = Decision {
        tool: "device__desk_lamp__read_light".to_owned(),
        device_id: Some("desk-lamp".to_owned()),
        capability: Some("read_light".to_owned()),
        allowed: true,
        reason: "allowed".to_owned(),
        agent_id: Some("kitchen".to_owned()),
        session_id: Some("s".to_owned()),
        rule: None,
        person: None,
        allowance: None,
        caller: None,
        channel: Some("dk/2".to_owned()),
        by: None,
        input: Some(json!({"on": true})),
    };
    check(
        plain.clone(),
        "decision",
        json!({"tool": "device__desk_lamp__read_light", "deviceId": "desk-lamp",
               "capability": "read_light", "allowed": true, "reason": "allowed",
               "agentId": "kitchen", "sessionId": "s", "rule": null, "channel": "dk/2",
               "input": {"on": true}}),
    );
    let unknown = Decision {
        tool: "nope".to_owned(),
        device_id: None,
        capability: None,
        allowed: false,
        reason: "[8dk-deny] unknown tool".to_owned(),
        agent_id: None,
        session_id: None,
        channel: None,
        input: None,
        ..plain.clone()
    };
    check(
        unknown,
        "decision",
        json!({"tool": "nope", "deviceId": null, "capability": null, "allowed": false,
               "reason": "[8dk-deny] unknown tool", "agentId": null, "sessionId": null,
               "rule": null}),
    );
    let asked = Decision {
        rule: Some("night".to_owned()),
        person: Some(PersonAnswer::Approved),
        allowance: Some(AllowanceRef {
            id: 4,
            created: true,
        }),
        by: Some(console()),
        ..plain.clone()
    };
    check(
        asked,
        "decision",
        json!({"tool": "device__desk_lamp__read_light", "deviceId": "desk-lamp",
               "capability": "read_light", "allowed": true, "reason": "allowed",
               "agentId": "kitchen", "sessionId": "s", "rule": "night", "channel": "dk/2",
               "person": "approved", "allowance": {"id": 4, "created": true},
               "by": {"frontEnd": "console", "session": "s-1"}, "input": {"on": true}}),
    );
    let remembered = Decision {
        person: Some(PersonAnswer::Remembered),
        allowance: Some(AllowanceRef {
            id: 4,
            created: false,
        }),
        ..plain.clone()
    };
    check(
        remembered,
        "decision",
        json!({"tool": "device__desk_lamp__read_light", "deviceId": "desk-lamp",
               "capability": "read_light", "allowed": true, "reason": "allowed",
               "agentId": "kitchen", "sessionId": "s", "rule": null, "channel": "dk/2",
               "person": "remembered", "allowance": {"id": 4}, "input": {"on": true}}),
    );
    let persons = Decision {
        agent_id: None,
        session_id: None,
        person: Some(PersonAnswer::Refused),
        caller: Some(Caller::Person),
        by: Some(By::admin_api()),
        ..plain
    };
    check(
        persons,
        "decision",
        json!({"tool": "device__desk_lamp__read_light", "deviceId": "desk-lamp",
               "capability": "read_light", "allowed": true, "reason": "allowed",
               "agentId": null, "sessionId": null, "rule": null, "channel": "dk/2",
               "person": "refused", "caller": "person", "by": {"frontEnd": "adminApi"},
               "input": {"on": true}}),
    );
}

#[test]
fn pairings_grants_and_unpairings_are_the_texts_they_were() {
    let paired = Paired {
        device_id: "desk-lamp".to_owned(),
        name: "Desk lamp".to_owned(),
        digest: "98".repeat(32),
        grants: vec!["read_light".to_owned(), "set_light".to_owned()],
        replaced: false,
        no_screen: false,
        channel: "v1".to_owned(),
        generation: 3,
        device_key: None,
        by: None,
    };
    check(
        paired.clone(),
        "paired",
        json!({"deviceId": "desk-lamp", "name": "Desk lamp", "digest": "98".repeat(32),
               "grants": ["read_light", "set_light"], "replaced": false, "noScreen": false,
               "channel": "v1", "generation": 3}),
    );
    check(
        Paired {
            replaced: true,
            no_screen: true,
            channel: "dk/2".to_owned(),
            device_key: Some("46".repeat(32)),
            by: Some(By::terminal()),
            ..paired
        },
        "paired",
        json!({"deviceId": "desk-lamp", "name": "Desk lamp", "digest": "98".repeat(32),
               "grants": ["read_light", "set_light"], "replaced": true, "noScreen": true,
               "channel": "dk/2", "generation": 3, "deviceKey": "46".repeat(32),
               "by": {"frontEnd": "terminal"}}),
    );
    let change = GrantChange {
        device_id: "desk-lamp".to_owned(),
        capability: "strobe".to_owned(),
        channel: "dk/2".to_owned(),
        by: Some(console()),
    };
    let old = json!({"deviceId": "desk-lamp", "capability": "strobe", "channel": "dk/2",
                     "by": {"frontEnd": "console", "session": "s-1"}});
    check(change.clone().granted(), "granted", old.clone());
    check(change.revoked(), "revoked", old);
    check(
        Unpaired {
            device_id: "front-door".to_owned(),
            channel: "v1".to_owned(),
            by: None,
        },
        "unpaired",
        json!({"deviceId": "front-door", "channel": "v1"}),
    );
}

#[test]
fn agent_changes_are_the_texts_they_were() {
    let scope = json!({"kind": "devices", "devices": {"desk-lamp": {"kind": "all"}}});
    check(
        AgentChange::Added {
            agent: AgentRecord {
                id: "kitchen".to_owned(),
                scope: json!({"kind": "allDevices"}),
                role: json!("user"),
                added_at_ms: 17,
            },
            by: Some(By::admin_api()),
        },
        "agent",
        json!({"change": "added",
               "agent": {"id": "kitchen", "scope": {"kind": "allDevices"}, "role": "user",
                         "addedAtMs": 17},
               "by": {"frontEnd": "adminApi"}}),
    );
    check(
        AgentChange::Scope {
            agent_id: "kitchen".to_owned(),
            scope: scope.clone(),
            by: None,
        },
        "agent",
        json!({"change": "scope", "agentId": "kitchen", "scope": scope}),
    );
    check(
        AgentChange::Removed {
            agent_id: "kitchen".to_owned(),
            by: Some(console()),
        },
        "agent",
        json!({"change": "removed", "agentId": "kitchen",
               "by": {"frontEnd": "console", "session": "s-1"}}),
    );
}

#[test]
fn allowances_are_the_texts_they_were() {
    let created = AllowanceCreated {
        id: 1,
        agent_id: "kitchen".to_owned(),
        tool: "device__desk_lamp__strobe".to_owned(),
        device_id: "desk-lamp".to_owned(),
        capability: "strobe".to_owned(),
        scope: "capability".to_owned(),
        minutes: 30,
        expires_at_ms: 1_796_241_192_478,
        arguments_sha256: None,
    };
    check(
        created.clone(),
        "allowance-created",
        json!({"id": 1, "agentId": "kitchen", "tool": "device__desk_lamp__strobe",
               "deviceId": "desk-lamp", "capability": "strobe", "scope": "capability",
               "minutes": 30, "expiresAtMs": 1_796_241_192_478_u64}),
    );
    check(
        AllowanceCreated {
            scope: "arguments".to_owned(),
            arguments_sha256: Some("cd".repeat(32)),
            ..created
        },
        "allowance-created",
        json!({"id": 1, "agentId": "kitchen", "tool": "device__desk_lamp__strobe",
               "deviceId": "desk-lamp", "capability": "strobe", "scope": "arguments",
               "minutes": 30, "expiresAtMs": 1_796_241_192_478_u64,
               "argumentsSha256": "cd".repeat(32)}),
    );
    check(
        AllowanceRevoked {
            id: 1,
            agent_id: "kitchen".to_owned(),
            tool: "device__desk_lamp__strobe".to_owned(),
            device_id: "desk-lamp".to_owned(),
            capability: "strobe".to_owned(),
            scope: "capability".to_owned(),
            uses: 2,
            why: "revoked by the person".to_owned(),
        },
        "allowance-revoked",
        json!({"id": 1, "agentId": "kitchen", "tool": "device__desk_lamp__strobe",
               "deviceId": "desk-lamp", "capability": "strobe", "scope": "capability",
               "uses": 2, "why": "revoked by the person"}),
    );
}

#[test]
fn rules_and_the_vessels_life_are_the_texts_they_were() {
    check(
        RulesReloaded {
            file: "/etc/dk/rules.yaml".to_owned(),
            sha256: "ab".repeat(32),
            rules: 2,
            cause: ReloadCause::FileChanged,
        },
        "rules-reloaded",
        json!({"file": "/etc/dk/rules.yaml", "sha256": "ab".repeat(32), "rules": 2,
               "cause": "file-changed"}),
    );
    check(
        RulesRefused {
            file: "/etc/dk/rules.yaml".to_owned(),
            sha256: None,
            errors: "cannot read".to_owned(),
            cause: ReloadCause::AdminApi,
            in_force: RulesInForce {
                file: None,
                sha256: None,
                rules: 0,
            },
        },
        "rules-refused",
        json!({"file": "/etc/dk/rules.yaml", "sha256": null, "errors": "cannot read",
               "cause": "admin-api", "inForce": {"file": null, "sha256": null, "rules": 0}}),
    );
    check(
        VesselStarted {
            version: "0.1.0".to_owned(),
            fingerprint: "V3NR".to_owned(),
            rules: rules(),
        },
        "vessel-started",
        json!({"version": "0.1.0", "fingerprint": "V3NR",
               "rules": {"file": "/etc/dk/rules.yaml", "sha256": "ab".repeat(32), "rules": 2}}),
    );
    check(
        VesselStopped { rules: rules() },
        "vessel-stopped",
        json!({"rules": {"file": "/etc/dk/rules.yaml", "sha256": "ab".repeat(32), "rules": 2}}),
    );
    check(
        VesselKey::made("V3NR".to_owned()),
        "vessel-key",
        json!({"made": true, "fingerprint": "V3NR"}),
    );
    check(
        VesselKey::replaced("V3NR".to_owned()),
        "vessel-key",
        json!({"made": true, "replaced": true, "fingerprint": "V3NR"}),
    );
    check(
        VesselKey::moved("/d/a".to_owned(), "/d.key".to_owned(), "V3NR".to_owned()),
        "vessel-key",
        json!({"moved": true, "from": "/d/a", "to": "/d.key", "fingerprint": "V3NR"}),
    );
    check(
        AdminToken { replaced: true },
        "admin-token",
        json!({"replaced": true}),
    );
    check(
        AuditKeyed {
            key_id: "b0c7f2dc5ef549b3".to_owned(),
        },
        "audit-keyed",
        json!({"keyId": "b0c7f2dc5ef549b3"}),
    );
    check(
        Unstorable {
            kind: "BAD".to_owned(),
            error: "not storable".to_owned(),
        },
        "unstorable",
        json!({"kind": "BAD", "error": "not storable"}),
    );
}

#[test]
fn stream_admissions_are_the_texts_they_were() {
    check(
        StreamAdmission {
            device_id: "kitchen-voice".to_owned(),
            kind: "voice".to_owned(),
            stage: "pair".to_owned(),
            admitted: true,
            outcome: AdmissionOutcome::Admitted {
                max_chunk_bytes: 4096,
                max_tool_calls: 200,
            },
        },
        "stream_admission",
        json!({"deviceId": "kitchen-voice", "kind": "voice", "stage": "pair",
               "admitted": true, "maxChunkBytes": 4096, "maxToolCalls": 200}),
    );
    check(
        StreamAdmission {
            device_id: "kitchen-voice".to_owned(),
            kind: "voice".to_owned(),
            stage: "resume".to_owned(),
            admitted: false,
            outcome: AdmissionOutcome::Refused {
                code: "SESSION_LIMIT".to_owned(),
                message: "too many".to_owned(),
            },
        },
        "stream_admission",
        json!({"deviceId": "kitchen-voice", "kind": "voice", "stage": "resume",
               "admitted": false, "code": "SESSION_LIMIT", "message": "too many"}),
    );
}

#[test]
fn the_fields_readers_select_by_are_the_schemas() {
    let decision = Entry::read(
        kinds::DECISION,
        &json!({"tool": "t", "deviceId": "d", "agentId": "a", "allowed": true,
                "reason": "allowed", "by": {"frontEnd": "terminal"}, "input": {}}),
    )
    .unwrap();
    let value = decision.to_value();
    for field in [
        fields::DEVICE_ID,
        fields::AGENT_ID,
        fields::ALLOWED,
        fields::BY,
        fields::INPUT,
        fields::TOOL,
        fields::REASON,
    ] {
        assert!(value.get(field).is_some(), "a decision has no `{field}`");
    }
    let Entry::Decision(decision) = decision else {
        panic!("not a decision")
    };
    assert_eq!(decision.device_id.as_deref(), Some("d"));
    assert_eq!(decision.agent_id.as_deref(), Some("a"));
    assert_eq!(decision.by, Some(By::terminal()));
    let removed = AgentChange::Removed {
        agent_id: "a".to_owned(),
        by: None,
    };
    assert_eq!(Entry::from(removed).to_value()[fields::AGENT_ID], "a");
    let granted = GrantChange {
        device_id: "d".to_owned(),
        capability: "c".to_owned(),
        channel: "v1".to_owned(),
        by: None,
    };
    assert_eq!(granted.granted().to_value()[fields::DEVICE_ID], "d");
}

#[test]
fn an_unknown_kind_or_shape_is_read_as_nothing() {
    assert_eq!(
        Entry::read("policy", &json!({})),
        Err(EntryError::UnknownKind("policy".to_owned()))
    );
    assert!(matches!(
        Entry::read(kinds::GRANTED, &json!({"deviceId": 3})),
        Err(EntryError::Shape(_))
    ));
    assert!(matches!(
        Entry::read(kinds::AGENT, &json!({"change": "renamed"})),
        Err(EntryError::Shape(_))
    ));
    // An older entry, without the fields added since, still reads.
    let old = Entry::read(kinds::PAIRED, &json!({"deviceId": "lamp", "digest": "d"})).unwrap();
    assert_eq!(old.by(), None);
    for kind in KINDS {
        assert!(
            !matches!(
                Entry::read(kind, &json!(null)),
                Err(EntryError::UnknownKind(_))
            ),
            "`{kind}` is listed but not read"
        );
    }
}

/// A log `dk vessel` wrote before the schema existed (keyed with the test
/// key beside it): every entry reads as its kind and gives back its text,
/// and the log verifies, the state cross-check included, against its key
/// and its kept head.
#[cfg(feature = "sqlite")]
#[test]
fn a_log_written_before_the_schema_reads_back_and_verifies() {
    use std::str::FromStr as _;

    use crate::{AuditHead, AuditKey, SqliteStore, Store as _};

    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/audit/schema-1");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("vessel");
    dk_files::private::ensure_private_dir(&data).unwrap();
    let db = data.join("vessel.db");
    std::fs::copy(fixture.join("vessel.db"), &db).unwrap();
    // A checkout does not keep the key's mode: the copy gets it back.
    let key_file = dir.path().join("audit.key");
    std::fs::copy(fixture.join("audit.key"), &key_file).unwrap();
    let mut mode = std::fs::metadata(&key_file).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o600);
    std::fs::set_permissions(&key_file, mode).unwrap();
    std::fs::set_permissions(&db, {
        let mut mode = std::fs::metadata(&db).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o600);
        mode
    })
    .unwrap();
    let key = AuditKey::load(&key_file).unwrap();
    let head = std::fs::read_to_string(fixture.join("vessel.audit-head")).unwrap();
    let head = AuditHead::from_str(head.trim()).unwrap();

    let store = SqliteStore::open_with(
        &db,
        crate::AuditOptions {
            head_file: None,
            key: Some(AuditKey::load(&key_file).unwrap()),
        },
    )
    .unwrap();
    let entries = store.read_audit(0, 1000).unwrap();
    assert_eq!(entries.len(), 29);
    let mut kinds_seen = std::collections::BTreeSet::new();
    for entry in &entries {
        let read = Entry::read(&entry.kind, &entry.entry)
            .unwrap_or_else(|e| panic!("entry {} ({}): {e}", entry.seq, entry.kind));
        assert_eq!(read.kind(), entry.kind);
        assert_eq!(
            canonical_json(&read.to_value()),
            canonical_json(&entry.entry),
            "entry {}",
            entry.seq
        );
        kinds_seen.insert(entry.kind.clone());
    }
    assert_eq!(kinds_seen.len(), 14, "{kinds_seen:?}");

    let report = store.verify_audit_with(Some(&key), Some(&head)).unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    assert_eq!(report.head(), head);
    let snapshot = store.load().unwrap();
    assert_eq!(snapshot.pairings.len(), 1);
    assert_eq!(store.load_agents().unwrap().len(), 1);
}

/// Migration 8 keeps the schema's fields the log is read by in columns,
/// filled from the entries' text as `append` fills them, and the store's
/// queries read those columns.
#[cfg(feature = "sqlite")]
#[test]
fn the_audit_indexes_are_on_the_schemas_fields() {
    let migration = crate::sqlite::MIGRATIONS[7];
    for field in [fields::DEVICE_ID, fields::AGENT_ID, fields::ALLOWED] {
        let column = crate::sqlite::column_of(field);
        let filled = format!("{column} = {}", crate::sqlite::column_from_entry(field));
        assert!(migration.contains(&filled), "migration 8 has no `{filled}`");
    }
    assert!(migration.contains(&format!("WHERE kind = '{}'", kinds::DECISION)));
    let query = crate::AuditQuery {
        device_id: Some("d".to_owned()),
        agent_id: Some("a".to_owned()),
        allowed: Some(true),
        ..crate::AuditQuery::newest(5)
    };
    let (sql, _) = crate::sqlite::audit_query_sql(&query);
    for field in [fields::DEVICE_ID, fields::AGENT_ID, fields::ALLOWED] {
        let column = crate::sqlite::column_of(field);
        assert!(sql.contains(&format!("{column} = ?")), "{sql}");
    }
}
