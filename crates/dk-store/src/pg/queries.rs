//! The queries the store's jobs run for one kind of row: pairings,
//! agents, the counts of rules with a limit and an agent's rate buckets.

use deadpool_postgres::Pool;
use tokio_postgres::IsolationLevel;
use tokio_postgres::types::ToSql;

use super::errors::{db, get, hash32, unreachable, unsigned};
use crate::audit::to_i64;
use crate::{BucketTake, RateClaim, RateHit, StoreError, StoredAgent, StoredPairing};

/// Every pairing with its grants, ordered by device id, grants sorted.
pub(super) async fn read_pairings(
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
pub(super) async fn read_agents(
    client: &tokio_postgres::Client,
) -> Result<Vec<StoredAgent>, StoreError> {
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
pub(super) async fn load_pairing(
    pool: Pool,
    device_id: String,
) -> Result<Option<StoredPairing>, StoreError> {
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
pub(super) async fn claim_rate_hit(pool: Pool, row: HitRow) -> Result<RateClaim, StoreError> {
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
pub(super) async fn take_from_buckets(
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

/// A counted call as the `rate_hit` table holds it.
pub(super) struct HitRow {
    pub(super) rule: String,
    pub(super) agent: String,
    pub(super) at: i64,
    pub(super) calls: i64,
    pub(super) window: i64,
    pub(super) until: i64,
}

impl HitRow {
    pub(super) fn of(hit: &RateHit) -> Result<HitRow, StoreError> {
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
    pub(super) async fn insert(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
    ) -> Result<(), StoreError> {
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
pub(super) async fn exec(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = tx.prepare_cached(sql).await.map_err(db)?;
    tx.execute(&statement, params).await.map_err(db)
}
