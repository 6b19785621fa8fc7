//! Case-insensitive comparison as 8gent does it, without allocating.
//!
//! 8gent lower-cases both sides with JavaScript's `toLowerCase()` and then
//! compares. Here the rule's side is lower-cased once at load with
//! [`str::to_lowercase`], and the context's side is lower-cased on the fly,
//! one `char` at a time, so evaluation allocates nothing.
//!
//! Differences from JavaScript, all outside what device ids and capability
//! names can hold:
//! - `str::to_lowercase` and `toLowerCase()` both apply the Unicode
//!   Final_Sigma rule (a word-final `Σ` becomes `ς`). The char-wise mapping
//!   cannot see context, so a context value containing `Σ` takes a slow path
//!   that allocates and uses `str::to_lowercase`: the result is the same.
//! - The case tables are those of the Unicode version of the Rust standard
//!   library, which may differ from the ICU version of a given Node.js for
//!   characters added in between.
//! - JavaScript strings may hold lone surrogates; Rust strings cannot, so the
//!   question does not arise.

use std::char::ToLowercase;
use std::iter::FlatMap;
use std::str::Chars;

use dk_proto::is_js_whitespace;

type LowerChars<'a> = FlatMap<Chars<'a>, ToLowercase, fn(char) -> ToLowercase>;

fn lower_chars(s: &str) -> LowerChars<'_> {
    s.chars()
        .flat_map(char::to_lowercase as fn(char) -> ToLowercase)
}

/// The one character whose lower case depends on its neighbours.
fn needs_context(s: &str) -> bool {
    s.contains('\u{3A3}')
}

/// `s.trim()` as JavaScript trims.
pub(crate) fn js_trim(s: &str) -> &str {
    s.trim_matches(is_js_whitespace)
}

/// `hay.toLowerCase() === lowered`, where `lowered` is already lower case.
pub(crate) fn equals(hay: &str, lowered: &str) -> bool {
    if hay.is_ascii() {
        return hay.len() == lowered.len()
            && hay
                .bytes()
                .zip(lowered.bytes())
                .all(|(h, n)| h.to_ascii_lowercase() == n);
    }
    if needs_context(hay) {
        return hay.to_lowercase() == lowered;
    }
    lower_chars(hay).eq(lowered.chars())
}

/// `hay.toLowerCase().startsWith(lowered)`.
pub(crate) fn starts_with(hay: &str, lowered: &str) -> bool {
    if hay.is_ascii() {
        let mut h = hay.bytes();
        return lowered
            .bytes()
            .all(|n| h.next().map(|b| b.to_ascii_lowercase()) == Some(n));
    }
    if needs_context(hay) {
        return hay.to_lowercase().starts_with(lowered);
    }
    let mut h = lower_chars(hay);
    lowered.chars().all(|n| h.next() == Some(n))
}

/// `hay.toLowerCase().endsWith(lowered)`.
pub(crate) fn ends_with(hay: &str, lowered: &str) -> bool {
    if hay.is_ascii() {
        let mut h = hay.bytes().rev();
        return lowered
            .bytes()
            .rev()
            .all(|n| h.next().map(|b| b.to_ascii_lowercase()) == Some(n));
    }
    if needs_context(hay) {
        return hay.to_lowercase().ends_with(lowered);
    }
    let mut h = hay.chars().rev().flat_map(|c| c.to_lowercase().rev());
    lowered.chars().rev().all(|n| h.next() == Some(n))
}

/// `hay.toLowerCase().includes(lowered)`.
pub(crate) fn contains(hay: &str, lowered: &str) -> bool {
    if lowered.is_empty() {
        return true;
    }
    if hay.is_ascii() {
        if !lowered.is_ascii() {
            return false;
        }
        let needle = lowered.as_bytes();
        return hay.as_bytes().windows(needle.len()).any(|window| {
            window
                .iter()
                .zip(needle)
                .all(|(h, n)| h.to_ascii_lowercase() == *n)
        });
    }
    if needs_context(hay) {
        return hay.to_lowercase().contains(lowered);
    }
    let mut start = lower_chars(hay);
    loop {
        let mut probe = start.clone();
        if lowered.chars().all(|n| probe.next() == Some(n)) {
            return true;
        }
        if start.next().is_none() {
            return false;
        }
    }
}

/// Feeds `s` lower-cased into `hasher`, with both sigmas folded to `σ`, so
/// that two strings equal after JavaScript lower-casing always hash alike
/// (the index may then hold a few extra candidates, never miss one).
pub(crate) fn hash_folded(s: &str, hasher: &mut impl std::hash::Hasher) {
    let mut buf = [0u8; 64];
    let mut len = 0usize;
    if s.is_ascii() {
        for chunk in s.as_bytes().chunks(buf.len()) {
            for (slot, b) in buf.iter_mut().zip(chunk) {
                *slot = b.to_ascii_lowercase();
            }
            hasher.write(buf.get(..chunk.len()).unwrap_or_default());
        }
        hasher.write_u8(0xff);
        return;
    }
    for c in lower_chars(s) {
        let c = if c == '\u{3C2}' { '\u{3C3}' } else { c };
        let mut utf8 = [0u8; 4];
        let bytes = c.encode_utf8(&mut utf8).as_bytes();
        if len + bytes.len() > buf.len() {
            hasher.write(buf.get(..len).unwrap_or_default());
            len = 0;
        }
        for b in bytes {
            if let Some(slot) = buf.get_mut(len) {
                *slot = *b;
                len += 1;
            }
        }
    }
    hasher.write(buf.get(..len).unwrap_or_default());
    hasher.write_u8(0xff);
}
