//! The registry's state: the devices paired ([`PairedDevice`],
//! [`DeviceSnapshot`]), their tokens ([`DeviceToken`]), the events it sends
//! ([`RegistryEvent`]), and [`DeviceRegistry`] itself with the locks and
//! the reads every other part of the registry shares.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use dk_proto::{Channel, Manifest, ManifestError};
use dk_store::epoch_ms;
use rand::RngExt;
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;

use crate::allowances::Allowances;
use crate::hook::Hook;
use crate::store::entry as schema;
use crate::store::{AuditEvent, MemoryStore, Store, StoreError};

/// How long the person has to answer a consent request by default (two minutes).
pub const DEFAULT_CONSENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Bytes of randomness in a device token (64 hex characters).
const TOKEN_BYTES: usize = 32;

/// A device token: 64 lower-case hex characters from a CSPRNG. The vessel
/// gives it to the device once and keeps only its SHA-256. `Debug` does not
/// show it.
#[derive(Clone, PartialEq, Eq)]
pub struct DeviceToken(pub(super) String);

impl DeviceToken {
    pub(super) fn generate() -> DeviceToken {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::rng().fill(&mut bytes);
        DeviceToken(dk_files::hex::encode(&bytes))
    }

    /// The token text, to send to the device in `device:paired`.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DeviceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeviceToken(..)")
    }
}

pub(super) fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// A uniform 6-digit code, zero-padded, from a CSPRNG.
pub(super) fn pairing_code() -> String {
    format!("{:06}", rand::rng().random_range(0..1_000_000u32))
}

/// Why a pairing did not happen. `Display` gives 8DK's reason text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairError {
    /// The manifest failed validation; the person was never asked.
    #[error("invalid manifest: {0}")]
    InvalidManifest(#[source] ManifestError),
    /// The person said no, the consent callback failed, or no answer came in time.
    #[error("the person did not approve pairing")]
    NotApproved,
    /// The device cannot show a code and the person did not confirm pairing
    /// without it.
    #[error("the person did not confirm pairing a device that cannot show a code")]
    NoScreenNotConfirmed,
    /// The device's key changed, or it dropped encryption, since the
    /// pairing it replaces, and the person did not confirm that.
    #[error("the person did not confirm that the device's key changed or that it drops encryption")]
    CredentialChangeNotConfirmed,
    /// The store could not commit the pairing; nothing was paired.
    #[error("the pairing could not be saved: {0}")]
    NotStored(#[source] StoreError),
    /// The grant named capabilities the device does not declare.
    #[error("grant names unknown capability: {}", .0.join(", "))]
    UnknownGrant(Vec<String>),
    /// The id was paired, re-paired or unpaired while the person was asked:
    /// what they saw it would replace is no longer what is there.
    #[error("the device was paired or unpaired by another request meanwhile: ask again")]
    ChangedMeanwhile,
}

/// A completed pairing: the token goes to the device, once.
#[derive(Debug, Clone)]
pub struct Paired {
    /// The paired device's id.
    pub device_id: String,
    /// The device token, to send in `device:paired`.
    pub token: DeviceToken,
    /// The pairing's generation.
    pub generation: u64,
}

/// A change to the registry, for whoever must react (the connection that
/// tells the device, agents whose tool list changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryEvent {
    /// A device was paired (or paired again).
    Paired {
        /// The device id.
        device_id: String,
    },
    /// A capability was granted.
    Granted {
        /// The device id.
        device_id: String,
        /// The capability.
        capability: String,
    },
    /// A capability was revoked.
    Revoked {
        /// The device id.
        device_id: String,
        /// The capability.
        capability: String,
    },
    /// A device was unpaired.
    Unpaired {
        /// The device id.
        device_id: String,
    },
}

/// What the registry keeps for one paired device. The approved manifest,
/// its digest and the token's hash never change; a new pairing makes a new one.
#[derive(Debug)]
pub struct PairedDevice {
    pub(super) manifest: Manifest,
    pub(super) digest: String,
    pub(super) token_hash: [u8; 32],
    /// The static key pinned when the device paired over dk/2.
    pub(super) key: Option<[u8; 32]>,
    pub(super) paired_at: SystemTime,
    pub(super) generation: u64,
}

impl PairedDevice {
    /// The manifest the person approved.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    /// Its digest.
    pub fn digest(&self) -> &str {
        &self.digest
    }
    /// When the person approved the pairing.
    pub fn paired_at(&self) -> SystemTime {
        self.paired_at
    }
    /// The pairing's generation: a new pairing of the same id has a larger one.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// The channel the device paired on, and must authenticate on: dk/2
    /// when its key is pinned, v1 otherwise.
    pub fn channel(&self) -> Channel {
        if self.key.is_some() {
            Channel::Dk2
        } else {
            Channel::V1
        }
    }
    /// The static public key pinned when the device paired over dk/2.
    pub fn key(&self) -> Option<&[u8; 32]> {
        self.key.as_ref()
    }
}

pub(super) struct Entry {
    pub(super) device: Arc<PairedDevice>,
    pub(super) grants: BTreeSet<String>,
}

/// A copy of one device's state, for listings.
#[derive(Debug, Clone)]
pub struct DeviceSnapshot {
    /// The pairing.
    pub device: Arc<PairedDevice>,
    /// Granted capabilities, sorted.
    pub grants: Vec<String>,
}

/// Paired devices and their grants.
pub struct DeviceRegistry {
    pub(super) devices: RwLock<HashMap<String, Entry>>,
    /// The token hashes of `devices`, so that telling whether a text is a
    /// token costs one hash and one lookup, however many devices are paired
    /// (redaction checks many texts on the event path). Changed under
    /// `changing`, after `devices`.
    pub(super) token_hashes: RwLock<HashSet<[u8; 32]>>,
    pub(super) generations: AtomicU64,
    pub(super) events: broadcast::Sender<RegistryEvent>,
    pub(super) store: Arc<dyn Store>,
    /// Serialises the changes made here: the store commits, then memory
    /// follows, in the same order for every change. Held across the
    /// change's commit, so only changes wait here (off the async threads:
    /// a front end makes them on a blocking thread); calls read memory and
    /// never wait here, nor does a read again from the store.
    pub(super) changing: Mutex<()>,
    /// Held while memory takes a change or a read from the store, never
    /// across IO.
    pub(super) applying: Mutex<()>,
    /// How many times memory took a change or a read from the store: what
    /// was read before another one landed is not applied over it (it is
    /// read again).
    pub(super) applied: AtomicU64,
    /// The person's remembered yeses: revoked with the grant they rest on.
    pub(super) allowances: Arc<Allowances>,
    /// Told the id of every device this registry changed itself (not one
    /// read again after another vessel changed it): a fleet tells the others.
    pub(super) on_change: Hook<dyn Fn(&str) + Send + Sync>,
    /// Whether other vessels share the store (a fleet): a device not held
    /// in memory is read from the store before it is refused.
    pub(super) shared: std::sync::atomic::AtomicBool,
    /// Audit entries the store committed with this registry's changes.
    pub(super) audited: AtomicU64,
}

/// Told the id of each device whose pairing or grants this registry
/// changed (see [`DeviceRegistry::on_change`]).
pub type ChangeHook = Arc<dyn Fn(&str) + Send + Sync>;

impl Default for DeviceRegistry {
    fn default() -> Self {
        DeviceRegistry::new()
    }
}

impl fmt::Debug for DeviceRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRegistry")
            .field("devices", &self.read().len())
            .finish()
    }
}

impl DeviceRegistry {
    /// An empty registry.
    pub fn new() -> DeviceRegistry {
        DeviceRegistry {
            devices: RwLock::new(HashMap::new()),
            token_hashes: RwLock::new(HashSet::new()),
            generations: AtomicU64::new(0),
            events: broadcast::channel(256).0,
            store: Arc::new(MemoryStore::new()),
            changing: Mutex::new(()),
            applying: Mutex::new(()),
            applied: AtomicU64::new(0),
            allowances: Arc::new(Allowances::new()),
            on_change: Hook::default(),
            shared: std::sync::atomic::AtomicBool::new(false),
            audited: AtomicU64::new(0),
        }
    }

    /// The store the registry commits to.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// How many audit entries the store committed with this registry's
    /// changes (one a pairing, grant, revoke or unpair), in the change's
    /// own transaction rather than through the audit writer.
    pub fn changes_audited(&self) -> u64 {
        self.audited.load(Ordering::Relaxed)
    }

    /// Counts the entry of a change just committed.
    pub(super) fn audited(&self) {
        self.audited.fetch_add(1, Ordering::Relaxed);
    }

    /// The person's remembered allowances: a revoke, an unpair or a new
    /// pairing of a device revokes those resting on it.
    pub fn allowances(&self) -> &Arc<Allowances> {
        &self.allowances
    }

    pub(super) fn changing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn applying(&self) -> std::sync::MutexGuard<'_, ()> {
        self.applying.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.devices.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.devices.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn notify(&self, event: RegistryEvent) {
        // No subscriber is fine.
        let _ = self.events.send(event);
    }

    /// Tells the change hook this registry changed `device_id` itself.
    pub(super) fn changed_here(&self, device_id: &str) {
        if let Some(hook) = self.on_change.get() {
            hook(device_id);
        }
    }

    /// Changes from now on. A slow subscriber misses events (it sees a lag
    /// error) rather than holding the registry back.
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.events.subscribe()
    }

    /// The pairing of `device_id`, if any.
    pub fn get(&self, device_id: &str) -> Option<Arc<PairedDevice>> {
        self.read().get(device_id).map(|e| Arc::clone(&e.device))
    }

    /// The pairing of `device_id` and whether `capability` is granted, read
    /// together under one lock.
    pub fn get_with_grant(
        &self,
        device_id: &str,
        capability: &str,
    ) -> Option<(Arc<PairedDevice>, bool)> {
        self.read()
            .get(device_id)
            .map(|e| (Arc::clone(&e.device), e.grants.contains(capability)))
    }

    /// Whether a device is paired under `device_id`.
    pub fn is_paired(&self, device_id: &str) -> bool {
        self.read().contains_key(device_id)
    }

    /// Whether `capability` is granted on `device_id`.
    pub fn is_granted(&self, device_id: &str, capability: &str) -> bool {
        self.read()
            .get(device_id)
            .is_some_and(|e| e.grants.contains(capability))
    }

    /// One paired device with its grants, without reading the others.
    pub fn snapshot(&self, device_id: &str) -> Option<DeviceSnapshot> {
        self.read().get(device_id).map(|e| DeviceSnapshot {
            device: Arc::clone(&e.device),
            grants: e.grants.iter().cloned().collect(),
        })
    }

    /// How many devices are paired.
    pub fn count(&self) -> usize {
        self.read().len()
    }

    /// How many paired devices `matches` accepts, given each one's id, without
    /// a copy of any of them (a status read at every poll with thousands
    /// paired).
    pub fn count_matching(&self, mut matches: impl FnMut(&str) -> bool) -> usize {
        self.read().keys().filter(|id| matches(id)).count()
    }

    /// Every paired device with its grants, sorted by id.
    pub fn list(&self) -> Vec<DeviceSnapshot> {
        let mut all: Vec<DeviceSnapshot> = self
            .read()
            .values()
            .map(|e| DeviceSnapshot {
                device: Arc::clone(&e.device),
                grants: e.grants.iter().cloned().collect(),
            })
            .collect();
        all.sort_by(|a, b| a.device.manifest.id().cmp(b.device.manifest.id()));
        all
    }
}

/// The audit event of `entry`, happening now.
pub(crate) fn audit_event(entry: &schema::Entry) -> AuditEvent {
    AuditEvent::of(entry, epoch_ms(SystemTime::now()))
}
