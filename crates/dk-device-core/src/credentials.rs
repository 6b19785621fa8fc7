//! What a dk/2 device keeps between runs: its key, the vessel's pinned
//! key, and whether the vessel knows it.

use core::fmt;

use dk_channel::{PublicKey, StaticKey};
use zeroize::Zeroizing;

use crate::entropy::{Entropy, EntropyFailed, random32};

/// A dk/2 device's credentials: its long-term key (a secret: whoever holds
/// it is the device), the vessel's public key once pinned, and whether the
/// vessel has the device paired. The core hands out a new copy to keep
/// ([`Output::Store`](crate::Output::Store)) whenever one of them changes.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    secret: Zeroizing<[u8; 32]>,
    pinned: Option<PublicKey>,
    paired: bool,
}

/// The length of [`Credentials::to_bytes`].
pub const CREDENTIALS_BYTES: usize = 66;

/// The first byte of [`Credentials::to_bytes`]: the layout's version.
const LAYOUT: u8 = 1;

/// Why stored credentials could not be read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialsError {
    /// Not [`CREDENTIALS_BYTES`] long.
    Length(usize),
    /// A layout this version does not know.
    Layout(u8),
    /// Flags with bits this version does not know, or paired without a pin.
    Flags(u8),
    /// The key does not make a key pair.
    Key,
}

impl fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialsError::Length(n) => {
                write!(
                    f,
                    "stored credentials are {n} bytes, not {CREDENTIALS_BYTES}"
                )
            }
            CredentialsError::Layout(v) => write!(f, "stored credentials of unknown layout {v}"),
            CredentialsError::Flags(v) => {
                write!(f, "stored credentials with unknown flags {v:#04x}")
            }
            CredentialsError::Key => f.write_str("stored credentials hold no usable key"),
        }
    }
}

impl core::error::Error for CredentialsError {}

impl Credentials {
    /// New credentials around a fresh key from the platform's random bytes:
    /// nothing pinned, not paired.
    pub fn generate(entropy: &mut dyn Entropy) -> Result<Credentials, EntropyFailed> {
        let secret = Zeroizing::new(random32(entropy)?);
        Ok(Credentials {
            secret,
            pinned: None,
            paired: false,
        })
    }

    /// Credentials around a saved key secret, with the vessel's pin and
    /// whether the device is paired (a device is paired only with a pin).
    pub fn from_parts(secret: [u8; 32], pinned: Option<PublicKey>, paired: bool) -> Credentials {
        Credentials {
            secret: Zeroizing::new(secret),
            paired: paired && pinned.is_some(),
            pinned,
        }
    }

    /// The device's key pair.
    pub fn key(&self) -> Option<StaticKey> {
        StaticKey::from_secret(*self.secret).ok()
    }

    /// The device's public key (what the vessel knows it by), when the
    /// secret makes a key pair.
    pub fn public(&self) -> Option<PublicKey> {
        self.key().map(|key| key.public())
    }

    /// The key's secret, for a platform that stores the parts itself.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The vessel's pinned key.
    pub fn pinned(&self) -> Option<&PublicKey> {
        self.pinned.as_ref()
    }

    /// Whether the vessel has this device paired: it then authenticates
    /// by key instead of asking to pair.
    pub fn is_paired(&self) -> bool {
        self.paired
    }

    pub(crate) fn pin(&mut self, vessel: PublicKey) {
        self.pinned = Some(vessel);
        self.paired = true;
    }

    pub(crate) fn unpair(&mut self) {
        self.paired = false;
    }

    /// The credentials as [`CREDENTIALS_BYTES`] bytes to store (flash, a
    /// file): a layout byte, the secret, a flags byte (pinned, paired) and
    /// the pin (zeros when none). Keep them secret: they hold the key.
    pub fn to_bytes(&self) -> Zeroizing<[u8; CREDENTIALS_BYTES]> {
        let flags = u8::from(self.pinned.is_some()) | (u8::from(self.paired) << 1);
        let pin = self.pinned.map_or([0u8; 32], |pinned| *pinned.as_bytes());
        let mut out = Zeroizing::new([0u8; CREDENTIALS_BYTES]);
        let bytes = core::iter::once(LAYOUT)
            .chain(self.secret.iter().copied())
            .chain(core::iter::once(flags))
            .chain(pin);
        for (slot, byte) in out.iter_mut().zip(bytes) {
            *slot = byte;
        }
        out
    }

    /// Reads back what [`Credentials::to_bytes`] wrote; anything else is
    /// refused whole.
    pub fn from_bytes(bytes: &[u8]) -> Result<Credentials, CredentialsError> {
        if bytes.len() != CREDENTIALS_BYTES {
            return Err(CredentialsError::Length(bytes.len()));
        }
        let (&layout, rest) = bytes
            .split_first()
            .ok_or(CredentialsError::Length(bytes.len()))?;
        if layout != LAYOUT {
            return Err(CredentialsError::Layout(layout));
        }
        let (secret, rest) = rest
            .split_first_chunk::<32>()
            .ok_or(CredentialsError::Length(bytes.len()))?;
        let (&flags, pin) = rest
            .split_first()
            .ok_or(CredentialsError::Length(bytes.len()))?;
        let pin: [u8; 32] = pin
            .try_into()
            .map_err(|_| CredentialsError::Length(bytes.len()))?;
        let (has_pin, paired) = (flags & 1 != 0, flags & 2 != 0);
        if flags & !3 != 0 || (paired && !has_pin) {
            return Err(CredentialsError::Flags(flags));
        }
        let credentials = Credentials {
            secret: Zeroizing::new(*secret),
            pinned: has_pin.then(|| PublicKey::from_bytes(pin)),
            paired,
        };
        if credentials.key().is_none() {
            return Err(CredentialsError::Key);
        }
        Ok(credentials)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("secret", &"<redacted>")
            .field("pinned", &self.pinned.map(|p| p.fingerprint()))
            .field("paired", &self.paired)
            .finish()
    }
}
