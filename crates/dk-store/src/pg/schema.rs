//! PostgreSQL's schema: the migrations, in order, and how a store brings
//! a database to [`PG_SCHEMA_VERSION`] under an advisory lock.

use deadpool_postgres::Pool;

use super::errors::{db, get, unreachable};
use crate::StoreError;

/// The schema version this build writes: the number of migration steps.
pub const PG_SCHEMA_VERSION: u32 = 3;

/// The advisory lock migrations run under ("dkst").
pub(super) const MIGRATION_LOCK: i64 = 0x646b_7374;

/// The migration steps, in order: step `i` takes the schema from version
/// `i` to `i + 1`. Steps are only ever added, never changed.
pub(super) const MIGRATIONS: [&str; PG_SCHEMA_VERSION as usize] = [
    // 1: everything SQLite's first five steps made.
    "CREATE TABLE pairing (
         device_id     TEXT   NOT NULL PRIMARY KEY,
         manifest_json TEXT   NOT NULL,
         digest        TEXT   NOT NULL,
         token_hash    BYTEA  NOT NULL,
         generation    BIGINT NOT NULL,
         paired_at_ms  BIGINT NOT NULL,
         device_key    BYTEA
     );
     CREATE TABLE device_grant (
         device_id  TEXT NOT NULL REFERENCES pairing (device_id) ON DELETE CASCADE,
         capability TEXT NOT NULL,
         PRIMARY KEY (device_id, capability)
     );
     CREATE TABLE secret (
         name TEXT  NOT NULL PRIMARY KEY,
         hash BYTEA NOT NULL
     );
     CREATE TABLE counter (
         name  TEXT   NOT NULL PRIMARY KEY,
         value BIGINT NOT NULL
     );
     CREATE TABLE audit (
         seq       BIGINT NOT NULL PRIMARY KEY,
         at_ms     BIGINT NOT NULL,
         kind      TEXT   NOT NULL,
         entry     TEXT   NOT NULL,
         prev_hash TEXT   NOT NULL,
         hash      TEXT   NOT NULL
     );
     CREATE TABLE audit_writer (
         one BOOLEAN NOT NULL PRIMARY KEY DEFAULT TRUE CHECK (one)
     );
     INSERT INTO audit_writer (one) VALUES (TRUE);
     CREATE TABLE audit_key (
         seq    BIGINT NOT NULL PRIMARY KEY,
         key_id TEXT   NOT NULL
     );
     CREATE FUNCTION dk_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$;
     CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit
         FOR EACH ROW EXECUTE FUNCTION dk_append_only();
     CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
         FOR EACH STATEMENT EXECUTE FUNCTION dk_append_only();
     CREATE TRIGGER audit_key_no_change BEFORE UPDATE OR DELETE ON audit_key
         FOR EACH ROW EXECUTE FUNCTION dk_append_only();
     CREATE TRIGGER audit_key_no_truncate BEFORE TRUNCATE ON audit_key
         FOR EACH STATEMENT EXECUTE FUNCTION dk_append_only();
     CREATE TABLE agent (
         name   TEXT NOT NULL PRIMARY KEY,
         record TEXT NOT NULL
     );
     CREATE TABLE rate_hit (
         id        BIGSERIAL NOT NULL PRIMARY KEY,
         rule      TEXT      NOT NULL,
         agent     TEXT      NOT NULL,
         at_ms     BIGINT    NOT NULL,
         calls     BIGINT    NOT NULL,
         window_ms BIGINT    NOT NULL,
         until_ms  BIGINT    NOT NULL
     );
     CREATE INDEX rate_hit_pair ON rate_hit (rule, agent, at_ms);
     CREATE INDEX rate_hit_until ON rate_hit (until_ms);",
    // 2: the audit log read by what its entries name, newest first (SQLite's
    // step 6).
    "CREATE INDEX audit_device ON audit (
         (CASE WHEN jsonb_typeof(entry::jsonb -> 'deviceId') = 'string'
               THEN entry::jsonb ->> 'deviceId' END), seq);
     CREATE INDEX audit_agent ON audit (
         (CASE WHEN jsonb_typeof(entry::jsonb -> 'agentId') = 'string'
               THEN entry::jsonb ->> 'agentId' END), seq);
     CREATE INDEX audit_allowed ON audit (
         (CASE WHEN jsonb_typeof(entry::jsonb -> 'allowed') = 'boolean'
               THEN (entry::jsonb ->> 'allowed')::boolean END), seq)
         WHERE kind = 'decision';",
    // 3: agents' call-rate buckets, shared by a fleet's vessels: the time
    // each is full again (milliseconds times its calls a minute, as text).
    "CREATE TABLE agent_bucket (
         key     TEXT NOT NULL PRIMARY KEY,
         full_at TEXT NOT NULL
     );",
];

/// The expression migration 2 indexes a text field `name` by.
pub(super) fn indexed_text(name: &str) -> String {
    format!(
        "(CASE WHEN jsonb_typeof(entry::jsonb -> '{name}') = 'string' \
         THEN entry::jsonb ->> '{name}' END)"
    )
}

/// Brings the schema up to date, one step per transaction, under the
/// migration lock.
pub(super) async fn migrate(pool: Pool) -> Result<(), StoreError> {
    let mut client = pool.get().await.map_err(unreachable)?;
    loop {
        let tx = client.transaction().await.map_err(db)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db)?;
        let known: bool = get(
            &tx.query_one("SELECT to_regclass('dk_schema') IS NOT NULL", &[])
                .await
                .map_err(db)?,
            0,
        )?;
        let version: i32 = if known {
            get(
                &tx.query_one("SELECT version FROM dk_schema", &[])
                    .await
                    .map_err(db)?,
                0,
            )?
        } else {
            let tables: i64 = get(
                &tx.query_one(
                    "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema()",
                    &[],
                )
                .await
                .map_err(db)?,
                0,
            )?;
            if tables > 0 {
                return Err(StoreError::Corrupt(
                    "the database holds tables of something else, not a dk store".to_owned(),
                ));
            }
            tx.batch_execute(
                "CREATE TABLE dk_schema (version INTEGER NOT NULL);
                 INSERT INTO dk_schema (version) VALUES (0);",
            )
            .await
            .map_err(db)?;
            0
        };
        let found = u32::try_from(version)
            .map_err(|_| StoreError::Corrupt(format!("the schema version is {version}")))?;
        if found > PG_SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                found,
                supported: PG_SCHEMA_VERSION,
            });
        }
        let Some(step) = MIGRATIONS.get(found as usize) else {
            return tx.commit().await.map_err(db);
        };
        tx.batch_execute(step).await.map_err(db)?;
        tx.execute("UPDATE dk_schema SET version = $1", &[&(version + 1)])
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
    }
}

/// The schema version the database records; `None` when it records none
/// (it holds no dk store).
pub(super) async fn schema_version(pool: Pool) -> Result<Option<u32>, StoreError> {
    let client = pool.get().await.map_err(unreachable)?;
    let known: bool = get(
        &client
            .query_one("SELECT to_regclass('dk_schema') IS NOT NULL", &[])
            .await
            .map_err(db)?,
        0,
    )?;
    if !known {
        return Ok(None);
    }
    let row = client
        .query_opt("SELECT version FROM dk_schema", &[])
        .await
        .map_err(db)?;
    let Some(row) = row else { return Ok(None) };
    let version: i32 = get(&row, 0)?;
    u32::try_from(version)
        .map(Some)
        .map_err(|_| StoreError::Corrupt(format!("the schema version is {version}")))
}
