//! How a connection ended, and whether the device connects again: the
//! ends a driver is told of.

use alloc::string::String;
use core::fmt;

/// How a connection ended, and whether to connect again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Connecting again makes sense (after a backoff).
    Retry(Retry),
    /// The device must not connect again on its own: the person must act.
    Stop(Stop),
    /// [`DeviceCore::shutdown`](crate::DeviceCore::shutdown) asked for it; the close was sent (none
    /// during the handshake, which is simply dropped).
    Shutdown,
}

/// An end the device can outlast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// The vessel closed with this code and reason (printable); on dk/2 a
    /// close not announced inside the channel is one of these whatever its
    /// code.
    Closed {
        /// The close code (1005 when none was given).
        code: u16,
        /// The reason.
        reason: String,
    },
    /// The connection dropped, or the channel failed (the device closed
    /// 4012).
    Lost,
    /// The dk/2 handshake did not finish: why.
    Handshake(String),
}

/// An end that needs the person.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// The person refused the pairing (4001): the vessel's reason.
    PairingRefused(String),
    /// The vessel refused the credential (4002); a dk/2 key is marked
    /// unpaired, a v1 token forgotten.
    AuthFailed,
    /// The manifest changed since the person approved it (4003); a dk/2
    /// key is marked unpaired, so the next run asks to pair.
    ManifestChanged,
    /// The person unpaired the device.
    Unpaired,
    /// The vessel refused the streaming session for good (4011): why.
    AdmissionRefused(String),
    /// The pairing exchange broke (a frame out of order, a reveal that
    /// does not match its commitment): the device closed 4001.
    PairingBroken(String),
    /// The vessel presented another key than the pinned one: nothing about
    /// the device was sent. Fingerprints of both.
    VesselKeyChanged {
        /// The pinned key's fingerprint.
        pinned: String,
        /// The presented key's fingerprint.
        presented: String,
    },
    /// v1: `device:paired` carried a token that is not printable ASCII of
    /// at most [`MAX_TOKEN_BYTES`](crate::MAX_TOKEN_BYTES) bytes.
    BadToken,
    /// The driver could not keep the credentials or token
    /// ([`DeviceCore::storage_failed`](crate::DeviceCore::storage_failed)).
    Storage,
    /// The platform gave no random bytes.
    Entropy,
    /// The stored credentials hold no usable key.
    Credentials,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::PairingRefused(why) => write!(f, "pairing refused: {why}"),
            Stop::AuthFailed => {
                f.write_str("the vessel refused the device's credential: pair again")
            }
            Stop::ManifestChanged => f.write_str(
                "the device's manifest changed since the person approved it: pair again",
            ),
            Stop::Unpaired => {
                f.write_str("the person unpaired the device: pair again to reconnect")
            }
            Stop::AdmissionRefused(why) => {
                write!(f, "the vessel refused the streaming session: {why}")
            }
            Stop::PairingBroken(why) => write!(f, "pairing broken: {why}"),
            Stop::VesselKeyChanged { pinned, presented } => write!(
                f,
                "the vessel's key changed (pinned {pinned}, presented {presented}): it may be an impostor"
            ),
            Stop::BadToken => f.write_str(
                "device:paired carried a token that is not printable ASCII of at most 1024 bytes",
            ),
            Stop::Storage => f.write_str("the device's credentials could not be kept"),
            Stop::Entropy => f.write_str("the platform gave no random bytes"),
            Stop::Credentials => f.write_str("the stored credentials hold no usable key"),
        }
    }
}
