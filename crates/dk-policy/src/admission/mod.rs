//! The admission contract for streaming devices (voice, desktop control): pure
//! policy, no IO.
//!
//! dk adopts the deny-by-default contract of the Prism agent framework
//! (`@arnilo/prism`, `src/devices.ts`); `/work/shared/spec/admission.md` is
//! the specification. In short:
//!
//! - A host configures each device class it accepts ([`RawDevicePolicy`],
//!   read from JSON or any serde format) and [`resolve`]s it: defaults, hard
//!   caps, values given at resolve time ([`ResolveOptions`]) in place of the
//!   configured ones.
//! - [`admit`] checks, in order, first failure wins: enabled, sandbox,
//!   approval, `activeSessions` well formed, under the session cap, a shared
//!   run budget. Run it on every connect and every resume.
//! - [`accept_chunk`] bounds each stream chunk: over the cap is dropped with
//!   the `dropped_oversize` marker, never forwarded.
//! - A [`Redactor`] removes every known secret from telemetry, in strings and
//!   object keys, before it is emitted or stored; [`redact_telemetry`] with no
//!   redactor passes telemetry unchanged.
//! - [`RunLimits`] is the run budget every device call charges
//!   ([`RunTracker`]); a run-level layer only narrows an agent-level one ([`narrow`]).
//! - [`run_device_policy_conformance`] checks a [`DeviceAdapter`] against
//!   the six cases of the contract.
//!
//! Every refusal is an [`AdmissionError`] whose [`AdmissionError::code`] is
//! one of Prism's stable codes and whose message is the contract's, word for
//! word.
//!
//! ```
//! use dk_policy::{
//!     AdmissionRequest, DeviceClass, RawDevicePolicy, ResolveOptions, RunLimits, admit,
//!     resolve,
//! };
//!
//! let raw = RawDevicePolicy::from_json(&serde_json::json!({
//!     "enabled": true,
//!     "sandbox": "sandbox-a",
//!     "limits": {"maxConcurrentSessions": 2},
//! }))?;
//! let policy = resolve(DeviceClass::Voice, &raw, &ResolveOptions::default())?;
//! let session_budget = RunLimits::default();
//! let request = AdmissionRequest {
//!     approved: false,
//!     active_sessions: 0.0,
//!     run_limits: Some(&session_budget),
//! };
//! let refused = admit(&policy, request).unwrap_err();
//! assert_eq!(refused.code().as_str(), "ERR_PRISM_DEVICE_APPROVAL");
//! assert_eq!(refused.to_string(), "voice device side effect requires approval");
//! let admitted = admit(&policy, AdmissionRequest { approved: true, ..request })?;
//! assert_eq!(admitted.run_limits(), &session_budget);
//! # Ok::<(), dk_policy::AdmissionError>(())
//! ```

mod conformance;
mod error;
mod limits;
mod names;
mod policy;
mod redact;

pub use conformance::{
    CONFORMANCE_CASES, ConformanceFailure, DeviceAdapter, DeviceConfig,
    run_device_policy_conformance,
};
pub use error::{AdmissionCode, AdmissionError, DisabledReason, InputError};
pub use limits::{RunLimitBreach, RunLimits, RunLimitsLayer, RunTracker, narrow};
pub use names::{DeviceClass, MAX_SAFE_INTEGER, RunLimit};
pub use policy::{
    AdmissionRequest, Admitted, ChunkVerdict, DEFAULT_MAX_CHUNK_BYTES,
    DEFAULT_MAX_CONCURRENT_SESSIONS, DROPPED_OVERSIZE, HARD_MAX_CHUNK_BYTES,
    HARD_MAX_CONCURRENT_SESSIONS, RawDevicePolicy, RawStreamLimits, ResolveOptions, ResolvedPolicy,
    accept_chunk, admit, resolve,
};
pub use redact::{MAX_DEPTH_MARKER, MAX_TELEMETRY_DEPTH, REDACTED, Redactor, redact_telemetry};

/// Fuzzing hook: reads arbitrary bytes as JSON and feeds it to every part of
/// the contract. Never panics.
///
/// The JSON may hold `kind`, `policy`, `approved`, `activeSessions`, `chunk`,
/// `secrets`, `runLimits` and `telemetry`; whatever is missing is taken from
/// the whole document.
#[doc(hidden)]
pub fn fuzz_admission(data: &[u8]) {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let field = |name: &str| doc.get(name).unwrap_or(&doc);
    let kinds: Vec<DeviceClass> = match doc.get("kind").and_then(|k| k.as_str()) {
        Some(kind) => DeviceClass::parse(kind).into_iter().collect(),
        None => DeviceClass::ALL.to_vec(),
    };
    let secrets: Vec<&str> = match field("secrets") {
        serde_json::Value::Array(items) => items.iter().filter_map(|s| s.as_str()).collect(),
        other => other.as_str().into_iter().collect(),
    };
    let redactor = Redactor::new(&secrets);
    let _ = redactor.redact_json(&doc);
    let _ = redact_telemetry(None, field("telemetry"));
    let layer = RunLimitsLayer::from_json(field("runLimits")).ok();
    let session = narrow(layer.as_ref(), layer.as_ref()).ok();
    let mut tracker = RunTracker::new(session.unwrap_or_default(), 0);
    for amount in [0, 1, u64::MAX] {
        let _ = tracker.charge_usage(amount, amount);
        let _ = tracker.charge_request_bytes(amount);
        let _ = tracker.check_wall_time(amount);
    }
    let Ok(raw) = RawDevicePolicy::from_json(field("policy")) else {
        return;
    };
    for kind in kinds {
        let adapter = DeviceConfig {
            kind,
            policy: raw.clone(),
        };
        let _ = run_device_policy_conformance(&adapter, &ResolveOptions::default());
        let Ok(policy) = resolve(kind, &raw, &ResolveOptions::default()) else {
            continue;
        };
        let request = AdmissionRequest {
            approved: doc
                .get("approved")
                .is_some_and(|a| a.as_bool() == Some(true)),
            active_sessions: doc
                .get("activeSessions")
                .and_then(|a| a.as_f64())
                .unwrap_or(0.0),
            run_limits: session.as_ref(),
        };
        if let Ok(admitted) = admit(&policy, request) {
            let _ = admitted.run_limits().get(RunLimit::MaxToolCalls);
        }
        let chunk = doc.get("chunk").and_then(|c| c.as_f64()).unwrap_or(-1.0);
        for bytes in [chunk, f64::NAN, f64::INFINITY, -0.0, 1.5] {
            let _ = accept_chunk(&policy, bytes);
        }
    }
}

#[cfg(test)]
mod tests;
