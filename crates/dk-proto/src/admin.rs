//! The admin API's request and response bodies, as JSON: the vessel's
//! server writes and reads them, and its client and the `dk` command line
//! read and write the same types. `docs/ADMIN-API.md` lists the routes.
//!
//! Requests refuse unknown fields; responses are read leniently (a newer
//! vessel may say more).

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `GET /v1/status`: what the vessel holds now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Paired devices.
    pub paired: u64,
    /// Paired devices connected now.
    pub connected: u64,
    /// Device connections open now (paired or not).
    pub connections: u64,
    /// Prompts waiting for the person.
    pub pending: u64,
    /// Each listener's counters.
    pub listeners: Listeners,
    /// The fingerprint of the vessel's dk/2 key, as devices show it after
    /// pairing. Absent from an older vessel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// dk/2 handshakes finished since the vessel started.
    #[serde(default)]
    pub secure_handshakes: u64,
    /// dk/2 connections that failed (closed 4012) since the vessel started.
    #[serde(default)]
    pub channel_failures: u64,
    /// v1 upgrades refused where plain v1 is not allowed.
    #[serde(default)]
    pub plain_v1_refused: u64,
    /// The vessel's place in its fleet, when it runs as a member; absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetStatus>,
    /// The microphones open now on voice devices, as each device said when
    /// it opened one; empty (and absent) when none is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub microphones: Vec<LiveMicrophone>,
}

/// A microphone open on a voice device, as `GET /v1/status` and the
/// console show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveMicrophone {
    /// The device.
    pub device_id: String,
    /// The capability that opened it (`listen`, `listen_stream`).
    pub capability: String,
    /// The most it stays open, in seconds, as the device said.
    pub max_seconds: u64,
    /// When the vessel heard it open, in ms since the epoch.
    pub since_ms: u64,
}

/// A fleet member's state, as `GET /v1/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    /// This member's id.
    pub member: String,
    /// This run of it (32 hex digits), new at every start.
    pub incarnation: String,
    /// Whether its connection to NATS is up.
    pub connected: bool,
    /// The devices connected to it, as it announces them.
    pub devices: u64,
    /// The other members present, in order.
    pub members: Vec<FleetMember>,
    /// The members that left and are not back, and how.
    #[serde(default)]
    pub departed: Vec<FleetDeparted>,
    /// The fleet messages it dropped, by reason, since it started.
    pub dropped: FleetDropped,
    /// The largest message the NATS servers carry, in bytes.
    pub max_message: u64,
}

/// Another member present in the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetMember {
    /// Its id.
    pub member: String,
    /// The run of it heard (32 hex digits).
    pub incarnation: String,
    /// The devices connected to it.
    pub devices: u64,
    /// How long ago it was last heard, in milliseconds.
    pub heard_ago_ms: u64,
}

/// A member that left the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetDeparted {
    /// Its id.
    pub member: String,
    /// The run of it that left (32 hex digits).
    pub incarnation: String,
    /// Whether it said goodbye (else it went silent past the expiry).
    pub goodbye: bool,
    /// How long ago it left, in milliseconds.
    pub ago_ms: u64,
}

/// Fleet messages dropped, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetDropped {
    /// Not sealed with the fleet key (forged, altered, or not fleet messages).
    pub forged: u64,
    /// Seen before within the replay window.
    pub replayed: u64,
    /// Too old, from a member's earlier run, or meant for an earlier run of
    /// this one.
    pub stale: u64,
    /// Larger than the limit.
    pub too_large: u64,
    /// Sealed by another version of dk.
    pub other_version: u64,
}

/// The counters of every listener of the vessel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listeners {
    /// The devices' WebSocket listener.
    pub devices: ListenerCounts,
    /// The admin API on loopback.
    pub admin: ListenerCounts,
    /// The MCP listener on loopback.
    pub mcp: ListenerCounts,
    /// The admin API's Unix socket.
    pub admin_socket: ListenerCounts,
    /// The MCP Unix socket.
    pub mcp_socket: ListenerCounts,
}

/// One listener's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerCounts {
    /// Connections held now.
    pub open: u64,
    /// The most connections held at once since it started.
    pub peak: u64,
    /// Connections closed at `accept` for a cap.
    pub refused_at_accept: u64,
    /// Connections closed for moving no byte for the idle timeout.
    pub idle_closed: u64,
}

/// `POST /v1/pending/{id}/consent`: the person's answer to a pairing request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsentAnswer {
    /// Whether the person pairs the device.
    pub approved: bool,
    /// The capabilities granted with the pairing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grant: Vec<String>,
    /// Needed, as `true`, to pair a device that cannot show a code.
    #[serde(default, skip_serializing_if = "is_false")]
    pub confirm_without_code: bool,
    /// Needed, as `true`, to pair an id whose pairing this one replaces
    /// with another key or without encryption
    /// ([`Replaced::credential`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub confirm_credential_change: bool,
}

/// `POST /v1/pending/{id}/approval`: the person's answer to an agent's call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalAnswer {
    /// Whether the person allows the call.
    pub approved: bool,
    /// A yes to remember (only with `approved: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<Remember>,
}

/// A yes the person remembers for the agent that asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Remember {
    /// What the allowance covers (`arguments`, or `args`; `capability`,
    /// or `cap`); the vessel refuses a name it does not know.
    pub scope: Named<AllowanceScope>,
    /// Minutes (1 to 1440); 15 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minutes: Option<u64>,
}

/// One open prompt, as `GET /v1/pending` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    /// Identifies the prompt when answering.
    pub id: u64,
    /// Milliseconds since the Unix epoch after which the prompt is a no.
    pub expires_at_ms: u64,
    /// What is asked (`kind` and `request`).
    #[serde(flatten)]
    pub prompt: Prompt,
    /// Whether a yes may be remembered (only on approvals of an agent's call).
    #[serde(default, skip_serializing_if = "is_false")]
    pub can_remember: bool,
}

/// What the person is asked: `kind` says which, `request` holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "request", rename_all = "camelCase")]
pub enum Prompt {
    /// A device asks to pair.
    Consent(ConsentRequest),
    /// A call needs a yes.
    Approval(ApprovalRequest),
}

/// What the person is asked when a device wants to pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsentRequest {
    /// The device id.
    pub device_id: String,
    /// Its display name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// The code the device is showing: the person checks they match.
    pub code: String,
    /// Every capability the device declares.
    pub capabilities: Vec<DeviceCapability>,
    /// The events the device declares, granted as capabilities; absent
    /// when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<DeclaredEvent>,
    /// The pairing this one would replace, when the id is already paired.
    pub replaces: Option<Replaced>,
    /// The device says it cannot display the code.
    pub no_screen: bool,
    /// The channel the device asks on: `dk/2` (encrypted, the code computed
    /// on both sides) or `v1` (in clear). Absent from an older vessel: v1.
    #[serde(default)]
    pub channel: crate::Channel,
}

/// What a new pairing of an already paired id replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replaced {
    /// When the current pairing was made, milliseconds since the Unix epoch.
    pub paired_at_ms: u64,
    /// What it grants now.
    pub grants: Vec<String>,
    /// The approved manifest's name, when the new one says another.
    pub was_name: Option<String>,
    /// The approved manifest's kind, when the new one says another.
    pub was_kind: Option<String>,
    /// Every capability added, removed or changed.
    pub changes: Vec<CapabilityChange>,
    /// How the device's credential differs from the paired one's: its dk/2
    /// key changed, or it asks over v1 where it was paired over dk/2. The
    /// person must confirm it knowingly (`confirmCredentialChange`).
    /// Absent when it is the same (and from an older vessel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialChange>,
}

/// How the device asking to pair differs in its credential from the device
/// paired under its id: a change the code cannot vouch for, since the code
/// proves only which device is asking now, not that it is the one paired
/// before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CredentialChange {
    /// Paired over dk/2 with one key, it asks with another: another device
    /// (or the same one reset) claims the id.
    KeyChanged,
    /// Paired over dk/2, it asks over v1: pairing it drops the encryption
    /// and makes its credential a token anyone on the path can copy.
    EncryptionDropped,
}

impl CredentialChange {
    /// The change in plain words, as every front end says it.
    pub fn words(self) -> &'static str {
        match self {
            CredentialChange::KeyChanged => {
                "its key changed: the device paired under this id had another key, so this may be another device"
            }
            CredentialChange::EncryptionDropped => {
                "encryption would be dropped: the device paired under this id was paired over dk/2 (encrypted) and now asks over v1 (not encrypted)"
            }
        }
    }
}

/// How one capability of a re-pairing differs from the approved manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityChange {
    /// The capability.
    pub capability: String,
    /// Added, removed or changed.
    pub change: ChangeKind,
    /// What changed in a capability both manifests have.
    pub differences: Vec<Difference>,
    /// The same in words, for a person.
    pub summary: String,
}

impl CapabilityChange {
    /// The change of `capability`, its summary in words for a person:
    /// `unlock: NO LONGER asks every time`, `siren: added`.
    pub fn new(
        capability: &str,
        change: ChangeKind,
        differences: Vec<Difference>,
    ) -> CapabilityChange {
        let summary = match change {
            ChangeKind::Added => format!("{capability}: added"),
            ChangeKind::Removed => format!("{capability}: removed"),
            ChangeKind::Changed => {
                let parts: Vec<String> = differences
                    .iter()
                    .map(|d| match d {
                        Difference::Kind { was, now } => format!("was {was}, now {now}"),
                        Difference::Confirm { was: true, .. } => {
                            "NO LONGER asks every time".to_owned()
                        }
                        Difference::Confirm { .. } => "now asks every time".to_owned(),
                        Difference::Params => "its params changed".to_owned(),
                        Difference::Description => "its description changed".to_owned(),
                        Difference::Title => "its title changed".to_owned(),
                        Difference::Claims => "what the device claims of it changed".to_owned(),
                        Difference::Schema => "its input or output schema changed".to_owned(),
                        Difference::Tool => "the tool it stands for changed".to_owned(),
                    })
                    .collect();
                format!("{capability}: {}", parts.join(", "))
            }
        };
        CapabilityChange {
            capability: capability.to_owned(),
            change,
            differences,
            summary,
        }
    }
}

/// The rules in force: the file they were read from, its SHA-256 when
/// read, and how many rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RulesInForce {
    /// The rule file; `None` for rules a host gave without one.
    pub file: Option<String>,
    /// The SHA-256 of the file's bytes when they were read.
    pub sha256: Option<String>,
    /// How many rules.
    pub rules: usize,
}

/// A reload whose rules are in force (`POST /v1/policy/reload`, 200):
/// `{"reloaded": true, "file", "sha256", "rules"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RulesReloaded {
    /// Always `true`.
    pub reloaded: bool,
    /// The rule file read.
    pub file: Option<String>,
    /// The SHA-256 of what was read.
    pub sha256: Option<String>,
    /// How many rules are in force.
    pub rules: usize,
}

/// A reload refused (422): the file's errors, and the rules that stay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RulesRefused {
    /// Always `false`.
    pub reloaded: bool,
    /// Every error of the file, one a line.
    pub errors: Vec<String>,
    /// The rules still in force.
    pub in_force: RulesInForce,
}

/// A one-time login link to the console (`POST /v1/console/link`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginLink {
    /// The link; it works once.
    pub url: String,
}

/// The stream chunks a watch saw (`GET /v1/devices/{id}/stream`): each
/// chunk's metadata, redacted, and how many the watch lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamChunks {
    /// The device watched.
    pub device_id: String,
    /// Each chunk's metadata, in the order they came.
    pub chunks: Vec<serde_json::Value>,
    /// Chunks the watch's queue dropped.
    pub lost: u64,
}

/// Whether a capability of a re-pairing is new, gone, or different.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChangeKind {
    /// Only the new manifest has it.
    Added,
    /// Only the approved manifest has it.
    Removed,
    /// Both have it, differently.
    Changed,
}

/// One difference in a capability both manifests declare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "what")]
pub enum Difference {
    /// Sensor became actuator or the other way round.
    Kind {
        /// The approved kind.
        was: crate::CapabilityKind,
        /// The new kind.
        now: crate::CapabilityKind,
    },
    /// Whether the person is asked on every call.
    Confirm {
        /// The approved manifest asked every time.
        was: bool,
        /// The new manifest asks every time.
        now: bool,
    },
    /// Its params differ (their bounds included).
    Params,
    /// Its description differs.
    Description,
    /// Its title differs (the dk manifest extension).
    Title,
    /// What the device claims of it (its annotations) differs.
    Claims,
    /// Its declared input or output schema differs (the dk manifest
    /// extension: an MCP server's tool behind a bridge).
    Schema,
    /// The name the device knows it by (`tool`) differs.
    Tool,
}

/// What the person is shown when a call needs a yes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The tool called.
    pub tool: String,
    /// The device.
    pub device_id: String,
    /// The capability.
    pub capability: String,
    /// Exactly the input that will be sent.
    pub input: serde_json::Map<String, serde_json::Value>,
    /// Why the person is asked.
    pub reason: String,
    /// The calling agent, when the call names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The calling agent's session, when the call names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The channel the device is connected on: `dk/2` (encrypted) or `v1`
    /// (in clear). Absent from an older vessel: v1.
    #[serde(default)]
    pub channel: crate::Channel,
    /// Set when the call opens a voice device's microphone: for how long
    /// at most. Absent for every other call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microphone: Option<MicrophoneRequest>,
}

/// A call that opens a voice device's microphone (a `sensor` capability
/// of a device of kind `voice`), as the person is asked about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MicrophoneRequest {
    /// The longest the microphone stays open, in whole seconds (rounded
    /// up), as the call's `max_seconds` says; absent when the call names
    /// none, and then only the device bounds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seconds: Option<u64>,
}

/// `n` (finite, not negative) rounded up to whole seconds, without std's
/// `ceil` (this crate builds without std); saturates at `u64::MAX`.
fn ceil_seconds(n: f64) -> u64 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a float cast to u64 saturates, and u64 back to f64 only rounds past 2^53, where every float is whole"
    )]
    {
        let whole = n as u64;
        if (whole as f64) < n {
            whole.saturating_add(1)
        } else {
            whole
        }
    }
}

impl MicrophoneRequest {
    /// What a call with `input` asks of the microphone.
    pub fn of(input: &serde_json::Map<String, serde_json::Value>) -> MicrophoneRequest {
        let max_seconds = input
            .get("max_seconds")
            .and_then(serde_json::Value::as_f64)
            .filter(|n| n.is_finite() && *n >= 0.0)
            .map(ceil_seconds);
        MicrophoneRequest { max_seconds }
    }

    /// One line for the person: `for at most 10 s`, or that the call
    /// names no limit.
    pub fn words(&self) -> String {
        match self.max_seconds {
            Some(n) => format!("for at most {n} s"),
            None => "for as long as the device allows (the call names no max_seconds)".to_owned(),
        }
    }
}

/// A remembered allowance, as `GET /v1/approvals/remembered` lists it and a
/// remembered yes answers (201).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allowance {
    /// Identifies it (never reused while the vessel runs).
    pub id: u64,
    /// The agent it lets call.
    pub agent_id: String,
    /// The tool.
    pub tool: String,
    /// The device.
    pub device_id: String,
    /// The capability.
    pub capability: String,
    /// What it covers.
    pub scope: AllowanceScope,
    /// For scope `arguments`: the SHA-256 (hex) of the arguments' canonical JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
    /// For scope `arguments`: the arguments' canonical JSON, cut at 512 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// When it was made, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When it ends, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// Calls it let through so far.
    pub uses: u64,
}

/// A paired device, as `GET /v1/devices` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The device id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its version.
    pub version: String,
    /// The approved manifest's digest.
    pub digest: String,
    /// When it was paired, milliseconds since the Unix epoch.
    pub paired_at_ms: u64,
    /// Whether it is connected now.
    pub connected: bool,
    /// In a fleet, the member it is connected to when that is another
    /// vessel (calls reach it through that member); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The channel it paired on and reconnects on: `dk/2` or `v1`. Absent
    /// from an older vessel: v1.
    #[serde(default)]
    pub channel: crate::Channel,
    /// The capabilities the person granted.
    pub grants: Vec<String>,
    /// Every capability it declares.
    pub capabilities: Vec<DeviceCapability>,
    /// The events it declares (the dk manifest extension), which the person
    /// grants as capabilities; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<DeclaredEvent>,
}

/// A capability of a paired device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCapability {
    /// Its name.
    pub name: String,
    /// `sensor` or `actuator`.
    pub kind: crate::CapabilityKind,
    /// What it does, in the device's words.
    pub description: String,
    /// Whether the person is asked on every call.
    pub confirm: bool,
    /// The input params it declares (what a rule's `input.<param>` may
    /// name); absent when it takes none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<DeviceParam>,
    /// Its title, a name for people (the dk manifest extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the device claims of it in its annotations (`read-only`,
    /// `destructive`, ...): claims, never checked; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
}

impl DeviceCapability {
    /// `capability` as the person is shown it.
    pub fn of(capability: &crate::Capability) -> DeviceCapability {
        DeviceCapability {
            name: capability.name().to_owned(),
            kind: capability.kind(),
            description: capability.description().to_owned(),
            confirm: capability.confirm(),
            params: capability.params().iter().map(DeviceParam::of).collect(),
            title: capability.title().map(str::to_owned),
            claims: capability
                .annotations()
                .map(crate::Annotations::claims)
                .unwrap_or_default(),
        }
    }
}

/// An event a device declares (the dk manifest extension), as the person is
/// shown it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredEvent {
    /// Its name, granted as a capability's is.
    pub name: String,
    /// What it tells, in the device's words.
    pub description: String,
    /// The params of its data; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<DeviceParam>,
}

impl DeclaredEvent {
    /// `event` as the person is shown it.
    pub fn of(event: &crate::EventSpec) -> DeclaredEvent {
        DeclaredEvent {
            name: event.name().to_owned(),
            description: event.description().to_owned(),
            params: event.params().iter().map(DeviceParam::of).collect(),
        }
    }

    /// Each of `manifest`'s declared events.
    pub fn all_of(manifest: &crate::Manifest) -> Vec<DeclaredEvent> {
        manifest.events().iter().map(DeclaredEvent::of).collect()
    }
}

/// An input param a capability declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceParam {
    /// Its key in the call's input.
    pub name: String,
    /// `string`, `number` or `boolean`.
    #[serde(rename = "type")]
    pub ty: String,
    /// Whether a call must give it.
    pub required: bool,
    /// What it is, in the device's words, when the device says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The bounds its values must keep, in words (`from 10 to 30 °C`,
    /// `one of "heat", "cool"`), when the device declares any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<String>,
}

impl DeviceParam {
    /// `param` as the person is shown it.
    pub fn of(param: &crate::Param) -> DeviceParam {
        DeviceParam {
            name: param.name().to_owned(),
            ty: param.ty().as_str().to_owned(),
            required: param.required(),
            description: param.description().map(str::to_owned),
            bounds: param.bounds().summary(),
        }
    }
}

/// An agent, as `GET /v1/agents` lists it: never its credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    /// Its name.
    pub name: String,
    /// What it may see: `*`, `DEVICE` or `DEVICE:CAPABILITY` items.
    pub scope: Vec<String>,
    /// What it may do on top of its scope.
    pub role: AgentRole,
    /// When it was added, milliseconds since the Unix epoch.
    pub added_at_ms: u64,
}

/// `POST /v1/agents`: an agent to add.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewAgent {
    /// Its name.
    pub name: String,
    /// What it may see (nothing when empty).
    #[serde(default)]
    pub scope: Vec<String>,
    /// `guest`, `user` (when absent) or `admin`; the vessel refuses a name
    /// it does not know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Named<AgentRole>>,
}

/// The answer to `POST /v1/agents` (201): the new agent's credential,
/// shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedAgent {
    /// Its name.
    pub name: String,
    /// Its credential.
    pub credential: String,
}

/// `PUT /v1/agents/{name}/scope`: an agent's new scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewScope {
    /// What it may see from now on.
    pub scope: Vec<String>,
}

/// The body of every refusal the admin API answers (4xx, 5xx).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Why, in one line.
    pub error: String,
}

/// What a remembered allowance covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AllowanceScope {
    /// The agent calling this tool with exactly these arguments.
    Arguments,
    /// The agent calling this capability with any arguments.
    Capability,
}

impl AllowanceScope {
    /// `arguments` or `capability`, as the admin API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AllowanceScope::Arguments => "arguments",
            AllowanceScope::Capability => "capability",
        }
    }

    /// The scope named `text`: `arguments` (or `args`) or `capability` (or
    /// `cap`).
    pub fn parse(text: &str) -> Result<AllowanceScope, UnknownScope> {
        match text {
            "arguments" | "args" => Ok(AllowanceScope::Arguments),
            "capability" | "cap" => Ok(AllowanceScope::Capability),
            other => Err(UnknownScope(other.to_owned())),
        }
    }
}

impl FromStr for AllowanceScope {
    type Err = UnknownScope;

    fn from_str(text: &str) -> Result<AllowanceScope, UnknownScope> {
        AllowanceScope::parse(text)
    }
}

/// A name that is no [`AllowanceScope`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not what an allowance covers: say `arguments` (`args`, these exact arguments) or `capability` (`cap`, any arguments)"
)]
pub struct UnknownScope(pub String);

/// What an agent may do, on top of its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentRole {
    /// Sees and calls sensors only (capabilities that read); no actuator is
    /// offered, and a call to one is refused as out of scope.
    Guest,
    /// Sees and calls every granted capability within its scope.
    User,
    /// As `user` for device tools. Reserved for the vessel's own management
    /// tools later; an admin agent never answers the person's prompts.
    Admin,
}

impl AgentRole {
    /// The role's name, as the admin API and the command line spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentRole::Guest => "guest",
            AgentRole::User => "user",
            AgentRole::Admin => "admin",
        }
    }

    /// The role named `text` (`guest`, `user` or `admin`).
    pub fn parse(text: &str) -> Option<AgentRole> {
        match text {
            "guest" => Some(AgentRole::Guest),
            "user" => Some(AgentRole::User),
            "admin" => Some(AgentRole::Admin),
            _ => None,
        }
    }
}

impl FromStr for AgentRole {
    type Err = UnknownRole;

    fn from_str(text: &str) -> Result<AgentRole, UnknownRole> {
        AgentRole::parse(text).ok_or_else(|| UnknownRole(text.to_owned()))
    }
}

/// A name that is no [`AgentRole`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("role `{0}` must be `guest`, `user` or `admin`")]
pub struct UnknownRole(pub String);

/// A value of `T` as a request names it. A name `T` does not know still
/// reads, as [`Named::Unknown`], so that the vessel refuses it (400) with
/// what `T` accepts, in the order it checks the rest of the request;
/// a wrong JSON type (not a string) is refused as any malformed body.
/// Written, it is the name alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named<T> {
    /// The value named.
    Known(T),
    /// A name no value of `T` has, as given.
    Unknown(String),
}

impl<T: FromStr> Named<T> {
    /// The value `text` names, or `text` as an unknown name.
    pub fn from_name(text: String) -> Named<T> {
        match text.parse() {
            Ok(value) => Named::Known(value),
            Err(_) => Named::Unknown(text),
        }
    }

    /// The value named, or why the name names none.
    pub fn known(self) -> Result<T, T::Err> {
        match self {
            Named::Known(value) => Ok(value),
            Named::Unknown(text) => text.parse(),
        }
    }
}

impl<T> From<T> for Named<T> {
    fn from(value: T) -> Named<T> {
        Named::Known(value)
    }
}

impl<T: Serialize> Serialize for Named<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Named::Known(value) => value.serialize(serializer),
            Named::Unknown(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de, T: FromStr> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Named<T>, D::Error> {
        String::deserialize(deserializer).map(Named::from_name)
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[cfg(test)]
mod tests;
