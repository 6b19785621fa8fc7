//! The audit log's hash chain in PostgreSQL: its head, taken under a lock
//! by each append so appends from a fleet's vessels chain one after the
//! other, and the key that starts a keyed chain.

use deadpool_postgres::Pool;

use super::errors::{db, get, unreachable};
use crate::audit::{GENESIS_HASH, Hashing, links, texts_of, to_i64};
use crate::key::AuditKey;
use crate::{AuditEvent, AuditText, StoreError};

/// The entry that keyed the chain and the key's id, if it is keyed.
pub(super) async fn recorded_key(
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
pub(super) fn hashing<'k>(
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
pub(super) type HeldChain = (Option<(i64, String)>, (i64, String));

/// Takes the chain for this transaction (the lock every appending
/// transaction takes first), then reads whether it is keyed and its head
/// in one statement, which sees every append committed before the lock was
/// had.
pub(super) async fn take_chain(
    tx: &deadpool_postgres::Transaction<'_>,
) -> Result<HeldChain, StoreError> {
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
pub(super) async fn audit_head(
    client: &tokio_postgres::Client,
) -> Result<(i64, String), StoreError> {
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
pub(super) async fn append(
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
pub(super) async fn key_the_chain(
    pool: Pool,
    key: AuditKey,
) -> Result<Option<(u64, AuditEvent)>, StoreError> {
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
