//! The one place dk-channel sets up the Noise library: the protocol's
//! builder, X25519 public keys and the system's random bytes.

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
