//! The PostgreSQL store: the same tables, audit chain and answers as the
//! SQLite store, in a database several vessels share.
//!
//! The driver is tokio-postgres with a deadpool-postgres pool: the
//! rust-postgres project's own maintained async driver, and a small,
//! maintained pool that reconnects by itself when the server comes back.
//!
//! A thread of the store's own owns a current-thread tokio runtime and the
//! pool, and each operation is sent to it as a task. A synchronous
//! [`Store`] method's caller waits for the answer on a std channel, at most
//! the store's timeout (and the task gives up at that timeout too),
//! blocking its thread: it is called from plain threads and blocking ones,
//! never on an async runtime's worker. What a call path asks (the
//! `*_async` faces: a pairing read again, a `limit` rule's count, a fleet's
//! rate) is answered on a oneshot channel the caller awaits, holding no
//! thread, and may stop awaiting at any time. A server that is down is an
//! error within the timeout, never a panic or a hang.
//!
//! [`PgStore::connect_read_only`] opens read-only sessions and migrates
//! nothing; a verification reads the log a page at a time in one read-only
//! transaction held by a task on the store's thread, each page within the
//! timeout.
//!
//! The schema is brought up to date by ordered migration steps, each in a
//! transaction of its own that records the new version in `dk_schema`;
//! the steps run under a transaction-level advisory lock, so two vessels
//! starting at once against an empty database do not both migrate. A
//! database with a newer version is refused with
//! [`StoreError::NewerSchema`].
//!
//! Every transaction that appends to the audit log first locks the one row
//! of `audit_writer` (`SELECT ... FOR UPDATE`), then reads the chain's head
//! and whether it is keyed: appends from every store on the database are
//! serialized there, so the chain stays one, whatever the number of
//! vessels. The URL's password is never shown: errors name the server as
//! `postgres://user@host:port/database`.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls};

use super::audit::to_i64;
use super::audit::{QuickCheck, RawRow, Verifier, log_appended, texts_of};
use super::crosscheck::{Replay, append_as_texts, refuse_reserved_kinds};
use super::key::AuditKey;
use super::{
    AuditEntry, AuditEvent, AuditHead, AuditQuery, AuditText, BucketTake, Cause, RateClaim,
    RateHit, Snapshot, Store, StoreError, StoreFuture, StoredAgent, StoredPairing, VerifyReport,
};

mod chain;
mod errors;
mod pages;
mod queries;
mod schema;
mod thread;

use chain::*;
use errors::*;
use pages::*;
use queries::*;
pub use schema::PG_SCHEMA_VERSION;
use schema::*;
use thread::{Job, drive};

/// How a [`PgStore`] connects and keeps its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// How long connecting, and each operation, may take before it fails.
    pub timeout: Duration,
    /// The most connections the store holds to the server.
    pub connections: usize,
    /// The key of a keyed chain, as `AuditOptions::key` is for SQLite: an
    /// unkeyed log is keyed from its next entry on, a log
    /// keyed with another key is refused with [`StoreError::WrongKey`].
    pub key: Option<AuditKey>,
}

impl Default for PgOptions {
    fn default() -> PgOptions {
        PgOptions {
            timeout: Duration::from_secs(10),
            connections: 8,
            key: None,
        }
    }
}

/// Whether a store may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadWrite,
    ReadOnly,
}

/// A [`Store`] in a PostgreSQL database, which several stores (several
/// vessels) may share: see the module's documentation.
pub struct PgStore {
    /// The server and database, without the password.
    shown: String,
    jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
    thread: Option<JoinHandle<()>>,
    timeout: Duration,
    key: Option<AuditKey>,
    /// About how many bytes of entries a verification reads at a time.
    page_bytes: usize,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("server", &self.shown)
            .field("timeout", &self.timeout)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// `postgres://user@host:port/database`: the server named without the
/// password.
fn shown(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .map(|user| format!("{user}@"))
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{host}:{port}/{database}")
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`,
    /// or the `key=value` form) with [`PgOptions::default`], and migrates
    /// its schema: see [`PgStore::connect_with`].
    pub fn connect(url: &str) -> Result<PgStore, StoreError> {
        PgStore::connect_with(url, PgOptions::default())
    }

    /// Connects to the database at `url` and migrates its schema. A server
    /// that cannot be reached within `options.timeout` is
    /// [`StoreError::Open`] naming it without its password; a database of
    /// something else is [`StoreError::Corrupt`], one from a newer dk
    /// [`StoreError::NewerSchema`], one keyed with another key
    /// [`StoreError::WrongKey`].
    pub fn connect_with(url: &str, options: PgOptions) -> Result<PgStore, StoreError> {
        let mut store = PgStore::start(url, &options, Access::ReadWrite)?;
        store.key = options.key;
        let open_error = |reason: Cause| StoreError::Open {
            path: store.shown.clone(),
            reason,
        };
        store.run(migrate).map_err(|error| match error {
            StoreError::Database(reason) => open_error(reason),
            other => other,
        })?;
        let recorded = store.run(|pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            recorded_key(&client).await
        })?;
        match (recorded, &store.key) {
            (Some((_, chain)), Some(key)) if chain != key.id() => Err(StoreError::WrongKey {
                chain,
                given: key.id(),
            }),
            (None, Some(key)) => {
                let key = key.clone();
                let first = store.run(move |pool| async move { key_the_chain(pool, key).await })?;
                if let Some((first, event)) = first {
                    log_appended(first, std::slice::from_ref(&event));
                }
                Ok(store)
            }
            _ => Ok(store),
        }
    }

    /// Connects to the existing store in the database at `url` to read it
    /// only, as `dk audit tail` and `dk audit verify --store` do: every
    /// session is read-only (`default_transaction_read_only`), so nothing
    /// is migrated, keyed or written, and a role that may only read the
    /// tables can. A store of an older schema is read as it is (every
    /// version has what is read), one from a newer dk is
    /// [`StoreError::NewerSchema`], a database without a dk store
    /// [`StoreError::Open`]. `options.key` is not used: give the key to
    /// [`PgStore::verify_audit_with`].
    pub fn connect_read_only(url: &str, options: PgOptions) -> Result<PgStore, StoreError> {
        let store = PgStore::start(url, &options, Access::ReadOnly)?;
        let found = store.run(schema_version).map_err(|error| match error {
            StoreError::Database(reason) => StoreError::Open {
                path: store.shown.clone(),
                reason,
            },
            other => other,
        })?;
        match found {
            None | Some(0) => Err(StoreError::Open {
                path: store.shown.clone(),
                reason: Cause::msg("the database holds no dk store"),
            }),
            Some(found) if found > PG_SCHEMA_VERSION => Err(StoreError::NewerSchema {
                found,
                supported: PG_SCHEMA_VERSION,
            }),
            Some(_) => Ok(store),
        }
    }

    /// The pool and the store's thread for `url`, nothing asked of the
    /// server yet; no key.
    fn start(url: &str, options: &PgOptions, access: Access) -> Result<PgStore, StoreError> {
        let mut config = tokio_postgres::Config::from_str(url).map_err(|_| StoreError::Open {
            path: "the PostgreSQL URL".to_owned(),
            reason: Cause::msg("it is not a PostgreSQL connection URL"),
        })?;
        let shown = shown(&config);
        config.connect_timeout(options.timeout);
        config.application_name("dk");
        if access == Access::ReadOnly {
            config.options("-c default_transaction_read_only=on");
        }
        let open_error = |reason: Cause| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.timeout))
            .create_timeout(Some(options.timeout))
            .recycle_timeout(Some(options.timeout))
            .build()
            .map_err(|error| open_error(Cause::new(PgError::new("the pool", error))))?;
        let (jobs, thread) = drive(pool).map_err(|error| open_error(Cause::new(error)))?;
        Ok(PgStore {
            shown,
            jobs: Some(jobs),
            thread: Some(thread),
            timeout: options.timeout,
            key: None,
            page_bytes: PAGE_BYTES,
        })
    }

    /// The server and database, as errors name them (no password).
    pub fn server(&self) -> &str {
        &self.shown
    }

    /// Sends `op` to the store's thread, where it runs as a task of its own
    /// for at most the store's timeout; `answer` is given its result.
    fn submit<T, F, Fut>(
        &self,
        op: F,
        answer: impl FnOnce(Result<T, StoreError>) + Send + 'static,
    ) -> Result<(), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Pool) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let timeout = self.timeout;
        let job: Job = Box::new(move |pool| {
            Box::pin(async move {
                let result = match tokio::time::timeout(timeout, op(pool)).await {
                    Ok(result) => result,
                    Err(_) => Err(unanswered(timeout)),
                };
                answer(result);
            })
        });
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        jobs.send(job).map_err(|_| stopped())
    }

    /// Runs `op` on the store's thread and waits for its answer, at most
    /// the store's timeout, blocking the caller's thread meanwhile.
    fn run<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Pool) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answer, answered) = std_mpsc::sync_channel(1);
        // The caller may have given up waiting: nothing to tell.
        self.submit(op, move |result| {
            let _ = answer.send(result);
        })?;
        // A little longer than the task's own timeout, which answers first.
        match answered.recv_timeout(self.timeout.saturating_add(Duration::from_secs(1))) {
            Ok(result) => result,
            Err(std_mpsc::RecvTimeoutError::Timeout) => Err(unanswered(self.timeout)),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(stopped()),
        }
    }

    /// Runs `op` on the store's thread; its answer is awaited without
    /// holding the awaiting thread (see [`StoreFuture`]).
    fn run_async<T, F, Fut>(&self, op: F) -> StoreFuture<T>
    where
        T: Send + 'static,
        F: FnOnce(Pool) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let sent = self.submit(op, move |result| {
            // The caller may have given up waiting: nothing to tell.
            let _ = answer.send(result);
        });
        Box::pin(async move {
            sent?;
            answered.await.unwrap_or_else(|_| Err(stopped()))
        })
    }

    /// Runs `change` in a transaction that holds the chain (see the module's
    /// documentation), then appends `events` to the log hashed as the chain
    /// asks, and commits. Logs the entries once committed.
    fn write_audited<F>(&self, events: Vec<AuditText>, change: F) -> Result<(), StoreError>
    where
        F: for<'t> FnOnce(
                &'t deadpool_postgres::Transaction<'t>,
            )
                -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 't>>
            + Send
            + 'static,
    {
        let key = self.key.clone();
        let (first, events) = self.run(move |pool| async move {
            let mut client = pool.get().await.map_err(unreachable)?;
            let tx = client.transaction().await.map_err(db)?;
            let (recorded, head) = take_chain(&tx).await?;
            let hashing = hashing(recorded.as_ref(), key.as_ref())?;
            change(&tx).await?;
            let first = append(&tx, &events, hashing, head).await?;
            tx.commit().await.map_err(db)?;
            Ok((first, events))
        })?;
        if let Some(first) = first {
            log_appended(first, &events);
        }
        Ok(())
    }

    /// Runs `change` in a transaction and commits it.
    fn write<F>(&self, change: F) -> Result<(), StoreError>
    where
        F: for<'t> FnOnce(
                &'t deadpool_postgres::Transaction<'t>,
            )
                -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 't>>
            + Send
            + 'static,
    {
        self.run(move |pool| async move {
            let mut client = pool.get().await.map_err(unreachable)?;
            let tx = client.transaction().await.map_err(db)?;
            change(&tx).await?;
            tx.commit().await.map_err(db)
        })
    }

    /// Recomputes the chain, checking keyed entries under `key` (when it is
    /// the chain's), replays the log against the state, and with `head`
    /// checks that its entry is still there unchanged: what `dk audit
    /// verify` runs with the key file it is given. The log and the state
    /// are read as of one moment (one read-only transaction), the log a
    /// page at a time (about 4 MiB of entries), each page within the
    /// store's timeout, whatever the log's size. A whole log is read once
    /// and verified in the same memory at any size; a log that is not whole
    /// is read a second time, keeping about 160 bytes of each entry, to say
    /// what is wrong and where.
    pub fn verify_audit_with(
        &self,
        key: Option<&AuditKey>,
        head: Option<&AuditHead>,
    ) -> Result<VerifyReport, StoreError> {
        let pages = read_pages(self.jobs.as_ref(), self.timeout, self.page_bytes)?;
        let (recorded, pairings, agents) = pages.state()?;
        let mut quick = QuickCheck::new(key);
        let mut replay = Replay::default();
        pages.each(&mut |row| {
            replay.push(&row);
            quick.push(&row);
        })?;
        let mut report = match quick.finish(Some(recorded.clone())) {
            Some(report) => report,
            None => {
                let mut verifier = Verifier::new(key);
                pages.each(&mut |row| verifier.push(row))?;
                verifier.recorded_key(recorded);
                verifier.finish()
            }
        };
        drop(pages);
        report.problems.extend(replay.compare(&pairings, &agents));
        if let Some(head) = head {
            super::check_head(self, &mut report, head)?;
        }
        Ok(report)
    }
}

#[cfg(test)]
impl PgStore {
    /// Reads about `bytes` of entries at a time when verifying (at least
    /// 16 entries), to see a small log read in many pages.
    pub(crate) fn set_page_bytes(&mut self, bytes: usize) {
        self.page_bytes = bytes;
    }

    /// The first column of every row `sql` selects, as text: a test's look
    /// at the database.
    pub(crate) fn query_raw(&self, sql: &str) -> Result<Vec<String>, StoreError> {
        let sql = sql.to_owned();
        self.run(move |pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            let rows = client.query(&sql, &[]).await.map_err(db)?;
            rows.iter().map(|row| get::<String>(row, 0)).collect()
        })
    }

    /// Runs `sql` as it is, outside any check: a test's hand on the
    /// database (tampering, a newer schema).
    pub(crate) fn execute_raw(&self, sql: &str) -> Result<(), StoreError> {
        let sql = sql.to_owned();
        self.run(move |pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            client.batch_execute(&sql).await.map_err(db)
        })
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Closing the queue ends the thread once its tasks are done.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A transaction's work, boxed for [`PgStore::write`] and
/// [`PgStore::write_audited`].
macro_rules! work {
    (|$tx:ident| $body:expr) => {
        move |$tx: &deadpool_postgres::Transaction<'_>| {
            Box::pin(async move { $body })
                as Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>>
        }
    };
}

impl Store for PgStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let key = self.key.clone();
        let (pairings, counted, (seq, audit_head)) = self.run(|pool| async move {
            let mut client = pool.get().await.map_err(unreachable)?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .start()
                .await
                .map_err(db)?;
            // A vessel starts from this: not on a keyed log it could not
            // append to.
            hashing(recorded_key(tx.client()).await?.as_ref(), key.as_ref())?;
            let pairings = read_pairings(tx.client(), None).await?;
            let counted = tx
                .query_opt(
                    "SELECT value FROM counter WHERE name = 'max_generation'",
                    &[],
                )
                .await
                .map_err(db)?
                .map(|row| get::<i64>(&row, 0))
                .transpose()?;
            let head = audit_head(tx.client()).await?;
            tx.commit().await.map_err(db)?;
            Ok((pairings, counted, head))
        })?;
        let counted = unsigned(counted.unwrap_or(0), "the largest generation")?;
        let max_generation = pairings
            .iter()
            .map(|p| p.generation)
            .fold(counted, u64::max);
        Ok(Snapshot {
            pairings,
            max_generation,
            audit_entries: unsigned(seq, "the last audit seq")?,
            audit_head,
        })
    }

    fn load_pairing(&self, device_id: &str) -> Result<Option<StoredPairing>, StoreError> {
        let device_id = device_id.to_owned();
        self.run(|pool| load_pairing(pool, device_id))
    }

    fn load_pairing_async(&self, device_id: &str) -> StoreFuture<Option<StoredPairing>> {
        let device_id = device_id.to_owned();
        self.run_async(|pool| load_pairing(pool, device_id))
    }

    fn put_pairing(&self, pairing: &StoredPairing, audit: &AuditEvent) -> Result<(), StoreError> {
        let generation = to_i64(pairing.generation, "generation")?;
        let paired_at = to_i64(pairing.paired_at_ms, "pairing time")?;
        let pairing = pairing.clone();
        self.write_audited(
            texts_of(std::slice::from_ref(audit))?,
            work!(|tx| {
                exec(
                    tx,
                    "DELETE FROM device_grant WHERE device_id = $1",
                    &[&pairing.device_id],
                )
                .await?;
                exec(
                    tx,
                    "INSERT INTO pairing (device_id, manifest_json, digest, token_hash,
                                          generation, paired_at_ms, device_key)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (device_id) DO UPDATE SET
                         manifest_json = excluded.manifest_json, digest = excluded.digest,
                         token_hash = excluded.token_hash, generation = excluded.generation,
                         paired_at_ms = excluded.paired_at_ms, device_key = excluded.device_key",
                    &[
                        &pairing.device_id,
                        &pairing.manifest_json,
                        &pairing.digest,
                        &&pairing.token_hash[..],
                        &generation,
                        &paired_at,
                        &pairing.device_key.as_ref().map(|key| &key[..]),
                    ],
                )
                .await?;
                exec(
                    tx,
                    "INSERT INTO device_grant (device_id, capability)
                     SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING",
                    &[&pairing.device_id, &pairing.grants],
                )
                .await?;
                exec(
                    tx,
                    "INSERT INTO counter (name, value) VALUES ('max_generation', $1)
                     ON CONFLICT (name) DO UPDATE
                     SET value = GREATEST(counter.value, excluded.value)",
                    &[&generation],
                )
                .await?;
                Ok(())
            }),
        )
    }

    fn set_grant(
        &self,
        device_id: &str,
        capability: &str,
        granted: bool,
        audit: &AuditEvent,
    ) -> Result<(), StoreError> {
        let device_id = device_id.to_owned();
        let capability = capability.to_owned();
        self.write_audited(
            texts_of(std::slice::from_ref(audit))?,
            work!(|tx| {
                let paired = tx
                    .query_opt("SELECT 1 FROM pairing WHERE device_id = $1", &[&device_id])
                    .await
                    .map_err(db)?;
                if paired.is_none() {
                    return Err(StoreError::UnknownDevice(device_id));
                }
                let sql = if granted {
                    "INSERT INTO device_grant (device_id, capability) VALUES ($1, $2)
                     ON CONFLICT DO NOTHING"
                } else {
                    "DELETE FROM device_grant WHERE device_id = $1 AND capability = $2"
                };
                exec(tx, sql, &[&device_id, &capability]).await?;
                Ok(())
            }),
        )
    }

    fn delete_pairing(&self, device_id: &str, audit: &AuditEvent) -> Result<(), StoreError> {
        let device_id = device_id.to_owned();
        self.write_audited(
            texts_of(std::slice::from_ref(audit))?,
            work!(|tx| {
                exec(
                    tx,
                    "DELETE FROM device_grant WHERE device_id = $1",
                    &[&device_id],
                )
                .await?;
                let removed = exec(
                    tx,
                    "DELETE FROM pairing WHERE device_id = $1",
                    &[&device_id],
                )
                .await?;
                if removed == 0 {
                    return Err(StoreError::UnknownDevice(device_id));
                }
                Ok(())
            }),
        )
    }

    fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        self.run(|pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            read_agents(&client).await
        })
    }

    fn put_agent(&self, agent: &StoredAgent, audit: &AuditEvent) -> Result<(), StoreError> {
        to_i64(agent.added_at_ms, "agent added time")?;
        let record = serde_json::to_string(agent)
            .map_err(|error| StoreError::InvalidInput(error.to_string()))?;
        let name = agent.id.clone();
        self.write_audited(
            texts_of(std::slice::from_ref(audit))?,
            work!(|tx| {
                exec(
                    tx,
                    "INSERT INTO agent (name, record) VALUES ($1, $2)
                     ON CONFLICT (name) DO UPDATE SET record = excluded.record",
                    &[&name, &record],
                )
                .await?;
                Ok(())
            }),
        )
    }

    fn delete_agent(&self, name: &str, audit: &AuditEvent) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write_audited(
            texts_of(std::slice::from_ref(audit))?,
            work!(|tx| {
                let removed = exec(tx, "DELETE FROM agent WHERE name = $1", &[&name]).await?;
                if removed == 0 {
                    return Err(StoreError::UnknownAgent(name));
                }
                Ok(())
            }),
        )
    }

    fn append_audit(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        append_as_texts(self, events)
    }

    fn append_audit_texts(&self, texts: &[AuditText]) -> Result<(), StoreError> {
        if texts.is_empty() {
            return Ok(());
        }
        refuse_reserved_kinds(texts.iter().map(AuditText::kind))?;
        self.write_audited(texts.to_vec(), work!(|_tx| Ok(())))
    }

    fn read_audit(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.run(move |pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            let select = client
                .prepare_cached(
                    "SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit
                     WHERE seq > $1 ORDER BY seq LIMIT $2",
                )
                .await
                .map_err(db)?;
            let rows = client.query(&select, &[&after, &limit]).await.map_err(db)?;
            rows.iter().map(raw_row).collect::<Result<Vec<_>, _>>()
        })?;
        rows.iter().map(RawRow::to_entry).collect()
    }

    fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        use crate::entry::{fields, kinds};
        let before = query
            .before_seq
            .map_or(i64::MAX, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let mut sql = String::from(
            "SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit WHERE seq < $1",
        );
        let mut texts: Vec<String> = Vec::new();
        let mut at = 1;
        if let Some(device) = &query.device_id {
            texts.push(device.clone());
            at += 1;
            sql.push_str(&format!(" AND {} = ${at}", indexed_text(fields::DEVICE_ID)));
        }
        if let Some(agent) = &query.agent_id {
            texts.push(agent.clone());
            at += 1;
            sql.push_str(&format!(" AND {} = ${at}", indexed_text(fields::AGENT_ID)));
        }
        let allowed = query.allowed;
        if allowed.is_some() {
            at += 1;
            sql.push_str(&format!(
                " AND kind = '{}' AND (CASE WHEN jsonb_typeof(entry::jsonb -> '{name}') = 'boolean' \
                 THEN (entry::jsonb ->> '{name}')::boolean END) = ${at}",
                kinds::DECISION,
                name = fields::ALLOWED,
            ));
        }
        at += 1;
        sql.push_str(&format!(" ORDER BY seq DESC LIMIT ${at}"));
        let rows = self.run(move |pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            let select = client.prepare_cached(&sql).await.map_err(db)?;
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&before];
            for text in &texts {
                params.push(text);
            }
            if let Some(allowed) = &allowed {
                params.push(allowed);
            }
            params.push(&limit);
            let rows = client.query(&select, &params).await.map_err(db)?;
            rows.iter().map(raw_row).collect::<Result<Vec<_>, _>>()
        })?;
        rows.iter().map(RawRow::to_entry).collect()
    }

    fn audit_head(&self) -> Result<AuditHead, StoreError> {
        let (seq, hash) = self.run(|pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            audit_head(&client).await
        })?;
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
        let name = name.to_owned();
        self.write(work!(|tx| {
            exec(
                tx,
                "INSERT INTO secret (name, hash) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET hash = excluded.hash",
                &[&name, &&hash[..]],
            )
            .await?;
            Ok(())
        }))
    }

    fn secret_hash(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError> {
        let name = name.to_owned();
        let shown = name.clone();
        let bytes = self.run(move |pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            let row = client
                .query_opt("SELECT hash FROM secret WHERE name = $1", &[&name])
                .await
                .map_err(db)?;
            row.map(|row| get::<Vec<u8>>(&row, 0)).transpose()
        })?;
        bytes
            .map(|bytes| hash32(bytes, || format!("the hash of secret `{shown}`")))
            .transpose()
    }

    fn probe_write(&self, at_ms: u64) -> Result<(), StoreError> {
        let at = to_i64(at_ms, "probe time")?;
        self.write(work!(|tx| {
            exec(
                tx,
                "INSERT INTO counter (name, value) VALUES ('write_probe', $1)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                &[&at],
            )
            .await?;
            Ok(())
        }))
    }

    fn put_rate_hit(&self, hit: &RateHit) -> Result<(), StoreError> {
        let row = HitRow::of(hit)?;
        let (rule, agent, calls) = (row.rule.clone(), row.agent.clone(), row.calls);
        self.write(work!(|tx| {
            row.insert(tx).await?;
            exec(
                tx,
                "DELETE FROM rate_hit WHERE rule = $1 AND agent = $2 AND id NOT IN (
                     SELECT id FROM rate_hit WHERE rule = $1 AND agent = $2
                     ORDER BY at_ms DESC, id DESC LIMIT $3)",
                &[&rule, &agent, &calls],
            )
            .await?;
            Ok(())
        }))
    }

    fn claim_rate_hit(&self, hit: &RateHit) -> Result<RateClaim, StoreError> {
        let row = HitRow::of(hit)?;
        self.run(move |pool| claim_rate_hit(pool, row))
    }

    fn claim_rate_hit_async(&self, hit: &RateHit) -> StoreFuture<RateClaim> {
        match HitRow::of(hit) {
            Ok(row) => self.run_async(move |pool| claim_rate_hit(pool, row)),
            Err(error) => Box::pin(std::future::ready(Err(error))),
        }
    }

    fn take_from_buckets(
        &self,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> Result<Option<(usize, u64)>, StoreError> {
        let takes = takes.to_vec();
        self.run(move |pool| take_from_buckets(pool, takes, now_ms))
    }

    fn take_from_buckets_async(
        &self,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> StoreFuture<Option<(usize, u64)>> {
        let takes = takes.to_vec();
        self.run_async(move |pool| take_from_buckets(pool, takes, now_ms))
    }

    fn load_rate_hits(&self, now_ms: u64) -> Result<Vec<RateHit>, StoreError> {
        let now = to_i64(now_ms, "the time")?;
        let rows = self.run(move |pool| async move {
            let client = pool.get().await.map_err(unreachable)?;
            let rows = client
                .query(
                    "SELECT rule, agent, at_ms, calls, window_ms FROM rate_hit
                     WHERE until_ms > $1 ORDER BY at_ms, id",
                    &[&now],
                )
                .await
                .map_err(db)?;
            rows.iter()
                .map(|row| {
                    Ok((
                        get::<String>(row, 0)?,
                        get::<String>(row, 1)?,
                        get::<i64>(row, 2)?,
                        get::<i64>(row, 3)?,
                        get::<i64>(row, 4)?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        let mut hits = Vec::with_capacity(rows.len());
        for (rule, agent, at_ms, calls, window_ms) in rows {
            let (Ok(at_ms), Ok(window_ms), Ok(calls)) = (
                u64::try_from(at_ms),
                u64::try_from(window_ms),
                u32::try_from(calls),
            ) else {
                return Err(StoreError::Corrupt(format!(
                    "rate hit of rule `{rule}` has a negative time, window or count"
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
