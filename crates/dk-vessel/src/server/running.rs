//! [`RunningVessel`](crate::RunningVessel): a started vessel, what it listens on, and its stop.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dk_core::Vessel;
use dk_http::AdminToken;
use dk_store::entry as schema;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::error::ServerError;
use super::files::{ADMIN_SOCKET, MCP_SOCKET};

/// A vessel [`VesselServer::start`](crate::VesselServer::start) started: where it listens, its state,
/// and the way to stop it.
#[derive(Debug)]
pub struct RunningVessel {
    #[cfg(feature = "fleet")]
    pub(super) membership: Option<crate::member::Membership>,
    pub(super) console: Arc<dk_http::Console>,
    pub(super) vessel: Arc<Vessel>,
    pub(super) token: AdminToken,
    pub(super) token_replaced: bool,
    pub(super) key_file: PathBuf,
    pub(super) moved_key: Option<PathBuf>,
    pub(super) device_addr: SocketAddr,
    pub(super) admin_addr: Option<SocketAddr>,
    pub(super) mcp_addr: Option<SocketAddr>,
    pub(super) metrics_addr: Option<SocketAddr>,
    pub(super) mcp_unavailable: Option<String>,
    pub(super) data_dir: PathBuf,
    pub(super) stop: watch::Sender<bool>,
    pub(super) tasks: Vec<(&'static str, JoinHandle<io::Result<()>>)>,
    pub(super) leftovers: Leftovers,
}

impl RunningVessel {
    /// The vessel's place in its fleet, when it runs as a member
    /// ([`VesselServer::fleet`](crate::VesselServer::fleet)).
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
    /// ([`VesselServer::metrics_listen`](crate::VesselServer::metrics_listen)).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Why MCP has no TCP listener when [`McpListen::IfFree`](crate::McpListen::IfFree) found its
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

    /// A future that resolves once [`RunningVessel::stop`](crate::RunningVessel::stop) is called, for
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
pub(super) struct Leftovers(pub(super) Vec<PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}
