//! A fleet of dk/2 lamps on one `dk vessel` process, shared by the fleet
//! bench (`benches/fleet.rs`, 10,000 devices) and its small version in the
//! tests (`tests/it/fleet.rs`, 1,000).
//!
//! - [`Home`]: a vessel's home seeded through the store, as if every lamp
//!   had paired over dk/2 and the person had granted both capabilities: the
//!   vessel's key, the admin token, one pairing per lamp with its pinned
//!   device key and its `paired` audit entry, and one key file per lamp
//!   (its secret, the vessel's key pinned, paired).
//! - [`Vessel`]: the `dk vessel` process on that home, on a device port
//!   that stays the same across restarts (the lamps know one URL).
//! - [`Fleet`]: the lamps, each a real dk-device client (`run_client`, its
//!   key file, the client's own backoff and jitter) in this process: the
//!   load generator, apart from the vessel it measures.
//! - [`Fleet::storm`]: the vessel killed with SIGKILL and started again;
//!   when each lamp is connected again and has answered a call made through
//!   the admin API, and why any attempt failed; [`Fleet::moved`]: a
//!   member of a fleet killed, and its lamps calling again through the
//!   others.
//! - `scale.rs`: three members of a fleet at size (the fleet-scale bench
//!   and its small version).

#![allow(
    dead_code,
    reason = "the bench and the test each use part of this module"
)]

pub mod scale;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dk_device::{ClientOptions, ConnectionEvent, Device, run_client};
use dk_http::{AdminClient, AdminToken};
use dk_store::entry::{Entry, Paired};
use dk_store::{AuditEvent, SqliteStore, Store, StoredPairing};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Any error a fleet step gives.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long any one step may take before the run gives up.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Calls through the admin API at once while the fleet comes back.
const CALLERS: usize = 32;

/// The vessel configuration of the fleet: every lamp connects from this
/// machine's loopback, one address, where a real fleet comes from thousands;
/// the cap on connections from one address is raised to hold them all. The
/// cap on connections from one address that have not yet authenticated (32)
/// and every other limit keep their defaults.
const CONFIG: &str = "[limits]\nmaxConnections = 40000\nmaxConnectionsPerAddress = 40000\n";

/// A vessel's home with `devices` lamps paired through the store.
pub struct Home {
    /// Removed with the home.
    dir: tempfile::TempDir,
    /// How many lamps are paired.
    pub devices: usize,
    /// The index of its first lamp (lamps `first..first + devices`).
    pub first: usize,
}

/// How a vessel of a fleet runs: its PostgreSQL store, its NATS server and
/// its member name (its home's vessel key is the fleet key).
pub struct Member {
    /// The store's URL.
    pub store: String,
    /// The NATS server's address.
    pub nats: String,
    /// Its name in the fleet.
    pub name: String,
}

impl Home {
    /// Seeds a new home: the vessel's key, the admin token, the config, and
    /// `devices` pairings, each with its audit entry, and their key files.
    pub fn seed(devices: usize) -> Result<Home, BoxError> {
        let dir = tempfile::Builder::new().prefix("dk-fleet-").tempdir()?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.path().join("vessel"))?;
        let store = SqliteStore::open(&dir.path().join("vessel").join("vessel.db"))?;
        Home::seed_on(dir, devices, 0, rand::random(), &store)
    }

    /// Seeds a home of one vessel of a fleet: lamps `first..first +
    /// devices` paired through `store` (the fleet's), the vessel's key the
    /// fleet key `vessel_secret`.
    pub fn seed_member(
        devices: usize,
        first: usize,
        vessel_secret: [u8; 32],
        store: &dyn Store,
    ) -> Result<Home, BoxError> {
        let dir = tempfile::Builder::new().prefix("dk-fleet-").tempdir()?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.path().join("vessel"))?;
        Home::seed_on(dir, devices, first, vessel_secret, store)
    }

    fn seed_on(
        dir: tempfile::TempDir,
        devices: usize,
        first: usize,
        vessel_secret: [u8; 32],
        store: &dyn Store,
    ) -> Result<Home, BoxError> {
        let home = Home {
            dir,
            devices,
            first,
        };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(home.keys_dir())?;
        std::fs::write(home.config_file(), CONFIG)?;
        AdminToken::generate().write_to(&home.token_file())?;

        let vessel_public = dk_channel::StaticKey::from_secret(vessel_secret)?.public();
        write_private(
            &home.vessel_key_file(),
            format!("{}\n", dk_channel::to_hex32(&vessel_secret)).as_bytes(),
        )?;

        let now = now_ms();
        for i in first..first + devices {
            let secret: [u8; 32] = rand::random();
            let public = dk_channel::StaticKey::from_secret(secret)?.public();
            let manifest = dk_proto::validate_manifest(&lamp_manifest(i)?)?;
            let generation = u64::try_from(i)? + 1;
            let grants = vec!["read_light".to_owned(), "set_light".to_owned()];
            let token: [u8; 32] = rand::random();
            let pairing = StoredPairing {
                device_id: manifest.id().to_owned(),
                manifest_json: manifest.to_stored_json(),
                digest: manifest.digest(),
                token_hash: Sha256::digest(token).into(),
                device_key: Some(*public.as_bytes()),
                grants: grants.clone(),
                generation,
                paired_at_ms: now,
            };
            let entry = Entry::Paired(Paired {
                device_id: pairing.device_id.clone(),
                name: manifest.name().to_owned(),
                digest: pairing.digest.clone(),
                grants,
                replaced: false,
                no_screen: false,
                channel: "dk/2".to_owned(),
                generation,
                device_key: Some(dk_channel::to_hex32(public.as_bytes())),
                by: None,
            });
            store.put_pairing(&pairing, &AuditEvent::of(&entry, now))?;
            let key_file = json!({
                "format": "dk-device-key/1",
                "secret": dk_channel::to_hex32(&secret),
                "vessel": dk_channel::to_hex32(vessel_public.as_bytes()),
                "paired": true,
            });
            write_private(&home.key_file(i), key_file.to_string().as_bytes())?;
        }
        Ok(home)
    }

    /// The vessel's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("vessel")
    }

    fn keys_dir(&self) -> PathBuf {
        self.dir.path().join("lamps")
    }

    /// Lamp `i`'s key file (`i` counted from the fleet's first lamp).
    pub fn key_file(&self, i: usize) -> PathBuf {
        self.keys_dir().join(format!("{i}.key"))
    }

    fn config_file(&self) -> PathBuf {
        self.dir.path().join("vessel.toml")
    }

    fn token_file(&self) -> PathBuf {
        self.dir.path().join("admin-token")
    }

    /// The vessel's key (in a fleet, the fleet key).
    pub fn vessel_key_file(&self) -> PathBuf {
        self.dir.path().join("vessel.key")
    }

    /// The admin token the vessel keeps the hash of.
    pub fn token(&self) -> Result<AdminToken, BoxError> {
        Ok(AdminToken::read_from(&self.token_file())?)
    }
}

/// Lamp `i`'s manifest: the reference lamp with an id and a name of its own.
pub fn lamp_manifest(i: usize) -> Result<Value, BoxError> {
    let mut manifest: Map<String, Value> = serde_json::from_str(dk_testkit::LAMP_JSON)?;
    manifest.insert("id".to_owned(), json!(device_id(i)));
    manifest.insert("name".to_owned(), json!(format!("Fleet lamp {i}")));
    Ok(Value::Object(manifest))
}

/// Lamp `i`'s device id.
pub fn device_id(i: usize) -> String {
    format!("lamp-{i:05}")
}

/// The tool reading lamp `i`.
pub fn read_tool(i: usize) -> String {
    format!("device__{}__read_light", device_id(i))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A free loopback port, for a device listener that must keep its port
/// across restarts.
pub fn free_port() -> Result<u16, BoxError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A `dk vessel` process on a [`Home`], killed and reaped when dropped.
pub struct Vessel {
    child: Option<Child>,
    /// Its admin API.
    pub admin: AdminClient,
    /// Its process id.
    pub pid: u32,
}

impl Vessel {
    /// Spawns `dk` as a vessel on `home`, devices on `port`, and waits
    /// until its admin API answers `GET /v1/status` with every pairing
    /// loaded: how long that took from the spawn.
    pub async fn start(dk: &Path, home: &Home, port: u16) -> Result<(Vessel, Duration), BoxError> {
        Vessel::start_as(dk, home, port, None).await
    }

    /// [`Vessel::start`], as a member of a fleet when `member` says so.
    pub async fn start_as(
        dk: &Path,
        home: &Home,
        port: u16,
        member: Option<&Member>,
    ) -> Result<(Vessel, Duration), BoxError> {
        let data_dir = home.data_dir();
        let address_file = data_dir.join("vessel.json");
        let _ = std::fs::remove_file(&address_file);
        let started = Instant::now();
        let mut extra: Vec<std::ffi::OsString> = Vec::new();
        match member {
            None => {
                extra.push("--vessel-key-file".into());
                extra.push(home.vessel_key_file().into());
            }
            Some(member) => {
                for arg in ["--fleet", &member.nats, "--fleet-member", &member.name] {
                    extra.push(arg.into());
                }
                extra.push("--fleet-key".into());
                extra.push(home.vessel_key_file().into());
            }
        }
        let mut command = Command::new(dk);
        if let Some(member) = member {
            command.env("DK_STORE", &member.store);
        }
        let child = command
            .env("DK_HOME", home.dir.path())
            .args(["vessel", "--no-prompt", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args([
                "--admin-listen",
                "127.0.0.1:0",
                "--mcp-listen",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--admin-token-file")
            .arg(home.token_file())
            .arg("--config")
            .arg(home.config_file())
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", dk.display()))?;
        let pid = child.id();
        let mut child = Some(child);
        let deadline = started + PATIENCE;
        let admin_addr: SocketAddr = loop {
            if let Ok(text) = std::fs::read_to_string(&address_file)
                && let Ok(value) = serde_json::from_str::<Value>(&text)
                && let Some(admin) = value.get("admin").and_then(Value::as_str)
            {
                break admin.parse()?;
            }
            if let Some(running) = child.as_mut()
                && let Some(status) = running.try_wait()?
            {
                return Err(format!("dk vessel exited at start ({status})").into());
            }
            if Instant::now() > deadline {
                return Err("dk vessel did not write vessel.json".into());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        };
        let vessel = Vessel {
            child,
            admin: AdminClient::new(admin_addr, home.token()?),
            pid,
        };
        loop {
            if let Ok(answer) = vessel.admin.get("/v1/status").await
                && answer.status == 200
            {
                let took = started.elapsed();
                let paired = answer.body.get("paired").and_then(Value::as_u64);
                if member.is_none() && paired != Some(u64::try_from(home.devices)?) {
                    return Err(format!("the vessel says {}", answer.body).into());
                }
                return Ok((vessel, took));
            }
            if Instant::now() > deadline {
                return Err("the admin API did not answer".into());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }

    /// SIGINT, and waits for the vessel to exit.
    pub async fn interrupt(mut self) -> Result<(), BoxError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + PATIENCE;
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("dk vessel did not stop on SIGINT".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// SIGKILL, and reaps it.
    pub fn kill(mut self) -> Result<(), BoxError> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Devices the vessel counts as connected.
    pub async fn connected(&self) -> Result<u64, BoxError> {
        let status = self.admin.get("/v1/status").await?;
        status
            .body
            .get("connected")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("no `connected` in {}", status.body).into())
    }

    /// A `kB` field of the process's `/proc/<pid>/status`, such as `VmRSS`.
    pub fn status_kib(&self, field: &str) -> Result<u64, BoxError> {
        status_kib(self.pid, field)
    }
}

impl Drop for Vessel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `kB` field of `/proc/<pid>/status`, such as `VmRSS`.
pub fn status_kib(pid: u32, field: &str) -> Result<u64, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no `{field}` in /proc/{pid}/status").into())
}

/// What the lamps' connection hooks record, shared with the fleet.
struct Record {
    /// When the storm began; `None` before.
    storm: Mutex<Option<Instant>>,
    /// Per lamp, whether it connected since the storm began (its call is
    /// then queued once; the call's answer is what the storm times).
    back_since_storm: Vec<AtomicBool>,
    /// Lamps connected at least once since the fleet started.
    ever: Vec<AtomicBool>,
    ever_count: AtomicUsize,
    /// Why attempts failed during the storm, counted.
    failures: Mutex<BTreeMap<String, u64>>,
    /// Lamps back, in order, for the callers.
    back: mpsc::UnboundedSender<usize>,
}

/// The lamps, each a dk-device client of its own in this process.
pub struct Fleet {
    record: Arc<Record>,
    back: Option<mpsc::UnboundedReceiver<usize>>,
    stop: watch::Sender<bool>,
    clients: JoinSet<Result<(), String>>,
    devices: usize,
}

/// How the fleet came back after the vessel was killed.
pub struct Storm {
    /// Lamps.
    pub devices: usize,
    /// From the restart's spawn until half, 99% and all of the lamps were
    /// connected again and had answered a call.
    pub p50: Duration,
    /// See `p50`.
    pub p99: Duration,
    /// See `p50`.
    pub all: Duration,
    /// From the spawn until its admin API answered.
    pub start: Duration,
    /// Why attempts failed, counted (the close code and reason, or the
    /// error opening the connection).
    pub failures: BTreeMap<String, u64>,
    /// Calls that failed before the lamp answered one, counted by reason.
    pub refused_calls: BTreeMap<String, u64>,
    /// Calls the vessel decided (answered with a decision, allowed or
    /// not): each one decision in the log.
    pub decided: u64,
}

impl Fleet {
    /// Starts one client per lamp of `home` against the vessel on `port`.
    pub fn start(home: &Home, port: u16) -> Result<Fleet, BoxError> {
        Fleet::start_at(home, &[port])
    }

    /// Starts one client per lamp of `home` against the vessel on the first
    /// of `ports`, moving on to the others when its connection drops (the
    /// members of a fleet).
    pub fn start_at(home: &Home, ports: &[u16]) -> Result<Fleet, BoxError> {
        let [port, others @ ..] = ports else {
            return Err("no port to connect to".into());
        };
        let (back, back_rx) = mpsc::unbounded_channel();
        let record = Arc::new(Record {
            storm: Mutex::new(None),
            back_since_storm: (0..home.devices).map(|_| AtomicBool::new(false)).collect(),
            ever: (0..home.devices).map(|_| AtomicBool::new(false)).collect(),
            ever_count: AtomicUsize::new(0),
            failures: Mutex::new(BTreeMap::new()),
            back,
        });
        let (stop, stop_rx) = watch::channel(false);
        let url = format!("ws://127.0.0.1:{port}/device");
        let mut clients = JoinSet::new();
        for i in 0..home.devices {
            let device = lamp_device(home.first + i)?;
            let hook = Arc::clone(&record);
            let mut options = ClientOptions::new(url.as_str())
                .key_file(home.key_file(home.first + i))
                .on_code(|_| {})
                .on_connection(move |event| hook.heard(i, event));
            for other in others {
                options = options.also_at(format!("ws://127.0.0.1:{other}/device"));
            }
            let mut stop = stop_rx.clone();
            clients.spawn(async move {
                let stopped = async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                };
                run_client(&device, options, stopped)
                    .await
                    .map_err(|e| format!("lamp {i}: {e}"))
            });
        }
        Ok(Fleet {
            record,
            back: Some(back_rx),
            stop,
            clients,
            devices: home.devices,
        })
    }

    /// Waits until every lamp has connected once and the vessel counts
    /// them all; how long that took.
    pub async fn connected(&mut self, vessel: &Vessel) -> Result<Duration, BoxError> {
        let started = Instant::now();
        let deadline = started + PATIENCE;
        loop {
            if let Some(ended) = self.clients.try_join_next() {
                return Err(format!("a lamp's client ended: {ended:?}").into());
            }
            let ever = self.record.ever_count.load(Ordering::Relaxed);
            if ever == self.devices && vessel.connected().await? == u64::try_from(self.devices)? {
                return Ok(started.elapsed());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{ever} of {} lamps connected, the vessel counts {}",
                    self.devices,
                    vessel.connected().await?
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills `vessel` with SIGKILL, waits `outage`, starts it again and
    /// waits until every lamp is connected again and has answered a call.
    pub async fn storm(
        &mut self,
        vessel: Vessel,
        dk: &Path,
        home: &Home,
        port: u16,
        outage: Duration,
    ) -> Result<(Vessel, Storm), BoxError> {
        let mut back = self.back.take().ok_or("the fleet has had its storm")?;
        // Lamps that connected before the storm are not news.
        while back.try_recv().is_ok() {}
        vessel.kill()?;
        tokio::time::sleep(outage).await;
        let spawned = Instant::now();
        if let Ok(mut storm) = self.record.storm.lock() {
            *storm = Some(spawned);
        }
        let (vessel, start) = Vessel::start(dk, home, port).await?;
        let storm = self.await_back(back, &vessel.admin, spawned, start).await?;
        Ok((vessel, storm))
    }

    /// Kills `holder` (SIGKILL), a member of a fleet holding every lamp,
    /// and waits until every lamp has connected to another member and has
    /// answered a call made through `through`'s admin API.
    pub async fn moved(
        &mut self,
        holder: Vessel,
        through: &AdminClient,
    ) -> Result<Storm, BoxError> {
        let back = self.back.take().ok_or("the fleet has had its storm")?;
        let killed = Instant::now();
        if let Ok(mut storm) = self.record.storm.lock() {
            *storm = Some(killed);
        }
        holder.kill()?;
        self.await_back(back, through, killed, Duration::ZERO).await
    }

    /// Calls each lamp once as it comes `back` (a refused call is tried
    /// again) through `admin`, until every lamp has answered; the times from
    /// `since`.
    async fn await_back(
        &mut self,
        back: mpsc::UnboundedReceiver<usize>,
        admin: &AdminClient,
        since: Instant,
        start: Duration,
    ) -> Result<Storm, BoxError> {
        let spawned = since;
        // Each lamp back is called once; a refused call is tried again.
        let answered: Arc<Vec<AtomicU64>> =
            Arc::new((0..self.devices).map(|_| AtomicU64::new(0)).collect());
        let refused: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let decided = Arc::new(AtomicU64::new(0));
        let queue = Arc::new(tokio::sync::Mutex::new(back));
        let mut callers = JoinSet::new();
        for _ in 0..CALLERS {
            let queue = Arc::clone(&queue);
            let answered = Arc::clone(&answered);
            let refused = Arc::clone(&refused);
            let decided = Arc::clone(&decided);
            let admin = admin.clone();
            callers.spawn(async move {
                loop {
                    let Some(i) = queue.lock().await.recv().await else {
                        return Ok::<(), BoxError>(());
                    };
                    call_until_answered(&admin, i, &refused, &decided).await?;
                    let took = spawned.elapsed();
                    if let Some(slot) = answered.get(i) {
                        slot.store(millis(took).saturating_add(1), Ordering::Relaxed);
                    }
                }
            });
        }
        let deadline = spawned + PATIENCE;
        loop {
            let done = answered
                .iter()
                .filter(|a| a.load(Ordering::Relaxed) > 0)
                .count();
            if done == self.devices {
                break;
            }
            if let Some(ended) = callers.try_join_next() {
                return Err(format!("a caller ended: {ended:?}").into());
            }
            if Instant::now() > deadline {
                return Err(format!("{done} of {} lamps answered", self.devices).into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        callers.abort_all();
        let mut times: Vec<u64> = answered
            .iter()
            .map(|a| a.load(Ordering::Relaxed).saturating_sub(1))
            .collect();
        times.sort_unstable();
        let at = |q: f64| {
            let last = times.len().saturating_sub(1);
            let index = ((last as f64) * q).round() as usize;
            Duration::from_millis(times.get(index.min(last)).copied().unwrap_or(0))
        };
        let failures = self
            .record
            .failures
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        let refused_calls = refused.lock().map(|r| r.clone()).unwrap_or_default();
        Ok(Storm {
            devices: self.devices,
            p50: at(0.5),
            p99: at(0.99),
            all: at(1.0),
            start,
            failures,
            refused_calls,
            decided: decided.load(Ordering::Relaxed),
        })
    }

    /// Stops every client and waits for them.
    pub async fn stop(mut self) -> Result<(), BoxError> {
        let _ = self.stop.send(true);
        while let Some(ended) = self.clients.join_next().await {
            ended?.map_err(|e| -> BoxError { e.into() })?;
        }
        Ok(())
    }
}

impl Record {
    /// A lamp's connection hook.
    fn heard(&self, i: usize, event: &ConnectionEvent) {
        let storm = self.storm.lock().ok().and_then(|s| *s);
        match event {
            ConnectionEvent::Connected => {
                if let Some(ever) = self.ever.get(i)
                    && !ever.swap(true, Ordering::Relaxed)
                {
                    self.ever_count.fetch_add(1, Ordering::Relaxed);
                }
                if storm.is_some()
                    && let Some(back) = self.back_since_storm.get(i)
                    && !back.swap(true, Ordering::Relaxed)
                {
                    let _ = self.back.send(i);
                }
            }
            ConnectionEvent::Disconnected { why, .. } => {
                if storm.is_some()
                    && let Ok(mut failures) = self.failures.lock()
                {
                    *failures.entry(failure_kind(why)).or_default() += 1;
                }
            }
            _ => {}
        }
    }
}

/// Why a connection failed, without what differs from one lamp to the next
/// (addresses, ports).
fn failure_kind(why: &str) -> String {
    // Close codes keep their digits: they are the reason.
    let code_at = why
        .find("closed by the vessel: ")
        .map(|at| at + 22)
        .or_else(|| why.find("closed the connection (").map(|at| at + 23));
    why.char_indices()
        .map(|(at, c)| {
            let in_code = code_at.is_some_and(|from| (from..from + 4).contains(&at));
            if c.is_ascii_digit() && !in_code {
                '#'
            } else {
                c
            }
        })
        .take(120)
        .collect()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Calls lamp `i`'s `read_light` through the admin API until it answers;
/// each refusal is counted by its reason.
async fn call_until_answered(
    admin: &AdminClient,
    i: usize,
    refused: &Mutex<BTreeMap<String, u64>>,
    decided: &AtomicU64,
) -> Result<(), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    let body = json!({"tool": read_tool(i), "input": {}, "timeoutMs": 10_000});
    loop {
        let answer = admin.post("/v1/tools/call", &body).await;
        if answer.as_ref().is_ok_and(|a| a.status == 200) {
            decided.fetch_add(1, Ordering::Relaxed);
        }
        let why = match answer {
            Ok(answer) if answer.status == 200 && answer.body.get("ok") == Some(&json!(true)) => {
                return Ok(());
            }
            Ok(answer) => answer
                .body
                .get("reason")
                .or_else(|| answer.body.get("error"))
                .map_or_else(|| format!("status {}", answer.status), Value::to_string),
            Err(e) => e.to_string(),
        };
        if let Ok(mut refused) = refused.lock() {
            *refused.entry(failure_kind(&why)).or_default() += 1;
        }
        if Instant::now() > deadline {
            return Err(format!("lamp {i} never answered: {why}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lamp `i` as a device: `set_light` keeps what it is given, and every
/// other capability answers the lamp's state, at once.
pub fn lamp_device(i: usize) -> Result<Device, BoxError> {
    let manifest = lamp_manifest(i)?;
    let state = Arc::new(Mutex::new(json!({"on": false, "brightness": 0})));
    let mut builder = Device::define(&manifest);
    let names: Vec<String> = manifest
        .get("capabilities")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name")?.as_str().map(str::to_owned))
        .collect();
    for name in names {
        let state = Arc::clone(&state);
        let sets = name == "set_light";
        builder = builder.handler(&name, move |input| {
            let answer = match state.lock() {
                Ok(mut state) => {
                    if sets {
                        *state = Value::Object(input);
                    }
                    state.clone()
                }
                Err(_) => Value::Null,
            };
            async move { Ok(answer) }
        });
    }
    Ok(builder.build()?)
}

impl Storm {
    /// The failed attempts and refused calls that are not what a restart
    /// at the connection caps explains: the connection lost at the kill,
    /// refused or reset while the vessel was down, the vessel busy (503 at
    /// its caps), the handshake deadline passed while the upgrade waited
    /// its turn (the vessel's close 4000, or the client's own deadline on
    /// an answer), and a call made between a lamp's handshake and the
    /// vessel counting it connected.
    pub fn unexplained(&self) -> Vec<String> {
        const FAILURES: [&str; 6] = [
            "connection lost",
            "Connection refused",
            "Connection reset by peer",
            "the vessel is busy (HTTP ###)",
            "the vessel closed the connection (4000)",
            "no answer within ## s",
        ];
        const CALLS: [&str; 1] = ["is not connected"];
        let failures = self
            .failures
            .keys()
            .filter(|why| !FAILURES.iter().any(|known| why.contains(known)));
        let calls = self
            .refused_calls
            .keys()
            .filter(|why| !CALLS.iter().any(|known| why.contains(known)));
        failures.chain(calls).cloned().collect()
    }
}

impl std::fmt::Display for Storm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "{} lamps back and answering: 50% {:.0} ms, 99% {:.0} ms, 100% {:.0} ms (vessel answering {:.0} ms after the spawn)",
            self.devices,
            ms(self.p50),
            ms(self.p99),
            ms(self.all),
            ms(self.start)
        )?;
        for (why, count) in &self.failures {
            write!(f, "\n  failed attempt x{count}: {why}")?;
        }
        for (why, count) in &self.refused_calls {
            write!(f, "\n  refused call x{count}: {why}")?;
        }
        Ok(())
    }
}
