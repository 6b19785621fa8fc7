//! The audit log's schema: [`Entry`], one variant per kind of entry, one
//! struct per kind, with the serde names every writer and reader uses. The
//! vessel's crates write entries only through it, and the store's
//! cross-check, its query filters and SQL indexes (through [`fields`]), the
//! console and `dk audit` read them back through it.
//!
//! An entry's text is what the chain hashes, so these types serialize to
//! exactly the JSON the vessel wrote before they existed (the canonical
//! text sorts keys, so field order does not matter; presence does: a field
//! written as `null` stays `null`, one left out stays left out). Reading is
//! lenient: a field an older vessel did not write takes its default, and
//! fields this build does not know are ignored. An entry of a kind this
//! build does not know, or not of its kind's shape, is read as nothing
//! ([`Entry::read`] fails) and shown as its raw JSON.
//!
//! Values that name another crate's type (a channel, a refusal's text, an
//! agent's scope) are kept as plain strings or JSON here: the store takes no
//! dk crate, and these texts are those crates' contract (`Channel::as_str`,
//! `Refusal`'s `Display`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kinds of entry, as the log's `kind` column names them.
pub mod kinds {
    /// A tool call's decision ([`Decision`](super::Decision)).
    pub const DECISION: &str = "decision";
    /// A device paired ([`Paired`](super::Paired)).
    pub const PAIRED: &str = "paired";
    /// A capability granted ([`GrantChange`](super::GrantChange)).
    pub const GRANTED: &str = "granted";
    /// A capability revoked ([`GrantChange`](super::GrantChange)).
    pub const REVOKED: &str = "revoked";
    /// A device unpaired ([`Unpaired`](super::Unpaired)).
    pub const UNPAIRED: &str = "unpaired";
    /// An agent added, re-scoped or removed ([`AgentChange`](super::AgentChange)).
    pub const AGENT: &str = "agent";
    /// A remembered yes made ([`AllowanceCreated`](super::AllowanceCreated)).
    pub const ALLOWANCE_CREATED: &str = "allowance-created";
    /// A remembered yes revoked ([`AllowanceRevoked`](super::AllowanceRevoked)).
    pub const ALLOWANCE_REVOKED: &str = "allowance-revoked";
    /// The rule file reloaded ([`RulesReloaded`](super::RulesReloaded)).
    pub const RULES_RELOADED: &str = "rules-reloaded";
    /// A rule file refused ([`RulesRefused`](super::RulesRefused)).
    pub const RULES_REFUSED: &str = "rules-refused";
    /// A streaming device admitted or refused ([`StreamAdmission`](super::StreamAdmission)).
    pub const STREAM_ADMISSION: &str = "stream_admission";
    /// The vessel's dk/2 key made or moved ([`VesselKey`](super::VesselKey)).
    pub const VESSEL_KEY: &str = "vessel-key";
    /// The admin token replaced ([`AdminToken`](super::AdminToken)).
    pub const ADMIN_TOKEN: &str = "admin-token";
    /// A networked vessel started ([`VesselStarted`](super::VesselStarted)).
    pub const VESSEL_STARTED: &str = "vessel-started";
    /// A networked vessel stopped ([`VesselStopped`](super::VesselStopped)).
    pub const VESSEL_STOPPED: &str = "vessel-stopped";
    /// The chain keyed from here on ([`AuditKeyed`](super::AuditKeyed)).
    pub const AUDIT_KEYED: &str = "audit-keyed";
    /// An entry the store refused, in its place ([`Unstorable`](super::Unstorable)).
    pub const UNSTORABLE: &str = "unstorable";
}

/// The names of the fields readers select entries by: the store's query
/// filters and its SQL indexes (`json_extract(entry, '$.deviceId')`). A
/// test checks them against the serde names of the kinds that carry them.
pub mod fields {
    /// The device an entry is about.
    pub const DEVICE_ID: &str = "deviceId";
    /// The agent an entry is about.
    pub const AGENT_ID: &str = "agentId";
    /// Whether a decision allowed its call.
    pub const ALLOWED: &str = "allowed";
    /// Who made a change ([`By`](super::By)).
    pub const BY: &str = "by";
    /// A decision's input.
    pub const INPUT: &str = "input";
    /// The tool a decision or an allowance is about.
    pub const TOOL: &str = "tool";
    /// Why a decision went as it did.
    pub const REASON: &str = "reason";
}

/// One audit entry, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// `decision`.
    Decision(Decision),
    /// `paired`.
    Paired(Paired),
    /// `granted`.
    Granted(GrantChange),
    /// `revoked`.
    Revoked(GrantChange),
    /// `unpaired`.
    Unpaired(Unpaired),
    /// `agent`.
    Agent(AgentChange),
    /// `allowance-created`.
    AllowanceCreated(AllowanceCreated),
    /// `allowance-revoked`.
    AllowanceRevoked(AllowanceRevoked),
    /// `rules-reloaded`.
    RulesReloaded(RulesReloaded),
    /// `rules-refused`.
    RulesRefused(RulesRefused),
    /// `stream_admission`.
    StreamAdmission(StreamAdmission),
    /// `vessel-key`.
    VesselKey(VesselKey),
    /// `admin-token`.
    AdminToken(AdminToken),
    /// `vessel-started`.
    VesselStarted(VesselStarted),
    /// `vessel-stopped`.
    VesselStopped(VesselStopped),
    /// `audit-keyed`.
    AuditKeyed(AuditKeyed),
    /// `unstorable`.
    Unstorable(Unstorable),
}

/// Every kind, in the order [`Entry`] lists them.
pub const KINDS: [&str; 17] = [
    kinds::DECISION,
    kinds::PAIRED,
    kinds::GRANTED,
    kinds::REVOKED,
    kinds::UNPAIRED,
    kinds::AGENT,
    kinds::ALLOWANCE_CREATED,
    kinds::ALLOWANCE_REVOKED,
    kinds::RULES_RELOADED,
    kinds::RULES_REFUSED,
    kinds::STREAM_ADMISSION,
    kinds::VESSEL_KEY,
    kinds::ADMIN_TOKEN,
    kinds::VESSEL_STARTED,
    kinds::VESSEL_STOPPED,
    kinds::AUDIT_KEYED,
    kinds::UNSTORABLE,
];

impl Entry {
    /// Its kind, as the log's `kind` column names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::Decision(_) => kinds::DECISION,
            Entry::Paired(_) => kinds::PAIRED,
            Entry::Granted(_) => kinds::GRANTED,
            Entry::Revoked(_) => kinds::REVOKED,
            Entry::Unpaired(_) => kinds::UNPAIRED,
            Entry::Agent(_) => kinds::AGENT,
            Entry::AllowanceCreated(_) => kinds::ALLOWANCE_CREATED,
            Entry::AllowanceRevoked(_) => kinds::ALLOWANCE_REVOKED,
            Entry::RulesReloaded(_) => kinds::RULES_RELOADED,
            Entry::RulesRefused(_) => kinds::RULES_REFUSED,
            Entry::StreamAdmission(_) => kinds::STREAM_ADMISSION,
            Entry::VesselKey(_) => kinds::VESSEL_KEY,
            Entry::AdminToken(_) => kinds::ADMIN_TOKEN,
            Entry::VesselStarted(_) => kinds::VESSEL_STARTED,
            Entry::VesselStopped(_) => kinds::VESSEL_STOPPED,
            Entry::AuditKeyed(_) => kinds::AUDIT_KEYED,
            Entry::Unstorable(_) => kinds::UNSTORABLE,
        }
    }

    /// Its details as JSON, the entry's text before redaction and
    /// canonical ordering.
    pub fn to_value(&self) -> Value {
        let value = match self {
            Entry::Decision(entry) => serde_json::to_value(entry),
            Entry::Paired(entry) => serde_json::to_value(entry),
            Entry::Granted(entry) | Entry::Revoked(entry) => serde_json::to_value(entry),
            Entry::Unpaired(entry) => serde_json::to_value(entry),
            Entry::Agent(entry) => serde_json::to_value(entry),
            Entry::AllowanceCreated(entry) => serde_json::to_value(entry),
            Entry::AllowanceRevoked(entry) => serde_json::to_value(entry),
            Entry::RulesReloaded(entry) => serde_json::to_value(entry),
            Entry::RulesRefused(entry) => serde_json::to_value(entry),
            Entry::StreamAdmission(entry) => serde_json::to_value(entry),
            Entry::VesselKey(entry) => serde_json::to_value(entry),
            Entry::AdminToken(entry) => serde_json::to_value(entry),
            Entry::VesselStarted(entry) => serde_json::to_value(entry),
            Entry::VesselStopped(entry) => serde_json::to_value(entry),
            Entry::AuditKeyed(entry) => serde_json::to_value(entry),
            Entry::Unstorable(entry) => serde_json::to_value(entry),
        };
        // Every field is a string, number, bool, map with string keys or
        // JSON: serializing cannot fail.
        value.unwrap_or(Value::Null)
    }

    /// Reads an entry of `kind` back from its details; fails for a kind
    /// this build does not know, or details not of its kind's shape.
    pub fn read(kind: &str, entry: &Value) -> Result<Entry, EntryError> {
        fn of<T: serde::de::DeserializeOwned>(entry: &Value) -> Result<T, EntryError> {
            T::deserialize(entry).map_err(|e| EntryError::Shape(e.to_string()))
        }
        Ok(match kind {
            kinds::DECISION => Entry::Decision(of(entry)?),
            kinds::PAIRED => Entry::Paired(of(entry)?),
            kinds::GRANTED => Entry::Granted(of(entry)?),
            kinds::REVOKED => Entry::Revoked(of(entry)?),
            kinds::UNPAIRED => Entry::Unpaired(of(entry)?),
            kinds::AGENT => Entry::Agent(of(entry)?),
            kinds::ALLOWANCE_CREATED => Entry::AllowanceCreated(of(entry)?),
            kinds::ALLOWANCE_REVOKED => Entry::AllowanceRevoked(of(entry)?),
            kinds::RULES_RELOADED => Entry::RulesReloaded(of(entry)?),
            kinds::RULES_REFUSED => Entry::RulesRefused(of(entry)?),
            kinds::STREAM_ADMISSION => Entry::StreamAdmission(of(entry)?),
            kinds::VESSEL_KEY => Entry::VesselKey(of(entry)?),
            kinds::ADMIN_TOKEN => Entry::AdminToken(of(entry)?),
            kinds::VESSEL_STARTED => Entry::VesselStarted(of(entry)?),
            kinds::VESSEL_STOPPED => Entry::VesselStopped(of(entry)?),
            kinds::AUDIT_KEYED => Entry::AuditKeyed(of(entry)?),
            kinds::UNSTORABLE => Entry::Unstorable(of(entry)?),
            other => return Err(EntryError::UnknownKind(other.to_owned())),
        })
    }

    /// Who made the change, when the entry names someone.
    pub fn by(&self) -> Option<&By> {
        match self {
            Entry::Decision(entry) => entry.by.as_ref(),
            Entry::Paired(entry) => entry.by.as_ref(),
            Entry::Granted(entry) | Entry::Revoked(entry) => entry.by.as_ref(),
            Entry::Unpaired(entry) => entry.by.as_ref(),
            Entry::Agent(
                AgentChange::Added { by, .. }
                | AgentChange::Removed { by, .. }
                | AgentChange::Scope { by, .. },
            ) => by.as_ref(),
            _ => None,
        }
    }
}

/// Why an entry could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// A kind this build does not know.
    #[error("unknown audit kind `{0}`")]
    UnknownKind(String),
    /// The details are not of the kind's shape.
    #[error("not the shape of its kind: {0}")]
    Shape(String),
}

macro_rules! into_entry {
    ($($variant:ident($kind:ty)),* $(,)?) => {
        $(impl From<$kind> for Entry {
            fn from(entry: $kind) -> Entry {
                Entry::$variant(entry)
            }
        })*
    };
}

into_entry!(
    Decision(Decision),
    Paired(Paired),
    Unpaired(Unpaired),
    Agent(AgentChange),
    AllowanceCreated(AllowanceCreated),
    AllowanceRevoked(AllowanceRevoked),
    RulesReloaded(RulesReloaded),
    RulesRefused(RulesRefused),
    StreamAdmission(StreamAdmission),
    VesselKey(VesselKey),
    AdminToken(AdminToken),
    VesselStarted(VesselStarted),
    VesselStopped(VesselStopped),
    AuditKeyed(AuditKeyed),
    Unstorable(Unstorable),
);

fn is_false(value: &bool) -> bool {
    !*value
}

/// The front end a change came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FrontEnd {
    /// The terminal prompt of `dk vessel`.
    Terminal,
    /// The admin API (`dk` commands, other tools), by its bearer token.
    AdminApi,
    /// The person's console in a browser.
    Console,
}

/// Who made a change, as its audit entry's `by` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct By {
    /// The front end.
    pub front_end: FrontEnd,
    /// The console's session: an id of its own, made when the session
    /// opened, never the cookie nor anything the cookie can be found from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl By {
    /// The terminal prompt.
    pub fn terminal() -> By {
        By {
            front_end: FrontEnd::Terminal,
            session: None,
        }
    }

    /// The admin API.
    pub fn admin_api() -> By {
        By {
            front_end: FrontEnd::AdminApi,
            session: None,
        }
    }

    /// The console session `session` (its id, not its cookie).
    pub fn console(session: impl Into<String>) -> By {
        By {
            front_end: FrontEnd::Console,
            session: Some(session.into()),
        }
    }
}

/// How the person took part in a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PersonAnswer {
    /// Asked, and said yes.
    Approved,
    /// Asked, and said no (or did not answer in time).
    Refused,
    /// Not asked: an allowance the person gave answered.
    Remembered,
}

/// Who made a call, when it was not an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Caller {
    /// The person's own call (the admin API, the console).
    Person,
}

/// The allowance a decision made or used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowanceRef {
    /// The allowance's id.
    pub id: u64,
    /// Whether this decision made it (the person's yes was remembered);
    /// left out when it was used.
    #[serde(default, skip_serializing_if = "is_false")]
    pub created: bool,
}

/// A `decision` entry: one tool call, allowed or refused, as 8DK records
/// it (plus `rule`, and what the person and the channel had to do with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The tool called.
    #[serde(default)]
    pub tool: String,
    /// The device, when the tool named a paired one.
    #[serde(default)]
    pub device_id: Option<String>,
    /// The capability, when the tool named a paired device's.
    #[serde(default)]
    pub capability: Option<String>,
    /// Whether the call was allowed.
    #[serde(default)]
    pub allowed: bool,
    /// Why, in 8DK's words (`allowed`, `[8dk-deny] ...`, `[policy] ...`).
    #[serde(default)]
    pub reason: String,
    /// The calling agent; `null` for the person's own call.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// The agent's session.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The rule that decided or asked, if any.
    #[serde(default)]
    pub rule: Option<String>,
    /// The person's part, when they were asked or an allowance answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<PersonAnswer>,
    /// The allowance made or used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowance: Option<AllowanceRef>,
    /// The caller, when it was the person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<Caller>,
    /// The device's channel (`v1`, `dk/2`), when it was paired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Who answered for the person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<By>,
    /// The call's input, redacted and cut (or a marker saying its size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

impl Decision {
    /// What stands for an input whose cut form, `size` bytes, would still
    /// make its entry too large to store.
    pub fn input_cut(size: usize) -> Value {
        Value::String(format!(
            "[cut: the input takes {size} bytes once cut, too many for one entry]"
        ))
    }
}

/// A `paired` entry: the person approved a device's pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Paired {
    /// The device id.
    pub device_id: String,
    /// The manifest's name.
    #[serde(default)]
    pub name: String,
    /// The approved manifest's digest.
    #[serde(default)]
    pub digest: String,
    /// The capabilities granted with the pairing.
    #[serde(default)]
    pub grants: Vec<String>,
    /// Whether it replaced an earlier pairing of the same id.
    #[serde(default)]
    pub replaced: bool,
    /// Whether the device has no screen (its code was not compared).
    #[serde(default)]
    pub no_screen: bool,
    /// The channel it paired over (`v1`, `dk/2`).
    #[serde(default)]
    pub channel: String,
    /// The pairing's generation.
    #[serde(default)]
    pub generation: u64,
    /// The pinned dk/2 key, lower-case hex; left out over v1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_key: Option<String>,
    /// Who approved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<By>,
}

/// A `granted` or `revoked` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantChange {
    /// The device.
    pub device_id: String,
    /// The capability granted or revoked.
    pub capability: String,
    /// The device's channel.
    #[serde(default)]
    pub channel: String,
    /// Who made the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<By>,
}

impl GrantChange {
    /// The `granted` entry of this change.
    pub fn granted(self) -> Entry {
        Entry::Granted(self)
    }

    /// The `revoked` entry of this change.
    pub fn revoked(self) -> Entry {
        Entry::Revoked(self)
    }
}

/// An `unpaired` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unpaired {
    /// The device.
    pub device_id: String,
    /// The channel it was paired over.
    #[serde(default)]
    pub channel: String,
    /// Who unpaired it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<By>,
}

/// An agent as an `agent` entry records it when added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    /// Its id (its name).
    pub id: String,
    /// What it may see, as the agent directory writes it.
    #[serde(default)]
    pub scope: Value,
    /// What it may do: `guest`, `user` or `admin`.
    #[serde(default)]
    pub role: Value,
    /// When it was added, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub added_at_ms: u64,
}

/// An `agent` entry: an agent added, re-scoped or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "lowercase")]
pub enum AgentChange {
    /// Added.
    Added {
        /// The agent.
        agent: AgentRecord,
        /// Who added it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<By>,
    },
    /// Removed.
    Removed {
        /// The agent's id.
        #[serde(rename = "agentId")]
        agent_id: String,
        /// Who removed it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<By>,
    },
    /// Its scope replaced.
    Scope {
        /// The agent's id.
        #[serde(rename = "agentId")]
        agent_id: String,
        /// The new scope, as the agent directory writes it.
        scope: Value,
        /// Who changed it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<By>,
    },
}

/// An `allowance-created` entry: the person's yes remembered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowanceCreated {
    /// The allowance's id.
    pub id: u64,
    /// The agent it lets call.
    pub agent_id: String,
    /// The tool.
    pub tool: String,
    /// The device.
    pub device_id: String,
    /// The capability.
    pub capability: String,
    /// What it covers: `arguments` or `capability`.
    pub scope: String,
    /// How long it lasts, in whole minutes.
    pub minutes: u64,
    /// When it ends, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// The SHA-256 of the arguments it covers, when it covers only them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
}

/// An `allowance-revoked` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowanceRevoked {
    /// The allowance's id.
    pub id: u64,
    /// The agent it let call.
    pub agent_id: String,
    /// The tool.
    pub tool: String,
    /// The device.
    pub device_id: String,
    /// The capability.
    pub capability: String,
    /// What it covered: `arguments` or `capability`.
    pub scope: String,
    /// How many calls it answered.
    pub uses: u64,
    /// Why it ended, in words.
    pub why: String,
}

/// The rules in force, as the audit log and the admin API name them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RulesInForce {
    /// The rule file they were read from; `None` for rules a host gave
    /// without a file (none, by default).
    pub file: Option<String>,
    /// The SHA-256 of the file's bytes when they were read.
    pub sha256: Option<String>,
    /// How many rules.
    pub rules: usize,
}

/// What asked for a reload, as the audit entry says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReloadCause {
    /// The file's modification time or length changed.
    FileChanged,
    /// The host was asked (SIGHUP in `dk vessel`).
    Asked,
    /// The person, through the admin API (`dk policy reload`).
    AdminApi,
}

/// A `rules-reloaded` entry: a rule file's rules put in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RulesReloaded {
    /// The file.
    pub file: String,
    /// The SHA-256 of what was read.
    pub sha256: String,
    /// How many rules are now in force.
    pub rules: usize,
    /// What asked for the reload.
    pub cause: ReloadCause,
}

/// A `rules-refused` entry: a rule file refused, the rules in force kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RulesRefused {
    /// The file.
    pub file: String,
    /// The SHA-256 of what was read, when it could be read.
    pub sha256: Option<String>,
    /// Every error, one a line.
    pub errors: String,
    /// What asked for the reload.
    pub cause: ReloadCause,
    /// The rules that stay in force.
    pub in_force: RulesInForce,
}

/// A `stream_admission` entry: a streaming device admitted or refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamAdmission {
    /// The device.
    pub device_id: String,
    /// Its class (`voice`, `desktop-control`).
    pub kind: String,
    /// When: `pair` (just paired) or `resume` (a reconnect).
    pub stage: String,
    /// Whether it was admitted.
    pub admitted: bool,
    /// What the admission decided.
    #[serde(flatten)]
    pub outcome: AdmissionOutcome,
}

/// What a stream admission decided, beside `admitted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, rename_all = "camelCase")]
pub enum AdmissionOutcome {
    /// Admitted, with these caps.
    #[serde(rename_all = "camelCase")]
    Admitted {
        /// The largest chunk the device may send.
        max_chunk_bytes: u64,
        /// The tool calls its run budget allows.
        max_tool_calls: u64,
    },
    /// Refused.
    Refused {
        /// The admission code.
        code: String,
        /// Why, in words.
        message: String,
    },
}

/// A `vessel-key` entry: the vessel's dk/2 key made, replaced or moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VesselKey {
    /// Whether a key was made.
    #[serde(default, skip_serializing_if = "is_false")]
    pub made: bool,
    /// Whether the made key replaced one whose file was missing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub replaced: bool,
    /// Whether the key was moved out of the data directory.
    #[serde(default, skip_serializing_if = "is_false")]
    pub moved: bool,
    /// Where it was moved from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Where it was moved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The key's fingerprint.
    pub fingerprint: String,
}

impl VesselKey {
    /// A key made at the first start.
    pub fn made(fingerprint: String) -> VesselKey {
        VesselKey {
            made: true,
            replaced: false,
            moved: false,
            from: None,
            to: None,
            fingerprint,
        }
    }

    /// A key made in place of one whose file was missing.
    pub fn replaced(fingerprint: String) -> VesselKey {
        VesselKey {
            replaced: true,
            ..VesselKey::made(fingerprint)
        }
    }

    /// A key an older dk left in the data directory, moved out.
    pub fn moved(from: String, to: String, fingerprint: String) -> VesselKey {
        VesselKey {
            made: false,
            replaced: false,
            moved: true,
            from: Some(from),
            to: Some(to),
            fingerprint,
        }
    }
}

/// An `admin-token` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminToken {
    /// Whether the token was replaced.
    pub replaced: bool,
}

/// A `vessel-started` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VesselStarted {
    /// dk's version.
    pub version: String,
    /// The vessel key's fingerprint.
    pub fingerprint: String,
    /// The rules in force from the start.
    pub rules: RulesInForce,
}

/// A `vessel-stopped` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VesselStopped {
    /// The rules in force at the stop.
    pub rules: RulesInForce,
}

/// An `audit-keyed` entry: the chain is keyed from it on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditKeyed {
    /// The key's id.
    pub key_id: String,
}

/// An `unstorable` entry, written in place of one the store refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unstorable {
    /// The refused entry's kind.
    pub kind: String,
    /// Why it was refused.
    pub error: String,
}

#[cfg(test)]
mod tests;
