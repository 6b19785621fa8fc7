//! The one place dk-channel sets up the Noise library: the protocol's
//! builder, X25519 public keys, the low-order check on a peer's keys and
//! the system's random bytes.

use crate::error::{ChannelError, from_noise, unsupported};
use crate::protocol::NOISE_PATTERN;

/// A builder for dk/2's Noise protocol.
pub(crate) fn builder() -> Result<snow::Builder<'static>, ChannelError> {
    let params: snow::params::NoiseParams = NOISE_PATTERN.parse().map_err(from_noise)?;
    Ok(snow::Builder::new(params))
}

/// The X25519 public key of a secret, computed by the Noise library.
pub(crate) fn public_of(secret: &[u8; 32]) -> Result<[u8; 32], ChannelError> {
    use snow::resolvers::CryptoResolver as _;
    let mut dh = snow::resolvers::DefaultResolver
        .resolve_dh(&snow::params::DHChoice::Curve25519)
        .ok_or_else(unsupported)?;
    dh.set(secret);
    <[u8; 32]>::try_from(dh.pubkey()).map_err(|_| unsupported())
}

/// 32 bytes from the system's CSPRNG, through the Noise library's.
pub(crate) fn random_bytes() -> Result<[u8; 32], ChannelError> {
    use snow::resolvers::CryptoResolver as _;
    let mut rng = snow::resolvers::DefaultResolver
        .resolve_rng()
        .ok_or_else(unsupported)?;
    let mut bytes = [0u8; 32];
    rng.try_fill_bytes(&mut bytes).map_err(from_noise)?;
    Ok(bytes)
}

/// A scalar for [`is_low_order`]: any will do, since X25519 clamps every
/// scalar to a multiple of 8 below the prime order.
const PROBE_SCALAR: [u8; 32] = [0x5a; 32];

/// Whether `point`, a public key as a peer sent it, is a low-order point
/// (the 7 small-order u-coordinates, non-canonical encodings and the top
/// bit included): X25519 with it gives all zeros whatever the scalar, so a
/// key agreement with it contributes nothing secret, and anyone could hold
/// the "private key" of such a static key. Checked the robust way, on the
/// key agreement's output, with the same X25519 the handshake uses.
pub(crate) fn is_low_order(point: &[u8; 32]) -> Result<bool, ChannelError> {
    use snow::resolvers::CryptoResolver as _;
    let mut dh = snow::resolvers::DefaultResolver
        .resolve_dh(&snow::params::DHChoice::Curve25519)
        .ok_or_else(unsupported)?;
    dh.set(&PROBE_SCALAR);
    let mut out = [0u8; 32];
    dh.dh(point, &mut out).map_err(from_noise)?;
    Ok(out.iter().all(|&b| b == 0))
}

/// A builder whose static or ephemeral key is the point 0 with a key
/// agreement that always gives zeros: a hostile peer that presents a
/// low-order key, for tests (the `vectors` feature) only.
#[cfg(feature = "vectors")]
pub(crate) fn hostile_builder(
    zero: crate::LowOrderSlot,
) -> Result<snow::Builder<'static>, ChannelError> {
    let params: snow::params::NoiseParams = NOISE_PATTERN.parse().map_err(from_noise)?;
    Ok(snow::Builder::with_resolver(
        params,
        Box::new(hostile::Resolver {
            zero,
            made: std::sync::atomic::AtomicU8::new(0),
        }),
    ))
}

#[cfg(feature = "vectors")]
mod hostile {
    use std::sync::atomic::{AtomicU8, Ordering};

    use snow::params::{CipherChoice, DHChoice, HashChoice};
    use snow::resolvers::{CryptoResolver, DefaultResolver};
    use snow::types::{Cipher, Dh, Hash, Random};

    use crate::LowOrderSlot;

    /// The default resolver, but one of the two key pairs it makes (the
    /// builder makes the static one first, then the ephemeral one) is
    /// [`ZeroDh`].
    pub(super) struct Resolver {
        pub(super) zero: LowOrderSlot,
        pub(super) made: AtomicU8,
    }

    impl CryptoResolver for Resolver {
        fn resolve_rng(&self) -> Option<Box<dyn Random>> {
            DefaultResolver.resolve_rng()
        }

        fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
            let index = self.made.fetch_add(1, Ordering::Relaxed);
            let slot = match index {
                0 => LowOrderSlot::Static,
                _ => LowOrderSlot::Ephemeral,
            };
            if slot == self.zero {
                Some(Box::new(ZeroDh))
            } else {
                DefaultResolver.resolve_dh(choice)
            }
        }

        fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
            DefaultResolver.resolve_hash(choice)
        }

        fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
            DefaultResolver.resolve_cipher(choice)
        }
    }

    /// A "key pair" whose public key is the point 0: every key agreement
    /// with it is all zeros, which the peer computes too.
    struct ZeroDh;

    impl Dh for ZeroDh {
        fn name(&self) -> &'static str {
            "25519"
        }

        fn pub_len(&self) -> usize {
            32
        }

        fn priv_len(&self) -> usize {
            32
        }

        fn set(&mut self, _privkey: &[u8]) {}

        fn generate(&mut self, _rng: &mut dyn Random) -> Result<(), snow::Error> {
            Ok(())
        }

        fn pubkey(&self) -> &[u8] {
            &[0; 32]
        }

        fn privkey(&self) -> &[u8] {
            &[0; 32]
        }

        fn dh(&self, _pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
            out.iter_mut().take(32).for_each(|b| *b = 0);
            Ok(())
        }
    }
}
