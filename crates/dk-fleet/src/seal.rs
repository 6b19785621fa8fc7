//! Sealed fleet messages: XChaCha20-Poly1305 under the fleet's sealing
//! key, a random 24-byte nonce each, the NATS subject and the sender's
//! member id bound as associated data; inside, the time sent, a random
//! message id, the sender's incarnation and the incarnation it is meant
//! for. `Replays` drops what is stale or seen before.
//!
//! On the wire: `0x02`, the sender's id length (one byte) and id, the
//! nonce, then the sealed text: the time sent (milliseconds since the Unix
//! epoch, 8 bytes big-endian), the message id (16 bytes), the sender's
//! incarnation (16 bytes), the receiver's (16 bytes, zero for a message to
//! any member) and the body.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngExt;

use crate::member::{Incarnation, MemberId};

/// Largest sealed message dk-fleet ever reads, in bytes: anything larger
/// is refused unread. The limit a member holds to is the NATS servers'
/// `max_payload` (1 MiB by default), when smaller.
pub const MAX_MESSAGE: usize = 8 * 1024 * 1024;

const VERSION: u8 = 2;
const NONCE: usize = 24;
const TAG: usize = 16;
const INNER_HEAD: usize = 8 + 16 + 16 + 16;

/// What sealing adds to a body from `member`, in bytes.
pub(crate) fn overhead(member: &MemberId) -> usize {
    2 + member.as_str().len() + NONCE + INNER_HEAD + TAG
}

/// Why a fleet message was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// Larger than the limit, refused before it was read.
    #[error("fleet message larger than the limit")]
    TooLarge,
    /// Not sealed by a holder of the fleet key for this subject and
    /// sender, or not a fleet message of this version at all.
    #[error("fleet message not sealed with the fleet key")]
    Forged,
    /// Sent longer ago (or further ahead) than the window allows, or meant
    /// for another incarnation of the receiver (sent before it restarted).
    #[error("fleet message outside the replay window or for an earlier incarnation")]
    Stale,
    /// Its message id was already seen within the window.
    #[error("fleet message replayed")]
    Replayed,
    /// Sealed in the layout of another version of dk (a member of another
    /// version during an upgrade), so not read.
    #[error("fleet message of another version of dk")]
    OtherVersion,
}

/// A message opened and verified: who sealed it, in which incarnation,
/// for which incarnation, when, and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    pub(crate) from: MemberId,
    pub(crate) from_incarnation: Incarnation,
    /// The receiver's incarnation the sender meant, or `None` for any.
    pub(crate) to_incarnation: Option<Incarnation>,
    pub(crate) sent_ms: u64,
    pub(crate) id: [u8; 16],
    pub(crate) body: Vec<u8>,
}

/// Who seals, as which incarnation, for which.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sender<'a> {
    pub(crate) member: &'a MemberId,
    pub(crate) incarnation: Incarnation,
    pub(crate) to: Option<Incarnation>,
}

/// Seals and opens fleet messages under the sealing key.
pub(crate) struct Sealer {
    cipher: XChaCha20Poly1305,
}

impl Sealer {
    pub(crate) fn new(key: &[u8; 32]) -> Sealer {
        Sealer {
            cipher: XChaCha20Poly1305::new(&(*key).into()),
        }
    }

    /// `body` sealed by `sender` for `subject`, sent at `sent_ms`, at most
    /// `limit` bytes in all.
    pub(crate) fn seal(
        &self,
        subject: &str,
        sender: Sender<'_>,
        sent_ms: u64,
        body: &[u8],
        limit: usize,
    ) -> Result<Vec<u8>, SealError> {
        let member = sender.member.as_str().as_bytes();
        let total = overhead(sender.member) + body.len();
        if total > limit.min(MAX_MESSAGE) {
            return Err(SealError::TooLarge);
        }
        let mut nonce = [0u8; NONCE];
        let mut id = [0u8; 16];
        let mut rng = rand::rng();
        rng.fill(&mut nonce);
        rng.fill(&mut id);
        let mut inner = Vec::with_capacity(INNER_HEAD + body.len() + TAG);
        inner.extend_from_slice(&sent_ms.to_be_bytes());
        inner.extend_from_slice(&id);
        inner.extend_from_slice(&sender.incarnation.to_bytes());
        inner.extend_from_slice(&sender.to.map_or([0; 16], Incarnation::to_bytes));
        inner.extend_from_slice(body);
        let aad = associated(subject, member);
        let sealed = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
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
            // A layout number dk has used or may use: a member of another
            // version. Anything else is not a fleet message at all.
            return Err(if (1..16).contains(&version) {
                SealError::OtherVersion
            } else {
                SealError::Forged
            });
        }
        let (member, rest) = rest
            .split_at_checked(usize::from(len))
            .ok_or(SealError::Forged)?;
        let (nonce, sealed) = rest.split_first_chunk::<NONCE>().ok_or(SealError::Forged)?;
        let from = std::str::from_utf8(member)
            .ok()
            .and_then(|m| MemberId::new(m).ok())
            .ok_or(SealError::Forged)?;
        let aad = associated(subject, member);
        let mut inner = self
            .cipher
            .decrypt(
                &XNonce::from(*nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Forged)?;
        let head: [u8; INNER_HEAD] = inner
            .get(..INNER_HEAD)
            .and_then(|h| h.try_into().ok())
            .ok_or(SealError::Forged)?;
        let (sent, head) = head.split_at(8);
        let (id, head) = head.split_at(16);
        let (from_incarnation, to_incarnation) = head.split_at(16);
        let sent_ms = u64::from_be_bytes(sent.try_into().map_err(|_| SealError::Forged)?);
        let id: [u8; 16] = id.try_into().map_err(|_| SealError::Forged)?;
        let from_incarnation =
            Incarnation::from_slice(from_incarnation).ok_or(SealError::Forged)?;
        let to_incarnation = Incarnation::from_slice(to_incarnation);
        // The body in place, without a copy.
        inner.drain(..INNER_HEAD);
        Ok(Opened {
            from,
            from_incarnation,
            to_incarnation,
            sent_ms,
            id,
            body: inner,
        })
    }
}

/// The associated data: a label, the subject and the sender, each with its
/// length, so no two pairs give the same bytes.
fn associated(subject: &str, member: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(16 + subject.len() + member.len());
    aad.extend_from_slice(b"dk-fleet/2");
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

/// How wide one bucket of [`Replays`] is, in milliseconds.
const BUCKET_MS: u64 = 1000;

/// The message ids seen within the window, in buckets of one second of
/// their sending time: a message costs one hash lookup and insert, and a
/// bucket leaves whole once every message it could hold is stale. Nothing
/// is dropped for lack of room: memory follows the rate of messages.
pub(crate) struct Replays {
    window_ms: u64,
    buckets: HashMap<u64, HashSet<[u8; 16]>>,
    /// The lowest bucket that may still hold a fresh message.
    floor: u64,
}

impl Replays {
    pub(crate) fn new(window: Duration) -> Replays {
        Replays {
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            buckets: HashMap::new(),
            floor: 0,
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
        let oldest = now_ms.saturating_sub(self.window_ms);
        if sent_ms < oldest || sent_ms > now_ms.saturating_add(self.window_ms) {
            return Err(SealError::Stale);
        }
        let floor = oldest / BUCKET_MS;
        if floor > self.floor {
            // At most one bucket per second of the window and as many
            // ahead: a short walk, once a second.
            self.buckets.retain(|bucket, _| *bucket >= floor);
            self.floor = floor;
        }
        if self
            .buckets
            .entry(sent_ms / BUCKET_MS)
            .or_default()
            .insert(id)
        {
            Ok(())
        } else {
            Err(SealError::Replayed)
        }
    }

    /// How many ids are remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.buckets.values().map(HashSet::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> MemberId {
        MemberId::new(name).unwrap()
    }

    fn from(member: &MemberId) -> Sender<'_> {
        Sender {
            member,
            incarnation: Incarnation::from_parts(7, 9),
            to: None,
        }
    }

    #[test]
    fn a_sealed_message_opens_only_where_it_was_sealed_for() {
        let sealer = Sealer::new(&[1; 32]);
        let a = member("a");
        let to = Incarnation::from_parts(3, 4);
        let sealed = sealer
            .seal(
                "dk.fleet.event",
                Sender {
                    to: Some(to),
                    ..from(&a)
                },
                5,
                b"hello",
                MAX_MESSAGE,
            )
            .unwrap();
        let opened = sealer.open("dk.fleet.event", &sealed).unwrap();
        assert_eq!(
            (
                opened.from,
                opened.from_incarnation,
                opened.to_incarnation,
                opened.sent_ms,
                opened.body
            ),
            (
                member("a"),
                Incarnation::from_parts(7, 9),
                Some(to),
                5,
                b"hello".to_vec()
            )
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
        // A message for any incarnation says so.
        let any = sealer
            .seal("s", from(&a), 5, b"x", MAX_MESSAGE)
            .and_then(|s| sealer.open("s", &s))
            .unwrap();
        assert_eq!(any.to_incarnation, None);
    }

    #[test]
    fn malformed_and_large_messages_are_refused() {
        let sealer = Sealer::new(&[1; 32]);
        for bytes in [
            &b""[..],
            &[2],
            &[2, 200],
            &[0, 1, b'a'],
            &[2, 1, b'a', 0, 0],
        ] {
            assert_eq!(sealer.open("s", bytes), Err(SealError::Forged));
        }
        // The previous layout, or a later one: not read, and said so.
        assert_eq!(
            sealer.open("s", &[1, 1, b'a']),
            Err(SealError::OtherVersion)
        );
        assert_eq!(
            sealer.open("s", &vec![2; MAX_MESSAGE + 1]),
            Err(SealError::TooLarge)
        );
        let a = member("a");
        // The limit counts the whole sealed message.
        let limit = 1000;
        let fits = limit - overhead(&a);
        let sealed = sealer
            .seal("s", from(&a), 0, &vec![0; fits], limit)
            .unwrap();
        assert_eq!(sealed.len(), limit);
        assert_eq!(
            sealer.seal("s", from(&a), 0, &vec![0; fits + 1], limit),
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
        // A message sent ahead is remembered until it is stale too.
        assert_eq!(replays.accept([6; 16], now + 29_000, now), Ok(()));
        assert_eq!(
            replays.accept([6; 16], now + 29_000, now + 58_000),
            Err(SealError::Replayed)
        );
        // Once out of the window, ids are forgotten and the message is stale.
        assert_eq!(replays.accept([5; 16], now + 40_000, now + 40_000), Ok(()));
        assert_eq!(replays.remembered(), 2);
        assert_eq!(
            replays.accept([1; 16], now, now + 40_000),
            Err(SealError::Stale)
        );
    }

    #[test]
    fn no_fresh_message_is_dropped_at_any_rate() {
        // Half a million distinct messages within one window (more than the
        // old cap of 262,144): every one taken, every repeat refused.
        let mut replays = Replays::new(Duration::from_secs(30));
        let start = 5_000_000;
        for n in 0u64..500_000 {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&n.to_be_bytes());
            let at = start + n / 20;
            assert_eq!(replays.accept(id, at, at), Ok(()), "message {n}");
        }
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&499_999u64.to_be_bytes());
        let at = start + 499_999 / 20;
        assert_eq!(replays.accept(id, at, at), Err(SealError::Replayed));
        // Buckets leave as the window moves on: memory follows the rate.
        let later = at + 61_000;
        assert_eq!(replays.accept([9; 16], later, later), Ok(()));
        assert_eq!(replays.remembered(), 1);
    }
}
