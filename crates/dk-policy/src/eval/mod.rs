//! Compiled rules and the pure `evaluate`: shadow hard-deny, then block, require_approval, allow.
//!
//! Rules are indexed once at load: by action (plus `*`), then by decision
//! tier, then by the exact `deviceId` (or else `capability`) a rule requires
//! through a top-level conjunct `equals` / `in`, with the other rules in a
//! fallback list. Every list holds rule indices in file order, so the first
//! match of a tier is the smallest matching index over a handful of lists,
//! and rules that cannot apply to a device are never looked at.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::path::Path;
use std::time::SystemTime;

use serde_json::{Map, Value};

use crate::condition::{Context, Field, Fields, KnownField};
use crate::error::PolicyFileError;
use crate::lower;
use crate::rate::RateCounts;
use crate::rule::{DEVICE_USE, Rule, RuleDecision};
use crate::time::InstantError;
use crate::time::{LocalTime, Zone, ZoneError};

/// The agent id of a shadow (hedge) candidate: it may never use a device.
pub const SHADOW_AGENT_ID: &str = "__shadow__";

/// The reason a shadow agent's device call is refused with (fixed by the 8DK contract).
pub const SHADOW_DENY_REASON: &str = "[shadow-deny] shadow/hedge candidate (scope __shadow__) attempted side-effecting action \"device_use\". Shadow candidates run text/plan-only; only the chosen winner re-executes side effects under the normal policy path.";

/// The context of a `device_use` call: who asks, and for what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceUseContext<'a> {
    /// The calling agent, if the host says.
    pub agent_id: Option<&'a str>,
    /// The agent's session, if the host says.
    pub session_id: Option<&'a str>,
    /// The device's id.
    pub device_id: &'a str,
    /// The capability called.
    pub capability: &'a str,
    /// The capability's kind (`sensor`, `actuator`, ...).
    pub capability_kind: &'a str,
}

impl Context for DeviceUseContext<'_> {
    fn get(&self, field: &str) -> Option<&str> {
        match field {
            "deviceId" => Some(self.device_id),
            "capability" => Some(self.capability),
            "capabilityKind" => Some(self.capability_kind),
            "agentId" => self.agent_id,
            "sessionId" => self.session_id,
            _ => None,
        }
    }
}

impl Fields for DeviceUseContext<'_> {
    fn field(&self, field: &Field) -> &str {
        match field.known {
            KnownField::DeviceId => self.device_id,
            KnownField::Capability => self.capability,
            KnownField::CapabilityKind => self.capability_kind,
            KnownField::AgentId => self.agent_id.unwrap_or(""),
            KnownField::SessionId => self.session_id.unwrap_or(""),
            KnownField::Input | KnownField::Time | KnownField::Weekday | KnownField::Other => "",
        }
    }
}

/// A whole `device_use` call: who asks for what, with which input, when.
///
/// [`PolicySet::evaluate_call`] decides it, with every condition: `input.`
/// params read from `input`, `time` and `weekday` from `at` in the rules'
/// zone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Call<'a> {
    /// Who asks, and for what.
    pub device: DeviceUseContext<'a>,
    /// The call's input, when it is a JSON object (`None` otherwise: every
    /// `input.` clause is then false).
    pub input: Option<&'a Map<String, Value>>,
    /// When the call is made. The caller reads the clock; evaluation never does.
    pub at: SystemTime,
}

/// A call's fields, with its local time worked out on first use.
struct CallFields<'c> {
    call: &'c Call<'c>,
    zone: Option<&'c Zone>,
    local: OnceCell<Option<LocalTime>>,
}

impl Fields for CallFields<'_> {
    fn field(&self, field: &Field) -> &str {
        match field.known {
            KnownField::Weekday => self.local_time().map_or("", LocalTime::weekday_name),
            _ => self.call.device.field(field),
        }
    }

    fn input(&self, param: &str) -> Option<&Value> {
        self.call.input?.get(param)
    }

    fn local_time(&self) -> Option<LocalTime> {
        *self.local.get_or_init(|| {
            self.zone
                .and_then(|zone| LocalTime::of(self.call.at, &zone.zone))
        })
    }
}

/// What the rules say about one call.
///
/// Not `#[non_exhaustive]` on purpose: a new outcome must break every
/// caller's build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision<'p> {
    /// No block or require_approval rule matched. `rule` names the first
    /// matching allow rule, if any.
    Allow {
        /// The first matching allow rule's name.
        rule: Option<&'p str>,
    },
    /// A require_approval rule matched (and no block rule did).
    RequireApproval {
        /// The rule's name.
        rule: &'p str,
        /// `[<name>] <message>`.
        reason: &'p str,
    },
    /// A block rule matched, or the caller is a shadow agent.
    Block {
        /// The rule's name; `None` only for the shadow hard-deny.
        rule: Option<&'p str>,
        /// `[<name>] <message>`, or [`SHADOW_DENY_REASON`].
        reason: &'p str,
    },
}

impl<'p> Decision<'p> {
    /// Which kind of decision it is.
    pub fn kind(&self) -> RuleDecision {
        match self {
            Decision::Allow { .. } => RuleDecision::Allow,
            Decision::RequireApproval { .. } => RuleDecision::RequireApproval,
            Decision::Block { .. } => RuleDecision::Block,
        }
    }

    /// The deciding rule's name, if a rule decided.
    pub fn rule(&self) -> Option<&'p str> {
        match *self {
            Decision::Allow { rule } | Decision::Block { rule, .. } => rule,
            Decision::RequireApproval { rule, .. } => Some(rule),
        }
    }

    /// The reason, for block and require_approval.
    pub fn reason(&self) -> Option<&'p str> {
        match *self {
            Decision::Allow { .. } => None,
            Decision::RequireApproval { reason, .. } | Decision::Block { reason, .. } => {
                Some(reason)
            }
        }
    }

    /// True for `Allow`.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Hashes of the index are already keyed hashes: pass them through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type HashIndex = HashMap<u64, Vec<u32>, BuildHasherDefault<PassThrough>>;

#[derive(Default, Debug)]
struct TierIndex {
    by_device: HashIndex,
    by_capability: HashIndex,
    rest: Vec<u32>,
}

#[derive(Default, Debug)]
struct ActionIndex {
    /// Block, require_approval, allow.
    tiers: [TierIndex; 3],
}

impl ActionIndex {
    /// No rule at all for this action.
    fn is_empty(&self) -> bool {
        self.tiers
            .iter()
            .all(|t| t.by_device.is_empty() && t.by_capability.is_empty() && t.rest.is_empty())
    }

    /// Whether any rule is indexed by device, and by capability.
    fn keyed(&self) -> (bool, bool) {
        let device = self.tiers.iter().any(|t| !t.by_device.is_empty());
        let capability = self.tiers.iter().any(|t| !t.by_capability.is_empty());
        (device, capability)
    }
}

/// A compiled, immutable set of rules. `Send + Sync`; share it with an `Arc`.
#[derive(Debug)]
pub struct PolicySet {
    rules: Vec<Rule>,
    device_use: ActionIndex,
    any_action: ActionIndex,
    other_actions: HashMap<String, ActionIndex>,
    /// Rules with a `limit`, in file order: never in an index, each checked
    /// on its own (they are few), against the counts the host keeps.
    limited: Vec<u32>,
    hasher: RandomState,
    /// The file's `timezone:`, if it names one.
    file_zone: Option<Zone>,
    /// The zone `time` and `weekday` are read in when the file names none:
    /// the host's choice, else the system's, read at load only when some
    /// rule has a time condition.
    local_zone: Option<Zone>,
}

/// A decision, and the rules with a `limit` the call counts against if it
/// is made.
#[derive(Clone, Debug)]
pub struct Evaluation<'p> {
    /// What the rules say.
    pub decision: Decision<'p>,
    /// Every applicable rule with a `limit` whose condition holds and whose
    /// limit is not reached yet, in file order. When the call is made (the
    /// rules allowed it, or the person said yes), the host records one call
    /// against each.
    pub counted: Vec<&'p Rule>,
}

/// The hashes of the two indexed fields of one call.
#[derive(Clone, Copy)]
struct Keys {
    device: u64,
    capability: u64,
}

impl PolicySet {
    /// No rules: everything is allowed (except shadow agents' device calls).
    pub fn empty() -> PolicySet {
        PolicySet::from_rules(Vec::new())
    }

    /// Reads a rule file's text. Any error refuses the whole file, with every
    /// error reported.
    ///
    /// When a rule has a `time` or `weekday` condition and the file names
    /// no `timezone:`, the system's zone is read here (`TZ`, else
    /// `/etc/localtime`, else UTC); [`PolicySet::with_local_zone`] sets
    /// another.
    pub fn from_yaml_str(text: &str) -> Result<PolicySet, PolicyFileError> {
        crate::file::load_str(text).map(PolicySet::from_file)
    }

    /// Reads a rule file. Any error refuses the whole file, with every error
    /// reported; a file that cannot be read is an error too. The zone is
    /// read as for [`PolicySet::from_yaml_str`].
    pub fn load(path: &Path) -> Result<PolicySet, PolicyFileError> {
        crate::file::load_path(path).map(PolicySet::from_file)
    }

    /// The same rules, reading `time` and `weekday` in the zone `name` (an
    /// IANA name such as `Europe/Berlin`) when the file has no
    /// `timezone:`: the vessel's local zone, as the host knows it. A
    /// file's `timezone:` still wins.
    pub fn with_local_zone(mut self, name: &str) -> Result<PolicySet, ZoneError> {
        self.local_zone = Some(Zone::named(name)?);
        Ok(self)
    }

    /// The IANA name of the zone `time` and `weekday` conditions are read
    /// in, when they are read in a named zone (`None` also when no rule
    /// has a time condition and no zone was given).
    pub fn time_zone(&self) -> Option<&str> {
        self.zone().and_then(|zone| zone.name.as_deref())
    }

    /// Reads `text` as an instant, for tools that take a time from a person
    /// (`dk policy explain --at`): RFC 3339 with an offset or `Z`, or a
    /// local date and time (`2026-12-01T23:30:00`) read in the zone the
    /// rules read time in (the file's `timezone:`, else the local zone). A
    /// local time a DST change skips reads as the time after the gap; one it
    /// repeats, as its first occurrence. The error says how to write it.
    pub fn instant(&self, text: &str) -> Result<SystemTime, InstantError> {
        match self.zone() {
            Some(zone) => crate::time::parse_instant(text, &zone.zone),
            None => crate::time::parse_instant(text, &Zone::system().zone),
        }
    }

    fn zone(&self) -> Option<&Zone> {
        self.file_zone.as_ref().or(self.local_zone.as_ref())
    }

    fn from_file(file: crate::file::LoadedFile) -> PolicySet {
        let needs_time = file.rules.iter().any(|rule| rule.condition.reads_time());
        let mut set = PolicySet::from_rules(file.rules);
        set.file_zone = file.zone;
        if needs_time && set.file_zone.is_none() {
            set.local_zone = Some(Zone::system());
        }
        set
    }

    /// The checked rules, in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub(crate) fn from_rules(rules: Vec<Rule>) -> PolicySet {
        let mut set = PolicySet {
            rules: Vec::new(),
            device_use: ActionIndex::default(),
            any_action: ActionIndex::default(),
            other_actions: HashMap::new(),
            limited: Vec::new(),
            hasher: RandomState::new(),
            file_zone: None,
            local_zone: None,
        };
        for (position, rule) in rules.iter().enumerate() {
            let Ok(index) = u32::try_from(position) else {
                break;
            };
            if !rule.enabled {
                continue;
            }
            if rule.limit.is_some() {
                set.limited.push(index);
                continue;
            }
            let hasher = &set.hasher;
            let action = match rule.action.as_str() {
                DEVICE_USE => &mut set.device_use,
                "*" => &mut set.any_action,
                other => set.other_actions.entry(other.to_owned()).or_default(),
            };
            let Some(tier) = action.tiers.get_mut(rule.decision.tier()) else {
                continue;
            };
            let (list, values) = if let Some(values) =
                rule.condition.required_values(KnownField::DeviceId)
            {
                (&mut tier.by_device, values)
            } else if let Some(values) = rule.condition.required_values(KnownField::Capability) {
                (&mut tier.by_capability, values)
            } else {
                tier.rest.push(index);
                continue;
            };
            // An empty `in []` never matches: the rule needs no entry at all.
            for value in values {
                let bucket = list.entry(fold_hash(hasher, value)).or_default();
                if bucket.last() != Some(&index) {
                    bucket.push(index);
                }
            }
        }
        set.rules = rules;
        set
    }

    /// Decides a call of `action` with the fields of `ctx`.
    ///
    /// A context holds strings only: every `input.` clause and `time`
    /// window is false, and `weekday` reads the context's `weekday` key
    /// like any field.
    ///
    /// 1. A shadow agent (agentId exactly `__shadow__`) asking for
    ///    `device_use` is blocked; no rule lifts it.
    /// 2. Applicable rules: enabled, action equal or `*`, agentScope absent
    ///    or equal to the agentId.
    /// 3. The first matching block rule in file order, else the first
    ///    matching require_approval rule, else allow (naming the first
    ///    matching allow rule, if any).
    pub fn evaluate(&self, action: &str, ctx: &dyn Context) -> Decision<'_> {
        let agent_id = ctx.get("agentId");
        if action == DEVICE_USE && agent_id == Some(SHADOW_AGENT_ID) {
            return shadow_deny();
        }
        let exact = match action {
            DEVICE_USE => Some(&self.device_use),
            "*" => None,
            other => self.other_actions.get(other),
        };
        let keys = Keys {
            device: fold_hash(&self.hasher, ctx.get("deviceId").unwrap_or("")),
            capability: fold_hash(&self.hasher, ctx.get("capability").unwrap_or("")),
        };
        self.decide(
            [exact, Some(&self.any_action)],
            keys,
            agent_id,
            &ctx,
            NOT_REACHED,
        )
    }

    /// Decides a `device_use` call: the same as
    /// `evaluate(DEVICE_USE, ctx)`, without allocating.
    ///
    /// The context carries no input and no instant: every `input.` clause,
    /// `time` window and `weekday` clause is false (so `not (...)` of one is
    /// true). A host that has them calls [`PolicySet::evaluate_call`].
    pub fn evaluate_device_use(&self, ctx: &DeviceUseContext<'_>) -> Decision<'_> {
        self.decide_device_use(ctx, ctx, NOT_REACHED)
    }

    /// Decides a whole `device_use` call, with every condition: the same
    /// tiers as [`PolicySet::evaluate_device_use`], with `input.` clauses
    /// read from `call.input` and `time`/`weekday` from `call.at` in the
    /// file's `timezone:`, else the local zone. Allocation-free; no clock
    /// is read.
    pub fn evaluate_call(&self, call: &Call<'_>) -> Decision<'_> {
        let fields = CallFields {
            call,
            zone: self.zone(),
            local: OnceCell::new(),
        };
        self.decide_device_use(&call.device, &fields, NOT_REACHED)
    }

    /// Every applicable rule whose condition holds for `call`, in file
    /// order, whatever its decision: what `dk policy explain` shows for a
    /// whole call. (The shadow hard-deny is not a rule and is not listed.)
    pub fn matching_call_rules(&self, call: &Call<'_>) -> Vec<&Rule> {
        let fields = CallFields {
            call,
            zone: self.zone(),
            local: OnceCell::new(),
        };
        self.rules
            .iter()
            .filter(|rule| {
                rule.applies_to(DEVICE_USE, call.device.agent_id)
                    && rule.condition.matches_fields(&fields)
            })
            .collect()
    }

    fn decide_device_use<F: Fields + ?Sized>(
        &self,
        ctx: &DeviceUseContext<'_>,
        fields: &F,
        reached: [Option<u32>; 3],
    ) -> Decision<'_> {
        if ctx.agent_id == Some(SHADOW_AGENT_ID) {
            return shadow_deny();
        }
        if self.device_use.is_empty() && self.any_action.is_empty() && reached == NOT_REACHED {
            return Decision::Allow { rule: None };
        }
        // Hash only the fields some rule is indexed by (0 never finds a bucket
        // in an empty map).
        let (d1, c1) = self.device_use.keyed();
        let (d2, c2) = self.any_action.keyed();
        let keys = Keys {
            device: if d1 || d2 {
                fold_hash(&self.hasher, ctx.device_id)
            } else {
                0
            },
            capability: if c1 || c2 {
                fold_hash(&self.hasher, ctx.capability)
            } else {
                0
            },
        };
        self.decide(
            [Some(&self.device_use), Some(&self.any_action)],
            keys,
            ctx.agent_id,
            fields,
            reached,
        )
    }

    /// Decides a whole `device_use` call as [`PolicySet::evaluate_call`]
    /// does, weighing the rules with a `limit` too: such a rule decides
    /// (in its tier, in file order, as any rule) only once `counts` says
    /// the calling agent made its `N` calls matching it within the window
    /// before `call.at`; until then it is passed over, and listed in
    /// [`Evaluation::counted`]. (Every other entry point passes them over.)
    pub fn evaluate_call_counted(
        &self,
        call: &Call<'_>,
        counts: &dyn RateCounts,
    ) -> Evaluation<'_> {
        let ctx = &call.device;
        if ctx.agent_id == Some(SHADOW_AGENT_ID) {
            return Evaluation {
                decision: shadow_deny(),
                counted: Vec::new(),
            };
        }
        let fields = CallFields {
            call,
            zone: self.zone(),
            local: OnceCell::new(),
        };
        let mut reached = NOT_REACHED;
        let mut counted = Vec::new();
        for &index in &self.limited {
            let Some(rule) = self.rules.get(index as usize) else {
                continue;
            };
            let Some(limit) = rule.limit else {
                continue;
            };
            if !rule.applies_to(DEVICE_USE, ctx.agent_id) || !rule.condition.matches_fields(&fields)
            {
                continue;
            }
            let agent = ctx.agent_id.unwrap_or("");
            if counts.counted(&rule.name, agent, limit.window(), call.at) >= limit.calls() {
                if let Some(slot) = reached.get_mut(rule.decision.tier()) {
                    slot.get_or_insert(index);
                }
            } else {
                counted.push(rule);
            }
        }
        let decision = self.decide_device_use(ctx, &fields, reached);
        Evaluation { decision, counted }
    }

    /// Every applicable rule whose condition holds, in file order, whatever
    /// its decision: what `dk policy explain` shows. (The shadow hard-deny is
    /// not a rule and is not listed.)
    pub fn matching_rules(&self, action: &str, ctx: &dyn Context) -> Vec<&Rule> {
        let agent_id = ctx.get("agentId");
        self.rules
            .iter()
            .filter(|rule| rule.applies_to(action, agent_id) && rule.condition.matches(ctx))
            .collect()
    }

    fn decide<F: Fields + ?Sized>(
        &self,
        indexes: [Option<&ActionIndex>; 2],
        keys: Keys,
        agent_id: Option<&str>,
        fields: &F,
        reached: [Option<u32>; 3],
    ) -> Decision<'_> {
        let [block, ask, allow] = reached;
        if let Some(rule) = self.first_match(0, indexes, keys, agent_id, fields, block) {
            return Decision::Block {
                rule: Some(&rule.name),
                reason: &rule.reason,
            };
        }
        if let Some(rule) = self.first_match(1, indexes, keys, agent_id, fields, ask) {
            return Decision::RequireApproval {
                rule: &rule.name,
                reason: &rule.reason,
            };
        }
        let rule = self.first_match(2, indexes, keys, agent_id, fields, allow);
        Decision::Allow {
            rule: rule.map(|r| r.name.as_str()),
        }
    }

    /// The matching rule with the smallest index in one tier; `seed` is a
    /// rule already known to decide in that tier (a reached limit).
    fn first_match<F: Fields + ?Sized>(
        &self,
        tier: usize,
        indexes: [Option<&ActionIndex>; 2],
        keys: Keys,
        agent_id: Option<&str>,
        fields: &F,
        seed: Option<u32>,
    ) -> Option<&Rule> {
        let mut best: Option<(u32, &Rule)> =
            seed.and_then(|index| Some((index, self.rules.get(index as usize)?)));
        for action in indexes.into_iter().flatten() {
            let Some(tier) = action.tiers.get(tier) else {
                continue;
            };
            let lists = [
                tier.by_device.get(&keys.device),
                tier.by_capability.get(&keys.capability),
                Some(&tier.rest),
            ];
            for list in lists.into_iter().flatten() {
                for &index in list {
                    if best.is_some_and(|(b, _)| index >= b) {
                        break;
                    }
                    let Some(rule) = self.rules.get(index as usize) else {
                        continue;
                    };
                    let scoped_out = rule
                        .agent_scope
                        .as_deref()
                        .is_some_and(|scope| Some(scope) != agent_id);
                    if !scoped_out && rule.condition.matches_fields(fields) {
                        best = Some((index, rule));
                        break;
                    }
                }
            }
        }
        best.map(|(_, rule)| rule)
    }
}

/// No limited rule has reached its limit, in any tier.
const NOT_REACHED: [Option<u32>; 3] = [None; 3];

fn shadow_deny() -> Decision<'static> {
    Decision::Block {
        rule: None,
        reason: SHADOW_DENY_REASON,
    }
}

fn fold_hash(state: &RandomState, text: &str) -> u64 {
    let mut hasher = state.build_hasher();
    lower::hash_folded(text, &mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests;
