//! Lower-case hex of 32-byte values, as keys, commitments and nonces are
//! written on the wire and in files.

use alloc::string::String;

use data_encoding::HEXLOWER;

/// The 64 lower-case hex digits of 32 bytes.
pub fn to_hex32(bytes: &[u8; 32]) -> String {
    HEXLOWER.encode(bytes)
}

/// The 32 bytes written as exactly 64 lower-case hex digits; anything else
/// (upper case, a sign, white space, another length) is `None`.
pub fn from_hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    // HEXLOWER decodes lower-case digits only.
    HEXLOWER.decode(text.as_bytes()).ok()?.try_into().ok()
}
