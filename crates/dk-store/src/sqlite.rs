//! The SQLite store: one database file in the vessel's data directory, WAL
//! mode with `synchronous=FULL` so a returned write is on disk, foreign keys
//! on, and the schema brought up to date by ordered migration steps counted
//! in `PRAGMA user_version`.
//!
//! Files are private to the user: the database file is created with mode
//! 0600 before SQLite opens it (so the umask does not matter), and SQLite
//! creates the `-wal` and `-shm` files with the permissions of the database
//! file. The directory, when created here, gets mode 0700.
//!
//! Opened with [`AuditOptions::head_file`], the store keeps the audit
//! chain's head in that file (see `anchor.rs`) after every commit that
//! appends, and refuses to open a log that no longer reaches the head kept
//! there or holds another entry at its place. Opened with
//! [`AuditOptions::key`], it keys the chain (see `key.rs`): an
//! `audit-keyed` entry, itself under the key, is appended once and recorded
//! in the `audit_key` table, and every later entry's hash is an HMAC. A
//! keyed log opened without its key can be read and verified as far as the
//! key allows, never appended to.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};

use super::audit::{Hashing, Logged, QuickCheck, RawRow, Verifier, log_appended, to_i64};
use super::crosscheck::{Replay, append_as_texts, refuse_reserved_kinds};
use super::keeper::HeadKeeper;
use super::key::AuditKey;
use super::{
    AuditEntry, AuditEvent, AuditHead, AuditQuery, AuditText, Cause, RateHit, Snapshot, Store,
    StoreError, StoredPairing, VerifyReport,
};
use crate::{DiskReserve, ReserveError, StoredAgent};

mod errors;
mod log;
mod rows;
mod schema;

use errors::{db, hash32, unsigned};
pub(crate) use log::*;
use rows::*;
pub use schema::SCHEMA_VERSION;
pub(crate) use schema::*;

/// How long a write waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema versions that added what a read-only store reads only when
/// the file has it: agents (2), the chain's key (3), devices' keys (5),
/// the log's columns (8).
const AGENT_SCHEMA: u32 = 2;
const KEY_SCHEMA: u32 = 3;
const DEVICE_KEY_SCHEMA: u32 = 5;
const COLUMNS_SCHEMA: u32 = 8;

/// A [`Store`] in an SQLite database file. One connection, used by one
/// caller at a time: [`Store::verify_audit`] holds it while it reads the
/// whole log, so a command that verifies should open its own store. Other
/// processes (such as `dk audit tail`) may open the same file; each write
/// reads the chain's head inside its transaction, so they cannot fork it.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Keeps the head in the head file, when there is one.
    head: Option<HeadKeeper>,
    /// The chain's key, when given.
    key: Option<AuditKey>,
    /// Where the chain turned keyed and the key's id, as recorded at open.
    keyed: Option<(i64, String)>,
    /// The schema version of the file: this build's, unless it was opened
    /// read-only ([`SqliteStore::open_read_only`]), which migrates nothing.
    schema: u32,
    /// The space kept in reserve against a full disk, when it keeps one.
    reserve: Option<DiskReserve>,
}

/// How a [`SqliteStore`] keeps its audit chain beyond the database file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditOptions {
    /// A file outside the data directory to keep the chain's head in
    /// (`SEQ:HASH`), rewritten in the background after every commit that
    /// appends (see [`SqliteStore::settle_head`]), and checked when the
    /// store opens: a log that no longer reaches the kept head, or
    /// has another entry in its place, is refused with
    /// [`StoreError::HeadMismatch`]. `dk vessel` keeps it beside its data
    /// directory ([`audit_head_file`](super::audit_head_file)).
    pub head_file: Option<PathBuf>,
    /// The key of a keyed chain, kept outside the data directory. An
    /// unkeyed log is keyed from its next entry on; a log keyed with another
    /// key is refused with [`StoreError::WrongKey`].
    pub key: Option<AuditKey>,
}

impl SqliteStore {
    /// Opens the store at `path`, creating the file (mode 0600) and its
    /// directory (mode 0700) if needed, and migrates the schema. A database
    /// from a newer dk is refused with [`StoreError::NewerSchema`], a file
    /// that is not a dk store with [`StoreError::Corrupt`]. No head is kept:
    /// a store of tests, or of a tool that writes (a tool that only reads
    /// opens it with [`SqliteStore::open_read_only`]).
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, AuditOptions::default())
    }

    /// Opens the existing store at `path` to read it only, as `dk audit
    /// tail`, `dk audit verify` and `dk backup` do: nothing is created,
    /// migrated, keyed or written, not even the file's mode, so a store the
    /// caller may not write (a read-only file, directory or mount) opens,
    /// and one a running vessel writes is read as of each read's
    /// transaction. A store of an older schema is read as it is; one from a
    /// newer dk is [`StoreError::NewerSchema`], a file that is not a dk
    /// store [`StoreError::Corrupt`]. Every write through it fails.
    ///
    /// A store in WAL mode needs its `-shm` file, which SQLite makes beside
    /// it when the directory can be written; when it cannot and no vessel
    /// has the store open (there is no `-wal` file to read), the file is
    /// read as immutable instead.
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        let shown = path.display().to_string();
        let open_error = |reason: Cause| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        if !path.is_file() {
            return Err(open_error(Cause::msg("there is no database file there")));
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .and_then(|conn| {
                // Opening is lazy: the first read finds out whether the
                // WAL index can be had.
                conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?;
                Ok(conn)
            })
            .or_else(|error| {
                let wal = PathBuf::from(format!("{}-wal", path.display()));
                if error.sqlite_error_code() == Some(ErrorCode::CannotOpen) && !wal.exists() {
                    immutable(path, flags)
                } else {
                    Err(error)
                }
            })
            .map_err(|error| open_error(Cause::new(error)))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(db)?;
        conn.pragma_update(None, "query_only", "ON").map_err(db)?;
        conn.pragma_update(None, "trusted_schema", "OFF")
            .map_err(db)?;
        let schema = schema_of(&conn, &shown)?;
        if schema == 0 {
            return Err(StoreError::Corrupt(format!("`{shown}` holds no dk store")));
        }
        let keyed = if schema >= KEY_SCHEMA {
            recorded_key(&conn)?
        } else {
            None
        };
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            head: None,
            key: None,
            keyed,
            schema,
            reserve: None,
        })
    }

    /// [`SqliteStore::open`], keeping the audit chain as `audit` says. With
    /// a head file, the log must still reach the head kept there, with the
    /// same entry in its place, or [`StoreError::HeadMismatch`]; a missing
    /// head file is started from the log's head, and one that cannot be
    /// written is [`StoreError::HeadFile`].
    pub fn open_with(path: &Path, audit: AuditOptions) -> Result<SqliteStore, StoreError> {
        let shown = path.display().to_string();
        let open_error = |reason: Cause| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        create_private(path).map_err(|error| open_error(Cause::new(error)))?;
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| open_error(Cause::new(error)))?;
        configure(&conn).map_err(|error| match error {
            StoreError::Corrupt(reason) => {
                StoreError::Corrupt(format!("`{shown}` is not a dk store: {reason}"))
            }
            other => other,
        })?;
        migrate(&mut conn, &shown)?;
        let recorded = recorded_key(&conn)?;
        if let (Some((_, chain)), Some(key)) = (&recorded, &audit.key)
            && *chain != key.id()
        {
            return Err(StoreError::WrongKey {
                chain: chain.clone(),
                given: key.id(),
            });
        }
        if let Some(file) = &audit.head_file {
            check_kept_head(&conn, file)?;
        }
        let keyed = match (recorded, &audit.key) {
            (None, Some(key)) => {
                let (seq, head) = key_the_chain(&mut conn, key)?;
                if let Some(file) = &audit.head_file {
                    head.write_to(file).map_err(|error| StoreError::HeadFile {
                        path: file.display().to_string(),
                        reason: Cause::new(error),
                    })?;
                }
                Some((seq, key.id()))
            }
            (recorded, _) => recorded,
        };
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            head: audit.head_file.map(HeadKeeper::start),
            key: audit.key,
            keyed,
            schema: SCHEMA_VERSION,
            reserve: None,
        })
    }

    /// Keeps `reserve` against a full disk (made by the caller, as `dk
    /// vessel` does before it opens the store): released when a write
    /// fails because the disk is full, made again once there is room
    /// ([`Store::release_reserve`], [`Store::restore_reserve`]).
    pub fn with_reserve(mut self, reserve: DiskReserve) -> SqliteStore {
        self.reserve = Some(reserve);
        self
    }

    /// How new entries are hashed: under the key once the chain is keyed,
    /// which then must be at hand.
    fn hashing(&self) -> Result<Hashing<'_>, StoreError> {
        match (&self.keyed, &self.key) {
            (None, _) => Ok(Hashing::Plain),
            (Some(_), Some(key)) => Ok(Hashing::Keyed(key)),
            (Some((from, _)), None) => Err(StoreError::KeyRequired {
                from: u64::try_from(*from).unwrap_or(0),
            }),
        }
    }

    /// Recomputes the chain, checking keyed entries under `key` (when it is
    /// the chain's), replays the log against the state, and with `head`
    /// (kept before the log was read) checks that its entry is still there
    /// unchanged. This is [`Store::verify_audit`] with the store's own key,
    /// and what `dk audit verify` runs with the key file it is given.
    pub fn verify_audit_with(
        &self,
        key: Option<&AuditKey>,
        head: Option<&AuditHead>,
    ) -> Result<VerifyReport, StoreError> {
        let schema = self.schema;
        let mut report = {
            let mut conn = self.conn();
            // One read transaction: the log and the state as of one moment.
            // The log is read once, keeping nothing of an entry past the
            // next; a second time only when it is not whole, to say where.
            let tx = conn.transaction().map_err(db)?;
            let each_row = |take: &mut dyn FnMut(RawRow)| -> Result<(), StoreError> {
                let mut select = tx
                    .prepare(
                        "SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit ORDER BY seq",
                    )
                    .map_err(db)?;
                let rows = select.query_map([], raw_row).map_err(db)?;
                for row in rows {
                    take(row.map_err(db)?);
                }
                Ok(())
            };
            let mut quick = QuickCheck::new(key);
            let mut replay = Replay::default();
            each_row(&mut |row| {
                replay.push(&row);
                quick.push(&row);
            })?;
            let recorded = if schema >= KEY_SCHEMA {
                recorded_key(&tx)?
            } else {
                None
            };
            let mut report = match quick.finish(Some(recorded.clone())) {
                Some(report) => report,
                None => {
                    let mut verifier = Verifier::new(key);
                    each_row(&mut |row| verifier.push(row))?;
                    verifier.recorded_key(recorded);
                    verifier.finish()
                }
            };
            let misindexed = if schema >= COLUMNS_SCHEMA {
                misindexed(&tx)?
            } else {
                Vec::new()
            };
            let pairings = read_pairings(&tx, schema >= DEVICE_KEY_SCHEMA)?;
            let agents = if schema >= AGENT_SCHEMA {
                read_agents(&tx)?
            } else {
                Vec::new()
            };
            tx.commit().map_err(db)?;
            report.problems.extend(misindexed);
            report.problems.extend(replay.compare(&pairings, &agents));
            report
        };
        if let Some(head) = head {
            super::check_head(self, &mut report, head)?;
        }
        Ok(report)
    }

    /// The file the audit head is kept in, if the store keeps one.
    pub fn head_file(&self) -> Option<&Path> {
        self.head.as_ref().map(HeadKeeper::file)
    }

    /// Waits until the head file holds the head of every commit made so far
    /// (it is written in the background, and always once the store is
    /// dropped).
    pub fn settle_head(&self) {
        if let Some(head) = &self.head {
            head.settle();
        }
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock drops the open transaction, which
        // rolls it back: the connection is still sound.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `change` in an immediate (write) transaction and commits it.
    fn write<T>(
        &self,
        change: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let value = change(&tx)?;
        tx.commit().map_err(db)?;
        Ok(value)
    }

    /// Like [`SqliteStore::write`] for a change that appends `events` to
    /// the audit log: once it is committed, the new head is handed to the
    /// head keeper, still under the connection's lock so heads go in commit
    /// order, and each entry is logged.
    fn write_audited<E: Logged>(
        &self,
        events: &[E],
        change: impl FnOnce(&Transaction<'_>) -> Result<Option<AuditHead>, StoreError>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let head = change(&tx)?;
        tx.commit().map_err(db)?;
        let Some(head) = head else {
            return Ok(());
        };
        let count = u64::try_from(events.len()).unwrap_or(u64::MAX);
        let first = head.seq.saturating_sub(count).saturating_add(1);
        if let Some(keeper) = &self.head {
            keeper.keep(head);
        }
        drop(conn);
        log_appended(first, events);
        Ok(())
    }
}

/// Creates the directory (0700) and the database file (0600) if missing,
/// and takes group and other permissions off an existing file.
fn create_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty())
            && !dir.exists()
        {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let mode = file.metadata()?.permissions().mode();
        if mode & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(mode & 0o700))?;
        }
    }
    #[cfg(not(unix))]
    {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
    }
    Ok(())
}

/// `path` opened as an immutable file (no lock, no WAL index): for a store
/// nobody writes, in a directory the reader cannot write.
fn immutable(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    let mut uri = String::from("file:");
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'?' | b'#' | b'%' => uri.push_str(&format!("%{byte:02X}")),
            _ => uri.push(char::from(*byte)),
        }
    }
    uri.push_str("?immutable=1");
    let conn = Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)?;
    conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?;
    Ok(conn)
}

fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db)?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(db)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Database(Cause::msg(format!(
            "journal mode is `{mode}`, WAL could not be set"
        ))));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(db)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(db)?;
    conn.pragma_update(None, "trusted_schema", "OFF")
        .map_err(db)?;
    Ok(())
}

impl Store for SqliteStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        // A vessel starts from this: not on a keyed log it could not append to.
        self.hashing()?;
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(db)?;
        let pairings = read_pairings(&tx, self.schema >= DEVICE_KEY_SCHEMA)?;
        let counted: Option<i64> = tx
            .query_row(
                "SELECT value FROM counter WHERE name = 'max_generation'",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(db)?;
        let counted = unsigned(counted.unwrap_or(0), "the largest generation")?;
        let max_generation = pairings
            .iter()
            .map(|p| p.generation)
            .fold(counted, u64::max);
        let (seq, audit_head) = audit_head(&tx)?;
        tx.commit().map_err(db)?;
        Ok(Snapshot {
            pairings,
            max_generation,
            audit_entries: unsigned(seq, "the last audit seq")?,
            audit_head,
        })
    }

    fn put_pairing(&self, pairing: &StoredPairing, audit: &AuditEvent) -> Result<(), StoreError> {
        let generation = to_i64(pairing.generation, "generation")?;
        let paired_at = to_i64(pairing.paired_at_ms, "pairing time")?;
        let hashing = self.hashing()?;
        self.write_audited(std::slice::from_ref(audit), |tx| {
            tx.prepare_cached("DELETE FROM device_grant WHERE device_id = ?1")
                .map_err(db)?
                .execute([&pairing.device_id])
                .map_err(db)?;
            tx.prepare_cached(
                "INSERT INTO pairing (device_id, manifest_json, digest, token_hash, generation,
                                      paired_at_ms, device_key)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (device_id) DO UPDATE SET
                     manifest_json = excluded.manifest_json, digest = excluded.digest,
                     token_hash = excluded.token_hash, generation = excluded.generation,
                     paired_at_ms = excluded.paired_at_ms, device_key = excluded.device_key",
            )
            .map_err(db)?
            .execute(params![
                pairing.device_id,
                pairing.manifest_json,
                pairing.digest,
                &pairing.token_hash[..],
                generation,
                paired_at,
                pairing.device_key.as_ref().map(|key| &key[..])
            ])
            .map_err(db)?;
            let mut grant = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO device_grant (device_id, capability) VALUES (?1, ?2)",
                )
                .map_err(db)?;
            for capability in &pairing.grants {
                grant
                    .execute([&pairing.device_id, capability])
                    .map_err(db)?;
            }
            tx.prepare_cached(
                "INSERT INTO counter (name, value) VALUES ('max_generation', ?1)
                 ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
            )
            .map_err(db)?
            .execute([generation])
            .map_err(db)?;
            append(tx, std::slice::from_ref(audit), hashing)
        })
    }

    fn set_grant(
        &self,
        device_id: &str,
        capability: &str,
        granted: bool,
        audit: &AuditEvent,
    ) -> Result<(), StoreError> {
        let hashing = self.hashing()?;
        self.write_audited(std::slice::from_ref(audit), |tx| {
            let paired = tx
                .prepare_cached("SELECT 1 FROM pairing WHERE device_id = ?1")
                .map_err(db)?
                .exists([device_id])
                .map_err(db)?;
            if !paired {
                return Err(StoreError::UnknownDevice(device_id.to_owned()));
            }
            let sql = if granted {
                "INSERT OR IGNORE INTO device_grant (device_id, capability) VALUES (?1, ?2)"
            } else {
                "DELETE FROM device_grant WHERE device_id = ?1 AND capability = ?2"
            };
            tx.prepare_cached(sql)
                .map_err(db)?
                .execute([device_id, capability])
                .map_err(db)?;
            append(tx, std::slice::from_ref(audit), hashing)
        })
    }

    fn delete_pairing(&self, device_id: &str, audit: &AuditEvent) -> Result<(), StoreError> {
        let hashing = self.hashing()?;
        self.write_audited(std::slice::from_ref(audit), |tx| {
            tx.prepare_cached("DELETE FROM device_grant WHERE device_id = ?1")
                .map_err(db)?
                .execute([device_id])
                .map_err(db)?;
            let removed = tx
                .prepare_cached("DELETE FROM pairing WHERE device_id = ?1")
                .map_err(db)?
                .execute([device_id])
                .map_err(db)?;
            if removed == 0 {
                return Err(StoreError::UnknownDevice(device_id.to_owned()));
            }
            append(tx, std::slice::from_ref(audit), hashing)
        })
    }

    fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        read_agents(&self.conn())
    }

    fn put_agent(&self, agent: &StoredAgent, audit: &AuditEvent) -> Result<(), StoreError> {
        to_i64(agent.added_at_ms, "agent added time")?;
        let record = serde_json::to_string(agent)
            .map_err(|error| StoreError::InvalidInput(error.to_string()))?;
        let hashing = self.hashing()?;
        self.write_audited(std::slice::from_ref(audit), |tx| {
            tx.prepare_cached(
                "INSERT INTO agent (name, record) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET record = excluded.record",
            )
            .map_err(db)?
            .execute(params![agent.id, record])
            .map_err(db)?;
            append(tx, std::slice::from_ref(audit), hashing)
        })
    }

    fn delete_agent(&self, name: &str, audit: &AuditEvent) -> Result<(), StoreError> {
        let hashing = self.hashing()?;
        self.write_audited(std::slice::from_ref(audit), |tx| {
            let removed = tx
                .prepare_cached("DELETE FROM agent WHERE name = ?1")
                .map_err(db)?
                .execute([name])
                .map_err(db)?;
            if removed == 0 {
                return Err(StoreError::UnknownAgent(name.to_owned()));
            }
            append(tx, std::slice::from_ref(audit), hashing)
        })
    }

    fn append_audit(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        append_as_texts(self, events)
    }

    fn append_audit_texts(&self, texts: &[AuditText]) -> Result<(), StoreError> {
        if texts.is_empty() {
            return Ok(());
        }
        refuse_reserved_kinds(texts.iter().map(AuditText::kind))?;
        let hashing = self.hashing()?;
        self.write_audited(texts, |tx| append_texts(tx, texts, hashing))
    }

    fn read_audit(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let conn = self.conn();
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut select = conn
            .prepare_cached(
                "SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit
                 WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )
            .map_err(db)?;
        let rows = select.query_map([after, limit], raw_row).map_err(db)?;
        let mut entries = Vec::new();
        for row in rows {
            entries.push(row.map_err(db)?.to_entry()?);
        }
        Ok(entries)
    }

    fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        use rusqlite::types::Value as Sql;
        let (sql, mut values) = audit_query_sql(query);
        let conn = self.conn();
        let mut select = conn.prepare_cached(&sql).map_err(db)?;
        let mut entries = Vec::new();
        let Some(device) = &query.device_id else {
            let rows = select
                .query_map(rusqlite::params_from_iter(values), raw_row)
                .map_err(db)?;
            for row in rows {
                entries.push(row.map_err(db)?.to_entry()?);
            }
            return Ok(entries);
        };
        // A device's entries, bucket by bucket from the newest, until the
        // page is full: each bucket is one seek in the device index.
        let before = query
            .before_seq
            .map_or(i64::MAX, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
        for bucket in device_buckets(&conn, device, before)? {
            let wanted = query.limit.saturating_sub(entries.len());
            if wanted == 0 {
                break;
            }
            if let Some(first) = values.first_mut() {
                *first = Sql::Integer(bucket);
            }
            if let Some(limit) = values.last_mut() {
                *limit = Sql::Integer(i64::try_from(wanted).unwrap_or(i64::MAX));
            }
            let rows = select
                .query_map(rusqlite::params_from_iter(values.iter()), raw_row)
                .map_err(db)?;
            for row in rows {
                entries.push(row.map_err(db)?.to_entry()?);
            }
        }
        Ok(entries)
    }

    fn audit_head(&self) -> Result<AuditHead, StoreError> {
        let (seq, hash) = audit_head(&self.conn())?;
        Ok(AuditHead {
            seq: unsigned(seq, "the last audit seq")?,
            hash,
        })
    }

    fn verify_audit(&self) -> Result<VerifyReport, StoreError> {
        self.verify_audit_with(self.key.as_ref(), None)
    }

    fn verify_audit_against(&self, expected: &AuditHead) -> Result<VerifyReport, StoreError> {
        self.verify_audit_with(self.key.as_ref(), Some(expected))
    }

    fn put_secret_hash(&self, name: &str, hash: [u8; 32]) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO secret (name, hash) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET hash = excluded.hash",
            )
            .map_err(db)?
            .execute(params![name, &hash[..]])
            .map_err(db)?;
            Ok(())
        })
    }

    fn secret_hash(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError> {
        let conn = self.conn();
        let bytes: Option<Vec<u8>> = conn
            .prepare_cached("SELECT hash FROM secret WHERE name = ?1")
            .map_err(db)?
            .query_row([name], |row| row.get(0))
            .optional()
            .map_err(db)?;
        bytes
            .map(|bytes| hash32(bytes, || format!("the hash of secret `{name}`")))
            .transpose()
    }

    fn disk_full(&self, error: &StoreError) -> bool {
        // SQLite names a full disk when the database or its log cannot
        // grow; one met elsewhere (its shared-memory index) reads as an I/O
        // error, told apart by the space left.
        matches!(error, StoreError::DiskFull(_))
            || self.reserve.as_ref().is_some_and(DiskReserve::low)
    }

    fn release_reserve(&self) -> bool {
        let Some(reserve) = &self.reserve else {
            return false;
        };
        let released = reserve.release();
        if released {
            tracing::error!(
                file = %reserve.file().display(),
                "the disk is full: its reserve is released, so that the decisions already made are committed; no call reaches a device until there are {}",
                reserve.wanted()
            );
        }
        released
    }

    fn restore_reserve(&self) -> bool {
        let Some(reserve) = &self.reserve else {
            return true;
        };
        match reserve.make() {
            Ok(()) => true,
            Err(ReserveError::NoRoom { .. }) => false,
            Err(error) => {
                tracing::warn!(%error, "the disk reserve is not made again");
                false
            }
        }
    }

    fn probe_write(&self, at_ms: u64) -> Result<(), StoreError> {
        let at = to_i64(at_ms, "probe time")?;
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO counter (name, value) VALUES ('write_probe', ?1)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            )
            .map_err(db)?
            .execute([at])
            .map_err(db)?;
            Ok(())
        })
    }

    fn put_rate_hit(&self, hit: &RateHit) -> Result<(), StoreError> {
        let at = to_i64(hit.at_ms, "rate hit time")?;
        let until = to_i64(hit.until_ms(), "rate hit time")?;
        let window = to_i64(hit.window_ms, "rate hit window")?;
        self.write(|tx| {
            tx.prepare_cached("DELETE FROM rate_hit WHERE until_ms <= ?1")
                .map_err(db)?
                .execute([at])
                .map_err(db)?;
            tx.prepare_cached(
                "INSERT INTO rate_hit (rule, agent, at_ms, calls, window_ms, until_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(db)?
            .execute(params![hit.rule, hit.agent, at, hit.calls, window, until])
            .map_err(db)?;
            tx.prepare_cached(
                "DELETE FROM rate_hit WHERE rule = ?1 AND agent = ?2 AND id NOT IN (
                     SELECT id FROM rate_hit WHERE rule = ?1 AND agent = ?2
                     ORDER BY at_ms DESC, id DESC LIMIT ?3)",
            )
            .map_err(db)?
            .execute(params![hit.rule, hit.agent, hit.calls])
            .map_err(db)?;
            Ok(())
        })
    }

    fn load_rate_hits(&self, now_ms: u64) -> Result<Vec<RateHit>, StoreError> {
        let now = to_i64(now_ms, "the time")?;
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(
                "SELECT rule, agent, at_ms, calls, window_ms FROM rate_hit
                 WHERE until_ms > ?1 ORDER BY at_ms, id",
            )
            .map_err(db)?;
        let rows = statement
            .query_map([now], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, u32>(3)?,
                    row.get::<_, i64>(4)?,
                ))
            })
            .map_err(db)?;
        let mut hits = Vec::new();
        for row in rows {
            let (rule, agent, at_ms, calls, window_ms) = row.map_err(db)?;
            let (Ok(at_ms), Ok(window_ms)) = (u64::try_from(at_ms), u64::try_from(window_ms))
            else {
                return Err(StoreError::Corrupt(format!(
                    "rate hit of rule `{rule}` has a negative time or window"
                )));
            };
            hits.push(RateHit {
                rule,
                agent,
                at_ms,
                calls,
                window_ms,
            });
        }
        Ok(hits)
    }
}
