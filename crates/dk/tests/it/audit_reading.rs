//! The commands that only read a store (`dk audit verify`, `dk audit
//! tail`, `dk backup`) on stores they may not write: an SQLite file and its
//! directory read-only to the user running them, a PostgreSQL role that may
//! only `SELECT`; each store of an older schema, which they read as it is
//! and never migrate. And `dk audit verify --store` on a PostgreSQL log ten
//! times larger than another, in the same memory.
//!
//! Tests running as root run the commands as `nobody`, whom file modes
//! bind. Without PostgreSQL the PostgreSQL tests say so and pass, unless
//! `DK_REQUIRE_PEERS` is set.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use dk_store::{AuditEvent, PgStore, Store};
use dk_testkit::postgres::PgServer;
use serde_json::json;

use crate::process::{Scratch, succeeded};

/// The user `nobody` (uid and gid), whom the commands run as when the tests
/// run as root.
const NOBODY: u32 = 65_534;

fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `dk ARGS` as a user who cannot write what `chmod` made read-only:
/// `nobody` when the tests run as root, else the tests' user.
fn dk_reading(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dk"));
    command.args(args).env_remove("DK_HOME").current_dir("/");
    if running_as_root() {
        command.uid(NOBODY).gid(NOBODY);
    }
    command.stdin(Stdio::null()).output().unwrap()
}

/// Sets `path`'s mode.
fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Gives the directories back their modes when dropped (a failed
/// assertion included), so the scratch directory can be removed.
struct Writable(Vec<PathBuf>);

impl Drop for Writable {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
    }
}

fn user_version(db: &Path) -> i64 {
    rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

#[test]
fn read_only_commands_read_an_sqlite_store_they_cannot_write_and_change_nothing() {
    // A log `dk vessel` wrote at schema 6, keyed, with its head kept beside
    // the data directory (`fixtures/audit/schema-1`).
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/audit/schema-1");
    let scratch = Scratch::new("read-only");
    let root = scratch.root().to_owned();
    let dir = root.join("vessel");
    std::fs::create_dir(&dir).unwrap();
    let db = dir.join("vessel.db");
    std::fs::copy(fixture.join("vessel.db"), &db).unwrap();
    let head = dir.with_extension("audit-head");
    std::fs::copy(fixture.join("vessel.audit-head"), &head).unwrap();
    let key = root.join("audit.key");
    std::fs::copy(fixture.join("audit.key"), &key).unwrap();
    chmod(&key, 0o600);
    if running_as_root() {
        // The key is its reader's own, as the key check asks.
        rustix::fs::chown(
            &key,
            Some(rustix::process::Uid::from_raw(NOBODY)),
            Some(rustix::process::Gid::from_raw(NOBODY)),
        )
        .unwrap();
    }
    // Where the backup may be written.
    let out = root.join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    // Everything else read-only, to anyone.
    chmod(&db, 0o444);
    chmod(&head, 0o444);
    chmod(&dir, 0o555);
    chmod(&root, 0o755);
    let _writable = Writable(vec![dir.clone(), root.clone()]);
    let before = std::fs::read(&db).unwrap();
    assert_eq!(user_version(&db), 6);

    let (dir_arg, key_arg) = (dir.to_str().unwrap(), key.to_str().unwrap());
    let verify = dk_reading(&[
        "audit",
        "verify",
        "--data-dir",
        dir_arg,
        "--audit-key-file",
        key_arg,
    ]);
    let said = succeeded(&verify);
    assert!(said.contains("intact: 29 entries"), "{said}");
    let tail = succeeded(&dk_reading(&[
        "audit",
        "tail",
        "--data-dir",
        dir_arg,
        "-n",
        "5",
        "--json",
    ]));
    assert_eq!(tail.lines().count(), 5, "{tail}");
    let backup = out.join("copy.db");
    let backed_up = succeeded(&dk_reading(&[
        "backup",
        backup.to_str().unwrap(),
        "--data-dir",
        dir_arg,
        "--audit-key-file",
        key_arg,
    ]));
    assert!(backed_up.contains("intact: 29 entries"), "{backed_up}");

    // Not a byte of the store changed, and the copy keeps its schema too.
    assert_eq!(std::fs::read(&db).unwrap(), before);
    assert_eq!(user_version(&db), 6);
    assert_eq!(user_version(&backup), 6);
}

/// `psql` of the server's programs, as its superuser, on `url`.
fn psql(url: &str, sql: &str) -> String {
    let bin = dk_testkit::postgres::programs().unwrap();
    let out = Command::new(bin.join("psql"))
        .args([
            url,
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    succeeded(&out)
}

/// The URL of `url`'s database for the role `role`.
fn as_role(url: &str, role: &str) -> String {
    url.replacen(
        &format!("{}@", dk_testkit::postgres::USER),
        &format!("{role}@"),
        1,
    )
}

#[test]
fn read_only_commands_read_a_postgres_store_as_a_role_that_may_only_select_and_migrate_nothing() {
    let test = "read_only_commands_read_a_postgres_store_as_a_role_that_may_only_select_and_migrate_nothing";
    let Some(pg) = PgServer::shared(test) else {
        return;
    };
    let url = pg.database();
    {
        let store = PgStore::connect(&url).unwrap();
        let events: Vec<AuditEvent> = (1..=50)
            .map(|n| AuditEvent {
                at_ms: 1_780_000_000_000 + n,
                kind: "decision".to_owned(),
                entry: json!({"n": n}),
            })
            .collect();
        store.append_audit(&events).unwrap();
    }
    // The store as an older dk left it (schema 2, before the agents'
    // buckets), and a role that may only read it.
    let role = format!("reader_{}", std::process::id());
    psql(
        &url,
        &format!(
            "DROP TABLE agent_bucket; UPDATE dk_schema SET version = 2;
             CREATE ROLE {role} LOGIN;
             GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};"
        ),
    );
    let reader = as_role(&url, &role);
    let scratch = Scratch::new("read-only-pg");
    let verified = succeeded(&scratch.run(&["audit", "verify", "--store", &reader]));
    assert!(verified.contains("intact: 50 entries"), "{verified}");
    let tail = succeeded(&scratch.run(&["audit", "tail", "--store", &reader, "-n", "3"]));
    assert_eq!(tail.lines().count(), 3, "{tail}");
    // As the owner too, the commands leave the schema as it was.
    succeeded(&scratch.run(&["audit", "verify", "--store", &url]));
    assert_eq!(psql(&url, "SELECT version FROM dk_schema").trim(), "2");
    assert_eq!(
        psql(&url, "SELECT to_regclass('agent_bucket') IS NULL").trim(),
        "t"
    );
    // A database with no store is refused, and left empty.
    let empty = pg.database();
    let refused = scratch.run(&["audit", "verify", "--store", &empty]);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("holds no dk store"), "{said}");
    assert_eq!(
        psql(
            &empty,
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'"
        )
        .trim(),
        "0"
    );
}

/// Appends `count` decisions to the log at `url`, chained as dk chains
/// them (docs/STORAGE.md: `hex(sha256(prev_hash "\n" seq "\n" at_ms "\n"
/// kind "\n" entry))`), in one statement on the server.
fn append_in_sql(url: &str, count: u64) {
    psql(
        url,
        &format!(
            "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash)
             WITH RECURSIVE head AS (
                 SELECT coalesce(max(seq), 0) AS seq,
                        coalesce((SELECT hash FROM audit ORDER BY seq DESC LIMIT 1),
                                 repeat('0', 64)) AS hash
                 FROM audit),
             chain (seq, at_ms, entry, prev_hash, hash) AS (
                 SELECT n.seq, n.at_ms, n.entry, head.hash,
                        encode(sha256(convert_to(head.hash || E'\\n' || n.seq || E'\\n' || n.at_ms
                            || E'\\n' || 'decision' || E'\\n' || n.entry, 'UTF8')), 'hex')
                 FROM head, LATERAL (SELECT head.seq + 1 AS seq,
                        1780000000000 + head.seq + 1 AS at_ms,
                        '{{\"deviceId\":\"lamp-' || ((head.seq + 1) % 1000) || '\",\"n\":'
                            || (head.seq + 1) || '}}' AS entry) AS n
                 UNION ALL
                 SELECT n.seq, n.at_ms, n.entry, c.hash,
                        encode(sha256(convert_to(c.hash || E'\\n' || n.seq || E'\\n' || n.at_ms
                            || E'\\n' || 'decision' || E'\\n' || n.entry, 'UTF8')), 'hex')
                 FROM chain c, LATERAL (SELECT c.seq + 1 AS seq,
                        1780000000000 + c.seq + 1 AS at_ms,
                        '{{\"deviceId\":\"lamp-' || ((c.seq + 1) % 1000) || '\",\"n\":'
                            || (c.seq + 1) || '}}' AS entry) AS n
                 WHERE c.seq < (SELECT seq FROM head) + {count})
             SELECT seq, at_ms, 'decision', entry, prev_hash, hash FROM chain"
        ),
    );
}

/// Runs `dk audit verify --store URL` to its end: what it printed, and its
/// peak memory in KiB (`VmHWM`, read from `/proc` until it exits).
fn verify_with_peak(scratch: &Scratch, url: &str) -> (String, u64) {
    let mut child = scratch
        .dk(&[
            "audit",
            "verify",
            "--store",
            url,
            "--no-kept-head",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    // Its peak memory, read until it ends.
    dk_testkit::eventually_blocking_within(
        "dk audit verify ending",
        dk_testkit::PATIENCE * 3,
        || {
            if let Some(kib) = std::fs::read_to_string(&status).ok().and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("VmHWM:"))
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            }) {
                peak = u64::max(peak, kib);
            }
            child.try_wait().unwrap().is_some()
        },
    );
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut said).unwrap();
    (said, peak)
}

#[test]
fn a_large_postgres_log_is_verified_a_page_at_a_time_in_the_same_memory() {
    let test = "a_large_postgres_log_is_verified_a_page_at_a_time_in_the_same_memory";
    let Some(pg) = PgServer::shared(test) else {
        return;
    };
    let url = pg.database();
    drop(PgStore::connect(&url).unwrap());
    let scratch = Scratch::new("verify-large");
    append_in_sql(&url, 20_000);
    let (small, small_peak) = verify_with_peak(&scratch, &url);
    assert!(small.contains("\"intact\":true"), "{small}");
    assert!(small.contains("\"entries\":20000"), "{small}");
    append_in_sql(&url, 180_000);
    let (large, large_peak) = verify_with_peak(&scratch, &url);
    assert!(large.contains("\"intact\":true"), "{large}");
    assert!(large.contains("\"entries\":200000"), "{large}");
    // Ten times the entries, the same memory (a page's worth more at most;
    // keeping the whole log would take over 100 MiB more).
    assert!(
        large_peak <= small_peak + 24 * 1024,
        "{small_peak} KiB for 20,000 entries, {large_peak} KiB for 200,000"
    );
    // An entry edited deep in the large log is found, and named.
    psql(
        &url,
        "ALTER TABLE audit DISABLE TRIGGER USER;
         UPDATE audit SET entry = '{\"n\":1}' WHERE seq = 150000;",
    );
    let out = scratch.run(&["audit", "verify", "--store", &url, "--no-kept-head"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("entry 150000: edited"), "{said}");
}
