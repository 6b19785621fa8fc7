//! Text rules shared by manifests and inputs: UTF-16 lengths, JavaScript's
//! notion of blank, and the characters a device may never put in text.

use unicode_general_category::{GeneralCategory, get_general_category};

/// Length of `s` in UTF-16 code units, the unit 8DK's limits are counted in
/// (an emoji outside the Basic Multilingual Plane counts 2).
pub fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        return s.len();
    }
    s.chars().map(char::len_utf16).sum()
}

/// True for a character that device-supplied text may not contain: Unicode
/// general categories Cc (controls), Cf (format: zero-width and directional
/// marks, bidi embeddings, overrides and isolates, the tag block, soft hyphen),
/// Zl and Zp (line and paragraph separators), plus the fillers and variation
/// selectors that render as nothing (U+034F, U+115F, U+1160, U+3164, U+FFA0,
/// U+FE00 to U+FE0F, U+E0100 to U+E01EF).
pub fn is_unsafe_char(c: char) -> bool {
    if (' '..='~').contains(&c) {
        return false;
    }
    matches!(
        c,
        '\u{034F}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{3164}'
            | '\u{FFA0}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{E0100}'..='\u{E01EF}'
    ) || matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// True when `s` contains a character refused by [`is_unsafe_char`].
pub(crate) fn has_unsafe_char(s: &str) -> bool {
    // Printable ASCII is always safe: only other bytes need the table.
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return false;
    }
    s.chars().any(is_unsafe_char)
}

/// JavaScript's `String.prototype.trim` white space: WhiteSpace plus
/// LineTerminator of ECMAScript. It differs from Rust's `char::is_whitespace`
/// (JavaScript counts U+FEFF and not U+0085), and blankness must match 8DK's.
fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// True when `s` is empty once JavaScript's `trim` has run.
pub(crate) fn is_js_blank(s: &str) -> bool {
    s.chars().all(is_js_whitespace)
}

/// The first `max` UTF-16 code units of `s`, as JavaScript's `slice(0, max)`
/// gives them. Where the cut would split a surrogate pair, JavaScript keeps a
/// lone surrogate, which a Rust string cannot hold: the half character is
/// dropped instead.
pub(crate) fn utf16_prefix(s: &str, max: usize) -> &str {
    let mut units = 0;
    for (at, c) in s.char_indices() {
        units += c.len_utf16();
        if units > max {
            return s.get(..at).unwrap_or(s);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_unsafe(c: char, unsafe_expected: bool) {
        assert_eq!(is_unsafe_char(c), unsafe_expected, "U+{:04X}", c as u32);
    }

    #[test]
    fn unsafe_characters_by_class() {
        for c in [
            '\n',
            '\t',
            '\u{1B}',
            '\u{7F}',
            '\u{85}',
            '\u{9B}',
            '\u{AD}',
            '\u{061C}',
            '\u{180E}',
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{200E}',
            '\u{200F}',
            '\u{2028}',
            '\u{2029}',
            '\u{202A}',
            '\u{202E}',
            '\u{2060}',
            '\u{2066}',
            '\u{2069}',
            '\u{FEFF}',
            '\u{FFF9}',
            '\u{FFFB}',
            '\u{E0001}',
            '\u{E0041}',
            '\u{E007F}',
            '\u{034F}',
            '\u{115F}',
            '\u{1160}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{FE00}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{E01EF}',
        ] {
            check_unsafe(c, true);
        }
        for c in [
            'a',
            ' ',
            '~',
            'é',
            '\u{201C}',
            '\u{4E2D}',
            '\u{D55C}',
            '\u{A0}',
            '\u{1F600}',
            '-',
            '\u{3000}',
        ] {
            check_unsafe(c, false);
        }
    }

    #[test]
    fn lengths_and_blanks() {
        assert_eq!(utf16_len("abc"), 3);
        assert_eq!(utf16_len("\u{1F600}"), 2);
        assert_eq!(utf16_len("é"), 1);
        assert!(is_js_blank(" \u{FEFF}\u{A0}\u{3000}"));
        assert!(!is_js_blank("\u{85}"));
        assert!(is_js_blank(""));
        assert_eq!(utf16_prefix("ab\u{1F600}c", 3), "ab");
        assert_eq!(utf16_prefix("ab\u{1F600}c", 4), "ab\u{1F600}");
        assert_eq!(utf16_prefix("abc", 64), "abc");
    }
}
