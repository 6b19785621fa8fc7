//! Close codes: why a vessel closes a device connection, read the same way by
//! the vessel that sends them and the device that decides what to do next.
//!
//! `docs/PROTOCOL.md` lists them. A close reason is at most
//! [`MAX_CLOSE_REASON_BYTES`]; [`CloseFrame::new`] cuts a longer one. A
//! 4011's reason starts with its [`AdmissionCode`], which decides whether a
//! device should try again.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;
use core::str::FromStr;

/// The close codes of a device connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// 1000: the device closed.
    Normal,
    /// 1001: the vessel is shutting down.
    GoingAway,
    /// 1005: a close without a code (RFC 6455 "no status received"); never sent.
    NoStatus,
    /// 1009: a frame or stream message was larger than the limit.
    TooLarge,
    /// 4000: no `device:hello` or `device:auth` within the handshake deadline.
    HandshakeTimeout,
    /// 4001: pairing did not happen (the person said no, or the manifest is invalid).
    PairingRefused,
    /// 4002: wrong device id or token.
    AuthFailed,
    /// 4003: the device's manifest is not the one the person approved: pair again.
    ManifestChanged,
    /// 4004: the first frame was not `device:hello` or `device:auth`.
    BadHandshake,
    /// 4005: too many malformed frames.
    Malformed,
    /// 4006: frames came faster than the limit.
    Rate,
    /// 4007: the person unpaired the device.
    Unpaired,
    /// 4008: a newer connection of the same device, or a new pairing, replaced this one.
    Replaced,
    /// 4009: the device stopped answering pings.
    Dead,
    /// 4010: a pairing limit: one waiting request per device, caps per
    /// address and overall, attempts per minute per address.
    PairingLimit,
    /// 4011: a streaming device (kind `voice` or `desktop-control`) was
    /// refused admission; the reason is `<admission code>: <message>`.
    AdmissionRefused,
    /// 4012: dk/2's secure channel failed (a handshake or record that does
    /// not hold, whatever it was: the code never says which).
    SecureChannel,
}

impl CloseCode {
    /// Every close code, in the order of their numbers.
    pub const ALL: [CloseCode; 17] = [
        CloseCode::Normal,
        CloseCode::GoingAway,
        CloseCode::NoStatus,
        CloseCode::TooLarge,
        CloseCode::HandshakeTimeout,
        CloseCode::PairingRefused,
        CloseCode::AuthFailed,
        CloseCode::ManifestChanged,
        CloseCode::BadHandshake,
        CloseCode::Malformed,
        CloseCode::Rate,
        CloseCode::Unpaired,
        CloseCode::Replaced,
        CloseCode::Dead,
        CloseCode::PairingLimit,
        CloseCode::AdmissionRefused,
        CloseCode::SecureChannel,
    ];

    /// The number on the wire.
    pub const fn code(self) -> u16 {
        match self {
            CloseCode::Normal => 1000,
            CloseCode::GoingAway => 1001,
            CloseCode::NoStatus => 1005,
            CloseCode::TooLarge => 1009,
            CloseCode::HandshakeTimeout => 4000,
            CloseCode::PairingRefused => 4001,
            CloseCode::AuthFailed => 4002,
            CloseCode::ManifestChanged => 4003,
            CloseCode::BadHandshake => 4004,
            CloseCode::Malformed => 4005,
            CloseCode::Rate => 4006,
            CloseCode::Unpaired => 4007,
            CloseCode::Replaced => 4008,
            CloseCode::Dead => 4009,
            CloseCode::PairingLimit => 4010,
            CloseCode::AdmissionRefused => 4011,
            CloseCode::SecureChannel => 4012,
        }
    }

    /// The close code numbered `code`, if it is one of these.
    pub fn from_code(code: u16) -> Option<CloseCode> {
        CloseCode::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The reason the vessel gives with this code, for a code whose reason
    /// is one fixed text (for [`CloseCode::BadHandshake`] and
    /// [`CloseCode::Replaced`], which have two, the first
    /// `docs/PROTOCOL.md` lists); `None` for a code whose reason says more
    /// (a limit, a pairing's or an admission's refusal) or that the vessel
    /// does not send.
    pub const fn reason(self) -> Option<&'static str> {
        match self {
            CloseCode::GoingAway => Some("vessel shutting down"),
            CloseCode::HandshakeTimeout => Some("send device:hello or device:auth first"),
            CloseCode::AuthFailed => Some("authentication failed"),
            CloseCode::ManifestChanged => Some("manifest changed since pairing: pair again"),
            CloseCode::BadHandshake => Some("expected device:hello or device:auth"),
            CloseCode::Malformed => Some("too many malformed frames"),
            CloseCode::Unpaired => Some("unpaired by the person"),
            CloseCode::Replaced => Some("replaced by a newer connection"),
            CloseCode::Dead => Some("no answer to pings"),
            CloseCode::SecureChannel => Some("secure channel failed"),
            CloseCode::Normal
            | CloseCode::NoStatus
            | CloseCode::TooLarge
            | CloseCode::PairingRefused
            | CloseCode::Rate
            | CloseCode::PairingLimit
            | CloseCode::AdmissionRefused => None,
        }
    }

    /// Whether a device should connect again after this close, knowing only
    /// the code: not when the person must act (pairing refused, token
    /// refused, manifest changed, unpaired), nor for a refused admission
    /// unless its admission code says so ([`CloseFrame::retry`] reads it).
    pub const fn retry(self) -> bool {
        !matches!(
            self,
            CloseCode::PairingRefused
                | CloseCode::AuthFailed
                | CloseCode::ManifestChanged
                | CloseCode::Unpaired
                | CloseCode::AdmissionRefused
        )
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code())
    }
}

/// The stable codes a refused admission names (the start of a 4011's
/// reason), as Prism names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdmissionCode {
    /// `ERR_PRISM_DEVICE_DISABLED`: the device class is not enabled, or has no sandbox.
    Disabled,
    /// `ERR_PRISM_DEVICE_APPROVAL`: a side effect needs approval and has none.
    Approval,
    /// `ERR_PRISM_DEVICE_SESSIONS`: the identity already holds its concurrent sessions.
    Sessions,
    /// `ERR_PRISM_DEVICE_CHUNK`: a stream chunk size that is not a non-negative safe integer.
    Chunk,
    /// `ERR_PRISM_DEVICE_RUN_LIMITS`: no shared run budget to charge.
    RunLimits,
    /// `ERR_PRISM_DEVICE_INPUT`: a malformed configuration or request.
    Input,
}

impl AdmissionCode {
    /// Every code, in the order the contract lists them.
    pub const ALL: [AdmissionCode; 6] = [
        AdmissionCode::Disabled,
        AdmissionCode::Approval,
        AdmissionCode::Sessions,
        AdmissionCode::Chunk,
        AdmissionCode::RunLimits,
        AdmissionCode::Input,
    ];

    /// The code string, e.g. `ERR_PRISM_DEVICE_SESSIONS`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AdmissionCode::Disabled => "ERR_PRISM_DEVICE_DISABLED",
            AdmissionCode::Approval => "ERR_PRISM_DEVICE_APPROVAL",
            AdmissionCode::Sessions => "ERR_PRISM_DEVICE_SESSIONS",
            AdmissionCode::Chunk => "ERR_PRISM_DEVICE_CHUNK",
            AdmissionCode::RunLimits => "ERR_PRISM_DEVICE_RUN_LIMITS",
            AdmissionCode::Input => "ERR_PRISM_DEVICE_INPUT",
        }
    }

    /// Whether a device refused with this code should try again later: only
    /// for the session cap, which frees up when another session ends.
    pub const fn retry(self) -> bool {
        matches!(self, AdmissionCode::Sessions)
    }
}

impl fmt::Display for AdmissionCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A text that is not one of the admission codes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown admission code `{0}`")]
pub struct UnknownAdmissionCode(pub String);

impl FromStr for AdmissionCode {
    type Err = UnknownAdmissionCode;

    fn from_str(text: &str) -> Result<AdmissionCode, UnknownAdmissionCode> {
        AdmissionCode::ALL
            .into_iter()
            .find(|c| c.as_str() == text)
            .ok_or_else(|| UnknownAdmissionCode(text.to_owned()))
    }
}

/// A pairing limit a `device:hello` ran into: the reason of a 4010.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum PairingLimit {
    /// A request of this device from this address already waits.
    #[error("a pairing request for this device is already waiting for the person")]
    AlreadyWaiting,
    /// The device id holds its most waiting requests (from any address).
    #[error("too many pairing requests for this device are waiting for the person")]
    TooManyForDevice,
    /// The vessel holds its most waiting requests.
    #[error("too many pairing requests are waiting for the person")]
    TooMany,
    /// The address holds its most waiting requests.
    #[error("too many pairing requests from this address are waiting for the person")]
    TooManyFromAddress,
    /// The address made its most attempts this minute.
    #[error("too many pairing attempts from this address: wait a minute")]
    TooManyAttempts,
}

impl From<PairingLimit> for CloseFrame {
    fn from(limit: PairingLimit) -> CloseFrame {
        CloseFrame::new(CloseCode::PairingLimit, limit.to_string())
    }
}

/// The longest close reason, in bytes: a close frame's payload is at most
/// 125 bytes (RFC 6455, section 5.5), two of them the code. Strict clients
/// refuse a longer one and see the connection drop (1006) instead.
pub const MAX_CLOSE_REASON_BYTES: usize = 123;

/// Marks a reason that was cut to fit.
const CUT_MARK: char = '…';

/// A close as it travels: its number and its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    /// The close code's number (any number a peer sent, known or not).
    pub code: u16,
    /// A short reason, for people.
    pub reason: String,
}

impl CloseFrame {
    /// A close with `code` and `reason`, the reason cut to fit
    /// [`MAX_CLOSE_REASON_BYTES`].
    pub fn new(code: CloseCode, reason: impl Into<String>) -> CloseFrame {
        CloseFrame {
            code: code.code(),
            reason: fit_close_reason(reason.into()),
        }
    }

    /// A close with `code` and its fixed reason ([`CloseCode::reason`]);
    /// no reason for a code without one.
    pub fn canonical(code: CloseCode) -> CloseFrame {
        CloseFrame::new(code, code.reason().unwrap_or_default())
    }

    /// A refused admission (4011): `<admission code>: <message>`.
    pub fn admission_refused(code: AdmissionCode, message: &str) -> CloseFrame {
        CloseFrame::new(CloseCode::AdmissionRefused, format!("{code}: {message}"))
    }

    /// The close code, when the number is one of ours.
    pub fn close_code(&self) -> Option<CloseCode> {
        CloseCode::from_code(self.code)
    }

    /// The admission code a 4011 names at the start of its reason.
    pub fn admission_code(&self) -> Option<AdmissionCode> {
        if self.close_code() != Some(CloseCode::AdmissionRefused) {
            return None;
        }
        let (code, _) = self.reason.split_once(':')?;
        code.parse().ok()
    }

    /// Whether a device should connect again after this close: as
    /// [`CloseCode::retry`], a refused admission as its admission code says,
    /// and any code that is not one of ours, yes.
    pub fn retry(&self) -> bool {
        match self.close_code() {
            Some(CloseCode::AdmissionRefused) => self.admission_code().is_some_and(|c| c.retry()),
            Some(code) => code.retry(),
            None => true,
        }
    }
}

impl fmt::Display for CloseFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.reason)
    }
}

/// `reason` itself when it fits in a close frame; otherwise its longest
/// prefix, cut at a character boundary, that fits with [`CUT_MARK`] after it.
fn fit_close_reason(mut reason: String) -> String {
    if reason.len() <= MAX_CLOSE_REASON_BYTES {
        return reason;
    }
    let cut = reason.floor_char_boundary(MAX_CLOSE_REASON_BYTES - CUT_MARK.len_utf8());
    reason.truncate(cut);
    reason.push(CUT_MARK);
    reason
}

#[cfg(test)]
mod tests;
