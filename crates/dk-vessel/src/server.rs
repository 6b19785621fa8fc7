//! [`VesselServer`]: a networked vessel in a few lines. It makes the data
//! directory private, binds the admin and MCP Unix sockets there (which
//! tells whether another vessel runs in it), opens the store, keeps the
//! admin token (its hash in the store, the token in a private file outside
//! the data directory), keeps the vessel's dk/2 static key (`vessel.key`,
//! 0600, made at the first start), binds the device, admin and MCP listeners, writes
//! the address file `vessel.json`, and serves every route until
//! [`RunningVessel::stop`]. The address file and the sockets are removed
//! when it stops.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dk_core::config::VesselConfig;
use dk_core::{Limits, Vessel};
use dk_http::{AdminToken, AdminTokenError, bind_private_socket};
use dk_mcp::McpOptions;
use dk_policy::PolicySet;
use dk_store::private::{
    PrivateFileError, ensure_private_dir, read_private_file, write_private_file,
};
use dk_store::{AuditOptions, SqliteStore, Store, StoreError, audit_head_file};
use serde_json::json;
use tokio::net::TcpListener;
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
/// The vessel's dk/2 static key in the data directory (the secret as 64
/// lower-case hex digits, mode 0600).
pub const VESSEL_KEY_FILE: &str = "vessel.key";
/// The name of the admin token's hash in the store.
const ADMIN_TOKEN: &str = "admin-token";

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
        "the vessel key file `{0}` does not hold a key: restore it, or move it away to make a new key (every dk/2 device must then forget the vessel and pair again)"
    )]
    NotAVesselKey(String),
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
    unix_sockets: bool,
    address_file: bool,
    admin_token_file: Option<PathBuf>,
    policies: PolicySet,
    config: VesselConfig,
    limits: Limits,
    mcp: McpOptions,
    store: Option<StoreOpener>,
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
            unix_sockets: true,
            address_file: true,
            admin_token_file: None,
            policies: PolicySet::empty(),
            config: VesselConfig::default(),
            limits: Limits::default(),
            mcp: McpOptions::default(),
            store: None,
        }
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

    /// The `device_use` rules in force at the start.
    pub fn policies(mut self, policies: PolicySet) -> VesselServer {
        self.policies = policies;
        self
    }

    /// The vessel configuration (streaming kinds, rate limits, run
    /// budgets), applied over the limits.
    pub fn config(mut self, config: VesselConfig) -> VesselServer {
        self.config = config;
        self
    }

    /// The limits, before the configuration is applied.
    pub fn limits(mut self, limits: Limits) -> VesselServer {
        self.limits = limits;
        self
    }

    /// The MCP route's options.
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
        let sockets = if self.unix_sockets {
            let admin_path = self.data_dir.join(ADMIN_SOCKET);
            let admin = bind_private_socket(&admin_path).await?;
            leftovers.0.push(admin_path);
            let mcp_path = self.data_dir.join(MCP_SOCKET);
            let mcp = bind_private_socket(&mcp_path).await?;
            leftovers.0.push(mcp_path);
            Some((admin, mcp))
        } else {
            None
        };
        let store = match self.store {
            Some(open) => open(&self.data_dir)?,
            None => {
                let audit = AuditOptions {
                    head_file: audit_head_file(&self.data_dir),
                    key: None,
                };
                let store = SqliteStore::open_with(&self.data_dir.join(DATABASE_FILE), audit)?;
                Arc::new(store) as Arc<dyn Store>
            }
        };
        let (token, replaced) = admin_token(store.as_ref(), self.admin_token_file.as_deref())?;
        let (identity, made_key) = vessel_key(&self.data_dir.join(VESSEL_KEY_FILE))?;
        let devices = bind(self.listen).await?;
        let admin = match self.admin_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let (mcp, mcp_unavailable) = match self.mcp_listen {
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
        let mut limits = self.limits;
        self.config.apply_to(&mut limits);
        let vessel = Vessel::open(store, self.policies, limits)?;
        let fingerprint = identity.public().fingerprint();
        vessel.set_identity(identity);
        if made_key {
            vessel.audit(
                "vessel-key",
                json!({"made": true, "fingerprint": fingerprint}),
            );
        }
        vessel.set_streaming(self.config.streaming.clone());
        vessel.add_secret(token.expose());
        if replaced {
            vessel.audit("admin-token", json!({"replaced": true}));
        }
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
                device_addr,
                admin_addr,
                mcp_addr,
            )?;
            leftovers.0.insert(0, file);
        }

        let (stop, stopped) = watch::channel(false);
        let until = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)> = Vec::new();
        let console = dk_http::Console::new();
        if let Some(mcp) = mcp_addr {
            let host = if mcp.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], mcp.port()))
            } else {
                mcp
            };
            console.set_mcp_url(format!("http://{host}/mcp"));
        }
        if let Some(addr) = admin_addr {
            console.set_address(addr);
        }
        if let Some(admin) = admin {
            let serve = dk_http::serve_admin(
                admin,
                Arc::clone(&vessel),
                token.clone(),
                Arc::clone(&console),
                until(stopped.clone()),
            );
            tasks.push(("admin API", tokio::spawn(serve)));
        }
        if let Some((admin_socket, mcp_socket)) = sockets {
            let serve = dk_http::serve_admin_unix(
                admin_socket,
                Arc::clone(&vessel),
                token.clone(),
                Arc::clone(&console),
                until(stopped.clone()),
            );
            tasks.push(("admin socket", tokio::spawn(serve)));
            let serve = dk_mcp::serve_mcp_unix(
                mcp_socket,
                Arc::clone(&vessel),
                Arc::clone(vessel.agents()),
                self.mcp,
                until(stopped.clone()),
            );
            tasks.push(("MCP socket", tokio::spawn(serve)));
        }
        let serve = dk_http::serve_devices(devices, Arc::clone(&vessel), until(stopped.clone()));
        tasks.push(("device route", tokio::spawn(serve)));
        if let Some(mcp) = mcp {
            let serve = dk_mcp::serve_mcp_with(
                mcp,
                Arc::clone(&vessel),
                Arc::clone(vessel.agents()),
                self.mcp,
                until(stopped.clone()),
            );
            tasks.push(("MCP route", tokio::spawn(serve)));
        }
        Ok(RunningVessel {
            vessel,
            console,
            token,
            token_replaced: replaced,
            device_addr,
            admin_addr,
            mcp_addr,
            mcp_unavailable,
            data_dir: self.data_dir,
            stop,
            tasks,
            leftovers,
        })
    }
}

/// A vessel [`VesselServer::start`] started: where it listens, its state,
/// and the way to stop it.
#[derive(Debug)]
pub struct RunningVessel {
    console: Arc<dk_http::Console>,
    vessel: Arc<Vessel>,
    token: AdminToken,
    token_replaced: bool,
    device_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    mcp_addr: Option<SocketAddr>,
    mcp_unavailable: Option<String>,
    data_dir: PathBuf,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)>,
    leftovers: Leftovers,
}

impl RunningVessel {
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

/// The vessel's static key kept in `path`, or a new one written there
/// (0600) when there is none; whether it was made now. A file that is not
/// private or holds no key is refused, never replaced: devices pinned the
/// key it holds.
fn vessel_key(path: &Path) -> Result<(dk_channel::StaticKey, bool), ServerError> {
    match read_private_file(path) {
        Ok(bytes) => {
            let shown = || path.display().to_string();
            let text =
                std::str::from_utf8(&bytes).map_err(|_| ServerError::NotAVesselKey(shown()))?;
            let secret = dk_channel::from_hex32(text.trim_end_matches('\n'))
                .ok_or_else(|| ServerError::NotAVesselKey(shown()))?;
            let key = dk_channel::StaticKey::from_secret(secret)
                .map_err(|_| ServerError::NotAVesselKey(shown()))?;
            Ok((key, false))
        }
        Err(e) if e.is_absent() => {
            let key = dk_channel::StaticKey::generate()
                .map_err(|e| ServerError::NoRandomness(e.to_string()))?;
            let text = format!("{}\n", dk_channel::to_hex32(key.secret()));
            write_private_file(path, text.as_bytes()).map_err(ServerError::VesselKey)?;
            Ok((key, true))
        }
        Err(e) => Err(ServerError::VesselKey(e)),
    }
}

/// The admin token: the one in `path` when the store holds its hash; else a
/// new one, written to `path` (0600) with only its hash in the store.
/// Without a file, a new one each time, its hash not kept. Returns whether
/// an earlier token was replaced.
fn admin_token(store: &dyn Store, path: Option<&Path>) -> Result<(AdminToken, bool), ServerError> {
    let Some(path) = path else {
        return Ok((AdminToken::generate(), false));
    };
    let kept = store.secret_hash(ADMIN_TOKEN)?;
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
    store.put_secret_hash(ADMIN_TOKEN, token.hash())?;
    Ok((token, kept.is_some()))
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
    let text = json!({
        "pid": std::process::id(),
        "devices": devices.to_string(),
        "admin": admin.map(|addr| addr.to_string()),
        "mcp": mcp.map(|addr| addr.to_string()),
        "adminSocket": socket(ADMIN_SOCKET),
        "mcpSocket": socket(MCP_SOCKET),
    })
    .to_string();
    write_private_file(file, text.as_bytes()).map_err(ServerError::AddressFile)
}
