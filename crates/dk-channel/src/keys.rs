//! Long-term X25519 keys: a [`StaticKey`] each side keeps in a 0600 file,
//! and the [`PublicKey`] that is a device's credential and a vessel's
//! identity.

use alloc::string::String;
use core::fmt;

use data_encoding::BASE32_NOPAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
#[cfg(feature = "ring")]
use zeroize::Zeroize;
use zeroize::Zeroizing;

use crate::error::ChannelError;
#[cfg(feature = "ring")]
use crate::error::from_noise;
use crate::hex::{from_hex32, to_hex32};

/// A long-term X25519 key pair. `Debug` never shows the secret, and the
/// secret is wiped from memory when the key is dropped.
pub struct StaticKey {
    /// The private scalar, as X25519 takes it.
    secret: Zeroizing<[u8; 32]>,
    /// Its public key.
    public: PublicKey,
}

impl StaticKey {
    /// A fresh key pair from the system's CSPRNG (the `ring` feature);
    /// fails only when that generator does. Without it, a key is made
    /// [`from_secret`](StaticKey::from_secret) with 32 bytes from the
    /// platform's CSPRNG.
    #[cfg(feature = "ring")]
    pub fn generate() -> Result<StaticKey, ChannelError> {
        let mut keypair = crate::noise::builder(crate::noise::Randomness::System)?
            .generate_keypair()
            .map_err(from_noise)?;
        let secret = <[u8; 32]>::try_from(keypair.private.as_slice());
        let public = <[u8; 32]>::try_from(keypair.public.as_slice());
        keypair.private.zeroize();
        match (secret, public) {
            (Ok(secret), Ok(public)) => Ok(StaticKey {
                secret: Zeroizing::new(secret),
                public: PublicKey(public),
            }),
            _ => Err(crate::error::unsupported()),
        }
    }

    /// The key pair of a saved secret; its public key is derived with the
    /// Noise library's X25519. Any 32 bytes are a secret (X25519 clamps
    /// them); fails only if the library lacks X25519.
    pub fn from_secret(secret: [u8; 32]) -> Result<StaticKey, ChannelError> {
        let secret = Zeroizing::new(secret);
        let public = crate::noise::public_of(&secret)?;
        Ok(StaticKey {
            secret,
            public: PublicKey(public),
        })
    }

    /// The secret, to save to a file only its owner may read (mode 0600).
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The public key.
    pub fn public(&self) -> PublicKey {
        self.public
    }
}

impl fmt::Debug for StaticKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKey")
            .field("public", &self.public)
            .field("secret", &"(hidden)")
            .finish()
    }
}

/// A static public key: a device's credential, a vessel's identity. Its
/// `Debug` prints its hex. Compare a key against a pin with
/// [`ct_eq`](PublicKey::ct_eq), which takes the same time whatever differs.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// The key of these 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> PublicKey {
        PublicKey(bytes)
    }

    /// Its 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Its 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        to_hex32(&self.0)
    }

    /// The key written as exactly 64 lower-case hex digits, else `None`.
    pub fn from_hex(text: &str) -> Option<PublicKey> {
        from_hex32(text).map(PublicKey)
    }

    /// Whether two keys are equal, in constant time.
    pub fn ct_eq(&self, other: &PublicKey) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    /// Its fingerprint, as a vessel prints it and a device shows it: the
    /// first 16 bytes of SHA-256 of the key, base32 (RFC 4648 alphabet, no
    /// padding, upper case), in groups of four joined by `-`, such as
    /// `XSCB-3OH6-UPX5-QRKV-U74O-5OJF-AM`.
    pub fn fingerprint(&self) -> String {
        let digest: [u8; 32] = Sha256::digest(self.0).into();
        let (head, _) = digest.split_at(16);
        let encoded = BASE32_NOPAD.encode(head);
        let mut grouped = String::with_capacity(encoded.len() + encoded.len() / 4);
        for (i, c) in encoded.chars().enumerate() {
            if i > 0 && i % 4 == 0 {
                grouped.push('-');
            }
            grouped.push(c);
        }
        grouped
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}
