//! A store double for tests (the `testing` feature, which only
//! dev-dependencies turn on, and dk-store's own tests): [`FaultyStore`],
//! another store with the faults a test switches on: writes of one kind
//! that fail as a full disk does (the write probe fails with pairings' and
//! agents' writes), and audit appends slowed, held at a gate
//! or failing. Every other call goes to the store underneath.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use crate::{
    AuditEntry, AuditEvent, AuditHead, AuditQuery, Cause, MemoryStore, RateHit, Snapshot, Store,
    StoreError, StoredAgent, StoredPairing, VerifyReport,
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
    inner: Box<dyn Store>,
    failing: [AtomicBool; 3],
    audit_pause_micros: AtomicU64,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
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
            inner: Box::new(inner),
            failing: [
                AtomicBool::new(false),
                AtomicBool::new(false),
                AtomicBool::new(false),
            ],
            audit_pause_micros: AtomicU64::new(0),
            entered: Mutex::new(None),
            gate: Mutex::new(None),
        }
    }

    /// Writes of `kind` fail (`failing`) as a full disk makes them fail, or
    /// go through again.
    pub fn fail(&self, kind: Writes, failing: bool) {
        self.flag(kind).store(failing, Ordering::SeqCst);
    }

    /// Every audit append first sleeps `pause` (a slow disk).
    pub fn pause_audit(&self, pause: Duration) {
        let micros = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX);
        self.audit_pause_micros.store(micros, Ordering::SeqCst);
    }

    /// Holds every audit append at a gate from now on.
    pub fn hold_audit(&self) -> AuditGate {
        let (entered, entered_rx) = mpsc::channel();
        let (open, gate) = mpsc::channel();
        *lock(&self.entered) = Some(entered);
        *lock(&self.gate) = Some(gate);
        AuditGate {
            entered: entered_rx,
            open,
        }
    }

    /// Held appends no longer say they started (the gate still holds them
    /// until its sender is dropped).
    pub fn stop_telling(&self) {
        *lock(&self.entered) = None;
    }

    fn flag(&self, kind: Writes) -> &AtomicBool {
        let [pairings, agents, audit] = &self.failing;
        match kind {
            Writes::Pairings => pairings,
            Writes::Agents => agents,
            Writes::Audit => audit,
        }
    }

    /// The full disk's error, when writes of `kind` fail.
    fn refuse(&self, kind: Writes) -> Result<(), StoreError> {
        if self.flag(kind).load(Ordering::SeqCst) {
            let disk = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
            return Err(StoreError::Database(Cause::new(disk)));
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for FaultyStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.inner.load()
    }
    fn put_pairing(&self, p: &StoredPairing, a: &AuditEvent) -> Result<(), StoreError> {
        self.refuse(Writes::Pairings)?;
        self.inner.put_pairing(p, a)
    }
    fn set_grant(&self, d: &str, c: &str, g: bool, a: &AuditEvent) -> Result<(), StoreError> {
        self.refuse(Writes::Pairings)?;
        self.inner.set_grant(d, c, g, a)
    }
    fn delete_pairing(&self, d: &str, a: &AuditEvent) -> Result<(), StoreError> {
        self.refuse(Writes::Pairings)?;
        self.inner.delete_pairing(d, a)
    }
    fn load_agents(&self) -> Result<Vec<StoredAgent>, StoreError> {
        self.inner.load_agents()
    }
    fn put_agent(&self, agent: &StoredAgent, a: &AuditEvent) -> Result<(), StoreError> {
        self.refuse(Writes::Agents)?;
        self.inner.put_agent(agent, a)
    }
    fn delete_agent(&self, name: &str, a: &AuditEvent) -> Result<(), StoreError> {
        self.refuse(Writes::Agents)?;
        self.inner.delete_agent(name, a)
    }
    fn append_audit(&self, events: &[AuditEvent]) -> Result<(), StoreError> {
        if let Some(entered) = lock(&self.entered).as_ref() {
            let _ = entered.send(());
        }
        if let Some(gate) = lock(&self.gate).as_ref() {
            let _ = gate.recv();
        }
        let pause = self.audit_pause_micros.load(Ordering::SeqCst);
        if pause > 0 {
            std::thread::sleep(Duration::from_micros(pause));
        }
        self.refuse(Writes::Audit)?;
        self.inner.append_audit(events)
    }
    fn probe_write(&self, at_ms: u64) -> Result<(), StoreError> {
        self.refuse(Writes::Pairings)?;
        self.refuse(Writes::Agents)?;
        self.inner.probe_write(at_ms)
    }
    fn read_audit(&self, after: u64, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.read_audit(after, limit)
    }
    fn query_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        self.inner.query_audit(query)
    }
    fn audit_head(&self) -> Result<AuditHead, StoreError> {
        self.inner.audit_head()
    }
    fn verify_audit(&self) -> Result<VerifyReport, StoreError> {
        self.inner.verify_audit()
    }
    fn put_secret_hash(&self, name: &str, hash: [u8; 32]) -> Result<(), StoreError> {
        self.inner.put_secret_hash(name, hash)
    }
    fn secret_hash(&self, name: &str) -> Result<Option<[u8; 32]>, StoreError> {
        self.inner.secret_hash(name)
    }
    fn put_rate_hit(&self, hit: &RateHit) -> Result<(), StoreError> {
        self.inner.put_rate_hit(hit)
    }
    fn load_rate_hits(&self, now_ms: u64) -> Result<Vec<RateHit>, StoreError> {
        self.inner.load_rate_hits(now_ms)
    }
}
