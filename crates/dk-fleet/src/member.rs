//! `MemberId`: a member's name in the fleet, safe as one token of a NATS
//! subject.

use std::fmt;

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
}
