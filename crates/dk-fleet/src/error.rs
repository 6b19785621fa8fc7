//! The fleet's errors, each saying what failed and never a credential.

use std::path::{Path, PathBuf};

use dk_store::private::{PrivateFileError, read_private_file};

use crate::key::KeyError;
use crate::member::MemberId;

/// Why a member could not join the fleet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The fleet key file is missing, exposed or not a key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A credential file is missing, exposed or unreadable.
    #[error("NATS credential: {0}")]
    Credential(PrivateFileError),
    /// A credential file is empty or not text.
    #[error("NATS credential: `{}` holds no credential", .0.display())]
    EmptyCredential(PathBuf),
    /// A server address carries credentials (they belong in files).
    #[error("a NATS server address carries credentials: give them in a file instead")]
    CredentialsInAddress,
    /// A server address does not parse.
    #[error("`{0}` is not a NATS server address")]
    BadAddress(String),
    /// No server address was given.
    #[error("no NATS server address given")]
    NoServers,
    /// The servers refused or could not be reached.
    #[error("NATS: {0}")]
    Nats(String),
}

/// Why a fleet operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// The connection to NATS is down.
    #[error("the fleet's NATS connection is down")]
    NatsDown,
    /// The message would exceed the size limit.
    #[error("fleet message too large")]
    TooLarge,
}

/// Why a routed request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No member of that id listens.
    #[error("no fleet member `{0}` answers")]
    NoSuchMember(MemberId),
    /// The deadline passed before a reply came.
    #[error("the fleet request's deadline passed")]
    DeadlinePassed,
    /// The connection to NATS is down.
    #[error("the fleet's NATS connection is down")]
    NatsDown,
    /// A reply came that was not sealed by the member asked.
    #[error("the fleet reply was not sealed by the member asked")]
    Refused,
    /// The request would exceed the size limit.
    #[error("fleet request too large")]
    TooLarge,
}

/// A credential read from a private file, its final newline dropped.
pub(crate) fn read_secret(path: &Path) -> Result<String, ConnectError> {
    let bytes = read_private_file(path).map_err(ConnectError::Credential)?;
    let text =
        String::from_utf8(bytes).map_err(|_| ConnectError::EmptyCredential(path.to_owned()))?;
    let text = text.trim_end_matches(['\n', '\r']).to_owned();
    if text.is_empty() {
        return Err(ConnectError::EmptyCredential(path.to_owned()));
    }
    Ok(text)
}
