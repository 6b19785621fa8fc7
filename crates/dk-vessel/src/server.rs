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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dk_core::config::VesselConfig;
use dk_core::reload::RuleFile;
use dk_core::{Limits, Vessel};
use dk_files::private::ensure_private_dir;
use dk_http::HttpLimits;
use dk_mcp::McpOptions;
use dk_policy::PolicySet;
use dk_store::entry as schema;
use dk_store::{AuditOptions, SqliteStore, Store, audit_head_file};
use tokio::net::TcpListener;

mod error;
mod files;
mod keys;
mod listen;
mod running;

pub use error::ServerError;
use files::ADMIN_TOKEN;
pub use files::{
    ADDRESS_FILE, ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET, McpListen, vessel_key_file,
};
use keys::*;
use listen::*;
pub use running::RunningVessel;
use running::*;

/// Opens the store of a vessel whose data directory is given.
pub type StoreOpener =
    Box<dyn FnOnce(&Path) -> Result<Arc<dyn Store>, ServerError> + Send + 'static>;

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
        let token_name = self.token_name();
        ensure_private_dir(&self.data_dir)?;
        // The sockets first: they tell whether another vessel runs here.
        let mut leftovers = Leftovers::default();
        let sockets = bind_unix_sockets(&self.data_dir, self.unix_sockets, &mut leftovers).await?;
        let store = open_store(self.store, &self.data_dir)?;
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
        let (listeners, metrics_addr) = bind_listeners(
            self.listen,
            self.admin_listen,
            &self.mcp_listen,
            self.metrics_listen,
        )
        .await?;
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
        let membership = join_fleet(&vessel, fleet, &served).await?;
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

    /// The name of the admin token's hash in the store: each member of a
    /// fleet keeps its own in the store they share.
    fn token_name(&self) -> String {
        #[cfg(feature = "fleet")]
        let token_name = self.fleet.as_ref().map_or_else(
            || ADMIN_TOKEN.to_owned(),
            |fleet| format!("{ADMIN_TOKEN}.{}", fleet.member()),
        );
        #[cfg(not(feature = "fleet"))]
        let token_name = ADMIN_TOKEN.to_owned();
        token_name
    }
}

/// The device, admin and MCP listeners bound, and `/metrics`'s when
/// asked for, with its address.
async fn bind_listeners(
    listen: SocketAddr,
    admin_listen: Option<SocketAddr>,
    mcp_listen: &McpListen,
    metrics_listen: Option<SocketAddr>,
) -> Result<(Listeners, Option<SocketAddr>), ServerError> {
    let mut listeners = Listeners::bind(listen, admin_listen, mcp_listen).await?;
    let metrics = match metrics_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let metrics_addr = metrics
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()
        .map_err(ServerError::LocalAddress)?;
    listeners.metrics = metrics;
    Ok((listeners, metrics_addr))
}

/// A member's place in its fleet taken, the registry then shared: a
/// member that cannot join stops what it serves.
#[cfg(feature = "fleet")]
async fn join_fleet(
    vessel: &Arc<Vessel>,
    fleet: Option<dk_fleet::Fleet>,
    served: &Served,
) -> Result<Option<crate::member::Membership>, ServerError> {
    let Some(fleet) = fleet else {
        return Ok(None);
    };
    vessel.registry().set_shared();
    match crate::member::Membership::start(vessel, fleet, served.stop.subscribe()).await {
        Ok(membership) => Ok(Some(membership)),
        Err(error) => {
            served.stop.send_replace(true);
            Err(ServerError::Fleet(error.to_string()))
        }
    }
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
