//! The chain itself: each entry's hash, plain or keyed ([`Hashing`]), an
//! entry as stored ([`RawRow`]), and a batch of texts chained onto a log's
//! head.

use dk_files::hex::encode as hex;
use sha2::{Digest, Sha256};

use crate::key::AuditKey;
use crate::{AuditEntry, AuditText, StoreError};

/// The `prev_hash` of the first entry: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The hash of one entry (see the module documentation of `store`).
pub(crate) fn entry_hash(prev_hash: &str, seq: i64, at_ms: i64, kind: &str, entry: &str) -> String {
    let mut hasher = Sha256::new();
    for part in entry_parts(prev_hash, &seq.to_string(), &at_ms.to_string(), kind, entry) {
        hasher.update(part);
    }
    hex(&hasher.finalize())
}

/// The text an entry's hash is taken of, in parts.
fn entry_parts<'a>(
    prev_hash: &'a str,
    seq: &'a str,
    at_ms: &'a str,
    kind: &'a str,
    entry: &'a str,
) -> [&'a [u8]; 9] {
    [
        prev_hash.as_bytes(),
        b"\n",
        seq.as_bytes(),
        b"\n",
        at_ms.as_bytes(),
        b"\n",
        kind.as_bytes(),
        b"\n",
        entry.as_bytes(),
    ]
}

/// The kind of the entry that starts a keyed chain: its own hash and every
/// later one are HMACs under the key whose id it holds (`{"keyId": ...}`).
pub(crate) const KEYED_KIND: &str = crate::entry::kinds::AUDIT_KEYED;

/// How an entry's hash is made: SHA-256, or HMAC-SHA256 under the key.
#[derive(Clone, Copy)]
pub(crate) enum Hashing<'k> {
    Plain,
    Keyed(&'k AuditKey),
}

impl Hashing<'_> {
    /// The hash of one entry.
    pub fn of(self, prev_hash: &str, seq: i64, at_ms: i64, kind: &str, entry: &str) -> String {
        match self {
            Hashing::Plain => entry_hash(prev_hash, seq, at_ms, kind, entry),
            Hashing::Keyed(key) => key.mac(&entry_parts(
                prev_hash,
                &seq.to_string(),
                &at_ms.to_string(),
                kind,
                entry,
            )),
        }
    }
}

/// An audit entry as stored, with the entry as its stored text. Numbers are
/// signed because that is what the database holds, whatever was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRow {
    pub seq: i64,
    pub at_ms: i64,
    pub kind: String,
    pub entry: String,
    pub prev_hash: String,
    pub hash: String,
}

impl RawRow {
    /// The row as an [`AuditEntry`], checking what the database gave back.
    pub(crate) fn to_entry(&self) -> Result<AuditEntry, StoreError> {
        let seq = u64::try_from(self.seq)
            .map_err(|_| StoreError::Corrupt(format!("audit entry with seq {}", self.seq)))?;
        let at_ms = u64::try_from(self.at_ms).map_err(|_| {
            StoreError::Corrupt(format!("audit entry {seq}: time {} ms", self.at_ms))
        })?;
        let entry = serde_json::from_str(&self.entry).map_err(|error| {
            StoreError::Corrupt(format!("audit entry {seq}: entry is not JSON: {error}"))
        })?;
        Ok(AuditEntry {
            seq,
            at_ms,
            kind: self.kind.clone(),
            entry,
            prev_hash: self.prev_hash.clone(),
            hash: self.hash.clone(),
        })
    }
}

/// The `seq` and hash each of `texts` takes, chained onto the head (`seq`,
/// `hash`) of a log and hashed as `hashing` says, in order: each entry's
/// `prev_hash` is the hash before it.
pub(crate) fn links(
    head_seq: i64,
    head_hash: &str,
    texts: &[AuditText],
    hashing: Hashing<'_>,
) -> Result<Vec<(i64, String)>, StoreError> {
    let mut links: Vec<(i64, String)> = Vec::with_capacity(texts.len());
    for text in texts {
        let (prev_seq, prev_hash) = links
            .last()
            .map_or((head_seq, head_hash), |(seq, hash)| (*seq, hash.as_str()));
        let seq = prev_seq
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt("audit seq overflow".to_owned()))?;
        let hash = hashing.of(prev_hash, seq, text.at_ms, &text.kind, &text.text);
        links.push((seq, hash));
    }
    Ok(links)
}

/// Chains `texts` onto the head (`seq`, `hash`) of a log, each hashed as
/// `hashing` says: the rows to append, in order.
pub(crate) fn chain(
    head_seq: i64,
    head_hash: &str,
    texts: &[AuditText],
    hashing: Hashing<'_>,
) -> Result<Vec<RawRow>, StoreError> {
    let links = links(head_seq, head_hash, texts, hashing)?;
    let mut prev_hash = head_hash.to_owned();
    Ok(texts
        .iter()
        .zip(links)
        .map(|(text, (seq, hash))| RawRow {
            seq,
            at_ms: text.at_ms,
            kind: text.kind.clone(),
            entry: text.text.clone(),
            prev_hash: std::mem::replace(&mut prev_hash, hash.clone()),
            hash,
        })
        .collect())
}
