//! The data directory's files and sockets by name, the vessel's key file
//! beside it, and where the MCP route listens.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
pub(super) const ADMIN_TOKEN: &str = "admin-token";
/// The name, in the store, of the SHA-256 of the vessel's public key: which
/// key this data directory's devices pinned.
pub(super) const VESSEL_KEY: &str = "vessel-key";

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
    /// an MCP listener and [`RunningVessel::mcp_unavailable`](crate::RunningVessel::mcp_unavailable) says why.
    IfFree(SocketAddr),
}
