//! The audit log in SQLite: appends chained to the head, the log read a
//! page at a time by query (the device index's buckets and spans), the
//! keyed chain's key, and the head kept in a file, checked at open.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::errors::{db, unsigned};
use super::schema::column_of;
use crate::audit::{GENESIS_HASH, Hashing, RawRow, links, texts_of, to_i64};
use crate::key::AuditKey;
use crate::{AuditEvent, AuditHead, AuditQuery, AuditText, Cause, StoreError};

/// Entries per bucket of the device index: `seq >> DEVICE_BUCKET_BITS`.
pub(super) const DEVICE_BUCKET_BITS: u32 = 10;

/// Entries per span of `audit_device_span`: `seq >> DEVICE_SPAN_BITS`.
pub(super) const DEVICE_SPAN_BITS: u32 = 16;

/// The entry that keyed the chain and the key's id, if it is keyed.
pub(super) fn recorded_key(conn: &Connection) -> Result<Option<(i64, String)>, StoreError> {
    conn.prepare_cached("SELECT seq, key_id FROM audit_key ORDER BY seq LIMIT 1")
        .map_err(db)?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .map_err(db)
}

/// Keys the chain from its next entry on: appends the `audit-keyed` entry,
/// under the key, and records it, in one transaction. Its seq and the new
/// head.
pub(super) fn key_the_chain(
    conn: &mut Connection,
    key: &AuditKey,
) -> Result<(i64, AuditHead), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db)?;
    let event = AuditEvent::of(
        &crate::entry::Entry::AuditKeyed(crate::entry::AuditKeyed {
            key_id: key.id().to_owned(),
        }),
        crate::epoch_ms(std::time::SystemTime::now()),
    );
    let head = append(&tx, std::slice::from_ref(&event), Hashing::Keyed(key))?
        .ok_or_else(|| StoreError::Corrupt("the keyed entry was not appended".to_owned()))?;
    let seq = to_i64(head.seq, "audit seq")?;
    tx.prepare_cached("INSERT INTO audit_key (seq, key_id) VALUES (?1, ?2)")
        .map_err(db)?
        .execute(params![seq, key.id()])
        .map_err(db)?;
    tx.commit().map_err(db)?;
    Ok((seq, head))
}

/// Checks the log against the head kept in `file` and keeps the log's
/// head there: the kept entry must still be in the log, unchanged. A
/// missing file is started.
pub(super) fn check_kept_head(conn: &Connection, file: &Path) -> Result<(), StoreError> {
    let shown = file.display().to_string();
    let mismatch = |detail: String| StoreError::HeadMismatch {
        path: shown.clone(),
        detail,
    };
    let (last, hash) = audit_head(conn)?;
    let head = AuditHead {
        seq: unsigned(last, "the last audit seq")?,
        hash,
    };
    if let Some(kept) = AuditHead::read_from(file)? {
        if kept == head {
            return Ok(());
        }
        if kept.seq > 0 {
            let at = i64::try_from(kept.seq).unwrap_or(i64::MAX);
            let stored: Option<String> = conn
                .prepare_cached("SELECT hash FROM audit WHERE seq = ?1")
                .map_err(db)?
                .query_row([at], |row| row.get(0))
                .optional()
                .map_err(db)?;
            match stored {
                None => {
                    return Err(mismatch(format!(
                        "the log ends at entry {last}, the kept head is entry {}",
                        kept.seq
                    )));
                }
                Some(stored) if stored != kept.hash => {
                    return Err(mismatch(format!(
                        "entry {} is not the one kept: the log was rewritten",
                        kept.seq
                    )));
                }
                Some(_) => {}
            }
        }
    }
    head.write_to(file).map_err(|error| StoreError::HeadFile {
        path: shown,
        reason: Cause::new(error),
    })
}

/// The SQL of `query` and its values, on the columns the indexes of
/// migration 8 are on. A query
/// that names a device reads one bucket of the device index: its first
/// value is the bucket (`seq >> 10`), set for each bucket read (see
/// [`SqliteStore::query_audit`]); its last value is always the limit.
pub(crate) fn audit_query_sql(query: &AuditQuery) -> (String, Vec<rusqlite::types::Value>) {
    use crate::entry::{fields, kinds};
    use rusqlite::types::Value as Sql;
    let before = query
        .before_seq
        .map_or(i64::MAX, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
    let mut values = Vec::new();
    let mut sql = String::from("SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit");
    if let Some(device) = &query.device_id {
        values.push(Sql::Integer(0));
        values.push(Sql::Integer(before));
        values.push(Sql::Text(device.clone()));
        sql.push_str(&format!(
            " INDEXED BY audit_device_bucket WHERE (seq >> {DEVICE_BUCKET_BITS}) = ?1 AND seq < ?2 AND {} = ?3",
            column_of(fields::DEVICE_ID),
        ));
    } else {
        values.push(Sql::Integer(before));
        sql.push_str(" WHERE seq < ?1");
    }
    if let Some(agent) = &query.agent_id {
        values.push(Sql::Text(agent.clone()));
        sql.push_str(&format!(
            " AND {} = ?{}",
            column_of(fields::AGENT_ID),
            values.len()
        ));
    }
    if let Some(allowed) = query.allowed {
        values.push(Sql::Integer(i64::from(allowed)));
        sql.push_str(&format!(
            " AND kind = '{}' AND {} = ?{}",
            kinds::DECISION,
            column_of(fields::ALLOWED),
            values.len()
        ));
    }
    values.push(Sql::Integer(i64::try_from(query.limit).unwrap_or(i64::MAX)));
    sql.push_str(&format!(" ORDER BY seq DESC LIMIT ?{}", values.len()));
    (sql, values)
}

/// The buckets of the device index that may hold `device`'s entries
/// before `before`, newest first: every bucket of each span the device
/// appears in (`audit_device_span`), none of the others.
pub(super) fn device_buckets(
    conn: &Connection,
    device: &str,
    before: i64,
) -> Result<impl Iterator<Item = i64> + use<>, StoreError> {
    let (head, _) = audit_head(conn)?;
    let last = before.saturating_sub(1).min(head);
    let spans: Vec<i64> = if last < 1 {
        Vec::new()
    } else {
        let mut select = conn
            .prepare_cached(
                "SELECT span FROM audit_device_span
                 WHERE device_id = ?1 AND span <= ?2 ORDER BY span DESC",
            )
            .map_err(db)?;
        let rows = select
            .query_map(params![device, last >> DEVICE_SPAN_BITS], |row| row.get(0))
            .map_err(db)?;
        rows.collect::<Result<_, _>>().map_err(db)?
    };
    let per_span = DEVICE_SPAN_BITS - DEVICE_BUCKET_BITS;
    Ok(spans.into_iter().flat_map(move |span| {
        let first = span << per_span;
        let end = (((span + 1) << per_span) - 1).min(last >> DEVICE_BUCKET_BITS);
        (first..=end).rev()
    }))
}

/// The last entry of the log, read inside the writing transaction so that
/// another process appending to the same file cannot fork the chain.
pub(super) fn audit_head(tx: &Connection) -> Result<(i64, String), StoreError> {
    let head = tx
        .prepare_cached("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")
        .map_err(db)?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .map_err(db)?;
    Ok(head.unwrap_or_else(|| (0, GENESIS_HASH.to_owned())))
}

/// Appends `events` to the log, hashed as `hashing` says; the new head,
/// `None` when there were none.
pub(super) fn append(
    tx: &Connection,
    events: &[AuditEvent],
    hashing: Hashing<'_>,
) -> Result<Option<AuditHead>, StoreError> {
    append_texts(tx, &texts_of(events)?, hashing)
}

/// [`append`] of events already made text.
pub(super) fn append_texts(
    tx: &Connection,
    texts: &[AuditText],
    hashing: Hashing<'_>,
) -> Result<Option<AuditHead>, StoreError> {
    if texts.is_empty() {
        return Ok(None);
    }
    let (seq, hash) = audit_head(tx)?;
    let links = links(seq, &hash, texts, hashing)?;
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash, device_id, agent_id, allowed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .map_err(db)?;
    let mut prev_hash = hash.as_str();
    for (text, (seq, hash)) in texts.iter().zip(&links) {
        insert
            .execute(params![
                seq,
                text.at_ms,
                text.kind(),
                text.text(),
                prev_hash,
                hash,
                text.device_id(),
                text.agent_id(),
                text.allowed(),
            ])
            .map_err(db)?;
        prev_hash = hash;
    }
    // The spans the appended entries name a device in (as the index reads
    // `deviceId`: only a string names one), each once.
    let mut spans: Vec<(&str, i64)> = texts
        .iter()
        .zip(&links)
        .filter_map(|(text, (seq, _))| Some((text.device_id()?, seq >> DEVICE_SPAN_BITS)))
        .collect();
    spans.sort_unstable();
    spans.dedup();
    let mut add_span = tx
        .prepare_cached("INSERT OR IGNORE INTO audit_device_span (device_id, span) VALUES (?1, ?2)")
        .map_err(db)?;
    for (device, span) in spans {
        add_span.execute(params![device, span]).map_err(db)?;
    }
    Ok(links.last().map(|(seq, hash)| AuditHead {
        seq: u64::try_from(*seq).unwrap_or(0),
        hash: hash.clone(),
    }))
}

pub(super) fn raw_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        seq: row.get(0)?,
        at_ms: row.get(1)?,
        kind: row.get(2)?,
        entry: row.get(3)?,
        prev_hash: row.get(4)?,
        hash: row.get(5)?,
    })
}
