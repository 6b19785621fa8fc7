//! What the registry reads from its store: every pairing when it opens
//! (checked on the machine's cores), a device that connects unknown to
//! memory ([`DeviceRegistry::recall`]), and pairings read again after a
//! fleet's other member changed them ([`DeviceRegistry::refresh`]), each
//! taken into memory only if memory took nothing else meanwhile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use dk_proto::validate_manifest_json;
use tokio::sync::broadcast;

use super::auth::AuthError;
use super::state::{ChangeHook, DeviceRegistry, Entry, PairedDevice, RegistryEvent};
use crate::allowances::{Allowances, RevokeCause};
use crate::hook::Hook;
use crate::store::{Store, StoreError, StoredPairing};

impl DeviceRegistry {
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

    /// How many times memory took a change or a read so far.
    pub(super) fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Runs `apply` (memory taking what was read, or a change committed,
    /// when memory had taken `seen` changes and reads) under `applying`,
    /// unless memory took another since: then `None`, and what was read
    /// must be read again.
    pub(super) fn apply_if_unchanged<T>(&self, seen: u64, apply: impl FnOnce() -> T) -> Option<T> {
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
    pub(super) fn catch_up(
        &self,
        device_id: &str,
        narrowing: Option<&dyn Fn() -> Vec<RegistryEvent>>,
    ) {
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
    pub(super) fn connecting(&self, device_id: &str) -> Result<Arc<PairedDevice>, AuthError> {
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
    pub(super) fn entry_of(
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
    pub(super) fn take_read(&self, device_id: &str, entry: Option<Entry>) -> Vec<RegistryEvent> {
        match entry {
            Some(entry) => self.take_entry(device_id, entry),
            None => self.forget(device_id),
        }
    }

    /// Puts `entry`, read from the store, in memory as `device_id`'s
    /// (under `applying`): the events that tell what changed.
    pub(super) fn take_entry(&self, device_id: &str, entry: Entry) -> Vec<RegistryEvent> {
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
    pub(super) fn forget(&self, device_id: &str) -> Vec<RegistryEvent> {
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
}

/// How many times a read from the store is made again when memory took
/// something else meanwhile, before it gives up.
pub(super) const READ_ATTEMPTS: usize = 8;

/// The error of a read from the store that memory took something else
/// during, every time it was made.
pub(super) fn changed_while_read() -> StoreError {
    StoreError::Database(crate::store::Cause::msg(
        "the registry kept changing while the store was read: read again later",
    ))
}

/// Stored pairings at least this many to a thread when a registry opens
/// on several: fewer are checked faster on one than a thread is started.
pub(super) const PAIRINGS_PER_THREAD: usize = 512;

/// Every stored pairing, checked and made a device, keyed by id. Each
/// manifest is validated again and digested again, and must match its id
/// and stored digest; the first pairing that does not (in the store's
/// order) is the error. With thousands of pairings this is most of a
/// vessel's start, so the pairings are split among the machine's cores in
/// runs of the store's order, each run checked as one thread would check
/// them all, and the first run's error wins as it would.
pub(super) fn load_devices(
    pairings: Vec<StoredPairing>,
) -> Result<HashMap<String, Entry>, StoreError> {
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
pub(super) fn load_run(
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
