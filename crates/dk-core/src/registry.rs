//! The device registry: pairing with the person's consent, device tokens
//! (kept only as SHA-256), authentication against the approved manifest,
//! grants, revocation and unpairing.
//!
//! Nothing is granted by default. Grants are read on every call, never
//! cached, and every pairing carries a generation number so a call that
//! waited for the person can tell that the device was paired again meanwhile.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use dk_proto::admin::{CapabilityChange, ChangeKind, CredentialChange, Difference, Replaced};
use dk_proto::{
    CapabilityKind, Channel, Manifest, ManifestError, validate_manifest, validate_manifest_json,
};
use rand::RngExt;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::broadcast;

use crate::allowances::{Allowances, RevokeCause};
use crate::by::By;
use crate::hook::Hook;
use crate::store::entry as schema;
use crate::store::{AuditEvent, MemoryStore, Store, StoreError, StoredPairing};
pub(crate) use dk_store::epoch_ms;

/// How long the person has to answer a consent request by default (two minutes).
pub const DEFAULT_CONSENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Bytes of randomness in a device token (64 hex characters).
const TOKEN_BYTES: usize = 32;

/// A device token: 64 lower-case hex characters from a CSPRNG. The vessel
/// gives it to the device once and keeps only its SHA-256. `Debug` does not
/// show it.
#[derive(Clone, PartialEq, Eq)]
pub struct DeviceToken(String);

impl DeviceToken {
    fn generate() -> DeviceToken {
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

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// A uniform 6-digit code, zero-padded, from a CSPRNG.
fn pairing_code() -> String {
    format!("{:06}", rand::rng().random_range(0..1_000_000u32))
}

/// One capability as the person sees it when asked to pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsentCapability {
    /// Capability name.
    pub name: String,
    /// Sensor or actuator.
    pub kind: CapabilityKind,
    /// What it does, in the device's words (validated text).
    pub description: String,
    /// Whether the person is asked on every call.
    pub confirm: bool,
    /// Its params, each with its bounds in words when declared.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<dk_proto::admin::DeviceParam>,
    /// Its title (the dk manifest extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the device claims of it (its annotations), never checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
}

impl ConsentCapability {
    /// `capability` as the person is asked about it.
    pub fn of(capability: &dk_proto::Capability) -> ConsentCapability {
        let shown = dk_proto::admin::DeviceCapability::of(capability);
        ConsentCapability {
            name: shown.name,
            kind: capability.kind(),
            description: shown.description,
            confirm: shown.confirm,
            params: shown.params,
            title: shown.title,
            claims: shown.claims,
        }
    }
}

/// What the person is asked when a device wants to pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
    pub capabilities: Vec<ConsentCapability>,
    /// The events the device declares (the dk manifest extension), which
    /// the person grants as capabilities.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<dk_proto::admin::DeclaredEvent>,
    /// The pairing this one would replace, when the id is already paired.
    pub replaces: Option<Box<Replaced>>,
    /// The device says it cannot display the code: nothing proves it is the
    /// device in front of the person, who must confirm that knowingly.
    pub no_screen: bool,
    /// The channel the device asks on: dk/2 (encrypted, the code computed on
    /// both sides) or v1 (in clear, the code sent to the device).
    pub channel: Channel,
}

/// How `new` differs from the approved `old`, capability by capability.
fn capability_changes(old: &Manifest, new: &Manifest) -> Vec<CapabilityChange> {
    let mut changes = Vec::new();
    for cap in new.capabilities() {
        let Some(was) = old.capability(cap.name()) else {
            changes.push(CapabilityChange::new(
                cap.name(),
                ChangeKind::Added,
                Vec::new(),
            ));
            continue;
        };
        let mut differences = Vec::new();
        if was.kind() != cap.kind() {
            differences.push(Difference::Kind {
                was: was.kind(),
                now: cap.kind(),
            });
        }
        if was.confirm() != cap.confirm() {
            differences.push(Difference::Confirm {
                was: was.confirm(),
                now: cap.confirm(),
            });
        }
        if was.params() != cap.params() {
            differences.push(Difference::Params);
        }
        if was.description() != cap.description() {
            differences.push(Difference::Description);
        }
        if was.title() != cap.title() {
            differences.push(Difference::Title);
        }
        if was.annotations() != cap.annotations() {
            differences.push(Difference::Claims);
        }
        if was.declared_input_schema() != cap.declared_input_schema()
            || was.output_schema() != cap.output_schema()
        {
            differences.push(Difference::Schema);
        }
        if was.tool() != cap.tool() {
            differences.push(Difference::Tool);
        }
        if !differences.is_empty() {
            changes.push(CapabilityChange::new(
                cap.name(),
                ChangeKind::Changed,
                differences,
            ));
        }
    }
    for was in old.capabilities() {
        if new.capability(was.name()).is_none() {
            changes.push(CapabilityChange::new(
                was.name(),
                ChangeKind::Removed,
                Vec::new(),
            ));
        }
    }
    // Declared events (the dk manifest extension), granted as capabilities
    // are: one added, removed or changed is told the same way.
    for event in new.events() {
        match old.event(event.name()) {
            None => changes.push(CapabilityChange::new(
                event.name(),
                ChangeKind::Added,
                Vec::new(),
            )),
            Some(was) => {
                let mut differences = Vec::new();
                if was.params() != event.params() {
                    differences.push(Difference::Params);
                }
                if was.description() != event.description() {
                    differences.push(Difference::Description);
                }
                if !differences.is_empty() {
                    changes.push(CapabilityChange::new(
                        event.name(),
                        ChangeKind::Changed,
                        differences,
                    ));
                }
            }
        }
    }
    for was in old.events() {
        if new.event(was.name()).is_none() {
            changes.push(CapabilityChange::new(
                was.name(),
                ChangeKind::Removed,
                Vec::new(),
            ));
        }
    }
    changes
}

/// The person's answer to a [`ConsentRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsentDecision {
    /// Yes or no.
    pub approved: bool,
    /// Capabilities the person grants; empty means none.
    pub grant: Vec<String>,
    /// For a device that cannot show a code: the person confirms pairing
    /// without the code check. A yes without it pairs nothing.
    pub confirmed_without_code: bool,
    /// Who answered (the pairing's audit entry names it), when a front
    /// end says.
    pub by: Option<By>,
    /// For a re-pairing whose credential changed (another dk/2 key, or v1
    /// where it was paired over dk/2): the person confirms it knowingly.
    /// A yes without it pairs nothing.
    pub confirmed_credential_change: bool,
}

impl ConsentDecision {
    /// A yes granting `grant`.
    pub fn approve<I: IntoIterator<Item = S>, S: Into<String>>(grant: I) -> ConsentDecision {
        ConsentDecision {
            approved: true,
            grant: grant.into_iter().map(Into::into).collect(),
            confirmed_without_code: false,
            by: None,
            confirmed_credential_change: false,
        }
    }

    /// The same answer, given through `by`.
    pub fn by(mut self, by: By) -> ConsentDecision {
        self.by = Some(by);
        self
    }

    /// The same answer, also confirming that the device's credential
    /// changed ([`Replaced::credential`]).
    pub fn credential_change_confirmed(mut self) -> ConsentDecision {
        self.confirmed_credential_change = true;
        self
    }

    /// The same answer, also confirming a device that cannot show a code.
    pub fn without_code_confirmed(mut self) -> ConsentDecision {
        self.confirmed_without_code = true;
        self
    }

    /// A no.
    pub fn refuse() -> ConsentDecision {
        ConsentDecision::default()
    }
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
    manifest: Manifest,
    digest: String,
    token_hash: [u8; 32],
    /// The static key pinned when the device paired over dk/2.
    key: Option<[u8; 32]>,
    paired_at: SystemTime,
    generation: u64,
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

struct Entry {
    device: Arc<PairedDevice>,
    grants: BTreeSet<String>,
}

/// How many times a read from the store is made again when memory took
/// something else meanwhile, before it gives up.
const READ_ATTEMPTS: usize = 8;

/// The error of a read from the store that memory took something else
/// during, every time it was made.
fn changed_while_read() -> StoreError {
    StoreError::Database(crate::store::Cause::msg(
        "the registry kept changing while the store was read: read again later",
    ))
}

/// Stored pairings at least this many to a thread when a registry opens
/// on several: fewer are checked faster on one than a thread is started.
const PAIRINGS_PER_THREAD: usize = 512;

/// Every stored pairing, checked and made a device, keyed by id. Each
/// manifest is validated again and digested again, and must match its id
/// and stored digest; the first pairing that does not (in the store's
/// order) is the error. With thousands of pairings this is most of a
/// vessel's start, so the pairings are split among the machine's cores in
/// runs of the store's order, each run checked as one thread would check
/// them all, and the first run's error wins as it would.
fn load_devices(pairings: Vec<StoredPairing>) -> Result<HashMap<String, Entry>, StoreError> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = cores.min(pairings.len() / PAIRINGS_PER_THREAD).max(1);
    if threads == 1 {
        let mut devices = HashMap::with_capacity(pairings.len());
        load_run(pairings, &mut devices)?;
        return Ok(devices);
    }
    let total = pairings.len();
    let per_run = total.div_ceil(threads);
    let mut runs = Vec::with_capacity(threads);
    let mut rest = pairings;
    while rest.len() > per_run {
        let tail = rest.split_off(per_run);
        runs.push(std::mem::replace(&mut rest, tail));
    }
    runs.push(rest);
    std::thread::scope(|scope| {
        let checking: Vec<_> = runs
            .into_iter()
            .map(|run| {
                scope.spawn(move || {
                    let mut devices = HashMap::with_capacity(run.len());
                    load_run(run, &mut devices).map(|()| devices)
                })
            })
            .collect();
        let mut devices = HashMap::with_capacity(total);
        for run in checking {
            let loaded = run.join().map_err(|_| {
                StoreError::Corrupt("checking the stored pairings failed".to_owned())
            })??;
            devices.extend(loaded);
        }
        Ok(devices)
    })
}

/// Checks `pairings` in order and adds each to `devices`: the first whose
/// manifest no longer validates, or whose id or digest does not match, is
/// the error.
fn load_run(
    pairings: Vec<StoredPairing>,
    devices: &mut HashMap<String, Entry>,
) -> Result<(), StoreError> {
    for stored in pairings {
        let damaged =
            |why: String| StoreError::Corrupt(format!("pairing `{}`: {why}", stored.device_id));
        let manifest =
            validate_manifest_json(&stored.manifest_json).map_err(|e| damaged(e.to_string()))?;
        if manifest.id() != stored.device_id || manifest.digest() != stored.digest {
            return Err(damaged(
                "the manifest does not match its id or digest".to_owned(),
            ));
        }
        let device = PairedDevice {
            digest: stored.digest,
            manifest,
            token_hash: stored.token_hash,
            key: stored.device_key,
            paired_at: UNIX_EPOCH + Duration::from_millis(stored.paired_at_ms),
            generation: stored.generation,
        };
        devices.insert(
            stored.device_id,
            Entry {
                device: Arc::new(device),
                grants: stored.grants.into_iter().collect(),
            },
        );
    }
    Ok(())
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
    devices: RwLock<HashMap<String, Entry>>,
    /// The token hashes of `devices`, so that telling whether a text is a
    /// token costs one hash and one lookup, however many devices are paired
    /// (redaction checks many texts on the event path). Changed under
    /// `changing`, after `devices`.
    token_hashes: RwLock<HashSet<[u8; 32]>>,
    generations: AtomicU64,
    events: broadcast::Sender<RegistryEvent>,
    store: Arc<dyn Store>,
    /// Serialises the changes made here: the store commits, then memory
    /// follows, in the same order for every change. Held across the
    /// change's commit, so only changes wait here (off the async threads:
    /// a front end makes them on a blocking thread); calls read memory and
    /// never wait here, nor does a read again from the store.
    changing: Mutex<()>,
    /// Held while memory takes a change or a read from the store, never
    /// across IO.
    applying: Mutex<()>,
    /// How many times memory took a change or a read from the store: what
    /// was read before another one landed is not applied over it (it is
    /// read again).
    applied: AtomicU64,
    /// The person's remembered yeses: revoked with the grant they rest on.
    allowances: Arc<Allowances>,
    /// Told the id of every device this registry changed itself (not one
    /// read again after another vessel changed it): a fleet tells the others.
    on_change: Hook<dyn Fn(&str) + Send + Sync>,
    /// Whether other vessels share the store (a fleet): a device not held
    /// in memory is read from the store before it is refused.
    shared: std::sync::atomic::AtomicBool,
    /// Audit entries the store committed with this registry's changes.
    audited: AtomicU64,
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

    /// A registry over `store`, holding every pairing the store has. A stored
    /// manifest that no longer validates, or whose digest does not match, is
    /// an error: the vessel does not start on damaged state.
    pub fn open(store: Arc<dyn Store>) -> Result<DeviceRegistry, StoreError> {
        let snapshot = store.load()?;
        let devices = load_devices(snapshot.pairings)?;
        let token_hashes = devices.values().map(|e| e.device.token_hash).collect();
        Ok(DeviceRegistry {
            devices: RwLock::new(devices),
            token_hashes: RwLock::new(token_hashes),
            generations: AtomicU64::new(snapshot.max_generation),
            events: broadcast::channel(256).0,
            store,
            changing: Mutex::new(()),
            applying: Mutex::new(()),
            applied: AtomicU64::new(0),
            allowances: Arc::new(Allowances::new()),
            on_change: Hook::default(),
            shared: std::sync::atomic::AtomicBool::new(false),
            audited: AtomicU64::new(0),
        })
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
    fn audited(&self) {
        self.audited.fetch_add(1, Ordering::Relaxed);
    }

    /// The person's remembered allowances: a revoke, an unpair or a new
    /// pairing of a device revokes those resting on it.
    pub fn allowances(&self) -> &Arc<Allowances> {
        &self.allowances
    }

    fn changing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn applying(&self) -> std::sync::MutexGuard<'_, ()> {
        self.applying.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many times memory took a change or a read so far.
    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Runs `apply` (memory taking what was read, or a change committed,
    /// when memory had taken `seen` changes and reads) under `applying`,
    /// unless memory took another since: then `None`, and what was read
    /// must be read again.
    fn apply_if_unchanged<T>(&self, seen: u64, apply: impl FnOnce() -> T) -> Option<T> {
        let applying = self.applying();
        if self.applied() != seen {
            return None;
        }
        let done = apply();
        self.applied.fetch_add(1, Ordering::AcqRel);
        drop(applying);
        Some(done)
    }

    /// After a change committed here while memory took a read from the
    /// store (a fleet's other members changed something): memory reads
    /// `device_id` again rather than apply the change over what may be
    /// newer. When the store cannot be read now, a change that narrows
    /// (`narrowing`: a revoke, an unpairing) is applied as it is, so a
    /// revoke is never lost from memory; one that widens waits for the
    /// next read.
    fn catch_up(&self, device_id: &str, narrowing: Option<&dyn Fn() -> Vec<RegistryEvent>>) {
        if let Err(error) = self.refresh(device_id) {
            tracing::warn!(%error, device = device_id, "reading a device again after a change failed");
            if let Some(apply) = narrowing {
                let events = {
                    let applying = self.applying();
                    let events = apply();
                    self.applied.fetch_add(1, Ordering::AcqRel);
                    drop(applying);
                    events
                };
                for event in events {
                    self.notify(event);
                }
            }
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.devices.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.devices.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self, event: RegistryEvent) {
        // No subscriber is fine.
        let _ = self.events.send(event);
    }

    /// Tells the change hook this registry changed `device_id` itself.
    fn changed_here(&self, device_id: &str) {
        if let Some(hook) = self.on_change.get() {
            hook(device_id);
        }
    }

    /// Calls `hook` with the device id after every change this registry
    /// commits itself (a pairing, grant, revocation or unpairing), never
    /// for what [`DeviceRegistry::refresh`] reads again: the vessels of a
    /// fleet tell each other what to read again this way. Replaces any
    /// earlier hook.
    pub fn on_change(&self, hook: ChangeHook) {
        self.on_change.set(hook);
    }

    /// Says other vessels share the store (a fleet): a device that connects
    /// unknown here is read from the store before it is refused, so a
    /// device paired through another member is known even when that
    /// member's word did not come.
    pub fn set_shared(&self) {
        self.shared.store(true, Ordering::Relaxed);
    }

    /// Whether other vessels share the store ([`DeviceRegistry::set_shared`]).
    pub fn is_shared(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }

    /// The pairing of a device that authenticates, from memory (a device
    /// of a fleet unknown here is read from the store first: see
    /// [`DeviceRegistry::recall`]).
    fn connecting(&self, device_id: &str) -> Result<Arc<PairedDevice>, AuthError> {
        self.get(device_id).ok_or(AuthError::NotPaired)
    }

    /// Before a device that connects authenticates: when other vessels
    /// share the store ([`DeviceRegistry::set_shared`]) and memory does not
    /// hold `device_id`, reads it from the store, awaiting the store
    /// without holding the thread (and without any lock: see
    /// [`DeviceRegistry::refresh`]), so a device paired through another
    /// member is known even when that member's word did not come. A store
    /// that fails or does not answer leaves memory as it is (the device is
    /// then refused as not paired, and tries again).
    pub async fn recall(&self, device_id: &str) {
        if !self.is_shared() || self.is_paired(device_id) {
            return;
        }
        for _ in 0..READ_ATTEMPTS {
            let seen = self.applied();
            let read = self.store.load_pairing_async(device_id).await;
            match read.and_then(|stored| self.entry_of(device_id, stored)) {
                Ok(entry) => {
                    if let Some(events) =
                        self.apply_if_unchanged(seen, || self.take_read(device_id, entry))
                    {
                        for event in events {
                            self.notify(event);
                        }
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, device = device_id, "a device that connected could not be read from the store");
                    return;
                }
            }
        }
    }

    /// Reads `device_id`'s pairing and grants again from the store, which
    /// another vessel sharing it may have changed, and makes memory match:
    /// the same events as a change made here (a pairing, each grant and
    /// revocation, an unpairing), and the same allowances dropped. A
    /// stored pairing that no longer checks (its manifest, id or digest) is
    /// an error and changes nothing.
    ///
    /// The store is read without any lock held (it blocks this thread: call
    /// it off the async threads); memory then takes what was read under a
    /// short lock, unless it took a change or another read meanwhile, which
    /// may be newer: then the store is read again (a few times at most,
    /// then an error), so what was read never goes over newer state.
    pub fn refresh(&self, device_id: &str) -> Result<(), StoreError> {
        for _ in 0..READ_ATTEMPTS {
            let seen = self.applied();
            let stored = self.store.load_pairing(device_id)?;
            let entry = self.entry_of(device_id, stored)?;
            if let Some(events) = self.apply_if_unchanged(seen, || self.take_read(device_id, entry))
            {
                for event in events {
                    self.notify(event);
                }
                return Ok(());
            }
        }
        Err(changed_while_read())
    }

    /// Reads every pairing again from the store and makes memory match, as
    /// [`DeviceRegistry::refresh`] does for one (the store read without a
    /// lock, memory changed only if it took nothing else meanwhile): what a
    /// vessel of a fleet does when it may have missed another member's word
    /// (its connection to the others came back), and now and then.
    pub fn refresh_all(&self) -> Result<(), StoreError> {
        for _ in 0..READ_ATTEMPTS {
            let seen = self.applied();
            let snapshot = self.store.load()?;
            let loaded = load_devices(snapshot.pairings)?;
            let applied = self.apply_if_unchanged(seen, || {
                self.generations
                    .fetch_max(snapshot.max_generation, Ordering::Relaxed);
                let gone: Vec<String> = self
                    .read()
                    .keys()
                    .filter(|id| !loaded.contains_key(*id))
                    .cloned()
                    .collect();
                let mut events = Vec::new();
                for id in gone {
                    events.extend(self.forget(&id));
                }
                for (id, entry) in loaded {
                    events.extend(self.take_entry(&id, entry));
                }
                events
            });
            if let Some(events) = applied {
                for event in events {
                    self.notify(event);
                }
                return Ok(());
            }
        }
        Err(changed_while_read())
    }

    /// What memory holds for `device_id` once `stored` (read from the
    /// store) is checked: `None` when the store holds no pairing of it.
    fn entry_of(
        &self,
        device_id: &str,
        stored: Option<StoredPairing>,
    ) -> Result<Option<Entry>, StoreError> {
        let Some(stored) = stored else {
            return Ok(None);
        };
        let mut loaded = HashMap::with_capacity(1);
        load_run(vec![stored], &mut loaded)?;
        Ok(loaded.remove(device_id))
    }

    /// Memory takes `entry`, read from the store, as `device_id`'s (under
    /// `applying`): the events that tell what changed.
    fn take_read(&self, device_id: &str, entry: Option<Entry>) -> Vec<RegistryEvent> {
        match entry {
            Some(entry) => self.take_entry(device_id, entry),
            None => self.forget(device_id),
        }
    }

    /// Puts `entry`, read from the store, in memory as `device_id`'s
    /// (under `applying`): the events that tell what changed.
    fn take_entry(&self, device_id: &str, entry: Entry) -> Vec<RegistryEvent> {
        self.generations
            .fetch_max(entry.device.generation, Ordering::Relaxed);
        let mut events = Vec::new();
        let mut devices = self.write();
        match devices.get_mut(device_id) {
            Some(held) if held.device.generation == entry.device.generation => {
                for capability in entry.grants.difference(&held.grants) {
                    events.push(RegistryEvent::Granted {
                        device_id: device_id.to_owned(),
                        capability: capability.clone(),
                    });
                }
                for capability in held.grants.difference(&entry.grants) {
                    self.allowances.drop_capability(device_id, capability);
                    events.push(RegistryEvent::Revoked {
                        device_id: device_id.to_owned(),
                        capability: capability.clone(),
                    });
                }
                held.grants = entry.grants;
            }
            _ => {
                let token_hash = entry.device.token_hash;
                let replaced = devices.insert(device_id.to_owned(), entry);
                drop(devices);
                let mut hashes = self.token_hashes_mut();
                if let Some(old) = &replaced {
                    hashes.remove(&old.device.token_hash);
                }
                hashes.insert(token_hash);
                drop(hashes);
                if replaced.is_some() {
                    self.allowances
                        .drop_device(device_id, RevokeCause::PairedAgain);
                }
                events.push(RegistryEvent::Paired {
                    device_id: device_id.to_owned(),
                });
            }
        }
        events
    }

    /// Forgets `device_id` (under `applying`), which the store no longer
    /// holds: the event, when it was held.
    fn forget(&self, device_id: &str) -> Vec<RegistryEvent> {
        let Some(old) = self.write().remove(device_id) else {
            return Vec::new();
        };
        self.token_hashes_mut().remove(&old.device.token_hash);
        self.allowances
            .drop_device(device_id, RevokeCause::Unpaired);
        vec![RegistryEvent::Unpaired {
            device_id: device_id.to_owned(),
        }]
    }

    /// Changes from now on. A slow subscriber misses events (it sees a lag
    /// error) rather than holding the registry back.
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.events.subscribe()
    }

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

    async fn ask_and_pair<F, Fut, E>(
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
        let channel = if key.is_some() {
            Channel::Dk2
        } else {
            Channel::V1
        };
        let request = ConsentRequest {
            device_id: manifest.id().to_owned(),
            name: manifest.name().to_owned(),
            kind: manifest.kind().to_owned(),
            code,
            capabilities: manifest
                .capabilities()
                .iter()
                .map(ConsentCapability::of)
                .collect(),
            events: dk_proto::admin::DeclaredEvent::all_of(&manifest),
            replaces: self.replaced(&manifest, key.as_ref()).map(Box::new),
            no_screen: manifest.no_screen(),
            channel,
        };
        let credential = request.replaces.as_ref().and_then(|old| old.credential);
        // What the person is shown as replaced must be what is replaced.
        let seen = self.get(manifest.id()).map(|d| d.generation);
        let decision = match tokio::time::timeout(timeout, consent(request)).await {
            Ok(Ok(decision)) if decision.approved => decision,
            _ => return Err(PairError::NotApproved),
        };
        if manifest.no_screen() && !decision.confirmed_without_code {
            return Err(PairError::NoScreenNotConfirmed);
        }
        if credential.is_some() && !decision.confirmed_credential_change {
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
        let replaced = self.is_paired(&device_id);
        let stored = StoredPairing {
            device_id: device_id.clone(),
            manifest_json: device.manifest.to_stored_json(),
            digest: device.digest.clone(),
            token_hash: device.token_hash,
            device_key: key,
            grants: decision.grant.clone(),
            generation,
            paired_at_ms: epoch_ms(device.paired_at),
        };
        let audit = audit_event(&schema::Entry::Paired(schema::Paired {
            device_id: device_id.clone(),
            name: device.manifest.name().to_owned(),
            digest: device.digest.clone(),
            grants: decision.grant.clone(),
            replaced,
            no_screen: device.manifest.no_screen(),
            channel: channel.as_str().to_owned(),
            generation,
            device_key: key.as_ref().map(|key| dk_files::hex::encode(key)),
            by: decision.by.clone(),
        }));
        let seen_applied = self.applied();
        // Committed before the device or the person hears of it.
        self.store
            .put_pairing(&stored, &audit)
            .map_err(PairError::NotStored)?;
        self.audited();
        let token_hash = device.token_hash;
        let entry = Entry {
            device: Arc::new(device),
            grants: decision.grant.into_iter().collect(),
        };
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
        Ok(Paired {
            device_id,
            token,
            generation,
        })
    }

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

    fn token_hashes_mut(&self) -> RwLockWriteGuard<'_, HashSet<[u8; 32]>> {
        self.token_hashes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
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

    /// What pairing `device_id` again would replace.
    fn replaced(&self, new: &Manifest, key: Option<&[u8; 32]>) -> Option<Replaced> {
        self.read().get(new.id()).map(|e| {
            let old = &e.device.manifest;
            let credential = match (&e.device.key, key) {
                (Some(pinned), Some(key)) if !bool::from(pinned.ct_eq(key)) => {
                    Some(CredentialChange::KeyChanged)
                }
                (Some(_), None) => Some(CredentialChange::EncryptionDropped),
                _ => None,
            };
            Replaced {
                credential,
                paired_at_ms: epoch_ms(e.device.paired_at),
                grants: e.grants.iter().cloned().collect(),
                was_name: (old.name() != new.name()).then(|| old.name().to_owned()),
                was_kind: (old.kind() != new.kind()).then(|| old.kind().to_owned()),
                changes: capability_changes(old, new),
            }
        })
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

/// Whether `manifest` validates to the one the person approved. Equal
/// validated manifests have equal digests: comparing the validated form
/// spares serialising and hashing it.
fn check_manifest(device: &PairedDevice, manifest: &Value) -> Result<(), AuthError> {
    match validate_manifest(manifest) {
        Ok(m) if m == device.manifest => Ok(()),
        _ => Err(AuthError::ManifestChanged),
    }
}

/// The audit event of `entry`, happening now.
pub(crate) fn audit_event(entry: &schema::Entry) -> AuditEvent {
    AuditEvent::of(entry, epoch_ms(SystemTime::now()))
}

#[cfg(test)]
mod tests;
