//! Lower-case hex, as dk writes hashes, keys, tokens and random names:
//! two digits a byte, read back from lower-case digits only.

use data_encoding::HEXLOWER;

/// The lower-case hex of `bytes`, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    HEXLOWER.encode(bytes)
}

/// The bytes written as lower-case hex digits, two a byte; anything else
/// (upper case, a sign, white space, an odd length) is `None`.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    HEXLOWER.decode(text.as_bytes()).ok()
}

/// The 32 bytes written as exactly 64 lower-case hex digits (a SHA-256, a
/// key); anything else is `None`.
pub fn decode32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    decode(text)?.try_into().ok()
}

/// `bytes` random bytes from the operating system's generator, as hex: a
/// name nobody can guess (a temporary file's, a token's).
pub fn random(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    rand::fill(&mut buffer[..]);
    encode(&buffer)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{decode, decode32, encode, random};

    #[test]
    fn every_byte_is_two_lower_case_digits_as_format_writes_them() {
        let bytes: Vec<u8> = (0..=255).collect();
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(encode(&bytes), expected);
        assert_eq!(encode(&[]), "");
        assert_eq!(decode(&expected), Some(bytes));
    }

    #[test]
    fn only_lower_case_digits_read_back() {
        for text in ["AB", "0", "+f", " 0f", "0f ", "0g", "-1"] {
            assert_eq!(decode(text), None, "{text:?}");
        }
        assert_eq!(decode(""), Some(Vec::new()));
        let hash = "ab".repeat(32);
        assert_eq!(decode32(&hash), Some([0xab; 32]));
        assert_eq!(decode32(&"ab".repeat(31)), None);
        assert_eq!(decode32(&"ab".repeat(33)), None);
        assert_eq!(decode32(&"AB".repeat(32)), None);
    }

    #[test]
    fn random_names_are_hex_of_their_length_and_differ() {
        let one = random(8);
        assert_eq!(one.len(), 16);
        assert!(decode(&one).is_some());
        assert_ne!(one, random(8));
    }

    proptest! {
        #[test]
        fn hex_reads_back(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            prop_assert_eq!(decode(&encode(&bytes)), Some(bytes));
        }
    }
}
