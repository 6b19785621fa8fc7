//! Why a networked vessel did not start or did not stop cleanly
//! ([`ServerError`]).

use std::io;
use std::net::SocketAddr;

use dk_files::private::PrivateFileError;
use dk_http::AdminTokenError;
use dk_store::StoreError;

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
