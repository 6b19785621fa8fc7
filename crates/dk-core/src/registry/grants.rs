//! What the person changes of a pairing after it is made: grants and
//! revocations of capabilities, and unpairing, each stored and audited in
//! one transaction and then told to memory and the registry's subscribers.

use super::state::{DeviceRegistry, RegistryEvent, audit_event};
use crate::by::By;
use crate::store::StoreError;
use crate::store::entry as schema;

impl DeviceRegistry {
    /// Grants `capability` on a paired device.
    pub fn grant(&self, device_id: &str, capability: &str) -> Result<(), GrantError> {
        self.grant_by(device_id, capability, None)
    }

    /// Grants `capability` on a paired device; the audit entry names `by`.
    pub fn grant_by(
        &self,
        device_id: &str,
        capability: &str,
        by: Option<&By>,
    ) -> Result<(), GrantError> {
        let changing = self.changing();
        let channel = {
            let devices = self.read();
            let entry = devices
                .get(device_id)
                .ok_or_else(|| GrantError::NotPaired(device_id.to_owned()))?;
            if entry.device.manifest.capability(capability).is_none()
                && entry.device.manifest.event(capability).is_none()
            {
                return Err(GrantError::NoSuchCapability {
                    device: device_id.to_owned(),
                    capability: capability.to_owned(),
                });
            }
            if entry.grants.contains(capability) {
                return Ok(());
            }
            entry.device.channel()
        };
        let audit = audit_event(
            &schema::GrantChange {
                device_id: device_id.to_owned(),
                capability: capability.to_owned(),
                channel: channel.as_str().to_owned(),
                by: by.cloned(),
            }
            .granted(),
        );
        let seen = self.applied();
        self.store
            .set_grant(device_id, capability, true, &audit)
            .map_err(GrantError::NotStored)?;
        self.audited();
        let applied = self.apply_if_unchanged(seen, || {
            if let Some(entry) = self.write().get_mut(device_id) {
                entry.grants.insert(capability.to_owned());
            }
        });
        if applied.is_some() {
            drop(changing);
            self.notify(RegistryEvent::Granted {
                device_id: device_id.to_owned(),
                capability: capability.to_owned(),
            });
        } else {
            self.catch_up(device_id, None);
            drop(changing);
        }
        self.changed_here(device_id);
        Ok(())
    }

    /// Revokes `capability`; revoking what is not granted does nothing.
    /// Takes effect on the next call and on a call waiting for the person.
    /// Fails only when the store cannot commit the change.
    pub fn revoke(&self, device_id: &str, capability: &str) -> Result<(), GrantError> {
        self.revoke_by(device_id, capability, None)
    }

    /// Revokes `capability` as [`DeviceRegistry::revoke`] does; the audit entry
    /// names `by`.
    pub fn revoke_by(
        &self,
        device_id: &str,
        capability: &str,
        by: Option<&By>,
    ) -> Result<(), GrantError> {
        let changing = self.changing();
        let channel = match self.get_with_grant(device_id, capability) {
            Some((device, true)) => device.channel(),
            _ => return Ok(()),
        };
        let audit = audit_event(
            &schema::GrantChange {
                device_id: device_id.to_owned(),
                capability: capability.to_owned(),
                channel: channel.as_str().to_owned(),
                by: by.cloned(),
            }
            .revoked(),
        );
        let seen = self.applied();
        self.store
            .set_grant(device_id, capability, false, &audit)
            .map_err(GrantError::NotStored)?;
        self.audited();
        let revoke = || {
            let held = self
                .write()
                .get_mut(device_id)
                .is_some_and(|entry| entry.grants.remove(capability));
            self.allowances.drop_capability(device_id, capability);
            let event = RegistryEvent::Revoked {
                device_id: device_id.to_owned(),
                capability: capability.to_owned(),
            };
            if held { vec![event] } else { Vec::new() }
        };
        match self.apply_if_unchanged(seen, revoke) {
            Some(_) => {
                drop(changing);
                self.notify(RegistryEvent::Revoked {
                    device_id: device_id.to_owned(),
                    capability: capability.to_owned(),
                });
            }
            None => {
                self.catch_up(device_id, Some(&revoke));
                drop(changing);
            }
        }
        self.changed_here(device_id);
        Ok(())
    }

    /// Forgets a device: its token stops working and its tools disappear.
    /// Unpairing what is not paired does nothing. Fails only when the store
    /// cannot commit the change.
    pub fn unpair(&self, device_id: &str) -> Result<(), GrantError> {
        self.unpair_by(device_id, None)
    }

    /// Forgets a device as [`DeviceRegistry::unpair`] does; the audit entry names
    /// `by`.
    pub fn unpair_by(&self, device_id: &str, by: Option<&By>) -> Result<(), GrantError> {
        let changing = self.changing();
        let Some(device) = self.get(device_id) else {
            return Ok(());
        };
        let audit = audit_event(&schema::Entry::Unpaired(schema::Unpaired {
            device_id: device_id.to_owned(),
            channel: device.channel().as_str().to_owned(),
            by: by.cloned(),
        }));
        let seen = self.applied();
        self.store
            .delete_pairing(device_id, &audit)
            .map_err(GrantError::NotStored)?;
        self.audited();
        let unpair = || self.forget(device_id);
        match self.apply_if_unchanged(seen, unpair) {
            Some(_) => {
                drop(changing);
                self.notify(RegistryEvent::Unpaired {
                    device_id: device_id.to_owned(),
                });
            }
            None => {
                self.catch_up(device_id, Some(&unpair));
                drop(changing);
            }
        }
        self.changed_here(device_id);
        Ok(())
    }
}

/// Why a grant was refused. `Display` gives 8DK's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// No device is paired under that id.
    #[error("device \"{0}\" is not paired")]
    NotPaired(String),
    /// The store could not commit the change; nothing changed.
    #[error("the change could not be saved: {0}")]
    NotStored(#[source] StoreError),
    /// The device declares no such capability.
    #[error("device \"{device}\" has no capability \"{capability}\"")]
    NoSuchCapability {
        /// The device id.
        device: String,
        /// The capability asked for.
        capability: String,
    },
}
