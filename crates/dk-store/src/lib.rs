//! Durable state: the [`Store`] trait with an embedded SQLite implementation
//! (`SqliteStore`), a PostgreSQL one several vessels can share (`PgStore`,
//! the `postgres` feature), and an in-memory one ([`MemoryStore`]), the
//! hash-chained audit log with its verification, and the write-behind
//! [`AuditWriter`].
//!
//! The PostgreSQL store is built on tokio-postgres and deadpool-postgres
//! because they are the rust-postgres project's own maintained async driver
//! and a small, maintained pool that reconnects by itself, and it runs them
//! on a thread of its own: its synchronous methods block their caller's
//! thread (call them off an async runtime's workers), and what a device's
//! call path asks of it comes through the trait's `*_async` faces
//! ([`StoreFuture`]), awaited without holding a thread.
//!
//! What the store holds: pairings (manifest, digest, token hash, grants,
//! generation, paired-at), agents (name, scope, role, added-at and the
//! SHA-256 of their credential), hashes of named secrets such as the admin
//! token, and the audit log. It never receives a token in clear, only SHA-256
//! hashes, so nothing in the data directory can be used to authenticate.
//!
//! Durability: every change to pairings or grants is one transaction that
//! also appends its audit entry; the call returns only once that
//! transaction is committed and synced (`synchronous=FULL` in WAL mode). A
//! crash therefore loses nothing that was acknowledged, and never leaves a
//! change without its audit entry or an entry without its change. Decision
//! records go through the [`AuditWriter`], which batches them off the call
//! path and drops none (a full queue makes calls wait); a crash can lose
//! the records of the last batch not yet committed (at most `max_delay`
//! plus one commit, and whatever is queued), never a pairing, grant, revoke
//! or unpair. A call reaches a device only while the writer's store took a
//! write within its bound ([`AuditRoom::durability`]), so a crash loses at
//! most the bound's worth of records of calls that reached a device.
//!
//! The audit chain: entry `seq` (from 1, step 1) carries `prev_hash`, the
//! hash of entry `seq - 1` (64 zeros for the first), and its own
//!
//! ```text
//! hash = hex(sha256(prev_hash "\n" seq "\n" at_ms "\n" kind "\n" entry))
//! ```
//!
//! where numbers are decimal, `kind` is `[a-z0-9._-]{1,32}` and `entry` is
//! the canonical JSON text of the entry (object keys sorted, no spaces) as
//! stored. In a keyed chain (see `key.rs`), from its `audit-keyed` entry on,
//! the hash is `hex(hmac_sha256(key, ...))` of the same text.
//!
//! [`Store::verify_audit`] recomputes the chain and reports edited, deleted,
//! inserted and reordered entries with their `seq`. It also replays the
//! entries that record pairings, grants and agents against the state tables
//! (`crosscheck.rs`): those change only in the transaction that appends
//! their entry, so a log emptied, or cut back past a change, no longer
//! accounts for the state, however intact its chain. Cutting decisions off
//! the end, or rewriting the whole chain with recomputed hashes, is
//! detectable only against a head kept elsewhere ([`Store::verify_audit_against`];
//! the SQLite store keeps one in a file, `anchor.rs`). Entries appended with
//! correct hashes are detectable only in a keyed chain, by whoever holds the
//! key: an unkeyed chain proves order and integrity relative to a kept head,
//! not authorship.

#![forbid(unsafe_code)]

mod anchor;
mod audit;
#[cfg(feature = "sqlite")]
mod backup;
mod cause;
mod crosscheck;
pub mod entry;
#[cfg(feature = "sqlite")]
mod keeper;
mod key;
mod memory;
mod model;
#[cfg(feature = "postgres")]
mod pg;
mod reserve;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod writer;

#[cfg(test)]
mod conformance;
#[cfg(test)]
#[cfg(feature = "sqlite")]
mod pages_tests;
#[cfg(test)]
#[cfg(feature = "postgres")]
mod pg_tests;
#[cfg(test)]
#[cfg(feature = "sqlite")]
mod tests;

pub use anchor::{HeadSyntaxError, audit_head_file};
pub use audit::{
    GENESIS_HASH, MAX_AUDIT_DEPTH, MAX_AUDIT_ENTRY_BYTES, MAX_AUDIT_ITEMS, MAX_AUDIT_STRING,
};
pub use audit::{
    canonical_json, cut_for_audit, cut_for_audit_in_place, cut_for_audit_with, fits_in_entry,
};
#[cfg(feature = "sqlite")]
pub use backup::RestoreError;
pub use cause::Cause;
pub use key::{AuditKey, AuditKeyError};
pub use memory::MemoryStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use model::check_head;
pub use model::{
    AuditEntry, AuditEvent, AuditHead, AuditProblem, AuditQuery, AuditText, BucketTake,
    ProblemKind, RateClaim, RateHit, Snapshot, Store, StoreError, StoreFuture, StoredAgent,
    StoredPairing, VerifyReport, epoch_ms, take_from_bucket,
};
#[cfg(feature = "postgres")]
pub use pg::{PG_SCHEMA_VERSION, PgOptions, PgStore};
pub use reserve::{
    DEFAULT_RESERVE_BYTES, DEFAULT_ROOM_BYTES, DiskReserve, RESERVE_FILE, ReserveError,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{AuditOptions, SCHEMA_VERSION, SqliteStore};
pub use writer::{
    AuditPlace, AuditRoom, AuditWriter, DEFAULT_DURABLE_WITHIN, Durability, Made, RECORD_PATIENCE,
    STOP_ATTEMPTS, WriterOptions,
};
