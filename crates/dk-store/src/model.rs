//! What the store holds and promises: the `Store` trait, the records it
//! keeps (pairings, agents, rate-rule counts), the audit log's entries,
//! heads and reports, and its errors.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Cause;

/// Durable state of a vessel: pairings with their grants, secret hashes and
/// the audit log. Every method is one transaction; a method that changes
/// pairings or grants appends its audit event in the same transaction and
/// returns only once it is durable.
pub trait Store: Send + Sync + 'static {
    /// Everything the vessel needs at start, read in a few queries.
    fn load(&self) -> Result<Snapshot, StoreError>;

    /// One device's pairing with its grants, or `None` when it is not
    /// paired: what a vessel of a fleet reads again when another member
    /// changed it. By default read out of [`Store::load`]; a store shared by
    /// a fleet reads just the one.
    fn load_pairing(&self, device_id: &str) -> Result<Option<StoredPairing>, StoreError> {
        Ok(self
            .load()?
            .pairings
            .into_iter()
            .find(|p| p.device_id == device_id))
    }

    /// Inserts or replaces a pairing together with its grants (a re-pairing
    /// replaces the old grants), and appends `audit` in the same transaction.
    fn put_pairing(&self, pairing: &StoredPairing, audit: &AuditEvent) -> Result<(), StoreError>;

    /// Grants (`granted` true) or revokes a capability of a paired device and
    /// appends `audit` in the same transaction. Idempotent: granting a held
    /// grant or revoking an absent one changes nothing but still records the
    /// event. An unknown device is [`StoreError::UnknownDevice`], with nothing
    /// recorded.
    fn set_grant(
        &self,
        device_id: &str,
        capability: &str,
        granted: bool,
        audit: &AuditEvent,
    ) -> Result<(), StoreError>;

    /// Removes a pairing and its grants and appends `audit` in the same
    /// transaction. An unknown device is [`StoreError::UnknownDevice`], with
    /// nothing recorded.
    fn delete_pairing(&self, device_id: &str, audit: &AuditEvent) -> Result<(), StoreError>;

    /// Every stored agent, sorted by name.
    fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError>;

    /// Inserts or replaces an agent (its credential only as its SHA-256) and
    /// appends `audit` in the same transaction. Durable on return.
    fn put_agent(&self, agent: &StoredAgent, audit: &AuditEvent) -> Result<(), StoreError>;

    /// Removes an agent and appends `audit` in the same transaction. An
    /// unknown name is [`StoreError::UnknownAgent`], with nothing recorded.
    fn delete_agent(&self, name: &str, audit: &AuditEvent) -> Result<(), StoreError>;

    /// Appends events to the audit log, all in one transaction. The kinds
    /// the store writes with their change (`paired`, `granted`, `revoked`,
    /// `unpaired`, `agent`) are refused here, with nothing appended.
    fn append_audit(&self, events: &[AuditEvent]) -> Result<(), StoreError>;

    /// [`Store::append_audit`] of events already made text (what the
    /// audit writer commits), under the same rules. This default reads
    /// each text back into its event; a store that chains the text as it
    /// is does better.
    fn append_audit_texts(&self, texts: &[AuditText]) -> Result<(), StoreError> {
        let events: Vec<AuditEvent> = texts.iter().map(AuditText::to_event).collect();
        self.append_audit(&events)
    }

    /// Up to `limit` entries with `seq > after_seq`, in order.
    fn read_audit(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError>;

    /// Up to `query.limit` entries that `query` selects, newest first: a
    /// page of the log for a reader (the person's console), indexed so a
    /// page costs the same at the log's end as deep in it.
    fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError>;

    /// The last entry's position and hash (`0` and
    /// [`GENESIS_HASH`](crate::GENESIS_HASH) when the log is empty),
    /// without reading the rest.
    fn audit_head(&self) -> Result<AuditHead, StoreError>;

    /// Recomputes the whole chain and reports every problem found, then
    /// replays the log's pairing, grant and agent entries and reports every
    /// difference from the state the store holds (a pairing, grant or agent
    /// without its entry, or an entry for one the state does not hold).
    fn verify_audit(&self) -> Result<VerifyReport, StoreError>;

    /// Like [`Store::verify_audit`], and also checks that the entry at
    /// `expected.seq` is still there with `expected.hash`: this catches
    /// entries cut off the end, which the chain alone cannot show.
    fn verify_audit_against(&self, expected: &AuditHead) -> Result<VerifyReport, StoreError> {
        let mut report = self.verify_audit()?;
        check_head(self, &mut report, expected)?;
        Ok(report)
    }

    /// Stores the hash of a named secret (for example `admin-token`),
    /// replacing any earlier one. Durable on return.
    fn put_secret_hash(&self, name: &str, hash: [u8; 32]) -> Result<(), StoreError>;

    /// The stored hash of a named secret, if any.
    fn secret_hash(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError>;

    /// Records a call a rule with a `limit` counted, forgetting in the same
    /// transaction every recorded call whose window has passed at
    /// `hit.at_ms`, and all but the latest `hit.calls` of its rule and
    /// agent (no more are needed to tell whether the limit is reached).
    /// Durable on return.
    fn put_rate_hit(&self, hit: &RateHit) -> Result<(), StoreError>;

    /// Records a call a rule with a `limit` counted, as
    /// [`Store::put_rate_hit`] does, but only while fewer than `hit.calls`
    /// calls of its rule and agent are within their windows at
    /// `hit.at_ms` in the store: decided atomically against every vessel
    /// sharing it, so a fleet's limit holds across its members. By default
    /// the store is one vessel's, whose own counts already decided: the
    /// call is recorded and counted.
    fn claim_rate_hit(&self, hit: &RateHit) -> Result<RateClaim, StoreError> {
        self.put_rate_hit(hit).map(|()| RateClaim::Counted)
    }

    /// Takes one call from each of `takes` (an agent's call-rate buckets,
    /// kept in a store shared by a fleet), all or none, in one transaction
    /// that holds the buckets against every vessel sharing the store:
    /// `None` when every bucket had room; else the index of the bucket
    /// that had none and how long until it has, in milliseconds (then
    /// nothing is taken). By default the store is one vessel's, whose own
    /// buckets in memory decide: nothing is taken here.
    fn take_from_buckets(
        &self,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> Result<Option<(usize, u64)>, StoreError> {
        let _ = (takes, now_ms);
        Ok(None)
    }

    /// Every recorded call whose window has not passed at `now_ms`, oldest
    /// first.
    fn load_rate_hits(&self, now_ms: u64) -> Result<Vec<RateHit>, StoreError>;

    /// Makes one small durable write that changes nothing the vessel reads
    /// (a counter of its own, set to `at_ms`), to tell whether the store
    /// takes writes now: a readiness check. Never writes an audit entry.
    fn probe_write(&self, at_ms: u64) -> Result<(), StoreError>;

    /// Whether `error`, which a write of this store returned, means that
    /// the disk holding it is full. By default, a
    /// [`StoreError::DiskFull`]; the SQLite store with a reserve also
    /// counts any write that failed with less free space left than it
    /// wants to work in (a full disk is not always named so on the way up).
    fn disk_full(&self, error: &StoreError) -> bool {
        matches!(error, StoreError::DiskFull(_))
    }

    /// Frees the space this store keeps in reserve against a full disk
    /// ([`DiskReserve`](crate::DiskReserve)), so that what waits to be
    /// committed fits: true when space was freed now. The audit writer
    /// calls it when a write failed because the disk is full, then commits
    /// again. By default a store keeps no reserve: false.
    fn release_reserve(&self) -> bool {
        false
    }

    /// Whether this store's reserve is in place, making it again first
    /// when it was released and the disk has room for it again (and room
    /// to work in beside it). By default a store keeps none: true. The
    /// audit writer asks after each write that held while the disk was
    /// found full: until it is true, no call reaches a device.
    fn restore_reserve(&self) -> bool {
        true
    }

    /// [`Store::load_pairing`] as a [`StoreFuture`]: what a vessel of a
    /// fleet awaits on an async runtime's thread (a device unknown there
    /// that connects).
    fn load_pairing_async(&self, device_id: &str) -> StoreFuture<Option<StoredPairing>> {
        answered(self.load_pairing(device_id))
    }

    /// [`Store::claim_rate_hit`] as a [`StoreFuture`]: what a call under a
    /// rule with a `limit` awaits just before it reaches the device.
    fn claim_rate_hit_async(&self, hit: &RateHit) -> StoreFuture<RateClaim> {
        answered(self.claim_rate_hit(hit))
    }

    /// [`Store::take_from_buckets`] as a [`StoreFuture`]: what a call of
    /// an agent awaits when a fleet keeps its rate in the store.
    fn take_from_buckets_async(
        &self,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> StoreFuture<Option<(usize, u64)>> {
        answered(self.take_from_buckets(takes, now_ms))
    }
}

/// A store's answer to await: what the `*_async` methods of [`Store`] give.
/// The PostgreSQL store answers from a thread of its own, so awaiting the
/// answer holds no thread (an async runtime's worker goes on with other
/// tasks meanwhile), and a caller may stop waiting at any time (a timeout:
/// the operation itself then ends within the store's own timeout, its
/// effect, if any, kept). The trait's defaults run the synchronous method at
/// once, on the caller's thread, and give its answer: right for a store in
/// memory, and what the SQLite store, on a local disk, does.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// A [`StoreFuture`] already answered.
pub(crate) fn answered<T: Send + 'static>(answer: Result<T, StoreError>) -> StoreFuture<T> {
    Box::pin(std::future::ready(answer))
}

/// One call-rate bucket a call takes from ([`Store::take_from_buckets`]):
/// a generic cell rate algorithm, as [`take_from_bucket`] computes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketTake {
    /// Whose bucket (an agent's, or an agent's for one device).
    pub key: String,
    /// Calls a minute it refills at.
    pub calls_per_minute: u32,
    /// Calls it holds when full.
    pub burst: u32,
}

/// Milliseconds in a minute: one call is this much of a bucket's state.
const MINUTE_MS: u128 = 60_000;

/// A call's take from a bucket whose state is `full_at` (the time it is
/// full again, in milliseconds times its calls a minute; `None` for a full
/// bucket): its new state, or how long until it has room, in milliseconds.
pub fn take_from_bucket(
    calls_per_minute: u32,
    burst: u32,
    full_at: Option<u128>,
    now_ms: u64,
) -> Result<u128, u64> {
    let rate = u128::from(calls_per_minute.max(1));
    let now = u128::from(now_ms).saturating_mul(rate);
    let full_at = full_at.unwrap_or(now).max(now);
    // A full bucket has `burst` tokens: a call is allowed while the bucket
    // is fewer than `burst` calls away from full.
    let room = u128::from(burst.saturating_sub(1)).saturating_mul(MINUTE_MS);
    let owed = full_at.saturating_sub(now);
    if owed > room {
        let wait = owed.saturating_sub(room).div_ceil(rate);
        return Err(u64::try_from(wait).unwrap_or(u64::MAX));
    }
    Ok(full_at.saturating_add(MINUTE_MS))
}

/// What [`Store::claim_rate_hit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateClaim {
    /// The call was recorded: it counts.
    Counted,
    /// The limit is reached in the store: nothing was recorded.
    Reached {
        /// How long until the oldest call in the window leaves it, in
        /// milliseconds.
        retry_after_ms: u64,
    },
}

/// One device call a rule with a `limit` counted (see
/// dk-policy's `RateLimit`): kept so that counts survive a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateHit {
    /// The rule's name.
    pub rule: String,
    /// The calling agent's id; empty for a call from no agent.
    pub agent: String,
    /// When the call was counted, in milliseconds since the epoch.
    pub at_ms: u64,
    /// The rule's limit when the call was counted: at most this many calls...
    pub calls: u32,
    /// ... per this many milliseconds.
    pub window_ms: u64,
}

impl RateHit {
    /// When the call leaves its window, in milliseconds since the epoch.
    pub(crate) fn until_ms(&self) -> u64 {
        self.at_ms.saturating_add(self.window_ms)
    }
}

/// Adds to `report` what differs from the head `expected` (kept before the
/// log was read): the entry at its seq gone (cut off the end) or another
/// one in its place (the chain rewritten since).
pub(crate) fn check_head<S: Store + ?Sized>(
    store: &S,
    report: &mut VerifyReport,
    expected: &AuditHead,
) -> Result<(), StoreError> {
    if expected.seq == 0 {
        return Ok(());
    }
    let at = store.read_audit(expected.seq - 1, 1)?;
    match at.first() {
        Some(entry) if entry.seq == expected.seq => {
            if entry.hash != expected.hash {
                report.problems.push(AuditProblem {
                    seq: entry.seq,
                    what: ProblemKind::Edited,
                    detail: format!(
                        "its hash is not the kept head's `{}`: the chain was rewritten since",
                        expected.hash
                    ),
                });
            }
        }
        _ => {
            let last = report.entries;
            report.problems.push(AuditProblem {
                seq: last + 1,
                what: ProblemKind::Truncated,
                detail: if last + 1 == expected.seq {
                    format!("the kept head is entry {}", expected.seq)
                } else {
                    format!(
                        "entries {} to {} are gone; the kept head is entry {}",
                        last + 1,
                        expected.seq,
                        expected.seq
                    )
                },
            });
        }
    }
    Ok(())
}

/// A pairing as stored: what the registry needs to serve the device again
/// after a restart. The token is kept only as its SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredPairing {
    /// The device id from the manifest.
    pub device_id: String,
    /// The approved manifest as canonical JSON.
    pub manifest_json: String,
    /// The manifest digest the device authenticates with.
    pub digest: String,
    /// SHA-256 of the device token. A device paired over dk/2 has no token
    /// it knows: this is the hash of one drawn and never sent.
    pub token_hash: [u8; 32],
    /// The device's static public key, pinned when it paired over dk/2: its
    /// credential on every reconnect. `None` for a device paired over v1.
    pub device_key: Option<[u8; 32]>,
    /// Granted capability names. Stored as a set: order and duplicates are
    /// not kept, [`Store::load`] returns them sorted.
    pub grants: Vec<String>,
    /// The pairing's generation.
    pub generation: u64,
    /// When the person approved the pairing, in milliseconds since the epoch.
    pub paired_at_ms: u64,
}

impl fmt::Debug for StoredPairing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredPairing")
            .field("device_id", &self.device_id)
            .field("digest", &self.digest)
            .field("grants", &self.grants)
            .field("device_key", &self.device_key.is_some())
            .field("generation", &self.generation)
            .field("paired_at_ms", &self.paired_at_ms)
            .finish_non_exhaustive()
    }
}

/// What [`Store::load`] returns: the state a vessel starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Every pairing, ordered by device id, grants sorted.
    pub pairings: Vec<StoredPairing>,
    /// The largest generation ever stored, including pairings since removed,
    /// so a new pairing can take a larger one.
    pub max_generation: u64,
    /// The `seq` of the last audit entry (the number of entries when the log
    /// is intact); 0 when empty.
    pub audit_entries: u64,
    /// The hash of the last audit entry; [`GENESIS_HASH`](crate::GENESIS_HASH) when empty.
    pub audit_head: String,
}

/// An event to append to the audit log.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent {
    /// When it happened, in milliseconds since the epoch.
    pub at_ms: u64,
    /// What kind of event: `decision`, `paired`, `granted`, `revoked`,
    /// `unpaired`, `policy`, ... (`[a-z0-9._-]{1,32}`).
    pub kind: String,
    /// The details. Must not hold a secret: see `redact_for_audit` in the vessel. Its
    /// canonical JSON may be at most [`MAX_AUDIT_ENTRY_BYTES`](crate::MAX_AUDIT_ENTRY_BYTES).
    pub entry: Value,
}

impl AuditEvent {
    /// The event that appends `entry` at `at_ms`, its details as
    /// [`Entry::to_value`](crate::entry::Entry::to_value) gives them (not
    /// redacted: a writer that may hold secrets redacts `entry` first).
    pub fn of(entry: &crate::entry::Entry, at_ms: u64) -> AuditEvent {
        AuditEvent {
            at_ms,
            kind: entry.kind().to_owned(),
            entry: entry.to_value(),
        }
    }
}

/// An audit event ready to be chained: its kind and time checked, its
/// details as their canonical JSON text, and the fields the log is read by
/// (`deviceId`, `agentId`, `allowed`) taken from them. What a store
/// appends. The audit writer makes one of each event it is given, on its
/// own thread; a decision's is written straight from its record
/// (`AuditText::decision`), without a [`Value`] between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditText {
    /// Checked to fit the stores' signed column.
    pub(crate) at_ms: i64,
    pub(crate) kind: String,
    pub(crate) text: String,
    pub(crate) device_id: Option<String>,
    pub(crate) agent_id: Option<String>,
    pub(crate) allowed: Option<bool>,
}

impl AuditText {
    /// When it happened, in milliseconds since the epoch.
    pub fn at_ms(&self) -> u64 {
        self.at_ms.unsigned_abs()
    }

    /// Its kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Its details: canonical JSON.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The device it names (a string `deviceId`).
    pub fn device_id(&self) -> Option<&str> {
        self.device_id.as_deref()
    }

    /// The agent it names (a string `agentId`).
    pub fn agent_id(&self) -> Option<&str> {
        self.agent_id.as_deref()
    }

    /// What a decision decided (a boolean `allowed`).
    pub fn allowed(&self) -> Option<bool> {
        self.allowed
    }

    /// The event again, its details read back from the text.
    pub fn to_event(&self) -> AuditEvent {
        AuditEvent {
            at_ms: self.at_ms(),
            kind: self.kind.clone(),
            entry: serde_json::from_str(&self.text).unwrap_or(Value::Null),
        }
    }
}

/// An entry of the audit log as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// Position in the log, from 1.
    pub seq: u64,
    /// When it happened, in milliseconds since the epoch.
    pub at_ms: u64,
    /// What kind of event.
    pub kind: String,
    /// The details.
    pub entry: Value,
    /// Hash of the entry before (64 zeros for the first).
    pub prev_hash: String,
    /// Hash of this entry.
    pub hash: String,
}

/// Which entries [`Store::query_audit`] returns: those before a position,
/// narrowed by what they name, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only entries with a smaller `seq` (`None`: from the newest).
    pub before_seq: Option<u64>,
    /// Only entries whose `deviceId` is this.
    pub device_id: Option<String>,
    /// Only entries whose `agentId` is this.
    pub agent_id: Option<String>,
    /// Only decisions, allowed (`true`) or refused (`false`).
    pub allowed: Option<bool>,
    /// At most this many entries.
    pub limit: usize,
}

impl AuditQuery {
    /// The newest `limit` entries, whatever they name.
    pub fn newest(limit: usize) -> AuditQuery {
        AuditQuery {
            before_seq: None,
            device_id: None,
            agent_id: None,
            allowed: None,
            limit,
        }
    }

    /// Whether an entry of `kind` with `entry` is one this selects, its
    /// position aside.
    pub fn selects(&self, kind: &str, entry: &Value) -> bool {
        use crate::entry::{fields, kinds};
        let text = |field: &str| entry.get(field).and_then(Value::as_str);
        self.device_id
            .as_deref()
            .is_none_or(|id| text(fields::DEVICE_ID) == Some(id))
            && self
                .agent_id
                .as_deref()
                .is_none_or(|id| text(fields::AGENT_ID) == Some(id))
            && self.allowed.is_none_or(|allowed| {
                kind == kinds::DECISION
                    && entry.get(fields::ALLOWED).and_then(Value::as_bool) == Some(allowed)
            })
    }
}

/// A point of the audit chain to keep elsewhere and verify against later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditHead {
    /// The entry's `seq`.
    pub seq: u64,
    /// The entry's hash.
    pub hash: String,
}

/// What [`Store::verify_audit`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// The `seq` of the last entry (the number of entries when intact).
    pub entries: u64,
    /// The hash of the last entry: keep it elsewhere to detect later that
    /// entries were cut off the end.
    pub head: String,
    /// Every problem found: those of the chain in log order, then those of
    /// the state; empty when the log is intact.
    pub problems: Vec<AuditProblem>,
}

impl VerifyReport {
    /// Whether no problem was found.
    pub fn is_intact(&self) -> bool {
        self.problems.is_empty()
    }

    /// The head as an [`AuditHead`].
    pub fn head(&self) -> AuditHead {
        AuditHead {
            seq: self.entries,
            hash: self.head.clone(),
        }
    }
}

/// One problem in the audit log, at an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditProblem {
    /// The entry concerned (for a missing range, the first missing one).
    pub seq: u64,
    /// What is wrong.
    pub what: ProblemKind,
    /// Why, in words.
    pub detail: String,
}

impl fmt::Display for AuditProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.what {
            ProblemKind::Unaccounted => write!(f, "state: {}", self.detail),
            ProblemKind::Key if self.seq == 0 => write!(f, "key: {}", self.detail),
            _ => write!(f, "entry {}: {} ({})", self.seq, self.what, self.detail),
        }
    }
}

/// The kind of an [`AuditProblem`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The entry's content or hash was changed.
    Edited,
    /// Entries are gone from the middle of the log (deleted).
    Missing,
    /// An entry that is not part of the chain was put in.
    Inserted,
    /// Entries are not in the order they were chained in.
    OutOfOrder,
    /// Entries were cut off the end (found only against a kept head).
    Truncated,
    /// The log and the state tables disagree: a pairing, grant or agent
    /// has no entry (the entries were removed, or the tables edited), or the
    /// log has one the tables do not hold. `seq` is the entry concerned, 0
    /// when there is none.
    Unaccounted,
    /// The chain's key: the chain is keyed and was checked without its key
    /// (or with another), a key was given for a chain nobody keyed (it was
    /// rewritten without the key), or the store's record of the key does not
    /// match the chain.
    Key,
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProblemKind::Edited => "edited",
            ProblemKind::Missing => "missing (deleted)",
            ProblemKind::Inserted => "inserted",
            ProblemKind::OutOfOrder => "out of order",
            ProblemKind::Truncated => "cut off the end",
            ProblemKind::Unaccounted => "not accounted for",
            ProblemKind::Key => "key",
        })
    }
}

/// What a store keeps of an agent: its name, scope, role and when it was
/// added, and its credential's SHA-256 (64 lower-case hex characters), never
/// the credential. The scope and role are kept as the agent directory
/// writes them; the directory reads them back and refuses what it does not
/// understand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredAgent {
    /// Its id (its name).
    pub id: String,
    /// What it may see, as JSON.
    pub scope: Value,
    /// What it may do: `guest`, `user` or `admin`.
    pub role: String,
    /// When it was added, in milliseconds since the Unix epoch.
    pub added_at_ms: u64,
    /// SHA-256 of the credential, lower-case hex.
    pub credential_sha256: String,
}

/// Milliseconds since the Unix epoch.
pub fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file or its directory could not be created or opened.
    #[error("cannot open the store at `{path}`: {reason}")]
    Open {
        /// The path.
        path: String,
        /// Why: the file system's or the database's error.
        #[source]
        reason: Cause,
    },
    /// The database was written by a newer dk with a schema this one does
    /// not know.
    #[error(
        "the store has schema version {found}, newer than this dk knows ({supported}): use a newer dk"
    )]
    NewerSchema {
        /// The database's version.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// The file is not a dk store, or its content is not what dk writes.
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    /// The database reported an error (its own, the
    /// [`source`](std::error::Error::source)).
    #[error("database error: {0}")]
    Database(#[source] Cause),
    /// A write failed because the disk holding the store is full (the
    /// database's or the file system's error, the
    /// [`source`](std::error::Error::source)).
    #[error("the disk is full: {0}")]
    DiskFull(#[source] Cause),
    /// No pairing with this device id.
    #[error("no paired device `{0}`")]
    UnknownDevice(String),
    /// No agent with this name.
    #[error("no agent named `{0}`")]
    UnknownAgent(String),
    /// A value given to the store is not storable (an audit kind outside
    /// `[a-z0-9._-]{1,32}`, an entry too large, a number past `i64::MAX`).
    #[error("not storable: {0}")]
    InvalidInput(String),
    /// The audit writer's thread is no longer running.
    #[error("the audit writer has stopped")]
    WriterStopped,
    /// The audit log does not reach the head kept outside the database, or
    /// holds another entry in its place: entries were cut off its end, or
    /// it was rewritten.
    #[error("the audit log does not match the head kept in `{path}`: {detail}")]
    HeadMismatch {
        /// The head file.
        path: String,
        /// What differs.
        detail: String,
    },
    /// The audit chain is keyed and the store was opened without its key:
    /// it can be read, not appended to.
    #[error(
        "the audit log is keyed from entry {from}: it can be appended to only with its key (--audit-key-file)"
    )]
    KeyRequired {
        /// The entry that keyed it.
        from: u64,
    },
    /// The store was opened with another key than the chain's.
    #[error("the audit log is keyed with key {chain}, not with the key given ({given})")]
    WrongKey {
        /// The chain's key id.
        chain: String,
        /// The given key's id.
        given: String,
    },
    /// The head file cannot be read, written, or does not hold a head.
    #[error("cannot keep the audit head in `{path}`: {reason}")]
    HeadFile {
        /// The head file.
        path: String,
        /// Why: the file system's error, or what the file holds instead
        /// of a head.
        #[source]
        reason: Cause,
    },
}
