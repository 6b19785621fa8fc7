//! The audit log against the state tables. Every pairing (its digest, its
//! pinned key and its grants) and every agent (its scope and role) was changed only in a
//! transaction that appended its entry, so replaying the log's `paired`,
//! `granted`, `revoked`, `unpaired` and `agent` entries gives back exactly
//! the state the tables hold. A log emptied, or cut back past a change,
//! no longer accounts for that state, however intact its chain; a table
//! edited without an entry no longer matches the log.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::audit::RawRow;
use super::{AuditProblem, ProblemKind, StoredPairing};
use crate::StoredAgent;
use crate::entry::{AgentChange, Entry, kinds};

/// The kinds of the entries the store writes only in the transaction of
/// their change; [`Store::append_audit`](super::Store::append_audit)
/// refuses them, so nothing else can write one.
pub(crate) const STATE_KINDS: [&str; 5] = [
    kinds::PAIRED,
    kinds::GRANTED,
    kinds::REVOKED,
    kinds::UNPAIRED,
    kinds::AGENT,
];

/// Refuses events of a kind the store writes only with its change, or
/// itself (`audit-keyed`, which starts a keyed chain).
pub(crate) fn refuse_reserved_kinds<'a>(
    mut kinds: impl Iterator<Item = &'a str>,
) -> Result<(), super::StoreError> {
    let reserved = |kind: &&str| STATE_KINDS.contains(kind) || *kind == super::audit::KEYED_KIND;
    match kinds.find(reserved) {
        Some(kind) => Err(super::StoreError::InvalidInput(format!(
            "audit kind `{kind}` is written only with its change"
        ))),
        None => Ok(()),
    }
}

/// [`Store::append_audit`](super::Store::append_audit) for a store that
/// appends through texts: a reserved kind refused first, as every store
/// does, then each event made text and the texts appended.
pub(crate) fn append_as_texts(
    store: &dyn super::Store,
    events: &[super::AuditEvent],
) -> Result<(), super::StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    refuse_reserved_kinds(events.iter().map(|event| event.kind.as_str()))?;
    store.append_audit_texts(&super::audit::texts_of(events)?)
}

/// A pairing as the log has it.
#[derive(Debug)]
struct LoggedPairing {
    /// The entry that paired it.
    seq: i64,
    digest: String,
    /// The pinned dk/2 key, as lower-case hex (`deviceKey`).
    key: Option<String>,
    /// Each grant with the entry that gave it.
    grants: BTreeMap<String, i64>,
}

/// An agent as the log has it.
#[derive(Debug)]
struct LoggedAgent {
    /// The last entry that changed it.
    seq: i64,
    scope: Value,
    role: Value,
}

/// The state the log's entries build, in stored order.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    pairings: BTreeMap<String, LoggedPairing>,
    agents: BTreeMap<String, LoggedAgent>,
}

impl Replay {
    /// Takes the next entry; only state entries change anything. An entry
    /// that does not have the shape the store writes is left out, so what it
    /// stood for shows as unaccounted.
    pub fn push(&mut self, row: &RawRow) {
        if !STATE_KINDS.contains(&row.kind.as_str()) {
            return;
        }
        let Ok(entry) = serde_json::from_str::<Value>(&row.entry) else {
            return;
        };
        let Ok(entry) = Entry::read(&row.kind, &entry) else {
            return;
        };
        let seq = row.seq;
        match entry {
            Entry::Paired(paired) => {
                self.pairings.insert(
                    paired.device_id,
                    LoggedPairing {
                        seq,
                        digest: paired.digest,
                        key: paired.device_key,
                        grants: paired
                            .grants
                            .into_iter()
                            .map(|grant| (grant, seq))
                            .collect(),
                    },
                );
            }
            Entry::Granted(change) => {
                if let Some(pairing) = self.pairings.get_mut(&change.device_id) {
                    pairing.grants.insert(change.capability, seq);
                }
            }
            Entry::Revoked(change) => {
                if let Some(pairing) = self.pairings.get_mut(&change.device_id) {
                    pairing.grants.remove(&change.capability);
                }
            }
            Entry::Unpaired(unpaired) => {
                self.pairings.remove(&unpaired.device_id);
            }
            Entry::Agent(change) => self.push_agent(seq, change),
            _ => {}
        }
    }

    fn push_agent(&mut self, seq: i64, change: AgentChange) {
        match change {
            AgentChange::Added { agent, .. } => {
                self.agents.insert(
                    agent.id,
                    LoggedAgent {
                        seq,
                        scope: agent.scope,
                        role: agent.role,
                    },
                );
            }
            AgentChange::Removed { agent_id, .. } => {
                self.agents.remove(&agent_id);
            }
            AgentChange::Scope {
                agent_id, scope, ..
            } => {
                if let Some(agent) = self.agents.get_mut(&agent_id) {
                    agent.seq = seq;
                    agent.scope = scope;
                }
            }
        }
    }

    /// Every difference between the replayed state and the state tables.
    pub fn compare(&self, pairings: &[StoredPairing], agents: &[StoredAgent]) -> Vec<AuditProblem> {
        let mut problems = Vec::new();
        let mut problem = |seq: i64, detail: String| {
            problems.push(AuditProblem {
                seq: u64::try_from(seq).unwrap_or(0),
                what: ProblemKind::Unaccounted,
                detail,
            });
        };
        let mut held = BTreeSet::new();
        for pairing in pairings {
            let id = &pairing.device_id;
            held.insert(id.as_str());
            let Some(logged) = self.pairings.get(id) else {
                problem(
                    0,
                    format!(
                        "pairing `{id}` (generation {}) has no `paired` entry in the log",
                        pairing.generation
                    ),
                );
                continue;
            };
            let key = pairing.device_key.map(|key| dk_files::hex::encode(&key));
            if logged.digest != pairing.digest || logged.key != key {
                problem(
                    logged.seq,
                    format!(
                        "pairing `{id}` is not the one its `paired` entry {} records",
                        logged.seq
                    ),
                );
            }
            let grants: BTreeSet<&str> = pairing.grants.iter().map(String::as_str).collect();
            for grant in &grants {
                if !logged.grants.contains_key(*grant) {
                    problem(
                        0,
                        format!("grant `{grant}` on `{id}` has no entry in the log"),
                    );
                }
            }
            for (grant, seq) in &logged.grants {
                if !grants.contains(grant.as_str()) {
                    problem(
                        *seq,
                        format!(
                            "the log grants `{grant}` on `{id}` (entry {seq}), the state does not"
                        ),
                    );
                }
            }
        }
        for (id, logged) in &self.pairings {
            if !held.contains(id.as_str()) {
                problem(
                    logged.seq,
                    format!(
                        "the log has `{id}` paired (entry {}), the state does not",
                        logged.seq
                    ),
                );
            }
        }
        let mut held = BTreeSet::new();
        for stored in agents {
            let id = &stored.id;
            held.insert(id.as_str());
            let Some(logged) = self.agents.get(id) else {
                problem(0, format!("agent `{id}` has no `agent` entry in the log"));
                continue;
            };
            let role = Value::String(stored.role.clone());
            if logged.scope != stored.scope || logged.role != role {
                problem(
                    logged.seq,
                    format!(
                        "agent `{id}` is not the one its last `agent` entry {} records",
                        logged.seq
                    ),
                );
            }
        }
        for (id, logged) in &self.agents {
            if !held.contains(id.as_str()) {
                problem(
                    logged.seq,
                    format!(
                        "the log has agent `{id}` (entry {}), the state does not",
                        logged.seq
                    ),
                );
            }
        }
        problems
    }
}
