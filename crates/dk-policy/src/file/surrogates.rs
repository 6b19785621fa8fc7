//! JSON-style surrogate-pair escapes (`"\ud83d\udca1"`) in double-quoted YAML strings, read as the one character they mean.
//!
//! YAML 1.2 reads JSON, and a JSON encoder writes a character outside the
//! Basic Multilingual Plane as two `\u` escapes, a high surrogate
//! (`D800`-`DBFF`) then a low one (`DC00`-`DFFF`). The YAML reader refuses
//! each half as an invalid escape, so before the text reaches it every such
//! pair inside a double-quoted scalar is rewritten as the one `\UXXXXXXXX`
//! escape of the same character. Nothing else changes: comments, plain,
//! single-quoted and block scalars, and `\\u` (an escaped backslash then a
//! `u`) are left as they are. A surrogate escape that is not part of a
//! pair is refused with its line and column.
//!
//! The rewrite is two characters shorter per pair, so positions the reader
//! reports on such a line are mapped back to the original text with
//! [`Prepared::original`] and [`Prepared::message`].
//!
//! Where a double-quoted scalar starts is judged cautiously: when unsure
//! (plain scalars and their continuation lines, block scalars) the text is
//! left alone, so a pair there is refused by the reader as before and a
//! value is never changed.

use std::borrow::Cow;

use crate::error::{Location, PolicyError};

/// The text to hand to the YAML reader, and how to map its positions back.
#[derive(Debug)]
pub(crate) struct Prepared<'t> {
    text: Cow<'t, str>,
    /// `(line, column in the rewritten text just past the replacement)`,
    /// in file order; each replacement is [`SHRINK`] characters shorter.
    shifts: Vec<(usize, usize)>,
}

/// How many characters shorter `\UXXXXXXXX` (10) is than `\uXXXX\uXXXX` (12).
const SHRINK: usize = 2;

impl Prepared<'_> {
    /// The text for the YAML reader.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The position in the original text of a position in [`Self::text`].
    pub(crate) fn original(&self, at: Location) -> Location {
        let before = self
            .shifts
            .iter()
            .filter(|&&(line, end)| line == at.line && end <= at.column)
            .count();
        Location {
            line: at.line,
            column: at.column + before * SHRINK,
        }
    }

    /// `message` with every `line N column M` in it mapped back to the original text.
    pub(crate) fn message(&self, message: &str) -> String {
        if self.shifts.is_empty() {
            return message.to_owned();
        }
        let mut out = String::with_capacity(message.len());
        let mut rest = message;
        while let Some(found) = rest.find("line ") {
            let (head, tail) = rest.split_at(found);
            out.push_str(head);
            match parse_position(tail) {
                Some((at, used)) => {
                    let at = self.original(at);
                    out.push_str(&format!("line {} column {}", at.line, at.column));
                    rest = tail.get(used..).unwrap_or("");
                }
                None => {
                    out.push_str("line ");
                    rest = tail.get("line ".len()..).unwrap_or("");
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// Reads `line N column M` at the start of `text`: the position and its length.
fn parse_position(text: &str) -> Option<(Location, usize)> {
    let after_line = text.strip_prefix("line ")?;
    let line_digits = after_line.bytes().take_while(u8::is_ascii_digit).count();
    let line = after_line.get(..line_digits)?.parse().ok()?;
    let after_column = after_line.get(line_digits..)?.strip_prefix(" column ")?;
    let column_digits = after_column.bytes().take_while(u8::is_ascii_digit).count();
    let column = after_column.get(..column_digits)?.parse().ok()?;
    let used = text.len() - after_column.len() + column_digits;
    Some((Location { line, column }, used))
}

/// Where the scan is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Where a node may start.
    Start,
    /// Just after a quoted scalar or a closing bracket.
    After,
    /// Inside a plain scalar.
    Plain,
    /// Inside a comment, or a part of a line taken as is (a directive, a
    /// block scalar's header, something not understood), up to the line end.
    Rest,
    /// Inside a double-quoted scalar.
    Double,
    /// Inside a single-quoted scalar.
    Single,
}

/// What the previous line leaves for the lines after it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// Nothing: a new line starts a node.
    None,
    /// Lines indented more than this continue a plain scalar.
    Plain(usize),
    /// Lines indented more than this (or blank) belong to a block scalar.
    Block(usize),
}

/// Rewrites the surrogate pairs of double-quoted scalars in `text`; refuses a lone surrogate escape.
pub(crate) fn prepare(text: &str) -> Result<Prepared<'_>, PolicyError> {
    if !text.contains("\\u") {
        return Ok(Prepared {
            text: Cow::Borrowed(text),
            shifts: Vec::new(),
        });
    }
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut out = String::with_capacity(text.len());
    let mut shifts = Vec::new();
    let mut state = State::Start;
    let mut carry = Carry::None;
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut column = 1usize;
    let mut line_start = true;
    let mut indent = 0usize;
    // Characters removed so far on this line.
    let mut shrunk = 0usize;
    let mut i = 0usize;
    if at(0) == Some('\u{feff}') {
        out.push('\u{feff}');
        i = 1;
    }
    while let Some(c) = at(i) {
        if c == '\n' || c == '\r' {
            out.push(c);
            if c == '\r' && at(i + 1) == Some('\n') {
                out.push('\n');
                i += 1;
            }
            i += 1;
            line += 1;
            column = 1;
            shrunk = 0;
            line_start = true;
            state = match state {
                State::Double | State::Single => state,
                State::Plain if depth > 0 => State::Plain,
                State::Plain => {
                    if carry == Carry::None {
                        carry = Carry::Plain(indent);
                    }
                    State::Start
                }
                _ => State::Start,
            };
            continue;
        }
        let first_of_line = std::mem::take(&mut line_start);
        if first_of_line && !matches!(state, State::Double | State::Single) {
            let spaces = chars
                .get(i..)
                .unwrap_or(&[])
                .iter()
                .take_while(|&&c| c == ' ')
                .count();
            let first = at(i + spaces);
            let empty = chars
                .get(i + spaces..)
                .unwrap_or(&[])
                .iter()
                .find(|&&c| !matches!(c, ' ' | '\t'))
                .is_none_or(|&c| matches!(c, '\n' | '\r'));
            indent = spaces;
            match carry {
                Carry::Block(n) if empty || spaces > n => state = State::Rest,
                Carry::Plain(_) if empty => {}
                Carry::Plain(n) if spaces > n && first != Some('#') => state = State::Plain,
                Carry::None => {}
                Carry::Block(_) | Carry::Plain(_) => carry = Carry::None,
            }
            if carry == Carry::None && spaces == 0 {
                let three: String = chars.get(i..i + 3).unwrap_or(&[]).iter().collect();
                let spaced = matches!(at(i + 3), None | Some(' ' | '\t' | '\n' | '\r'));
                if c == '%' {
                    state = State::Rest;
                } else if (three == "---" || three == "...") && spaced {
                    push_n(&mut out, &chars, i, 3);
                    i += 3;
                    column += 3;
                    state = State::Start;
                    continue;
                }
            }
        }
        let next = at(i + 1);
        let spaced_next = matches!(next, None | Some(' ' | '\t' | '\n' | '\r'));
        match state {
            State::Rest => {}
            State::Start => match c {
                ' ' | '\t' => {}
                '"' => state = State::Double,
                '\'' => state = State::Single,
                '#' => state = State::Rest,
                '|' | '>' => {
                    carry = Carry::Block(indent);
                    state = State::Rest;
                }
                '[' | '{' => depth += 1,
                ']' | '}' => {
                    depth = depth.saturating_sub(1);
                    state = State::After;
                }
                ',' if depth > 0 => {}
                '-' | '?' | ':' if spaced_next => {}
                '&' | '!' | '*' => {
                    let len = chars
                        .get(i..)
                        .unwrap_or(&[])
                        .iter()
                        .take_while(|&&c| {
                            !matches!(c, ' ' | '\t' | '\n' | '\r' | ',' | '[' | ']' | '{' | '}')
                        })
                        .count();
                    push_n(&mut out, &chars, i, len);
                    i += len;
                    column += len;
                    state = if c == '*' { State::After } else { State::Start };
                    continue;
                }
                _ => state = State::Plain,
            },
            State::After => match c {
                ' ' | '\t' => {}
                '#' => state = State::Rest,
                ':' | ',' => state = State::Start,
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => state = State::Rest,
            },
            State::Plain => match c {
                ' ' | '\t' if next == Some('#') => state = State::Rest,
                ':' if spaced_next || (depth > 0 && matches!(next, Some(',' | ']' | '}'))) => {
                    state = State::Start;
                }
                ',' if depth > 0 => state = State::Start,
                ']' | '}' if depth > 0 => {
                    depth -= 1;
                    state = State::After;
                }
                _ => {}
            },
            State::Single => {
                if c == '\'' {
                    if next == Some('\'') {
                        out.push_str("''");
                        i += 2;
                        column += 2;
                        continue;
                    }
                    state = State::After;
                }
            }
            State::Double => match c {
                '"' => state = State::After,
                '\\' if next == Some('u') => {
                    let here = Location { line, column };
                    let Some(high) = hex4(&chars, i + 2) else {
                        // Not four hex digits: the reader reports it.
                        out.push_str("\\u");
                        i += 2;
                        column += 2;
                        continue;
                    };
                    if (0xDC00..=0xDFFF).contains(&high) {
                        return Err(lone(high, here));
                    }
                    if (0xD800..=0xDBFF).contains(&high) {
                        let low = if at(i + 6) == Some('\\') && at(i + 7) == Some('u') {
                            hex4(&chars, i + 8)
                        } else {
                            None
                        };
                        let Some(low) = low.filter(|low| (0xDC00..=0xDFFF).contains(low)) else {
                            return Err(lone(high, here));
                        };
                        let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
                        out.push_str(&format!("\\U{code:08X}"));
                        shifts.push((line, column - shrunk + 10));
                        shrunk += SHRINK;
                        i += 12;
                        column += 12;
                        continue;
                    }
                    push_n(&mut out, &chars, i, 6);
                    i += 6;
                    column += 6;
                    continue;
                }
                '\\' => {
                    // Any other escape, `\\` and `\"` among them: keep both characters.
                    if let Some(n) = next.filter(|n| !matches!(n, '\n' | '\r')) {
                        out.push(c);
                        out.push(n);
                        i += 2;
                        column += 2;
                        continue;
                    }
                }
                _ => {}
            },
        }
        out.push(c);
        i += 1;
        column += 1;
    }
    if shifts.is_empty() {
        return Ok(Prepared {
            text: Cow::Borrowed(text),
            shifts,
        });
    }
    Ok(Prepared {
        text: Cow::Owned(out),
        shifts,
    })
}

/// Appends `len` characters of `chars` from `from`.
fn push_n(out: &mut String, chars: &[char], from: usize, len: usize) {
    out.extend(chars.get(from..from.saturating_add(len)).unwrap_or(&[]));
}

/// The value of four hex digits at `from`, if they are there.
fn hex4(chars: &[char], from: usize) -> Option<u32> {
    let digits = chars.get(from..from.checked_add(4)?)?;
    digits
        .iter()
        .try_fold(0u32, |value, c| Some(value * 16 + c.to_digit(16)?))
}

/// The error for a surrogate escape that is not part of a pair.
fn lone(code: u32, at: Location) -> PolicyError {
    let mut error = PolicyError::file(format!(
        "invalid yaml: lone surrogate escape `\\u{code:04x}` in a double-quoted string (a pair is a `\\ud800`-`\\udbff` escape then a `\\udc00`-`\\udfff` one)"
    ));
    error.location = Some(at);
    error
}

#[cfg(test)]
mod tests {
    //! The rewrite, case by case: what changes, what is left alone, what is refused.

    use super::*;

    /// The rewritten text, or the refusal's message, line and column.
    type Expected = Result<&'static str, (&'static str, usize, usize)>;

    /// `input` must become `expected` (`Ok`), or be refused with this message at this line and column.
    #[track_caller]
    fn check(input: &str, expected: Expected) {
        match (prepare(input), expected) {
            (Ok(prepared), Ok(text)) => assert_eq!(prepared.text(), text, "{input}"),
            (Err(error), Err((message, line, column))) => {
                assert_eq!(error.message, message, "{input}");
                assert_eq!(error.location, Some(Location { line, column }), "{input}");
            }
            (got, want) => panic!("{input}\ngot {got:?}\nwanted {want:?}"),
        }
    }

    const LONE_D83D: &str = "invalid yaml: lone surrogate escape `\\ud83d` in a double-quoted string (a pair is a `\\ud800`-`\\udbff` escape then a `\\udc00`-`\\udfff` one)";
    const LONE_DCA1: &str = "invalid yaml: lone surrogate escape `\\udca1` in a double-quoted string (a pair is a `\\ud800`-`\\udbff` escape then a `\\udc00`-`\\udfff` one)";

    #[test]
    fn rewrites() {
        let cases: &[(&str, Expected)] = &[
            // Pairs in double-quoted scalars become one escape.
            (r#"a: "\ud83d\udca1""#, Ok(r#"a: "\U0001F4A1""#)),
            (r#"a: "x\uD83D\uDCA1y""#, Ok(r#"a: "x\U0001F4A1y""#)),
            (
                r#"a: "\ud800\udc00\udbff\udfff""#,
                Ok(r#"a: "\U00010000\U0010FFFF""#),
            ),
            (r#"{"a": ["\ud83d\udca1"]}"#, Ok(r#"{"a": ["\U0001F4A1"]}"#)),
            (
                r#"{"\ud83d\udca1":"\ud83d\udca1"}"#,
                Ok(r#"{"\U0001F4A1":"\U0001F4A1"}"#),
            ),
            ("- \"a\n  \\ud83d\\udca1\"", Ok("- \"a\n  \\U0001F4A1\"")),
            (r#"a: !t "\ud83d\udca1""#, Ok(r#"a: !t "\U0001F4A1""#)),
            (r#"a: &x "\ud83d\udca1""#, Ok(r#"a: &x "\U0001F4A1""#)),
            (r#"a: "\"\ud83d\udca1""#, Ok(r#"a: "\"\U0001F4A1""#)),
            (
                "a: 'x'\nb: \"\\ud83d\\udca1\"",
                Ok("a: 'x'\nb: \"\\U0001F4A1\""),
            ),
            (
                "a: |\n  x\nb: \"\\ud83d\\udca1\"",
                Ok("a: |\n  x\nb: \"\\U0001F4A1\""),
            ),
            // Other escapes stay as written.
            (r#"a: "\u00e9 \x41""#, Ok(r#"a: "\u00e9 \x41""#)),
            // An escaped backslash then `u` is no escape.
            (r#"a: "\\ud83d\\udca1""#, Ok(r#"a: "\\ud83d\\udca1""#)),
            (r#"a: "\\\ud83d\udca1""#, Ok(r#"a: "\\\U0001F4A1""#)),
            // Single-quoted, plain and block scalars and comments are left alone.
            (r"a: '\ud83d\udca1'", Ok(r"a: '\ud83d\udca1'")),
            (r"a: 'it''s \ud83d'", Ok(r"a: 'it''s \ud83d'")),
            (r"a: \ud83d\udca1", Ok(r"a: \ud83d\udca1")),
            (r#"a: say "\ud83d\udca1""#, Ok(r#"a: say "\ud83d\udca1""#)),
            ("a: x\n  \"\\ud83d\"", Ok("a: x\n  \"\\ud83d\"")),
            (r#"a: 1 # "\ud83d\udca1""#, Ok(r#"a: 1 # "\ud83d\udca1""#)),
            (r#"# "\ud83d""#, Ok(r#"# "\ud83d""#)),
            ("a: |\n  \"\\ud83d\"\n", Ok("a: |\n  \"\\ud83d\"\n")),
            (
                "a: >-\n  \"\\ud83d\"\n\n  \"\\udca1\"\n",
                Ok("a: >-\n  \"\\ud83d\"\n\n  \"\\udca1\"\n"),
            ),
            (
                "  a: |\n    x\n  \t\n    \"\\ud83d\"\n",
                Ok("  a: |\n    x\n  \t\n    \"\\ud83d\"\n"),
            ),
            // A lone surrogate is refused where it is written.
            (r#"a: "\ud83d""#, Err((LONE_D83D, 1, 5))),
            (r#"a: "\ud83dx""#, Err((LONE_D83D, 1, 5))),
            (r#"a: "\ud83d\ud83d""#, Err((LONE_D83D, 1, 5))),
            ("a: 1\nb: \"é\\udca1\"", Err((LONE_DCA1, 2, 6))),
            ("a: \"\\ud83d\\udca1 \\ud83d\"", Err((LONE_D83D, 1, 18))),
        ];
        for (input, expected) in cases {
            check(input, *expected);
        }
    }

    #[test]
    fn positions_map_back() {
        let prepared = match prepare("a: \"\\ud83d\\udca1\\ud83d\\udca1x\"\nb: c") {
            Ok(prepared) => prepared,
            Err(error) => panic!("{error:?}"),
        };
        assert_eq!(prepared.text(), "a: \"\\U0001F4A1\\U0001F4A1x\"\nb: c");
        // (line, column in the rewritten text, column in the original)
        let cases = [
            (1, 1, 1),
            (1, 5, 5),
            (1, 14, 14),
            (1, 15, 17),
            (1, 25, 29),
            (1, 26, 30),
            (2, 4, 4),
        ];
        for (line, column, original) in cases {
            let got = prepared.original(Location { line, column });
            assert_eq!(
                got,
                Location {
                    line,
                    column: original
                },
                "{line}:{column}"
            );
        }
        assert_eq!(
            prepared
                .message("bad at line 1 column 26, while parsing at line 1 column 4 and line 2"),
            "bad at line 1 column 30, while parsing at line 1 column 4 and line 2"
        );
    }
}

#[cfg(test)]
mod load_tests {
    //! Rule files with surrogate pairs, read end to end.

    use std::path::PathBuf;

    use super::super::{load_path, load_str};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/policies")
            .join(name)
    }

    #[test]
    fn escaped_and_literal_emoji_load_the_same_rules() {
        let escaped = load_path(&fixture("good/emoji-escaped.yaml"))
            .unwrap()
            .rules;
        let literal = load_path(&fixture("good/emoji-literal.yaml"))
            .unwrap()
            .rules;
        assert_eq!(format!("{escaped:?}"), format!("{literal:?}"));
        assert_eq!(escaped[0].message(), "No 💡 today é");
        assert_eq!(
            escaped[0].condition_text(),
            "deviceId equals idea-lamp and agentId equals owl-💡"
        );
    }

    /// Errors after a rewritten pair still point at the original text.
    #[test]
    fn errors_keep_their_place() {
        let cases: &[(&str, &str)] = &[
            // The reader's own error, after two pairs on its line.
            (
                "version: 1\npolicies:\n  - {name: \"\\ud83d\\udca1\\ud83d\\udca1\", action: [x}\n",
                "line 3 column 50: invalid yaml: did not find expected ',' or ']' at line 3 column 50, while parsing a flow sequence at line 3 column 48",
            ),
            // A checker error located after a pair on its line.
            (
                "version: 1\npolicies:\n  - {name: \"\\ud83d\\udca1\", action: device_use, decision: maybe, message: m, condition: 'agentId equals a'}\n",
                "line 3 column 58: policies[0] `💡`: `decision` must be block, require_approval or allow, found `maybe`",
            ),
        ];
        for (text, expected) in cases {
            let error = load_str(text).unwrap_err();
            assert_eq!(error.to_string(), *expected, "{text}");
        }
    }
}
