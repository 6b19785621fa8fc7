//! Why the device client stopped.

use std::io;
use std::path::PathBuf;

/// Why the client stopped. The variants that name the person need them to
/// act; retrying would not help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The URL cannot be connected to (not a `ws://` or `wss://` URL).
    #[error("cannot use the vessel URL `{url}`: {why}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it cannot be used.
        why: String,
    },
    /// The connection could not be opened (refused, timed out, the vessel
    /// answered HTTP instead of upgrading). [`run_client`](crate::run_client) retries it.
    #[error("cannot connect to the vessel: {0}")]
    Connect(String),
    /// The vessel answered the upgrade with HTTP 503: it is up and at a
    /// connection cap (connections at once, or connections from this
    /// address not yet authenticated). [`run_client`](crate::run_client)
    /// tries again within `retry_after` (the vessel's `Retry-After`, 1 s
    /// when it gives none, at most 60 s) without growing its backoff.
    #[error("the vessel is busy (HTTP 503): try again within {retry_after:?}")]
    Busy {
        /// How long the vessel asked the device to wait.
        retry_after: std::time::Duration,
    },
    /// The vessel refused the upgrade with HTTP 403: it does not take this
    /// device here (plain v1 beyond loopback, where it accepts only dk/2; a
    /// Host or Origin its listener does not take). Its answer, made
    /// printable. Not retried, except by a paired dk/2 device: the answer
    /// comes outside the channel, where anyone on the path can forge it,
    /// so [`run_client`](crate::run_client) tries again.
    #[error("the vessel refused the connection (HTTP 403): {0}")]
    Refused(String),
    /// Close 4001: the person said no, did not answer in time, or the vessel
    /// refused the manifest. The vessel's reason.
    #[error("pairing refused: {0}")]
    PairingRefused(String),
    /// Close 4002: the vessel did not accept the device's credential. On
    /// v1 the token was removed (file and memory); on dk/2 the key file is
    /// marked unpaired (the key and the vessel pin are kept). The next run
    /// pairs again; the person must approve that pairing.
    #[error(
        "the vessel refused the device's credential (a v1 token is removed, a dk/2 key marked unpaired): pair the device again"
    )]
    AuthFailed,
    /// Close 4003: the device's manifest is not the one the person
    /// approved. The token is kept; the device must pair again for the
    /// person to approve the new manifest.
    #[error("the device's manifest changed since the person approved it: pair again")]
    ManifestChanged,
    /// Close 4011: the vessel refused this streaming device admission for a
    /// reason retrying does not change (the kind disabled, no sandbox, the
    /// person said no, no run limits). The vessel's reason: the admission
    /// code and message. A refusal for the session cap is retried instead.
    #[error("the vessel refused the streaming session: {0}")]
    AdmissionRefused(String),
    /// Close 4007: the person unpaired the device. The v1 token was removed
    /// (a dk/2 key is marked unpaired); the device must pair again.
    #[error(
        "the person unpaired the device (a v1 token is removed, a dk/2 key marked unpaired): pair again to reconnect"
    )]
    Unpaired,
    /// The token file could not be read, written or removed, or holds
    /// something that is not a device token.
    #[error("token file `{}`: {source}", path.display())]
    TokenFile {
        /// The token file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// The vessel sent something the protocol does not allow where it
    /// matters (a device token that cannot be kept).
    #[error("the vessel broke the protocol: {0}")]
    Protocol(String),
    /// [`ClientOptions::max_attempts`](crate::ClientOptions::max_attempts) connections in a row failed.
    #[error("gave up after {attempts} connection attempts; the last: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// How the last one ended.
        last: String,
    },
    /// The key file could not be read or written, or holds something that
    /// is not a dk device key (never overwritten then).
    #[error("key file `{}`: {source}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
    /// The vessel did not answer the `dk.2` subprotocol: it speaks only v1
    /// (8DK, or a dk vessel too old). The client never falls back to v1 on
    /// its own; [`ClientOptions::v1`](crate::ClientOptions::v1) asks for it.
    /// A paired dk/2 device's [`run_client`](crate::run_client) tries again
    /// instead: such an answer can be forged on the path.
    #[error(
        "the vessel does not speak dk/2 (it answered no `dk.2` subprotocol); v1 is used only when asked"
    )]
    NotDk2,
    /// The vessel presented a static key other than the one pinned when it
    /// paired the device: it may be an impostor. Nothing about the device was
    /// sent. A person who really replaced the vessel resets the pin with
    /// [`ClientOptions::forget_vessel`](crate::ClientOptions::forget_vessel).
    #[error(
        "the vessel's key changed (pinned {pinned}, presented {presented}): it may be an impostor; if the vessel was really replaced, forget its key and pair again"
    )]
    VesselKeyChanged {
        /// The pinned key's fingerprint.
        pinned: String,
        /// The presented key's fingerprint.
        presented: String,
    },
    /// The dk/2 pairing exchange broke its rules (a reveal that does not
    /// match the commitment, a repeated, early or unexpected pairing frame):
    /// a relay may be in the middle. The device closed 4001 and stopped.
    #[error("pairing broken: {0}")]
    PairingBroken(String),
    /// The certificates to trust for `wss://` cannot be used: the PEM given
    /// to [`ClientOptions::tls_root`](crate::ClientOptions::tls_root) holds
    /// none or a broken one, or the platform has no roots.
    #[error("TLS roots: {0}")]
    TlsRoot(String),
    /// The client was not run inside a Tokio runtime; nothing was done.
    #[error("the device client must run inside a tokio runtime")]
    NoRuntime,
}
