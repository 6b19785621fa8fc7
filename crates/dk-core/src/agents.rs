//! Agents: who may use the vessel's tools, and which of them. The person
//! adds an agent with a name, a scope and a role; the agent gets a bearer
//! credential, shown once, of which only the SHA-256 is kept. The agent's
//! name is its `agentId` in every policy context and decision record.
//!
//! The directory serves from memory. With [`AgentDirectory::with_store`]
//! every add, remove and scope change is committed to the store (with its
//! `agent` audit entry, never the credential) before it takes effect or is
//! acknowledged; [`StoredAgent`] is the shape a store keeps (hash only), and
//! [`AgentDirectory::from_stored`] / [`AgentDirectory::stored`] are the way
//! in and out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::SystemTime;

pub use dk_proto::admin::AgentRole;
use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::broadcast;

use crate::allowances::Allowances;
use crate::by::By;
pub use crate::store::StoredAgent;
use crate::store::entry as schema;
use crate::store::{AuditEvent, Store, StoreError};

/// Every agent credential starts with this, so a leaked one is recognisable.
pub const AGENT_CREDENTIAL_PREFIX: &str = "dka_";

/// Longest agent name (its id).
pub const MAX_AGENT_NAME: usize = 32;

/// The agent's id: its name, lower-case ASCII letters, digits and single
/// `-` between them, at most [`MAX_AGENT_NAME`] characters. No `_`, so no
/// agent can be called `__shadow__`.
pub type AgentId = String;

/// Whether `role` may use a capability that acts (not a sensor).
fn may_act(role: AgentRole) -> bool {
    !matches!(role, AgentRole::Guest)
}

/// Which capabilities of one device a scope covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "names")]
pub enum CapabilityScope {
    /// Every capability of the device (still only the granted ones).
    All,
    /// Only these capability names.
    Only(BTreeSet<String>),
}

/// Which devices an agent may see. Grants still apply: a scope never offers
/// what the person did not grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "devices")]
pub enum AgentScope {
    /// Every paired device.
    AllDevices,
    /// Only these device ids, each with all or some of its capabilities.
    Devices(BTreeMap<String, CapabilityScope>),
}

/// Why a scope item was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// An item was empty, or had an empty device or capability part.
    #[error("scope item `{0}` must be `DEVICE` or `DEVICE:CAPABILITY`")]
    Malformed(String),
}

impl AgentScope {
    /// A scope from command-line items: `*` for every device, `DEVICE` for
    /// all of a device's capabilities, `DEVICE:CAPABILITY` for one of them.
    /// Items add up; `*` wins over everything else.
    pub fn from_items<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, ScopeError> {
        let mut devices: BTreeMap<String, CapabilityScope> = BTreeMap::new();
        for item in items {
            let item = item.trim();
            if item == "*" {
                return Ok(AgentScope::AllDevices);
            }
            let (device, capability) = match item.split_once(':') {
                Some((d, c)) => (d, Some(c)),
                None => (item, None),
            };
            if device.is_empty() || capability.is_some_and(str::is_empty) {
                return Err(ScopeError::Malformed(item.to_owned()));
            }
            let entry = devices
                .entry(device.to_owned())
                .or_insert_with(|| CapabilityScope::Only(BTreeSet::new()));
            match (capability, entry) {
                (None, entry) => *entry = CapabilityScope::All,
                (Some(_), CapabilityScope::All) => {}
                (Some(c), CapabilityScope::Only(names)) => {
                    names.insert(c.to_owned());
                }
            }
        }
        Ok(AgentScope::Devices(devices))
    }

    /// The scope as command-line items, the inverse of
    /// [`AgentScope::from_items`]: `["*"]`, or `DEVICE` and
    /// `DEVICE:CAPABILITY` items sorted by device and capability.
    pub fn to_items(&self) -> Vec<String> {
        match self {
            AgentScope::AllDevices => vec!["*".to_owned()],
            AgentScope::Devices(devices) => devices
                .iter()
                .flat_map(|(device, capabilities)| match capabilities {
                    CapabilityScope::All => vec![device.clone()],
                    CapabilityScope::Only(names) => {
                        names.iter().map(|c| format!("{device}:{c}")).collect()
                    }
                })
                .collect(),
        }
    }

    /// Whether `capability` of `device_id` is within the scope.
    pub fn covers(&self, device_id: &str, capability: &str) -> bool {
        match self {
            AgentScope::AllDevices => true,
            AgentScope::Devices(devices) => match devices.get(device_id) {
                Some(CapabilityScope::All) => true,
                Some(CapabilityScope::Only(names)) => names.contains(capability),
                None => false,
            },
        }
    }
}

/// An agent as the directory lists it: never its credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    /// Its id (its name).
    pub id: AgentId,
    /// What it may see.
    pub scope: AgentScope,
    /// What it may do.
    pub role: AgentRole,
    /// When it was added, in milliseconds since the Unix epoch.
    pub added_at_ms: u64,
}

impl Agent {
    /// Whether this agent may see and call `capability` of `device_id`,
    /// given whether that capability only reads.
    pub fn may_use(&self, device_id: &str, capability: &str, read_only: bool) -> bool {
        (read_only || may_act(self.role)) && self.scope.covers(device_id, capability)
    }
}

impl crate::adapter::AgentGate for AgentDirectory {
    fn may_call(
        &self,
        agent_id: &str,
        device_id: &str,
        capability: &str,
        read_only: bool,
    ) -> Option<bool> {
        self.get(agent_id)
            .map(|agent| agent.may_use(device_id, capability, read_only))
    }
}

/// The record a store keeps of `agent` whose credential hashes to `hash`.
fn stored_of(agent: &Agent, hash: &[u8; 32]) -> StoredAgent {
    StoredAgent {
        id: agent.id.clone(),
        scope: serde_json::to_value(&agent.scope).unwrap_or(Value::Null),
        role: agent.role.as_str().to_owned(),
        added_at_ms: agent.added_at_ms,
        credential_sha256: dk_files::hex::encode(hash),
    }
}

/// The agent and credential hash of a store's record.
fn agent_of(stored: StoredAgent) -> Result<(Agent, [u8; 32]), AgentError> {
    let malformed = || {
        AgentError::Store(StoreError::Corrupt(format!(
            "the record of agent `{}` holds a scope or role this vessel does not know",
            stored.id
        )))
    };
    let scope: AgentScope =
        serde_json::from_value(stored.scope.clone()).map_err(|_| malformed())?;
    let role = AgentRole::parse(&stored.role).ok_or_else(malformed)?;
    let hash = dk_files::hex::decode32(&stored.credential_sha256)
        .ok_or_else(|| AgentError::BadHash(stored.id.clone()))?;
    let agent = Agent {
        id: stored.id,
        scope,
        role,
        added_at_ms: stored.added_at_ms,
    };
    Ok((agent, hash))
}

/// An agent's bearer credential: `dka_` and 64 lower-case hex characters
/// from a CSPRNG. Shown to the person once; `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentCredential(String);

impl fmt::Debug for AgentCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentCredential(..)")
    }
}

impl AgentCredential {
    fn generate() -> AgentCredential {
        let mut bytes = [0u8; 32];
        rand::rng().fill(&mut bytes);
        let mut text = String::with_capacity(AGENT_CREDENTIAL_PREFIX.len() + 64);
        text.push_str(AGENT_CREDENTIAL_PREFIX);
        text.push_str(&dk_files::hex::encode(&bytes));
        AgentCredential(text)
    }

    /// The credential text, to hand to the agent's configuration once.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// A change in the directory, for connected sessions whose tool list may
/// change with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEvent {
    /// An agent was added.
    Added {
        /// Its id.
        id: AgentId,
    },
    /// An agent was removed: its credential no longer works.
    Removed {
        /// Its id.
        id: AgentId,
    },
    /// An agent's scope changed.
    ScopeChanged {
        /// Its id.
        id: AgentId,
    },
}

/// Why the directory refused a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The name breaks the naming rule.
    #[error(
        "agent name `{0}` must be 1 to 32 lower-case letters, digits and single `-` between them"
    )]
    BadName(String),
    /// An agent with that name exists.
    #[error("an agent named `{0}` exists already")]
    Exists(String),
    /// No agent with that id.
    #[error("no agent named `{0}`")]
    NotFound(String),
    /// A stored hash is not 64 hex characters.
    #[error("the stored credential hash of agent `{0}` is malformed")]
    BadHash(String),
    /// The store refused or failed the change; nothing changed.
    #[error("the change could not be stored: {0}")]
    Store(#[source] StoreError),
}

/// Receives an audit entry (`kind`, entry) for every change.
pub type AgentAuditHook = Arc<dyn Fn(&str, Value) + Send + Sync>;

/// Withdraws what an agent has waiting for the person once it is removed
/// (`None`) or re-scoped (its new self): set by the vessel, so a change
/// made through the directory itself does what the vessel's own methods do.
pub(crate) type WithdrawHook = Arc<dyn Fn(&str, Option<&Agent>) + Send + Sync>;

struct Entry {
    agent: Agent,
    hash: [u8; 32],
}

/// The agents the person has added.
pub struct AgentDirectory {
    agents: RwLock<BTreeMap<AgentId, Entry>>,
    events: broadcast::Sender<AgentEvent>,
    audit: Option<AgentAuditHook>,
    store: Option<Arc<dyn Store>>,
    /// The person's remembered allowances: an agent's go when it is
    /// removed, and those its new scope leaves out when it is re-scoped.
    allowances: Option<Arc<Allowances>>,
    /// The vessel's withdrawal of waiting approvals, once it is built.
    withdraw: OnceLock<WithdrawHook>,
    /// Told after every change made here (not one read again with
    /// [`AgentDirectory::reload`]): a fleet tells its other members.
    on_change: OnceLock<Arc<dyn Fn() + Send + Sync>>,
    /// Audit entries the store committed with this directory's changes.
    audited: AtomicU64,
}

impl fmt::Debug for AgentDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentDirectory")
            .field("agents", &self.read().len())
            .finish_non_exhaustive()
    }
}

impl Default for AgentDirectory {
    fn default() -> Self {
        AgentDirectory::new()
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_AGENT_NAME
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn now_ms() -> u64 {
    dk_store::epoch_ms(SystemTime::now())
}

impl AgentDirectory {
    /// An empty directory.
    pub fn new() -> AgentDirectory {
        AgentDirectory {
            agents: RwLock::new(BTreeMap::new()),
            events: broadcast::channel(256).0,
            audit: None,
            store: None,
            allowances: None,
            withdraw: OnceLock::new(),
            on_change: OnceLock::new(),
            audited: AtomicU64::new(0),
        }
    }

    /// A directory holding `stored` agents (as a store gave them back).
    pub fn from_stored(
        stored: impl IntoIterator<Item = StoredAgent>,
    ) -> Result<AgentDirectory, AgentError> {
        let directory = AgentDirectory::new();
        {
            let mut agents = directory.write();
            for s in stored {
                let (agent, hash) = agent_of(s)?;
                agents.insert(agent.id.clone(), Entry { agent, hash });
            }
        }
        Ok(directory)
    }

    /// Sends an `agent` audit entry for every add, remove and scope change
    /// (never a credential). `vessel.audit` is the usual hook.
    pub fn with_audit(mut self, hook: AgentAuditHook) -> AgentDirectory {
        self.audit = Some(hook);
        self
    }

    /// Commits every add, remove and scope change to `store`, with its
    /// `agent` audit entry in the same transaction, before it takes effect.
    /// The audit hook of [`AgentDirectory::with_audit`] is then not called:
    /// the store's transaction records the entry.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> AgentDirectory {
        self.store = Some(store);
        self
    }

    /// Revokes an agent's remembered allowances in `allowances` when it is
    /// removed, and those its new scope leaves out when it is re-scoped.
    pub(crate) fn with_allowances(mut self, allowances: Arc<Allowances>) -> AgentDirectory {
        self.allowances = Some(allowances);
        self
    }

    /// Calls `hook` after every removal and scope change (the first hook
    /// set stays).
    pub(crate) fn set_withdraw(&self, hook: WithdrawHook) {
        let _ = self.withdraw.set(hook);
    }

    /// Whether `presented` is the credential of an agent in the directory.
    pub(crate) fn is_credential(&self, presented: &str) -> bool {
        self.authenticate(presented).is_some()
    }

    /// Stores `stored` (or, with `stored` `None`, removes `id`) with its
    /// audit entry, when the directory has a store.
    fn commit(
        &self,
        id: &str,
        stored: Option<&StoredAgent>,
        entry: &schema::Entry,
    ) -> Result<(), AgentError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let audit = AuditEvent::of(entry, now_ms());
        match stored {
            Some(stored) => store.put_agent(stored, &audit),
            None => store.delete_agent(id, &audit),
        }
        .map_err(AgentError::Store)?;
        self.audited.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How many `agent` audit entries the store committed with this
    /// directory's changes, in the change's own transaction (with a store;
    /// without one, they go to the audit hook).
    pub fn changes_audited(&self) -> u64 {
        self.audited.load(Ordering::Relaxed)
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<AgentId, Entry>> {
        self.agents.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<AgentId, Entry>> {
        self.agents.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, event: AgentEvent, entry: &schema::Entry) {
        if let (Some(hook), None) = (&self.audit, &self.store) {
            hook(entry.kind(), entry.to_value());
        }
        // No subscriber is fine: nobody is connected.
        let _ = self.events.send(event);
        if let Some(hook) = self.on_change.get() {
            hook();
        }
    }

    /// Calls `hook` after every add, removal and scope change made through
    /// this directory, never for what [`AgentDirectory::reload`] reads
    /// (the first hook set stays): the vessels of a fleet tell each other
    /// to read their agents again this way.
    pub fn on_change(&self, hook: Arc<dyn Fn() + Send + Sync>) {
        let _ = self.on_change.set(hook);
    }

    /// Makes the directory hold exactly `stored` (as a store shared with
    /// other vessels gives them back now): an agent gone is removed (its
    /// allowances dropped, its waiting approvals withdrawn), one re-scoped
    /// takes its new scope the same way, a new one is added; each with the
    /// event a change made here sends. A record this vessel cannot read
    /// refuses the whole reload, changing nothing.
    pub fn reload(&self, stored: impl IntoIterator<Item = StoredAgent>) -> Result<(), AgentError> {
        let mut next = BTreeMap::new();
        for s in stored {
            let (agent, hash) = agent_of(s)?;
            next.insert(agent.id.clone(), Entry { agent, hash });
        }
        let mut events = Vec::new();
        let mut removed = Vec::new();
        let mut rescoped = Vec::new();
        {
            let mut agents = self.write();
            for (id, old) in agents.iter() {
                match next.get(id) {
                    None => removed.push(id.clone()),
                    Some(new) if new.agent != old.agent || new.hash != old.hash => {
                        rescoped.push(new.agent.clone());
                    }
                    Some(_) => {}
                }
            }
            for id in next.keys() {
                if !agents.contains_key(id) {
                    events.push(AgentEvent::Added { id: id.clone() });
                }
            }
            *agents = next;
        }
        for id in removed {
            if let Some(allowances) = &self.allowances {
                allowances.drop_agent(&id);
            }
            if let Some(withdraw) = self.withdraw.get() {
                withdraw(&id, None);
            }
            events.push(AgentEvent::Removed { id });
        }
        for agent in rescoped {
            if let Some(allowances) = &self.allowances {
                allowances.drop_agent_outside(&agent.id, |device, capability, read_only| {
                    agent.may_use(device, capability, read_only)
                });
            }
            if let Some(withdraw) = self.withdraw.get() {
                withdraw(&agent.id, Some(&agent));
            }
            events.push(AgentEvent::ScopeChanged {
                id: agent.id.clone(),
            });
        }
        for event in events {
            let _ = self.events.send(event);
        }
        Ok(())
    }

    /// Adds an agent; returns its id and its credential, which is not kept
    /// and cannot be shown again.
    pub fn add(
        &self,
        name: &str,
        scope: AgentScope,
        role: AgentRole,
    ) -> Result<(AgentId, AgentCredential), AgentError> {
        self.add_by(name, scope, role, None)
    }

    /// Adds an agent as [`AgentDirectory::add`] does; the audit entry names
    /// `by`.
    pub fn add_by(
        &self,
        name: &str,
        scope: AgentScope,
        role: AgentRole,
        by: Option<&By>,
    ) -> Result<(AgentId, AgentCredential), AgentError> {
        if !valid_name(name) {
            return Err(AgentError::BadName(name.to_owned()));
        }
        let credential = AgentCredential::generate();
        let agent = Agent {
            id: name.to_owned(),
            scope,
            role,
            added_at_ms: now_ms(),
        };
        let entry = schema::Entry::Agent(schema::AgentChange::Added {
            agent: schema::AgentRecord {
                id: agent.id.clone(),
                scope: serde_json::to_value(&agent.scope).unwrap_or(Value::Null),
                role: Value::from(agent.role.as_str()),
                added_at_ms: agent.added_at_ms,
            },
            by: by.cloned(),
        });
        {
            let mut agents = self.write();
            if agents.contains_key(name) {
                return Err(AgentError::Exists(name.to_owned()));
            }
            let hash = sha256(credential.expose());
            let stored = stored_of(&agent, &hash);
            self.commit(name, Some(&stored), &entry)?;
            agents.insert(name.to_owned(), Entry { agent, hash });
        }
        self.changed(
            AgentEvent::Added {
                id: name.to_owned(),
            },
            &entry,
        );
        Ok((name.to_owned(), credential))
    }

    /// The agent whose credential is `presented`, if any. Every stored hash
    /// is compared in constant time, so the time taken says nothing about
    /// which agent, or how much of a hash, matched.
    pub fn authenticate(&self, presented: &str) -> Option<Agent> {
        let presented = sha256(presented);
        let agents = self.read();
        let mut found = None;
        for entry in agents.values() {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(entry.agent.clone());
            }
        }
        found
    }

    /// The agent with this id.
    pub fn get(&self, id: &str) -> Option<Agent> {
        self.read().get(id).map(|e| e.agent.clone())
    }

    /// Every agent, sorted by id.
    pub fn list(&self) -> Vec<Agent> {
        self.read().values().map(|e| e.agent.clone()).collect()
    }

    /// What a store keeps: every agent with its credential's hash.
    pub fn stored(&self) -> Vec<StoredAgent> {
        self.read()
            .values()
            .map(|e| stored_of(&e.agent, &e.hash))
            .collect()
    }

    /// Removes an agent: its credential stops working on its next request.
    pub fn remove(&self, id: &str) -> Result<(), AgentError> {
        self.remove_by(id, None)
    }

    /// Removes an agent as [`AgentDirectory::remove`] does; the audit entry
    /// names `by`.
    pub fn remove_by(&self, id: &str, by: Option<&By>) -> Result<(), AgentError> {
        let entry = schema::Entry::Agent(schema::AgentChange::Removed {
            agent_id: id.to_owned(),
            by: by.cloned(),
        });
        {
            let mut agents = self.write();
            if !agents.contains_key(id) {
                return Err(AgentError::NotFound(id.to_owned()));
            }
            self.commit(id, None, &entry)?;
            agents.remove(id);
        }
        if let Some(allowances) = &self.allowances {
            allowances.drop_agent(id);
        }
        if let Some(withdraw) = self.withdraw.get() {
            withdraw(id, None);
        }
        self.changed(AgentEvent::Removed { id: id.to_owned() }, &entry);
        Ok(())
    }

    /// Replaces an agent's scope; connected sessions see it on their next
    /// request and are told when their tool list changed.
    pub fn set_scope(&self, id: &str, scope: AgentScope) -> Result<(), AgentError> {
        self.set_scope_by(id, scope, None)
    }

    /// Replaces an agent's scope as [`AgentDirectory::set_scope`] does; the
    /// audit entry names `by`.
    pub fn set_scope_by(
        &self,
        id: &str,
        scope: AgentScope,
        by: Option<&By>,
    ) -> Result<(), AgentError> {
        let entry = schema::Entry::Agent(schema::AgentChange::Scope {
            agent_id: id.to_owned(),
            scope: serde_json::to_value(&scope).unwrap_or(Value::Null),
            by: by.cloned(),
        });
        let rescoped = {
            let mut agents = self.write();
            let agent = agents
                .get_mut(id)
                .ok_or_else(|| AgentError::NotFound(id.to_owned()))?;
            let mut next = agent.agent.clone();
            next.scope = scope;
            self.commit(id, Some(&stored_of(&next, &agent.hash)), &entry)?;
            agent.agent = next;
            agent.agent.clone()
        };
        if let Some(allowances) = &self.allowances {
            allowances.drop_agent_outside(id, |device, capability, read_only| {
                rescoped.may_use(device, capability, read_only)
            });
        }
        if let Some(withdraw) = self.withdraw.get() {
            withdraw(id, Some(&rescoped));
        }
        self.changed(AgentEvent::ScopeChanged { id: id.to_owned() }, &entry);
        Ok(())
    }

    /// Changes from now on (a slow subscriber misses some and should read
    /// the state again).
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.events.subscribe()
    }

    /// How many subscribers there are now (each connected MCP session has one).
    pub fn subscribers(&self) -> usize {
        self.events.receiver_count()
    }
}

#[cfg(test)]
mod tests;
