//! `dk vessel`: run a vessel. Devices connect to its `/device` route, agents
//! to its `/mcp` route; the person answers from the terminal prompt (when
//! there is a terminal), the admin API, or the `dk pairings` /
//! `dk approvals` / `dk devices` / `dk agents` commands.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use dk_policy::PolicySet;
use dk_vessel::{
    AdminToken, FileStamp, Limits, McpOptions, Reloaded, Store, Vessel, VesselConfig, serve_admin,
    serve_devices, serve_mcp_with, watch_policy_file,
};
use serde_json::json;
use tokio::net::TcpListener;

use crate::input::printable;
use crate::prompt;

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
    /// A device result whose JSON is longer than this many bytes reaches an
    /// agent in chunks, the rest through the `read_more` tool.
    #[arg(long, value_name = "BYTES", default_value_t = 16 * 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mcp_read_more_threshold: u64,
    /// The vessel's data directory: its database (pairings, token hashes,
    /// the audit log) and its address file. No token is ever kept there.
    #[arg(long, default_value = ".dk/vessel")]
    pub data_dir: PathBuf,
    /// Where the admin token is kept for the person's commands (mode 0600);
    /// outside the data directory, which holds only its hash.
    #[arg(long, default_value = ".dk/admin-token")]
    pub admin_token_file: PathBuf,
    /// A `device_use` rule file; a broken file stops the vessel from starting.
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// A vessel configuration file (TOML, see docs/CONFIG.md): the streaming
    /// device kinds admitted and their caps, the agents' run budget. A broken
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
    /// directory, `DIR.audit-head`]
    #[arg(long, value_name = "FILE")]
    pub audit_head_file: Option<PathBuf>,
    /// Key the audit chain with the key in this file (64 hex characters,
    /// mode 0600, made on first use): nobody without it can then write an
    /// entry that verifies. Keep it outside the data directory; `dk audit
    /// verify` needs it too.
    #[arg(long, value_name = "FILE")]
    pub audit_key_file: Option<PathBuf>,
}

/// Where a running vessel says its admin API is.
pub const ADDRESS_FILE: &str = "vessel.json";
/// The vessel's database in its data directory.
pub const DATABASE_FILE: &str = "vessel.db";
/// Where agents connect over MCP unless `--mcp-listen` says otherwise.
const DEFAULT_MCP_LISTEN: &str = "127.0.0.1:7779";
/// The name of the admin token's hash in the store.
const ADMIN_TOKEN: &str = "admin-token";

/// Runs the vessel until Ctrl-C.
pub fn run(args: &VesselArgs) -> ExitCode {
    // Taken before loading, so a change made meanwhile is reloaded.
    let loaded = args.policies.as_deref().map(FileStamp::of);
    let policies = match &args.policies {
        None => PolicySet::empty(),
        Some(path) => match PolicySet::load(path) {
            Ok(set) => set,
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
    match runtime.block_on(serve(args, policies, loaded)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    args: &VesselArgs,
    policies: PolicySet,
    loaded: Option<FileStamp>,
) -> Result<(), String> {
    let config = match &args.config {
        None => VesselConfig::default(),
        Some(path) => VesselConfig::load(path).map_err(|e| {
            format!(
                "the configuration `{}` is refused: {}",
                path.display(),
                printable(&e.to_string())
            )
        })?,
    };
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| format!("data directory `{}`: {e}", args.data_dir.display()))?;
    let (store, audit_kept) = crate::audit_cmd::open_vessel_store(
        &args.data_dir,
        args.audit_head_file.as_deref(),
        args.audit_key_file.as_deref(),
    )?;
    let store: Arc<dyn Store> = Arc::new(store);
    let token_path = args.admin_token_file.clone();
    let (token, replaced) = admin_token(store.as_ref(), &token_path)?;
    let devices = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let admin = TcpListener::bind(args.admin_listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.admin_listen))?;
    let mcp = match args.mcp_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?,
        ),
        None => match TcpListener::bind(DEFAULT_MCP_LISTEN).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                eprintln!(
                    "warning: agents cannot connect over MCP: cannot listen on {DEFAULT_MCP_LISTEN}: {e} (choose an address with --mcp-listen)"
                );
                None
            }
        },
    };
    let device_addr = devices.local_addr().map_err(|e| e.to_string())?;
    let admin_addr = admin.local_addr().map_err(|e| e.to_string())?;
    let mcp_addr = mcp
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()
        .map_err(|e| e.to_string())?;
    write_address(&args.data_dir, device_addr, admin_addr, mcp_addr)?;

    let rules = policies.rules().len();
    let started = std::time::Instant::now();
    let mut limits = Limits {
        pairings_per_minute_per_address: args.pairings_per_minute,
        max_pending_pairings_per_address: args.pending_pairings_per_address,
        max_pending_pairings: Limits::default()
            .max_pending_pairings
            .max(args.pending_pairings_per_address),
        ..Limits::default()
    };
    config.apply_to(&mut limits);
    let vessel = Vessel::open(Arc::clone(&store), policies, limits).map_err(|e| e.to_string())?;
    vessel.set_streaming(config.streaming.clone());
    vessel.add_secret(token.expose());
    if replaced {
        vessel.audit("admin-token", json!({"replaced": true}));
    }
    let paired = vessel.registry().list().len();
    println!("dk vessel");
    println!("  devices connect to   ws://{device_addr}/device");
    println!(
        "  admin API on         http://{admin_addr} (token in {})",
        token_path.display()
    );
    match mcp_addr {
        Some(addr) => println!(
            "  agents connect to    http://{addr}/mcp ({} agents; `dk agents add NAME` adds one)",
            vessel.agents().list().len()
        ),
        None => println!("  agents connect to    nowhere (no MCP listener)"),
    }
    println!("  audit log            {audit_kept}");
    println!("  device_use rules     {rules}");
    println!("  streaming kinds      {}", streaming_summary(&config));
    println!(
        "  paired devices       {paired} (loaded in {} ms)",
        started.elapsed().as_millis()
    );
    let interactive = !args.no_prompt && std::io::stdin().is_terminal();
    if interactive {
        println!("  pairing requests and approvals will be asked here; Ctrl-C stops the vessel");
    } else {
        println!("  answer pairing requests with `dk pairings`, approvals with `dk approvals`");
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let admin_task = serve_admin(admin, Arc::clone(&vessel), token, stopped(stop_rx.clone()));
    let device_task = serve_devices(devices, Arc::clone(&vessel), stopped(stop_rx.clone()));
    let mcp_task = async {
        match mcp {
            Some(listener) => {
                serve_mcp_with(
                    listener,
                    Arc::clone(&vessel),
                    Arc::clone(vessel.agents()),
                    McpOptions {
                        read_more_threshold: usize::try_from(args.mcp_read_more_threshold)
                            .unwrap_or(usize::MAX),
                        ..McpOptions::default()
                    },
                    stopped(stop_rx.clone()),
                )
                .await
            }
            None => Ok(()),
        }
    };
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
            |outcome| match outcome {
                Reloaded::Applied { rules } => {
                    println!("[rules] reloaded: {rules} rules in force");
                    vessel.audit("policy", json!({"reloaded": true, "rules": rules}));
                }
                Reloaded::Refused { errors } => {
                    vessel.audit("policy", json!({"reloaded": false, "errors": errors}));
                    eprintln!(
                        "[rules] REFUSED the changed rule file; the previous rules stay in force:"
                    );
                    for line in errors.lines() {
                        eprintln!("[rules]   {}", printable(line));
                    }
                }
            },
            stopped(stop_rx.clone()),
        )
        .await;
    };
    let prompt_task = async {
        if interactive {
            prompt::run(Arc::clone(&vessel), stopped(stop_rx.clone())).await;
        }
    };
    let signal = async {
        let _ = tokio::signal::ctrl_c().await;
        println!("\nstopping: closing device connections");
        stop_tx.send_replace(true);
    };
    let (admin_result, device_result, mcp_result, (), (), ()) = tokio::join!(
        admin_task,
        device_task,
        mcp_task,
        prompt_task,
        reload_task,
        signal
    );
    let _ = std::fs::remove_file(args.data_dir.join(ADDRESS_FILE));
    vessel
        .flush_audit()
        .map_err(|e| format!("audit log: {e}"))?;
    admin_result.map_err(|e| format!("admin API: {e}"))?;
    device_result.map_err(|e| format!("device route: {e}"))?;
    mcp_result.map_err(|e| format!("MCP route: {e}"))?;
    Ok(())
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

/// The admin token: the one in `path` when the store holds its hash; else a
/// new one, written to `path` (0600) with only its hash in the store. Returns
/// whether an earlier token was replaced.
fn admin_token(store: &dyn Store, path: &Path) -> Result<(AdminToken, bool), String> {
    let kept = store.secret_hash(ADMIN_TOKEN).map_err(|e| e.to_string())?;
    let on_file = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| AdminToken::parse(&t));
    if let (Some(hash), Some(token)) = (kept, &on_file)
        && token.hash() == hash
    {
        return Ok((token.clone(), false));
    }
    let token = match (kept, on_file) {
        (None, Some(token)) => token,
        _ => AdminToken::generate(),
    };
    token
        .write_to(path)
        .map_err(|e| format!("admin token `{}`: {e}", path.display()))?;
    store
        .put_secret_hash(ADMIN_TOKEN, token.hash())
        .map_err(|e| e.to_string())?;
    Ok((token, kept.is_some()))
}

fn write_address(
    data_dir: &Path,
    devices: SocketAddr,
    admin: SocketAddr,
    mcp: Option<SocketAddr>,
) -> Result<(), String> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("data directory `{}`: {e}", data_dir.display()))?;
    let text = json!({
        "devices": devices.to_string(),
        "admin": admin.to_string(),
        "mcp": mcp.map(|addr| addr.to_string()),
    })
    .to_string();
    std::fs::write(data_dir.join(ADDRESS_FILE), text).map_err(|e| format!("address file: {e}"))
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
