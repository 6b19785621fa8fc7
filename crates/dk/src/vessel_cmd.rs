//! `dk vessel`: run a vessel. Devices connect to its `/device` route, agents
//! to its `/mcp` route (on loopback, or through `dk mcp` on its MCP socket);
//! the person answers from the terminal prompt (when there is a terminal),
//! the admin API, or the `dk pairings` / `dk approvals` / `dk devices` /
//! `dk agents` commands, which reach it on its admin socket. Its files live
//! in dk's home (`home.rs`), where the other commands find them.

use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use clap::Args;
use dk_core::vessel::PlainV1;
use dk_files::private::{PrivateDir, PrivateFileError, ensure_private_dir};
use dk_fleet::{Auth, FleetOptions, MemberId};
use dk_mcp::McpOptions;
use dk_store::{DiskReserve, ReserveError, Store};
use dk_vessel::{
    Limits, McpListen, RunningVessel, ServerError, VesselServer,
    config::VesselConfig,
    reload::{FileStamp, Reloaded, RuleFile, load_rule_file, watch_policy_file},
};
use tokio::signal::unix::{SignalKind, signal};

use dk_http::notify::{NotifyFormat, NotifyTarget, notify_prompts};
use dk_http::readiness_failures;

use crate::home::Paths;
use crate::input::printable;
use crate::prompt;
use crate::systemd::Notifier;

/// Arguments of `dk vessel`.
#[derive(Args)]
pub struct VesselArgs {
    /// Where devices connect (the `/device` WebSocket route).
    #[arg(long, default_value = "127.0.0.1:7777")]
    pub listen: SocketAddr,
    /// Where the admin API listens; keep it on loopback.
    #[arg(long, default_value = "127.0.0.1:7778")]
    pub admin_listen: SocketAddr,
    /// Where agents connect over MCP (the `/mcp` route); keep it on
    /// loopback. [default: 127.0.0.1:7779; when that address is taken the
    /// vessel runs without MCP and says so]
    #[arg(long)]
    pub mcp_listen: Option<SocketAddr>,
    /// Also serve `/metrics` (Prometheus' text format) alone on this
    /// address, without the admin token, for a scraper that should not
    /// hold it. [default: only on the admin API, behind the token]
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// A device result whose JSON is longer than this many bytes reaches an
    /// agent in chunks, the rest through the `read_more` tool.
    #[arg(long, value_name = "BYTES", default_value_t = 16 * 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mcp_read_more_threshold: u64,
    /// The vessel's data directory (mode 0700): its database (pairings,
    /// token hashes, the audit log), its address file and its admin and MCP
    /// sockets. No token is ever kept there. [default: `vessel` in dk's
    /// home: $DK_HOME, else $XDG_DATA_HOME/dk, else ~/.local/share/dk]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Where the admin token is kept for the person's commands (mode 0600);
    /// outside the data directory, which holds only its hash. [default:
    /// `admin-token` in dk's home]
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Where the vessel's dk/2 secret key is kept (mode 0600, made at the
    /// first start), outside the data directory: devices pin its public
    /// half, so a copy of the data directory without it cannot pass for
    /// this vessel. Back it up apart from the data directory.
    /// [default: beside the data directory, `DIR.key`: `vessel.key` in
    /// dk's home]
    #[arg(long, value_name = "FILE")]
    pub vessel_key_file: Option<PathBuf>,
    /// Make a new vessel key although this data directory's devices pinned
    /// one whose file is missing (otherwise the start is refused). Every
    /// dk/2 device must then forget the vessel and pair again.
    #[arg(long)]
    pub new_vessel_key: bool,
    /// A `device_use` rule file; a broken file stops the vessel from starting.
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// A vessel configuration file (TOML, see docs/CONFIG.md): the streaming
    /// device kinds admitted and their caps, the agents' rate limits and run
    /// budget. A broken
    /// file stops the vessel from starting; without one no streaming kind is
    /// admitted.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Do not prompt on the terminal even when there is one.
    #[arg(long)]
    pub no_prompt: bool,
    /// `device:hello` frames one address may send per minute.
    #[arg(long, default_value_t = Limits::default().pairings_per_minute_per_address)]
    pub pairings_per_minute: u32,
    /// Pairing requests one address may have waiting for the person at once.
    #[arg(long, default_value_t = Limits::default().max_pending_pairings_per_address)]
    pub pending_pairings_per_address: usize,
    /// Where the audit log's head (`SEQ:HASH`) is kept, brought up to date
    /// as commits are made and checked at start and by `dk audit verify`;
    /// keep it outside the data directory. [default: beside the data
    /// directory, `DIR.audit-head`; not kept with `--store`]
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    pub audit_head_file: Option<PathBuf>,
    /// Key the audit chain with the key in this file (64 hex characters,
    /// mode 0600, made on first use): nobody without it can then write an
    /// entry that verifies. Keep it outside the data directory; `dk audit
    /// verify` needs it too.
    #[arg(long, value_name = "FILE")]
    pub audit_key_file: Option<PathBuf>,
    /// Keep pairings, agents and the audit log in the PostgreSQL database
    /// at this URL (`postgres://user:password@host:port/database`) instead
    /// of the data directory's SQLite file: vessels given the same URL
    /// share one store and one audit chain (docs/POSTGRES.md). Give it in
    /// the environment (`DK_STORE`) to keep a password off the command
    /// line; it is never printed.
    #[arg(long, value_name = "URL", env = "DK_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// Run as a member of a fleet of vessels that behave as one, joined
    /// through the NATS servers at these addresses (`nats://host:port` or
    /// `tls://host:port`, comma-separated): devices connected to any member
    /// are reached from every member, and prompts are shown and answered on
    /// all (docs/FLEET.md). Needs `--store postgres://...` and
    /// `--fleet-key`.
    #[arg(long, value_name = "ADDRS", value_delimiter = ',', requires_all = ["store", "fleet_key"])]
    pub fleet: Vec<String>,
    /// The fleet key: a vessel key file (mode 0600) every member holds.
    /// It is this vessel's dk/2 key, so devices pin one key for the whole
    /// fleet, and it seals every message between members: a member without
    /// it cannot join. Replaces `--vessel-key-file`.
    #[arg(
        long,
        value_name = "FILE",
        requires = "fleet",
        conflicts_with = "vessel_key_file"
    )]
    pub fleet_key: Option<PathBuf>,
    /// This member's name in the fleet (1 to 64 letters, digits, `-` or
    /// `_`), unique among the members. [default: `vessel-` and the device
    /// route's port]
    #[arg(long, value_name = "NAME", requires = "fleet")]
    pub fleet_member: Option<String>,
    /// Authenticate to NATS as this user, with `--fleet-password-file`.
    #[arg(long, value_name = "USER", requires_all = ["fleet", "fleet_password_file"])]
    pub fleet_user: Option<String>,
    /// The NATS user's password, in a file of mode 0600.
    #[arg(long, value_name = "FILE", requires = "fleet_user")]
    pub fleet_password_file: Option<PathBuf>,
    /// Authenticate to NATS with the token in this file (mode 0600).
    #[arg(
        long,
        value_name = "FILE",
        requires = "fleet",
        conflicts_with = "fleet_user"
    )]
    pub fleet_token_file: Option<PathBuf>,
    /// Require TLS to NATS, trusting the certificate authorities in this
    /// PEM file.
    #[arg(long, value_name = "FILE", requires = "fleet")]
    pub fleet_ca_file: Option<PathBuf>,
    /// Accept devices speaking plain 8DK v1 (in clear, with a bearer token)
    /// on any address, not only on loopback. Anyone who sees the traffic
    /// can then copy a device's token, and a relay can pair.
    #[arg(long, conflicts_with = "refuse_plain_v1")]
    pub allow_plain_v1: bool,
    /// Refuse plain 8DK v1 everywhere, loopback included (for a vessel
    /// behind a TCP-level proxy, which adds no header to tell it).
    #[arg(long)]
    pub refuse_plain_v1: bool,
    /// Let a device that says it has no screen pair from another machine,
    /// where nothing excludes a relay in the middle.
    #[arg(long)]
    pub allow_no_screen_off_loopback: bool,
    /// Notify this URL of every new pairing or approval (an ntfy topic such
    /// as `https://ntfy.sh/TOPIC`, or any webhook with `--notify-format
    /// json`). It carries only that something waits and the console's
    /// address: no name, input, code or login link. A failure is logged and
    /// never holds a prompt back. Given in the environment
    /// (`DK_NOTIFY_URL`), the topic stays out of the process list.
    #[arg(
        long,
        value_name = "URL",
        env = "DK_NOTIFY_URL",
        hide_env_values = true
    )]
    pub notify_url: Option<String>,
    /// The notification's shape: `ntfy` (text with Title and Click headers)
    /// or `json` (`{"event", "waiting", "console"}`).
    #[arg(long, value_enum, default_value = "ntfy", requires = "notify_url")]
    pub notify_format: NotifyShape,
}

/// The shapes of `--notify-format`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum NotifyShape {
    /// ntfy's: a text body, Title, Click and Tags headers.
    Ntfy,
    /// A JSON object.
    Json,
}

/// Where agents connect over MCP unless `--mcp-listen` says otherwise.
const DEFAULT_MCP_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7779);

/// The exit status of a start refused because the disk of the data
/// directory has no room for the store's reserve and the room to work in
/// (sysexits' `EX_TEMPFAIL`): the systemd unit names it in
/// `RestartPreventExitStatus=`, so a vessel on a disk still full is not
/// started again and again (docs/SERVICE.md).
pub const NO_ROOM_EXIT: u8 = 75;

/// Why `dk vessel` ended with an error.
enum Failed {
    /// Said as it is; exit status 1.
    Error(String),
    /// No room on the disk for the store ([`NO_ROOM_EXIT`]).
    NoRoom(String),
}

impl From<String> for Failed {
    fn from(error: String) -> Failed {
        Failed::Error(error)
    }
}

/// Runs the vessel until Ctrl-C or SIGTERM.
pub fn run(args: &VesselArgs) -> ExitCode {
    let paths = match Paths::resolve(args.data_dir.as_deref(), args.admin_token_file.as_deref()) {
        Ok(paths) => paths,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Taken before loading, so a change made meanwhile is reloaded.
    let loaded = args.policies.as_deref().map(FileStamp::of);
    let policies = match &args.policies {
        None => None,
        Some(path) => match load_rule_file(path) {
            Ok(file) => Some(file),
            Err(errors) => {
                eprintln!("error: the rule file `{}` is refused:", path.display());
                for error in errors.errors() {
                    eprintln!("  {}", printable(&error.to_string()));
                }
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args, &paths, policies, loaded)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed::Error(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(Failed::NoRoom(e)) => {
            eprintln!("error: {e} (exit status {NO_ROOM_EXIT})");
            ExitCode::from(NO_ROOM_EXIT)
        }
    }
}

async fn serve(
    args: &VesselArgs,
    paths: &Paths,
    policies: Option<RuleFile>,
    loaded: Option<FileStamp>,
) -> Result<(), Failed> {
    // Watched from the start, so a stop asked for at any moment is a clean
    // one that removes the vessel's files.
    let signals = StopSignals::watch()?;
    let manager = Notifier::from_env().map_err(|e| e.to_string())?;
    let notify = notify_target(args)?;
    let config = read_config(args)?;
    if let Some(home) = &paths.home {
        private_dir(home.root())?;
    }
    private_dir(&paths.data_dir)?;
    let reserve = match &args.store {
        None => Some(make_reserve(&paths.data_dir)?),
        Some(_) => None,
    };
    let rules = policies
        .as_ref()
        .map_or(0, |file| file.policies().rules().len());
    let started = std::time::Instant::now();
    let (running, audit_kept) = start_vessel(args, paths, policies, &config, reserve).await?;
    warn_about_start(&running);
    let interactive = !args.no_prompt && std::io::stdin().is_terminal();
    print_start_text(
        args,
        paths,
        &running,
        &StartFacts {
            rules,
            audit_kept,
            config: &config,
            notify: notify.as_ref(),
            started,
            interactive,
        },
    );
    let beside = Beside {
        loaded,
        notify,
        manager,
        interactive,
    };
    Ok(run_until_stopped(args, running, beside, signals).await?)
}

/// The SQLite store's reserve against a full disk, in the data directory
/// `data_dir`, made whole: a start without room for it (and room to work
/// in) is refused, saying where and how much to free.
fn make_reserve(data_dir: &Path) -> Result<DiskReserve, Failed> {
    let reserve = DiskReserve::of_data_dir(data_dir);
    match reserve.make() {
        Ok(()) => Ok(reserve),
        Err(error @ ReserveError::NoRoom { .. }) => Err(Failed::NoRoom(error.to_string())),
        Err(error) => Err(Failed::Error(error.to_string())),
    }
}

/// What runs beside the vessel until it stops.
struct Beside {
    /// The rule file's stamp when it was read, to watch it from.
    loaded: Option<FileStamp>,
    /// Where new prompts are posted.
    notify: Option<NotifyTarget>,
    /// The service manager, when one started the vessel.
    manager: Option<Notifier>,
    /// Whether the person is asked at this terminal.
    interactive: bool,
}

/// SIGINT and SIGTERM, either of which stops the vessel.
struct StopSignals {
    interrupts: tokio::signal::unix::Signal,
    terminations: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn watch() -> Result<StopSignals, String> {
        Ok(StopSignals {
            interrupts: signal(SignalKind::interrupt())
                .map_err(|e| format!("cannot watch SIGINT: {e}"))?,
            terminations: signal(SignalKind::terminate())
                .map_err(|e| format!("cannot watch SIGTERM: {e}"))?,
        })
    }

    /// Waits for the first of them.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupts.recv() => {}
            _ = self.terminations.recv() => {}
        }
    }
}

/// Where new prompts are posted (`--notify-url`), if anywhere.
fn notify_target(args: &VesselArgs) -> Result<Option<NotifyTarget>, String> {
    let Some(url) = &args.notify_url else {
        return Ok(None);
    };
    let format = match args.notify_format {
        NotifyShape::Ntfy => NotifyFormat::Ntfy,
        NotifyShape::Json => NotifyFormat::Json,
    };
    NotifyTarget::parse(url, format)
        .map(Some)
        .map_err(|e| format!("--notify-url: {e}"))
}

/// The configuration file (`--config`), read and checked whole; none is
/// the default configuration.
fn read_config(args: &VesselArgs) -> Result<VesselConfig, String> {
    let Some(path) = &args.config else {
        return Ok(VesselConfig::default());
    };
    dk_vessel::config::load(path).map_err(|e| {
        format!(
            "the configuration `{}` is refused: {}",
            path.display(),
            printable(&e.to_string())
        )
    })
}

/// The limits the flags set over the defaults.
fn limits_of(args: &VesselArgs) -> Limits {
    Limits {
        pairings_per_minute_per_address: args.pairings_per_minute,
        max_pending_pairings_per_address: args.pending_pairings_per_address,
        max_pending_pairings: Limits::default()
            .max_pending_pairings
            .max(args.pending_pairings_per_address),
        plain_v1: if args.allow_plain_v1 {
            PlainV1::Everywhere
        } else if args.refuse_plain_v1 {
            PlainV1::Never
        } else {
            PlainV1::Loopback
        },
        no_screen_off_loopback: args.allow_no_screen_off_loopback,
        ..Limits::default()
    }
}

/// Starts the networked vessel with its SQLite store (keeping `reserve`
/// against a full disk) or its PostgreSQL one; returns it and what the
/// store says of its audit log (for the start text).
async fn start_vessel(
    args: &VesselArgs,
    paths: &Paths,
    policies: Option<RuleFile>,
    config: &VesselConfig,
    reserve: Option<DiskReserve>,
) -> Result<(RunningVessel, String), String> {
    let audit_kept = Arc::new(Mutex::new(String::new()));
    let said = Arc::clone(&audit_kept);
    let head_file = args.audit_head_file.clone();
    let key_file = args.audit_key_file.clone();
    let store_url = args.store.clone();
    let mut server = VesselServer::new(&paths.data_dir);
    // A member's dk/2 key is the fleet's: devices pin one key for all.
    if let Some(file) = args.fleet_key.as_ref().or(args.vessel_key_file.as_ref()) {
        server = server.vessel_key_file(file);
    }
    if let Some(options) = fleet_options(args)? {
        server = server.fleet(options);
    }
    if args.new_vessel_key {
        server = server.new_vessel_key();
    }
    if let Some(file) = policies {
        server = server.rule_file(file);
    }
    let running = server
        .listen(args.listen)
        .admin_listen(Some(args.admin_listen))
        .metrics_listen(args.metrics_listen)
        .mcp_listen(match args.mcp_listen {
            Some(addr) => McpListen::At(addr),
            None => McpListen::IfFree(DEFAULT_MCP_LISTEN),
        })
        .admin_token_file(&paths.admin_token_file)
        .config(config.clone())
        .limits(limits_of(args))
        .mcp_options(McpOptions {
            read_more_threshold: usize::try_from(args.mcp_read_more_threshold)
                .unwrap_or(usize::MAX),
            ..McpOptions::default()
        })
        .store_with(move |data_dir| {
            if let Some(url) = &store_url {
                let (store, kept) =
                    crate::audit_cmd::open_vessel_pg(url, data_dir, key_file.as_deref())
                        .map_err(ServerError::StoreRefused)?;
                *said.lock().unwrap_or_else(PoisonError::into_inner) = kept;
                return Ok(Arc::new(store) as Arc<dyn Store>);
            }
            let (store, kept) = crate::audit_cmd::open_vessel_store(
                data_dir,
                head_file.as_deref(),
                key_file.as_deref(),
            )
            .map_err(ServerError::StoreRefused)?;
            let store = match reserve {
                Some(reserve) => store.with_reserve(reserve),
                None => store,
            };
            *said.lock().unwrap_or_else(PoisonError::into_inner) = kept;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
        .start()
        .await
        .map_err(|e| match e {
            ServerError::AdminTokenFile(e) => {
                let advice = match e {
                    PrivateFileError::Exposed { .. } => {
                        "remove it and start the vessel again to make a new token"
                    }
                    _ => "remove it, or name another file with --admin-token-file",
                };
                format!("the admin token file is refused: {e}; {advice}")
            }
            other => other.to_string(),
        })?;
    let audit_kept = audit_kept
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok((running, audit_kept))
}

/// The fleet `args` name, if any: its NATS servers, this member's name,
/// the fleet key (which is also the vessel's key) and NATS credentials.
fn fleet_options(args: &VesselArgs) -> Result<Option<FleetOptions>, String> {
    let Some(key) = &args.fleet_key else {
        return Ok(None);
    };
    let member = args
        .fleet_member
        .clone()
        .unwrap_or_else(|| format!("vessel-{}", args.listen.port()));
    let member = MemberId::new(&member).map_err(|e| format!("--fleet-member: {e}"))?;
    let mut options = FleetOptions::new(args.fleet.iter().cloned(), member, key);
    if let (Some(user), Some(password_file)) = (&args.fleet_user, &args.fleet_password_file) {
        options = options.auth(Auth::UserPassword {
            user: user.clone(),
            password_file: password_file.clone(),
        });
    }
    if let Some(token_file) = &args.fleet_token_file {
        options = options.auth(Auth::TokenFile(token_file.clone()));
    }
    if let Some(ca) = &args.fleet_ca_file {
        options = options.tls_ca_file(ca);
    }
    Ok(Some(options))
}

/// Notes on stderr about how the vessel started: its key moved out of the
/// data directory, MCP left without a loopback listener.
fn warn_about_start(running: &RunningVessel) {
    let json = crate::logging::json();
    if let Some(old) = running.vessel_key_moved_from() {
        let (old, new) = (old.display(), running.vessel_key_file().display());
        if json {
            tracing::warn!(from = %old, to = %new, "moved the vessel's secret key out of the data directory (0600); back the key up apart from it (docs/STORAGE.md)");
        } else {
            eprintln!(
                "note: moved the vessel's secret key from `{old}` to `{new}` (0600): the data directory now holds no secret, so a copy of it cannot pass for this vessel; back the key up apart from it (docs/STORAGE.md)"
            );
        }
    }
    if let Some(reason) = running.mcp_unavailable() {
        if json {
            tracing::warn!(reason = %reason, "agents cannot connect over MCP (choose an address with --mcp-listen)");
        } else {
            eprintln!(
                "warning: agents cannot connect over MCP: {reason} (choose an address with --mcp-listen)"
            );
        }
    }
}

/// What the start text says beyond the running vessel itself.
struct StartFacts<'a> {
    /// How many rules the rule file holds.
    rules: usize,
    /// What the store says of its audit log.
    audit_kept: String,
    config: &'a VesselConfig,
    notify: Option<&'a NotifyTarget>,
    /// When the start began, for "loaded in".
    started: std::time::Instant,
    /// Whether the person is asked at this terminal.
    interactive: bool,
}

/// The start text on stdout: where everything is and how to reach it.
fn print_start_text(
    args: &VesselArgs,
    paths: &Paths,
    running: &RunningVessel,
    facts: &StartFacts<'_>,
) {
    let vessel = running.vessel();
    let paired = vessel.registry().count();
    println!("dk vessel");
    if let Some(home) = &paths.home {
        println!(
            "  home                 {} ({})",
            home.root().display(),
            home.found_through()
        );
    }
    println!("  data directory       {}", paths.data_dir.display());
    println!(
        "  devices connect to   ws://{}/device",
        running.device_addr()
    );
    let plain = match vessel.limits().plain_v1 {
        PlainV1::Loopback => "plain v1 on loopback only",
        PlainV1::Never => "plain v1 refused everywhere",
        PlainV1::Everywhere => "plain v1 ALSO ACCEPTED OFF LOOPBACK (--allow-plain-v1)",
    };
    println!("  device channel       dk/2, encrypted; {plain}");
    println!(
        "  vessel fingerprint   {}   <- devices show it after pairing",
        running.fingerprint()
    );
    println!(
        "  vessel key           {} (secret: keep it off copies of the data directory)",
        running.vessel_key_file().display()
    );
    let admin_addr = running
        .admin_addr()
        .map_or_else(String::new, |addr| format!(" and http://{addr}"));
    println!(
        "  admin API on         {}{admin_addr} (token in {})",
        running.admin_socket().display(),
        paths.admin_token_file.display()
    );
    if let Some(addr) = running.metrics_addr() {
        println!("  metrics on           http://{addr}/metrics (no token: /metrics only)");
    }
    // A login link signs in as the person: printed only to a terminal,
    // never into a log or a journal.
    let to_terminal = std::io::stdout().is_terminal();
    match (running.console().login_link(), running.console().url()) {
        (Some(link), _) if to_terminal => println!(
            "  console              {link}\n                       (signs you in once, within 15 minutes; `dk console` prints a fresh link)"
        ),
        (_, Some(url)) => {
            println!("  console              {url} (sign in with the link `dk console` prints)")
        }
        _ => println!("  console              none (the admin API has no TCP listener)"),
    }
    if let Some(target) = facts.notify {
        println!(
            "  notifications        {} on every new prompt",
            target.shown()
        );
    }
    let over_http = match running.mcp_addr() {
        Some(addr) => format!(" or http://{addr}/mcp"),
        None => " (no MCP listener on loopback)".to_owned(),
    };
    println!(
        "  agents connect to    `dk mcp` (through {}){over_http} ({} agents; `dk agents add NAME` adds one)",
        running.mcp_socket().display(),
        vessel.agents().list().len()
    );
    println!("  audit log            {}", facts.audit_kept);
    let rules = facts.rules;
    match &args.policies {
        Some(path) => println!(
            "  device_use rules     {rules} from {} (reloaded when it changes, on SIGHUP and by `dk policy reload`)",
            path.display()
        ),
        None => println!("  device_use rules     {rules}"),
    }
    println!("  streaming kinds      {}", streaming_summary(facts.config));
    if let Some(fleet) = vessel.fleet_status() {
        let others: Vec<&str> = fleet.members.iter().map(|m| m.member.as_str()).collect();
        println!(
            "  fleet member         {} (run {}), NATS {}; {} other member(s) heard: {}",
            fleet.member,
            fleet.incarnation,
            if fleet.connected { "up" } else { "DOWN" },
            others.len(),
            if others.is_empty() {
                "none yet".to_owned()
            } else {
                others.join(", ")
            }
        );
    }
    println!(
        "  paired devices       {paired} (loaded in {} ms)",
        facts.started.elapsed().as_millis()
    );
    if facts.interactive {
        println!("  pairing requests and approvals will be asked here; Ctrl-C stops the vessel");
    } else {
        println!("  answer pairing requests with `dk pairings`, approvals with `dk approvals`");
    }
    println!("  {}", how_others_find_it(args, paths));
}

/// Serves until SIGINT or SIGTERM: the terminal prompt, the rule file's
/// watch, the notifications and the service manager's messages run beside
/// the vessel and end with it.
async fn run_until_stopped(
    args: &VesselArgs,
    running: RunningVessel,
    beside: Beside,
    mut signals: StopSignals,
) -> Result<(), String> {
    let Beside {
        loaded,
        notify,
        manager,
        interactive,
    } = beside;
    let vessel = Arc::clone(running.vessel());
    let (reload_stops, prompt_stops) = (running.stopping(), running.stopping());
    let reload_task = async {
        let (Some(path), Some(loaded)) = (args.policies.clone(), loaded) else {
            return;
        };
        watch_policy_file(
            Arc::clone(&vessel),
            path,
            loaded,
            std::time::Duration::from_secs(1),
            hangups(),
            report_reload,
            reload_stops,
        )
        .await;
    };
    let prompt_task = async {
        if interactive {
            prompt::run(Arc::clone(&vessel), prompt_stops).await;
        }
    };
    let notify_stops = running.stopping();
    let console_url = running.console().url();
    let notify_task = async {
        if let Some(target) = notify {
            notify_prompts(Arc::clone(&vessel), target, console_url, notify_stops).await;
        }
    };
    let manager_stops = running.stopping();
    let devices = running.device_addr();
    let manager_task = async {
        if let Some(manager) = &manager {
            tell_the_manager(&vessel, manager, devices, manager_stops).await;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async {
        signals.recv().await;
        if let Some(manager) = &manager {
            manager.stopping();
        }
        println!("\nstopping: closing device connections");
        let _ = stop_tx.send(());
    };
    // The vessel stops on a signal; the prompt and the rule-file watch end
    // with it.
    let stop = async {
        let _ = stop_rx.await;
        running.stop().await
    };
    let ((), (), (), (), (), stopped) = tokio::join!(
        prompt_task,
        reload_task,
        notify_task,
        manager_task,
        signal,
        stop
    );
    stopped.map_err(|e| e.to_string())
}

/// How often the readiness checks run before the vessel first passes them.
const READY_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Tells the service manager `READY=1` once the vessel passes the checks
/// `/readyz` makes (the store takes a write, the audit writer keeps up, the
/// device listener accepts), then, when it has a watchdog, pings it at half
/// its period while those checks pass (saying which fail otherwise, so a
/// vessel stuck that way is restarted), until `stops`.
async fn tell_the_manager(
    vessel: &Arc<dk_vessel::Vessel>,
    manager: &Notifier,
    devices: SocketAddr,
    stops: impl Future<Output = ()>,
) {
    let serving = format!("ready: devices connect to ws://{devices}/device");
    let tell = async {
        while !readiness_failures(vessel).is_empty() {
            tokio::time::sleep(READY_POLL).await;
        }
        manager.ready(&serving);
        let Some(every) = manager.ping_every() else {
            return std::future::pending().await;
        };
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_ready = true;
        loop {
            ticks.tick().await;
            let failing = readiness_failures(vessel);
            if failing.is_empty() {
                if !was_ready {
                    manager.status(&serving);
                }
                manager.ping();
            } else {
                let names: Vec<String> = failing.iter().map(ToString::to_string).collect();
                manager.status(&format!("not ready: {}", names.join(", ")));
            }
            was_ready = failing.is_empty();
        }
    };
    tokio::select! {
        () = tell => {}
        () = stops => {}
    }
}

/// Tells the terminal what a reload of the rule file did.
fn report_reload(outcome: &Reloaded) {
    match outcome {
        Reloaded::Applied { rules, sha256 } => {
            println!("[rules] reloaded: {rules} rules in force (sha256 {sha256})");
        }
        Reloaded::Unchanged => {}
        Reloaded::Refused { errors } => {
            eprintln!("[rules] REFUSED the changed rule file; the previous rules stay in force:");
            for line in errors.lines() {
                eprintln!("[rules]   {}", printable(line));
            }
        }
    }
}

/// Makes `dir` private (0700), or checks it is: another user's is refused,
/// one of ours that others could enter is tightened, and the person told.
fn private_dir(dir: &Path) -> Result<(), String> {
    match ensure_private_dir(dir).map_err(|e| e.to_string())? {
        PrivateDir::Tightened { was } => eprintln!(
            "note: `{}` had mode {was:04o}; it is now 0700 (only you may enter it)",
            dir.display()
        ),
        PrivateDir::Created | PrivateDir::Kept => {}
    }
    Ok(())
}

/// How the person's other commands find this vessel, for the start text.
fn how_others_find_it(args: &VesselArgs, paths: &Paths) -> String {
    let mut flags = Vec::new();
    if let Some(dir) = &args.data_dir {
        flags.push(format!("--data-dir {}", dir.display()));
    }
    if let Some(file) = &args.admin_token_file {
        flags.push(format!("--admin-token-file {}", file.display()));
    }
    let commands = "`dk pairings`, `dk approvals`, `dk devices`, `dk agents`, `dk audit` and `dk mcp` find this vessel";
    match (paths.home.is_some(), flags.is_empty()) {
        (true, true) => format!(
            "{commands} through DK_HOME, or the default home when DK_HOME is unset, from any directory"
        ),
        (true, false) => format!(
            "{commands} when given {} (and the same DK_HOME)",
            flags.join(" ")
        ),
        (false, _) => format!("{commands} when given {}", flags.join(" ")),
    }
}

/// SIGHUP as a stream of reload requests.
fn hangups() -> Hangups {
    Hangups(tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok())
}

/// Yields once per SIGHUP; never, when the signal could not be watched.
struct Hangups(Option<tokio::signal::unix::Signal>);

impl futures::Stream for Hangups {
    type Item = ();
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<()>> {
        match self.0.as_mut() {
            Some(signal) => signal.poll_recv(cx),
            None => std::task::Poll::Pending,
        }
    }
}

/// The streaming kinds a configuration admits, for the start-up summary.
fn streaming_summary(config: &VesselConfig) -> String {
    let admitted: Vec<String> = dk_policy::DeviceClass::ALL
        .into_iter()
        .filter_map(|kind| config.streaming.configured(kind))
        .filter(|policy| policy.enabled())
        .map(|policy| {
            format!(
                "{} (chunks up to {} bytes, {} per device)",
                policy.kind(),
                policy.max_chunk_bytes(),
                policy.max_concurrent_sessions()
            )
        })
        .collect();
    if admitted.is_empty() {
        "none (--config admits voice or desktop-control)".to_owned()
    } else {
        admitted.join(", ")
    }
}
