//! Lower-case hex, as the audit chain and its key write hashes.

/// Lower-case hex of bytes: two digits a byte, computed rather than
/// formatted (the audit writer hexes a hash for every entry).
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        out.push(digit(byte >> 4));
        out.push(digit(byte));
    }
    out
}

/// The lower-case hex digit of the low four bits of `nibble`.
fn digit(nibble: u8) -> char {
    let value = nibble & 0x0f;
    char::from(if value < 10 {
        b'0' + value
    } else {
        b'a' + (value - 10)
    })
}

#[cfg(test)]
mod tests {
    use super::hex;

    #[test]
    fn every_byte_is_two_lower_case_digits_as_format_writes_them() {
        let bytes: Vec<u8> = (0..=255).collect();
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&bytes), expected);
        assert_eq!(hex(&[]), "");
    }
}
