//! Pairing a device: [`DeviceRegistry::pair`] (a code drawn and shown),
//! [`DeviceRegistry::pair_with_key`] (dk/2's code, the key pinned), and
//! the one path both take, asking the person and storing what they said.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use dk_proto::{Channel, Manifest, validate_manifest};
use serde_json::Value;

use super::consent::{ConsentCapability, ConsentDecision, ConsentRequest};
use super::state::{
    DeviceRegistry, DeviceToken, Entry, PairError, Paired, PairedDevice, RegistryEvent,
    audit_event, pairing_code, sha256,
};
use crate::allowances::RevokeCause;
use crate::store::StoredPairing;
use crate::store::entry as schema;
use dk_store::epoch_ms;

impl DeviceRegistry {
    /// Pairs a device over v1. The manifest is validated first (an invalid
    /// one never reaches the person); then a 6-digit code is drawn, handed to
    /// `show_code` (for the device to display), and the person is asked
    /// through `consent`. No answer within `timeout`, an error or a no pairs
    /// nothing. A yes stores the approved manifest, the token's hash and the
    /// grants, replacing any earlier pairing of the same id.
    pub async fn pair<F, Fut, E>(
        &self,
        manifest: &Value,
        show_code: impl FnOnce(&str),
        consent: F,
        timeout: Duration,
    ) -> Result<Paired, PairError>
    where
        F: FnOnce(ConsentRequest) -> Fut,
        Fut: Future<Output = Result<ConsentDecision, E>>,
    {
        let manifest = validate_manifest(manifest).map_err(PairError::InvalidManifest)?;
        let code = pairing_code();
        show_code(&code);
        self.ask_and_pair(manifest, code, None, consent, timeout)
            .await
    }

    /// Pairs a device over dk/2: as [`DeviceRegistry::pair`], but the code
    /// is the one both sides computed from the channel (never sent), and a
    /// yes pins `key`, the static key the device made the channel with, as
    /// its credential, in the same commit as the pairing and its audit
    /// entry. No token is made for the device to keep.
    pub async fn pair_with_key<F, Fut, E>(
        &self,
        manifest: Manifest,
        code: String,
        key: [u8; 32],
        consent: F,
        timeout: Duration,
    ) -> Result<Paired, PairError>
    where
        F: FnOnce(ConsentRequest) -> Fut,
        Fut: Future<Output = Result<ConsentDecision, E>>,
    {
        self.ask_and_pair(manifest, code, Some(key), consent, timeout)
            .await
    }

    pub(super) async fn ask_and_pair<F, Fut, E>(
        &self,
        manifest: Manifest,
        code: String,
        key: Option<[u8; 32]>,
        consent: F,
        timeout: Duration,
    ) -> Result<Paired, PairError>
    where
        F: FnOnce(ConsentRequest) -> Fut,
        Fut: Future<Output = Result<ConsentDecision, E>>,
    {
        let request = self.consent_request(&manifest, code, key);
        let channel = request.channel;
        let credential = request.replaces.as_ref().and_then(|old| old.credential);
        // What the person is shown as replaced must be what is replaced.
        let seen = self.get(manifest.id()).map(|d| d.generation);
        let decision = match tokio::time::timeout(timeout, consent(request)).await {
            Ok(Ok(decision)) if decision.approved => decision,
            _ => return Err(PairError::NotApproved),
        };
        check_decision(&manifest, &decision, credential.is_some())?;
        let token = DeviceToken::generate();
        let changing = self.changing();
        if self.get(manifest.id()).map(|d| d.generation) != seen {
            return Err(PairError::ChangedMeanwhile);
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let device_id = manifest.id().to_owned();
        let device = PairedDevice {
            digest: manifest.digest(),
            manifest,
            token_hash: sha256(token.expose()),
            key,
            paired_at: SystemTime::now(),
            generation,
        };
        let seen_applied = self.store_pairing(&device, &decision, channel)?;
        let entry = Entry {
            device: Arc::new(device),
            grants: decision.grant.into_iter().collect(),
        };
        self.take_pairing(entry, seen_applied, changing);
        Ok(Paired {
            device_id,
            token,
            generation,
        })
    }

    /// What the person is asked about pairing `manifest` (with `key` on
    /// dk/2), the code they see being `code`: its capabilities and events,
    /// and the pairing it would replace.
    fn consent_request(
        &self,
        manifest: &Manifest,
        code: String,
        key: Option<[u8; 32]>,
    ) -> ConsentRequest {
        let channel = if key.is_some() {
            Channel::Dk2
        } else {
            Channel::V1
        };
        ConsentRequest {
            device_id: manifest.id().to_owned(),
            name: manifest.name().to_owned(),
            kind: manifest.kind().to_owned(),
            code,
            capabilities: manifest
                .capabilities()
                .iter()
                .map(ConsentCapability::of)
                .collect(),
            events: dk_proto::admin::DeclaredEvent::all_of(manifest),
            replaces: self.replaced(manifest, key.as_ref()).map(Box::new),
            no_screen: manifest.no_screen(),
            channel,
        }
    }

    /// Commits the pairing of `device` the person decided on, with its
    /// audit entry, before the device or the person hears of it. Returns
    /// what memory had applied before the commit, for
    /// [`DeviceRegistry::take_pairing`].
    fn store_pairing(
        &self,
        device: &PairedDevice,
        decision: &ConsentDecision,
        channel: Channel,
    ) -> Result<u64, PairError> {
        let device_id = device.manifest.id();
        let replaced = self.is_paired(device_id);
        let stored = StoredPairing {
            device_id: device_id.to_owned(),
            manifest_json: device.manifest.to_stored_json(),
            digest: device.digest.clone(),
            token_hash: device.token_hash,
            device_key: device.key,
            grants: decision.grant.clone(),
            generation: device.generation,
            paired_at_ms: epoch_ms(device.paired_at),
        };
        let audit = audit_event(&schema::Entry::Paired(schema::Paired {
            device_id: device_id.to_owned(),
            name: device.manifest.name().to_owned(),
            digest: device.digest.clone(),
            grants: decision.grant.clone(),
            replaced,
            no_screen: device.manifest.no_screen(),
            channel: channel.as_str().to_owned(),
            generation: device.generation,
            device_key: device.key.as_ref().map(|key| dk_files::hex::encode(key)),
            by: decision.by.clone(),
        }));
        let seen_applied = self.applied();
        self.store
            .put_pairing(&stored, &audit)
            .map_err(PairError::NotStored)?;
        self.audited();
        Ok(seen_applied)
    }

    /// Takes a committed pairing into memory, replacing any earlier one of
    /// the same id (its token and allowances dropped), unless memory took a
    /// read since `seen_applied` (then it reads the pairing again); then
    /// lets go of `changing` and tells whoever listens.
    fn take_pairing(
        &self,
        entry: Entry,
        seen_applied: u64,
        changing: std::sync::MutexGuard<'_, ()>,
    ) {
        let device_id = entry.device.manifest.id().to_owned();
        let token_hash = entry.device.token_hash;
        let applied = self.apply_if_unchanged(seen_applied, || {
            let replaced_entry = self.write().insert(device_id.clone(), entry);
            let mut hashes = self.token_hashes_mut();
            if let Some(old) = &replaced_entry {
                hashes.remove(&old.device.token_hash);
            }
            hashes.insert(token_hash);
            drop(hashes);
            if replaced_entry.is_some() {
                self.allowances
                    .drop_device(&device_id, RevokeCause::PairedAgain);
            }
        });
        if applied.is_some() {
            drop(changing);
            self.notify(RegistryEvent::Paired {
                device_id: device_id.clone(),
            });
        } else {
            // Memory took a read meanwhile: it reads the pairing again.
            self.catch_up(&device_id, None);
            drop(changing);
        }
        self.changed_here(&device_id);
    }
}

/// Whether the person's `decision` may pair `manifest`: a device without a
/// screen, and a changed credential (`credential_changed`), each confirmed,
/// and no grant of what the manifest does not declare.
fn check_decision(
    manifest: &Manifest,
    decision: &ConsentDecision,
    credential_changed: bool,
) -> Result<(), PairError> {
    if manifest.no_screen() && !decision.confirmed_without_code {
        return Err(PairError::NoScreenNotConfirmed);
    }
    if credential_changed && !decision.confirmed_credential_change {
        return Err(PairError::CredentialChangeNotConfirmed);
    }
    let unknown: Vec<String> = decision
        .grant
        .iter()
        .filter(|g| manifest.capability(g).is_none() && manifest.event(g).is_none())
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(PairError::UnknownGrant(unknown));
    }
    Ok(())
}
