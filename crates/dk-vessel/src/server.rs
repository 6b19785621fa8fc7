//! [`VesselServer`]: a networked vessel in a few lines. It makes the data
//! directory private, binds the admin and MCP Unix sockets there (which
//! tells whether another vessel runs in it), opens the store, keeps the
//! admin token (its hash in the store, the token in a private file outside
//! the data directory), keeps the vessel's dk/2 static key (a private file
//! outside the data directory, by default `DIR.key` beside it; one left in
//! an old data directory is moved out), binds the device, admin and MCP listeners, writes
//! the address file `vessel.json`, and serves every route until
//! [`RunningVessel::stop`]. The address file and the sockets are removed
//! when it stops.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dk_core::config::VesselConfig;
use dk_core::reload::RuleFile;
use dk_core::{Limits, Vessel};
use dk_files::private::{
    PrivateFileError, ensure_private_dir, is_inside, read_private_file, write_private_file,
};
use dk_http::HttpLimits;
use dk_http::{AdminToken, AdminTokenError, bind_private_socket};
use dk_mcp::McpOptions;
use dk_policy::PolicySet;
use dk_store::entry as schema;
use dk_store::{AuditOptions, SqliteStore, Store, StoreError, audit_head_file};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The address file a running vessel writes in its data directory.
pub const ADDRESS_FILE: &str = "vessel.json";
/// The database file in the data directory, unless a store is given.
pub const DATABASE_FILE: &str = "vessel.db";
/// The admin API's Unix socket in the data directory.
pub const ADMIN_SOCKET: &str = "admin.sock";
/// The MCP route's Unix socket in the data directory.
pub const MCP_SOCKET: &str = "mcp.sock";
/// Where dk kept the vessel's dk/2 static key before: in the data
/// directory (the secret as 64 lower-case hex digits, mode 0600). A key
/// found there is moved to the key file outside it at start.
pub const OLD_VESSEL_KEY_FILE: &str = "vessel.key";
/// The name of the admin token's hash in the store.
const ADMIN_TOKEN: &str = "admin-token";
/// The name, in the store, of the SHA-256 of the vessel's public key: which
/// key this data directory's devices pinned.
const VESSEL_KEY: &str = "vessel-key";

/// The vessel's key file unless another is named: beside the data
/// directory, its name with `.key` added (for `~/.local/share/dk/vessel`,
/// `~/.local/share/dk/vessel.key`, beside the admin token). `None` when the
/// data directory has no name (`/`).
pub fn vessel_key_file(data_dir: &Path) -> Option<PathBuf> {
    let name = data_dir.file_name()?;
    let mut file = name.to_owned();
    file.push(".key");
    Some(data_dir.with_file_name(file))
}

/// Where the MCP route listens on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpListen {
    /// Not on TCP (agents may still use the MCP socket).
    Off,
    /// At this address; failing to bind it fails the start.
    At(SocketAddr),
    /// At this address when it is free; otherwise the vessel runs without
    /// an MCP listener and [`RunningVessel::mcp_unavailable`] says why.
    IfFree(SocketAddr),
}

/// Opens the store of a vessel whose data directory is given.
pub type StoreOpener =
    Box<dyn FnOnce(&Path) -> Result<Arc<dyn Store>, ServerError> + Send + 'static>;

/// Why a networked vessel did not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The data directory or one of its sockets could not be made or used
    /// (another vessel running there is one case).
    #[error("{0}")]
    Private(#[from] PrivateFileError),
    /// The store could not be opened or used.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The store opener refused, saying why.
    #[error("{0}")]
    StoreRefused(String),
    /// The vessel could not join its fleet (the fleet key, NATS), saying why.
    #[error("fleet: {0}")]
    Fleet(String),
    /// The admin token file is not a private file of this user.
    #[error("the admin token file is refused: {0}")]
    AdminTokenFile(PrivateFileError),
    /// The admin token file could not be read for another reason.
    #[error("the admin token file is refused: {0}")]
    AdminToken(AdminTokenError),
    /// The admin token could not be written to its file.
    #[error("admin token: {0}")]
    AdminTokenWrite(PrivateFileError),
    /// The vessel's key file is not a private file of this user, or does
    /// not hold a key (it is never replaced: devices pinned the key in it).
    #[error("the vessel key file is refused: {0}")]
    VesselKey(PrivateFileError),
    /// The vessel's key file holds something other than a key.
    #[error(
        "the vessel key file `{0}` does not hold a key: restore it, or move it away and start with --new-vessel-key (every dk/2 device must then forget the vessel and pair again)"
    )]
    NotAVesselKey(String),
    /// The vessel's key file is missing, but this data directory's devices
    /// pinned a key: a copy of the data directory without it is not the
    /// vessel they paired with.
    #[error(
        "the vessel key file `{path}` is missing, but this data directory's vessel had a key{}: restore the file from where you keep it (docs/STORAGE.md), or start with --new-vessel-key to make a new key (every dk/2 device must then forget the vessel and pair again)",
        pinned_by(*pinned)
    )]
    MissingVesselKey {
        /// The key file.
        path: String,
        /// How many paired dk/2 devices pinned the vessel's key.
        pinned: usize,
    },
    /// The vessel's key file holds another key than the one this data
    /// directory's devices pinned.
    #[error(
        "the vessel key file `{path}` holds the key {fingerprint}, not the one this data directory's devices pinned: put back the right file, or move it away and start with --new-vessel-key (every dk/2 device must then forget the vessel and pair again)"
    )]
    AnotherVesselKey {
        /// The key file.
        path: String,
        /// The fingerprint of the key it holds.
        fingerprint: String,
    },
    /// A new key was asked for while the key file holds one.
    #[error(
        "--new-vessel-key would replace the key in `{0}`, which devices may have pinned: move the file away first if that is what you mean"
    )]
    VesselKeyKept(String),
    /// The key file is inside the data directory, or cannot be named.
    #[error("{0}")]
    VesselKeyPlace(String),
    /// Two keys: one left in the data directory and another in the key
    /// file.
    #[error(
        "the data directory holds an old vessel key `{old}` that differs from the one in `{new}`: keep the one your devices pinned (the fingerprint `dk vessel` printed when they paired) in `{new}` and remove the other"
    )]
    TwoVesselKeys {
        /// The key left in the data directory.
        old: String,
        /// The key file.
        new: String,
    },
    /// The system gave no randomness to make the vessel's key.
    #[error("cannot make the vessel's key: {0}")]
    NoRandomness(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// A bound listener's address could not be read.
    #[error("{0}")]
    LocalAddress(io::Error),
    /// The address file could not be written.
    #[error("address file: {0}")]
    AddressFile(PrivateFileError),
    /// A route failed while serving.
    #[error("{route}: {source}")]
    Serve {
        /// The route: `admin API`, `admin socket`, `device route`, `MCP
        /// route` or `MCP socket`.
        route: &'static str,
        /// Why.
        source: io::Error,
    },
    /// A route's task ended without its answer (it panicked or was
    /// cancelled).
    #[error("{0}: its task ended early")]
    Task(&'static str),
    /// The audit log could not be flushed at the stop.
    #[error("audit log: {0}")]
    Audit(StoreError),
}

/// Who pinned a missing key, for its error.
fn pinned_by(devices: usize) -> String {
    match devices {
        0 => String::new(),
        1 => " (1 paired dk/2 device pinned it)".to_owned(),
        n => format!(" ({n} paired dk/2 devices pinned it)"),
    }
}

/// Starts a networked vessel: every route, the store, MCP, the Unix sockets
/// and the address file.
///
/// ```
/// use std::net::SocketAddr;
///
/// use dk_vessel::{McpListen, VesselServer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let dir = tempfile::TempDir::new()?;
/// let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
/// let running = VesselServer::new(dir.path().join("vessel"))
///     .listen(any_port)
///     .admin_listen(Some(any_port))
///     .mcp_listen(McpListen::At(any_port))
///     .start()
///     .await?;
/// println!("devices connect to ws://{}/device", running.device_addr());
/// assert!(dir.path().join("vessel/vessel.json").exists());
/// running.stop().await?;
/// assert!(!dir.path().join("vessel/vessel.json").exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })
/// # }
/// ```
pub struct VesselServer {
    data_dir: PathBuf,
    listen: SocketAddr,
    admin_listen: Option<SocketAddr>,
    mcp_listen: McpListen,
    metrics_listen: Option<SocketAddr>,
    unix_sockets: bool,
    address_file: bool,
    admin_token_file: Option<PathBuf>,
    vessel_key_file: Option<PathBuf>,
    new_vessel_key: bool,
    policies: PolicySet,
    rule_file: Option<RuleFile>,
    config: VesselConfig,
    limits: Limits,
    http: HttpLimits,
    mcp: McpOptions,
    store: Option<StoreOpener>,
    #[cfg(feature = "fleet")]
    fleet: Option<dk_fleet::FleetOptions>,
}

impl std::fmt::Debug for VesselServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VesselServer")
            .field("data_dir", &self.data_dir)
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("mcp_listen", &self.mcp_listen)
            .finish_non_exhaustive()
    }
}

impl VesselServer {
    /// A vessel keeping its files in `data_dir` (made 0700), with the
    /// defaults of `dk vessel`: devices on 127.0.0.1:7777, the admin API on
    /// 127.0.0.1:7778, MCP on 127.0.0.1:7779 when it is free, the Unix
    /// sockets and the address file, no rules, the default configuration
    /// and limits, and a SQLite store `vessel.db` whose audit head is kept
    /// beside the data directory. Without an admin token file a fresh admin
    /// token is made at every start.
    pub fn new(data_dir: impl Into<PathBuf>) -> VesselServer {
        VesselServer {
            data_dir: data_dir.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7777)),
            admin_listen: Some(SocketAddr::from(([127, 0, 0, 1], 7778))),
            mcp_listen: McpListen::IfFree(SocketAddr::from(([127, 0, 0, 1], 7779))),
            metrics_listen: None,
            unix_sockets: true,
            address_file: true,
            admin_token_file: None,
            vessel_key_file: None,
            new_vessel_key: false,
            policies: PolicySet::empty(),
            rule_file: None,
            config: VesselConfig::default(),
            limits: Limits::default(),
            http: HttpLimits::default(),
            mcp: McpOptions::default(),
            store: None,
            #[cfg(feature = "fleet")]
            fleet: None,
        }
    }

    /// Runs as a member of a fleet: joins it through NATS as `options`
    /// say at the start (no fleet key file, no NATS, no start), reaches
    /// devices connected to other members through them, follows the state
    /// they change in the shared store, and shows the prompts they raise.
    /// The vessel's dk/2 key should be the fleet key file
    /// ([`VesselServer::vessel_key_file`]), so devices pin one key for
    /// every member, and its store the fleet's PostgreSQL one.
    #[cfg(feature = "fleet")]
    pub fn fleet(mut self, options: dk_fleet::FleetOptions) -> VesselServer {
        self.fleet = Some(options);
        self
    }

    /// Where devices connect (the `/device` route).
    pub fn listen(mut self, addr: SocketAddr) -> VesselServer {
        self.listen = addr;
        self
    }

    /// Where the admin API listens on TCP; `None` for the admin socket only.
    pub fn admin_listen(mut self, addr: Option<SocketAddr>) -> VesselServer {
        self.admin_listen = addr;
        self
    }

    /// Where the MCP route listens on TCP.
    pub fn mcp_listen(mut self, listen: McpListen) -> VesselServer {
        self.mcp_listen = listen;
        self
    }

    /// Where `/metrics` is also served alone, without the admin token, for
    /// a scraper that should not hold it; `None` (the default) for the
    /// admin API's `/metrics` only.
    pub fn metrics_listen(mut self, addr: Option<SocketAddr>) -> VesselServer {
        self.metrics_listen = addr;
        self
    }

    /// Whether the admin API and the MCP route also listen on Unix sockets
    /// in the data directory (on by default).
    pub fn unix_sockets(mut self, on: bool) -> VesselServer {
        self.unix_sockets = on;
        self
    }

    /// Whether `vessel.json` is written in the data directory (on by
    /// default).
    pub fn address_file(mut self, on: bool) -> VesselServer {
        self.address_file = on;
        self
    }

    /// Where the admin token is kept (mode 0600), outside the data
    /// directory, which holds only its hash.
    pub fn admin_token_file(mut self, path: impl Into<PathBuf>) -> VesselServer {
        self.admin_token_file = Some(path.into());
        self
    }

    /// Where the vessel's dk/2 static key is kept (mode 0600), outside the
    /// data directory, which holds only its public half's hash. [default:
    /// [`vessel_key_file`], beside the data directory]
    pub fn vessel_key_file(mut self, path: impl Into<PathBuf>) -> VesselServer {
        self.vessel_key_file = Some(path.into());
        self
    }

    /// Makes a new vessel key when the key file is missing although this
    /// data directory's devices pinned one (by default the start is then
    /// refused): every dk/2 device must forget the vessel and pair again.
    /// A key file that is there is never replaced.
    pub fn new_vessel_key(mut self) -> VesselServer {
        self.new_vessel_key = true;
        self
    }

    /// The `device_use` rules in force at the start.
    pub fn policies(mut self, policies: PolicySet) -> VesselServer {
        self.policies = policies;
        self
    }

    /// The `device_use` rules in force at the start, from a rule file:
    /// recorded with the file and its digest (in the `vessel-started`
    /// entry), and read again by [`Vessel::reload_rules`] (the admin API's
    /// `POST /v1/rules/reload`). Takes the place of [`VesselServer::policies`].
    pub fn rule_file(mut self, file: RuleFile) -> VesselServer {
        self.rule_file = Some(file);
        self
    }

    /// The vessel configuration (streaming kinds, rate limits, run
    /// budgets, `[limits]`), applied over the limits, the HTTP limits and
    /// the MCP route's options.
    pub fn config(mut self, config: VesselConfig) -> VesselServer {
        self.config = config;
        self
    }

    /// The limits, before the configuration is applied.
    pub fn limits(mut self, limits: Limits) -> VesselServer {
        self.limits = limits;
        self
    }

    /// The device route's and admin API's listener limits (and every
    /// listener's deadlines), before the configuration is applied.
    pub fn http_limits(mut self, limits: HttpLimits) -> VesselServer {
        self.http = limits;
        self
    }

    /// The MCP route's options (its listener's caps and deadlines among
    /// them), before the configuration is applied.
    pub fn mcp_options(mut self, options: McpOptions) -> VesselServer {
        self.mcp = options;
        self
    }

    /// Opens the store with `open` (given the data directory), after the
    /// sockets are bound, instead of the default SQLite store.
    pub fn store_with(
        mut self,
        open: impl FnOnce(&Path) -> Result<Arc<dyn Store>, ServerError> + Send + 'static,
    ) -> VesselServer {
        self.store = Some(Box::new(open));
        self
    }

    /// Binds everything, opens the store and starts serving. Call it within
    /// a Tokio runtime.
    pub async fn start(self) -> Result<RunningVessel, ServerError> {
        ensure_private_dir(&self.data_dir)?;
        // The sockets first: they tell whether another vessel runs here.
        let mut leftovers = Leftovers::default();
        let sockets = bind_unix_sockets(&self.data_dir, self.unix_sockets, &mut leftovers).await?;
        let store = open_store(self.store, &self.data_dir)?;
        // Each member of a fleet keeps its own admin token's hash in the
        // store they share.
        #[cfg(feature = "fleet")]
        let token_name = self.fleet.as_ref().map_or_else(
            || ADMIN_TOKEN.to_owned(),
            |fleet| format!("{ADMIN_TOKEN}.{}", fleet.member()),
        );
        #[cfg(not(feature = "fleet"))]
        let token_name = ADMIN_TOKEN.to_owned();
        // A member joins with the fleet's key or not at all: read before a
        // missing vessel key could be made.
        #[cfg(feature = "fleet")]
        let fleet = match self.fleet {
            Some(options) => Some(
                dk_fleet::Fleet::connect(options)
                    .await
                    .map_err(|e| ServerError::Fleet(e.to_string()))?,
            ),
            None => None,
        };
        let (token, replaced) = admin_token(
            store.as_ref(),
            &token_name,
            self.admin_token_file.as_deref(),
        )?;
        let key_file = key_file_of(&self.data_dir, self.vessel_key_file.clone())?;
        refuse_inside(&self.data_dir, &key_file)?;
        let moved_key = move_old_key(&self.data_dir, &key_file)?;
        let (identity, made_key) = vessel_key(store.as_ref(), &key_file, self.new_vessel_key)?;
        let mut listeners =
            Listeners::bind(self.listen, self.admin_listen, &self.mcp_listen).await?;
        let metrics = match self.metrics_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let metrics_addr = metrics
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map_err(ServerError::LocalAddress)?;
        listeners.metrics = metrics;
        let mut limits = self.limits;
        self.config.apply_to(&mut limits);
        let (mut http, mut mcp) = (self.http, self.mcp);
        crate::config::apply_listener_limits(&self.config, &mut http, &mut mcp);
        let vessel = Vessel::open(store, self.policies, limits)?;
        if let Some(file) = self.rule_file {
            vessel.use_rule_file(file);
        }
        let fingerprint = identity.public().fingerprint();
        vessel.set_identity(identity);
        record_key(
            &vessel,
            made_key,
            moved_key.as_deref(),
            &key_file,
            &fingerprint,
        );
        vessel.set_streaming(self.config.streaming.clone());
        vessel.add_secret(token.expose());
        record_start(&vessel, replaced, &fingerprint);
        // The address file says the vessel is up: written once its first
        // entries are committed, so nothing a client does comes before them.
        let flushing = Arc::clone(&vessel);
        if let Ok(flushed) = tokio::task::spawn_blocking(move || flushing.flush_audit()).await {
            flushed?;
        }
        if self.address_file {
            let file = self.data_dir.join(ADDRESS_FILE);
            write_address(
                &file,
                &self.data_dir,
                self.unix_sockets,
                listeners.device_addr,
                listeners.admin_addr,
                listeners.mcp_addr,
            )?;
            leftovers.0.insert(0, file);
        }
        let (device_addr, admin_addr, mcp_addr) = (
            listeners.device_addr,
            listeners.admin_addr,
            listeners.mcp_addr,
        );
        let mcp_unavailable = listeners.mcp_unavailable.clone();
        let served = serve_all(&vessel, &token, listeners, sockets, &http, mcp);
        #[cfg(feature = "fleet")]
        let membership = match fleet {
            Some(fleet) => {
                vessel.registry().set_shared();
                let joined =
                    crate::member::Membership::start(&vessel, fleet, served.stop.subscribe()).await;
                match joined {
                    Ok(membership) => Some(membership),
                    Err(error) => {
                        served.stop.send_replace(true);
                        return Err(ServerError::Fleet(error.to_string()));
                    }
                }
            }
            None => None,
        };
        Ok(RunningVessel {
            #[cfg(feature = "fleet")]
            membership,
            vessel,
            console: served.console,
            token,
            token_replaced: replaced,
            key_file,
            moved_key,
            device_addr,
            admin_addr,
            mcp_addr,
            metrics_addr,
            mcp_unavailable,
            data_dir: self.data_dir,
            stop: served.stop,
            tasks: served.tasks,
            leftovers,
        })
    }
}

/// The admin and MCP Unix sockets in `data_dir`, when the vessel has them;
/// each noted in `leftovers` once bound.
async fn bind_unix_sockets(
    data_dir: &Path,
    unix_sockets: bool,
    leftovers: &mut Leftovers,
) -> Result<Option<(UnixListener, UnixListener)>, ServerError> {
    if !unix_sockets {
        return Ok(None);
    }
    let admin_path = data_dir.join(ADMIN_SOCKET);
    let admin = bind_private_socket(&admin_path).await?;
    leftovers.0.push(admin_path);
    let mcp_path = data_dir.join(MCP_SOCKET);
    let mcp = bind_private_socket(&mcp_path).await?;
    leftovers.0.push(mcp_path);
    Ok(Some((admin, mcp)))
}

/// The store `open` gives, or by default the SQLite store in `data_dir`
/// with its audit head kept beside the data directory.
fn open_store(open: Option<StoreOpener>, data_dir: &Path) -> Result<Arc<dyn Store>, ServerError> {
    if let Some(open) = open {
        return open(data_dir);
    }
    let audit = AuditOptions {
        head_file: audit_head_file(data_dir),
        key: None,
    };
    let store = SqliteStore::open_with(&data_dir.join(DATABASE_FILE), audit)?;
    Ok(Arc::new(store) as Arc<dyn Store>)
}

/// The vessel key's file: the one named, else the one beside `data_dir`.
fn key_file_of(data_dir: &Path, named: Option<PathBuf>) -> Result<PathBuf, ServerError> {
    match named {
        Some(file) => Ok(file),
        None => vessel_key_file(data_dir).ok_or_else(|| {
            ServerError::VesselKeyPlace(format!(
                "the data directory `{}` has no name to put the vessel key file beside: name one",
                data_dir.display()
            ))
        }),
    }
}

/// The TCP listeners, bound, and their addresses.
struct Listeners {
    devices: TcpListener,
    admin: Option<TcpListener>,
    mcp: Option<TcpListener>,
    /// `/metrics` alone, when it has a listener of its own.
    metrics: Option<TcpListener>,
    /// Why MCP has no listener, when it was to take a busy address.
    mcp_unavailable: Option<String>,
    device_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    mcp_addr: Option<SocketAddr>,
}

impl Listeners {
    async fn bind(
        listen: SocketAddr,
        admin_listen: Option<SocketAddr>,
        mcp_listen: &McpListen,
    ) -> Result<Listeners, ServerError> {
        let devices = bind(listen).await?;
        let admin = match admin_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let (mcp, mcp_unavailable) = match *mcp_listen {
            McpListen::Off => (None, None),
            McpListen::At(addr) => (Some(bind(addr).await?), None),
            McpListen::IfFree(addr) => match bind(addr).await {
                Ok(listener) => (Some(listener), None),
                Err(error) => (None, Some(error.to_string())),
            },
        };
        let device_addr = devices.local_addr().map_err(ServerError::LocalAddress)?;
        let admin_addr = admin
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map_err(ServerError::LocalAddress)?;
        let mcp_addr = mcp
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map_err(ServerError::LocalAddress)?;
        Ok(Listeners {
            devices,
            admin,
            mcp,
            metrics: None,
            mcp_unavailable,
            device_addr,
            admin_addr,
            mcp_addr,
        })
    }
}

/// The audit entry of the vessel's key when this start made or moved it.
fn record_key(
    vessel: &Vessel,
    made_key: Made,
    moved_key: Option<&Path>,
    key_file: &Path,
    fingerprint: &str,
) {
    let fingerprint = fingerprint.to_owned();
    match (made_key, moved_key) {
        (Made::New, _) => vessel.record(schema::VesselKey::made(fingerprint)),
        (Made::Replacing, _) => vessel.record(schema::VesselKey::replaced(fingerprint)),
        (Made::Kept, Some(old)) => vessel.record(schema::VesselKey::moved(
            old.display().to_string(),
            key_file.display().to_string(),
            fingerprint,
        )),
        (Made::Kept, None) => {}
    }
}

/// The audit entries of the start: a replaced admin token, then
/// `vessel-started`.
fn record_start(vessel: &Vessel, token_replaced: bool, fingerprint: &str) {
    if token_replaced {
        vessel.record(schema::AdminToken { replaced: true });
    }
    // Which rules are in force, from now until a reload or the stop.
    vessel.record(schema::VesselStarted {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        fingerprint: fingerprint.to_owned(),
        rules: vessel.rules_in_force(),
    });
}

/// What serving every route started: the console, the stop signal and the
/// tasks that serve.
struct Served {
    console: Arc<dk_http::Console>,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)>,
}

/// Starts a task for every listener (admin API, the Unix sockets, devices,
/// MCP), each ending when the stop signal is sent.
fn serve_all(
    vessel: &Arc<Vessel>,
    token: &AdminToken,
    listeners: Listeners,
    sockets: Option<(UnixListener, UnixListener)>,
    http: &HttpLimits,
    mcp_options: McpOptions,
) -> Served {
    let (stop, stopped) = watch::channel(false);
    let until = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)> = Vec::new();
    let console = dk_http::Console::new();
    if let Some(mcp) = listeners.mcp_addr {
        let host = if mcp.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], mcp.port()))
        } else {
            mcp
        };
        console.set_mcp_url(format!("http://{host}/mcp"));
    }
    if let Some(addr) = listeners.admin_addr {
        console.set_address(addr);
    }
    if let Some(admin) = listeners.admin {
        let serve = dk_http::serve_admin_with(
            admin,
            Arc::clone(vessel),
            token.clone(),
            Arc::clone(&console),
            http.clone(),
            until(stopped.clone()),
        );
        tasks.push(("admin API", tokio::spawn(serve)));
    }
    if let Some((admin_socket, mcp_socket)) = sockets {
        let serve = dk_http::serve_admin_unix_with(
            admin_socket,
            Arc::clone(vessel),
            token.clone(),
            Arc::clone(&console),
            http.clone(),
            until(stopped.clone()),
        );
        tasks.push(("admin socket", tokio::spawn(serve)));
        let serve = dk_mcp::serve_mcp_unix(
            mcp_socket,
            Arc::clone(vessel),
            Arc::clone(vessel.agents()),
            mcp_options,
            until(stopped.clone()),
        );
        tasks.push(("MCP socket", tokio::spawn(serve)));
    }
    let serve = dk_http::serve_devices_with(
        listeners.devices,
        Arc::clone(vessel),
        http.clone(),
        until(stopped.clone()),
    );
    tasks.push(("device route", tokio::spawn(serve)));
    if let Some(mcp) = listeners.mcp {
        let serve = dk_mcp::serve_mcp_with(
            mcp,
            Arc::clone(vessel),
            Arc::clone(vessel.agents()),
            mcp_options,
            until(stopped.clone()),
        );
        tasks.push(("MCP route", tokio::spawn(serve)));
    }
    if let Some(metrics) = listeners.metrics {
        let serve = dk_http::serve_metrics(
            metrics,
            Arc::clone(vessel),
            http.clone(),
            until(stopped.clone()),
        );
        tasks.push(("metrics", tokio::spawn(serve)));
    }
    Served {
        console,
        stop,
        tasks,
    }
}

/// A vessel [`VesselServer::start`] started: where it listens, its state,
/// and the way to stop it.
#[derive(Debug)]
pub struct RunningVessel {
    #[cfg(feature = "fleet")]
    membership: Option<crate::member::Membership>,
    console: Arc<dk_http::Console>,
    vessel: Arc<Vessel>,
    token: AdminToken,
    token_replaced: bool,
    key_file: PathBuf,
    moved_key: Option<PathBuf>,
    device_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    mcp_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    mcp_unavailable: Option<String>,
    data_dir: PathBuf,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)>,
    leftovers: Leftovers,
}

impl RunningVessel {
    /// The vessel's place in its fleet, when it runs as a member
    /// ([`VesselServer::fleet`]).
    #[cfg(feature = "fleet")]
    pub fn fleet(&self) -> Option<&Arc<dk_fleet::Fleet>> {
        self.membership
            .as_ref()
            .map(crate::member::Membership::fleet)
    }

    /// The vessel's state.
    pub fn vessel(&self) -> &Arc<Vessel> {
        &self.vessel
    }

    /// The fingerprint of the vessel's dk/2 key, as a device shows it
    /// after pairing: people compare the two.
    pub fn fingerprint(&self) -> String {
        self.vessel.fingerprint().unwrap_or_default()
    }

    /// The person's console on the admin listener: its login links
    /// ([`Console::login_link`](dk_http::Console::login_link), `None`
    /// without a TCP admin listener).
    pub fn console(&self) -> &Arc<dk_http::Console> {
        &self.console
    }

    /// The admin API's bearer token.
    pub fn admin_token(&self) -> &AdminToken {
        &self.token
    }

    /// Whether the start replaced an earlier admin token (the file's was
    /// missing or not the one whose hash the store holds).
    pub fn admin_token_replaced(&self) -> bool {
        self.token_replaced
    }

    /// Where the vessel's dk/2 static key is kept.
    pub fn vessel_key_file(&self) -> &Path {
        &self.key_file
    }

    /// Where the key was found when this start moved it out of the data
    /// directory (where an older dk kept it), if it did.
    pub fn vessel_key_moved_from(&self) -> Option<&Path> {
        self.moved_key.as_deref()
    }

    /// Where devices connect.
    pub fn device_addr(&self) -> SocketAddr {
        self.device_addr
    }

    /// Where the admin API listens on TCP, if it does.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Where the MCP route listens on TCP, if it does.
    pub fn mcp_addr(&self) -> Option<SocketAddr> {
        self.mcp_addr
    }

    /// Where `/metrics` is served alone, without the token, if it is
    /// ([`VesselServer::metrics_listen`]).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Why MCP has no TCP listener when [`McpListen::IfFree`] found its
    /// address taken.
    pub fn mcp_unavailable(&self) -> Option<&str> {
        self.mcp_unavailable.as_deref()
    }

    /// The admin API's Unix socket.
    pub fn admin_socket(&self) -> PathBuf {
        self.data_dir.join(ADMIN_SOCKET)
    }

    /// The MCP route's Unix socket.
    pub fn mcp_socket(&self) -> PathBuf {
        self.data_dir.join(MCP_SOCKET)
    }

    /// A future that resolves once [`RunningVessel::stop`] is called, for
    /// the embedder's own tasks (a prompt, a rule-file watch) to end with
    /// the vessel.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// Asks every route to finish, waits for them, removes the address file
    /// and the sockets, and flushes the audit log. The first failure of a
    /// route is returned, after everything is stopped.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        #[cfg(feature = "fleet")]
        if let Some(membership) = self.membership.take() {
            membership.leave().await;
        }
        self.stop.send_replace(true);
        let mut first = None;
        for (route, task) in std::mem::take(&mut self.tasks) {
            let outcome = match task.await {
                Ok(Ok(())) => continue,
                Ok(Err(source)) => ServerError::Serve { route, source },
                Err(_) => ServerError::Task(route),
            };
            first.get_or_insert(outcome);
        }
        drop(std::mem::take(&mut self.leftovers));
        self.vessel.record(schema::VesselStopped {
            rules: self.vessel.rules_in_force(),
        });
        self.vessel.flush_audit().map_err(ServerError::Audit)?;
        first.map_or(Ok(()), Err)
    }
}

/// Files the vessel made that go when it stops (short of SIGKILL): its
/// address file and its sockets, removed when this is dropped.
#[derive(Debug, Default)]
struct Leftovers(Vec<PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

/// Whether the vessel's key was made at this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// The key file's key.
    Kept,
    /// A first key, for a data directory that had none.
    New,
    /// A new key where devices had pinned another (`new_vessel_key`).
    Replacing,
}

/// The key in `path`, parsed; a file that holds no key is refused.
fn parse_key(path: &Path, bytes: &[u8]) -> Result<dk_channel::StaticKey, ServerError> {
    let shown = || path.display().to_string();
    let text = std::str::from_utf8(bytes).map_err(|_| ServerError::NotAVesselKey(shown()))?;
    let secret = dk_channel::from_hex32(text.trim_end_matches('\n'))
        .ok_or_else(|| ServerError::NotAVesselKey(shown()))?;
    dk_channel::StaticKey::from_secret(secret).map_err(|_| ServerError::NotAVesselKey(shown()))
}

/// The SHA-256 of a key's public half, as the store keeps it.
fn public_hash(key: &dk_channel::StaticKey) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(key.public().as_bytes()).into()
}

/// The vessel's static key kept in `path`, or a new one written there
/// (0600) when there is none and none was pinned; how it came. A file that
/// is not private or holds no key is refused, never replaced: devices
/// pinned the key it holds. A missing file where the store says devices
/// pinned a key is refused unless `new_key` (a copy of the data directory
/// without the key is not the vessel the devices paired with); a key the
/// store does not know as this data directory's is refused.
fn vessel_key(
    store: &dyn Store,
    path: &Path,
    new_key: bool,
) -> Result<(dk_channel::StaticKey, Made), ServerError> {
    let shown = || path.display().to_string();
    let kept = store.secret_hash(VESSEL_KEY)?;
    match read_private_file(path) {
        Ok(_) if new_key => Err(ServerError::VesselKeyKept(shown())),
        Ok(bytes) => {
            let key = parse_key(path, &bytes)?;
            let hash = public_hash(&key);
            match kept {
                Some(kept) if kept != hash => Err(ServerError::AnotherVesselKey {
                    path: shown(),
                    fingerprint: key.public().fingerprint(),
                }),
                Some(_) => Ok((key, Made::Kept)),
                None => {
                    store.put_secret_hash(VESSEL_KEY, hash)?;
                    Ok((key, Made::Kept))
                }
            }
        }
        Err(e) if e.is_absent() => {
            let pinned = store
                .load()?
                .pairings
                .iter()
                .filter(|p| p.device_key.is_some())
                .count();
            let had_one = kept.is_some() || pinned > 0;
            if had_one && !new_key {
                return Err(ServerError::MissingVesselKey {
                    path: shown(),
                    pinned,
                });
            }
            let key = dk_channel::StaticKey::generate()
                .map_err(|e| ServerError::NoRandomness(e.to_string()))?;
            let text = format!("{}\n", dk_channel::to_hex32(key.secret()));
            write_private_file(path, text.as_bytes()).map_err(ServerError::VesselKey)?;
            store.put_secret_hash(VESSEL_KEY, public_hash(&key))?;
            Ok((key, if had_one { Made::Replacing } else { Made::New }))
        }
        Err(e) => Err(ServerError::VesselKey(e)),
    }
}

/// Moves a key an older dk left in the data directory to `key_file`
/// (written 0600 atomically, then the old one removed and the directory
/// synced); the old path when it did. The same key in both places only
/// loses the old copy; two different keys are refused.
fn move_old_key(data_dir: &Path, key_file: &Path) -> Result<Option<PathBuf>, ServerError> {
    let old = data_dir.join(OLD_VESSEL_KEY_FILE);
    if std::fs::symlink_metadata(&old).is_err() {
        return Ok(None);
    }
    let bytes = read_private_file(&old).map_err(ServerError::VesselKey)?;
    let key = parse_key(&old, &bytes)?;
    match read_private_file(key_file) {
        Ok(there) => {
            let same = parse_key(key_file, &there)?;
            if same.secret() != key.secret() {
                return Err(ServerError::TwoVesselKeys {
                    old: old.display().to_string(),
                    new: key_file.display().to_string(),
                });
            }
        }
        Err(e) if e.is_absent() => {
            write_private_file(key_file, &bytes).map_err(ServerError::VesselKey)?;
        }
        Err(e) => return Err(ServerError::VesselKey(e)),
    }
    std::fs::remove_file(&old)
        .and_then(|()| std::fs::File::open(data_dir)?.sync_all())
        .map_err(|e| ServerError::VesselKey(PrivateFileError::io(&old, e)))?;
    Ok(Some(old))
}

/// Refuses a key file inside the data directory, which a copy or a backup
/// of it would carry.
fn refuse_inside(data_dir: &Path, key_file: &Path) -> Result<(), ServerError> {
    if is_inside(data_dir, key_file).map_err(|e| ServerError::VesselKeyPlace(e.to_string()))? {
        return Err(ServerError::VesselKeyPlace(format!(
            "the vessel key file `{}` is inside the data directory `{}`: keep it outside, where a copy of the data directory does not take it",
            key_file.display(),
            data_dir.display()
        )));
    }
    Ok(())
}

/// The admin token: the one in `path` when the store holds its hash; else a
/// new one, written to `path` (0600) with only its hash in the store.
/// Without a file, a new one each time, its hash not kept. Returns whether
/// an earlier token was replaced.
fn admin_token(
    store: &dyn Store,
    name: &str,
    path: Option<&Path>,
) -> Result<(AdminToken, bool), ServerError> {
    let Some(path) = path else {
        return Ok((AdminToken::generate(), false));
    };
    let kept = store.secret_hash(name)?;
    let on_file = match AdminToken::read_from(path) {
        Ok(token) => Some(token),
        Err(AdminTokenError::NotAToken { .. }) => None,
        Err(AdminTokenError::File(e)) if e.is_absent() => None,
        Err(AdminTokenError::File(e)) => return Err(ServerError::AdminTokenFile(e)),
        Err(other) => return Err(ServerError::AdminToken(other)),
    };
    if let (Some(hash), Some(token)) = (kept, &on_file)
        && token.hash() == hash
    {
        return Ok((token.clone(), false));
    }
    let token = match (kept, on_file) {
        (None, Some(token)) => token,
        _ => AdminToken::generate(),
    };
    token.write_to(path).map_err(ServerError::AdminTokenWrite)?;
    store.put_secret_hash(name, token.hash())?;
    Ok((token, kept.is_some()))
}

/// What `vessel.json` says: the process, its listeners' addresses and, when
/// it has them, its Unix sockets.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct AddressFile {
    /// The vessel's process id.
    pid: u32,
    /// The device listener.
    devices: SocketAddr,
    /// The admin API's TCP listener.
    admin: Option<SocketAddr>,
    /// The MCP listener.
    mcp: Option<SocketAddr>,
    /// The admin API's Unix socket.
    admin_socket: Option<PathBuf>,
    /// The MCP Unix socket.
    mcp_socket: Option<PathBuf>,
}

/// Writes `vessel.json` (0600, atomically): where this vessel listens, for
/// the person and their tools. dk's own commands do not trust it: they
/// reach the vessel through its sockets.
fn write_address(
    file: &Path,
    data_dir: &Path,
    sockets: bool,
    devices: SocketAddr,
    admin: Option<SocketAddr>,
    mcp: Option<SocketAddr>,
) -> Result<(), ServerError> {
    let absolute = |path: PathBuf| std::path::absolute(&path).unwrap_or(path);
    let socket = |name: &str| sockets.then(|| absolute(data_dir.join(name)));
    let address = AddressFile {
        pid: std::process::id(),
        devices,
        admin,
        mcp,
        admin_socket: socket(ADMIN_SOCKET),
        mcp_socket: socket(MCP_SOCKET),
    };
    let text = serde_json::to_string(&address).unwrap_or_default();
    write_private_file(file, text.as_bytes()).map_err(ServerError::AddressFile)
}
