//! SQLite's schema: the migrations, in order, the columns the audit log is
//! read by (filled from each entry), and how a file is brought to
//! [`SCHEMA_VERSION`].

use rusqlite::{Connection, TransactionBehavior};

use super::errors::db;
use crate::{AuditProblem, ProblemKind, StoreError};

/// The schema version this build writes: the number of migration steps.
pub const SCHEMA_VERSION: u32 = 8;

/// `PRAGMA application_id` of a dk store ("dkst").
pub(crate) const APPLICATION_ID: i32 = 0x646b_7374;

/// The migration steps, in order: step `i` takes the schema from version
/// `i` to `i + 1`. Steps are only ever added, never changed.
pub(crate) const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    // 1: pairings, grants, secret hashes, counters, the audit log.
    "CREATE TABLE pairing (
         device_id     TEXT    NOT NULL PRIMARY KEY,
         manifest_json TEXT    NOT NULL,
         digest        TEXT    NOT NULL,
         token_hash    BLOB    NOT NULL,
         generation    INTEGER NOT NULL,
         paired_at_ms  INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE device_grant (
         device_id  TEXT NOT NULL REFERENCES pairing (device_id) ON DELETE CASCADE,
         capability TEXT NOT NULL,
         PRIMARY KEY (device_id, capability)
     ) STRICT, WITHOUT ROWID;
     CREATE TABLE secret (
         name TEXT NOT NULL PRIMARY KEY,
         hash BLOB NOT NULL
     ) STRICT;
     CREATE TABLE counter (
         name  TEXT    NOT NULL PRIMARY KEY,
         value INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE audit (
         seq       INTEGER NOT NULL PRIMARY KEY,
         at_ms     INTEGER NOT NULL,
         kind      TEXT    NOT NULL,
         entry     TEXT    NOT NULL,
         prev_hash TEXT    NOT NULL,
         hash      TEXT    NOT NULL
     ) STRICT;
     CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
         BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
     CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
         BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;",
    // 2: agents, each as the JSON of its stored record (credential hash only).
    "CREATE TABLE agent (
         name   TEXT NOT NULL PRIMARY KEY,
         record TEXT NOT NULL
     ) STRICT;",
    // 3: the key of a keyed audit chain: the entry that keyed it and the
    // key's id (never the key). A dk without this step refuses the file.
    "CREATE TABLE audit_key (
         seq    INTEGER NOT NULL PRIMARY KEY,
         key_id TEXT    NOT NULL
     ) STRICT;
     CREATE TRIGGER audit_key_no_update BEFORE UPDATE ON audit_key
         BEGIN SELECT RAISE(ABORT, 'the audit key record is append-only'); END;
     CREATE TRIGGER audit_key_no_delete BEFORE DELETE ON audit_key
         BEGIN SELECT RAISE(ABORT, 'the audit key record is append-only'); END;",
    // 4: the calls rules with a `limit` counted, until their window passes.
    "CREATE TABLE rate_hit (
         id        INTEGER NOT NULL PRIMARY KEY,
         rule      TEXT    NOT NULL,
         agent     TEXT    NOT NULL,
         at_ms     INTEGER NOT NULL,
         calls     INTEGER NOT NULL,
         window_ms INTEGER NOT NULL,
         until_ms  INTEGER NOT NULL
     ) STRICT;
     CREATE INDEX rate_hit_pair ON rate_hit (rule, agent, at_ms);
     CREATE INDEX rate_hit_until ON rate_hit (until_ms);",
    // 5: the static key a device paired over dk/2 with, pinned as its
    // credential (NULL for a v1 pairing).
    "ALTER TABLE pairing ADD COLUMN device_key BLOB;",
    // 6: the audit log read by what its entries name, newest first (the
    // console's filtered pages). An entry that is not JSON (only a damaged
    // file holds one) is indexed as naming nothing, so opening it still
    // works and `verify` reports it.
    "CREATE INDEX audit_device ON audit
         ((CASE WHEN json_valid(entry) THEN json_extract(entry, '$.deviceId') END), seq);
     CREATE INDEX audit_agent ON audit
         ((CASE WHEN json_valid(entry) THEN json_extract(entry, '$.agentId') END), seq);
     CREATE INDEX audit_allowed ON audit
         ((CASE WHEN json_valid(entry) THEN json_extract(entry, '$.allowed') END), seq)
         WHERE kind = 'decision';",
    // 7: the device index in buckets of 1,024 entries (`seq >> 10` first),
    // so that an append touches the few pages of the newest bucket instead
    // of one page per device named, and the spans of 65,536 entries (`seq
    // >> 16`) each device appears in, so that a device's page skips the
    // spans it is absent from. `append` adds the spans of what it appends.
    "DROP INDEX audit_device;
     CREATE INDEX audit_device_bucket ON audit
         ((seq >> 10), (CASE WHEN json_valid(entry) THEN json_extract(entry, '$.deviceId') END), seq);
     CREATE TABLE audit_device_span (
         device_id TEXT    NOT NULL,
         span      INTEGER NOT NULL,
         PRIMARY KEY (device_id, span)
     ) STRICT, WITHOUT ROWID;
     INSERT OR IGNORE INTO audit_device_span (device_id, span)
         SELECT json_extract(entry, '$.deviceId'), seq >> 16 FROM audit
         WHERE json_valid(entry) AND json_type(entry, '$.deviceId') = 'text';",
    // 8: the fields the log is read by kept in columns of their own, which
    // `append` writes from the entry it holds, instead of indexes on
    // expressions that made SQLite parse every entry appended three times
    // over. Entries already stored get them from their text: a string
    // `deviceId` or `agentId`, a boolean `allowed`, else NULL (so damaged
    // JSON still names nothing). The log stays append-only: the trigger is
    // set aside for the one backfill, in the migration's transaction.
    "DROP INDEX audit_device_bucket;
     DROP INDEX audit_agent;
     DROP INDEX audit_allowed;
     ALTER TABLE audit ADD COLUMN device_id TEXT;
     ALTER TABLE audit ADD COLUMN agent_id TEXT;
     ALTER TABLE audit ADD COLUMN allowed INTEGER;
     DROP TRIGGER audit_no_update;
     UPDATE audit SET
         device_id = (CASE WHEN json_valid(entry) AND json_type(entry, '$.deviceId') = 'text' THEN json_extract(entry, '$.deviceId') END),
         agent_id = (CASE WHEN json_valid(entry) AND json_type(entry, '$.agentId') = 'text' THEN json_extract(entry, '$.agentId') END),
         allowed = (CASE WHEN json_valid(entry) AND json_type(entry, '$.allowed') IN ('true', 'false') THEN json_extract(entry, '$.allowed') END);
     CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
         BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
     CREATE INDEX audit_device_bucket ON audit ((seq >> 10), device_id, seq);
     CREATE INDEX audit_agent ON audit (agent_id, seq);
     CREATE INDEX audit_allowed ON audit (allowed, seq) WHERE kind = 'decision';",
];

/// What migration 8 fills the column of the field `name` with, for an entry
/// already stored: the field when it is a string (or, for `allowed`, a
/// boolean), else NULL. `append` writes the same from the entry it holds;
/// verifying checks every entry's columns against it, and the tests check
/// the migration's text against it.
pub(crate) fn column_from_entry(name: &str) -> String {
    let types = if name == crate::entry::fields::ALLOWED {
        "IN ('true', 'false')"
    } else {
        "= 'text'"
    };
    format!(
        "(CASE WHEN json_valid(entry) AND json_type(entry, '$.{name}') {types} THEN json_extract(entry, '$.{name}') END)"
    )
}

/// The entries whose columns (schema 8) do not say what their text says:
/// the columns were edited, so the console's filtered pages would hide the
/// entry or show it where it does not belong, while its text and hash are
/// untouched.
pub(super) fn misindexed(tx: &Connection) -> Result<Vec<AuditProblem>, StoreError> {
    use crate::entry::fields::{AGENT_ID, ALLOWED, DEVICE_ID};
    let differs: Vec<String> = [DEVICE_ID, AGENT_ID, ALLOWED]
        .map(|field| format!("{} IS NOT {}", column_of(field), column_from_entry(field)))
        .into();
    let mut select = tx
        .prepare(&format!(
            "SELECT seq FROM audit WHERE {} ORDER BY seq",
            differs.join(" OR ")
        ))
        .map_err(db)?;
    let seqs = select
        .query_map([], |row| row.get::<_, i64>(0))
        .map_err(db)?;
    let mut problems = Vec::new();
    for seq in seqs {
        problems.push(AuditProblem {
            seq: u64::try_from(seq.map_err(db)?).unwrap_or(0),
            what: ProblemKind::Edited,
            detail: "its device, agent or decision columns do not match its text: the log's filtered pages would hide or misplace it".to_owned(),
        });
    }
    Ok(problems)
}

/// The column migration 8 keeps the entry's field `name` in.
pub(crate) fn column_of(name: &str) -> &'static str {
    use crate::entry::fields;
    match name {
        fields::DEVICE_ID => "device_id",
        fields::AGENT_ID => "agent_id",
        _ => "allowed",
    }
}

/// The schema version of the dk store `conn` holds (0 for an empty file),
/// refusing a newer one and a database of something else.
pub(super) fn schema_of(conn: &Connection, shown: &str) -> Result<u32, StoreError> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(db)?;
    let application: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(db)?;
    let found = u32::try_from(version)
        .map_err(|_| StoreError::Corrupt(format!("`{shown}` has schema version {version}")))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let theirs = if found == 0 {
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
            .map_err(db)?;
        tables > 0 || application != 0
    } else {
        application != i64::from(APPLICATION_ID)
    };
    if theirs {
        return Err(StoreError::Corrupt(format!(
            "`{shown}` is a database of something else, not a dk store"
        )));
    }
    Ok(found)
}

pub(super) fn migrate(conn: &mut Connection, shown: &str) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db)?;
    let found = schema_of(&tx, shown)?;
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    for step in MIGRATIONS.iter().skip(found as usize) {
        tx.execute_batch(step).map_err(db)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(db)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(db)?;
    tx.commit().map_err(db)
}
