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
