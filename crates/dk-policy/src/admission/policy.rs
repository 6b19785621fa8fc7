//! Device-class policy: the raw configuration, its resolution, admission and stream bounds.

use std::str::FromStr;

use serde::Deserialize;
use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::Value;

use super::error::{AdmissionError, DisabledReason, InputError};
use super::limits::{RunLimits, RunLimitsLayer};
use super::names::{DeviceClass, safe_integer};

/// Default `maxChunkBytes`: 1 MiB.
pub const DEFAULT_MAX_CHUNK_BYTES: u64 = 1024 * 1024;
/// Hard cap on `maxChunkBytes`: 8 MiB.
pub const HARD_MAX_CHUNK_BYTES: u64 = 8 * 1024 * 1024;
/// Default `maxConcurrentSessions` per identity.
pub const DEFAULT_MAX_CONCURRENT_SESSIONS: u64 = 1;
/// Hard cap on `maxConcurrentSessions` per identity.
pub const HARD_MAX_CONCURRENT_SESSIONS: u64 = 4;
/// The marker of a chunk dropped for being over the cap.
pub const DROPPED_OVERSIZE: &str = "dropped_oversize";

impl DeviceClass {
    /// Reads `voice` or `desktop-control` (exactly; no other spelling).
    pub fn parse(kind: &str) -> Result<DeviceClass, AdmissionError> {
        match kind {
            "voice" => Ok(DeviceClass::Voice),
            "desktop-control" => Ok(DeviceClass::DesktopControl),
            _ => Err(InputError::UnknownKind.into()),
        }
    }
}

impl FromStr for DeviceClass {
    type Err = AdmissionError;

    fn from_str(kind: &str) -> Result<Self, Self::Err> {
        DeviceClass::parse(kind)
    }
}

/// A device-class policy as the host configures it (JSON, TOML, ...), before
/// any check.
///
/// Every value is kept as it was written, so a wrong type is an error of
/// [`resolve`], never a failed or panicking parse; a JSON `null` counts as
/// absent. Only the shape is checked on reading ([`RawDevicePolicy::from_json`],
/// also what `Deserialize` does): an object, with known fields only (a
/// misspelt limit would otherwise silently fall back to the, possibly larger,
/// default), and `limits`, when present, an object too.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub struct RawDevicePolicy {
    /// `enabled`: admits only when exactly `true`.
    pub enabled: Option<Value>,
    /// `requireApproval`: approval is required unless exactly `false`.
    pub require_approval: Option<Value>,
    /// `sandbox`: the host-owned sandbox id, a string; empty counts as missing.
    pub sandbox: Option<Value>,
    /// `network`: the host-owned egress policy id, a string; kept, not checked.
    pub network: Option<Value>,
    /// `limits`: the stream limits.
    pub limits: Option<RawStreamLimits>,
    /// `runLimits`: a run-limit layer (see [`RunLimitsLayer::from_json`]).
    pub run_limits: Option<Value>,
}

/// The `limits` of a [`RawDevicePolicy`], unchecked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawStreamLimits {
    /// `maxChunkBytes`: an integer in `1..=8 MiB`; default 1 MiB.
    pub max_chunk_bytes: Option<Value>,
    /// `maxConcurrentSessions`: an integer in `1..=4`; default 1.
    pub max_concurrent_sessions: Option<Value>,
}

/// `value` unless it is `null`.
fn present(value: &Value) -> Option<Value> {
    (!value.is_null()).then(|| value.clone())
}

impl RawDevicePolicy {
    /// Reads a policy from JSON; only its shape is checked here, the values
    /// by [`resolve`].
    pub fn from_json(value: &Value) -> Result<RawDevicePolicy, AdmissionError> {
        let Value::Object(fields) = value else {
            return Err(InputError::Malformed("expected an object".to_owned()).into());
        };
        let mut raw = RawDevicePolicy::default();
        for (name, value) in fields {
            match name.as_str() {
                "enabled" => raw.enabled = present(value),
                "requireApproval" => raw.require_approval = present(value),
                "sandbox" => raw.sandbox = present(value),
                "network" => raw.network = present(value),
                "runLimits" => raw.run_limits = present(value),
                "limits" => raw.limits = RawStreamLimits::from_json(value)?,
                _ => return Err(InputError::Malformed(format!("unknown field `{name}`")).into()),
            }
        }
        Ok(raw)
    }
}

impl TryFrom<Value> for RawDevicePolicy {
    type Error = AdmissionError;

    fn try_from(value: Value) -> Result<Self, Self::Error> {
        RawDevicePolicy::from_json(&value)
    }
}

impl RawStreamLimits {
    fn from_json(value: &Value) -> Result<Option<RawStreamLimits>, AdmissionError> {
        let fields = match value {
            Value::Null => return Ok(None),
            Value::Object(fields) => fields,
            _ => {
                return Err(InputError::FieldType {
                    field: "limits",
                    expected: "an object",
                }
                .into());
            }
        };
        let mut limits = RawStreamLimits::default();
        for (name, value) in fields {
            match name.as_str() {
                "maxChunkBytes" => limits.max_chunk_bytes = present(value),
                "maxConcurrentSessions" => limits.max_concurrent_sessions = present(value),
                _ => {
                    return Err(
                        InputError::Malformed(format!("unknown field `limits.{name}`")).into(),
                    );
                }
            }
        }
        Ok(Some(limits))
    }
}

/// Values given when a policy is resolved; each one set replaces the
/// configured value, which is then not read at all (as in Prism, where
/// `options.x ?? adapter.x`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolveOptions {
    /// Replaces `limits.maxChunkBytes`; still checked against the cap.
    pub max_chunk_bytes: Option<u64>,
    /// Replaces `limits.maxConcurrentSessions`; still checked against the cap.
    pub max_concurrent_sessions: Option<u64>,
    /// Replaces `runLimits`.
    pub run_limits: Option<RunLimits>,
}

/// A checked device-class policy. Only [`resolve`] makes one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedPolicy {
    kind: DeviceClass,
    enabled: bool,
    require_approval: bool,
    max_chunk_bytes: u64,
    max_concurrent_sessions: u64,
    sandbox: Option<String>,
    network: Option<String>,
    run_limits: Option<RunLimits>,
}

impl ResolvedPolicy {
    /// The device class.
    pub fn kind(&self) -> DeviceClass {
        self.kind
    }

    /// Whether the class is enabled (`enabled` was exactly `true`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether side effects need approval (`requireApproval` was not exactly `false`).
    pub fn requires_approval(&self) -> bool {
        self.require_approval
    }

    /// The stream chunk cap in bytes.
    pub fn max_chunk_bytes(&self) -> u64 {
        self.max_chunk_bytes
    }

    /// Concurrent sessions per identity.
    pub fn max_concurrent_sessions(&self) -> u64 {
        self.max_concurrent_sessions
    }

    /// The sandbox id; never empty.
    pub fn sandbox(&self) -> Option<&str> {
        self.sandbox.as_deref()
    }

    /// The egress policy id; never empty.
    pub fn network(&self) -> Option<&str> {
        self.network.as_deref()
    }

    /// The configured run budget, if any.
    pub fn run_limits(&self) -> Option<&RunLimits> {
        self.run_limits.as_ref()
    }
}

/// Resolves a device-class policy: defaults, caps, and the values of `options`
/// in place of the configured ones.
///
/// Checked in this order, first failure wins: `maxChunkBytes`,
/// `maxConcurrentSessions`, `sandbox`, `network`, `runLimits`. A cap must be
/// an integer (`8.0` is one, JSON does not tell them apart) in `1..=cap`; a
/// string, boolean, fraction or out-of-range number is
/// `<name> must be a positive safe integer at most <cap>`. `enabled` and
/// `requireApproval` never fail: any value other than exactly `true` (resp.
/// exactly `false`) is the safe choice. `sandbox` and `network` must be
/// strings; an empty one is missing.
pub fn resolve(
    kind: DeviceClass,
    raw: &RawDevicePolicy,
    options: &ResolveOptions,
) -> Result<ResolvedPolicy, AdmissionError> {
    let limits = raw.limits.as_ref();
    let max_chunk_bytes = cap(
        "maxChunkBytes",
        options.max_chunk_bytes,
        limits.and_then(|l| l.max_chunk_bytes.as_ref()),
        DEFAULT_MAX_CHUNK_BYTES,
        HARD_MAX_CHUNK_BYTES,
    )?;
    let max_concurrent_sessions = cap(
        "maxConcurrentSessions",
        options.max_concurrent_sessions,
        limits.and_then(|l| l.max_concurrent_sessions.as_ref()),
        DEFAULT_MAX_CONCURRENT_SESSIONS,
        HARD_MAX_CONCURRENT_SESSIONS,
    )?;
    let sandbox = id("sandbox", raw.sandbox.as_ref())?;
    let network = id("network", raw.network.as_ref())?;
    let run_limits = match (&options.run_limits, &raw.run_limits) {
        (Some(limits), _) => Some(*limits),
        (None, Some(layer)) => Some(RunLimits::from_layer(&RunLimitsLayer::from_json(layer)?)?),
        (None, None) => None,
    };
    Ok(ResolvedPolicy {
        kind,
        enabled: matches!(raw.enabled, Some(Value::Bool(true))),
        require_approval: !matches!(raw.require_approval, Some(Value::Bool(false))),
        max_chunk_bytes,
        max_concurrent_sessions,
        sandbox,
        network,
        run_limits,
    })
}

fn cap(
    name: &'static str,
    given: Option<u64>,
    configured: Option<&Value>,
    default: u64,
    max: u64,
) -> Result<u64, InputError> {
    let value = match (given, configured) {
        (Some(given), _) => Some(given),
        (None, Some(configured)) => configured.as_f64().and_then(safe_integer),
        (None, None) => Some(default),
    };
    value
        .filter(|value| (1..=max).contains(value))
        .ok_or(InputError::Cap { name, max })
}

fn id(field: &'static str, value: Option<&Value>) -> Result<Option<String>, InputError> {
    match value {
        None => Ok(None),
        Some(Value::String(text)) if text.is_empty() => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(InputError::FieldType {
            field,
            expected: "a string",
        }),
    }
}

/// One admission: a connect or a resume of a device session.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdmissionRequest<'a> {
    /// Whether the host approved this device side effect.
    pub approved: bool,
    /// The identity's active sessions of this class, as reported: a number
    /// that may arrive negative, fractional or not finite, and is then refused
    /// (`activeSessions must be a non-negative safe integer`).
    pub active_sessions: f64,
    /// The run budget of the calling agent session, if it has one.
    pub run_limits: Option<&'a RunLimits>,
}

/// Proof of one admission, and the budget the session must charge. Only
/// [`admit`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    kind: DeviceClass,
    run_limits: RunLimits,
}

impl Admitted {
    /// The device class admitted.
    pub fn kind(&self) -> DeviceClass {
        self.kind
    }

    /// The run budget to charge: the policy's and the request's, the smaller
    /// limit by limit when both are given.
    pub fn run_limits(&self) -> &RunLimits {
        &self.run_limits
    }
}

/// Admits a device session or refuses it, checking in the contract's order
/// (first failure wins): enabled, sandbox, approval, `activeSessions` well
/// formed, under the session cap, run limits present (the policy's or the
/// request's).
///
/// Run it on every connect and every resume: an admission is not carried
/// over a reconnect, so side effects never replay.
pub fn admit(
    policy: &ResolvedPolicy,
    request: AdmissionRequest<'_>,
) -> Result<Admitted, AdmissionError> {
    let kind = policy.kind;
    if !policy.enabled {
        return Err(AdmissionError::Disabled(DisabledReason::NotEnabled {
            kind,
        }));
    }
    if policy.sandbox.is_none() {
        return Err(AdmissionError::Disabled(DisabledReason::NoSandbox { kind }));
    }
    if policy.require_approval && !request.approved {
        return Err(AdmissionError::Approval { kind });
    }
    let active = safe_integer(request.active_sessions).ok_or(InputError::ActiveSessions)?;
    if active >= policy.max_concurrent_sessions {
        return Err(AdmissionError::Sessions {
            kind,
            max: policy.max_concurrent_sessions,
        });
    }
    let run_limits = match (policy.run_limits.as_ref(), request.run_limits) {
        (Some(configured), Some(session)) => configured.narrowed_by(session),
        (Some(limits), None) | (None, Some(limits)) => *limits,
        (None, None) => return Err(AdmissionError::RunLimits { kind }),
    };
    Ok(Admitted { kind, run_limits })
}

/// What became of one stream chunk.
///
/// Serialises as Prism reports it: `{"accepted":true,"bytes":n}` or
/// `{"accepted":false,"bytes":n,"marker":"dropped_oversize"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkVerdict {
    /// Within the cap: forward it.
    Accepted {
        /// The chunk's size.
        bytes: u64,
    },
    /// Over the cap: dropped, never forwarded, reported with [`DROPPED_OVERSIZE`].
    DroppedOversize {
        /// The chunk's size.
        bytes: u64,
    },
}

impl ChunkVerdict {
    /// Whether the chunk may be forwarded.
    pub fn accepted(&self) -> bool {
        matches!(self, ChunkVerdict::Accepted { .. })
    }

    /// The chunk's size.
    pub fn bytes(&self) -> u64 {
        match *self {
            ChunkVerdict::Accepted { bytes } | ChunkVerdict::DroppedOversize { bytes } => bytes,
        }
    }

    /// [`DROPPED_OVERSIZE`] for a dropped chunk.
    pub fn marker(&self) -> Option<&'static str> {
        match self {
            ChunkVerdict::Accepted { .. } => None,
            ChunkVerdict::DroppedOversize { .. } => Some(DROPPED_OVERSIZE),
        }
    }
}

impl Serialize for ChunkVerdict {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.accepted() { 2 } else { 3 };
        let mut out = serializer.serialize_struct("ChunkVerdict", fields)?;
        out.serialize_field("accepted", &self.accepted())?;
        out.serialize_field("bytes", &self.bytes())?;
        if let Some(marker) = self.marker() {
            out.serialize_field("marker", marker)?;
        }
        out.end()
    }
}

/// Checks one stream chunk against the policy's cap: at most the cap
/// (0 included) is accepted, more is dropped with the marker.
///
/// The size is an `f64` so that any size a peer can report (negative,
/// fractional, not finite, past 2^53) can be given and refused:
/// `chunk bytes must be a non-negative safe integer`.
pub fn accept_chunk(policy: &ResolvedPolicy, bytes: f64) -> Result<ChunkVerdict, AdmissionError> {
    let bytes = safe_integer(bytes).ok_or(AdmissionError::Chunk)?;
    if bytes > policy.max_chunk_bytes {
        Ok(ChunkVerdict::DroppedOversize { bytes })
    } else {
        Ok(ChunkVerdict::Accepted { bytes })
    }
}
