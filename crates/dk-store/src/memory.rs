//! The in-memory store, for tests: the same semantics as the SQLite store,
//! hash chain included, and nothing survives the process.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::audit::{
    GENESIS_HASH, Hashing, Logged, RawRow, Verifier, chain, log_appended, texts_of, to_i64,
};
use super::crosscheck::{Replay, append_as_texts, refuse_reserved_kinds};
use super::{
    AuditEntry, AuditEvent, AuditHead, AuditQuery, AuditText, RateHit, Snapshot, Store, StoreError,
    StoredPairing, VerifyReport,
};
use crate::StoredAgent;

/// A [`Store`] held in memory. Every method takes one lock, so each is
/// atomic like a transaction.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pairings: BTreeMap<String, StoredPairing>,
    max_generation: u64,
    secrets: HashMap<String, [u8; 32]>,
    agents: BTreeMap<String, StoredAgent>,
    audit: Vec<RawRow>,
    rate_hits: Vec<RateHit>,
}

impl State {
    /// Chains events onto the log's head: checked before anything changes.
    fn chained(&self, events: &[AuditEvent]) -> Result<Vec<RawRow>, StoreError> {
        self.chained_texts(&texts_of(events)?)
    }

    /// [`State::chained`] for events already made text.
    fn chained_texts(&self, texts: &[AuditText]) -> Result<Vec<RawRow>, StoreError> {
        let (seq, hash) = self
            .audit
            .last()
            .map_or((0, GENESIS_HASH), |row| (row.seq, row.hash.as_str()));
        chain(seq, hash, texts, Hashing::Plain)
    }

    /// Keeps the `rows` chained from `events`, and logs them.
    fn keep<E: Logged>(&mut self, rows: Vec<RawRow>, events: &[E]) {
        if let Some(first) = rows.first() {
            log_appended(u64::try_from(first.seq).unwrap_or(0), events);
        }
        self.audit.extend(rows);
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every method leaves the state whole before anything can panic, so
        // a poisoned lock still guards consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn normalised(pairing: &StoredPairing) -> StoredPairing {
    let grants: BTreeSet<String> = pairing.grants.iter().cloned().collect();
    StoredPairing {
        grants: grants.into_iter().collect(),
        ..pairing.clone()
    }
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let state = self.state();
        Ok(Snapshot {
            pairings: state.pairings.values().cloned().collect(),
            max_generation: state.max_generation,
            audit_entries: state
                .audit
                .last()
                .map_or(0, |row| u64::try_from(row.seq).unwrap_or(0)),
            audit_head: state
                .audit
                .last()
                .map_or_else(|| GENESIS_HASH.to_owned(), |row| row.hash.clone()),
        })
    }

    fn put_pairing(&self, pairing: &StoredPairing, audit: &AuditEvent) -> Result<(), StoreError> {
        to_i64(pairing.generation, "generation")?;
        to_i64(pairing.paired_at_ms, "pairing time")?;
        let mut state = self.state();
        let rows = state.chained(std::slice::from_ref(audit))?;
        state.max_generation = state.max_generation.max(pairing.generation);
        state
            .pairings
            .insert(pairing.device_id.clone(), normalised(pairing));
        state.keep(rows, std::slice::from_ref(audit));
        Ok(())
    }

    fn set_grant(
        &self,
        device_id: &str,
        capability: &str,
        granted: bool,
        audit: &AuditEvent,
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        let rows = state.chained(std::slice::from_ref(audit))?;
        let pairing = state
            .pairings
            .get_mut(device_id)
            .ok_or_else(|| StoreError::UnknownDevice(device_id.to_owned()))?;
        let held = pairing
            .grants
            .binary_search_by(|g| g.as_str().cmp(capability));
        match (granted, held) {
            (true, Err(at)) => pairing.grants.insert(at, capability.to_owned()),
            (false, Ok(at)) => {
                pairing.grants.remove(at);
            }
            _ => {}
        }
        state.keep(rows, std::slice::from_ref(audit));
        Ok(())
    }

    fn delete_pairing(&self, device_id: &str, audit: &AuditEvent) -> Result<(), StoreError> {
        let mut state = self.state();
        let rows = state.chained(std::slice::from_ref(audit))?;
        if state.pairings.remove(device_id).is_none() {
            return Err(StoreError::UnknownDevice(device_id.to_owned()));
        }
        state.keep(rows, std::slice::from_ref(audit));
        Ok(())
    }

    fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        Ok(self.state().agents.values().cloned().collect())
    }

    fn put_agent(&self, agent: &StoredAgent, audit: &AuditEvent) -> Result<(), StoreError> {
        to_i64(agent.added_at_ms, "agent added time")?;
        let mut state = self.state();
        let rows = state.chained(std::slice::from_ref(audit))?;
        state.agents.insert(agent.id.clone(), agent.clone());
        state.keep(rows, std::slice::from_ref(audit));
        Ok(())
    }

    fn delete_agent(&self, name: &str, audit: &AuditEvent) -> Result<(), StoreError> {
        let mut state = self.state();
        let rows = state.chained(std::slice::from_ref(audit))?;
        if state.agents.remove(name).is_none() {
            return Err(StoreError::UnknownAgent(name.to_owned()));
        }
        state.keep(rows, std::slice::from_ref(audit));
        Ok(())
    }

    fn append_audit(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        append_as_texts(self, events)
    }

    fn append_audit_texts(&self, texts: &[AuditText]) -> Result<(), StoreError> {
        refuse_reserved_kinds(texts.iter().map(AuditText::kind))?;
        let mut state = self.state();
        let rows = state.chained_texts(texts)?;
        state.keep(rows, texts);
        Ok(())
    }

    fn read_audit(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let state = self.state();
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let start = state.audit.partition_point(|row| row.seq <= after);
        state
            .audit
            .iter()
            .skip(start)
            .take(limit)
            .map(RawRow::to_entry)
            .collect()
    }

    fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let state = self.state();
        let before = query
            .before_seq
            .map_or(i64::MAX, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
        let end = state.audit.partition_point(|row| row.seq < before);
        let mut page = Vec::new();
        for row in state.audit.iter().take(end).rev() {
            if page.len() >= query.limit {
                break;
            }
            let entry = row.to_entry()?;
            if query.selects(&entry.kind, &entry.entry) {
                page.push(entry);
            }
        }
        Ok(page)
    }

    fn audit_head(&self) -> Result<AuditHead, StoreError> {
        let state = self.state();
        match state.audit.last() {
            Some(row) => row.to_entry().map(|entry| AuditHead {
                seq: entry.seq,
                hash: entry.hash,
            }),
            None => Ok(AuditHead {
                seq: 0,
                hash: GENESIS_HASH.to_owned(),
            }),
        }
    }

    fn verify_audit(&self) -> Result<VerifyReport, StoreError> {
        let state = self.state();
        let mut verifier = Verifier::new(None);
        let mut replay = Replay::default();
        for row in &state.audit {
            replay.push(row);
            verifier.push(row.clone());
        }
        let pairings: Vec<StoredPairing> = state.pairings.values().cloned().collect();
        let agents: Vec<StoredAgent> = state.agents.values().cloned().collect();
        let mut report = verifier.finish();
        report.problems.extend(replay.compare(&pairings, &agents));
        Ok(report)
    }

    fn put_secret_hash(&self, name: &str, hash: [u8; 32]) -> Result<(), StoreError> {
        self.state().secrets.insert(name.to_owned(), hash);
        Ok(())
    }

    fn secret_hash(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError> {
        Ok(self.state().secrets.get(name).copied())
    }

    fn put_rate_hit(&self, hit: &RateHit) -> Result<(), StoreError> {
        to_i64(hit.until_ms(), "rate hit time")?;
        let mut state = self.state();
        state.rate_hits.retain(|h| h.until_ms() > hit.at_ms);
        state.rate_hits.push(hit.clone());
        state.rate_hits.sort_by_key(|h| h.at_ms);
        let keep = usize::try_from(hit.calls).unwrap_or(usize::MAX);
        let of_pair = |h: &RateHit| h.rule == hit.rule && h.agent == hit.agent;
        let mut excess = state.rate_hits.iter().filter(|h| of_pair(h)).count();
        excess = excess.saturating_sub(keep);
        // Oldest first: the pair's calls before its latest `keep` go.
        state.rate_hits.retain(|h| {
            if excess > 0 && of_pair(h) {
                excess -= 1;
                return false;
            }
            true
        });
        Ok(())
    }

    /// Memory always takes a write: this only takes the state's lock.
    fn probe_write(&self, _at_ms: u64) -> Result<(), StoreError> {
        drop(self.state());
        Ok(())
    }

    fn load_rate_hits(&self, now_ms: u64) -> Result<Vec<RateHit>, StoreError> {
        let state = self.state();
        Ok(state
            .rate_hits
            .iter()
            .filter(|h| h.until_ms() > now_ms)
            .cloned()
            .collect())
    }
}
