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
        return Ok(Prepared::unchanged(text));
    }
    let chars: Vec<char> = text.chars().collect();
    let mut scan = Scan::new(&chars, text.len());
    scan.skip_byte_order_mark();
    while let Some(c) = scan.peek(0) {
        scan.step(c)?;
    }
    if scan.shifts.is_empty() {
        return Ok(Prepared::unchanged(text));
    }
    Ok(Prepared {
        text: Cow::Owned(scan.out),
        shifts: scan.shifts,
    })
}

impl<'t> Prepared<'t> {
    /// `text` as it is, with no positions to map.
    fn unchanged(text: &'t str) -> Self {
        Prepared {
            text: Cow::Borrowed(text),
            shifts: Vec::new(),
        }
    }
}

/// What a step did with the character it was at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing yet: the character is copied as it is.
    Copy,
    /// It already copied (or rewrote) what it read and moved past it.
    Done,
}

/// One scan through a text: where it is, what it has written, and what it
/// knows of the YAML around it.
struct Scan<'c> {
    chars: &'c [char],
    /// The index in `chars` of the character the scan is at.
    i: usize,
    /// The rewritten text so far.
    out: String,
    /// As in [`Prepared`].
    shifts: Vec<(usize, usize)>,
    state: State,
    carry: Carry,
    /// How many flow collections (`[`, `{`) are open.
    depth: usize,
    line: usize,
    column: usize,
    /// The next character is the first of its line.
    line_start: bool,
    /// The spaces before the first character of the current line.
    indent: usize,
    /// Characters removed so far on this line.
    shrunk: usize,
}

impl<'c> Scan<'c> {
    /// A scan at the start of `chars`, writing into room for `capacity` bytes.
    fn new(chars: &'c [char], capacity: usize) -> Self {
        Scan {
            chars,
            i: 0,
            out: String::with_capacity(capacity),
            shifts: Vec::new(),
            state: State::Start,
            carry: Carry::None,
            depth: 0,
            line: 1,
            column: 1,
            line_start: true,
            indent: 0,
            shrunk: 0,
        }
    }

    /// The character `ahead` places after the current one (0: the current one).
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    /// The characters from the current one to the end.
    fn rest(&self) -> &'c [char] {
        self.chars.get(self.i..).unwrap_or(&[])
    }

    /// Copies `len` characters as they are and moves past them.
    fn copy(&mut self, len: usize) {
        push_n(&mut self.out, self.chars, self.i, len);
        self.i += len;
        self.column += len;
    }

    /// Copies a leading byte order mark, which is no character of the first line.
    fn skip_byte_order_mark(&mut self) {
        if self.peek(0) == Some('\u{feff}') {
            self.out.push('\u{feff}');
            self.i = 1;
        }
    }

    /// Inside a quoted scalar, where line breaks and indentation mean nothing to the scan.
    fn quoted(&self) -> bool {
        matches!(self.state, State::Double | State::Single)
    }

    /// Reads the character `c` (the current one), and whatever it starts.
    fn step(&mut self, c: char) -> Result<(), PolicyError> {
        if c == '\n' || c == '\r' {
            self.end_line(c);
            return Ok(());
        }
        let first_of_line = std::mem::take(&mut self.line_start);
        if first_of_line && !self.quoted() && self.begin_line(c) == Step::Done {
            return Ok(());
        }
        let next = self.peek(1);
        let step = match self.state {
            State::Rest => Step::Copy,
            State::Start => self.node_start(c, next),
            State::After => {
                self.after_node(c);
                Step::Copy
            }
            State::Plain => {
                self.plain(c, next);
                Step::Copy
            }
            State::Single => self.single_quoted(c, next),
            State::Double => self.double_quoted(c, next)?,
        };
        if step == Step::Copy {
            self.copy(1);
        }
        Ok(())
    }

    /// At a line break: copies it (`\r\n` whole) and says what the next line starts in.
    fn end_line(&mut self, c: char) {
        let len = if c == '\r' && self.peek(1) == Some('\n') {
            2
        } else {
            1
        };
        self.copy(len);
        self.line += 1;
        self.column = 1;
        self.shrunk = 0;
        self.line_start = true;
        self.state = match self.state {
            State::Double | State::Single => self.state,
            State::Plain if self.depth > 0 => State::Plain,
            State::Plain => {
                if self.carry == Carry::None {
                    self.carry = Carry::Plain(self.indent);
                }
                State::Start
            }
            _ => State::Start,
        };
    }

    /// At the first character `c` of a line outside quotes: measures the
    /// indent, carries on or ends what earlier lines left, takes a
    /// directive as is and copies a document marker (`---`, `...`) whole.
    fn begin_line(&mut self, c: char) -> Step {
        self.indent = self.rest().iter().take_while(|&&c| c == ' ').count();
        self.carry_over();
        if self.carry == Carry::None && self.indent == 0 {
            if c == '%' {
                self.state = State::Rest;
            } else if self.at_document_marker() {
                self.copy(3);
                self.state = State::Start;
                return Step::Done;
            }
        }
        Step::Copy
    }

    /// Whether this line, after its indent, still belongs to the plain or
    /// block scalar the previous lines carry; if not, the carry ends.
    fn carry_over(&mut self) {
        let spaces = self.indent;
        let first = self.peek(spaces);
        let empty = self
            .rest()
            .get(spaces..)
            .unwrap_or(&[])
            .iter()
            .find(|&&c| !matches!(c, ' ' | '\t'))
            .is_none_or(|&c| matches!(c, '\n' | '\r'));
        match self.carry {
            Carry::Block(n) if empty || spaces > n => self.state = State::Rest,
            Carry::Plain(_) if empty => {}
            Carry::Plain(n) if spaces > n && first != Some('#') => self.state = State::Plain,
            Carry::None => {}
            Carry::Block(_) | Carry::Plain(_) => self.carry = Carry::None,
        }
    }

    /// At `---` or `...` followed by a blank or the end.
    fn at_document_marker(&self) -> bool {
        let three: String = self.rest().get(..3).unwrap_or(&[]).iter().collect();
        (three == "---" || three == "...") && blank_or_end(self.peek(3))
    }

    /// Where a node may start: what `c` (followed by `next`) starts.
    fn node_start(&mut self, c: char, next: Option<char>) -> Step {
        match c {
            ' ' | '\t' => {}
            '"' => self.state = State::Double,
            '\'' => self.state = State::Single,
            '#' => self.state = State::Rest,
            '|' | '>' => {
                self.carry = Carry::Block(self.indent);
                self.state = State::Rest;
            }
            '[' | '{' => self.depth += 1,
            ']' | '}' => {
                self.depth = self.depth.saturating_sub(1);
                self.state = State::After;
            }
            ',' if self.depth > 0 => {}
            '-' | '?' | ':' if blank_or_end(next) => {}
            '&' | '!' | '*' => return self.anchor_tag_or_alias(c),
            _ => self.state = State::Plain,
        }
        Step::Copy
    }

    /// Copies an anchor (`&`), a tag (`!`) or an alias (`*`) whole: a node
    /// may follow the first two, not the last.
    fn anchor_tag_or_alias(&mut self, c: char) -> Step {
        let len = self
            .rest()
            .iter()
            .take_while(|&&c| !matches!(c, ' ' | '\t' | '\n' | '\r' | ',' | '[' | ']' | '{' | '}'))
            .count();
        self.copy(len);
        self.state = if c == '*' { State::After } else { State::Start };
        Step::Done
    }

    /// Just after a quoted scalar or a closing bracket: what `c` leads to.
    fn after_node(&mut self, c: char) {
        match c {
            ' ' | '\t' => {}
            '#' => self.state = State::Rest,
            ':' | ',' => self.state = State::Start,
            ']' | '}' => self.depth = self.depth.saturating_sub(1),
            _ => self.state = State::Rest,
        }
    }

    /// Inside a plain scalar: whether `c` (followed by `next`) ends it.
    fn plain(&mut self, c: char, next: Option<char>) {
        match c {
            ' ' | '\t' if next == Some('#') => self.state = State::Rest,
            ':' if blank_or_end(next)
                || (self.depth > 0 && matches!(next, Some(',' | ']' | '}'))) =>
            {
                self.state = State::Start;
            }
            ',' if self.depth > 0 => self.state = State::Start,
            ']' | '}' if self.depth > 0 => {
                self.depth -= 1;
                self.state = State::After;
            }
            _ => {}
        }
    }

    /// Inside a single-quoted scalar: `''` is a quote, `'` its end.
    fn single_quoted(&mut self, c: char, next: Option<char>) -> Step {
        if c == '\'' {
            if next == Some('\'') {
                self.copy(2);
                return Step::Done;
            }
            self.state = State::After;
        }
        Step::Copy
    }

    /// Inside a double-quoted scalar: its end, and its escapes.
    fn double_quoted(&mut self, c: char, next: Option<char>) -> Result<Step, PolicyError> {
        match c {
            '"' => self.state = State::After,
            '\\' if next == Some('u') => {
                self.unicode_escape()?;
                return Ok(Step::Done);
            }
            // Any other escape, `\\` and `\"` among them: keep both characters.
            '\\' if next.is_some_and(|n| !matches!(n, '\n' | '\r')) => {
                self.copy(2);
                return Ok(Step::Done);
            }
            _ => {}
        }
        Ok(Step::Copy)
    }

    /// At a `\u` escape: rewrites a surrogate pair as one `\U` escape,
    /// refuses a lone surrogate, copies anything else.
    fn unicode_escape(&mut self) -> Result<(), PolicyError> {
        let here = Location {
            line: self.line,
            column: self.column,
        };
        let Some(high) = hex4(self.chars, self.i + 2) else {
            // Not four hex digits: the reader reports it.
            self.copy(2);
            return Ok(());
        };
        if (0xDC00..=0xDFFF).contains(&high) {
            return Err(lone(high, here));
        }
        if !(0xD800..=0xDBFF).contains(&high) {
            self.copy(6);
            return Ok(());
        }
        let low = if self.peek(6) == Some('\\') && self.peek(7) == Some('u') {
            hex4(self.chars, self.i + 8)
        } else {
            None
        };
        let Some(low) = low.filter(|low| (0xDC00..=0xDFFF).contains(low)) else {
            return Err(lone(high, here));
        };
        self.write_pair(high, low);
        Ok(())
    }

    /// Writes the surrogate pair `high`, `low` (12 characters) as one `\U`
    /// escape (10), and notes the shift.
    fn write_pair(&mut self, high: u32, low: u32) {
        let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
        self.out.push_str(&format!("\\U{code:08X}"));
        self.shifts
            .push((self.line, self.column - self.shrunk + 10));
        self.shrunk += SHRINK;
        self.i += 12;
        self.column += 12;
    }
}

/// A blank, a line break or the end: what ends a token.
fn blank_or_end(c: Option<char>) -> bool {
    matches!(c, None | Some(' ' | '\t' | '\n' | '\r'))
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
