//! Remembered allowances: a yes the person gave for a while, so that the
//! same agent is not asked again and again.
//!
//! When a rule or a capability's `confirm` asks the person about an agent's
//! call, the person may answer: this call once; this agent, this tool, with
//! exactly these arguments, for N minutes; this agent, this capability, for
//! N minutes; or no. A remembered allowance is bound to the agent, the tool
//! (the device and capability), the device's pairing generation and, for
//! "exactly these arguments", the SHA-256 of the arguments' canonical JSON
//! (keys sorted, no white space, numbers as serde_json prints them).
//!
//! It only ever answers a question: a call a rule blocks, or that is not
//! granted, is refused before any allowance is looked at. It ends when its
//! minutes are up (against the vessel's clock, [`Allowances::set_clock`]),
//! and is revoked at once when the person revokes the capability, unpairs
//! or re-pairs the device, removes the agent or re-scopes it away from the
//! tool, or revokes it by its id. At most [`MAX_ALLOWANCES`] live at once.
//! They are kept in memory only: a restart forgets them all (which errs on
//! the safe side: the person is asked again).
//!
//! Creations and revocations are audit entries of their own
//! (`allowance-created`, `allowance-revoked`); every call an allowance lets
//! through says so in its decision (`"person": "remembered"` and the
//! allowance's id).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

pub use dk_proto::admin::{Allowance, AllowanceScope};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::hook::Hook;
use crate::store::canonical_json;
use crate::store::entry as schema;

/// Most allowances live at once; past it a new one is refused (the call may
/// still be allowed once).
pub const MAX_ALLOWANCES: usize = 256;

/// Fewest minutes an allowance lasts.
pub const MIN_ALLOWANCE_MINUTES: u32 = 1;

/// Most minutes an allowance lasts (a day).
pub const MAX_ALLOWANCE_MINUTES: u32 = 1440;

/// Minutes an allowance lasts when the person names none.
pub const DEFAULT_ALLOWANCE_MINUTES: u32 = 15;

/// Longest text of the arguments an allowance keeps to show the person
/// (the hash binds them whole).
const SHOWN_ARGUMENTS: usize = 512;

/// How many devices, capabilities and agents the allowances remember a
/// change of (for answers given while one changed); past it every answer
/// asked before the last change is refused as changed.
const TRACKED_CHANGES: usize = 1024;

/// How long an allowance lasts: [`MIN_ALLOWANCE_MINUTES`] to
/// [`MAX_ALLOWANCE_MINUTES`] minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowanceMinutes(u32);

impl AllowanceMinutes {
    /// `minutes`, when within the bounds.
    pub fn new(minutes: u64) -> Result<AllowanceMinutes, AllowanceError> {
        u32::try_from(minutes)
            .ok()
            .filter(|m| (MIN_ALLOWANCE_MINUTES..=MAX_ALLOWANCE_MINUTES).contains(m))
            .map(AllowanceMinutes)
            .ok_or(AllowanceError::BadMinutes(minutes))
    }

    /// The minutes.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for AllowanceMinutes {
    fn default() -> Self {
        AllowanceMinutes(DEFAULT_ALLOWANCE_MINUTES)
    }
}

/// A yes to remember: what it covers and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remember {
    /// What it covers.
    pub scope: AllowanceScope,
    /// How long.
    pub minutes: AllowanceMinutes,
}

/// Why an allowance was not made, or not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllowanceError {
    /// The minutes are out of bounds.
    #[error("an allowance lasts 1 to 1440 minutes, not {0}")]
    BadMinutes(u64),
    /// [`MAX_ALLOWANCES`] are live.
    #[error(
        "{0} allowances are remembered already: revoke one (`dk approvals remembered revoke ID`) or allow this call once"
    )]
    Full(usize),
    /// The device, the grant or the agent changed while the person was
    /// asked: what the person would allow is not what is there now.
    #[error(
        "the device, its grant or the agent changed while you were asked: this call can be allowed once or refused, not remembered"
    )]
    Changed,
    /// No live allowance has that id.
    #[error("no remembered allowance {0}")]
    NotFound(u64),
}

/// A live allowance: what front ends list, and what binds it that they
/// do not show.
#[derive(Debug, Clone)]
struct Live {
    /// As front ends list it.
    shown: Allowance,
    /// The device's pairing generation it is bound to.
    generation: u64,
    /// Whether the capability only reads (for a re-scoped agent).
    read_only: bool,
    /// For a copy of another fleet member's allowance: that member and the
    /// allowance's id there. Its making and its end are that member's to
    /// record.
    origin: Option<(String, u64)>,
}

/// An allowance made, or revoked by the person, on this vessel: what a
/// fleet's other members are told (see [`Allowances::share_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowanceChange {
    /// The person remembered a yes here.
    Made {
        /// The allowance, as listed here.
        allowance: Allowance,
        /// The device's pairing generation it is bound to.
        generation: u64,
        /// Whether the capability only reads.
        read_only: bool,
    },
    /// The person revoked an allowance here: `origin` names the member
    /// that made it and its id there, when it is a copy; `None` when it
    /// was made here (then `id` is its id here).
    Revoked {
        /// The member that made it and its id there, for a copy.
        origin: Option<(String, u64)>,
        /// Its id here.
        id: u64,
    },
}

/// Told of every [`AllowanceChange`].
pub type AllowanceShare = Arc<dyn Fn(AllowanceChange) + Send + Sync>;

/// Why an allowance ended before its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RevokeCause {
    /// The person revoked it by its id.
    ByPerson,
    /// The person revoked the capability.
    CapabilityRevoked,
    /// The device was unpaired.
    Unpaired,
    /// The device was paired again: the grant is a new one.
    PairedAgain,
    /// The agent was removed.
    AgentRemoved,
    /// The agent's new scope leaves the tool out.
    AgentRescoped,
}

impl RevokeCause {
    fn as_str(self) -> &'static str {
        match self {
            RevokeCause::ByPerson => "revoked by the person",
            RevokeCause::CapabilityRevoked => "the capability was revoked",
            RevokeCause::Unpaired => "the device was unpaired",
            RevokeCause::PairedAgain => "the device was paired again",
            RevokeCause::AgentRemoved => "the agent was removed",
            RevokeCause::AgentRescoped => "the agent's scope no longer covers the tool",
        }
    }
}

/// The time allowances are measured against: milliseconds since the Unix
/// epoch.
pub type AllowanceClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Receives an audit entry (`kind`, entry) for every allowance made or
/// revoked.
pub(crate) type AllowanceAuditHook = Arc<AuditSink>;

/// What [`AllowanceAuditHook`] calls: the entry's kind and its details.
type AuditSink = dyn Fn(&str, Value) + Send + Sync;

/// What changed last, so an answer given meanwhile is not remembered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Changed {
    Device(String),
    Capability(String, String),
    Agent(String),
}

struct Inner {
    live: BTreeMap<u64, Live>,
    next_id: u64,
    /// Counts changes; an offer keeps the count it was made at.
    stamp: u64,
    /// The count at each thing's last change.
    changed: HashMap<Changed, u64>,
    /// Offers made before this count are refused (`changed` was cleared).
    floor: u64,
}

impl Inner {
    fn bump(&mut self, what: Changed) {
        self.stamp += 1;
        if self.changed.len() >= TRACKED_CHANGES {
            self.changed.clear();
            self.floor = self.stamp;
        }
        self.changed.insert(what, self.stamp);
    }

    fn changed_since(&self, what: &Changed, stamp: u64) -> bool {
        self.changed.get(what).is_some_and(|at| *at > stamp)
    }

    fn prune(&mut self, now: u64) {
        self.live.retain(|_, a| a.shown.expires_at_ms > now);
    }
}

/// The live allowances of a vessel (one per registry).
pub struct Allowances {
    inner: Mutex<Inner>,
    clock: RwLock<AllowanceClock>,
    audit: Hook<AuditSink>,
    /// Told of allowances made and revoked here, in a fleet.
    share: Hook<dyn Fn(AllowanceChange) + Send + Sync>,
}

impl fmt::Debug for Allowances {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allowances")
            .field("live", &self.lock().live.len())
            .finish_non_exhaustive()
    }
}

impl Default for Allowances {
    fn default() -> Self {
        Allowances::new()
    }
}

fn system_clock() -> AllowanceClock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

/// The SHA-256 (hex) of the canonical JSON of `arguments`, and that JSON.
pub(crate) fn arguments_digest(arguments: &Map<String, Value>) -> (String, String) {
    let text = canonical_json(&Value::Object(arguments.clone()));
    (
        dk_files::hex::encode(&Sha256::digest(text.as_bytes())),
        text,
    )
}

/// `text` cut to at most `max` bytes on a character boundary, saying so.
fn shown(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} bytes more)",
        text.get(..end).unwrap_or_default(),
        text.len() - end
    )
}

impl Allowances {
    /// None yet, on the system clock.
    pub fn new() -> Allowances {
        Allowances {
            inner: Mutex::new(Inner {
                live: BTreeMap::new(),
                next_id: 1,
                stamp: 0,
                changed: HashMap::new(),
                floor: 0,
            }),
            clock: RwLock::new(system_clock()),
            audit: Hook::default(),
            share: Hook::default(),
        }
    }

    /// Tells `share` of every allowance the person makes here and every
    /// one they revoke here (a fleet's other members keep copies).
    pub fn share_with(&self, share: AllowanceShare) {
        self.share.set(share);
    }

    fn shared(&self, change: AllowanceChange) {
        if let Some(share) = self.share.get() {
            share(change);
        }
    }

    /// Keeps a copy of `allowance`, made by the fleet member `member` (its
    /// id there is `allowance.id`), under an id of this vessel's: it covers
    /// calls decided here as it does there, until it expires, its grant,
    /// device or agent changes, or the person revokes it anywhere. Nothing
    /// is recorded: the member that made it did. Returns its id here, or
    /// `None` when [`MAX_ALLOWANCES`] are live.
    pub fn adopt(
        &self,
        member: &str,
        allowance: Allowance,
        generation: u64,
        read_only: bool,
    ) -> Option<u64> {
        let now = self.now();
        let mut inner = self.lock();
        inner.prune(now);
        if inner.live.len() >= MAX_ALLOWANCES {
            return None;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let origin = Some((member.to_owned(), allowance.id));
        let shown = Allowance { id, ..allowance };
        inner.live.insert(
            id,
            Live {
                shown,
                generation,
                read_only,
                origin,
            },
        );
        Some(id)
    }

    /// Ends the allowance `id` that fleet member `member` made (its id
    /// there), revoked by the person anywhere: the copy here, or, when
    /// `member` is this vessel (`here`), the allowance itself, recorded as
    /// revoked by the person.
    pub fn forget(&self, here: &str, member: &str, id: u64) {
        if member == here {
            let gone = self.lock().live.remove(&id).map(|a| a.shown);
            if let Some(gone) = gone {
                self.announce_revoked(std::slice::from_ref(&gone), RevokeCause::ByPerson);
            }
            return;
        }
        self.lock().live.retain(|_, a| {
            a.origin
                .as_ref()
                .is_none_or(|(m, origin_id)| m != member || *origin_id != id)
        });
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        let clock = Arc::clone(&self.clock.read().unwrap_or_else(PoisonError::into_inner));
        clock()
    }

    /// Measures expiry against `clock` (milliseconds since the epoch) from
    /// now on.
    pub fn set_clock(&self, clock: AllowanceClock) {
        *self.clock.write().unwrap_or_else(PoisonError::into_inner) = clock;
    }

    /// Sends an audit entry for every allowance made or revoked to `hook`.
    pub(crate) fn set_audit_hook(&self, hook: AllowanceAuditHook) {
        self.audit.set(hook);
    }

    fn audit(&self, entry: &schema::Entry) {
        if let Some(hook) = self.audit.get() {
            hook(entry.kind(), entry.to_value());
        }
    }

    /// The live allowances, oldest first.
    pub fn list(&self) -> Vec<Allowance> {
        let now = self.now();
        let mut inner = self.lock();
        inner.prune(now);
        inner.live.values().map(|a| a.shown.clone()).collect()
    }

    /// The live allowance `id`, if any.
    pub fn get(&self, id: u64) -> Option<Allowance> {
        let now = self.now();
        self.lock()
            .live
            .get(&id)
            .filter(|a| a.shown.expires_at_ms > now)
            .map(|a| a.shown.clone())
    }

    /// Revokes allowance `id` (the person's own revocation).
    pub fn revoke(&self, id: u64) -> Result<Allowance, AllowanceError> {
        let now = self.now();
        let gone = {
            let mut inner = self.lock();
            inner.prune(now);
            inner.live.remove(&id).ok_or(AllowanceError::NotFound(id))?
        };
        match gone.origin {
            // A copy: the member that made it records its end.
            Some(origin) => self.shared(AllowanceChange::Revoked {
                origin: Some(origin),
                id,
            }),
            None => {
                self.announce_revoked(std::slice::from_ref(&gone.shown), RevokeCause::ByPerson);
                self.shared(AllowanceChange::Revoked { origin: None, id });
            }
        }
        Ok(gone.shown)
    }

    /// The live allowance that covers `agent_id` calling `tool` (on the
    /// pairing of `generation`) with `arguments`, counting the use: one for
    /// these exact arguments before one for the whole capability.
    pub(crate) fn covering(
        &self,
        agent_id: &str,
        tool: &str,
        generation: u64,
        arguments: &Map<String, Value>,
    ) -> Option<u64> {
        let now = self.now();
        let mut inner = self.lock();
        let applies = |a: &Live| {
            a.shown.agent_id == agent_id
                && a.shown.tool == tool
                && a.generation == generation
                && a.shown.expires_at_ms > now
        };
        let mut by_capability = None;
        let mut by_arguments = Vec::new();
        for Live {
            shown: allowance, ..
        } in inner.live.values().filter(|a| applies(a))
        {
            match allowance.scope {
                AllowanceScope::Capability => by_capability = by_capability.or(Some(allowance.id)),
                AllowanceScope::Arguments => by_arguments.push(allowance.id),
            }
        }
        let exact = if by_arguments.is_empty() {
            None
        } else {
            let (digest, _) = arguments_digest(arguments);
            by_arguments.into_iter().find(|id| {
                inner
                    .live
                    .get(id)
                    .and_then(|a| a.shown.arguments_sha256.as_deref())
                    == Some(digest.as_str())
            })
        };
        let id = exact.or(by_capability)?;
        if let Some(allowance) = inner.live.get_mut(&id) {
            allowance.shown.uses += 1;
        }
        Some(id)
    }

    /// The count of changes so far, for an offer: taken before the asker
    /// reads again that the call may still be made, so that any change from
    /// then on refuses the offer.
    pub(crate) fn stamp(&self) -> u64 {
        self.lock().stamp
    }

    /// An offer to remember a yes to `call`, as of `stamp`.
    pub(crate) fn offer(self: &Arc<Self>, stamp: u64, call: OfferedCall<'_>) -> AllowanceOffer {
        let (arguments_sha256, arguments) = arguments_digest(call.arguments);
        AllowanceOffer {
            allowances: Arc::clone(self),
            stamp,
            agent_id: call.agent_id.to_owned(),
            tool: call.tool.to_owned(),
            device_id: call.device_id.to_owned(),
            capability: call.capability.to_owned(),
            generation: call.generation,
            read_only: call.read_only,
            arguments_sha256,
            arguments: shown(&arguments, SHOWN_ARGUMENTS),
        }
    }

    fn drop_where(
        &self,
        what: Changed,
        cause: RevokeCause,
        matches: impl Fn(&Live) -> bool,
    ) -> usize {
        let gone: Vec<Allowance> = {
            let mut inner = self.lock();
            inner.bump(what);
            let ids: Vec<u64> = inner
                .live
                .values()
                .filter(|a| matches(a))
                .map(|a| a.shown.id)
                .collect();
            ids.iter()
                .filter_map(|id| inner.live.remove(id))
                // A copy's end is recorded by the member that made it,
                // which sees the same change.
                .filter(|a| a.origin.is_none())
                .map(|a| a.shown)
                .collect()
        };
        self.announce_revoked(&gone, cause);
        gone.len()
    }

    /// Revokes every allowance for `capability` of `device_id` (the
    /// capability was revoked). Returns how many.
    pub(crate) fn drop_capability(&self, device_id: &str, capability: &str) -> usize {
        self.drop_where(
            Changed::Capability(device_id.to_owned(), capability.to_owned()),
            RevokeCause::CapabilityRevoked,
            |a| a.shown.device_id == device_id && a.shown.capability == capability,
        )
    }

    /// Revokes every allowance for `device_id` (unpaired, or paired again).
    pub(crate) fn drop_device(&self, device_id: &str, cause: RevokeCause) -> usize {
        self.drop_where(Changed::Device(device_id.to_owned()), cause, |a| {
            a.shown.device_id == device_id
        })
    }

    /// Revokes every allowance of `agent_id` (removed).
    pub(crate) fn drop_agent(&self, agent_id: &str) -> usize {
        self.drop_where(
            Changed::Agent(agent_id.to_owned()),
            RevokeCause::AgentRemoved,
            |a| a.shown.agent_id == agent_id,
        )
    }

    /// Revokes the allowances of `agent_id` whose tool `still_covered` (given
    /// device, capability and whether it only reads) says its new scope
    /// leaves out.
    pub(crate) fn drop_agent_outside(
        &self,
        agent_id: &str,
        still_covered: impl Fn(&str, &str, bool) -> bool,
    ) -> usize {
        self.drop_where(
            Changed::Agent(agent_id.to_owned()),
            RevokeCause::AgentRescoped,
            |a| {
                a.shown.agent_id == agent_id
                    && !still_covered(&a.shown.device_id, &a.shown.capability, a.read_only)
            },
        )
    }

    fn announce_revoked(&self, gone: &[Allowance], cause: RevokeCause) {
        for allowance in gone {
            self.audit(&schema::Entry::AllowanceRevoked(schema::AllowanceRevoked {
                id: allowance.id,
                agent_id: allowance.agent_id.clone(),
                tool: allowance.tool.clone(),
                device_id: allowance.device_id.clone(),
                capability: allowance.capability.clone(),
                scope: allowance.scope.as_str().to_owned(),
                uses: allowance.uses,
                why: cause.as_str().to_owned(),
            }));
        }
    }
}

/// The call an offer is for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OfferedCall<'a> {
    pub agent_id: &'a str,
    pub tool: &'a str,
    pub device_id: &'a str,
    pub capability: &'a str,
    pub generation: u64,
    pub read_only: bool,
    pub arguments: &'a Map<String, Value>,
}

/// What the person may choose to remember for one call waiting for a yes:
/// made by the adapter, accepted (at most once) by the person channel.
pub struct AllowanceOffer {
    allowances: Arc<Allowances>,
    stamp: u64,
    agent_id: String,
    tool: String,
    device_id: String,
    capability: String,
    generation: u64,
    read_only: bool,
    arguments_sha256: String,
    arguments: String,
}

impl fmt::Debug for AllowanceOffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllowanceOffer")
            .field("agent_id", &self.agent_id)
            .field("tool", &self.tool)
            .finish_non_exhaustive()
    }
}

impl AllowanceOffer {
    /// Makes the allowance `remember` says, unless the device, the
    /// capability or the agent changed since the offer was made, or
    /// [`MAX_ALLOWANCES`] are live. Not yet audited: see
    /// [`AllowanceOffer::announce`].
    pub(crate) fn accept(&self, remember: Remember) -> Result<Allowance, AllowanceError> {
        let now = self.allowances.now();
        let mut inner = self.allowances.lock();
        let changed = self.stamp < inner.floor
            || inner.changed_since(&Changed::Device(self.device_id.clone()), self.stamp)
            || inner.changed_since(
                &Changed::Capability(self.device_id.clone(), self.capability.clone()),
                self.stamp,
            )
            || inner.changed_since(&Changed::Agent(self.agent_id.clone()), self.stamp);
        if changed {
            return Err(AllowanceError::Changed);
        }
        inner.prune(now);
        if inner.live.len() >= MAX_ALLOWANCES {
            return Err(AllowanceError::Full(MAX_ALLOWANCES));
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let exact = remember.scope == AllowanceScope::Arguments;
        let allowance = Allowance {
            id,
            agent_id: self.agent_id.clone(),
            tool: self.tool.clone(),
            device_id: self.device_id.clone(),
            capability: self.capability.clone(),
            scope: remember.scope,
            arguments_sha256: exact.then(|| self.arguments_sha256.clone()),
            arguments: exact.then(|| self.arguments.clone()),
            created_at_ms: now,
            expires_at_ms: now.saturating_add(u64::from(remember.minutes.get()) * 60_000),
            uses: 0,
        };
        let live = Live {
            shown: allowance.clone(),
            generation: self.generation,
            read_only: self.read_only,
            origin: None,
        };
        inner.live.insert(id, live);
        Ok(allowance)
    }

    /// Records `allowance`, made by [`AllowanceOffer::accept`], in the audit
    /// log (outside any lock the person channel holds).
    pub(crate) fn announce(&self, allowance: &Allowance) {
        self.allowances.shared(AllowanceChange::Made {
            allowance: allowance.clone(),
            generation: self.generation,
            read_only: self.read_only,
        });
        let minutes = allowance
            .expires_at_ms
            .saturating_sub(allowance.created_at_ms)
            / 60_000;
        self.allowances
            .audit(&schema::Entry::AllowanceCreated(schema::AllowanceCreated {
                id: allowance.id,
                agent_id: allowance.agent_id.clone(),
                tool: allowance.tool.clone(),
                device_id: allowance.device_id.clone(),
                capability: allowance.capability.clone(),
                scope: allowance.scope.as_str().to_owned(),
                minutes,
                expires_at_ms: allowance.expires_at_ms,
                arguments_sha256: allowance.arguments_sha256.clone(),
            }));
    }
}

#[cfg(test)]
mod tests;
