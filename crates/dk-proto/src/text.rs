//! Text rules shared by manifests and inputs: UTF-16 lengths, JavaScript's
//! notion of blank, the characters a device may never put in text, and
//! validated text written as a JSON string.

mod categories;

use alloc::format;
use alloc::string::String;

use categories::UNSAFE_CATEGORIES;

/// Length of `s` in UTF-16 code units, the unit 8DK's limits are counted in
/// (an emoji outside the Basic Multilingual Plane counts 2).
pub fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        return s.len();
    }
    s.chars().map(char::len_utf16).sum()
}

/// Unicode's Default_Ignorable_Code_Point property (DerivedCoreProperties.txt,
/// Unicode 16.0), as inclusive ranges in order: code points a renderer shows
/// as nothing at all when it does not support them. Soft hyphen, joiners,
/// directional marks, fillers, variation selectors, the tag block, and the
/// code points reserved for more of the same.
pub(crate) const DEFAULT_IGNORABLE: [(char, char); 17] = [
    ('\u{00AD}', '\u{00AD}'),
    ('\u{034F}', '\u{034F}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180B}', '\u{180F}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FE00}', '\u{FE0F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF0}', '\u{FFF8}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0000}', '\u{E0FFF}'),
];

/// Characters that are not Default_Ignorable but still print as an empty
/// cell: U+2800 BRAILLE PATTERN BLANK, a symbol that looks like a space and
/// is not one.
const BLANK_SYMBOLS: [char; 1] = ['\u{2800}'];

/// True for a code point in [`DEFAULT_IGNORABLE`].
fn is_default_ignorable(c: char) -> bool {
    DEFAULT_IGNORABLE
        .binary_search_by(|&(first, last)| {
            if last < c {
                core::cmp::Ordering::Less
            } else if first > c {
                core::cmp::Ordering::Greater
            } else {
                core::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// True for a code point of Unicode 16.0 in general category Cc, Cf, Zl,
/// Zp or Cn ([`UNSAFE_CATEGORIES`]).
fn in_unsafe_category(c: char) -> bool {
    let n = u32::from(c);
    UNSAFE_CATEGORIES
        .binary_search_by(|&(first, last)| {
            if last < n {
                core::cmp::Ordering::Less
            } else if first > n {
                core::cmp::Ordering::Greater
            } else {
                core::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// True for one of Unicode's 66 noncharacters: U+FDD0 to U+FDEF and the last
/// two code points of every plane (U+FFFE, U+FFFF, U+1FFFE, ... U+10FFFF).
/// They are also unassigned (Cn); the rule is spelled out so that it holds
/// whatever the Unicode version of the category table.
fn is_noncharacter(c: char) -> bool {
    let n = u32::from(c);
    (0xFDD0..=0xFDEF).contains(&n) || n & 0xFFFE == 0xFFFE
}

/// True for a character that device-supplied text may not contain, 8DK's
/// "control, escape, invisible or bidirectional" read in full: Unicode
/// general categories Cc (controls), Cf (format: zero-width and directional
/// marks, bidi embeddings, overrides and isolates, the tag block, soft
/// hyphen), Zl and Zp (line and paragraph separators) and Cn (unassigned in
/// Unicode 16.0: a code point no font draws yet), every Default_Ignorable
/// code point (`DEFAULT_IGNORABLE`: fillers, variation selectors and the
/// like that render as nothing), the 66 noncharacters, and U+2800 (braille
/// blank).
pub fn is_unsafe_char(c: char) -> bool {
    if (' '..='~').contains(&c) {
        return false;
    }
    in_unsafe_category(c)
        || is_default_ignorable(c)
        || is_noncharacter(c)
        || BLANK_SYMBOLS.contains(&c)
}

/// True when `s` contains a character refused by [`is_unsafe_char`].
pub(crate) fn has_unsafe_char(s: &str) -> bool {
    // Printable ASCII is always safe: only other bytes need the table.
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return false;
    }
    s.chars().any(is_unsafe_char)
}

/// JavaScript's white space, as `\s` and `String.prototype.trim` see it:
/// WhiteSpace plus LineTerminator of ECMAScript. It differs from Rust's
/// [`char::is_whitespace`] (JavaScript counts U+FEFF and not U+0085), and
/// blankness and trimming must match 8DK's and 8gent's. The one table of it
/// in dk: the rule language of dk-policy trims and splits with it too.
pub fn is_js_whitespace(c: char) -> bool {
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

/// Appends `s` as a JSON string, escaping `"` and `\\` (validated text has
/// no control characters, the only other characters JSON escapes).
pub(crate) fn write_json_str(out: &mut String, s: &str) {
    out.push('"');
    if s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push(c),
            }
        }
    } else {
        out.push_str(s);
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicode_general_category::{GeneralCategory, get_general_category};

    #[test]
    fn the_category_ranges_are_unicode_general_categorys_table() {
        assert_eq!(unicode_general_category::UNICODE_VERSION, (16, 0, 0));
        for pair in UNSAFE_CATEGORIES.windows(2) {
            assert!(pair[0].1 + 1 < pair[1].0, "sorted and apart: {pair:?}");
        }
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let listed = matches!(
                get_general_category(c),
                GeneralCategory::Control
                    | GeneralCategory::Format
                    | GeneralCategory::LineSeparator
                    | GeneralCategory::ParagraphSeparator
                    | GeneralCategory::Unassigned
            );
            assert_eq!(in_unsafe_category(c), listed, "U+{:04X}", u32::from(c));
        }
    }

    #[track_caller]
    fn check_unsafe(c: char, unsafe_expected: bool) {
        assert_eq!(is_unsafe_char(c), unsafe_expected, "U+{:04X}", c as u32);
    }

    #[test]
    fn unsafe_characters_by_class() {
        for c in [
            // Cc
            '\n',
            '\t',
            '\u{1B}',
            '\u{7F}',
            '\u{85}',
            '\u{9B}',
            // Cf
            '\u{AD}',
            '\u{061C}',
            '\u{180E}',
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{200E}',
            '\u{200F}',
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
            // Zl, Zp
            '\u{2028}',
            '\u{2029}',
            // Default_Ignorable letters and marks
            '\u{034F}',
            '\u{115F}',
            '\u{1160}',
            '\u{17B4}',
            '\u{17B5}',
            '\u{180B}',
            '\u{180C}',
            '\u{180D}',
            '\u{180F}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{FE00}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{E01EF}',
            // Default_Ignorable and unassigned
            '\u{2065}',
            '\u{FFF0}',
            '\u{FFF8}',
            '\u{E0000}',
            '\u{E0002}',
            '\u{E0080}',
            '\u{E01F0}',
            '\u{E0FFF}',
            // noncharacters
            '\u{FDD0}',
            '\u{FDEF}',
            '\u{FFFE}',
            '\u{FFFF}',
            '\u{1FFFE}',
            '\u{10FFFF}',
            // unassigned
            '\u{0378}',
            '\u{2B74}',
            '\u{E1000}',
            '\u{3FFFD}',
            // braille blank
            '\u{2800}',
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
            // Neighbours of the refused ranges.
            '\u{17B3}',
            '\u{17B6}',
            '\u{180A}',
            '\u{1810}',
            '\u{FDCF}',
            '\u{FDF0}',
            '\u{FFFD}',
            '\u{2801}',
            '\u{27FF}',
            // Private use is assigned (Co): its glyph is the font's business.
            '\u{E000}',
            '\u{10FFFD}',
        ] {
            check_unsafe(c, false);
        }
    }

    /// The Default_Ignorable_Code_Point lines of Unicode 16.0's
    /// DerivedCoreProperties.txt, verbatim but for the names.
    const DERIVED_CORE_PROPERTIES: &str = "\
00AD          ; Default_Ignorable_Code_Point # Cf
034F          ; Default_Ignorable_Code_Point # Mn
061C          ; Default_Ignorable_Code_Point # Cf
115F..1160    ; Default_Ignorable_Code_Point # Lo   [2]
17B4..17B5    ; Default_Ignorable_Code_Point # Mn   [2]
180B..180D    ; Default_Ignorable_Code_Point # Mn   [3]
180E          ; Default_Ignorable_Code_Point # Cf
180F          ; Default_Ignorable_Code_Point # Mn
200B..200F    ; Default_Ignorable_Code_Point # Cf   [5]
202A..202E    ; Default_Ignorable_Code_Point # Cf   [5]
2060..2064    ; Default_Ignorable_Code_Point # Cf   [5]
2065          ; Default_Ignorable_Code_Point # Cn
2066..206F    ; Default_Ignorable_Code_Point # Cf  [10]
3164          ; Default_Ignorable_Code_Point # Lo
FE00..FE0F    ; Default_Ignorable_Code_Point # Mn  [16]
FEFF          ; Default_Ignorable_Code_Point # Cf
FFA0          ; Default_Ignorable_Code_Point # Lo
FFF0..FFF8    ; Default_Ignorable_Code_Point # Cn   [9]
1BCA0..1BCA3  ; Default_Ignorable_Code_Point # Cf   [4]
1D173..1D17A  ; Default_Ignorable_Code_Point # Cf   [8]
E0000         ; Default_Ignorable_Code_Point # Cn
E0001         ; Default_Ignorable_Code_Point # Cf
E0002..E001F  ; Default_Ignorable_Code_Point # Cn  [30]
E0020..E007F  ; Default_Ignorable_Code_Point # Cf  [96]
E0080..E00FF  ; Default_Ignorable_Code_Point # Cn [128]
E0100..E01EF  ; Default_Ignorable_Code_Point # Mn [240]
E01F0..E0FFF  ; Default_Ignorable_Code_Point # Cn [3600]
";

    /// `(first, last, general category)` of each line above.
    fn derived_lines() -> Vec<(u32, u32, &'static str)> {
        DERIVED_CORE_PROPERTIES
            .lines()
            .map(|line| {
                let (range, rest) = line.split_once(';').unwrap();
                let category = rest.split('#').nth(1).unwrap().split_whitespace().next();
                let (first, last) = range
                    .trim()
                    .split_once("..")
                    .unwrap_or((range.trim(), range.trim()));
                let hex = |h: &str| u32::from_str_radix(h, 16).unwrap();
                (hex(first), hex(last), category.unwrap())
            })
            .collect()
    }

    #[test]
    fn the_default_ignorable_table_is_unicodes() {
        // The table merges adjacent lines of the file into one range.
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (first, last, _) in derived_lines() {
            match merged.last_mut() {
                Some(previous) if previous.1 + 1 == first => previous.1 = last,
                _ => merged.push((first, last)),
            }
        }
        let table: Vec<(u32, u32)> = DEFAULT_IGNORABLE
            .iter()
            .map(|&(first, last)| (u32::from(first), u32::from(last)))
            .collect();
        assert_eq!(table, merged);
        let total: u32 = table.iter().map(|(first, last)| last - first + 1).sum();
        assert_eq!(total, 4174, "the file's total");
        // Sorted and apart, so the binary search finds every range.
        for pair in table.windows(2) {
            assert!(pair[0].1 + 1 < pair[1].0, "{pair:?}");
        }
        // Each line's category agrees with the category table in use, and
        // every code point of the property is found by the search and refused.
        assert_eq!(unicode_general_category::UNICODE_VERSION, (16, 0, 0));
        for (first, last, category) in derived_lines() {
            for n in first..=last {
                let c = char::from_u32(n).unwrap();
                assert_eq!(
                    get_general_category(c).abbreviation(),
                    category,
                    "U+{n:04X}"
                );
                assert!(is_default_ignorable(c), "U+{n:04X}");
                check_unsafe(c, true);
            }
            for n in [first - 1, last + 1] {
                let c = char::from_u32(n).unwrap();
                let listed = table.iter().any(|&(f, l)| (f..=l).contains(&n));
                assert_eq!(is_default_ignorable(c), listed, "U+{n:04X}");
            }
        }
    }

    #[test]
    fn noncharacters_are_the_66_and_all_unassigned() {
        let all: Vec<u32> = (0..=0x10FFFF)
            .filter_map(char::from_u32)
            .filter(|&c| is_noncharacter(c))
            .map(u32::from)
            .collect();
        assert_eq!(all.len(), 66);
        for n in all {
            let c = char::from_u32(n).unwrap();
            assert_eq!(
                get_general_category(c),
                GeneralCategory::Unassigned,
                "U+{n:04X}"
            );
            check_unsafe(c, true);
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
