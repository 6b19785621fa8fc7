//! Reading the state tables: pairings (with their keys, when the file has
//! them) and agents.

use rusqlite::Connection;

use super::errors::{db, hash32, unsigned};
use crate::{StoreError, StoredAgent, StoredPairing};

/// Every pairing with its grants, ordered by device id, grants sorted.
/// Every pairing with its grants; `with_keys` unless the schema is older
/// than the devices' keys (then none has one).
pub(super) fn read_pairings(
    tx: &Connection,
    with_keys: bool,
) -> Result<Vec<StoredPairing>, StoreError> {
    let mut pairings: Vec<StoredPairing> = Vec::new();
    {
        let mut select = tx
            .prepare(&format!(
                "SELECT device_id, manifest_json, digest, token_hash, generation, paired_at_ms,
                        {}
                 FROM pairing",
                if with_keys { "device_key" } else { "NULL" }
            ))
            .map_err(db)?;
        let mut rows = select.query([]).map_err(db)?;
        while let Some(row) = rows.next().map_err(db)? {
            let device_id: String = row.get(0).map_err(db)?;
            let token_hash = hash32(row.get(3).map_err(db)?, || {
                format!("the token hash of `{device_id}`")
            })?;
            let device_key = match row.get::<_, Option<Vec<u8>>>(6).map_err(db)? {
                None => None,
                Some(key) => Some(hash32(key, || format!("the key of `{device_id}`"))?),
            };
            pairings.push(StoredPairing {
                manifest_json: row.get(1).map_err(db)?,
                digest: row.get(2).map_err(db)?,
                token_hash,
                device_key,
                grants: Vec::new(),
                generation: unsigned(
                    row.get(4).map_err(db)?,
                    &format!("the generation of `{device_id}`"),
                )?,
                paired_at_ms: unsigned(
                    row.get(5).map_err(db)?,
                    &format!("the pairing time of `{device_id}`"),
                )?,
                device_id,
            });
        }
    }
    // Read in the table's own order and sorted here, as SQLite's binary
    // collation sorts: ordered by its id, SQLite walks the id's index and
    // looks every row up in the table, most of the read with thousands paired.
    pairings.sort_unstable_by(|a, b| a.device_id.cmp(&b.device_id));
    let mut select = tx
        .prepare("SELECT device_id, capability FROM device_grant ORDER BY device_id, capability")
        .map_err(db)?;
    let mut rows = select.query([]).map_err(db)?;
    while let Some(row) = rows.next().map_err(db)? {
        let device_id: String = row.get(0).map_err(db)?;
        let capability: String = row.get(1).map_err(db)?;
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
pub(super) fn read_agents(conn: &Connection) -> Result<Vec<StoredAgent>, StoreError> {
    let mut select = conn
        .prepare_cached("SELECT name, record FROM agent ORDER BY name")
        .map_err(db)?;
    let rows = select
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .map_err(db)?;
    let mut agents = Vec::new();
    for row in rows {
        let (name, record) = row.map_err(db)?;
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
