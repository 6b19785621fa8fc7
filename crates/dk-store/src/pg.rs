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

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{IsolationLevel, NoTls, Row};

use super::audit::to_i64;
use super::audit::{
    GENESIS_HASH, Hashing, QuickCheck, RawRow, Verifier, links, log_appended, texts_of,
};
use super::crosscheck::{Replay, append_as_texts, refuse_reserved_kinds};
use super::key::AuditKey;
use super::{
    AuditEntry, AuditEvent, AuditHead, AuditQuery, AuditText, BucketTake, Cause, RateClaim,
    RateHit, Snapshot, Store, StoreError, StoreFuture, StoredAgent, StoredPairing, VerifyReport,
};

/// The schema version this build writes: the number of migration steps.
pub const PG_SCHEMA_VERSION: u32 = 3;

/// The advisory lock migrations run under ("dkst").
const MIGRATION_LOCK: i64 = 0x646b_7374;

/// How many entries a verification reads first; then as many as make
/// about [`PAGE_BYTES`], from 16 to [`MOST_PER_PAGE`].
const FIRST_PAGE: i64 = 1_000;

/// About how many bytes of entries a verification holds at a time.
const PAGE_BYTES: usize = 4 << 20;

/// The most entries a verification reads at a time.
const MOST_PER_PAGE: i64 = 10_000;

/// What a row costs beside its entry's text (hashes, kind, numbers).
const ROW_BYTES: usize = 200;

/// The migration steps, in order: step `i` takes the schema from version
/// `i` to `i + 1`. Steps are only ever added, never changed.
const MIGRATIONS: [&str; PG_SCHEMA_VERSION as usize] = [
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
fn indexed_text(name: &str) -> String {
    format!(
        "(CASE WHEN jsonb_typeof(entry::jsonb -> '{name}') = 'string' \
         THEN entry::jsonb ->> '{name}' END)"
    )
}

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

/// An operation for the store's thread: given the pool, the task to run.
type Job = Box<dyn FnOnce(Pool) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

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

/// An error of the driver, its text with the texts of its sources (the
/// driver's own text is often only "db error"), and itself kept as the
/// source.
#[derive(Debug)]
struct PgError {
    text: String,
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl PgError {
    fn new(context: &str, error: impl std::error::Error + Send + Sync + 'static) -> PgError {
        let mut text = context.to_owned();
        let mut next: Option<&dyn std::error::Error> = Some(&error);
        while let Some(error) = next {
            let said = error.to_string();
            if !text.ends_with(&said) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&said);
            }
            next = error.source();
        }
        PgError {
            text,
            error: Box::new(error),
        }
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// The database's error as a [`StoreError::Database`].
fn db(error: tokio_postgres::Error) -> StoreError {
    StoreError::Database(Cause::new(PgError::new("", error)))
}

/// The pool's error: the server could not be reached in time.
fn unreachable(error: PoolError) -> StoreError {
    StoreError::Database(Cause::new(PgError::new(
        "cannot reach the PostgreSQL server",
        error,
    )))
}

/// The error of an operation that did not finish within `timeout`.
fn unanswered(timeout: Duration) -> StoreError {
    StoreError::Database(Cause::msg(format!(
        "the PostgreSQL server did not answer within {} ms",
        timeout.as_millis()
    )))
}

/// The error of an operation sent to a store whose thread is gone.
fn stopped() -> StoreError {
    StoreError::Database(Cause::msg("the PostgreSQL store's thread has stopped"))
}

/// Column `at` of `row`, a wrong type being a corrupt store.
fn get<'a, T: FromSql<'a>>(row: &'a Row, at: usize) -> Result<T, StoreError> {
    row.try_get(at)
        .map_err(|error| StoreError::Corrupt(PgError::new("", error).to_string()))
}

fn unsigned(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} is {value}")))
}

fn hash32(bytes: Vec<u8>, what: impl FnOnce() -> String) -> Result<[u8; 32], StoreError> {
    let len = bytes.len();
    <[u8; 32]>::try_from(bytes)
        .map_err(|_| StoreError::Corrupt(format!("{} is {len} bytes, not 32", what())))
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
        let pages = self.read_pages()?;
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

    /// A read-only transaction on the store's thread that answers the
    /// state first, then a page of the log for each page asked for, until
    /// the [`Pages`] is dropped. Each answer comes within the store's
    /// timeout or is an error.
    fn read_pages(&self) -> Result<Pages, StoreError> {
        let (asks, mut asked) = tokio::sync::mpsc::unbounded_channel::<(i64, i64)>();
        let (answer, answers) = std_mpsc::sync_channel::<Result<Read, StoreError>>(1);
        let timeout = self.timeout;
        let job: Job = Box::new(move |pool| {
            Box::pin(async move {
                // One answer at a time is asked for: the channel always has
                // room, and the store's thread never waits on it.
                let said = |read: Result<Read, StoreError>| answer.try_send(read).is_ok();
                let read = async {
                    let mut client =
                        within(timeout, async { pool.get().await.map_err(unreachable) }).await?;
                    let tx = within(timeout, async {
                        client
                            .build_transaction()
                            .isolation_level(IsolationLevel::RepeatableRead)
                            .read_only(true)
                            .start()
                            .await
                            .map_err(db)
                    })
                    .await?;
                    let state = within(timeout, async {
                        Ok(Read::State(
                            recorded_key(tx.client()).await?,
                            read_pairings(tx.client(), None).await?,
                            read_agents(tx.client()).await?,
                        ))
                    })
                    .await?;
                    if !said(Ok(state)) {
                        return Ok(());
                    }
                    while let Some((after, limit)) = asked.recv().await {
                        let page = within(timeout, async {
                            let rows = tx
                                .query(
                                    "SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit
                                     WHERE seq > $1 ORDER BY seq LIMIT $2",
                                    &[&after, &limit],
                                )
                                .await
                                .map_err(db)?;
                            rows.iter().map(raw_row).collect::<Result<Vec<_>, _>>()
                        })
                        .await;
                        let failed = page.is_err();
                        if !said(page.map(Read::Page)) || failed {
                            return Ok(());
                        }
                    }
                    within(timeout, async { tx.commit().await.map_err(db) }).await
                };
                if let Err(error) = read.await {
                    said(Err(error));
                }
            })
        });
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        jobs.send(job).map_err(|_| stopped())?;
        Ok(Pages {
            asks,
            answers,
            timeout: self.timeout,
            page_bytes: self.page_bytes,
        })
    }
}

/// `work`, given at most `timeout`.
async fn within<T>(
    timeout: Duration,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(unanswered(timeout)))
}

/// What a paged read answers: the state (the chain's recorded key, the
/// pairings, the agents), then pages of the log.
enum Read {
    State(Option<(i64, String)>, Vec<StoredPairing>, Vec<StoredAgent>),
    Page(Vec<RawRow>),
}

/// The log and the state of one read-only transaction on the store's
/// thread ([`PgStore::read_pages`]), read a page at a time.
struct Pages {
    asks: tokio::sync::mpsc::UnboundedSender<(i64, i64)>,
    answers: std_mpsc::Receiver<Result<Read, StoreError>>,
    timeout: Duration,
    page_bytes: usize,
}

/// The state a [`Pages`] answers first.
type State = (Option<(i64, String)>, Vec<StoredPairing>, Vec<StoredAgent>);

impl Pages {
    /// The next answer, waited for a little longer than the store's
    /// thread gives it.
    fn next(&self) -> Result<Read, StoreError> {
        match self
            .answers
            .recv_timeout(self.timeout.saturating_add(Duration::from_secs(1)))
        {
            Ok(read) => read,
            Err(std_mpsc::RecvTimeoutError::Timeout) => Err(unanswered(self.timeout)),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(stopped()),
        }
    }

    /// The state, the first answer.
    fn state(&self) -> Result<State, StoreError> {
        match self.next()? {
            Read::State(recorded, pairings, agents) => Ok((recorded, pairings, agents)),
            Read::Page(_) => Err(StoreError::Corrupt(
                "a page of the log came before the state".to_owned(),
            )),
        }
    }

    /// Gives every entry of the log to `take`, in stored order, a page at
    /// a time.
    fn each(&self, take: &mut dyn FnMut(RawRow)) -> Result<(), StoreError> {
        let mut after = i64::MIN;
        let mut limit = FIRST_PAGE;
        loop {
            self.asks.send((after, limit)).map_err(|_| stopped())?;
            let page = match self.next()? {
                Read::Page(page) => page,
                Read::State(..) => {
                    return Err(StoreError::Corrupt(
                        "the state came again instead of a page of the log".to_owned(),
                    ));
                }
            };
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = last.seq;
            let rows = page.len();
            let bytes: usize = page.iter().map(|row| row.entry.len() + ROW_BYTES).sum();
            let asked = limit;
            limit = i64::try_from(self.page_bytes.saturating_mul(rows) / bytes.max(1))
                .unwrap_or(MOST_PER_PAGE)
                .clamp(16, MOST_PER_PAGE);
            for row in page {
                take(row);
            }
            if i64::try_from(rows).unwrap_or(i64::MAX) < asked {
                return Ok(());
            }
        }
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

/// Starts the store's thread: a current-thread runtime that runs each job
/// sent to it as a task of its own, with the pool, until the queue closes.
fn drive(pool: Pool) -> std::io::Result<(tokio::sync::mpsc::UnboundedSender<Job>, JoinHandle<()>)> {
    let (jobs, mut queue) = tokio::sync::mpsc::unbounded_channel::<Job>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let thread = std::thread::Builder::new()
        .name("dk-store-pg".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                while let Some(job) = queue.recv().await {
                    while tasks.try_join_next().is_some() {}
                    tasks.spawn(job(pool.clone()));
                }
                while tasks.join_next().await.is_some() {}
                pool.close();
            });
        })?;
    Ok((jobs, thread))
}

/// Brings the schema up to date, one step per transaction, under the
/// migration lock.
async fn migrate(pool: Pool) -> Result<(), StoreError> {
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
async fn schema_version(pool: Pool) -> Result<Option<u32>, StoreError> {
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

/// The entry that keyed the chain and the key's id, if it is keyed.
async fn recorded_key(
    client: &tokio_postgres::Client,
) -> Result<Option<(i64, String)>, StoreError> {
    let row = client
        .query_opt(
            "SELECT seq, key_id FROM audit_key ORDER BY seq LIMIT 1",
            &[],
        )
        .await
        .map_err(db)?;
    row.map(|row| Ok((get(&row, 0)?, get(&row, 1)?)))
        .transpose()
}

/// How new entries are hashed given the chain's recorded key and the
/// store's.
fn hashing<'k>(
    recorded: Option<&(i64, String)>,
    key: Option<&'k AuditKey>,
) -> Result<Hashing<'k>, StoreError> {
    match (recorded, key) {
        (None, _) => Ok(Hashing::Plain),
        (Some((_, chain)), Some(key)) if *chain == key.id() => Ok(Hashing::Keyed(key)),
        (Some((_, chain)), Some(key)) => Err(StoreError::WrongKey {
            chain: chain.clone(),
            given: key.id(),
        }),
        (Some((from, _)), None) => Err(StoreError::KeyRequired {
            from: u64::try_from(*from).unwrap_or(0),
        }),
    }
}

/// The chain as an appending transaction holds it: where it turned keyed
/// and the key's id, if it did, and its head (`seq`, `hash`).
type HeldChain = (Option<(i64, String)>, (i64, String));

/// Takes the chain for this transaction (the lock every appending
/// transaction takes first), then reads whether it is keyed and its head
/// in one statement, which sees every append committed before the lock was
/// had.
async fn take_chain(tx: &deadpool_postgres::Transaction<'_>) -> Result<HeldChain, StoreError> {
    let lock = tx
        .prepare_cached("SELECT one FROM audit_writer FOR UPDATE")
        .await
        .map_err(db)?;
    tx.query(&lock, &[]).await.map_err(db)?;
    let read = tx
        .prepare_cached(
            "SELECT h.seq, h.hash, k.seq, k.key_id FROM (SELECT 1) AS one
             LEFT JOIN LATERAL (SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1) AS h
                 ON TRUE
             LEFT JOIN LATERAL (SELECT seq, key_id FROM audit_key ORDER BY seq LIMIT 1) AS k
                 ON TRUE",
        )
        .await
        .map_err(db)?;
    let row = tx.query_one(&read, &[]).await.map_err(db)?;
    let head = match (
        get::<Option<i64>>(&row, 0)?,
        get::<Option<String>>(&row, 1)?,
    ) {
        (Some(seq), Some(hash)) => (seq, hash),
        _ => (0, GENESIS_HASH.to_owned()),
    };
    let recorded = match (
        get::<Option<i64>>(&row, 2)?,
        get::<Option<String>>(&row, 3)?,
    ) {
        (Some(seq), Some(key_id)) => Some((seq, key_id)),
        _ => None,
    };
    Ok((recorded, head))
}

/// The last entry of the log.
async fn audit_head(client: &tokio_postgres::Client) -> Result<(i64, String), StoreError> {
    let row = client
        .query_opt("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", &[])
        .await
        .map_err(db)?;
    match row {
        Some(row) => Ok((get(&row, 0)?, get(&row, 1)?)),
        None => Ok((0, GENESIS_HASH.to_owned())),
    }
}

/// Appends `texts` to the log after `head` (as [`take_chain`] read it),
/// in one statement; the seq of the first, `None` when there were none.
async fn append(
    tx: &deadpool_postgres::Transaction<'_>,
    texts: &[AuditText],
    hashing: Hashing<'_>,
    (seq, hash): (i64, String),
) -> Result<Option<u64>, StoreError> {
    if texts.is_empty() {
        return Ok(None);
    }
    let links = links(seq, &hash, texts, hashing)?;
    // Each entry's previous hash: the head's, then each one's before it.
    let prev_hashes = std::iter::once(hash.as_str()).chain(links.iter().map(|(_, h)| h.as_str()));
    let mut columns = (
        Vec::with_capacity(texts.len()),
        Vec::with_capacity(texts.len()),
        Vec::with_capacity(texts.len()),
        Vec::with_capacity(texts.len()),
        Vec::with_capacity(texts.len()),
        Vec::with_capacity(texts.len()),
    );
    for ((text, (seq, hash)), prev_hash) in texts.iter().zip(&links).zip(prev_hashes) {
        columns.0.push(*seq);
        columns.1.push(text.at_ms);
        columns.2.push(text.kind());
        columns.3.push(text.text());
        columns.4.push(prev_hash);
        columns.5.push(hash.as_str());
    }
    let insert = tx
        .prepare_cached(
            "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash)
             SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::text[],
                                  $5::text[], $6::text[])",
        )
        .await
        .map_err(db)?;
    tx.execute(
        &insert,
        &[
            &columns.0, &columns.1, &columns.2, &columns.3, &columns.4, &columns.5,
        ],
    )
    .await
    .map_err(db)?;
    Ok(links
        .first()
        .map(|(seq, _)| u64::try_from(*seq).unwrap_or(0)))
}

/// Keys the chain from its next entry on, unless another store keyed it
/// meanwhile: the `audit-keyed` entry under the key, and its record. The
/// entry's seq and event, when this store appended it.
async fn key_the_chain(pool: Pool, key: AuditKey) -> Result<Option<(u64, AuditEvent)>, StoreError> {
    let mut client = pool.get().await.map_err(unreachable)?;
    let tx = client.transaction().await.map_err(db)?;
    let (recorded, head) = take_chain(&tx).await?;
    match recorded {
        Some((_, chain)) if chain == key.id() => return Ok(None),
        Some((_, chain)) => {
            return Err(StoreError::WrongKey {
                chain,
                given: key.id(),
            });
        }
        None => {}
    }
    let event = AuditEvent::of(
        &crate::entry::Entry::AuditKeyed(crate::entry::AuditKeyed {
            key_id: key.id().to_owned(),
        }),
        crate::epoch_ms(std::time::SystemTime::now()),
    );
    let first = append(
        &tx,
        &texts_of(std::slice::from_ref(&event))?,
        Hashing::Keyed(&key),
        head,
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("the keyed entry was not appended".to_owned()))?;
    let seq = to_i64(first, "audit seq")?;
    tx.execute(
        "INSERT INTO audit_key (seq, key_id) VALUES ($1, $2)",
        &[&seq, &key.id()],
    )
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(Some((first, event)))
}

fn raw_row(row: &Row) -> Result<RawRow, StoreError> {
    Ok(RawRow {
        seq: get(row, 0)?,
        at_ms: get(row, 1)?,
        kind: get(row, 2)?,
        entry: get(row, 3)?,
        prev_hash: get(row, 4)?,
        hash: get(row, 5)?,
    })
}

/// Every pairing with its grants, ordered by device id, grants sorted.
async fn read_pairings(
    client: &tokio_postgres::Client,
    only: Option<&str>,
) -> Result<Vec<StoredPairing>, StoreError> {
    let rows = client
        .query(
            "SELECT device_id, manifest_json, digest, token_hash, generation, paired_at_ms,
                    device_key
             FROM pairing WHERE $1::text IS NULL OR device_id = $1
             ORDER BY device_id COLLATE \"C\"",
            &[&only],
        )
        .await
        .map_err(db)?;
    let mut pairings = Vec::with_capacity(rows.len());
    for row in &rows {
        let device_id: String = get(row, 0)?;
        let token_hash = hash32(get(row, 3)?, || format!("the token hash of `{device_id}`"))?;
        let device_key = match get::<Option<Vec<u8>>>(row, 6)? {
            None => None,
            Some(key) => Some(hash32(key, || format!("the key of `{device_id}`"))?),
        };
        pairings.push(StoredPairing {
            manifest_json: get(row, 1)?,
            digest: get(row, 2)?,
            token_hash,
            device_key,
            grants: Vec::new(),
            generation: unsigned(get(row, 4)?, &format!("the generation of `{device_id}`"))?,
            paired_at_ms: unsigned(get(row, 5)?, &format!("the pairing time of `{device_id}`"))?,
            device_id,
        });
    }
    let grants = client
        .query(
            "SELECT device_id, capability FROM device_grant
             WHERE $1::text IS NULL OR device_id = $1
             ORDER BY device_id COLLATE \"C\", capability COLLATE \"C\"",
            &[&only],
        )
        .await
        .map_err(db)?;
    for row in &grants {
        let device_id: String = get(row, 0)?;
        let capability: String = get(row, 1)?;
        let at = pairings
            .binary_search_by(|p| p.device_id.as_str().cmp(&device_id))
            .map_err(|_| {
                StoreError::Corrupt(format!("a grant for `{device_id}`, which is not paired"))
            })?;
        if let Some(pairing) = pairings.get_mut(at) {
            pairing.grants.push(capability);
        }
    }
    Ok(pairings)
}

/// Every agent, sorted by name.
async fn read_agents(client: &tokio_postgres::Client) -> Result<Vec<StoredAgent>, StoreError> {
    let rows = client
        .query(
            "SELECT name, record FROM agent ORDER BY name COLLATE \"C\"",
            &[],
        )
        .await
        .map_err(db)?;
    let mut agents = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = get(row, 0)?;
        let record: String = get(row, 1)?;
        let agent: StoredAgent = serde_json::from_str(&record).map_err(|error| {
            StoreError::Corrupt(format!("the record of agent `{name}`: {error}"))
        })?;
        if agent.id != name {
            return Err(StoreError::Corrupt(format!(
                "the record of agent `{name}` names `{}`",
                agent.id
            )));
        }
        agents.push(agent);
    }
    Ok(agents)
}

/// One device's pairing with its grants, as of one moment.
async fn load_pairing(pool: Pool, device_id: String) -> Result<Option<StoredPairing>, StoreError> {
    let mut client = pool.get().await.map_err(unreachable)?;
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)?;
    let mut found = read_pairings(tx.client(), Some(&device_id)).await?;
    tx.commit().await.map_err(db)?;
    Ok(found.pop())
}

/// [`Store::claim_rate_hit`] of `row`, in one transaction.
async fn claim_rate_hit(pool: Pool, row: HitRow) -> Result<RateClaim, StoreError> {
    let HitRow {
        rule,
        agent,
        at,
        calls,
        until,
        ..
    } = &row;
    let mut client = pool.get().await.map_err(unreachable)?;
    let tx = client.transaction().await.map_err(db)?;
    // One rule and agent's count at a time, across every vessel.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, 7))",
        &[rule, agent],
    )
    .await
    .map_err(db)?;
    let counts = tx
        .query_one(
            "SELECT count(*), min(until_ms) FROM rate_hit
             WHERE rule = $1 AND agent = $2 AND until_ms > $3",
            &[rule, agent, at],
        )
        .await
        .map_err(db)?;
    let (counted, oldest): (i64, Option<i64>) = (get(&counts, 0)?, get(&counts, 1)?);
    if counted >= *calls {
        tx.commit().await.map_err(db)?;
        let wait = oldest.unwrap_or(*until).saturating_sub(*at);
        return Ok(RateClaim::Reached {
            retry_after_ms: u64::try_from(wait).unwrap_or(0),
        });
    }
    row.insert(&tx).await?;
    tx.commit().await.map_err(db)?;
    Ok(RateClaim::Counted)
}

/// [`Store::take_from_buckets`], in one transaction.
async fn take_from_buckets(
    pool: Pool,
    takes: Vec<BucketTake>,
    now_ms: u64,
) -> Result<Option<(usize, u64)>, StoreError> {
    let mut client = pool.get().await.map_err(unreachable)?;
    let tx = client.transaction().await.map_err(db)?;
    let mut taken = Vec::with_capacity(takes.len());
    // Every call takes its buckets in the same order (the agent's,
    // then the device's): transactions never wait on each other
    // in a cycle.
    for (i, take) in takes.iter().enumerate() {
        tx.execute(
            "INSERT INTO agent_bucket (key, full_at) VALUES ($1, '') \
             ON CONFLICT (key) DO NOTHING",
            &[&take.key],
        )
        .await
        .map_err(db)?;
        let row = tx
            .query_one(
                "SELECT full_at FROM agent_bucket WHERE key = $1 FOR UPDATE",
                &[&take.key],
            )
            .await
            .map_err(db)?;
        let held: String = get(&row, 0)?;
        let full_at = held.parse::<u128>().ok();
        match crate::take_from_bucket(take.calls_per_minute, take.burst, full_at, now_ms) {
            Ok(next) => taken.push((take.key.clone(), next.to_string())),
            Err(wait) => {
                tx.rollback().await.map_err(db)?;
                return Ok(Some((i, wait)));
            }
        }
    }
    for (key, next) in &taken {
        tx.execute(
            "UPDATE agent_bucket SET full_at = $2 WHERE key = $1",
            &[key, next],
        )
        .await
        .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(None)
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

/// A counted call as the `rate_hit` table holds it.
struct HitRow {
    rule: String,
    agent: String,
    at: i64,
    calls: i64,
    window: i64,
    until: i64,
}

impl HitRow {
    fn of(hit: &RateHit) -> Result<HitRow, StoreError> {
        Ok(HitRow {
            rule: hit.rule.clone(),
            agent: hit.agent.clone(),
            at: to_i64(hit.at_ms, "rate hit time")?,
            calls: i64::from(hit.calls),
            window: to_i64(hit.window_ms, "rate hit window")?,
            until: to_i64(hit.until_ms(), "rate hit time")?,
        })
    }

    /// Forgets the calls whose window has passed at this one's time, then
    /// records this one.
    async fn insert(&self, tx: &deadpool_postgres::Transaction<'_>) -> Result<(), StoreError> {
        exec(tx, "DELETE FROM rate_hit WHERE until_ms <= $1", &[&self.at]).await?;
        exec(
            tx,
            "INSERT INTO rate_hit (rule, agent, at_ms, calls, window_ms, until_ms)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &self.rule,
                &self.agent,
                &self.at,
                &self.calls,
                &self.window,
                &self.until,
            ],
        )
        .await?;
        Ok(())
    }
}

/// Executes `sql` with `params` in `tx`, its statement prepared once per
/// connection; the number of rows it changed.
async fn exec(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = tx.prepare_cached(sql).await.map_err(db)?;
    tx.execute(&statement, params).await.map_err(db)
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
