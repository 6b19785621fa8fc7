//! The device registry: pairing with the person's consent, device tokens
//! (kept only as SHA-256), authentication against the approved manifest,
//! grants, revocation and unpairing.
//!
//! Nothing is granted by default. Grants are read on every call, never
//! cached, and every pairing carries a generation number so a call that
//! waited for the person can tell that the device was paired again meanwhile.

mod auth;
mod consent;
mod grants;
mod pairing;
mod reads;
mod state;

pub use auth::{AuthError, AuthenticatedDevice};
pub use consent::{ConsentCapability, ConsentDecision, ConsentRequest};
pub use dk_proto::admin::{CapabilityChange, ChangeKind, CredentialChange, Difference, Replaced};
pub(crate) use dk_store::epoch_ms;
pub use grants::GrantError;
pub use state::{
    ChangeHook, DEFAULT_CONSENT_TIMEOUT, DeviceRegistry, DeviceSnapshot, DeviceToken, PairError,
    Paired, PairedDevice, RegistryEvent,
};

#[cfg(test)]
mod tests;
