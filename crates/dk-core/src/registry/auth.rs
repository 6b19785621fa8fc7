//! Letting a paired device in: by its token ([`DeviceRegistry::authenticate`])
//! or by its channel's key ([`DeviceRegistry::authenticate_key`]), each
//! check the only maker of an [`AuthenticatedDevice`].

use std::collections::HashSet;
use std::sync::{PoisonError, RwLockWriteGuard};

use dk_proto::validate_manifest;
use serde_json::Value;
use subtle::ConstantTimeEq;

use super::state::{DeviceRegistry, PairedDevice, sha256};

impl DeviceRegistry {
    /// Checks a reconnecting device: the token's hash must equal the stored
    /// one (compared in constant time), and when the device sends its
    /// manifest, it must validate to the manifest the person approved.
    pub fn authenticate(
        &self,
        device_id: &str,
        token: &str,
        manifest: Option<&Value>,
    ) -> Result<AuthenticatedDevice, AuthError> {
        let device = self.connecting(device_id)?;
        let presented = sha256(token);
        // A device paired over dk/2 has no token: its key is its credential.
        if !bool::from(presented.ct_eq(&device.token_hash)) || device.key.is_some() {
            return Err(AuthError::WrongToken);
        }
        if let Some(manifest) = manifest {
            check_manifest(&device, manifest)?;
        }
        Ok(AuthenticatedDevice {
            device_id: device_id.to_owned(),
            generation: device.generation,
        })
    }

    /// Checks a device reconnecting over dk/2: `key`, the static key its
    /// channel was made with, must be the one pinned when it paired
    /// (compared in constant time; a device paired over v1 has none), and
    /// its manifest must validate to the one the person approved.
    pub fn authenticate_key(
        &self,
        device_id: &str,
        key: &[u8; 32],
        manifest: &Value,
    ) -> Result<AuthenticatedDevice, AuthError> {
        let device = self.connecting(device_id)?;
        let pinned = device.key.ok_or(AuthError::WrongKey)?;
        if !bool::from(pinned.ct_eq(key)) {
            return Err(AuthError::WrongKey);
        }
        check_manifest(&device, manifest)?;
        Ok(AuthenticatedDevice {
            device_id: device_id.to_owned(),
            generation: device.generation,
        })
    }

    /// Whether `text` is the token of a paired device (its hash is looked up
    /// among the devices' token hashes; used to keep tokens out of the audit
    /// log, events and logs). Authentication does not use this: it compares
    /// one device's hash in constant time.
    pub(crate) fn is_device_token(&self, text: &str) -> bool {
        let hash = sha256(text);
        self.token_hashes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&hash)
    }

    pub(super) fn token_hashes_mut(&self) -> RwLockWriteGuard<'_, HashSet<[u8; 32]>> {
        self.token_hashes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why a reconnecting device was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No device is paired under that id.
    #[error("device is not paired")]
    NotPaired,
    /// The token is wrong.
    #[error("wrong device token")]
    WrongToken,
    /// The manifest is not the one the person approved: pair again.
    #[error("manifest changed since pairing: pair again")]
    ManifestChanged,
    /// The channel was made with another key than the one pinned for the
    /// device, or the device paired on the other channel.
    #[error("wrong device key")]
    WrongKey,
}

/// A device whose token (and manifest, when it sent one) passed
/// [`DeviceRegistry::authenticate`], or whose key and manifest passed
/// [`DeviceRegistry::authenticate_key`]. Only those checks make one.
#[derive(Debug, Clone)]
pub struct AuthenticatedDevice {
    device_id: String,
    generation: u64,
}

impl AuthenticatedDevice {
    /// The device id.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }
    /// The pairing generation the device authenticated against.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Whether `manifest` validates to the one the person approved. Equal
/// validated manifests have equal digests: comparing the validated form
/// spares serialising and hashing it.
pub(super) fn check_manifest(device: &PairedDevice, manifest: &Value) -> Result<(), AuthError> {
    match validate_manifest(manifest) {
        Ok(m) if m == device.manifest => Ok(()),
        _ => Err(AuthError::ManifestChanged),
    }
}
