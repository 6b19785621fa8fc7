//! Lower-case hex, as the audit chain and its key write hashes.

use std::fmt::Write;

/// Lower-case hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}
