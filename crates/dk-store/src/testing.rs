//! A store double for tests (the `testing` feature, which only
//! dev-dependencies turn on, and dk-store's own tests): [`FaultyStore`],
//! another store with the faults a test switches on: writes of one kind
//! that fail as a full disk does (the write probe fails with pairings' and
//! agents' writes), a disk that fills with a reserve kept against it (every
//! write fails until the reserve is released, and the reserve is made again
//! only once space is freed), audit appends slowed, held at a gate or failing, the
//! reads and claims of a device's call path held at a gate, and the whole
//! store frozen, as a database server paused (every call waits until it is
//! thawed). Every other call goes to the store underneath. Its `*_async`
//! answers come, while a gate or a freeze holds them, from a thread of
//! their own, as the PostgreSQL store's come from its thread: awaiting one
//! holds no thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::time::Duration;

use crate::{
    AuditEntry, AuditEvent, AuditHead, AuditQuery, BucketTake, Cause, MemoryStore, RateClaim,
    RateHit, Snapshot, Store, StoreError, StoreFuture, StoredAgent, StoredPairing, VerifyReport,
};

/// The kinds of write a [`FaultyStore`] can refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// `put_pairing`, `set_grant` and `delete_pairing` (and `probe_write`).
    Pairings,
    /// `put_agent` and `delete_agent` (and `probe_write`).
    Agents,
    /// `append_audit`.
    Audit,
}

/// An audit append held at a gate: `entered` hears of each append as it
/// starts, and each message on `open` lets one through (dropping `open`
/// lets every one through).
#[derive(Debug)]
pub struct AuditGate {
    /// One message as each held append starts.
    pub entered: mpsc::Receiver<()>,
    /// Send one message to let one append through.
    pub open: mpsc::Sender<()>,
}

/// A store whose faults a test switches on; see the module's docs.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: Arc<Faults>,
}

/// What a [`FaultyStore`] does wrong, shared with the threads its held
/// `*_async` answers wait on.
struct Faults {
    failing: [AtomicBool; 3],
    audit_pause_micros: AtomicU64,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
    /// The call path's gate: see [`FaultyStore::hold_call_path`].
    path_held: AtomicBool,
    path_entered: Mutex<Option<mpsc::Sender<()>>>,
    path_gate: Mutex<Option<mpsc::Receiver<()>>>,
    /// Frozen: every call waits until this is false again.
    frozen: Mutex<bool>,
    thawed: Condvar,
    /// Write probes asked for, counted as they are asked.
    probes: AtomicU64,
    /// The disk of [`FaultyStore::fill_disk`].
    disk: Mutex<Disk>,
}

/// A [`FaultyStore`]'s disk, as [`FaultyStore::fill_disk`] and
/// [`FaultyStore::free_disk`] leave it.
#[derive(Debug, Default)]
struct Disk {
    /// Every write fails as a full disk's.
    full: bool,
    /// The reserve kept against it: `None` until the disk first fills,
    /// then whether it is in place.
    reserve: Option<bool>,
    /// Space was freed: the reserve can be made again.
    freed: bool,
    /// Times the reserve was released.
    released: u64,
}

/// While kept, the [`FaultyStore`] that gave it is frozen; dropping it
/// thaws the store, and every call waiting goes on.
#[must_use = "dropping it thaws the store"]
pub struct Frozen(Arc<Faults>);

impl std::fmt::Debug for Frozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Frozen(..)")
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        *lock(&self.0.frozen) = false;
        self.0.thawed.notify_all();
    }
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

impl Default for FaultyStore {
    fn default() -> FaultyStore {
        FaultyStore::over(MemoryStore::new())
    }
}

impl FaultyStore {
    /// `inner` with no fault switched on.
    pub fn over(inner: impl Store + 'static) -> FaultyStore {
        FaultyStore {
            inner: Arc::new(inner),
            faults: Arc::new(Faults {
                failing: [
                    AtomicBool::new(false),
                    AtomicBool::new(false),
                    AtomicBool::new(false),
                ],
                audit_pause_micros: AtomicU64::new(0),
                entered: Mutex::new(None),
                gate: Mutex::new(None),
                path_held: AtomicBool::new(false),
                path_entered: Mutex::new(None),
                path_gate: Mutex::new(None),
                frozen: Mutex::new(false),
                thawed: Condvar::new(),
                probes: AtomicU64::new(0),
                disk: Mutex::new(Disk::default()),
            }),
        }
    }

    /// Writes of `kind` fail (`failing`) as a full disk makes them fail, or
    /// go through again.
    pub fn fail(&self, kind: Writes, failing: bool) {
        self.faults.flag(kind).store(failing, Ordering::SeqCst);
    }

    /// Every audit append first sleeps `pause` (a slow disk).
    pub fn pause_audit(&self, pause: Duration) {
        let micros = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX);
        self.faults
            .audit_pause_micros
            .store(micros, Ordering::SeqCst);
    }

    /// Holds every audit append at a gate from now on.
    pub fn hold_audit(&self) -> AuditGate {
        let (entered, entered_rx) = mpsc::channel();
        let (open, gate) = mpsc::channel();
        *lock(&self.faults.entered) = Some(entered);
        *lock(&self.faults.gate) = Some(gate);
        AuditGate {
            entered: entered_rx,
            open,
        }
    }

    /// Held appends no longer say they started (the gate still holds them
    /// until its sender is dropped).
    pub fn stop_telling(&self) {
        *lock(&self.faults.entered) = None;
    }

    /// Holds at a gate, from now on, what a device's call path and its
    /// connection ask of the store: `load_pairing`, `claim_rate_hit`,
    /// `put_rate_hit` and `take_from_buckets`, and their `*_async` faces
    /// (answered from a thread of their own meanwhile, so awaiting them
    /// holds no thread).
    pub fn hold_call_path(&self) -> AuditGate {
        let (entered, entered_rx) = mpsc::channel();
        let (open, gate) = mpsc::channel();
        *lock(&self.faults.path_entered) = Some(entered);
        *lock(&self.faults.path_gate) = Some(gate);
        self.faults.path_held.store(true, Ordering::SeqCst);
        AuditGate {
            entered: entered_rx,
            open,
        }
    }

    /// The disk fills, with a reserve kept against it: from now on every
    /// write fails as a full disk's ([`StoreError::DiskFull`]) until the
    /// reserve is released ([`Store::release_reserve`]: its space takes the
    /// writes again) or [`FaultyStore::free_disk`]. The reserve is made
    /// again ([`Store::restore_reserve`]) only once space is freed.
    pub fn fill_disk(&self) {
        let mut disk = lock(&self.faults.disk);
        disk.full = true;
        disk.freed = false;
        disk.reserve.get_or_insert(true);
    }

    /// Space is freed on the disk [`FaultyStore::fill_disk`] filled: writes
    /// go through, and the reserve can be made again.
    pub fn free_disk(&self) {
        let mut disk = lock(&self.faults.disk);
        disk.full = false;
        disk.freed = true;
    }

    /// Whether the disk's reserve is in place (`None` before the disk
    /// first filled), and how many times it was released.
    pub fn reserve(&self) -> (Option<bool>, u64) {
        let disk = lock(&self.faults.disk);
        (disk.reserve, disk.released)
    }

    /// How many write probes ([`Store::probe_write`]) were asked of the
    /// store so far, frozen or not: whoever asks for one costs the store a
    /// write.
    pub fn probes(&self) -> u64 {
        self.faults.probes.load(Ordering::SeqCst)
    }

    /// Freezes the store, as a database server paused: from now on every
    /// call (reads, writes, the probe, appends) waits until the returned
    /// [`Frozen`] is dropped; its `*_async` answers wait on a thread of
    /// their own.
    pub fn freeze(&self) -> Frozen {
        *lock(&self.faults.frozen) = true;
        Frozen(Arc::clone(&self.faults))
    }

    /// Whether an `*_async` answer must wait now (a gate or a freeze):
    /// then it is answered from a thread of its own.
    fn holds_answers(&self) -> bool {
        *lock(&self.faults.frozen) || self.faults.path_held.load(Ordering::SeqCst)
    }

    /// `op` on the store underneath, from a thread of its own when answers
    /// are held now, else at once.
    fn answer<T: Send + 'static>(
        &self,
        op: impl FnOnce(&dyn Store, &Faults) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<T> {
        if !self.holds_answers() {
            return Box::pin(std::future::ready(op(&*self.inner, &self.faults)));
        }
        let (inner, faults) = (Arc::clone(&self.inner), Arc::clone(&self.faults));
        let (answer, answered) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("faulty-store".to_owned())
            .spawn(move || {
                let _ = answer.send(op(&*inner, &faults));
            });
        Box::pin(async move {
            spawned.map_err(|error| StoreError::Database(Cause::new(error)))?;
            answered
                .await
                .unwrap_or_else(|_| Err(StoreError::Database(Cause::msg("the answer was lost"))))
        })
    }
}

impl Faults {
    fn flag(&self, kind: Writes) -> &AtomicBool {
        let [pairings, agents, audit] = &self.failing;
        match kind {
            Writes::Pairings => pairings,
            Writes::Agents => agents,
            Writes::Audit => audit,
        }
    }

    /// The full disk's error, when writes of `kind` fail or the disk is
    /// full.
    fn refuse(&self, kind: Writes) -> Result<(), StoreError> {
        if self.flag(kind).load(Ordering::SeqCst) || lock(&self.disk).full {
            let disk = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
            return Err(StoreError::DiskFull(Cause::new(disk)));
        }
        Ok(())
    }

    /// Waits while the store is frozen.
    fn thawed(&self) {
        let mut frozen = lock(&self.frozen);
        while *frozen {
            frozen = self
                .thawed
                .wait(frozen)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits while the store is frozen, then at the call path's gate when
    /// one holds it.
    fn on_call_path(&self) {
        self.thawed();
        if let Some(entered) = lock(&self.path_entered).as_ref() {
            let _ = entered.send(());
        }
        if let Some(gate) = lock(&self.path_gate).as_ref() {
            let _ = gate.recv();
        }
    }

    fn load_pairing(
        &self,
        inner: &dyn Store,
        device_id: &str,
    ) -> Result<Option<StoredPairing>, StoreError> {
        self.on_call_path();
        inner.load_pairing(device_id)
    }

    fn claim_rate_hit(&self, inner: &dyn Store, hit: &RateHit) -> Result<RateClaim, StoreError> {
        self.on_call_path();
        inner.claim_rate_hit(hit)
    }

    fn take_from_buckets(
        &self,
        inner: &dyn Store,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> Result<Option<(usize, u64)>, StoreError> {
        self.on_call_path();
        inner.take_from_buckets(takes, now_ms)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for FaultyStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.faults.thawed();
        self.inner.load()
    }
    fn load_pairing(&self, device_id: &str) -> Result<Option<StoredPairing>, StoreError> {
        self.faults.load_pairing(&*self.inner, device_id)
    }
    fn put_pairing(&self, p: &StoredPairing, a: &AuditEvent) -> Result<(), StoreError> {
        self.faults.thawed();
        self.faults.refuse(Writes::Pairings)?;
        self.inner.put_pairing(p, a)
    }
    fn set_grant(&self, d: &str, c: &str, g: bool, a: &AuditEvent) -> Result<(), StoreError> {
        self.faults.thawed();
        self.faults.refuse(Writes::Pairings)?;
        self.inner.set_grant(d, c, g, a)
    }
    fn delete_pairing(&self, d: &str, a: &AuditEvent) -> Result<(), StoreError> {
        self.faults.thawed();
        self.faults.refuse(Writes::Pairings)?;
        self.inner.delete_pairing(d, a)
    }
    fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        self.faults.thawed();
        self.inner.load_agents()
    }
    fn put_agent(&self, agent: &StoredAgent, a: &AuditEvent) -> Result<(), StoreError> {
        self.faults.thawed();
        self.faults.refuse(Writes::Agents)?;
        self.inner.put_agent(agent, a)
    }
    fn delete_agent(&self, name: &str, a: &AuditEvent) -> Result<(), StoreError> {
        self.faults.thawed();
        self.faults.refuse(Writes::Agents)?;
        self.inner.delete_agent(name, a)
    }
    fn append_audit(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        self.faults.thawed();
        if let Some(entered) = lock(&self.faults.entered).as_ref() {
            let _ = entered.send(());
        }
        if let Some(gate) = lock(&self.faults.gate).as_ref() {
            let _ = gate.recv();
        }
        let pause = self.faults.audit_pause_micros.load(Ordering::SeqCst);
        if pause > 0 {
            std::thread::sleep(Duration::from_micros(pause));
        }
        self.faults.refuse(Writes::Audit)?;
        self.inner.append_audit(events)
    }
    fn probe_write(&self, at_ms: u64) -> Result<(), StoreError> {
        self.faults.probes.fetch_add(1, Ordering::SeqCst);
        self.faults.thawed();
        self.faults.refuse(Writes::Pairings)?;
        self.faults.refuse(Writes::Agents)?;
        self.inner.probe_write(at_ms)
    }
    fn release_reserve(&self) -> bool {
        let mut disk = lock(&self.faults.disk);
        if disk.reserve != Some(true) {
            return false;
        }
        disk.reserve = Some(false);
        disk.full = false;
        disk.released += 1;
        true
    }
    fn restore_reserve(&self) -> bool {
        let mut disk = lock(&self.faults.disk);
        match disk.reserve {
            None | Some(true) => true,
            Some(false) if disk.freed => {
                disk.reserve = Some(true);
                true
            }
            Some(false) => false,
        }
    }
    fn read_audit(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.faults.thawed();
        self.inner.read_audit(after, limit)
    }
    fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.faults.thawed();
        self.inner.query_audit(query)
    }
    fn audit_head(&self) -> Result<AuditHead, StoreError> {
        self.faults.thawed();
        self.inner.audit_head()
    }
    fn verify_audit(&self) -> Result<VerifyReport, StoreError> {
        self.faults.thawed();
        self.inner.verify_audit()
    }
    fn put_secret_hash(&self, name: &str, hash: [u8; 32]) -> Result<(), StoreError> {
        self.faults.thawed();
        self.inner.put_secret_hash(name, hash)
    }
    fn secret_hash(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError> {
        self.faults.thawed();
        self.inner.secret_hash(name)
    }
    fn put_rate_hit(&self, hit: &RateHit) -> Result<(), StoreError> {
        self.faults.on_call_path();
        self.inner.put_rate_hit(hit)
    }
    fn claim_rate_hit(&self, hit: &RateHit) -> Result<RateClaim, StoreError> {
        self.faults.claim_rate_hit(&*self.inner, hit)
    }
    fn take_from_buckets(
        &self,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> Result<Option<(usize, u64)>, StoreError> {
        self.faults.take_from_buckets(&*self.inner, takes, now_ms)
    }
    fn load_rate_hits(&self, now_ms: u64) -> Result<Vec<RateHit>, StoreError> {
        self.faults.thawed();
        self.inner.load_rate_hits(now_ms)
    }
    fn load_pairing_async(&self, device_id: &str) -> StoreFuture<Option<StoredPairing>> {
        let device_id = device_id.to_owned();
        self.answer(move |inner, faults| faults.load_pairing(inner, &device_id))
    }
    fn claim_rate_hit_async(&self, hit: &RateHit) -> StoreFuture<RateClaim> {
        let hit = hit.clone();
        self.answer(move |inner, faults| faults.claim_rate_hit(inner, &hit))
    }
    fn take_from_buckets_async(
        &self,
        takes: &[BucketTake],
        now_ms: u64,
    ) -> StoreFuture<Option<(usize, u64)>> {
        let takes = takes.to_vec();
        self.answer(move |inner, faults| faults.take_from_buckets(inner, &takes, now_ms))
    }
}
