//! Sealed fleet messages: XChaCha20-Poly1305 under the fleet's sealing
//! key, a random 24-byte nonce each, the NATS subject and the sender's
//! member id bound as associated data, the time sent and a random message
//! id inside; `Replays` drops what is stale or seen before.
//!
//! On the wire: `0x01`, the sender's id length (one byte) and id, the
//! nonce, then the sealed text: the time sent (milliseconds since the Unix
//! epoch, 8 bytes big-endian), the message id (16 bytes) and the body.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngExt;

use crate::member::MemberId;

/// Largest sealed message, in bytes: anything larger is refused unread.
pub const MAX_MESSAGE: usize = 64 * 1024;

const VERSION: u8 = 1;
const NONCE: usize = 24;
const TAG: usize = 16;
const INNER_HEAD: usize = 8 + 16;
/// Most replay entries kept: beyond it, new messages are dropped until old
/// ones leave the window.
const MAX_REMEMBERED: usize = 1 << 18;

/// Why a fleet message was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// Larger than [`MAX_MESSAGE`], refused before it was read.
    #[error("fleet message larger than {MAX_MESSAGE} bytes")]
    TooLarge,
    /// Not sealed by a holder of the fleet key for this subject and
    /// sender, or not a fleet message at all.
    #[error("fleet message not sealed with the fleet key")]
    Forged,
    /// Sent longer ago (or further ahead) than the window allows.
    #[error("fleet message outside the replay window")]
    Stale,
    /// Its message id was already seen within the window.
    #[error("fleet message replayed")]
    Replayed,
}

/// A message opened and verified: who sealed it, when, and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    pub(crate) from: MemberId,
    pub(crate) sent_ms: u64,
    pub(crate) id: [u8; 16],
    pub(crate) body: Vec<u8>,
}

/// Seals and opens fleet messages under the sealing key.
pub(crate) struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl Sealer {
    pub(crate) fn new(key: &[u8; 32]) -> Sealer {
        Sealer {
            cipher: XChaCha20Poly1305::new(key.into()),
        }
    }

    /// `body` sealed by `from` for `subject`, sent at `sent_ms`.
    pub(crate) fn seal(
        &self,
        subject: &str,
        from: &MemberId,
        sent_ms: u64,
        body: &[u8],
    ) -> Result<Vec<u8>, SealError> {
        let member = from.as_str().as_bytes();
        let total = 2 + member.len() + NONCE + INNER_HEAD + body.len() + TAG;
        if total > MAX_MESSAGE {
            return Err(SealError::TooLarge);
        }
        let mut nonce = [0u8; NONCE];
        let mut id = [0u8; 16];
        let mut rng = rand::rng();
        rng.fill(&mut nonce);
        rng.fill(&mut id);
        let mut inner = Vec::with_capacity(INNER_HEAD + body.len());
        inner.extend_from_slice(&sent_ms.to_be_bytes());
        inner.extend_from_slice(&id);
        inner.extend_from_slice(body);
        let aad = associated(subject, member);
        let sealed = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &inner,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::TooLarge)?;
        let mut out = Vec::with_capacity(total);
        out.push(VERSION);
        out.push(u8::try_from(member.len()).map_err(|_| SealError::TooLarge)?);
        out.extend_from_slice(member);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The message `bytes` received on `subject`, if a holder of the key
    /// sealed it for that subject (its freshness is [`Replays`]' to judge).
    pub(crate) fn open(&self, subject: &str, bytes: &[u8]) -> Result<Opened, SealError> {
        if bytes.len() > MAX_MESSAGE {
            return Err(SealError::TooLarge);
        }
        let (&version, rest) = bytes.split_first().ok_or(SealError::Forged)?;
        let (&len, rest) = rest.split_first().ok_or(SealError::Forged)?;
        if version != VERSION {
            return Err(SealError::Forged);
        }
        let (member, rest) = rest
            .split_at_checked(usize::from(len))
            .ok_or(SealError::Forged)?;
        let (nonce, sealed) = rest.split_at_checked(NONCE).ok_or(SealError::Forged)?;
        let from = std::str::from_utf8(member)
            .ok()
            .and_then(|m| MemberId::new(m).ok())
            .ok_or(SealError::Forged)?;
        let aad = associated(subject, member);
        let inner = self
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Forged)?;
        let (sent, rest) = inner.split_at_checked(8).ok_or(SealError::Forged)?;
        let (id, body) = rest.split_at_checked(16).ok_or(SealError::Forged)?;
        let sent_ms = u64::from_be_bytes(sent.try_into().map_err(|_| SealError::Forged)?);
        let id: [u8; 16] = id.try_into().map_err(|_| SealError::Forged)?;
        Ok(Opened {
            from,
            sent_ms,
            id,
            body: body.to_vec(),
        })
    }
}

/// The associated data: a label, the subject and the sender, each with its
/// length, so no two pairs give the same bytes.
fn associated(subject: &str, member: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(16 + subject.len() + member.len());
    aad.extend_from_slice(b"dk-fleet/1");
    aad.extend_from_slice(
        &u32::try_from(subject.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    aad.extend_from_slice(subject.as_bytes());
    aad.extend_from_slice(
        &u32::try_from(member.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    aad.extend_from_slice(member);
    aad
}

/// Milliseconds since the Unix epoch now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The message ids seen within the window, each kept until it leaves it.
pub(crate) struct Replays {
    window_ms: u64,
    seen: HashMap<[u8; 16], u64>,
    oldest_kept: u64,
}

impl Replays {
    pub(crate) fn new(window: Duration) -> Replays {
        Replays {
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            seen: HashMap::new(),
            oldest_kept: 0,
        }
    }

    /// Accepts a message sent at `sent_ms` with `id` once, if it is within
    /// the window of `now_ms` either way.
    pub(crate) fn accept(
        &mut self,
        id: [u8; 16],
        sent_ms: u64,
        now_ms: u64,
    ) -> Result<(), SealError> {
        let floor = now_ms.saturating_sub(self.window_ms);
        if sent_ms < floor || sent_ms > now_ms.saturating_add(self.window_ms) {
            return Err(SealError::Stale);
        }
        if self.oldest_kept < floor {
            self.seen.retain(|_, sent| *sent >= floor);
            self.oldest_kept = self.seen.values().copied().min().unwrap_or(now_ms);
        }
        if self.seen.contains_key(&id) || self.seen.len() >= MAX_REMEMBERED {
            return Err(SealError::Replayed);
        }
        self.seen.insert(id, sent_ms);
        self.oldest_kept = self.oldest_kept.min(sent_ms);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> MemberId {
        MemberId::new(name).unwrap()
    }

    #[test]
    fn a_sealed_message_opens_only_where_it_was_sealed_for() {
        let sealer = Sealer::new(&[1; 32]);
        let sealed = sealer
            .seal("dk.fleet.event", &member("a"), 5, b"hello")
            .unwrap();
        let opened = sealer.open("dk.fleet.event", &sealed).unwrap();
        assert_eq!(
            (opened.from, opened.sent_ms, opened.body),
            (member("a"), 5, b"hello".to_vec())
        );
        assert_eq!(
            sealer.open("dk.fleet.other", &sealed),
            Err(SealError::Forged)
        );
        assert_eq!(
            Sealer::new(&[2; 32]).open("dk.fleet.event", &sealed),
            Err(SealError::Forged)
        );
        // Another sender's name in the clear header does not open.
        let mut renamed = sealed.clone();
        if let Some(b) = renamed.get_mut(2) {
            *b = b'b';
        }
        assert_eq!(
            sealer.open("dk.fleet.event", &renamed),
            Err(SealError::Forged)
        );
        assert!(!sealed.windows(5).any(|w| w == b"hello"));
    }

    #[test]
    fn malformed_and_large_messages_are_refused() {
        let sealer = Sealer::new(&[1; 32]);
        for bytes in [
            &b""[..],
            &[1],
            &[1, 200],
            &[2, 1, b'a'],
            &[1, 1, b'a', 0, 0],
        ] {
            assert_eq!(sealer.open("s", bytes), Err(SealError::Forged));
        }
        assert_eq!(
            sealer.open("s", &vec![1; MAX_MESSAGE + 1]),
            Err(SealError::TooLarge)
        );
        assert_eq!(
            sealer.seal("s", &member("a"), 0, &vec![0; MAX_MESSAGE]),
            Err(SealError::TooLarge)
        );
    }

    #[test]
    fn replays_and_stale_messages_are_dropped() {
        let mut replays = Replays::new(Duration::from_secs(30));
        let now = 1_000_000;
        assert_eq!(replays.accept([1; 16], now, now), Ok(()));
        assert_eq!(
            replays.accept([1; 16], now, now + 10),
            Err(SealError::Replayed)
        );
        assert_eq!(
            replays.accept([2; 16], now - 30_001, now),
            Err(SealError::Stale)
        );
        assert_eq!(
            replays.accept([3; 16], now + 30_001, now),
            Err(SealError::Stale)
        );
        assert_eq!(replays.accept([4; 16], now - 29_000, now), Ok(()));
        // Once out of the window, ids are forgotten and the message is stale.
        assert_eq!(replays.accept([5; 16], now + 40_000, now + 40_000), Ok(()));
        assert_eq!(replays.seen.len(), 1);
        assert_eq!(
            replays.accept([1; 16], now, now + 40_000),
            Err(SealError::Stale)
        );
    }
}
