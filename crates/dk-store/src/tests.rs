//! Tests of the store: the conformance suite (`conformance.rs`) run
//! against memory and SQLite, tampering with a real database file,
//! migrations, file modes, the audit writer, and crash safety with a child
//! process killed mid-write.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use rand::RngExt;
use rusqlite::{Connection, params};
use serde_json::{Value, json};

use super::audit::{canonical_json, entry_hash};
use super::conformance::{self, Subject, *};
use super::*;
use crate::testing::{AuditGate, FaultyStore, Writes};

// ---------------------------------------------------------------- helpers

/// A temporary directory, removed on drop, holding a store's file.
struct TempDir {
    root: PathBuf,
    _removed_on_drop: tempfile::TempDir,
}

impl TempDir {
    fn new() -> TempDir {
        let dir = tempfile::tempdir().unwrap();
        TempDir {
            root: dir.path().to_owned(),
            _removed_on_drop: dir,
        }
    }

    fn db(&self) -> PathBuf {
        self.root.join("data").join("dk.db")
    }
}

/// A fresh `SqliteStore` in a directory of its own, which it can be
/// reopened from.
fn sqlite() -> Subject {
    let dir = TempDir::new();
    let path = dir.db();
    let store = SqliteStore::open(&path).unwrap();
    Subject {
        name: "sqlite",
        store: Box::new(store),
        reopen: Some(Box::new(move || {
            Box::new(SqliteStore::open(&path).unwrap())
        })),
        keep: Some(Box::new(dir)),
    }
}

/// The conformance suite against SQLite.
#[test]
fn conformance_sqlite() {
    conformance::run_all(&sqlite);
}

// ---------------------------------------------------------- contract suite

#[test]
fn errors_read_as_one_lower_case_line() {
    let errors = [
        StoreError::UnknownDevice("d1".to_owned()),
        StoreError::NewerSchema {
            found: 9,
            supported: 1,
        },
        StoreError::Corrupt("x".to_owned()),
        StoreError::WriterStopped,
    ];
    for error in errors {
        let text = error.to_string();
        assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
        assert!(!text.contains('\n') && !text.ends_with('.'), "{text}");
    }
}

// ----------------------------------------------------------------- hashing

#[test]
fn entry_hash_is_the_documented_formula() {
    use sha2::{Digest, Sha256};
    let text = format!("{GENESIS_HASH}\n1\n5\ndecision\n{{\"a\":1}}");
    let expected = dk_files::hex::encode(&Sha256::digest(text.as_bytes()));
    assert_eq!(
        entry_hash(GENESIS_HASH, 1, 5, "decision", r#"{"a":1}"#),
        expected
    );
}

#[test]
fn canonical_json_sorts_keys_at_every_depth() {
    let value: Value =
        serde_json::from_str(r#"{ "b": [ {"z": 1, "a": "é\n"} ], "a": null }"#).unwrap();
    assert_eq!(
        canonical_json(&value),
        r#"{"a":null,"b":[{"a":"é\n","z":1}]}"#
    );
}

// --------------------------------------------------------------- tampering

/// A store with `entries` decision entries, and a second connection to
/// its file with the append-only triggers dropped, as an attacker with
/// write access to the file would.
fn tamper_setup(entries: u64) -> (TempDir, SqliteStore, Connection) {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    let events: Vec<AuditEvent> = (1..=entries).map(|n| event("decision", n)).collect();
    store.append_audit(&events).unwrap();
    let attacker = Connection::open(dir.db()).unwrap();
    attacker
        .execute_batch("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")
        .unwrap();
    (dir, store, attacker)
}

fn stored_hash(conn: &Connection, seq: i64) -> String {
    conn.query_row("SELECT hash FROM audit WHERE seq = ?1", [seq], |row| {
        row.get(0)
    })
    .unwrap()
}

/// Forges a well-hashed row at `seq` chained to `prev_hash`.
fn forge(conn: &Connection, seq: i64, prev_hash: &str) {
    let entry = r#"{"device":"d1","forged":true}"#;
    let hash = entry_hash(prev_hash, seq, 5, "decision", entry);
    conn.execute(
        "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash) VALUES (?1, 5, 'decision', ?2, ?3, ?4)",
        params![seq, entry, prev_hash, hash],
    )
    .unwrap();
}

/// Rehashes entry `seq` over its (edited) content and stored prev_hash.
fn rehash(conn: &Connection, seq: i64) {
    let (at, kind, entry, prev): (i64, String, String, String) = conn
        .query_row(
            "SELECT at_ms, kind, entry, prev_hash FROM audit WHERE seq = ?1",
            [seq],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .unwrap();
    let hash = entry_hash(&prev, seq, at, &kind, &entry);
    conn.execute(
        "UPDATE audit SET hash = ?1 WHERE seq = ?2",
        params![hash, seq],
    )
    .unwrap();
}

/// Applies `attack` to a log of 10 entries and checks the problems found,
/// both without and with the head kept before the attack.
#[track_caller]
fn check_tamper(
    attack: impl FnOnce(&Connection),
    expected: &[(u64, ProblemKind)],
    expected_against_head: &[(u64, ProblemKind)],
) {
    let (_dir, store, attacker) = tamper_setup(10);
    let head = store.verify_audit().unwrap().head();
    attack(&attacker);
    let found = |report: VerifyReport| {
        report
            .problems
            .iter()
            .map(|p| (p.seq, p.what))
            .collect::<Vec<_>>()
    };
    let report = store.verify_audit().unwrap();
    assert_eq!(found(report.clone()), expected, "{:#?}", report.problems);
    let report = store.verify_audit_against(&head).unwrap();
    assert_eq!(
        found(report.clone()),
        expected_against_head,
        "{:#?}",
        report.problems
    );
}

#[test]
fn tampering_is_found_where_it_happened() {
    use ProblemKind::*;
    // Edited content.
    check_tamper(
        |c| {
            c.execute(
                r#"UPDATE audit SET entry = '{"device":"d1","n":5,"reason":"refused"}' WHERE seq = 5"#,
                [],
            )
            .unwrap();
        },
        &[(5, Edited)],
        &[(5, Edited)],
    );
    // Edited time.
    check_tamper(
        |c| {
            c.execute("UPDATE audit SET at_ms = 1 WHERE seq = 1", [])
                .unwrap();
        },
        &[(1, Edited)],
        &[(1, Edited)],
    );
    // Edited content with its hash recomputed: the next entry's prev_hash.
    check_tamper(
        |c| {
            c.execute("UPDATE audit SET kind = 'policy' WHERE seq = 5", [])
                .unwrap();
            rehash(c, 5);
        },
        &[(5, Edited)],
        &[(5, Edited)],
    );
    // Only the hash changed.
    check_tamper(
        |c| {
            c.execute("UPDATE audit SET hash = ?1 WHERE seq = 3", [GENESIS_HASH])
                .unwrap();
        },
        &[(3, Edited)],
        &[(3, Edited)],
    );
    // The last entry edited and rehashed: only the kept head shows it.
    check_tamper(
        |c| {
            c.execute("UPDATE audit SET kind = 'policy' WHERE seq = 10", [])
                .unwrap();
            rehash(c, 10);
        },
        &[],
        &[(10, Edited)],
    );
    // Deleted rows.
    check_tamper(
        |c| {
            c.execute("DELETE FROM audit WHERE seq = 5", []).unwrap();
        },
        &[(5, Missing)],
        &[(5, Missing)],
    );
    check_tamper(
        |c| {
            c.execute("DELETE FROM audit WHERE seq IN (1, 2)", [])
                .unwrap();
        },
        &[(1, Missing)],
        &[(1, Missing)],
    );
    // Deleted and the rest renumbered to close the gap.
    check_tamper(
        |c| {
            c.execute_batch(
                "DELETE FROM audit WHERE seq = 5;
                 UPDATE audit SET seq = seq - 1 WHERE seq > 5;",
            )
            .unwrap();
        },
        &[(5, Missing)],
        &[(5, Missing), (10, Truncated)],
    );
    // A well-hashed row inserted, the rest renumbered to make room.
    check_tamper(
        |c| {
            c.execute_batch(
                "UPDATE audit SET seq = seq + 1000 WHERE seq >= 5;
                 UPDATE audit SET seq = seq - 999 WHERE seq >= 1000;",
            )
            .unwrap();
            forge(c, 5, &stored_hash(c, 4));
        },
        &[(5, Inserted)],
        &[(5, Inserted), (10, Edited)],
    );
    // A well-hashed row put before the first.
    check_tamper(
        |c| forge(c, 0, GENESIS_HASH),
        &[(0, Inserted)],
        &[(0, Inserted)],
    );
}

#[test]
fn reordering_is_found() {
    use ProblemKind::*;
    // Swap only the content of two rows (time, kind, entry).
    check_tamper(
        |c| {
            c.execute_batch(
                r#"CREATE TEMP TABLE keep AS SELECT seq, at_ms, kind, entry FROM audit WHERE seq IN (4, 5);
                   UPDATE audit SET
                       at_ms = (SELECT at_ms FROM keep WHERE keep.seq = 9 - audit.seq),
                       kind = (SELECT kind FROM keep WHERE keep.seq = 9 - audit.seq),
                       entry = (SELECT entry FROM keep WHERE keep.seq = 9 - audit.seq)
                   WHERE seq IN (4, 5);"#,
            )
            .unwrap();
        },
        &[(4, OutOfOrder), (5, OutOfOrder)],
        &[(4, OutOfOrder), (5, OutOfOrder)],
    );
    // Swap whole rows but their seq.
    check_tamper(
        |c| {
            c.execute_batch(
                "UPDATE audit SET seq = -4 WHERE seq = 4;
                 UPDATE audit SET seq = 4 WHERE seq = 5;
                 UPDATE audit SET seq = 5 WHERE seq = -4;",
            )
            .unwrap();
        },
        &[(4, OutOfOrder)],
        &[(4, OutOfOrder)],
    );
}

#[test]
fn truncation_is_found_only_against_the_kept_head() {
    use ProblemKind::*;
    check_tamper(
        |c| {
            c.execute("DELETE FROM audit WHERE seq > 7", []).unwrap();
        },
        &[],
        &[(8, Truncated)],
    );
    check_tamper(
        |c| {
            c.execute("DELETE FROM audit", []).unwrap();
        },
        &[],
        &[(1, Truncated)],
    );
}

#[test]
fn problems_say_where_and_what() {
    let (_dir, store, attacker) = tamper_setup(20);
    attacker
        .execute("UPDATE audit SET entry = '{}' WHERE seq = 17", [])
        .unwrap();
    let report = store.verify_audit().unwrap();
    assert_eq!(
        report
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["entry 17: edited (its hash does not match its content)"]
    );
    attacker
        .execute("DELETE FROM audit WHERE seq = 3", [])
        .unwrap();
    let report = store.verify_audit().unwrap();
    assert_eq!(
        report.problems[0].to_string(),
        "entry 3: missing (deleted) (entry 4 is chained to it)"
    );
}

#[test]
fn the_audit_table_refuses_edits_while_its_triggers_stand() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    store.append_audit(&[event("decision", 1)]).unwrap();
    let other = Connection::open(dir.db()).unwrap();
    let update = other.execute("UPDATE audit SET kind = 'x'", []);
    assert!(update.unwrap_err().to_string().contains("append-only"));
    let delete = other.execute("DELETE FROM audit", []);
    assert!(delete.unwrap_err().to_string().contains("append-only"));
}

// ------------------------------------------------- files, schema, damage

fn user_version(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

#[test]
fn migrations_set_the_version_once_and_refuse_newer_databases() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    store
        .put_pairing(
            &pairing("d1", &["a"], 1),
            &paired(&pairing("d1", &["a"], 1), 1),
        )
        .unwrap();
    drop(store);
    assert_eq!(user_version(&dir.db()), i64::from(SCHEMA_VERSION));
    // Reopening changes nothing.
    for _ in 0..2 {
        let store = SqliteStore::open(&dir.db()).unwrap();
        assert_eq!(store.load().unwrap().pairings.len(), 1);
        assert!(store.verify_audit().unwrap().is_intact());
    }
    assert_eq!(user_version(&dir.db()), i64::from(SCHEMA_VERSION));
    // A newer dk's database.
    Connection::open(dir.db())
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let error = SqliteStore::open(&dir.db()).unwrap_err();
    assert_eq!(
        error,
        StoreError::NewerSchema {
            found: SCHEMA_VERSION + 1,
            supported: SCHEMA_VERSION
        }
    );
    assert!(error.to_string().contains("newer"), "{error}");
}

#[test]
fn files_are_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    store
        .put_pairing(
            &pairing("d1", &["a"], 1),
            &paired(&pairing("d1", &["a"], 1), 1),
        )
        .unwrap();
    let mode = |path: PathBuf| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let db = dir.db();
    assert_eq!(mode(db.parent().unwrap().to_owned()), 0o700);
    assert_eq!(mode(db.clone()), 0o600);
    assert_eq!(mode(db.with_extension("db-wal")), 0o600);
    assert_eq!(mode(db.with_extension("db-shm")), 0o600);
    drop(store);
    // An existing file open to others is made private.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(SqliteStore::open(&db).unwrap());
    assert_eq!(mode(db), 0o600);
}

#[test]
fn no_token_reaches_the_data_directory() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    let token = "4f1c2b8e9d7a6c5b4f1c2b8e9d7a6c5b4f1c2b8e9d7a6c5b4f1c2b8e9d7a6c5b";
    let mut stored = pairing("d1", &["a"], 1);
    stored.token_hash = {
        use sha2::{Digest, Sha256};
        Sha256::digest(token.as_bytes()).into()
    };
    store.put_pairing(&stored, &paired(&stored, 1)).unwrap();
    store
        .put_secret_hash("admin-token", stored.token_hash)
        .unwrap();
    drop(store);
    for file in std::fs::read_dir(dir.db().parent().unwrap()).unwrap() {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
            "a token in clear on disk"
        );
    }
    // And a debug print of a pairing shows no hash either.
    assert!(!format!("{stored:?}").contains("token_hash"));
}

#[test]
fn damaged_files_are_errors_not_panics() {
    let dir = TempDir::new();
    // Not a database at all.
    std::fs::create_dir_all(dir.db().parent().unwrap()).unwrap();
    std::fs::write(dir.db(), vec![0x5a; 8192]).unwrap();
    let error = SqliteStore::open(&dir.db()).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");

    // Another program's database.
    let other = dir.root.join("other.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let error = SqliteStore::open(&other).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");

    // A directory where the file should be.
    let error = SqliteStore::open(&dir.root).unwrap_err();
    assert!(matches!(error, StoreError::Open { .. }), "{error}");

    // A dk store with a bad value in it.
    let path = dir.root.join("store.db");
    let store = SqliteStore::open(&path).unwrap();
    store
        .put_pairing(
            &pairing("d1", &["a"], 1),
            &paired(&pairing("d1", &["a"], 1), 1),
        )
        .unwrap();
    store.put_secret_hash("admin-token", [1; 32]).unwrap();
    let editor = Connection::open(&path).unwrap();
    editor
        .execute_batch(
            "UPDATE pairing SET token_hash = x'0102';
             UPDATE secret SET hash = x'01';",
        )
        .unwrap();
    let error = store.load().unwrap_err();
    assert!(
        matches!(&error, StoreError::Corrupt(text) if text.contains("token hash of `d1`")),
        "{error}"
    );
    let error = store.secret_hash("admin-token").unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
    editor
        .execute_batch("UPDATE pairing SET token_hash = zeroblob(32), generation = -1;")
        .unwrap();
    let error = store.load().unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
}

/// The system's error under a store error, found as its source.
fn io_source<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    error.source()?.downcast_ref::<std::io::Error>()
}

#[test]
fn errors_keep_the_error_underneath_as_their_source() {
    let dir = TempDir::new();
    let file = dir.root.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();

    // A store whose directory is a file.
    let inside = file.join("dk.db");
    let error = SqliteStore::open(&inside).unwrap_err();
    assert!(matches!(error, StoreError::Open { .. }), "{error}");
    let io = io_source(&error).unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::NotADirectory);
    assert_eq!(
        error.to_string(),
        format!("cannot open the store at `{}`: {io}", inside.display())
    );

    // A head file whose directory is a file.
    let error = AuditHead::read_from(&file.join("head")).unwrap_err();
    assert!(matches!(error, StoreError::HeadFile { .. }), "{error}");
    assert!(io_source(&error).is_some(), "{error}");

    // A head file that holds no head: the syntax error is the source.
    let head = dir.root.join("head");
    std::fs::write(&head, "not a head").unwrap();
    let error = AuditHead::read_from(&head).unwrap_err();
    let source = std::error::Error::source(&error).unwrap();
    assert!(source.is::<HeadSyntaxError>(), "{error}");

    // A key file whose directory is a file.
    let error = AuditKey::load(&file.join("audit.key")).unwrap_err();
    assert!(matches!(error, AuditKeyError::Io { .. }), "{error}");
    assert!(io_source(&error).is_some(), "{error}");

    // A cause given as text reads as it, and is its own source.
    let error = StoreError::Database(Cause::msg("disk full"));
    assert_eq!(error.to_string(), "database error: disk full");
    let source = std::error::Error::source(&error).unwrap();
    assert_eq!(source.to_string(), "disk full");
    assert!(source.source().is_none());
}

#[test]
fn ten_thousand_pairings_load_in_one_pass() {
    const DEVICES: usize = 10_000;
    let dir = TempDir::new();
    drop(SqliteStore::open(&dir.db()).unwrap());
    // Written in one transaction from the side: the test is about load.
    let mut conn = Connection::open(dir.db()).unwrap();
    let tx = conn.transaction().unwrap();
    for i in 0..DEVICES {
        let p = pairing(&format!("device-{i:05}"), &[], i as u64 + 1);
        tx.execute(
            "INSERT INTO pairing VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)",
            params![
                p.device_id,
                p.manifest_json,
                p.digest,
                &p.token_hash[..],
                p.generation as i64,
                p.paired_at_ms as i64
            ],
        )
        .unwrap();
        for cap in ["brightness", "color", "set_power"] {
            tx.execute(
                "INSERT INTO device_grant VALUES (?1, ?2)",
                params![p.device_id, cap],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
    drop(conn);
    let store = SqliteStore::open(&dir.db()).unwrap();
    let snapshot = store.load().unwrap();
    assert_eq!(snapshot.pairings.len(), DEVICES);
    assert_eq!(snapshot.max_generation, DEVICES as u64);
    for (i, p) in snapshot.pairings.iter().enumerate() {
        assert_eq!(p.device_id, format!("device-{i:05}"));
        assert_eq!(p.grants, ["brightness", "color", "set_power"]);
        assert_eq!(*p, {
            let mut e = pairing(&p.device_id, &["brightness", "color", "set_power"], 0);
            e.generation = i as u64 + 1;
            e.token_hash = [(i as u64 + 1) as u8; 32];
            e.paired_at_ms = 1_700_000_000_000 + i as u64 + 1;
            e
        });
    }
}

// ------------------------------------------------------------ the writer

/// Options that commit only full batches or on flush.
fn patient(max_batch: usize, queue: usize) -> WriterOptions {
    WriterOptions {
        max_batch,
        max_delay: Duration::from_secs(3600),
        queue,
        ..WriterOptions::default()
    }
}

/// The `n` of every entry in `store`, in order.
fn numbers(store: &dyn Store) -> Vec<u64> {
    store
        .read_audit(0, 1000)
        .unwrap()
        .iter()
        .map(|e| e.entry["n"].as_u64().unwrap())
        .collect()
}

#[test]
fn writer_commits_full_batches_and_the_rest_on_flush() {
    let store = Arc::new(MemoryStore::new());
    let writer = AuditWriter::start(store.clone(), patient(10, 1000));
    for n in 1..=25 {
        writer.record(event("decision", n));
    }
    writer.flush().unwrap();
    assert_eq!(writer.committed(), 25);
    assert_eq!(writer.batches(), 3);
    assert_eq!(writer.dropped(), 0);
    assert_eq!(numbers(&*store), (1..=25).collect::<Vec<_>>());
    assert!(store.verify_audit().unwrap().is_intact());
    // A flush with nothing pending commits nothing.
    writer.flush().unwrap();
    assert_eq!(writer.batches(), 3);
}

#[test]
fn writer_holds_a_partial_batch_until_flush_or_delay() {
    let store = Arc::new(MemoryStore::new());
    let writer = AuditWriter::start(store.clone(), patient(100, 1000));
    writer.record(event("decision", 1));
    writer.record(event("decision", 2));
    // A full batch has not formed and the delay is an hour: nothing yet.
    assert_eq!(store.load().unwrap().audit_entries, 0);
    writer.flush().unwrap();
    assert_eq!(store.load().unwrap().audit_entries, 2);

    // With a short delay the batch commits without a flush.
    let store = Arc::new(MemoryStore::new());
    let options = WriterOptions {
        max_delay: Duration::from_millis(1),
        ..WriterOptions::default()
    };
    let writer = AuditWriter::start(store.clone(), options);
    writer.record(event("decision", 1));
    dk_testkit::eventually_blocking("the batch committed without a flush", || {
        store.load().unwrap().audit_entries == 1
    });
    drop(writer);
}

#[test]
fn dropping_the_writer_commits_what_was_recorded() {
    let store = Arc::new(MemoryStore::new());
    let writer = AuditWriter::start(store.clone(), patient(100, 1000));
    for n in 1..=7 {
        writer.record(event("decision", n));
    }
    drop(writer);
    assert_eq!(store.load().unwrap().audit_entries, 7);
}

#[test]
fn a_full_queue_makes_callers_wait_and_drops_nothing() {
    use futures::FutureExt;
    let store = Arc::new(FaultyStore::default());
    let AuditGate {
        entered: entered_rx,
        open,
    } = store.hold_audit();
    // Two places, one event a batch.
    let writer = AuditWriter::start(store.clone(), patient(1, 2));
    let room = writer.room();
    for n in 1..=2 {
        let place = room.take().now_or_never().unwrap().unwrap();
        place.spend();
        writer.record_placed(move || Some(event("decision", n)));
    }
    // Event 1 is being committed, held at the gate; event 2 is queued.
    entered_rx.recv().unwrap();
    // A third call finds no room: it waits, without blocking its thread.
    let mut third = Box::pin(room.take());
    assert!(third.as_mut().now_or_never().is_none());
    // Event 1's commit gives its place back, to the call waiting for it.
    open.send(()).unwrap();
    futures::executor::block_on(third).unwrap().spend();
    writer.record_placed(|| Some(event("decision", 3)));
    // An event recorded outside a call, with every place still taken,
    // waits its patience and is queued past the bound, not dropped.
    writer.record(event("decision", 4));
    store.stop_telling();
    drop(open);
    writer.flush().unwrap();
    assert_eq!(numbers(&*store), [1, 2, 3, 4]);
    assert_eq!((writer.committed(), writer.dropped()), (4, 0));
    // Every place came back.
    let places: Vec<_> = (0..2)
        .map(|_| room.take().now_or_never().unwrap().unwrap())
        .collect();
    assert!(room.take().now_or_never().is_none());
    drop(places);
}

#[test]
fn a_failing_store_is_retried_and_nothing_is_lost() {
    let store = Arc::new(FaultyStore::default());
    store.fail(Writes::Audit, true);
    let writer = AuditWriter::start(store.clone(), patient(2, 100));
    for n in 1..=3 {
        writer.record(event("decision", n));
    }
    // Each flush while the store fails says so; the events stay queued.
    for _ in 0..2 {
        let error = writer.flush().unwrap_err();
        assert_eq!(error, StoreError::DiskFull(Cause::msg("disk full")));
    }
    assert_eq!((writer.committed(), writer.dropped()), (0, 0));
    writer.record(event("decision", 4));
    store.fail(Writes::Audit, false);
    writer.flush().unwrap();
    assert_eq!(numbers(&*store), [1, 2, 3, 4]);
    assert_eq!((writer.committed(), writer.dropped()), (4, 0));
    writer.flush().unwrap();
}

#[test]
fn a_writer_keeps_up_until_its_commits_fail_or_its_queue_fills() {
    let store = Arc::new(FaultyStore::default());
    let writer = AuditWriter::start(store.clone(), patient(1, 4));
    assert!(writer.keeping_up());
    // Commits that fail: not keeping up until one succeeds again.
    store.fail(Writes::Audit, true);
    writer.record(event("decision", 1));
    assert!(writer.flush().is_err());
    assert!(!writer.keeping_up());
    store.fail(Writes::Audit, false);
    writer.flush().unwrap();
    assert!(writer.keeping_up());
    // A disk that holds every commit: four places taken of four is more
    // than three quarters.
    let AuditGate { entered, open } = store.hold_audit();
    for n in 2..=5 {
        writer.record(event("decision", n));
    }
    entered.recv().unwrap();
    assert_eq!(writer.queued(), 4);
    assert!(!writer.keeping_up());
    store.stop_telling();
    drop(open);
    writer.flush().unwrap();
    assert_eq!(writer.queued(), 0);
    assert!(writer.keeping_up());
}

/// Options that commit at once, holding calls to `bound`.
fn bounded(bound: Duration) -> WriterOptions {
    WriterOptions {
        max_delay: Duration::from_millis(1),
        durable_within: bound,
        ..WriterOptions::default()
    }
}

#[test]
fn a_store_that_hangs_with_nothing_queued_stops_calls_within_the_bound() {
    let store = Arc::new(FaultyStore::default());
    let bound = Duration::from_millis(200);
    let writer = AuditWriter::start(store.clone(), bounded(bound));
    let room = writer.room();
    assert_eq!(room.durable_within(), bound);
    // Its probe at start shows that the store takes writes.
    assert!(room.accepting());
    assert!(writer.store_takes_writes());
    // A store that answers nothing (a server paused), with no event queued:
    // only the writer's probe can tell, and it does within the bound.
    // (How soon after the bound is for a bench to measure, not a test.)
    let frozen = store.freeze();
    dk_testkit::eventually_blocking("calls refused while the store hangs", || {
        room.durability() == Durability::Lost
    });
    // What a readiness check reads says so too; nothing failed and nothing
    // is queued, so the writer itself keeps up.
    assert!(!writer.store_takes_writes());
    assert!(writer.keeping_up());
    assert!(!room.failing());
    drop(frozen);
    dk_testkit::eventually_blocking("calls accepted once it answers", || room.accepting());
    assert!(writer.store_takes_writes());
}

#[test]
fn a_store_that_refuses_its_first_write_refuses_calls_from_the_start() {
    // The writer probes the store as it starts: a store that takes the
    // write is shown to at once, one that refuses it refuses calls at
    // once (a bound of an hour: not found out only when it runs out).
    let store = Arc::new(FaultyStore::default());
    let writer = AuditWriter::start(store.clone(), bounded(Duration::from_secs(3600)));
    assert!(writer.room().accepting());
    assert!(writer.store_takes_writes());
    let store = Arc::new(FaultyStore::default());
    store.fail(Writes::Agents, true);
    let writer = AuditWriter::start(store.clone(), bounded(Duration::from_secs(3600)));
    let room = writer.room();
    assert_eq!(room.durability(), Durability::Lost);
    assert!(!writer.store_takes_writes());
    store.fail(Writes::Agents, false);
    writer.record(event("decision", 1));
    writer.flush().unwrap();
    assert!(room.accepting());
    assert!(writer.store_takes_writes());
}

#[test]
fn a_backlog_older_than_the_bound_holds_calls_back_while_commits_still_hold() {
    let store = Arc::new(FaultyStore::default());
    // A disk slower than the records: one event a commit, 40 ms each.
    store.pause_audit(Duration::from_millis(40));
    let options = WriterOptions {
        max_batch: 1,
        ..bounded(Duration::from_millis(100))
    };
    let writer = AuditWriter::start(store.clone(), options);
    let room = writer.room();
    for n in 1..=30 {
        writer.record(event("decision", n));
    }
    // Every commit holds (the store took one within 40 ms), but the oldest
    // event waits longer than the bound: calls wait for it to catch up.
    dk_testkit::eventually_blocking("calls held back behind the backlog", || {
        room.durability() == Durability::Behind
    });
    assert!(!room.accepting());
    assert!(!room.failing());
    writer.flush().unwrap();
    assert_eq!(writer.committed(), 30);
    store.pause_audit(Duration::ZERO);
    dk_testkit::eventually_blocking("calls accepted once it is committed", || room.accepting());
}

#[test]
fn a_store_that_refuses_the_probe_stops_calls_with_nothing_queued() {
    let store = Arc::new(FaultyStore::default());
    let writer = AuditWriter::start(store.clone(), bounded(Duration::from_millis(100)));
    let room = writer.room();
    // A full disk: the probe's write fails, and no commit proves otherwise.
    store.fail(Writes::Pairings, true);
    dk_testkit::eventually_blocking("calls refused on a full disk", || {
        room.durability() == Durability::Lost
    });
    store.fail(Writes::Pairings, false);
    dk_testkit::eventually_blocking("calls accepted again", || room.accepting());
    // The probes wrote no audit entry.
    assert_eq!(store.load().unwrap().audit_entries, 0);
}

#[test]
fn a_full_disk_releases_the_reserve_for_what_is_queued_and_refuses_calls_until_there_is_room() {
    let store = Arc::new(FaultyStore::default());
    let writer = AuditWriter::start(store.clone(), bounded(Duration::from_millis(100)));
    let room = writer.room();
    dk_testkit::eventually_blocking("calls accepted", || room.accepting());
    // The disk fills while decisions of calls that reached a device are
    // queued: the commit fails, the reserve is released, and they are
    // committed into its space.
    store.fill_disk();
    for n in 1..=5 {
        writer.record(event("decision", n));
    }
    writer.flush().unwrap();
    assert_eq!(numbers(&*store), [1, 2, 3, 4, 5]);
    assert_eq!(store.reserve(), (Some(false), 1));
    // From then on no call reaches a device, and a readiness check names
    // the store, though the reserve's space still takes commits.
    assert_eq!(room.durability(), Durability::Lost);
    assert!(writer.disk_full());
    assert!(!writer.store_takes_writes());
    assert!(writer.keeping_up());
    writer.record(event("decision", 6));
    writer.flush().unwrap();
    assert_eq!(room.durability(), Durability::Lost);
    // Space is freed: the reserve is made again, and calls are accepted.
    store.free_disk();
    dk_testkit::eventually_blocking("calls accepted once there is room", || room.accepting());
    assert_eq!(store.reserve(), (Some(true), 1));
    assert!(writer.store_takes_writes());
    assert_eq!((writer.committed(), writer.dropped()), (6, 0));
}

#[test]
fn a_full_disk_stops_calls_at_its_first_failed_write_not_after_the_bound() {
    // A bound of an hour: only the full disk, not the bound, stops calls.
    let store = Arc::new(FaultyStore::default());
    let writer = AuditWriter::start(store.clone(), bounded(Duration::from_secs(3600)));
    let room = writer.room();
    dk_testkit::eventually_blocking("calls accepted", || room.accepting());
    store.fill_disk();
    writer.record(event("decision", 1));
    writer.flush().unwrap();
    assert_eq!(room.durability(), Durability::Lost);
    assert_eq!(store.reserve(), (Some(false), 1));
    assert_eq!(numbers(&*store), [1]);
    store.free_disk();
    writer.record(event("decision", 2));
    writer.flush().unwrap();
    assert!(room.accepting());

    // With nothing queued, the writer's probe finds the disk full.
    let store = Arc::new(FaultyStore::default());
    let writer = AuditWriter::start(store.clone(), bounded(Duration::from_millis(200)));
    let room = writer.room();
    dk_testkit::eventually_blocking("calls accepted", || room.accepting());
    store.fill_disk();
    dk_testkit::eventually_blocking("the probe finding the disk full", || writer.disk_full());
    assert_eq!(room.durability(), Durability::Lost);
    assert_eq!(store.reserve(), (Some(false), 1));
    assert_eq!(store.load().unwrap().audit_entries, 0);
}

#[test]
fn an_sqlite_store_releases_its_reserve_on_a_full_disk_and_makes_it_again() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    // Without a reserve: a full disk is named so, and nothing is kept.
    assert!(store.disk_full(&StoreError::DiskFull(Cause::msg("disk full"))));
    assert!(!store.release_reserve());
    assert!(store.restore_reserve());
    let file = dir.root.join("data").join(RESERVE_FILE);
    let reserve = DiskReserve::new(&file, 64 * 1024, 4096);
    reserve.make().unwrap();
    let store = store.with_reserve(reserve);
    // Another error, with room on the disk, is not a full disk.
    assert!(!store.disk_full(&StoreError::Database(Cause::msg("locked"))));
    assert!(store.disk_full(&StoreError::DiskFull(Cause::msg("disk full"))));
    assert!(store.release_reserve());
    assert!(!file.exists());
    assert!(!store.release_reserve());
    assert!(store.restore_reserve());
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 64 * 1024);
}

#[test]
fn a_store_opened_read_only_migrates_nothing_and_writes_nothing() {
    use std::os::unix::fs::PermissionsExt;

    // A log written at schema 6, keyed (the fixture of the audit schema).
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/audit/schema-1");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("vessel.db");
    std::fs::copy(fixture.join("vessel.db"), &db).unwrap();
    let key_file = dir.path().join("audit.key");
    std::fs::copy(fixture.join("audit.key"), &key_file).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Readable by anyone: opening to read does not take that away either.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let before = std::fs::read(&db).unwrap();
    let user_version = |db: &Path| -> i64 {
        Connection::open(db)
            .unwrap()
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap()
    };
    assert_eq!(user_version(&db), 6);

    let store = SqliteStore::open_read_only(&db).unwrap();
    let key = AuditKey::load(&key_file).unwrap();
    let report = store.verify_audit_with(Some(&key), None).unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    assert_eq!(report.entries, 29);
    assert_eq!(store.read_audit(0, 100).unwrap().len(), 29);
    assert_eq!(store.audit_head().unwrap().seq, 29);
    // Every write fails, and none is made.
    assert!(store.append_audit(&[event("decision", 1)]).is_err());
    assert!(store.probe_write(1).is_err());
    drop(store);
    assert_eq!(std::fs::read(&db).unwrap(), before);
    assert_eq!(
        std::fs::metadata(&db).unwrap().permissions().mode() & 0o777,
        0o644
    );

    // No store there, or an empty file: refused, nothing made.
    let missing = dir.path().join("none.db");
    assert!(SqliteStore::open_read_only(&missing).is_err());
    assert!(!missing.exists());
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let error = SqliteStore::open_read_only(&empty).unwrap_err();
    assert!(error.to_string().contains("holds no dk store"), "{error}");
    assert_eq!(std::fs::read(&empty).unwrap(), b"");
}

#[test]
fn a_faulty_store_fails_its_write_probe() {
    let faulty = FaultyStore::default();
    faulty.probe_write(1).unwrap();
    faulty.fail(Writes::Pairings, true);
    assert!(faulty.probe_write(2).is_err());
}

#[test]
fn a_writer_stopped_while_its_store_fails_still_stops() {
    let logs = dk_testkit::LogBuffer::default();
    let sink = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .finish(),
    );
    let store = Arc::new(FaultyStore::default());
    store.fail(Writes::Audit, true);
    let writer = AuditWriter::start(store.clone(), patient(100, 100));
    for n in 1..=3 {
        writer.record(event("decision", n));
    }
    // The drop flushes, tries a few more times, and returns.
    drop(writer);
    assert_eq!(store.load().unwrap().audit_entries, 0);
    // The loss is logged with the store's error as its text, not as Rust's
    // debug form of it.
    let text = logs.text();
    let line = text
        .lines()
        .find(|line| line.contains("they are lost"))
        .unwrap_or_else(|| panic!("no loss logged: {text}"));
    assert!(line.contains("lost=3"), "{line}");
    assert!(line.contains("error=the disk is full: disk full"), "{line}");
    assert!(
        !line.contains("Some(") && !line.contains("Cause("),
        "{line}"
    );
}

#[test]
fn an_unstorable_event_is_recorded_as_such_and_holds_back_no_other() {
    let store = Arc::new(MemoryStore::new());
    let writer = AuditWriter::start(store.clone(), patient(100, 100));
    let big = AuditEvent {
        entry: json!({"blob": "x".repeat(MAX_AUDIT_ENTRY_BYTES)}),
        ..event("decision", 3)
    };
    for event in [
        event("decision", 1),
        event("Bad\nKind", 2),
        big,
        event("decision", 4),
    ] {
        writer.record(event);
    }
    writer.flush().unwrap();
    let entries = store.read_audit(0, 10).unwrap();
    let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["decision", "unstorable", "unstorable", "decision"]);
    assert_eq!(entries[1].entry["kind"], "Bad\\nKind");
    assert!(
        entries[2].entry["error"]
            .as_str()
            .unwrap()
            .starts_with("not storable: audit entry of "),
        "{}",
        entries[2].entry
    );
    assert_eq!(writer.dropped(), 0);
}

// ------------------------------------------------------------ crash safety

/// One change the crash child makes, a pure function of its number and
/// the state before it, so the parent can tell what each "ack" covered.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Pair(String, Vec<String>),
    Grant(String, String),
    Revoke(String, String),
    Unpair(String),
}

/// Device id -> (generation, grants).
type Model = BTreeMap<String, (u64, BTreeSet<String>)>;

const CAPABILITIES: [&str; 3] = ["light", "sound", "door"];

fn change(n: u64, model: &Model) -> Change {
    let device = format!("d{}", n % 5);
    let cap = CAPABILITIES[(n % 3) as usize].to_owned();
    if !model.contains_key(&device) {
        return Change::Pair(device, vec![cap]);
    }
    match (n / 5) % 4 {
        0 => Change::Pair(device, vec![cap, "sound".to_owned()]),
        1 => Change::Grant(device, cap),
        2 => Change::Revoke(device, cap),
        _ => Change::Unpair(device),
    }
}

fn applied(model: &Model, n: u64, change: &Change) -> Model {
    let mut model = model.clone();
    match change {
        Change::Pair(device, grants) => {
            model.insert(device.clone(), (n, grants.iter().cloned().collect()));
        }
        Change::Grant(device, cap) => {
            if let Some((_, grants)) = model.get_mut(device) {
                grants.insert(cap.clone());
            }
        }
        Change::Revoke(device, cap) => {
            if let Some((_, grants)) = model.get_mut(device) {
                grants.remove(cap);
            }
        }
        Change::Unpair(device) => {
            model.remove(device);
        }
    }
    model
}

fn model_of(snapshot: &Snapshot) -> Model {
    snapshot
        .pairings
        .iter()
        .map(|p| {
            (
                p.device_id.clone(),
                (p.generation, p.grants.iter().cloned().collect()),
            )
        })
        .collect()
}

fn commit_change(store: &dyn Store, n: u64, change: &Change) -> Result<(), StoreError> {
    // Each entry as the registry writes it, with the change's number.
    let audit = |event: AuditEvent| {
        let mut entry = event.entry;
        entry["op"] = json!(n);
        AuditEvent {
            at_ms: n,
            entry,
            ..event
        }
    };
    match change {
        Change::Pair(device, grants) => {
            let grants: Vec<&str> = grants.iter().map(String::as_str).collect();
            let stored = pairing(device, &grants, n);
            store.put_pairing(&stored, &audit(paired(&stored, n)))
        }
        Change::Grant(device, cap) => store.set_grant(
            device,
            cap,
            true,
            &audit(grant_change("granted", device, cap, n)),
        ),
        Change::Revoke(device, cap) => store.set_grant(
            device,
            cap,
            false,
            &audit(grant_change("revoked", device, cap, n)),
        ),
        Change::Unpair(device) => store.delete_pairing(device, &audit(unpaired(device, n))),
    }
}

/// The child's side: runs only when the crash test starts this binary
/// with `DK_STORE_CRASH_CHILD=1`; otherwise it passes at once.
#[test]
fn crash_child() {
    if std::env::var("DK_STORE_CRASH_CHILD").as_deref() != Ok("1") {
        return;
    }
    let path = PathBuf::from(std::env::var("DK_STORE_CRASH_DB").unwrap());
    let start: u64 = std::env::var("DK_STORE_CRASH_START")
        .unwrap()
        .parse()
        .unwrap();
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let mut model = model_of(&store.load().unwrap());
    // Decisions go through the writer at the same time, as in a vessel.
    let writer = AuditWriter::start(
        store.clone(),
        WriterOptions {
            max_delay: Duration::from_millis(2),
            ..WriterOptions::default()
        },
    );
    for n in start..start + 100_000 {
        writer.record(AuditEvent {
            at_ms: n,
            kind: "decision".to_owned(),
            entry: json!({ "call": n }),
        });
        let next = change(n, &model);
        commit_change(&*store, n, &next).unwrap();
        model = applied(&model, n, &next);
        println!("ack {n}");
    }
}

#[test]
fn acknowledged_changes_survive_a_kill() {
    let rounds = if std::env::var("DK_SOAK").is_ok() {
        100
    } else {
        5
    };
    let dir = TempDir::new();
    let path = dir.db();
    drop(SqliteStore::open(&path).unwrap());
    let mut model = Model::new();
    let mut start = 1u64;
    let mut rng = rand::rng();
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "tests::crash_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DK_STORE_CRASH_CHILD", "1")
            .env("DK_STORE_CRASH_DB", &path)
            .env("DK_STORE_CRASH_START", start.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (acks, acked) = mpsc::channel::<u64>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut words = line.split_whitespace();
                while let Some(word) = words.next() {
                    if word == "ack"
                        && let Some(n) = words.next().and_then(|n| n.parse().ok())
                    {
                        let _ = acks.send(n);
                    }
                }
            }
        });
        // Kill it at a random moment once it is writing.
        let first = acked.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(first, start);
        std::thread::sleep(Duration::from_millis(rng.random_range(0..60)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        let mut last = first;
        for n in acked.try_iter() {
            assert_eq!(n, last + 1, "acks out of order");
            last = n;
        }

        // Everything acknowledged is there; the change in flight is there
        // whole or not at all.
        let mut expected = model.clone();
        for n in start..=last {
            let next = change(n, &expected);
            expected = applied(&expected, n, &next);
        }
        let in_flight = last + 1;
        let maybe = applied(&expected, in_flight, &change(in_flight, &expected));
        let store = SqliteStore::open(&path).unwrap();
        let snapshot = store.load().unwrap();
        let found = model_of(&snapshot);
        assert!(
            found == expected || found == maybe,
            "round {round}: state after {last} acks is neither before nor after change {in_flight}"
        );
        let report = store.verify_audit().unwrap();
        assert!(report.is_intact(), "round {round}: {:?}", report.problems);
        let mut recorded = BTreeSet::new();
        let mut after = 0;
        loop {
            let page = store.read_audit(after, 1000).unwrap();
            let Some(tail) = page.last() else { break };
            after = tail.seq;
            recorded.extend(page.iter().filter_map(|e| e.entry["op"].as_u64()));
        }
        for n in start..=last {
            assert!(
                recorded.contains(&n),
                "round {round}: change {n} has no audit entry"
            );
        }
        if expected != maybe {
            assert_eq!(
                recorded.contains(&in_flight),
                found == maybe,
                "round {round}: change {in_flight} and its audit entry did not commit together"
            );
        }
        let orphans: i64 = Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM device_grant WHERE device_id NOT IN (SELECT device_id FROM pairing)",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(orphans, 0, "round {round}: grants of an unpaired device");
        println!(
            "round {round}: changes {start} to {last} acknowledged, {in_flight} {}",
            if found == maybe && expected != maybe {
                "committed"
            } else {
                "not committed (or no change)"
            }
        );
        model = found;
        start = in_flight + 1;
    }
}

// ---------------------------------------------------------------- agents

#[test]
fn agents_survive_a_reopen_with_only_the_credential_hash() {
    let dir = TempDir::new();
    let agent = stored_agent("main", &["lamp"], 7);
    {
        let store = SqliteStore::open(&dir.db()).unwrap();
        store
            .put_agent(&agent, &agent_change("added", &agent, 1))
            .unwrap();
    }
    let store = SqliteStore::open(&dir.db()).unwrap();
    assert_eq!(store.load_agents().unwrap(), vec![agent]);
    let record: String = Connection::open(dir.db())
        .unwrap()
        .query_row("SELECT record FROM agent", [], |row| row.get(0))
        .unwrap();
    assert!(record.contains("credentialSha256"), "{record}");
    assert!(!record.contains("dka_"), "{record}");
}

#[test]
fn a_version_1_store_upgrades_keeping_its_pairings() {
    let dir = TempDir::new();
    {
        let store = SqliteStore::open(&dir.db()).unwrap();
        store
            .put_pairing(
                &pairing("d1", &["a"], 1),
                &paired(&pairing("d1", &["a"], 1), 1),
            )
            .unwrap();
    }
    // What a version 1 dk left: no agent, audit_key or rate_hit table, user_version 1.
    {
        let conn = Connection::open(dir.db()).unwrap();
        conn.execute_batch(
            "DROP TABLE agent; DROP TABLE audit_key; DROP TABLE rate_hit;
             ALTER TABLE pairing DROP COLUMN device_key;
             DROP INDEX audit_device_bucket; DROP INDEX audit_agent; DROP INDEX audit_allowed;
             ALTER TABLE audit DROP COLUMN device_id; ALTER TABLE audit DROP COLUMN agent_id;
             ALTER TABLE audit DROP COLUMN allowed;
             DROP TABLE audit_device_span;",
        )
        .unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
    }
    let store = SqliteStore::open(&dir.db()).unwrap();
    assert_eq!(user_version(&dir.db()), i64::from(SCHEMA_VERSION));
    let pairings = store.load().unwrap().pairings;
    assert_eq!(pairings.len(), 1);
    assert_eq!(pairings[0].device_key, None, "a v1 pairing keeps no key");
    assert!(store.load_agents().unwrap().is_empty());
    let main = stored_agent("main", &["*"], 1);
    store
        .put_agent(&main, &agent_change("added", &main, 2))
        .unwrap();
    assert_eq!(store.load_agents().unwrap().len(), 1);
    assert!(store.verify_audit().unwrap().is_intact());
}

#[test]
fn a_damaged_agent_record_is_corrupt_not_a_panic() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    Connection::open(dir.db())
        .unwrap()
        .execute("INSERT INTO agent (name, record) VALUES ('x', '{')", [])
        .unwrap();
    assert!(matches!(store.load_agents(), Err(StoreError::Corrupt(_))));
}

// ------------------------------------------------------ log against state

/// A store holding `d1` paired with `a`, then `b` granted, three
/// decisions, agent `main` added and one more decision (seq 1 to 7), and
/// a second connection to its file with the append-only triggers dropped.
fn state_setup() -> (TempDir, SqliteStore, Connection) {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    let d1 = pairing("d1", &["a"], 1);
    store.put_pairing(&d1, &paired(&d1, 1)).unwrap();
    store
        .set_grant("d1", "b", true, &grant_change("granted", "d1", "b", 2))
        .unwrap();
    let decisions: Vec<AuditEvent> = (3..=5).map(|n| event("decision", n)).collect();
    store.append_audit(&decisions).unwrap();
    let main = stored_agent("main", &["*"], 6);
    store
        .put_agent(&main, &agent_change("added", &main, 6))
        .unwrap();
    store.append_audit(&[event("decision", 7)]).unwrap();
    let attacker = Connection::open(dir.db()).unwrap();
    attacker
        .execute_batch("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")
        .unwrap();
    (dir, store, attacker)
}

/// Runs `attack` (SQL) on [`state_setup`]'s file and checks every problem
/// verification reports.
#[track_caller]
fn check_state(attack: &str, expected: &[&str]) {
    let (_dir, store, attacker) = state_setup();
    let before = store.verify_audit().unwrap();
    assert!(before.is_intact(), "{:?}", before.problems);
    attacker.execute_batch(attack).unwrap();
    let found: Vec<String> = store
        .verify_audit()
        .unwrap()
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(found, expected, "{attack}");
}

#[test]
fn verification_finds_state_the_log_does_not_account_for() {
    let no_pairing = "state: pairing `d1` (generation 1) has no `paired` entry in the log";
    let no_agent = "state: agent `main` has no `agent` entry in the log";
    let no_grant_b = "state: grant `b` on `d1` has no entry in the log";
    // The log emptied, or cut back past changes: its chain is intact, the
    // state is not accounted for.
    check_state("DELETE FROM audit", &[no_pairing, no_agent]);
    check_state("DELETE FROM audit WHERE seq >= 6", &[no_agent]);
    check_state("DELETE FROM audit WHERE seq >= 2", &[no_grant_b, no_agent]);
    // The state tables edited without an entry.
    check_state(
        "INSERT INTO device_grant (device_id, capability) VALUES ('d1', 'c')",
        &["state: grant `c` on `d1` has no entry in the log"],
    );
    check_state(
        "DELETE FROM device_grant WHERE capability = 'a'",
        &["state: the log grants `a` on `d1` (entry 1), the state does not"],
    );
    check_state(
        "UPDATE pairing SET digest = 'sha256:other'",
        &["state: pairing `d1` is not the one its `paired` entry 1 records"],
    );
    check_state(
        "DELETE FROM pairing",
        &["state: the log has `d1` paired (entry 1), the state does not"],
    );
    check_state(
        "UPDATE agent SET record = replace(record, '\"user\"', '\"admin\"')",
        &["state: agent `main` is not the one its last `agent` entry 6 records"],
    );
    check_state(
        "DELETE FROM agent",
        &["state: the log has agent `main` (entry 6), the state does not"],
    );
    // Cutting decisions only leaves everything accounted for: that takes a
    // kept head.
    check_state("DELETE FROM audit WHERE seq = 7", &[]);
}

// ------------------------------------------------------------ kept head

/// A store in `dir` keeping its head beside its data directory.
fn anchored(dir: &TempDir) -> Result<SqliteStore, StoreError> {
    SqliteStore::open_with(
        &dir.db(),
        AuditOptions {
            head_file: audit_head_file(dir.db().parent().unwrap()),
            ..AuditOptions::default()
        },
    )
}

fn kept_head(dir: &TempDir) -> AuditHead {
    let file = audit_head_file(dir.db().parent().unwrap()).unwrap();
    AuditHead::read_from(&file).unwrap().unwrap()
}

#[test]
fn the_head_file_lies_beside_the_data_directory() {
    for (data_dir, expected) in [
        (
            "/home/me/.local/share/dk/vessel",
            Some("/home/me/.local/share/dk/vessel.audit-head"),
        ),
        (".dk/vessel", Some(".dk/vessel.audit-head")),
        ("data", Some("data.audit-head")),
        ("/", None),
    ] {
        assert_eq!(
            audit_head_file(Path::new(data_dir)),
            expected.map(PathBuf::from),
            "{data_dir}"
        );
    }
    for (text, ok) in [
        (format!("7:{}", "ab".repeat(32)), true),
        (format!(" 0:{GENESIS_HASH}\n"), true),
        (format!("7:{}", "AB".repeat(32)), false),
        (format!("7:{}", "ab".repeat(31)), false),
        (format!("x:{}", "ab".repeat(32)), false),
        ("7".to_owned(), false),
    ] {
        assert_eq!(text.parse::<AuditHead>().is_ok(), ok, "{text:?}");
    }
}

#[test]
fn the_head_is_kept_after_every_commit_that_appends() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    let store = anchored(&dir).unwrap();
    // Started at open, from the empty log.
    assert_eq!(
        kept_head(&dir),
        AuditHead {
            seq: 0,
            hash: GENESIS_HASH.to_owned()
        }
    );
    let d1 = pairing("d1", &["a"], 1);
    store.put_pairing(&d1, &paired(&d1, 1)).unwrap();
    // Written in the background: once settled, it is the log's head.
    store.settle_head();
    assert_eq!(kept_head(&dir), store.verify_audit().unwrap().head());
    let writer = AuditWriter::start(Arc::new(store), patient(10, 100));
    for n in 2..=26 {
        writer.record(event("decision", n));
    }
    writer.flush().unwrap();
    // Dropping the store (with the writer) writes its last head.
    drop(writer);
    assert_eq!(kept_head(&dir).seq, 26);
    let file = audit_head_file(dir.db().parent().unwrap()).unwrap();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Nothing left behind beside it.
    let names: Vec<String> = std::fs::read_dir(&dir.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // Reopened on the same log: fine.
    let store = anchored(&dir).unwrap();
    assert_eq!(store.audit_head().unwrap(), kept_head(&dir));
}

/// Rewrites every entry's hash (and the next one's prev_hash) over its
/// stored content, as someone who can write the file and knows the
/// formula would: the chain verifies again.
fn rehash_everything(conn: &Connection) {
    let rows: Vec<(i64, i64, String, String)> = conn
        .prepare("SELECT seq, at_ms, kind, entry FROM audit ORDER BY seq")
        .unwrap()
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut prev = GENESIS_HASH.to_owned();
    for (seq, at, kind, entry) in rows {
        let hash = entry_hash(&prev, seq, at, &kind, &entry);
        conn.execute(
            "UPDATE audit SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
}

#[test]
fn a_log_that_no_longer_matches_its_kept_head_is_refused_at_open() {
    type Attack = fn(&Connection);
    let attacks: [(&str, Attack, &str); 3] = [
        (
            "cut",
            |c| {
                c.execute("DELETE FROM audit WHERE seq > 5", []).unwrap();
            },
            "the log ends at entry 5, the kept head is entry 8",
        ),
        (
            "emptied",
            |c| {
                c.execute("DELETE FROM audit", []).unwrap();
            },
            "the log ends at entry 0, the kept head is entry 8",
        ),
        (
            "rewritten",
            |c| {
                c.execute("UPDATE audit SET entry = '{}' WHERE seq = 3", [])
                    .unwrap();
                rehash_everything(c);
            },
            "entry 8 is not the one kept: the log was rewritten",
        ),
    ];
    for (name, attack, detail) in attacks {
        let dir = TempDir::new();
        let store = anchored(&dir).unwrap();
        let events: Vec<AuditEvent> = (1..=8).map(|n| event("decision", n)).collect();
        store.append_audit(&events).unwrap();
        drop(store);
        let attacker = Connection::open(dir.db()).unwrap();
        attacker
            .execute_batch("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")
            .unwrap();
        attack(&attacker);
        // The chain alone says nothing is wrong.
        let plain = SqliteStore::open(&dir.db()).unwrap();
        assert!(plain.verify_audit().unwrap().is_intact(), "{name}");
        let error = anchored(&dir).unwrap_err();
        let file = audit_head_file(dir.db().parent().unwrap()).unwrap();
        assert_eq!(
            error.to_string(),
            format!(
                "the audit log does not match the head kept in `{}`: {detail}",
                file.display()
            ),
            "{name}"
        );
        // The kept head is left as it was, for `dk audit verify`.
        assert_eq!(kept_head(&dir).seq, 8, "{name}");
        let report = plain.verify_audit_against(&kept_head(&dir)).unwrap();
        assert!(!report.is_intact(), "{name}");
    }
}

#[test]
fn a_planted_head_file_is_refused_and_never_followed() {
    let dir = TempDir::new();
    let file = audit_head_file(dir.db().parent().unwrap()).unwrap();
    let victim = dir.root.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, &file).unwrap();
    let error = anchored(&dir).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "cannot keep the audit head in `{}`: it is not a regular file",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, "not a head").unwrap();
    assert!(matches!(anchored(&dir), Err(StoreError::HeadFile { .. })));
}

// ------------------------------------------------------------ keyed chain

#[test]
fn hmac_sha256_gives_rfc_4231_results() {
    let long_key = [0xaa; 131];
    let cases: [(&[u8], &[u8], &str); 6] = [
        (
            &[0x0b; 20],
            b"Hi There",
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        ),
        (
            b"Jefe",
            b"what do ya want for nothing?",
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        ),
        (
            &[0xaa; 20],
            &[0xdd; 50],
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        ),
        (
            &[
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
                24, 25,
            ],
            &[0xcd; 50],
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
        ),
        (
            &long_key,
            b"Test Using Larger Than Block-Size Key - Hash Key First",
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        ),
        (
            &long_key,
            b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        ),
    ];
    for (key, data, expected) in cases {
        let (head, tail) = data.split_at(data.len() / 2);
        let mac = super::key::hmac_sha256(key, &[head, tail]);
        assert_eq!(dk_files::hex::encode(&mac), expected);
    }
}

#[test]
fn key_files_are_made_private_and_only_private_regular_files_are_used() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    let path = dir.root.join("keys").join("audit.key");
    let key = AuditKey::load_or_create(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 65, "{text:?}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let parent = path.parent().unwrap();
    assert_eq!(
        std::fs::metadata(parent).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(AuditKey::load_or_create(&path).unwrap(), key);
    assert_eq!(AuditKey::load(&path).unwrap(), key);
    assert!(!format!("{key:?}").contains(text.trim()));
    assert_eq!(format!("{key:?}"), format!("AuditKey({})", key.id()));

    let shown = |p: &Path| p.display().to_string();
    let open = dir.root.join("open.key");
    std::fs::write(&open, text.as_bytes()).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let linked = dir.root.join("linked.key");
    std::os::unix::fs::symlink(&path, &linked).unwrap();
    let malformed = dir.root.join("malformed.key");
    std::fs::write(&malformed, "not a key\n").unwrap();
    std::fs::set_permissions(&malformed, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cases = [
        (
            open.clone(),
            AuditKeyError::Mode {
                path: shown(&open),
                mode: 0o644,
            },
        ),
        (
            linked.clone(),
            AuditKeyError::NotRegular {
                path: shown(&linked),
            },
        ),
        (
            parent.to_owned(),
            AuditKeyError::NotRegular {
                path: shown(parent),
            },
        ),
        (
            malformed.clone(),
            AuditKeyError::Malformed {
                path: shown(&malformed),
            },
        ),
    ];
    for (file, expected) in cases {
        assert_eq!(
            AuditKey::load_or_create(&file),
            Err(expected),
            "{}",
            file.display()
        );
    }
    // The link's target is untouched.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

/// A store keyed with `key`, its head kept beside its data directory.
fn keyed(dir: &TempDir, key: &AuditKey) -> Result<SqliteStore, StoreError> {
    SqliteStore::open_with(
        &dir.db(),
        AuditOptions {
            head_file: audit_head_file(dir.db().parent().unwrap()),
            key: Some(key.clone()),
        },
    )
}

/// The problems a report holds, as text.
fn said(report: &VerifyReport) -> Vec<String> {
    report.problems.iter().map(ToString::to_string).collect()
}

#[test]
fn a_keyed_chain_continues_an_unkeyed_log_and_needs_its_key() {
    let dir = TempDir::new();
    let key = AuditKey::generate();
    let other = AuditKey::generate();
    {
        let store = SqliteStore::open(&dir.db()).unwrap();
        store
            .append_audit(&[event("decision", 1), event("decision", 2)])
            .unwrap();
    }
    let store = keyed(&dir, &key).unwrap();
    let d1 = pairing("d1", &["a"], 1);
    store.put_pairing(&d1, &paired(&d1, 4)).unwrap();
    store.append_audit(&[event("decision", 5)]).unwrap();
    let entries = store.read_audit(0, 10).unwrap();
    assert_eq!(entries[2].kind, "audit-keyed");
    assert_eq!(entries[2].entry, json!({"keyId": key.id()}));
    // Entries 1 and 2 keep their plain hashes, 3 on are HMACs.
    assert_eq!(
        entries[1].hash,
        entry_hash(
            &entries[0].hash,
            2,
            entries[1].at_ms as i64,
            "decision",
            &canonical_json(&entries[1].entry)
        )
    );
    assert_ne!(
        entries[3].hash,
        entry_hash(
            &entries[2].hash,
            4,
            entries[3].at_ms as i64,
            "paired",
            &canonical_json(&entries[3].entry)
        )
    );
    let report = store.verify_audit().unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    store.settle_head();
    assert_eq!(kept_head(&dir), report.head());
    drop(store);

    // Opened again: with its key, fine; with another, refused; without one,
    // readable and verifiable only up to the keyed part, never appended to.
    assert!(keyed(&dir, &key).is_ok());
    assert_eq!(
        keyed(&dir, &other).unwrap_err(),
        StoreError::WrongKey {
            chain: key.id(),
            given: other.id()
        }
    );
    let plain = SqliteStore::open(&dir.db()).unwrap();
    assert_eq!(plain.read_audit(0, 10).unwrap().len(), 5);
    assert_eq!(
        plain.load().unwrap_err(),
        StoreError::KeyRequired { from: 3 }
    );
    assert_eq!(
        plain.append_audit(&[event("decision", 6)]).unwrap_err(),
        StoreError::KeyRequired { from: 3 }
    );
    assert_eq!(
        said(&plain.verify_audit().unwrap()),
        [format!(
            "entry 3: key (the chain is keyed from here with key {}: its entries can be checked only with that key)",
            key.id()
        )]
    );
    assert_eq!(
        said(&plain.verify_audit_with(Some(&other), None).unwrap()),
        [format!(
            "entry 3: key (the chain is keyed with key {}, not with the key given ({}))",
            key.id(),
            other.id()
        )]
    );
    assert!(
        plain
            .verify_audit_with(Some(&key), None)
            .unwrap()
            .is_intact()
    );
    // The entry that keys a chain is written only by the store.
    let error = keyed(&dir, &key)
        .unwrap()
        .append_audit(&[event("audit-keyed", 7)])
        .unwrap_err();
    assert!(matches!(error, StoreError::InvalidInput(_)), "{error}");
}

/// A keyed log of 8 entries (1 keys it, 2 pairs `d1`, 3 to 8 decisions),
/// its key, and a connection for an attacker without the key.
fn keyed_setup() -> (TempDir, AuditKey, Connection) {
    let dir = TempDir::new();
    let key = AuditKey::generate();
    let store = keyed(&dir, &key).unwrap();
    let d1 = pairing("d1", &["a"], 1);
    store.put_pairing(&d1, &paired(&d1, 2)).unwrap();
    let decisions: Vec<AuditEvent> = (3..=8).map(|n| event("decision", n)).collect();
    store.append_audit(&decisions).unwrap();
    let attacker = Connection::open(dir.db()).unwrap();
    attacker
        .execute_batch(
            "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;
             DROP TRIGGER audit_key_no_update; DROP TRIGGER audit_key_no_delete;",
        )
        .unwrap();
    (dir, key, attacker)
}

#[test]
fn without_its_key_nobody_writes_an_entry_that_verifies() {
    type Attack = fn(&Connection);
    let attacks: [(&str, Attack, &[&str]); 4] = [
        // Everything rewritten with plain hashes, the keying left in place.
        (
            "rehash",
            |c| {
                c.execute("UPDATE audit SET entry = '{}' WHERE seq = 5", [])
                    .unwrap();
                rehash_everything(c);
            },
            &["entry 1: edited"],
        ),
        // The keying removed too: a plain chain that verifies without the
        // key, and is named with it.
        (
            "unkey",
            |c| {
                c.execute_batch(
                    "DELETE FROM audit WHERE seq = 1; DELETE FROM audit_key;
                     UPDATE audit SET seq = seq - 1;",
                )
                .unwrap();
                rehash_everything(c);
            },
            &["key: a key was given"],
        ),
        // A forged decision appended, chained with a plain hash.
        (
            "append",
            |c| {
                let prev = stored_hash(c, 8);
                forge(c, 9, &prev);
            },
            &["entry 9: edited"],
        ),
        // The record of the key removed: the chain still says it is keyed.
        (
            "record",
            |c| {
                c.execute("DELETE FROM audit_key", []).unwrap();
            },
            &[
                "entry 1: key (the store records the chain as not keyed, the chain is keyed from entry 1",
            ],
        ),
    ];
    for (name, attack, expected) in attacks {
        let (dir, key, attacker) = keyed_setup();
        attack(&attacker);
        let store = SqliteStore::open(&dir.db()).unwrap();
        let found = said(&store.verify_audit_with(Some(&key), None).unwrap());
        assert!(!found.is_empty(), "{name}: nothing found");
        for expected in expected {
            assert!(
                found.iter().any(|p| p.starts_with(expected)),
                "{name}: {expected:?} not in {found:#?}"
            );
        }
    }
}

#[test]
fn a_version_2_store_upgrades_and_its_log_still_verifies() {
    let dir = TempDir::new();
    {
        let store = SqliteStore::open(&dir.db()).unwrap();
        let d1 = pairing("d1", &["a"], 1);
        store.put_pairing(&d1, &paired(&d1, 1)).unwrap();
        store.append_audit(&[event("decision", 2)]).unwrap();
    }
    // What a version 2 dk left: no audit_key or rate_hit table, user_version 2.
    {
        let conn = Connection::open(dir.db()).unwrap();
        conn.execute_batch(
            "DROP TABLE audit_key; DROP TABLE rate_hit; ALTER TABLE pairing DROP COLUMN device_key;
             DROP INDEX audit_device_bucket; DROP INDEX audit_agent; DROP INDEX audit_allowed;
             ALTER TABLE audit DROP COLUMN device_id; ALTER TABLE audit DROP COLUMN agent_id;
             ALTER TABLE audit DROP COLUMN allowed;
             DROP TABLE audit_device_span;",
        )
        .unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
    }
    let store = SqliteStore::open(&dir.db()).unwrap();
    assert_eq!(user_version(&dir.db()), i64::from(SCHEMA_VERSION));
    let report = store.verify_audit().unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    assert_eq!(report.entries, 2);
    // And it can be keyed from there.
    drop(store);
    let key = AuditKey::generate();
    let store = keyed(&dir, &key).unwrap();
    assert_eq!(store.read_audit(2, 10).unwrap()[0].kind, "audit-keyed");
    assert!(store.verify_audit().unwrap().is_intact());
}

#[test]
fn a_key_swapped_in_the_table_does_not_match_the_log() {
    let dir = TempDir::new();
    let mut keyed = pairing("keyed-lamp", &["a"], 1);
    keyed.device_key = Some([7; 32]);
    let mut entry = paired(&keyed, 1);
    entry.entry["deviceKey"] = serde_json::json!(dk_files::hex::encode(&[7; 32]));
    {
        let store = SqliteStore::open(&dir.db()).unwrap();
        store.put_pairing(&keyed, &entry).unwrap();
        assert!(store.verify_audit().unwrap().is_intact());
    }
    Connection::open(dir.db())
        .unwrap()
        .execute_batch("UPDATE pairing SET device_key = zeroblob(32);")
        .unwrap();
    let store = SqliteStore::open(&dir.db()).unwrap();
    let report = store.verify_audit().unwrap();
    assert!(!report.is_intact());
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.detail.contains("keyed-lamp")),
        "{:?}",
        report.problems
    );
}

// ------------------------------------------------------ pages of the log

#[test]
fn filtered_audit_pages_read_through_their_indexes() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    store
        .append_audit(&[decision(1, "lamp", None, true)])
        .unwrap();
    drop(store);
    let conn = Connection::open(dir.db()).unwrap();
    for (filter, index) in [
        ("deviceId", "audit_device_bucket"),
        ("agentId", "audit_agent"),
        ("allowed", "audit_allowed"),
    ] {
        let mut query = AuditQuery::newest(50);
        match filter {
            "deviceId" => query.device_id = Some("lamp".to_owned()),
            "agentId" => query.agent_id = Some("kitchen".to_owned()),
            _ => query.allowed = Some(false),
        }
        let plan = crate::pages_tests::query_plan(&conn, &query);
        assert!(
            plan.iter().any(|step| step.contains(index)),
            "{filter}: {plan:?}"
        );
    }
}

#[test]
fn backup_copies_while_another_connection_writes_and_restore_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live").join("vessel.db");
    let writer = SqliteStore::open(&live).unwrap();
    let lamp = pairing("lamp", &["read"], 1);
    writer.put_pairing(&lamp, &paired(&lamp, 1)).unwrap();
    let reader = SqliteStore::open(&live).unwrap();
    // Another connection keeps appending while the copy is taken.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appending = std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            let mut n = 2;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                writer.append_audit(&[event("call", n)]).unwrap();
                n += 1;
            }
            writer
        }
    });
    // Lets the writer append for a while, so the backup runs beside it.
    std::thread::sleep(Duration::from_millis(50));
    let copy = dir.path().join("copy.db");
    reader.backup_to(&copy, false).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writer = appending.join().unwrap();
    let refused = reader.backup_to(&copy, false).unwrap_err();
    assert!(matches!(refused, StoreError::InvalidInput(_)), "{refused}");

    let copied = SqliteStore::open(&copy).unwrap();
    assert!(copied.verify_audit().unwrap().is_intact());
    let at_backup = copied.audit_head().unwrap();
    assert!(at_backup.seq >= 2, "{at_backup:?}");
    drop(copied);

    // Restored over the live database (its writers gone): the copy's state
    // and log, none of the entries appended since.
    writer.append_audit(&[event("late", 10_000)]).unwrap();
    drop((writer, reader));
    SqliteStore::restore_from(&copy, &live, |store| {
        store
            .verify_audit()
            .map_err(|e| e.to_string())?
            .is_intact()
            .then_some(())
            .ok_or_else(|| "broken".to_owned())
    })
    .unwrap();
    let restored = SqliteStore::open(&live).unwrap();
    assert_eq!(restored.audit_head().unwrap(), at_backup);
    assert_eq!(restored.load().unwrap().pairings.len(), 1);

    // A refused check, and a database of something else, change nothing.
    let refused = SqliteStore::restore_from(&copy, &live, |_| Err("no".to_owned()));
    assert!(matches!(refused, Err(RestoreError::Refused(_))));
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let refused = SqliteStore::restore_from(&other, &live, |_| Ok(())).unwrap_err();
    assert!(refused.to_string().contains("not a dk store"), "{refused}");
    assert_eq!(restored.audit_head().unwrap(), at_backup);
    let leftovers: Vec<_> = std::fs::read_dir(live.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The columns an entry's pages are found by can be edited without
/// touching its text or hash (once the trigger is dropped): verifying
/// finds each such entry, and a log whose columns say what the entries say
/// stays intact.
#[test]
fn an_entry_hidden_from_its_pages_by_its_columns_is_found() {
    let dir = TempDir::new();
    let store = SqliteStore::open(&dir.db()).unwrap();
    store
        .append_audit(&[
            decision(1, "lamp", Some("kitchen"), true),
            decision(2, "lock", None, false),
            decision(3, "lamp", None, true),
        ])
        .unwrap();
    assert!(store.verify_audit().unwrap().is_intact());
    drop(store);
    Connection::open(dir.db())
        .unwrap()
        .execute_batch(
            "DROP TRIGGER audit_no_update;
             UPDATE audit SET device_id = 'elsewhere' WHERE seq = 1;
             UPDATE audit SET allowed = 1 WHERE seq = 2;",
        )
        .unwrap();
    let store = SqliteStore::open(&dir.db()).unwrap();
    let mut lamp = AuditQuery::newest(10);
    lamp.device_id = Some("lamp".to_owned());
    assert_eq!(
        store.query_audit(&lamp).unwrap().len(),
        1,
        "hidden from its page"
    );
    let report = store.verify_audit().unwrap();
    let found: Vec<(u64, ProblemKind)> = report
        .problems
        .iter()
        .filter(|p| p.detail.contains("columns"))
        .map(|p| (p.seq, p.what))
        .collect();
    assert_eq!(found, [(1, ProblemKind::Edited), (2, ProblemKind::Edited)]);
}
