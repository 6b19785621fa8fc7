//! `FleetOptions`: where the NATS servers are, how to authenticate to
//! them, who this member is and where its fleet key lies. Credentials are
//! read from private files, never taken on a command line, and never
//! shown by `Debug`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::member::MemberId;

/// How a member authenticates to the NATS servers.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Auth {
    /// No credentials (a server open to anyone who reaches it).
    None,
    /// A user name, and the password in a private file (0600, ours).
    UserPassword {
        /// The NATS user.
        user: String,
        /// The file holding the password (a final newline is dropped).
        password_file: PathBuf,
    },
    /// A token in a private file (0600, ours).
    TokenFile(PathBuf),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::UserPassword {
                user,
                password_file,
            } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password_file", password_file)
                .finish(),
            Auth::TokenFile(path) => f.debug_tuple("TokenFile").field(path).finish(),
        }
    }
}

/// What [`crate::Fleet::connect`] needs.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub(crate) servers: Vec<String>,
    pub(crate) auth: Auth,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) member: MemberId,
    pub(crate) key_file: PathBuf,
    pub(crate) heartbeat: Duration,
    pub(crate) expiry: Duration,
    pub(crate) window: Duration,
}

impl FleetOptions {
    /// Options for `member`, joining through `servers` (`nats://host:port`
    /// or `tls://host:port`) with the fleet key in `key_file`; no
    /// credentials, a beat every second, presence expiring after 3 s and a
    /// 30 s replay window.
    pub fn new(
        servers: impl IntoIterator<Item = impl Into<String>>,
        member: MemberId,
        key_file: impl Into<PathBuf>,
    ) -> FleetOptions {
        FleetOptions {
            servers: servers.into_iter().map(Into::into).collect(),
            auth: Auth::None,
            ca_file: None,
            member,
            key_file: key_file.into(),
            heartbeat: Duration::from_secs(1),
            expiry: Duration::from_secs(3),
            window: Duration::from_secs(30),
        }
    }

    /// Authenticates with `auth`.
    pub fn auth(mut self, auth: Auth) -> FleetOptions {
        self.auth = auth;
        self
    }

    /// The member these options join as.
    pub fn member(&self) -> &MemberId {
        &self.member
    }

    /// Requires TLS, trusting the certificate authorities in `ca_file` (PEM).
    pub fn tls_ca_file(mut self, ca_file: impl Into<PathBuf>) -> FleetOptions {
        self.ca_file = Some(ca_file.into());
        self
    }

    /// How often presence is announced, and after how long without a beat
    /// a member's presence expires (at least twice the beat).
    pub fn presence(mut self, heartbeat: Duration, expiry: Duration) -> FleetOptions {
        self.heartbeat = heartbeat.max(Duration::from_millis(10));
        self.expiry = expiry.max(self.heartbeat * 2);
        self
    }

    /// How old (or how far ahead) a message may be when it arrives.
    pub fn replay_window(mut self, window: Duration) -> FleetOptions {
        self.window = window;
        self
    }
}
