//! `MemberId`: a member's name in the fleet, safe as one token of a NATS
//! subject; `Incarnation`: one run of a member, new at every start.

use std::fmt;

use rand::RngExt;

/// Longest member id, in bytes.
pub const MAX_MEMBER_ID: usize = 64;

/// A member's id: 1 to 64 ASCII letters, digits, `-` or `_`, so it is one
/// token of a NATS subject and never a wildcard.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(String);

/// Why a text is not a member id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a member id: 1 to 64 ASCII letters, digits, `-` or `_`")]
pub struct BadMemberId(pub String);

impl MemberId {
    /// The id `text` names, or why it cannot be one.
    pub fn new(text: &str) -> Result<MemberId, BadMemberId> {
        let fits = !text.is_empty()
            && text.len() <= MAX_MEMBER_ID
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if fits {
            Ok(MemberId(text.to_owned()))
        } else {
            Err(BadMemberId(text.chars().take(MAX_MEMBER_ID + 1).collect()))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for MemberId {
    type Err = BadMemberId;
    fn from_str(text: &str) -> Result<MemberId, BadMemberId> {
        MemberId::new(text)
    }
}

/// One run of a member: chosen when it joins, never the same twice. The
/// high half is the time it started (milliseconds since the Unix epoch),
/// the low half random, so a later start compares greater (clocks that
/// go back aside) and two starts in the same millisecond still differ.
/// Messages meant for one incarnation are refused by any other, so nothing
/// said to a member before it restarted reaches it afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation(u128);

impl Incarnation {
    /// A new incarnation, started now.
    pub(crate) fn new() -> Incarnation {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let random: u64 = rand::rng().random();
        Incarnation::from_parts(started, random.max(1))
    }

    /// The incarnation started at `started_ms` with the random part `random`.
    pub(crate) fn from_parts(started_ms: u64, random: u64) -> Incarnation {
        Incarnation((u128::from(started_ms) << 64) | u128::from(random))
    }

    /// The incarnation in 16 bytes (big-endian); never all zero.
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The incarnation `bytes` hold, or `None` for sixteen zeros (no
    /// incarnation) or a slice of another length.
    pub(crate) fn from_slice(bytes: &[u8]) -> Option<Incarnation> {
        let bytes: [u8; 16] = bytes.try_into().ok()?;
        let value = u128::from_be_bytes(bytes);
        (value != 0).then_some(Incarnation(value))
    }

    /// When this incarnation started, in milliseconds since the Unix epoch.
    pub fn started_ms(self) -> u64 {
        u64::try_from(self.0 >> 64).unwrap_or(u64::MAX)
    }
}

/// 32 lower-case hex digits.
impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for Incarnation {
    type Err = BadIncarnation;
    fn from_str(text: &str) -> Result<Incarnation, BadIncarnation> {
        if text.len() != 32 {
            return Err(BadIncarnation);
        }
        let value = u128::from_str_radix(text, 16).map_err(|_| BadIncarnation)?;
        if value == 0 || text.bytes().any(|b| b.is_ascii_uppercase() || b == b'+') {
            return Err(BadIncarnation);
        }
        Ok(Incarnation(value))
    }
}

/// Why a text is not an incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not an incarnation: 32 lower-case hex digits, not all zero")]
pub struct BadIncarnation;

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(text: &str, fits: bool) {
        assert_eq!(MemberId::new(text).is_ok(), fits, "{text:?}");
    }

    #[test]
    fn ids() {
        check("vessel-1", true);
        check("A_b-9", true);
        check("", false);
        check("a.b", false);
        check("a*", false);
        check(">", false);
        check("a b", false);
        check(&"x".repeat(64), true);
        check(&"x".repeat(65), false);
    }

    #[test]
    fn incarnations_differ_order_by_start_and_read_back() {
        let (a, b) = (Incarnation::new(), Incarnation::new());
        assert_ne!(a, b);
        assert!(Incarnation::from_parts(2, 0) > Incarnation::from_parts(1, u64::MAX));
        assert_eq!(Incarnation::from_slice(&a.to_bytes()), Some(a));
        assert_eq!(Incarnation::from_slice(&[0; 16]), None);
        assert_eq!(Incarnation::from_slice(&[1; 15]), None);
        assert_eq!(a.to_string().parse(), Ok(a));
        assert_eq!(Incarnation::from_parts(5, 1).started_ms(), 5);
        for bad in ["", "0", &"0".repeat(32), &"A".repeat(32), &"g".repeat(32)] {
            assert_eq!(bad.parse::<Incarnation>(), Err(BadIncarnation), "{bad}");
        }
    }
}
