//! The device index in buckets (schema 7): pages of one device's entries
//! are exactly the entries a full scan selects, across buckets and spans,
//! on a new database and on one migrated from schema 6.

use proptest::prelude::*;
use rusqlite::{Connection, params};
use serde_json::json;

use crate::{AuditEntry, AuditQuery, SqliteStore, Store};

/// One entry placed at `seq` by hand (the chain does not matter to a page):
/// `device` and `agent` are indexes into small name lists, so that pages
/// have something to select and skip.
#[derive(Debug, Clone)]
struct Row {
    seq: i64,
    device: Option<usize>,
    agent: Option<usize>,
    allowed: bool,
    decision: bool,
}

const DEVICES: [&str; 3] = ["lamp", "lock", "it's \"odd\""];
const AGENTS: [&str; 2] = ["kitchen", "hall"];

fn entry(row: &Row) -> String {
    let mut entry = json!({ "n": row.seq, "allowed": row.allowed });
    if let Some(device) = row.device {
        entry["deviceId"] = json!(DEVICES[device]);
    }
    if let Some(agent) = row.agent {
        entry["agentId"] = json!(AGENTS[agent]);
    }
    entry.to_string()
}

/// Puts `rows` in the log by hand, and their spans as `append` records them.
fn insert(conn: &Connection, rows: &[Row]) {
    insert_rows(conn, rows);
    conn.execute_batch(SPANS_FROM_ENTRIES).unwrap();
}

/// Puts `rows` in the log by hand, and nothing else: with the columns
/// schema 8 reads them by filled from their text as its migration fills
/// them, when the log has those columns.
fn insert_rows(conn: &Connection, rows: &[Row]) {
    use crate::entry::fields::{AGENT_ID, ALLOWED, DEVICE_ID};
    use crate::sqlite::{column_from_entry, column_of};
    let has_columns: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('audit') WHERE name = 'device_id'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let sql = if has_columns {
        let [device, agent, allowed] = [DEVICE_ID, AGENT_ID, ALLOWED]
            .map(|field| column_from_entry(field).replace("entry", "?4"));
        format!(
            "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash, {}, {}, {})
             VALUES (?1, ?2, ?3, ?4, '', '', {device}, {agent}, {allowed})",
            column_of(DEVICE_ID),
            column_of(AGENT_ID),
            column_of(ALLOWED),
        )
    } else {
        "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, '', '')"
            .to_owned()
    };
    let mut insert = conn.prepare(&sql).unwrap();
    for row in rows {
        let kind = if row.decision { "decision" } else { "note" };
        insert
            .execute(params![row.seq, row.seq, kind, entry(row)])
            .unwrap();
    }
}

/// The spans the log's entries name each device in, read from the entries
/// themselves.
const SPANS_FROM_ENTRIES: &str = "INSERT OR IGNORE INTO audit_device_span (device_id, span)
     SELECT json_extract(entry, '$.deviceId'), seq >> 16 FROM audit
     WHERE json_valid(entry) AND json_type(entry, '$.deviceId') = 'text'";

fn spans(path: &std::path::Path) -> Vec<(String, i64)> {
    Connection::open(path)
        .unwrap()
        .prepare("SELECT device_id, span FROM audit_device_span ORDER BY device_id, span")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Appending records the spans of the entries appended: exactly those the
/// entries name a device in (a `deviceId` that is not a string names
/// none), whatever the batch.
#[test]
fn appends_record_the_spans_their_entries_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dk.db");
    let store = SqliteStore::open(&path).unwrap();
    let event = |n: u64, entry: serde_json::Value| crate::AuditEvent {
        at_ms: n,
        kind: "decision".to_owned(),
        entry,
    };
    store
        .append_audit(&[
            event(1, json!({"deviceId": "lamp"})),
            event(2, json!({"deviceId": "lamp"})),
            event(3, json!({"deviceId": 7})),
            event(4, json!({"deviceId": null, "agentId": "kitchen"})),
        ])
        .unwrap();
    store
        .append_audit(&[event(5, json!({"deviceId": "it's \"odd\""}))])
        .unwrap();
    let recorded = spans(&path);
    assert_eq!(
        recorded,
        [("it's \"odd\"".to_owned(), 0), ("lamp".to_owned(), 0)]
    );
    let conn = Connection::open(&path).unwrap();
    conn.execute("DELETE FROM audit_device_span", []).unwrap();
    conn.execute_batch(SPANS_FROM_ENTRIES).unwrap();
    assert_eq!(spans(&path), recorded);
}

/// What a page must hold: the full log scanned newest first.
fn expected(rows: &[Row], query: &AuditQuery) -> Vec<i64> {
    let mut sorted: Vec<&Row> = rows.iter().collect();
    sorted.sort_by_key(|row| std::cmp::Reverse(row.seq));
    sorted
        .into_iter()
        .filter(|row| query.before_seq.is_none_or(|b| row.seq < b as i64))
        .filter(|row| {
            let kind = if row.decision { "decision" } else { "note" };
            let value: serde_json::Value = serde_json::from_str(&entry(row)).unwrap();
            query.selects(kind, &value)
        })
        .take(query.limit)
        .map(|row| row.seq)
        .collect()
}

fn seqs(entries: &[AuditEntry]) -> Vec<i64> {
    entries.iter().map(|e| e.seq as i64).collect()
}

fn row_strategy() -> impl Strategy<Value = Row> {
    (
        // Sparse positions across several spans of 65,536 entries, and
        // dense ones in the first buckets.
        prop_oneof![1i64..3_000, 1i64..300_000],
        proptest::option::weighted(0.8, 0usize..DEVICES.len()),
        proptest::option::of(0usize..AGENTS.len()),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(seq, device, agent, allowed, decision)| Row {
            seq,
            device,
            agent,
            allowed,
            decision,
        })
}

fn query_strategy() -> impl Strategy<Value = AuditQuery> {
    (
        proptest::option::of(1u64..310_000),
        proptest::option::of(0usize..DEVICES.len() + 1),
        proptest::option::of(0usize..AGENTS.len()),
        proptest::option::of(any::<bool>()),
        0usize..40,
    )
        .prop_map(|(before_seq, device, agent, allowed, limit)| AuditQuery {
            before_seq,
            // One past the list: a device the log never names.
            device_id: device.map(|d| DEVICES.get(d).copied().unwrap_or("absent").to_owned()),
            agent_id: agent.map(|a| AGENTS[a].to_owned()),
            allowed,
            limit,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn device_pages_are_what_a_full_scan_selects(
        rows in proptest::collection::btree_map(any::<u32>(), row_strategy(), 0..120),
        queries in proptest::collection::vec(query_strategy(), 1..12),
    ) {
        let mut unique = std::collections::BTreeMap::new();
        for row in rows.into_values() {
            unique.insert(row.seq, row);
        }
        let rows: Vec<Row> = unique.into_values().collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dk.db");
        drop(SqliteStore::open(&path).unwrap());
        insert(&Connection::open(&path).unwrap(), &rows);
        let store = SqliteStore::open(&path).unwrap();
        for query in &queries {
            prop_assert_eq!(
                seqs(&store.query_audit(query).unwrap()),
                expected(&rows, query),
                "{:?}",
                query
            );
        }
    }
}

/// A log written under schema 6 (one index on the device, no spans) is
/// migrated: its spans are filled from the entries, and pages read the
/// same before and after.
#[test]
fn a_schema_6_log_gets_its_spans_when_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dk.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        for step in &crate::sqlite::MIGRATIONS[..6] {
            conn.execute_batch(step).unwrap();
        }
        conn.pragma_update(None, "application_id", crate::sqlite::APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", 6).unwrap();
    }
    let rows: Vec<Row> = [3, 70_000, 70_001, 140_000, 200_000]
        .into_iter()
        .enumerate()
        .map(|(i, seq)| Row {
            seq,
            device: Some(i % 2),
            agent: None,
            allowed: true,
            decision: true,
        })
        .chain([Row {
            seq: 9,
            device: None,
            agent: None,
            allowed: false,
            decision: false,
        }])
        .collect();
    insert_rows(&Connection::open(&path).unwrap(), &rows);
    // Damaged JSON migrates as naming nothing.
    Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash)
             VALUES (10, 10, 'decision', '{not json', '', '')",
            [],
        )
        .unwrap();
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        spans(&path),
        [
            ("lamp".to_owned(), 0),
            ("lamp".to_owned(), 1),
            ("lamp".to_owned(), 3),
            ("lock".to_owned(), 1),
            ("lock".to_owned(), 2),
        ]
    );
    for device in DEVICES {
        let query = AuditQuery {
            device_id: Some(device.to_owned()),
            ..AuditQuery::newest(10)
        };
        assert_eq!(
            seqs(&store.query_audit(&query).unwrap()),
            expected(&rows, &query)
        );
    }
}

/// Every bucket read goes through the device index (SQLite refuses a
/// query whose `INDEXED BY` it cannot use, so this also fails if the
/// query's expressions drift from the index's).
#[test]
fn device_pages_read_through_the_bucket_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dk.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    for query in [
        AuditQuery {
            device_id: Some("lamp".to_owned()),
            ..AuditQuery::newest(5)
        },
        AuditQuery {
            device_id: Some("lamp".to_owned()),
            agent_id: Some("kitchen".to_owned()),
            allowed: Some(true),
            before_seq: Some(7),
            limit: 5,
        },
    ] {
        let plan = query_plan(&conn, &query);
        assert!(
            plan.iter()
                .any(|step| step.contains("audit_device_bucket") && !step.contains("SCAN")),
            "{plan:?}"
        );
    }
}

/// The steps SQLite plans for the SQL of `query`, as `EXPLAIN QUERY PLAN`
/// details them.
pub(crate) fn query_plan(conn: &Connection, query: &AuditQuery) -> Vec<String> {
    let (sql, values) = crate::sqlite::audit_query_sql(query);
    conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(rusqlite::params_from_iter(values), |row| {
            row.get::<_, String>(3)
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}
