//! The one place dk-channel sets up the Noise library: the protocol's
//! builder and the primitives it resolves, X25519 public keys, the
//! low-order check on a peer's keys and the random bytes.
//!
//! snow is built without its own primitives (its default resolver would
//! compile in sha2 0.10 and a second, portable ChaCha20-Poly1305):
//! [`DkResolver`] hands it curve25519-dalek's X25519, the `sha2` crate's
//! SHA-256 (the one the rest of dk hashes with) and ChaCha20-Poly1305:
//! ring's with the `ring` feature (six times faster than the portable one
//! on a 200-byte record, which is what keeps a call over dk/2 within 1.15x
//! of v1), RustCrypto's `chacha20poly1305` without it. The random bytes
//! are ring's system ones ([`Randomness::System`], `ring` only) or the 32
//! a caller gave for one handshake's ephemeral key ([`Randomness::Once`]).
//! Every primitive is a library's: what is written here is the glue snow's
//! traits ask for, the Noise specification's nonce layout included. snow
//! builds HMAC and HKDF on the hash.

use alloc::boxed::Box;
use core::cell::Cell;

use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::CryptoResolver;
use snow::types::{Cipher, Dh, Hash, Random};
use zeroize::Zeroizing;

use crate::error::{ChannelError, from_noise, unsupported};
use crate::protocol::{NOISE_PATTERN, TAG_LEN};

/// A builder for dk/2's Noise protocol, on [`DkResolver`] with these
/// random bytes.
pub(crate) fn builder(random: Randomness) -> Result<snow::Builder<'static>, ChannelError> {
    let params: snow::params::NoiseParams = NOISE_PATTERN.parse().map_err(from_noise)?;
    Ok(snow::Builder::with_resolver(
        params,
        Box::new(DkResolver { random }),
    ))
}

/// Where the random bytes a handshake asks for (its ephemeral key's, the
/// only ones dk/2's handshake uses) come from.
pub(crate) enum Randomness {
    /// None: asking fails (for the public key of a secret and the
    /// low-order check, which ask for none).
    Never,
    /// The system's CSPRNG, through ring.
    #[cfg(feature = "ring")]
    System,
    /// These 32 bytes, once; asking again, or for another length, fails.
    Once(Cell<Option<Zeroizing<[u8; 32]>>>),
}

impl Randomness {
    /// The 32 bytes `seed`, given once.
    pub(crate) fn once(seed: [u8; 32]) -> Randomness {
        Randomness::Once(Cell::new(Some(Zeroizing::new(seed))))
    }
}

/// The primitives of `Noise_XX_25519_ChaChaPoly_SHA256` and the random
/// bytes; any other choice resolves to nothing.
pub(crate) struct DkResolver {
    /// What `resolve_rng` hands out.
    pub(crate) random: Randomness,
}

impl DkResolver {
    /// The primitives alone, with no random bytes.
    pub(crate) fn primitives() -> DkResolver {
        DkResolver {
            random: Randomness::Never,
        }
    }
}

impl CryptoResolver for DkResolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        match &self.random {
            Randomness::Never => Some(Box::new(OneShot(None))),
            #[cfg(feature = "ring")]
            Randomness::System => Some(Box::new(SystemRandom(ring::rand::SystemRandom::new()))),
            Randomness::Once(seed) => Some(Box::new(OneShot(seed.take()))),
        }
    }

    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        match choice {
            DHChoice::Curve25519 => Some(Box::new(X25519::default())),
            _ => None,
        }
    }

    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        match choice {
            HashChoice::SHA256 => Some(Box::new(Sha256::default())),
            _ => None,
        }
    }

    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        match choice {
            CipherChoice::ChaChaPoly => Some(Box::new(ChaChaPoly::default())),
            _ => None,
        }
    }
}

/// ring's system random bytes, as snow's [`Random`].
#[cfg(feature = "ring")]
struct SystemRandom(ring::rand::SystemRandom);

#[cfg(feature = "ring")]
impl Random for SystemRandom {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        ring::rand::SecureRandom::fill(&self.0, dest).map_err(|_| snow::Error::Rng)
    }
}

/// 32 given bytes as snow's [`Random`]: handed out once, for exactly 32
/// bytes (an X25519 secret); any other request fails. They are zeroed
/// when handed out or dropped.
struct OneShot(Option<Zeroizing<[u8; 32]>>);

impl Random for OneShot {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        let dest = <&mut [u8; 32]>::try_from(dest).map_err(|_| snow::Error::Rng)?;
        let seed = self.0.take().ok_or(snow::Error::Rng)?;
        dest.copy_from_slice(seed.as_slice());
        Ok(())
    }
}

/// curve25519-dalek's X25519, as snow's [`Dh`]: the key pair of a 32-byte
/// secret (zeroed when dropped), the library clamping it.
#[derive(Default)]
struct X25519 {
    /// The secret.
    secret: Zeroizing<[u8; 32]>,
    /// Its public key.
    public: [u8; 32],
}

impl X25519 {
    /// Takes `secret` and derives its public key.
    fn take(&mut self, secret: [u8; 32]) {
        let secret = Zeroizing::new(secret);
        self.public = curve25519_dalek::MontgomeryPoint::mul_base_clamped(*secret).to_bytes();
        self.secret = secret;
    }
}

impl Dh for X25519 {
    fn name(&self) -> &'static str {
        "25519"
    }

    fn pub_len(&self) -> usize {
        32
    }

    fn priv_len(&self) -> usize {
        32
    }

    /// snow hands 32 bytes; fewer are taken as they are, zeros after.
    fn set(&mut self, secret: &[u8]) {
        let mut bytes = Zeroizing::new([0u8; 32]);
        copy_into(secret, bytes.as_mut_slice());
        self.take(*bytes);
    }

    fn generate(&mut self, rng: &mut dyn Random) -> Result<(), snow::Error> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        rng.try_fill_bytes(bytes.as_mut_slice())?;
        self.take(*bytes);
        Ok(())
    }

    fn pubkey(&self) -> &[u8] {
        &self.public
    }

    fn privkey(&self) -> &[u8] {
        self.secret.as_slice()
    }

    /// snow hands a peer's key at the start of a buffer of its longest
    /// key; one shorter than 32 bytes is refused.
    fn dh(&self, public: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        let public = *public.first_chunk::<32>().ok_or(snow::Error::Dh)?;
        let shared = Zeroizing::new(
            curve25519_dalek::MontgomeryPoint(public)
                .mul_clamped(*self.secret)
                .to_bytes(),
        );
        copy_into(shared.as_slice(), out);
        Ok(())
    }
}

/// The `sha2` crate's SHA-256, as snow's [`Hash`]. Its state (which holds
/// an HMAC key while snow derives keys) is zeroed when dropped (`sha2`'s
/// `zeroize` feature).
#[derive(Default)]
struct Sha256(sha2::Sha256);

/// The build fails if `sha2` stops zeroing its state on drop.
const _: fn() = || {
    fn zeroed_on_drop<T: zeroize::ZeroizeOnDrop>() {}
    zeroed_on_drop::<sha2::Sha256>();
};

impl Hash for Sha256 {
    fn name(&self) -> &'static str {
        "SHA256"
    }

    fn block_len(&self) -> usize {
        64
    }

    fn hash_len(&self) -> usize {
        32
    }

    fn reset(&mut self) {
        sha2::Digest::reset(&mut self.0);
    }

    fn input(&mut self, data: &[u8]) {
        sha2::Digest::update(&mut self.0, data);
    }

    /// snow hands a buffer of its longest hash.
    fn result(&mut self, out: &mut [u8]) {
        copy_into(&sha2::Digest::finalize_reset(&mut self.0), out);
    }
}

/// ring's ChaCha20-Poly1305, as snow's [`Cipher`]; no key until snow sets
/// one, which it does before it encrypts or decrypts.
#[cfg(feature = "ring")]
#[derive(Default)]
struct ChaChaPoly(Option<ring::aead::LessSafeKey>);

#[cfg(feature = "ring")]
impl ChaChaPoly {
    /// The Noise specification's ChaChaPoly nonce: 32 zero bits, then the
    /// 64-bit counter little-endian.
    fn nonce(n: u64) -> ring::aead::Nonce {
        let mut bytes = [0u8; 12];
        let [_, _, _, _, counter @ ..] = &mut bytes;
        *counter = n.to_le_bytes();
        ring::aead::Nonce::assume_unique_for_key(bytes)
    }
}

#[cfg(feature = "ring")]
impl Cipher for ChaChaPoly {
    fn name(&self) -> &'static str {
        "ChaChaPoly"
    }

    fn set(&mut self, key: &[u8; 32]) {
        self.0 = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, key)
            .ok()
            .map(ring::aead::LessSafeKey::new);
    }

    /// Writes the ciphertext and its tag to `out`. snow checks that `out`
    /// holds both before it asks; were it not so, or were there no key,
    /// nothing is written and the length is 0, which no peer opens.
    fn encrypt(&self, nonce: u64, authtext: &[u8], plaintext: &[u8], out: &mut [u8]) -> usize {
        let Some(key) = &self.0 else {
            return 0;
        };
        let Some((body, rest)) = out.split_at_mut_checked(plaintext.len()) else {
            return 0;
        };
        let Some(tag_out) = rest.get_mut(..TAG_LEN) else {
            return 0;
        };
        body.copy_from_slice(plaintext);
        let aad = ring::aead::Aad::from(authtext);
        match key.seal_in_place_separate_tag(Self::nonce(nonce), aad, body) {
            Ok(tag) => {
                tag_out.copy_from_slice(tag.as_ref());
                plaintext.len() + TAG_LEN
            }
            Err(_) => {
                body.fill(0);
                0
            }
        }
    }

    /// Opens `ciphertext` (its tag last) into `out`; nothing of it stays
    /// in `out` when it does not open.
    fn decrypt(
        &self,
        nonce: u64,
        authtext: &[u8],
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, snow::Error> {
        let key = self.0.as_ref().ok_or(snow::Error::Decrypt)?;
        let body_len = ciphertext
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(snow::Error::Decrypt)?;
        let (body, tag) = ciphertext.split_at(body_len);
        let tag = ring::aead::Tag::try_from(tag).map_err(|_| snow::Error::Decrypt)?;
        let plain = out.get_mut(..body_len).ok_or(snow::Error::Decrypt)?;
        plain.copy_from_slice(body);
        let aad = ring::aead::Aad::from(authtext);
        match key.open_in_place_separate_tag(Self::nonce(nonce), aad, tag, plain, 0..) {
            Ok(_) => Ok(body_len),
            Err(_) => {
                plain.fill(0);
                Err(snow::Error::Decrypt)
            }
        }
    }
}

/// RustCrypto's ChaCha20-Poly1305 (the `chacha20poly1305` crate, its key
/// zeroed on drop), as snow's [`Cipher`], without the `ring` feature; no
/// key until snow sets one, which it does before it encrypts or decrypts.
#[cfg(not(feature = "ring"))]
#[derive(Default)]
struct ChaChaPoly(Option<chacha20poly1305::ChaCha20Poly1305>);

#[cfg(not(feature = "ring"))]
impl ChaChaPoly {
    /// The Noise specification's ChaChaPoly nonce: 32 zero bits, then the
    /// 64-bit counter little-endian.
    fn nonce(n: u64) -> chacha20poly1305::Nonce {
        let mut bytes = [0u8; 12];
        let [_, _, _, _, counter @ ..] = &mut bytes;
        *counter = n.to_le_bytes();
        chacha20poly1305::Nonce::from(bytes)
    }
}

#[cfg(not(feature = "ring"))]
impl Cipher for ChaChaPoly {
    fn name(&self) -> &'static str {
        "ChaChaPoly"
    }

    fn set(&mut self, key: &[u8; 32]) {
        use chacha20poly1305::KeyInit;
        self.0 = Some(chacha20poly1305::ChaCha20Poly1305::new(
            &chacha20poly1305::Key::from(*key),
        ));
    }

    /// Writes the ciphertext and its tag to `out`. snow checks that `out`
    /// holds both before it asks; were it not so, or were there no key,
    /// nothing is written and the length is 0, which no peer opens.
    fn encrypt(&self, nonce: u64, authtext: &[u8], plaintext: &[u8], out: &mut [u8]) -> usize {
        use chacha20poly1305::AeadInOut;
        let Some(key) = &self.0 else {
            return 0;
        };
        let Some((body, rest)) = out.split_at_mut_checked(plaintext.len()) else {
            return 0;
        };
        let Some(tag_out) = rest.get_mut(..TAG_LEN) else {
            return 0;
        };
        body.copy_from_slice(plaintext);
        match key.encrypt_inout_detached(&Self::nonce(nonce), authtext, body.into()) {
            Ok(tag) => {
                tag_out.copy_from_slice(tag.as_slice());
                plaintext.len() + TAG_LEN
            }
            Err(_) => {
                body.fill(0);
                0
            }
        }
    }

    /// Opens `ciphertext` (its tag last) into `out`; nothing of it stays
    /// in `out` when it does not open.
    fn decrypt(
        &self,
        nonce: u64,
        authtext: &[u8],
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, snow::Error> {
        use chacha20poly1305::AeadInOut;
        let key = self.0.as_ref().ok_or(snow::Error::Decrypt)?;
        let body_len = ciphertext
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(snow::Error::Decrypt)?;
        let (body, tag) = ciphertext.split_at(body_len);
        let tag = <[u8; TAG_LEN]>::try_from(tag).map_err(|_| snow::Error::Decrypt)?;
        let plain = out.get_mut(..body_len).ok_or(snow::Error::Decrypt)?;
        plain.copy_from_slice(body);
        match key.decrypt_inout_detached(
            &Self::nonce(nonce),
            authtext,
            (&mut *plain).into(),
            &chacha20poly1305::Tag::from(tag),
        ) {
            Ok(()) => Ok(body_len),
            Err(_) => {
                plain.fill(0);
                Err(snow::Error::Decrypt)
            }
        }
    }
}

/// Copies as much of `from` as `to` holds to the start of `to`.
fn copy_into(from: &[u8], to: &mut [u8]) {
    for (to, from) in to.iter_mut().zip(from) {
        *to = *from;
    }
}

/// The X25519 public key of a secret.
pub(crate) fn public_of(secret: &[u8; 32]) -> Result<[u8; 32], ChannelError> {
    let mut dh = DkResolver::primitives()
        .resolve_dh(&DHChoice::Curve25519)
        .ok_or_else(unsupported)?;
    dh.set(secret);
    <[u8; 32]>::try_from(dh.pubkey()).map_err(|_| unsupported())
}

/// 32 bytes from the system's CSPRNG, through ring.
#[cfg(feature = "ring")]
pub(crate) fn random_bytes() -> Result<[u8; 32], ChannelError> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| ChannelError::Random)?;
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
    let mut dh = DkResolver::primitives()
        .resolve_dh(&DHChoice::Curve25519)
        .ok_or_else(unsupported)?;
    dh.set(&PROBE_SCALAR);
    let mut out = [0u8; 32];
    dh.dh(point, &mut out).map_err(from_noise)?;
    Ok(out.iter().all(|&b| b == 0))
}
