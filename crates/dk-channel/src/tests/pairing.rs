//! The pairing math beyond the vectors: hex as the wire writes it, fresh
//! nonces, a commitment that binds every bit, codes always six digits.

use std::format;

use super::fresh_bytes;
use crate::{code_number, commitment, commitment_holds, from_hex32, pairing_code, to_hex32};

#[track_caller]
fn check_hex(text: &str, expected: Option<[u8; 32]>) {
    assert_eq!(from_hex32(text), expected, "{text:?}");
}

#[test]
fn hex_is_exactly_64_lower_case_digits() {
    let bytes: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37));
    let hex = to_hex32(&bytes);
    assert_eq!(hex.len(), 64);
    check_hex(&hex, Some(bytes));
    check_hex(&"0".repeat(64), Some([0; 32]));
    check_hex(&"f".repeat(64), Some([0xff; 32]));
    check_hex(&"F".repeat(64), None);
    check_hex(&format!("{}A", &hex[..63]), None);
    check_hex(&hex[..63], None);
    check_hex(&format!("{hex}0"), None);
    check_hex(&format!("{hex}00"), None);
    check_hex(&format!("0x{}", &hex[..62]), None);
    check_hex(&format!(" {}", &hex[..63]), None);
    check_hex(&format!("{}\n", &hex[..63]), None);
    check_hex(&format!("+{}", &hex[..63]), None);
    check_hex(&format!("{}é", &hex[..62]), None);
    check_hex("", None);
}

#[test]
fn nonces_are_fresh() {
    let a = fresh_bytes();
    let b = fresh_bytes();
    assert_ne!(a, b);
}

#[test]
fn the_commitment_binds_every_bit() {
    let nv = fresh_bytes();
    let h = fresh_bytes();
    let committed = commitment(&nv, &h);
    assert!(commitment_holds(&committed, &nv, &h));
    for bit in 0..256 {
        let mut other = nv;
        other[bit / 8] ^= 1 << (bit % 8);
        assert!(!commitment_holds(&committed, &other, &h), "nv bit {bit}");
        let mut other = h;
        other[bit / 8] ^= 1 << (bit % 8);
        assert!(!commitment_holds(&committed, &nv, &other), "h bit {bit}");
        let mut other = committed;
        other[bit / 8] ^= 1 << (bit % 8);
        assert!(!commitment_holds(&other, &nv, &h), "commitment bit {bit}");
    }
    // Nv and h are not interchangeable.
    assert!(!commitment_holds(&committed, &h, &nv));
}

#[test]
fn codes_depend_on_every_input_and_keep_their_zeros() {
    let h = [1; 32];
    let nd = [2; 32];
    let nv = [3; 32];
    let code = pairing_code(&h, &nd, &nv);
    assert_eq!(code.len(), 6);
    assert_eq!(
        code,
        format!("{:06}", code_number(&h, &nd, &nv) % 1_000_000)
    );
    assert_ne!(code_number(&h, &nd, &nv), code_number(&h, &nv, &nd));
    assert_ne!(code_number(&h, &nd, &nv), code_number(&nd, &h, &nv));
}
