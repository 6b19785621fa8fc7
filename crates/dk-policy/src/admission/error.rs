//! Admission errors: one variant per stable code, each carrying the specific reason.

use super::names::{DeviceClass, RunLimit};

/// The stable error codes of the admission contract, as Prism names them:
/// dk-proto's, the same type a device reads from a 4011 close.
pub use dk_proto::AdmissionCode;

/// Why a device class, configuration or request is refused.
///
/// Each variant is exactly one [`AdmissionCode`] ([`AdmissionError::code`]);
/// `Display` is the contract's message, word for word.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// `ERR_PRISM_DEVICE_DISABLED`: not enabled, or enabled without a sandbox.
    #[error("{0}")]
    Disabled(DisabledReason),
    /// `ERR_PRISM_DEVICE_APPROVAL`: `<kind> device side effect requires approval`.
    #[error("{kind} device side effect requires approval")]
    Approval {
        /// The device class refused.
        kind: DeviceClass,
    },
    /// `ERR_PRISM_DEVICE_SESSIONS`: `concurrent <kind> sessions capped at <max>`.
    #[error("concurrent {kind} sessions capped at {max}")]
    Sessions {
        /// The device class refused.
        kind: DeviceClass,
        /// The resolved `maxConcurrentSessions`.
        max: u64,
    },
    /// `ERR_PRISM_DEVICE_CHUNK`: `chunk bytes must be a non-negative safe integer`.
    #[error("chunk bytes must be a non-negative safe integer")]
    Chunk,
    /// `ERR_PRISM_DEVICE_RUN_LIMITS`: `<kind> device must consume shared RunLimits`.
    #[error("{kind} device must consume shared RunLimits")]
    RunLimits {
        /// The device class refused.
        kind: DeviceClass,
    },
    /// `ERR_PRISM_DEVICE_INPUT`: the configuration or the request is malformed.
    #[error("{0}")]
    Input(InputError),
}

impl AdmissionError {
    /// The stable code of this error.
    pub const fn code(&self) -> AdmissionCode {
        match self {
            AdmissionError::Disabled(_) => AdmissionCode::Disabled,
            AdmissionError::Approval { .. } => AdmissionCode::Approval,
            AdmissionError::Sessions { .. } => AdmissionCode::Sessions,
            AdmissionError::Chunk => AdmissionCode::Chunk,
            AdmissionError::RunLimits { .. } => AdmissionCode::RunLimits,
            AdmissionError::Input(_) => AdmissionCode::Input,
        }
    }
}

impl From<InputError> for AdmissionError {
    fn from(error: InputError) -> Self {
        AdmissionError::Input(error)
    }
}

/// The two ways a device class is disabled (`ERR_PRISM_DEVICE_DISABLED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DisabledReason {
    /// `enabled` was not exactly `true`: `<kind> device is disabled by default`.
    #[error("{kind} device is disabled by default")]
    NotEnabled {
        /// The device class refused.
        kind: DeviceClass,
    },
    /// No sandbox, or an empty one: `<kind> device requires an explicit sandbox`.
    #[error("{kind} device requires an explicit sandbox")]
    NoSandbox {
        /// The device class refused.
        kind: DeviceClass,
    },
}

/// A malformed configuration or request (`ERR_PRISM_DEVICE_INPUT`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A device kind other than `voice` or `desktop-control` (message fixed by the contract).
    #[error("device kind must be 'voice' or 'desktop-control'")]
    UnknownKind,
    /// `maxChunkBytes` or `maxConcurrentSessions` out of range or not an integer
    /// (message fixed by the contract).
    #[error("{name} must be a positive safe integer at most {max}")]
    Cap {
        /// `maxChunkBytes` or `maxConcurrentSessions`.
        name: &'static str,
        /// The hard cap.
        max: u64,
    },
    /// `activeSessions` negative, fractional or not finite (message fixed by the contract).
    #[error("activeSessions must be a non-negative safe integer")]
    ActiveSessions,
    /// A run limit out of range or not an integer, as Prism words it.
    #[error("{} must be a positive safe integer at most {}", limit.name(), limit.hard_cap())]
    RunLimit {
        /// The limit.
        limit: RunLimit,
    },
    /// A run-limit layer naming a limit that does not exist.
    #[error("unknown run limit `{0}`")]
    UnknownRunLimit(String),
    /// A field of the wrong type, e.g. a number where the sandbox id belongs.
    #[error("{field} must be {expected}")]
    FieldType {
        /// The field, as it is spelt in the configuration.
        field: &'static str,
        /// What it must be, e.g. `a string`.
        expected: &'static str,
    },
    /// A device-class configuration that does not have the contract's shape
    /// (not an object, an unknown field, a `limits` that is not an object).
    #[error("device policy is malformed: {0}")]
    Malformed(String),
}
