//! A started vessel's listeners: bound (TCP, and Unix sockets in the data
//! directory), served each on its task, and named in the address file.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dk_core::Vessel;
use dk_files::private::write_private_file;
use dk_http::{AdminToken, HttpLimits, bind_private_socket};
use dk_mcp::McpOptions;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error::ServerError;
use super::files::{ADMIN_SOCKET, MCP_SOCKET, McpListen};
use super::running::Leftovers;

/// The admin and MCP Unix sockets in `data_dir`, when the vessel has them;
/// each noted in `leftovers` once bound.
pub(super) async fn bind_unix_sockets(
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

/// The TCP listeners, bound, and their addresses.
pub(super) struct Listeners {
    pub(super) devices: TcpListener,
    pub(super) admin: Option<TcpListener>,
    pub(super) mcp: Option<TcpListener>,
    /// `/metrics` alone, when it has a listener of its own.
    pub(super) metrics: Option<TcpListener>,
    /// Why MCP has no listener, when it was to take a busy address.
    pub(super) mcp_unavailable: Option<String>,
    pub(super) device_addr: SocketAddr,
    pub(super) admin_addr: Option<SocketAddr>,
    pub(super) mcp_addr: Option<SocketAddr>,
}

impl Listeners {
    pub(super) async fn bind(
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

/// What serving every route started: the console, the stop signal and the
/// tasks that serve.
pub(super) struct Served {
    pub(super) console: Arc<dk_http::Console>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)>,
}

/// Starts a task for every listener (admin API, the Unix sockets, devices,
/// MCP), each ending when the stop signal is sent.
pub(super) fn serve_all(
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

pub(super) async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

/// What `vessel.json` says: the process, its listeners' addresses and, when
/// it has them, its Unix sockets.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AddressFile {
    /// The vessel's process id.
    pub(super) pid: u32,
    /// The device listener.
    pub(super) devices: SocketAddr,
    /// The admin API's TCP listener.
    pub(super) admin: Option<SocketAddr>,
    /// The MCP listener.
    pub(super) mcp: Option<SocketAddr>,
    /// The admin API's Unix socket.
    pub(super) admin_socket: Option<PathBuf>,
    /// The MCP Unix socket.
    pub(super) mcp_socket: Option<PathBuf>,
}

/// Writes `vessel.json` (0600, atomically): where this vessel listens, for
/// the person and their tools. dk's own commands do not trust it: they
/// reach the vessel through its sockets.
pub(super) fn write_address(
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
