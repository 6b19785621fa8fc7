//! A hostile Noise peer for tests (the `vectors` feature, which no build
//! that talks to a real peer has): a builder whose static or ephemeral key
//! is the point 0, so that tests over real sockets show both sides refuse
//! it. Kept with the tests: it implements the Noise library's traits,
//! which nothing public of dk-channel may name.

use alloc::boxed::Box;

use crate::error::{ChannelError, from_noise};
use crate::protocol::NOISE_PATTERN;

/// A builder whose static or ephemeral key is the point 0 with a key
/// agreement that always gives zeros: a hostile peer that presents a
/// low-order key, for tests (the `vectors` feature) only.
pub(crate) fn hostile_builder(
    zero: crate::error::LowOrderSlot,
) -> Result<snow::Builder<'static>, ChannelError> {
    let params: snow::params::NoiseParams = NOISE_PATTERN.parse().map_err(from_noise)?;
    Ok(snow::Builder::with_resolver(
        params,
        Box::new(hostile::Resolver {
            zero,
            made: core::sync::atomic::AtomicU8::new(0),
            real: crate::noise::DkResolver {
                random: crate::noise::Randomness::System,
            },
        }),
    ))
}

mod hostile {
    use alloc::boxed::Box;
    use core::sync::atomic::{AtomicU8, Ordering};

    use snow::params::{CipherChoice, DHChoice, HashChoice};
    use snow::resolvers::CryptoResolver;
    use snow::types::{Cipher, Dh, Hash, Random};

    use crate::error::LowOrderSlot;
    use crate::noise::DkResolver;

    /// dk-channel's resolver, but one of the two key pairs it makes (the
    /// builder makes the static one first, then the ephemeral one) is
    /// [`ZeroDh`].
    pub(super) struct Resolver {
        pub(super) zero: LowOrderSlot,
        pub(super) made: AtomicU8,
        /// dk-channel's resolver, for everything else.
        pub(super) real: DkResolver,
    }

    impl CryptoResolver for Resolver {
        fn resolve_rng(&self) -> Option<Box<dyn Random>> {
            self.real.resolve_rng()
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
                self.real.resolve_dh(choice)
            }
        }

        fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
            self.real.resolve_hash(choice)
        }

        fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
            self.real.resolve_cipher(choice)
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
