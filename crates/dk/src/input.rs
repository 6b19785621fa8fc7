//! Reading the files the commands are given, with a size cap, and printing
//! untrusted text safely on a terminal.

use std::io::Read;
use std::path::Path;

/// Largest file a command reads (4 MiB).
pub const MAX_INPUT_BYTES: u64 = 4 << 20;

/// Reads `path` as UTF-8 text, or standard input when `path` is `-`.
pub fn read_text(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin()
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(format!("`{shown}` is larger than {MAX_INPUT_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| format!("`{shown}` is not UTF-8 text"))
}

/// Most characters [`printable`] shows of one text, escapes counted as
/// they are shown. The longest text a device or an agent can put in one
/// field (an input string of 1,000 UTF-16 units, every one escaped by JSON,
/// quotes included) fits; past this the text is cut, and the cut says how
/// much was left out.
pub const MAX_SHOWN: usize = 2048;

/// True for a character [`printable`] shows as a `\u{..}` escape: every
/// character dk-proto refuses in device text (controls, escapes, invisible,
/// bidirectional, unassigned, noncharacters, the braille blank), any white
/// space but the plain space (no-break, ideographic, em and other spaces a
/// terminal draws as blank cells), and private-use characters (drawn as
/// whatever a font puts there).
fn shown_escaped(c: char) -> bool {
    c != ' '
        && (c.is_whitespace()
            || dk_proto::is_unsafe_char(c)
            || matches!(
                c,
                '\u{E000}'..='\u{F8FF}' | '\u{F0000}'..='\u{FFFFD}' | '\u{100000}'..='\u{10FFFD}'
            ))
}

/// `text` made safe to show on one line of a terminal, so that what the
/// person reads is what is there: every unusual character (see
/// [`shown_escaped`]) shown as a visible `\u{..}` escape, so printing it
/// cannot drive the terminal or hide anything; every run of spaces shown as
/// one space, so text cannot pad itself onto what looks like a line of its
/// own; and at most [`MAX_SHOWN`] characters, then `… (N more characters)`.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_SHOWN));
    let mut shown = 0;
    let mut after_space = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == ' ' && after_space {
            continue;
        }
        after_space = c == ' ';
        let escape = shown_escaped(c).then(|| c.escape_unicode());
        let width = escape.as_ref().map_or(1, ExactSizeIterator::len);
        if shown + width > MAX_SHOWN {
            let more = 1 + chars.count();
            let unit = if more == 1 { "character" } else { "characters" };
            out.push_str(&format!("… ({more} more {unit})"));
            break;
        }
        shown += width;
        match escape {
            Some(escape) => out.extend(escape),
            None => out.push(c),
        }
    }
    out
}

/// Prints `value` as one line of JSON on standard output.
pub fn print_json(value: &serde_json::Value) {
    match serde_json::to_string(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: {e}"),
    }
}

/// When `at_ms` (milliseconds since the Unix epoch) was, from now: `paired 5
/// minutes ago` style text.
pub fn ago(at_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let seconds = now.saturating_sub(at_ms) / 1000;
    match seconds {
        0..=119 => format!("paired {seconds} seconds ago"),
        120..=7199 => format!("paired {} minutes ago", seconds / 60),
        7200..=172_799 => format!("paired {} hours ago", seconds / 3600),
        _ => format!("paired {} days ago", seconds / 86_400),
    }
}

/// How a channel reads in a prompt or a listing.
pub(crate) fn channel_words(channel: dk_proto::Channel) -> &'static str {
    match channel {
        dk_proto::Channel::Dk2 => "encrypted (dk/2)",
        dk_proto::Channel::V1 => "NOT encrypted (v1)",
    }
}

/// Who asks for an approval: the agent and its session, when the request
/// names them.
pub(crate) fn asker(agent: Option<&str>, session: Option<&str>) -> String {
    let agent = agent.map_or_else(
        || "no agent (the vessel's own host or the admin API)".to_owned(),
        |a| format!("agent {}", printable(a)),
    );
    match session {
        Some(session) => format!("{agent}, session {}", printable(session)),
        None => format!("{agent}, no session"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_naturally() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert_eq!(ago(now), "paired 0 seconds ago");
        assert_eq!(ago(now - 300_000), "paired 5 minutes ago");
        assert_eq!(ago(now - 3 * 3_600_000), "paired 3 hours ago");
        assert_eq!(ago(now - 4 * 86_400_000), "paired 4 days ago");
        assert_eq!(ago(now + 10_000), "paired 0 seconds ago");
    }

    #[track_caller]
    fn check(text: &str, expected: &str) {
        assert_eq!(printable(text), expected, "{text:?}");
    }

    #[test]
    fn printable_shows_what_is_there_on_one_line() {
        // Ordinary text, international text included, is shown as it is.
        check("Desk lamp", "Desk lamp");
        check("Küche 😀 台灯 “quoted” a\\b", "Küche 😀 台灯 “quoted” a\\b");
        check("", "");
        // What a terminal would act on.
        check("a\u{1b}[2Jb", "a\\u{1b}[2Jb");
        check("a\nb\r\nc\td", "a\\u{a}b\\u{d}\\u{a}c\\u{9}d");
        check("a\u{7f}\u{9b}b", "a\\u{7f}\\u{9b}b");
        check("a\u{2028}b\u{2029}c\u{85}", "a\\u{2028}b\\u{2029}c\\u{85}");
        // Bidirectional and invisible characters.
        check("abc\u{202e}def", "abc\\u{202e}def");
        check("a\u{200b}\u{2066}b", "a\\u{200b}\\u{2066}b");
        check("a\u{e0041}b", "a\\u{e0041}b");
        // Every Default_Ignorable code point, noncharacters, unassigned.
        check("a\u{17b4}\u{17b5}b", "a\\u{17b4}\\u{17b5}b");
        check("a\u{180b}\u{180f}b", "a\\u{180b}\\u{180f}b");
        check("a\u{fff0}\u{fff8}b", "a\\u{fff0}\\u{fff8}b");
        check("a\u{e0000}\u{e0fff}b", "a\\u{e0000}\\u{e0fff}b");
        check("a\u{3164}\u{fe0f}b", "a\\u{3164}\\u{fe0f}b");
        check(
            "a\u{fdd0}\u{fffe}\u{10ffff}b",
            "a\\u{fdd0}\\u{fffe}\\u{10ffff}b",
        );
        check("a\u{378}b", "a\\u{378}b");
        // Blank-looking characters: the braille blank and every white space
        // but the plain space.
        check("a\u{2800}b", "a\\u{2800}b");
        check("a\u{a0}b", "a\\u{a0}b");
        check("a\u{3000}\u{3000}b", "a\\u{3000}\\u{3000}b");
        check(
            "a\u{2003}\u{2009}\u{202f}\u{205f}\u{1680}b",
            "a\\u{2003}\\u{2009}\\u{202f}\\u{205f}\\u{1680}b",
        );
        // Private use: whatever a font draws.
        check(
            "a\u{e000}\u{f8ff}\u{10fffd}b",
            "a\\u{e000}\\u{f8ff}\\u{10fffd}b",
        );
        // Runs of spaces collapse to one, wherever they are.
        check("a    b", "a b");
        check("  a  b  ", " a b ");
        check(
            &format!("Read the lamp.{}[2] unlock_door", " ".repeat(60)),
            "Read the lamp. [2] unlock_door",
        );
        check("a \u{3000} b", "a \\u{3000} b");
    }

    #[test]
    fn printable_cuts_a_long_line_and_says_so() {
        let at_cap = "x".repeat(MAX_SHOWN);
        check(&at_cap, &at_cap);
        check(
            &format!("{at_cap}y"),
            &format!("{at_cap}… (1 more character)"),
        );
        check(
            &format!("{at_cap}yz"),
            &format!("{at_cap}… (2 more characters)"),
        );
        // Collapsed spaces do not count towards the cap.
        let spaced = format!("{}{}", " ".repeat(5000), "x".repeat(MAX_SHOWN - 1));
        check(&spaced, &format!(" {}", "x".repeat(MAX_SHOWN - 1)));
        // An escape is never split: it is shown whole or not at all.
        let short = "x".repeat(MAX_SHOWN - 8);
        check(&format!("{short}\u{2800}"), &format!("{short}\\u{{2800}}"));
        let shorter = "x".repeat(MAX_SHOWN - 7);
        check(
            &format!("{shorter}\u{2800}z"),
            &format!("{shorter}… (2 more characters)"),
        );
        // A device's 4 MiB of escapes costs one line.
        let whole = MAX_SHOWN / "\\u{1b}".len();
        check(
            &"\u{1b}".repeat(4 << 20),
            &format!(
                "{}… ({} more characters)",
                "\\u{1b}".repeat(whole),
                (4 << 20) - whole
            ),
        );
    }
}
