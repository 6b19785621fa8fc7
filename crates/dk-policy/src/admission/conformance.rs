//! The conformance run: six cases an adapter must pass, in the contract's order.

use serde_json::{Value, json};

use super::error::{AdmissionCode, AdmissionError};
use super::names::DeviceClass;
use super::policy::{
    AdmissionRequest, Admitted, ChunkVerdict, DROPPED_OVERSIZE, RawDevicePolicy, ResolveOptions,
    ResolvedPolicy, resolve,
};
use super::redact::{Redactor, redact_telemetry};

/// The conformance cases, in the order they run and are reported.
pub const CONFORMANCE_CASES: [&str; 6] =
    [DENIAL, APPROVAL, SESSIONS, ACCOUNTING, BOUNDS, REDACTION];

const DENIAL: &str = "denial-by-default";
const APPROVAL: &str = "approval-gate";
const SESSIONS: &str = "session-budget";
const ACCOUNTING: &str = "run-accounting";
const BOUNDS: &str = "stream-bounds";
const REDACTION: &str = "redaction";

/// The secret the redaction case plants in telemetry.
const PLANTED_SECRET: &str = "dk-conformance-device-token-3f9a";

/// A streaming device adapter, as the conformance run sees it: a device class
/// with its configured policy, and the three gates the adapter puts its
/// traffic through.
///
/// The gates default to the contract's own functions ([`super::admit`],
/// [`super::accept_chunk`], [`redact_telemetry`]); an adapter that wraps or
/// replaces one overrides it, and the conformance run then checks the
/// adapter's gate rather than the contract's. [`DeviceConfig`] is the plain
/// configuration, with every gate left as the contract's.
pub trait DeviceAdapter {
    /// The device class.
    fn kind(&self) -> DeviceClass;

    /// The configured policy of the class.
    fn policy(&self) -> &RawDevicePolicy;

    /// Admits a session on connect and on resume.
    fn admit(
        &self,
        policy: &ResolvedPolicy,
        request: AdmissionRequest<'_>,
    ) -> Result<Admitted, AdmissionError> {
        super::admit(policy, request)
    }

    /// Bounds one stream chunk.
    fn accept_chunk(
        &self,
        policy: &ResolvedPolicy,
        bytes: f64,
    ) -> Result<ChunkVerdict, AdmissionError> {
        super::accept_chunk(policy, bytes)
    }

    /// Makes telemetry safe to emit: `redactor` is built by the host from its
    /// secrets; without one, telemetry must pass unchanged.
    fn redact_telemetry(&self, redactor: Option<&Redactor>, telemetry: &Value) -> Value {
        redact_telemetry(redactor, telemetry)
    }
}

/// A device class and its configured policy, with the contract's own gates.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceConfig {
    /// The device class.
    pub kind: DeviceClass,
    /// Its configured policy.
    pub policy: RawDevicePolicy,
}

impl DeviceAdapter for DeviceConfig {
    fn kind(&self) -> DeviceClass {
        self.kind
    }

    fn policy(&self) -> &RawDevicePolicy {
        &self.policy
    }
}

/// A conformance case that failed: which, with the case's code, and why.
///
/// The code is the case's own (`denial-by-default` DISABLED, `approval-gate`
/// APPROVAL, `session-budget` SESSIONS, `run-accounting` RUN_LIMITS,
/// `stream-bounds` CHUNK, `redaction` INPUT, as Prism raises them), except
/// when the adapter's policy does not resolve at all: then the case being set
/// up fails with INPUT, the resolution's own code (as in Prism, where
/// `resolveDevicePolicy` throws before the case can run).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("conformance case {case} failed with {code}: {reason}")]
pub struct ConformanceFailure {
    /// The case, one of [`CONFORMANCE_CASES`].
    pub case: &'static str,
    /// The code the case raises.
    pub code: AdmissionCode,
    /// What went wrong, one line.
    pub reason: String,
}

fn fail(case: &'static str, code: AdmissionCode, reason: impl Into<String>) -> ConformanceFailure {
    ConformanceFailure {
        case,
        code,
        reason: reason.into(),
    }
}

/// Expects `outcome` to be refused with `code`; else the case fails with `code`.
fn expect_refused<T>(
    case: &'static str,
    code: AdmissionCode,
    what: &str,
    outcome: Result<T, AdmissionError>,
) -> Result<(), ConformanceFailure> {
    match outcome {
        Err(error) if error.code() == code => Ok(()),
        Err(error) => Err(fail(
            case,
            code,
            format!(
                "{what} was refused with {} ({error}), not {code}",
                error.code()
            ),
        )),
        Ok(_) => Err(fail(case, code, format!("{what} was admitted"))),
    }
}

/// Runs the six conformance cases against `adapter`, in order, and returns
/// their names; the first case that fails stops the run.
///
/// The adapter's policy must first resolve as configured, with `options`
/// (else `denial-by-default` fails with INPUT). The cases then derive
/// policies from it (so its caps, sandbox and network are what is checked)
/// and use `options` as given, with
/// `options.run_limits`, or else the default budget, as the shared run budget:
///
/// 1. `denial-by-default`: `enabled` forced to `false`; an approved admission
///    with no active session is refused DISABLED.
/// 2. `approval-gate`: `enabled` and `requireApproval` forced to `true`, the
///    sandbox kept (`sandbox` when none is configured; an empty one stays
///    empty and so fails); unapproved is refused APPROVAL, approved admitted.
/// 3. `session-budget`: that policy with the identity at its session cap is
///    refused SESSIONS.
/// 4. `run-accounting`: enabled, sandboxed, no run limits anywhere; refused
///    RUN_LIMITS.
/// 5. `stream-bounds`: cap + 1 bytes dropped with `dropped_oversize`, cap
///    bytes accepted (else CHUNK).
/// 6. `redaction`: a secret planted in a string and a key is gone from the
///    redacted telemetry, and without a redactor telemetry passes unchanged
///    (else INPUT).
pub fn run_device_policy_conformance(
    adapter: &dyn DeviceAdapter,
    options: &ResolveOptions,
) -> Result<Vec<&'static str>, ConformanceFailure> {
    let run = Run::new(adapter, options);
    // The policy as configured must resolve before any case can run.
    run.resolved(DENIAL, run.configured, options)?;
    run.denial_by_default()?;
    let enabled = run.approval_gate()?;
    run.session_budget(&enabled)?;
    run.run_accounting()?;
    run.stream_bounds(&enabled)?;
    run.redaction()?;
    Ok(CONFORMANCE_CASES.to_vec())
}

/// An approved admission with no active session and no run budget of its
/// own: what each case changes one thing of.
fn approved() -> AdmissionRequest<'static> {
    AdmissionRequest {
        approved: true,
        active_sessions: 0.0,
        run_limits: None,
    }
}

/// One conformance run: the adapter, its configured policy, and the
/// options the cases resolve their policies with.
struct Run<'a> {
    adapter: &'a dyn DeviceAdapter,
    kind: DeviceClass,
    configured: &'a RawDevicePolicy,
    options: &'a ResolveOptions,
    /// `options` with a run budget (its own, else the default).
    accounted: ResolveOptions,
}

impl<'a> Run<'a> {
    fn new(adapter: &'a dyn DeviceAdapter, options: &'a ResolveOptions) -> Self {
        Run {
            adapter,
            kind: adapter.kind(),
            configured: adapter.policy(),
            options,
            accounted: ResolveOptions {
                run_limits: Some(options.run_limits.unwrap_or_default()),
                ..options.clone()
            },
        }
    }

    /// `raw` resolved for the adapter's class; else `case` fails with the
    /// resolution's code.
    fn resolved(
        &self,
        case: &'static str,
        raw: &RawDevicePolicy,
        options: &ResolveOptions,
    ) -> Result<ResolvedPolicy, ConformanceFailure> {
        resolve(self.kind, raw, options)
            .map_err(|error| fail(case, error.code(), error.to_string()))
    }

    /// `denial-by-default`: the policy disabled refuses an approved admission.
    fn denial_by_default(&self) -> Result<(), ConformanceFailure> {
        let disabled = self.resolved(
            DENIAL,
            &RawDevicePolicy {
                enabled: Some(Value::Bool(false)),
                ..self.configured.clone()
            },
            &self.accounted,
        )?;
        expect_refused(
            DENIAL,
            AdmissionCode::Disabled,
            "a disabled device",
            self.adapter.admit(&disabled, approved()),
        )
    }

    /// `approval-gate`: the policy enabled and asking for approval, in its
    /// sandbox, refuses an unapproved admission and admits an approved one.
    /// Returns that policy, which the later cases use.
    fn approval_gate(&self) -> Result<ResolvedPolicy, ConformanceFailure> {
        let enabled = self.resolved(
            APPROVAL,
            &RawDevicePolicy {
                enabled: Some(Value::Bool(true)),
                require_approval: Some(Value::Bool(true)),
                sandbox: Some(
                    self.configured
                        .sandbox
                        .clone()
                        .unwrap_or_else(|| Value::String("sandbox".to_owned())),
                ),
                ..self.configured.clone()
            },
            &self.accounted,
        )?;
        expect_refused(
            APPROVAL,
            AdmissionCode::Approval,
            "an unapproved side effect",
            self.adapter.admit(
                &enabled,
                AdmissionRequest {
                    approved: false,
                    ..approved()
                },
            ),
        )?;
        if let Err(error) = self.adapter.admit(&enabled, approved()) {
            return Err(fail(
                APPROVAL,
                AdmissionCode::Approval,
                format!("an approved side effect was refused: {error}"),
            ));
        }
        Ok(enabled)
    }

    /// `session-budget`: the `enabled` policy refuses an identity at its
    /// session cap.
    fn session_budget(&self, enabled: &ResolvedPolicy) -> Result<(), ConformanceFailure> {
        // The cap is at most 4, so the conversion is exact.
        let at_cap = enabled.max_concurrent_sessions() as f64;
        expect_refused(
            SESSIONS,
            AdmissionCode::Sessions,
            "a session over the cap",
            self.adapter.admit(
                enabled,
                AdmissionRequest {
                    active_sessions: at_cap,
                    ..approved()
                },
            ),
        )
    }

    /// `run-accounting`: enabled and sandboxed with no run limits anywhere,
    /// an admission is refused.
    fn run_accounting(&self) -> Result<(), ConformanceFailure> {
        let unaccounted = self.resolved(
            ACCOUNTING,
            &RawDevicePolicy {
                enabled: Some(Value::Bool(true)),
                sandbox: Some(Value::String("sandbox".to_owned())),
                run_limits: None,
                ..self.configured.clone()
            },
            &ResolveOptions {
                run_limits: None,
                ..self.options.clone()
            },
        )?;
        expect_refused(
            ACCOUNTING,
            AdmissionCode::RunLimits,
            "a session without run limits",
            self.adapter.admit(&unaccounted, approved()),
        )
    }

    /// `stream-bounds`: under the `enabled` policy a chunk one byte over
    /// the cap is dropped with its marker, one of exactly the cap accepted.
    fn stream_bounds(&self, enabled: &ResolvedPolicy) -> Result<(), ConformanceFailure> {
        // The cap is at most 8 MiB, so both conversions are exact.
        let cap = enabled.max_chunk_bytes();
        let over = self
            .adapter
            .accept_chunk(enabled, cap.saturating_add(1) as f64);
        if !matches!(&over, Ok(verdict) if !verdict.accepted() && verdict.marker() == Some(DROPPED_OVERSIZE))
        {
            return Err(fail(
                BOUNDS,
                AdmissionCode::Chunk,
                format!(
                    "an oversize chunk of {} bytes was not dropped",
                    cap.saturating_add(1)
                ),
            ));
        }
        if !matches!(self.adapter.accept_chunk(enabled, cap as f64), Ok(verdict) if verdict.accepted())
        {
            return Err(fail(
                BOUNDS,
                AdmissionCode::Chunk,
                format!("a chunk of exactly {cap} bytes was not accepted"),
            ));
        }
        Ok(())
    }

    /// `redaction`: a secret planted in a string and a key is gone from
    /// redacted telemetry, and without a redactor telemetry is unchanged.
    fn redaction(&self) -> Result<(), ConformanceFailure> {
        let redactor = Redactor::new([PLANTED_SECRET]);
        let leaky = json!({
            "note": format!("leak {PLANTED_SECRET}"),
            PLANTED_SECRET: ["nested", {"token": PLANTED_SECRET}],
        });
        let redacted = self.adapter.redact_telemetry(Some(&redactor), &leaky);
        if redacted.to_string().contains(PLANTED_SECRET) {
            return Err(fail(
                REDACTION,
                AdmissionCode::Input,
                "a secret survived telemetry redaction",
            ));
        }
        let plain = json!({"note": "ok"});
        if self.adapter.redact_telemetry(None, &plain) != plain {
            return Err(fail(
                REDACTION,
                AdmissionCode::Input,
                "telemetry changed without a redactor",
            ));
        }
        Ok(())
    }
}
