//! The fleet's errors, each saying what failed and never a credential.

use std::path::{Path, PathBuf};

use dk_files::private::{PrivateFileError, read_private_file};

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

impl ConnectError {
    /// The error of a failed connection, in words an operator can act on.
    pub(crate) fn nats(error: &async_nats::ConnectError, tls: bool) -> ConnectError {
        use async_nats::ConnectErrorKind as Kind;
        let kind = error.kind();
        let words = match kind {
            Kind::Io if tls => format!(
                "{error}: the connection failed while TLS was required (`--fleet-ca-file`); \
                 check the servers speak TLS (`tls://`) and are reachable"
            ),
            Kind::Tls => format!("{error}: check the servers' certificate against the CA file"),
            Kind::TimedOut => format!("{error}: no server answered within 5 s"),
            Kind::Authentication | Kind::AuthorizationViolation => {
                format!("{error}: check the NATS user and password, or token, files")
            }
            _ => error.to_string(),
        };
        ConnectError::Nats(words)
    }
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
    /// No member of that id is present.
    #[error("no fleet member `{0}` is present")]
    NoSuchMember(MemberId),
    /// The member left or restarted before it answered (what was asked of
    /// its earlier run is not done by the new one).
    #[error("fleet member `{0}` left or restarted before it answered")]
    MemberGone(MemberId),
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
