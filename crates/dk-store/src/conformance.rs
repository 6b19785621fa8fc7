//! The store conformance suite: what every [`Store`] does the same, as
//! functions taking a factory of fresh stores, run against `MemoryStore`,
//! `SqliteStore` and (with the `postgres` feature) `PgStore`. What only one
//! store has (SQLite's files, head file and backup) is tested beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::StoredAgent;

/// A fresh, empty store to put through the suite.
pub(crate) struct Subject {
    /// Which store it is, for failure messages.
    pub name: &'static str,
    pub store: Box<dyn Store>,
    /// Opens the same store again, when it outlives its value.
    pub reopen: Option<Box<dyn Fn() -> Box<dyn Store>>>,
    /// Whatever must live as long as the store (its directory).
    pub keep: Option<Box<dyn std::any::Any>>,
}

/// Makes a fresh [`Subject`].
pub(crate) type Factory<'a> = &'a dyn Fn() -> Subject;

// ---------------------------------------------------------------- helpers

pub(crate) fn pairing(id: &str, grants: &[&str], generation: u64) -> StoredPairing {
    StoredPairing {
        device_id: id.to_owned(),
        manifest_json: format!(r#"{{"deviceId":"{id}","name":"Lamp"}}"#),
        digest: format!("sha256:{id}"),
        token_hash: [generation as u8; 32],
        device_key: None,
        grants: grants.iter().map(|g| (*g).to_owned()).collect(),
        generation,
        paired_at_ms: 1_700_000_000_000 + generation,
    }
}

pub(crate) fn event(kind: &str, n: u64) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: kind.to_owned(),
        entry: json!({ "n": n, "device": "d1", "reason": "allowed" }),
    }
}

/// The `paired` entry the registry writes with `pairing`.
pub(crate) fn paired(pairing: &StoredPairing, n: u64) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: "paired".to_owned(),
        entry: json!({"deviceId": pairing.device_id, "digest": pairing.digest,
            "grants": pairing.grants, "n": n}),
    }
}

/// The `granted` or `revoked` entry the registry writes.
pub(crate) fn grant_change(kind: &str, device: &str, capability: &str, n: u64) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: kind.to_owned(),
        entry: json!({"deviceId": device, "capability": capability, "n": n}),
    }
}

/// The `unpaired` entry the registry writes.
pub(crate) fn unpaired(device: &str, n: u64) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: "unpaired".to_owned(),
        entry: json!({"deviceId": device, "n": n}),
    }
}

/// The `agent` entry the agent directory writes: `added` with the agent,
/// `scope` with its scope, or `removed`.
pub(crate) fn agent_change(change: &str, agent: &StoredAgent, n: u64) -> AuditEvent {
    let entry = match change {
        "added" => json!({"change": "added", "agent": {"id": agent.id, "scope": agent.scope,
            "role": agent.role, "addedAtMs": agent.added_at_ms}, "n": n}),
        "scope" => json!({"change": "scope", "agentId": agent.id,
            "scope": agent.scope, "n": n}),
        _ => json!({"change": "removed", "agentId": agent.id, "n": n}),
    };
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: "agent".to_owned(),
        entry,
    }
}

/// The pairings of a snapshot as device id -> grants.
pub(crate) fn grants_of(snapshot: &Snapshot) -> Vec<(String, Vec<String>)> {
    snapshot
        .pairings
        .iter()
        .map(|p| (p.device_id.clone(), p.grants.clone()))
        .collect()
}

pub(crate) fn apply(store: &dyn Store, op: Op, n: u64) -> Result<(), StoreError> {
    match op {
        Op::Put(id, grants, generation) => {
            let stored = pairing(id, grants, generation);
            store.put_pairing(&stored, &paired(&stored, n))
        }
        Op::Grant(id, cap) => store.set_grant(id, cap, true, &grant_change("granted", id, cap, n)),
        Op::Revoke(id, cap) => {
            store.set_grant(id, cap, false, &grant_change("revoked", id, cap, n))
        }
        Op::Delete(id) => store.delete_pairing(id, &unpaired(id, n)),
    }
}

/// The agent directory's JSON of a scope given as command-line items
/// (`*`, `DEVICE` or `DEVICE:CAPABILITY`).
pub(crate) fn scope_json(items: &[&str]) -> Value {
    if items.contains(&"*") {
        return json!({"kind": "allDevices"});
    }
    let mut devices: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    for item in items {
        match item.split_once(':') {
            Some((device, capability)) => {
                if let Some(names) = devices
                    .entry(device.to_owned())
                    .or_insert(Some(BTreeSet::new()))
                {
                    names.insert(capability.to_owned());
                }
            }
            None => {
                devices.insert((*item).to_owned(), None);
            }
        }
    }
    let devices: serde_json::Map<String, Value> = devices
        .into_iter()
        .map(|(device, names)| {
            let scope = match names {
                None => json!({"kind": "all"}),
                Some(names) => json!({"kind": "only", "names": names}),
            };
            (device, scope)
        })
        .collect();
    json!({"kind": "devices", "devices": devices})
}

pub(crate) fn stored_agent(name: &str, scope: &[&str], n: u64) -> StoredAgent {
    StoredAgent {
        id: name.to_owned(),
        scope: scope_json(scope),
        role: "user".to_owned(),
        added_at_ms: 1_700_000_000_000 + n,
        credential_sha256: format!("{n:064x}"),
    }
}

pub(crate) fn decision(n: u64, device: &str, agent: Option<&str>, allowed: bool) -> AuditEvent {
    AuditEvent {
        at_ms: 1_700_000_000_000 + n,
        kind: "decision".to_owned(),
        entry: json!({"deviceId": device, "agentId": agent, "allowed": allowed, "n": n}),
    }
}

pub(crate) fn seqs(entries: &[AuditEntry]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Put(&'static str, &'static [&'static str], u64),
    Grant(&'static str, &'static str),
    Revoke(&'static str, &'static str),
    Delete(&'static str),
}

// ---------------------------------------------------------- the suite

/// Runs `ops` on a fresh store (and on it reopened, when it can be)
/// and checks the pairings, the largest generation and the audit count.
#[track_caller]
fn check(make: Factory<'_>, ops: &[Op], expected: &[(&str, &[&str])], max_generation: u64) {
    let expected: Vec<(String, Vec<String>)> = expected
        .iter()
        .map(|(id, grants)| {
            (
                (*id).to_owned(),
                grants.iter().map(|g| (*g).to_owned()).collect(),
            )
        })
        .collect();
    {
        let Subject {
            name,
            store,
            reopen,
            keep: _keep,
        } = make();
        let mut acknowledged = 0;
        for (n, op) in ops.iter().enumerate() {
            match apply(&*store, *op, n as u64) {
                Ok(()) => acknowledged += 1,
                Err(StoreError::UnknownDevice(_)) => {}
                Err(error) => panic!("{name}: {op:?}: {error}"),
            }
        }
        let mut snapshots = vec![store.load().unwrap()];
        drop(store);
        if let Some(reopen) = &reopen {
            snapshots.push(reopen().load().unwrap());
        }
        for snapshot in snapshots {
            assert_eq!(grants_of(&snapshot), expected, "{name}: {ops:?}");
            assert_eq!(snapshot.max_generation, max_generation, "{name}: {ops:?}");
            assert_eq!(snapshot.audit_entries, acknowledged, "{name}: {ops:?}");
        }
    }
}

/// Pairings and grants: put, re-put, grant, revoke, unpair, unknown devices.
pub(crate) fn pairings_and_grants(make: Factory<'_>) {
    use Op::*;
    check(make, &[], &[], 0);
    check(
        make,
        &[Put("d1", &["a", "b"], 1)],
        &[("d1", &["a", "b"])],
        1,
    );
    check(
        make,
        &[Put("d1", &["b", "a", "a"], 1)],
        &[("d1", &["a", "b"])],
        1,
    );
    // Re-pairing replaces the grants.
    check(
        make,
        &[Put("d1", &["a"], 1), Put("d1", &["c"], 2)],
        &[("d1", &["c"])],
        2,
    );
    check(
        make,
        &[Put("d1", &["a"], 1), Grant("d1", "b"), Grant("d1", "b")],
        &[("d1", &["a", "b"])],
        1,
    );
    check(
        make,
        &[Put("d1", &["a"], 1), Revoke("d1", "a"), Revoke("d1", "a")],
        &[("d1", &[])],
        1,
    );
    // Unpairing removes the grants; a new pairing starts from none.
    check(
        make,
        &[Put("d1", &["a"], 1), Put("d2", &["b"], 2), Delete("d1")],
        &[("d2", &["b"])],
        2,
    );
    check(
        make,
        &[Put("d1", &["a"], 1), Delete("d1"), Put("d1", &[], 2)],
        &[("d1", &[])],
        2,
    );
    // The largest generation outlives the pairing that had it.
    check(
        make,
        &[Put("d9", &[], 7), Put("d1", &[], 3), Delete("d9")],
        &[("d1", &[])],
        7,
    );
    // Unknown devices: refused, nothing recorded.
    check(
        make,
        &[Grant("nope", "a"), Revoke("nope", "a"), Delete("nope")],
        &[],
        0,
    );
    check(
        make,
        &[Put("d1", &["a"], 1), Delete("d1"), Grant("d1", "a")],
        &[],
        1,
    );
}

/// A pairing, secrets and the audit log read back as written, the chain whole.
pub(crate) fn round_trip_secrets_and_audit(make: Factory<'_>) {
    {
        let Subject {
            name,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        let stored = StoredPairing {
            device_id: "desk-lamp".to_owned(),
            manifest_json: r#"{"deviceId":"desk-lamp","name":"Lämp \u2028"}"#.to_owned(),
            digest: "sha256:abc".to_owned(),
            token_hash: std::array::from_fn(|i| i as u8),
            device_key: None,
            grants: vec!["set_power".to_owned(), "brightness".to_owned()],
            generation: 42,
            paired_at_ms: 1_700_000_000_123,
        };
        store.put_pairing(&stored, &paired(&stored, 0)).unwrap();
        let snapshot = store.load().unwrap();
        let mut expected = stored.clone();
        expected.grants.sort();
        assert_eq!(snapshot.pairings, vec![expected], "{name}");
        assert_eq!(snapshot.max_generation, 42, "{name}");

        // Secrets.
        assert_eq!(store.secret_hash("admin-token").unwrap(), None, "{name}");
        store.put_secret_hash("admin-token", [7; 32]).unwrap();
        store.put_secret_hash("admin-token", [8; 32]).unwrap();
        assert_eq!(
            store.secret_hash("admin-token").unwrap(),
            Some([8; 32]),
            "{name}"
        );

        // Audit: append, read after a seq with a limit, verify.
        let batch: Vec<AuditEvent> = (1..=9).map(|n| event("decision", n)).collect();
        store.append_audit(&batch).unwrap();
        store.append_audit(&[]).unwrap();
        let all = store.read_audit(0, 100).unwrap();
        assert_eq!(all.len(), 10, "{name}");
        assert_eq!(
            all.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=10).collect::<Vec<_>>()
        );
        assert_eq!(all[0].prev_hash, GENESIS_HASH);
        assert_eq!(all[0].kind, "paired");
        for pair in all.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash, "{name}");
        }
        assert_eq!(all[3].entry, batch[2].entry);
        assert_eq!(all[3].at_ms, batch[2].at_ms);
        let page = store.read_audit(4, 3).unwrap();
        assert_eq!(
            page.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![5, 6, 7]
        );
        assert!(store.read_audit(10, 5).unwrap().is_empty());
        assert!(store.read_audit(u64::MAX, 5).unwrap().is_empty());

        let report = store.verify_audit().unwrap();
        assert!(report.is_intact(), "{name}: {:?}", report.problems);
        assert_eq!(report.entries, 10);
        assert_eq!(report.head, all[9].hash);
        let snapshot = store.load().unwrap();
        assert_eq!(snapshot.audit_entries, 10);
        assert_eq!(snapshot.audit_head, report.head);
        let against = store.verify_audit_against(&report.head()).unwrap();
        assert!(against.is_intact(), "{name}");
    }
}

/// Unstorable values are refused and change nothing.
pub(crate) fn refuses_unstorable_values_without_change(make: Factory<'_>) {
    {
        let Subject {
            name,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        let bad_kind = AuditEvent {
            kind: "Decision\n".to_owned(),
            ..event("x", 1)
        };
        let error = store
            .put_pairing(&pairing("d1", &["a"], 1), &bad_kind)
            .unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidInput(_)),
            "{name}: {error}"
        );
        let huge = AuditEvent {
            entry: json!({ "text": "x".repeat(MAX_AUDIT_ENTRY_BYTES) }),
            ..event("decision", 1)
        };
        let error = store
            .append_audit(&[event("decision", 0), huge])
            .unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidInput(_)),
            "{name}: {error}"
        );
        let error = store
            .put_pairing(
                &pairing("d1", &[], i64::MAX as u64 + 1),
                &event("paired", 1),
            )
            .unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidInput(_)),
            "{name}: {error}"
        );
        let snapshot = store.load().unwrap();
        assert!(snapshot.pairings.is_empty(), "{name}");
        assert_eq!(snapshot.audit_entries, 0, "{name}");
    }
}

/// Agents put, replaced and deleted, each with its entry.
pub(crate) fn agents_round_trip_replace_and_delete(make: Factory<'_>) {
    {
        let Subject {
            name: kind,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        assert!(store.load_agents().unwrap().is_empty(), "{kind}");
        let b = stored_agent("b", &["*"], 1);
        let a = stored_agent("a", &["lamp", "fan:speed"], 2);
        store.put_agent(&b, &agent_change("added", &b, 1)).unwrap();
        store.put_agent(&a, &agent_change("added", &a, 2)).unwrap();
        assert_eq!(
            store.load_agents().unwrap(),
            vec![a.clone(), b.clone()],
            "{kind}"
        );
        let a2 = stored_agent("a", &["lamp:on"], 2);
        store
            .put_agent(&a2, &agent_change("scope", &a2, 3))
            .unwrap();
        assert_eq!(
            store.load_agents().unwrap(),
            vec![a2.clone(), b.clone()],
            "{kind}"
        );
        store
            .delete_agent("a", &agent_change("removed", &a2, 4))
            .unwrap();
        assert_eq!(store.load_agents().unwrap(), vec![b], "{kind}");
        assert_eq!(
            store.delete_agent("a", &agent_change("removed", &a2, 5)),
            Err(StoreError::UnknownAgent("a".to_owned())),
            "{kind}"
        );
        let report = store.verify_audit().unwrap();
        assert!(report.is_intact(), "{kind}: {:?}", report.problems);
        assert_eq!(
            report.entries, 4,
            "{kind}: a refused delete records nothing"
        );
    }
}

/// The kinds of state entries are refused by `append_audit`.
pub(crate) fn entries_of_changes_are_written_only_with_their_change(make: Factory<'_>) {
    {
        let Subject {
            name,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        for kind in ["paired", "granted", "revoked", "unpaired", "agent"] {
            let error = store
                .append_audit(&[event("decision", 1), event(kind, 2)])
                .unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("not storable: audit kind `{kind}` is written only with its change"),
                "{name}"
            );
        }
        // That refusal comes first, beside an entry too large to store,
        // and texts are held to it too.
        let large = AuditEvent {
            at_ms: 3,
            kind: "note".to_owned(),
            entry: json!({"x": "y".repeat(MAX_AUDIT_ENTRY_BYTES)}),
        };
        let reserved = "not storable: audit kind `paired` is written only with its change";
        let error = store
            .append_audit(&[large, event("paired", 2)])
            .unwrap_err();
        assert_eq!(error.to_string(), reserved, "{name}");
        let texts = [
            AuditText::of(&event("decision", 1)).unwrap(),
            AuditText::of(&event("paired", 2)).unwrap(),
        ];
        let error = store.append_audit_texts(&texts).unwrap_err();
        assert_eq!(error.to_string(), reserved, "{name}");
        assert_eq!(store.load().unwrap().audit_entries, 0, "{name}");
    }
}

/// A fresh store of a factory's, shared with an audit writer over it.
struct WithWriter {
    name: &'static str,
    store: Arc<dyn Store>,
    writer: AuditWriter,
    /// What must outlive the store (its directory): declared last,
    /// dropped last.
    _keep: Option<Box<dyn std::any::Any>>,
}

/// A fresh store of `make`'s and an audit writer over it, with the default
/// options.
fn with_writer(make: Factory<'_>) -> WithWriter {
    let Subject {
        name, store, keep, ..
    } = make();
    let store: Arc<dyn Store> = Arc::from(store);
    let writer = AuditWriter::start(store.clone(), WriterOptions::default());
    WithWriter {
        name,
        store,
        writer,
        _keep: keep,
    }
}

/// The audit writer records an event of a kind written only with its
/// change as `unstorable`, naming the kind, and the events around it as
/// they are: nothing is held back or left out.
pub(crate) fn the_writer_records_a_reserved_kind_as_unstorable(make: Factory<'_>) {
    let subject = with_writer(make);
    let (name, store, writer) = (subject.name, &subject.store, &subject.writer);
    writer.record(event("decision", 1));
    writer.record(event("paired", 2));
    writer.record(event("decision", 3));
    writer.flush().unwrap();
    let entries = store.read_audit(0, 10).unwrap();
    let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["decision", "unstorable", "decision"], "{name}");
    assert_eq!(entries[1].entry["kind"], "paired", "{name}");
    assert!(store.verify_audit().unwrap().is_intact(), "{name}");
}

/// Both stores keep a rule's counted calls until their window passes, at
/// most the limit's number per rule and agent.
/// Rate hits: the latest kept per rule and agent, forgotten once their window passed.
pub(crate) fn rate_hits(make: Factory<'_>) {
    let hit = |rule: &str, agent: &str, at_ms: u64, calls: u32| RateHit {
        rule: rule.to_owned(),
        agent: agent.to_owned(),
        at_ms,
        calls,
        window_ms: 1_000,
    };
    {
        let Subject {
            name,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        for h in [
            hit("door", "main", 100, 3),
            hit("door", "main", 200, 3),
            hit("door", "guest", 300, 3),
            hit("lamp", "main", 400, 3),
            hit("door", "main", 500, 3),
            hit("door", "main", 600, 3),
        ] {
            store.put_rate_hit(&h).unwrap();
        }
        let shown = |hits: Vec<RateHit>| -> Vec<(String, String, u64)> {
            hits.into_iter()
                .map(|h| (h.rule, h.agent, h.at_ms))
                .collect()
        };
        let own = |r: &str, a: &str, t: u64| (r.to_owned(), a.to_owned(), t);
        // main's call at 100 went: only the latest three are kept.
        assert_eq!(
            shown(store.load_rate_hits(0).unwrap()),
            [
                own("door", "main", 200),
                own("door", "guest", 300),
                own("lamp", "main", 400),
                own("door", "main", 500),
                own("door", "main", 600),
            ],
            "{name}"
        );
        // A call leaves when its window has passed.
        assert_eq!(
            shown(store.load_rate_hits(1_300).unwrap()),
            [
                own("lamp", "main", 400),
                own("door", "main", 500),
                own("door", "main", 600)
            ],
            "{name}"
        );
        // A write forgets the calls whose window has passed.
        store.put_rate_hit(&hit("lamp", "guest", 1_450, 1)).unwrap();
        assert_eq!(
            shown(store.load_rate_hits(0).unwrap()),
            [
                own("door", "main", 500),
                own("door", "main", 600),
                own("lamp", "guest", 1_450)
            ],
            "{name}"
        );
        let far = hit("door", "main", u64::MAX - 10, 1);
        assert!(store.put_rate_hit(&far).is_err(), "{name}");
    }
}

/// A dk/2 pairing's pinned key is kept, and checked against the log.
pub(crate) fn a_pinned_key_is_kept_with_its_pairing(make: Factory<'_>) {
    {
        let Subject {
            name,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        let mut keyed = pairing("keyed-lamp", &["a"], 1);
        keyed.device_key = Some(std::array::from_fn(|i| 255 - i as u8));
        let mut entry = paired(&keyed, 1);
        entry.entry["deviceKey"] =
            serde_json::json!(dk_files::hex::encode(&keyed.device_key.unwrap()));
        store.put_pairing(&keyed, &entry).unwrap();
        let loaded = store.load().unwrap().pairings;
        assert_eq!(loaded[0].device_key, keyed.device_key, "{name}");
        assert!(store.verify_audit().unwrap().is_intact(), "{name}");

        // Paired again over v1: the key is gone, and the log says so too.
        keyed.device_key = None;
        keyed.generation = 2;
        store.put_pairing(&keyed, &paired(&keyed, 2)).unwrap();
        assert_eq!(store.load().unwrap().pairings[0].device_key, None, "{name}");
        assert!(store.verify_audit().unwrap().is_intact(), "{name}");
    }
}

/// Pages of the log, newest first, narrowed by device, agent and decision.
pub(crate) fn audit_pages_newest_first_narrowed_by_what_entries_name(make: Factory<'_>) {
    {
        let Subject {
            name,
            store,
            reopen: _,
            keep: _keep,
        } = make();
        assert_eq!(store.audit_head().unwrap().seq, 0, "{name}");
        let events: Vec<AuditEvent> = (1..=30)
            .map(|n| {
                let device = if n % 3 == 0 { "lock" } else { "lamp" };
                let agent = (n % 2 == 0).then_some("kitchen");
                decision(n, device, agent, n % 5 != 0)
            })
            .chain([event("note", 31)])
            .collect();
        store.append_audit(&events).unwrap();
        let head = store.audit_head().unwrap();
        assert_eq!(head.seq, 31, "{name}");
        assert_eq!(head.hash, store.read_audit(30, 1).unwrap()[0].hash);

        let page = store.query_audit(&AuditQuery::newest(5)).unwrap();
        assert_eq!(seqs(&page), [31, 30, 29, 28, 27], "{name}");
        let mut older = AuditQuery::newest(5);
        older.before_seq = Some(27);
        assert_eq!(
            seqs(&store.query_audit(&older).unwrap()),
            [26, 25, 24, 23, 22]
        );

        let mut query = AuditQuery::newest(100);
        query.device_id = Some("lock".to_owned());
        assert_eq!(
            seqs(&store.query_audit(&query).unwrap()),
            [30, 27, 24, 21, 18, 15, 12, 9, 6, 3],
            "{name}"
        );
        query.agent_id = Some("kitchen".to_owned());
        assert_eq!(
            seqs(&store.query_audit(&query).unwrap()),
            [30, 24, 18, 12, 6]
        );
        query.allowed = Some(false);
        assert_eq!(seqs(&store.query_audit(&query).unwrap()), [30]);
        query.allowed = Some(true);
        query.before_seq = Some(18);
        assert_eq!(seqs(&store.query_audit(&query).unwrap()), [12, 6]);

        // A value that only looks like a filter's matches nothing.
        let mut odd = AuditQuery::newest(10);
        odd.device_id = Some("lamp' OR 1=1 --".to_owned());
        assert!(store.query_audit(&odd).unwrap().is_empty(), "{name}");
        let mut none = AuditQuery::newest(0);
        none.device_id = Some("lamp".to_owned());
        assert!(store.query_audit(&none).unwrap().is_empty(), "{name}");
    }
}

/// A write probe writes no entry and leaves the chain whole.
pub(crate) fn a_write_probe_writes_no_audit_entry(make: Factory<'_>) {
    let Subject {
        name,
        store,
        reopen: _,
        keep: _keep,
    } = make();
    store.append_audit(&[event("decision", 1)]).unwrap();
    store.probe_write(1_700_000_000_000).unwrap();
    store.probe_write(1_700_000_000_001).unwrap();
    assert_eq!(store.load().unwrap().audit_entries, 1, "{name}");
    assert!(store.verify_audit().unwrap().is_intact(), "{name}");
}

/// The audit writer's batches and direct changes, from two threads, make
/// one chain.
pub(crate) fn the_writer_and_direct_changes_share_one_chain(make: Factory<'_>) {
    let subject = with_writer(make);
    let (name, store, writer) = (subject.name, &subject.store, &subject.writer);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for n in 0..200 {
                writer.record(event("decision", n));
            }
        });
        for n in 0..20 {
            let stored = pairing(&format!("d{n}"), &["a"], n + 1);
            store.put_pairing(&stored, &paired(&stored, n)).unwrap();
        }
    });
    writer.flush().unwrap();
    let report = store.verify_audit().unwrap();
    assert!(report.is_intact(), "{name}: {:?}", report.problems);
    assert_eq!(report.entries, 220, "{name}");
}

/// Runs every test of the suite, each on stores `make` makes.
pub(crate) fn run_all(make: Factory<'_>) {
    pairings_and_grants(make);
    round_trip_secrets_and_audit(make);
    refuses_unstorable_values_without_change(make);
    agents_round_trip_replace_and_delete(make);
    entries_of_changes_are_written_only_with_their_change(make);
    rate_hits(make);
    a_pinned_key_is_kept_with_its_pairing(make);
    audit_pages_newest_first_narrowed_by_what_entries_name(make);
    a_write_probe_writes_no_audit_entry(make);
    the_writer_and_direct_changes_share_one_chain(make);
    the_writer_records_a_reserved_kind_as_unstorable(make);
}

/// A fresh `MemoryStore`.
fn memory() -> Subject {
    Subject {
        name: "memory",
        store: Box::new(MemoryStore::new()),
        reopen: None,
        keep: None,
    }
}

#[test]
fn conformance_memory() {
    run_all(&memory);
}
