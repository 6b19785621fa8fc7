//! Condition text to syntax tree with byte spans; nom lexes, a recursive descent builds.
//!
//! Where the grammar leaves room, the parser follows what 8gent's
//! regex splitting does on text without quotes or parentheses:
//! - a separator is a whitespace run, `and` or `or` (ASCII case-insensitive),
//!   and another whitespace run; `or` splits first, so in `a and or b` the
//!   `and` belongs to the value before the `or`;
//! - a bare value runs to the next separator, an unbalanced `)` or the end,
//!   and is trimmed;
//! - a word is a keyword only where a keyword can stand: `and equals x` is a
//!   clause on the field `and`, and `not` followed by an operator is a field.

use std::borrow::Cow;
use std::ops::Range;

use nom::bytes::complete::{take_till, take_while, take_while1};
use nom::{IResult, Parser as _};

use crate::error::ConditionError;
use dk_proto::is_js_whitespace;

/// How deep `not` and parentheses may nest. Deeper conditions are refused, so
/// no condition can exhaust the stack.
pub const MAX_NESTING: usize = 32;

/// At most this many errors are reported for one condition; past it the
/// parser stops.
pub(crate) const MAX_ERRORS: usize = 32;

type Lex<'a> = IResult<&'a str, &'a str, ()>;

fn spaces(input: &str) -> Lex<'_> {
    take_while(is_js_whitespace).parse(input)
}

fn spaces1(input: &str) -> Lex<'_> {
    take_while1(is_js_whitespace).parse(input)
}

pub(crate) fn is_field_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn word(input: &str) -> Lex<'_> {
    take_while1(is_field_char).parse(input)
}

/// A field name: a word, or words joined by `.` (only `input.<param>` is
/// then accepted, when the clause is checked).
fn field_name(input: &str) -> Lex<'_> {
    take_while1(|c| is_field_char(c) || c == '.').parse(input)
}

/// `>`, `>=`, `<`, `<=` (anything else made of these characters is read
/// whole and refused as an unknown operator).
fn symbol(input: &str) -> Lex<'_> {
    take_while1(|c| matches!(c, '<' | '>' | '=' | '!')).parse(input)
}

fn bare_item(input: &str) -> Lex<'_> {
    take_till(|c| c == ',' || c == ']').parse(input)
}

/// The operators a clause may name (before checking: `has_secret` parses so
/// that it can be refused with a clear message).
pub(crate) const OPERATORS: [&str; 10] = [
    "equals",
    "contains",
    "starts_with",
    "ends_with",
    "in",
    "has_secret",
    ">",
    ">=",
    "<",
    "<=",
];

pub(crate) fn is_operator(word: &str) -> bool {
    OPERATORS.iter().any(|op| op.eq_ignore_ascii_case(word))
}

/// A value as written: quoted (unescaped) or bare (trimmed).
#[derive(Debug)]
pub(crate) struct SynValue<'a> {
    pub(crate) text: Cow<'a, str>,
    pub(crate) span: Range<usize>,
    /// Written in quotes: always text, never a number or boolean.
    pub(crate) quoted: bool,
}

/// What follows the operator.
#[derive(Debug)]
pub(crate) enum SynRhs<'a> {
    /// A single value.
    Value(SynValue<'a>),
    /// `[ item, ... ]`, bare empty items already dropped.
    List(Vec<SynValue<'a>>),
    /// Nothing (the operator ended the clause).
    Nothing,
}

/// One `field operator value` clause.
#[derive(Debug)]
pub(crate) struct SynClause<'a> {
    pub(crate) field: &'a str,
    pub(crate) field_span: Range<usize>,
    pub(crate) op: &'a str,
    pub(crate) op_span: Range<usize>,
    pub(crate) rhs: SynRhs<'a>,
}

/// The syntax tree.
#[derive(Debug)]
pub(crate) enum Syn<'a> {
    Clause(SynClause<'a>),
    Not(Box<Syn<'a>>),
    And(Vec<Syn<'a>>),
    Or(Vec<Syn<'a>>),
    /// A piece that did not parse; its error is recorded.
    Error,
}

struct Descent<'a> {
    text: &'a str,
    pos: usize,
    end: usize,
    errors: Vec<ConditionError>,
    /// Set when parsing must stop (nesting too deep, too many errors).
    stop: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Keyword {
    And,
    Or,
}

impl Keyword {
    fn text(self) -> &'static str {
        match self {
            Keyword::And => "and",
            Keyword::Or => "or",
        }
    }
}

/// Parses `text` (already known to be non-empty once trimmed, and not too
/// long). `start..end` is the trimmed part.
pub(crate) fn parse(text: &str, start: usize, end: usize) -> (Syn<'_>, Vec<ConditionError>) {
    let mut parser = Descent {
        text,
        pos: start,
        end,
        errors: Vec::new(),
        stop: false,
    };
    let tree = parser.or(0);
    if !parser.stop && parser.pos < parser.end {
        let rest = parser.rest();
        let shown: String = rest.chars().take(20).collect();
        let message = if rest.starts_with(')') {
            "unmatched `)`".to_owned()
        } else {
            format!("unexpected `{shown}`")
        };
        parser.error(parser.pos..parser.end, message);
    }
    (tree, parser.errors)
}

impl<'a> Descent<'a> {
    fn rest(&self) -> &'a str {
        self.text.get(self.pos..self.end).unwrap_or("")
    }

    fn rest_from(&self, pos: usize) -> &'a str {
        self.text.get(pos..self.end).unwrap_or("")
    }

    /// Byte offset of a suffix of `self.text` (what a nom parser left).
    fn offset(&self, rest: &str) -> usize {
        self.end - rest.len()
    }

    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        if self.errors.len() >= MAX_ERRORS {
            self.stop = true;
            return;
        }
        self.errors.push(ConditionError::new(span, message));
    }

    fn skip_spaces(&mut self) {
        if let Ok((rest, _)) = spaces(self.rest()) {
            self.pos = self.offset(rest);
        }
    }

    fn or(&mut self, depth: usize) -> Syn<'a> {
        self.list(depth, Keyword::Or)
    }

    fn list(&mut self, depth: usize, keyword: Keyword) -> Syn<'a> {
        let mut items = vec![self.item(depth, keyword)];
        while !self.stop {
            let Some(after) = self.separator(self.pos, keyword) else {
                break;
            };
            self.pos = after;
            items.push(self.item(depth, keyword));
        }
        if items.len() == 1 {
            items.pop().unwrap_or(Syn::Error)
        } else if keyword == Keyword::Or {
            Syn::Or(items)
        } else {
            Syn::And(items)
        }
    }

    fn item(&mut self, depth: usize, keyword: Keyword) -> Syn<'a> {
        match keyword {
            Keyword::Or => self.list(depth, Keyword::And),
            Keyword::And => self.unary(depth),
        }
    }

    /// A separator at `pos`: whitespace, the keyword, and whitespace (or a
    /// `(` right after the keyword). Returns where what follows starts.
    fn separator(&self, pos: usize, keyword: Keyword) -> Option<usize> {
        let rest = self.rest_from(pos);
        let (rest, _) = spaces(rest).ok()?;
        let (after_word, found) = word(rest).ok()?;
        if !found.eq_ignore_ascii_case(keyword.text()) {
            return None;
        }
        // Followed by `(`, or by nothing (an empty piece, reported by `unary`).
        if after_word.is_empty() || after_word.starts_with('(') || after_word.starts_with(')') {
            return Some(self.offset(after_word));
        }
        let (after, _) = spaces1(after_word).ok()?;
        Some(self.offset(after))
    }

    fn unary(&mut self, depth: usize) -> Syn<'a> {
        if self.stop {
            return Syn::Error;
        }
        if depth >= MAX_NESTING {
            let at = self.pos;
            self.error(
                at..self.end,
                format!("condition nests `not` and parentheses deeper than {MAX_NESTING}"),
            );
            self.stop = true;
            return Syn::Error;
        }
        let rest = self.rest();
        if rest.is_empty() || rest.starts_with(')') {
            let whole = self.text.to_owned();
            let at = self.pos;
            self.error(at..at, format!("empty clause in condition: {whole:?}"));
            return Syn::Error;
        }
        if let Some(inner) = rest.strip_prefix('(') {
            let open = self.pos;
            self.pos = self.offset(inner);
            self.skip_spaces();
            let tree = self.or(depth + 1);
            if self.stop {
                return Syn::Error;
            }
            self.skip_spaces();
            if let Some(after) = self.rest().strip_prefix(')') {
                self.pos = self.offset(after);
            } else {
                self.error(open..open + 1, "unclosed `(`");
                self.recover();
            }
            return tree;
        }
        if let Some(after) = self.not_keyword() {
            self.pos = after;
            let inner = self.unary(depth + 1);
            return Syn::Not(Box::new(inner));
        }
        self.clause()
    }

    /// `not` as an operator: the word `not` followed by `(`, or by
    /// whitespace and something that is not an operator (else `not` is a
    /// field name, as in 8gent).
    fn not_keyword(&self) -> Option<usize> {
        let (after_word, found) = word(self.rest()).ok()?;
        if !found.eq_ignore_ascii_case("not") {
            return None;
        }
        if after_word.starts_with('(') {
            return Some(self.offset(after_word));
        }
        let (after, _) = spaces1(after_word).ok()?;
        if let Ok((after_next, next)) = word(after).or_else(|_| symbol(after)) {
            let ends = after_next.is_empty()
                || after_next.starts_with(is_js_whitespace)
                || after_next.starts_with('[');
            if is_operator(next) && ends {
                return None;
            }
        }
        Some(self.offset(after))
    }

    fn clause(&mut self) -> Syn<'a> {
        let start = self.pos;
        let Ok((after_field, field)) = field_name(self.rest()) else {
            let shown: String = self.rest().chars().take(20).collect();
            self.error(
                start..start + shown.len(),
                format!("expected a field name (letters, digits, `_`), found `{shown}`"),
            );
            self.recover();
            return Syn::Error;
        };
        let field_span = start..self.offset(after_field);
        let Ok((after_space, _)) = spaces1(after_field) else {
            let at = field_span.end;
            if after_field.is_empty() || after_field.starts_with(')') {
                self.error(field_span, format!("expected an operator after `{field}`"));
            } else {
                let shown: String = after_field.chars().take(1).collect();
                self.error(
                    at..at + shown.len(),
                    format!(
                        "unexpected `{shown}` in field name `{field}` (letters, digits, `_` only)"
                    ),
                );
            }
            self.recover();
            return Syn::Error;
        };
        let op_start = self.offset(after_space);
        let op_word = word(after_space)
            .or_else(|_| symbol(after_space))
            .ok()
            .filter(|(rest, _)| {
                rest.is_empty()
                    || rest.starts_with(is_js_whitespace)
                    || rest.starts_with('[')
                    || rest.starts_with(')')
            });
        let Some((after_op, op)) = op_word else {
            let shown: String = after_space
                .chars()
                .take_while(|c| !is_js_whitespace(*c))
                .take(20)
                .collect();
            self.error(
                op_start..op_start + shown.len(),
                format!("expected an operator after `{field}`, found `{shown}`"),
            );
            self.recover();
            return Syn::Error;
        };
        let op_span = op_start..self.offset(after_op);
        self.pos = op_span.end;
        let rhs = if op.eq_ignore_ascii_case("has_secret") {
            SynRhs::Nothing
        } else if op.eq_ignore_ascii_case("in") && field == "time" && !self.list_follows() {
            // `time in HH:MM..HH:MM`: a window, not a list.
            match self.value_rhs(field, op) {
                Some(value) => SynRhs::Value(value),
                None => return Syn::Error,
            }
        } else if op.eq_ignore_ascii_case("in") {
            match self.list_rhs(field, op) {
                Some(items) => SynRhs::List(items),
                None => return Syn::Error,
            }
        } else {
            match self.value_rhs(field, op) {
                Some(value) => SynRhs::Value(value),
                None => return Syn::Error,
            }
        };
        Syn::Clause(SynClause {
            field,
            field_span,
            op,
            op_span,
            rhs,
        })
    }

    /// Whether `[` comes next, after any whitespace.
    fn list_follows(&self) -> bool {
        self.rest()
            .trim_start_matches(is_js_whitespace)
            .starts_with('[')
    }

    fn value_rhs(&mut self, field: &str, op: &str) -> Option<SynValue<'a>> {
        let op_end = self.pos;
        let rest = self.rest();
        let at_end = rest.is_empty() || rest.starts_with(')');
        let Some(after) = spaces1(rest)
            .ok()
            .map(|(after, _)| after)
            .filter(|_| !at_end)
        else {
            self.error(op_end..op_end, format!("missing value after `{op}`"));
            self.recover();
            return None;
        };
        self.pos = self.offset(after);
        if after.starts_with('"') {
            let value = self.quoted()?;
            if !self.after_value() {
                return None;
            }
            return Some(value);
        }
        // As in 8gent, `and`/`or` right after the operator is a separator,
        // so the clause has no value.
        if self.ends_value_at(op_end) {
            self.error(op_end..op_end, format!("missing value after `{op}`"));
            self.pos = op_end;
            self.recover();
            return None;
        }
        let start = self.pos;
        let stop = self.bare_end(start);
        let raw = self.text.get(start..stop).unwrap_or("");
        let trimmed = raw.trim_end_matches(is_js_whitespace);
        if trimmed.is_empty() {
            self.error(op_end..op_end, format!("missing value after `{op}`"));
            self.recover();
            return None;
        }
        self.pos = stop;
        let span = start..start + trimmed.len();
        if let Some(message) = bare_value_problem(field, op, trimmed) {
            self.error(span, message);
            return None;
        }
        Some(SynValue {
            text: Cow::Borrowed(trimmed),
            span,
            quoted: false,
        })
    }

    /// Where a bare value starting at `start` ends: before the next
    /// separator, an unbalanced `)`, or the end.
    fn bare_end(&self, start: usize) -> usize {
        let rest = self.rest_from(start);
        let mut depth = 0usize;
        let iter = rest.char_indices();
        let mut previous_space = false;
        for (i, c) in iter {
            let at = start + i;
            if is_js_whitespace(c) {
                if !previous_space && self.ends_value_at(at) {
                    return at;
                }
                previous_space = true;
                continue;
            }
            previous_space = false;
            if c == '(' {
                depth += 1;
            } else if c == ')' {
                if depth == 0 {
                    return at;
                }
                depth -= 1;
            }
        }
        self.end
    }

    /// Whether the whitespace run at `at` starts a separator that ends a
    /// bare value. `or` always does; `and` does unless an `or` separator
    /// follows it directly (8gent splits on `or` first, and that split takes
    /// the whitespace after the `and`).
    fn ends_value_at(&self, at: usize) -> bool {
        if self.plain_separator_at(at, Keyword::Or) {
            return true;
        }
        if self.plain_separator_at(at, Keyword::And) {
            let and_end = self.keyword_end(at);
            return !self.plain_separator_at(and_end, Keyword::Or);
        }
        false
    }

    /// Whitespace, the keyword, whitespace: the only separator inside a bare
    /// value (a `(` right after the keyword does not separate, as in 8gent).
    fn plain_separator_at(&self, at: usize, keyword: Keyword) -> bool {
        let Ok((rest, _)) = spaces1(self.rest_from(at)) else {
            return false;
        };
        let Ok((after, found)) = word(rest) else {
            return false;
        };
        found.eq_ignore_ascii_case(keyword.text()) && after.starts_with(is_js_whitespace)
    }

    /// The end of the word after the whitespace run at `at`.
    fn keyword_end(&self, at: usize) -> usize {
        let rest = self.rest_from(at);
        let Ok((rest, _)) = spaces(rest) else {
            return at;
        };
        match word(rest) {
            Ok((after, _)) => self.offset(after),
            Err(_) => self.offset(rest),
        }
    }

    /// After a quoted value or a list: whitespace, then a separator, `)` or the end.
    fn after_value(&mut self) -> bool {
        let before = self.pos;
        self.skip_spaces();
        let rest = self.rest();
        if rest.is_empty()
            || rest.starts_with(')')
            || self.separator(before, Keyword::And).is_some()
            || self.separator(before, Keyword::Or).is_some()
        {
            self.pos = before;
            return true;
        }
        let shown: String = rest.chars().take(20).collect();
        let at = self.pos;
        self.error(
            at..at + shown.len(),
            format!("expected `and`, `or`, `)` or the end, found `{shown}`"),
        );
        self.recover();
        false
    }

    /// A quoted string at `self.pos` (which is at `"`), with `\"` and `\\`.
    fn quoted(&mut self) -> Option<SynValue<'a>> {
        let open = self.pos;
        let body_start = open + 1;
        let body = self.rest_from(body_start);
        let mut out: Option<String> = None;
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    let raw = body.get(..i).unwrap_or("");
                    self.pos = body_start + i + 1;
                    let text = match out {
                        Some(owned) => Cow::Owned(owned),
                        None => Cow::Borrowed(raw),
                    };
                    return Some(SynValue {
                        text,
                        span: open..self.pos,
                        quoted: true,
                    });
                }
                '\\' => {
                    let owned = out.get_or_insert_with(|| body.get(..i).unwrap_or("").to_owned());
                    match chars.next() {
                        Some((_, escaped @ ('"' | '\\'))) => owned.push(escaped),
                        Some((j, other)) => {
                            let at = body_start + i;
                            let end = body_start + j + other.len_utf8();
                            self.error(
                                at..end,
                                format!("unknown escape `\\{other}` (only `\\\"` and `\\\\`)"),
                            );
                            self.recover_from(end);
                            return None;
                        }
                        None => break,
                    }
                }
                other => {
                    if let Some(owned) = out.as_mut() {
                        owned.push(other);
                    }
                }
            }
        }
        self.error(open..self.end, "unclosed quote");
        self.pos = self.end;
        None
    }

    fn list_rhs(&mut self, field: &str, op: &str) -> Option<Vec<SynValue<'a>>> {
        let op_end = self.pos;
        let rest = self.rest();
        let spaced = spaces1(rest).ok().map(|(after, _)| after);
        let after = spaced.unwrap_or(rest);
        if !after.starts_with('[') {
            self.error(op_end..op_end, format!("expected `[` after `{op}`"));
            self.recover();
            return None;
        }
        if spaced.is_none() {
            // 8gent's clause pattern needs whitespace there; it skips the rule.
            let op = op.to_ascii_lowercase();
            self.error(
                op_end..op_end + 1,
                format!("write a space between `{op}` and `[`, as in `{field} {op} [a, b]`"),
            );
            self.recover();
            return None;
        }
        let open = self.offset(after);
        self.pos = open + 1;
        let mut items = Vec::new();
        loop {
            self.skip_spaces();
            let rest = self.rest();
            if rest.starts_with('"') {
                let item = self.quoted()?;
                items.push(item);
                self.skip_spaces();
            } else {
                let Ok((after_item, raw)) = bare_item(rest) else {
                    break;
                };
                let start = self.pos;
                let trimmed = raw.trim_end_matches(is_js_whitespace);
                if !trimmed.is_empty() {
                    items.push(SynValue {
                        text: Cow::Borrowed(trimmed),
                        span: start..start + trimmed.len(),
                        quoted: false,
                    });
                }
                self.pos = self.offset(after_item);
            }
            let rest = self.rest();
            if let Some(after) = rest.strip_prefix(',') {
                self.pos = self.offset(after);
                continue;
            }
            if let Some(after) = rest.strip_prefix(']') {
                let close = self.pos;
                self.pos = self.offset(after);
                let inner = self.text.get(open + 1..close).unwrap_or("");
                if let Some(message) = list_problem(field, op, inner, &items) {
                    self.error(open..self.pos, message);
                    self.recover();
                    return None;
                }
                if !self.after_value() {
                    return None;
                }
                return Some(items);
            }
            if rest.is_empty() {
                break;
            }
            let shown: String = rest.chars().take(20).collect();
            let at = self.pos;
            self.error(
                at..at + shown.len(),
                format!("expected `,` or `]` in the list, found `{shown}`"),
            );
            self.recover();
            return None;
        }
        self.error(open..open + 1, "unclosed `[`");
        self.pos = self.end;
        None
    }

    /// After an error: skip to the next separator, unbalanced `)` or the end.
    fn recover(&mut self) {
        let from = self.pos;
        self.recover_from(from);
    }

    fn recover_from(&mut self, from: usize) {
        let from = from.min(self.end);
        // A bare value scan from here finds the next separator.
        self.pos = self.bare_end(from);
    }
}

/// The separators 8gent splits on (`/\s+and\s+/i`, `/\s+or\s+/i`) in
/// `text`: each as (start of the whitespace before, the keyword, end of the
/// whitespace after).
fn separators_in(text: &str) -> Vec<(usize, &str, usize)> {
    let mut found = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if !is_js_whitespace(c) {
            continue;
        }
        let mut after_space = at + c.len_utf8();
        while let Some((i, c)) = chars.peek().copied() {
            if !is_js_whitespace(c) {
                break;
            }
            after_space = i + c.len_utf8();
            chars.next();
        }
        let rest = text.get(after_space..).unwrap_or("");
        let Ok((after_word, keyword)) = word(rest) else {
            continue;
        };
        if !keyword.eq_ignore_ascii_case("and") && !keyword.eq_ignore_ascii_case("or") {
            continue;
        }
        let Ok((after, _)) = spaces1(after_word) else {
            continue;
        };
        found.push((at, keyword, text.len() - after.len()));
    }
    found
}

/// JavaScript's line terminators: 8gent's clause pattern (`.+`) stops at
/// them, so it skips a rule whose bare value holds one.
pub(crate) fn is_line_terminator(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}')
}

/// A value as dk's printer writes it quoted.
pub(crate) fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Why a bare value cannot stand as written: a line break 8gent cannot
/// read, or a trailing `and`/`or` that joins nothing.
fn bare_value_problem(field: &str, op: &str, value: &str) -> Option<String> {
    let op = op.to_ascii_lowercase();
    if value.chars().any(is_line_terminator) {
        let shown = value.escape_debug();
        return Some(format!(
            "the value `{shown}` holds a line break, which 8gent cannot read: keep it on one line, or quote it (`{field} {op} \"...\"`) if the break belongs to the value"
        ));
    }
    let last = value.rsplit(is_js_whitespace).next().unwrap_or("");
    let dangling = last.eq_ignore_ascii_case("and") || last.eq_ignore_ascii_case("or");
    if dangling && last.len() < value.len() {
        let before = value
            .get(..value.len() - last.len())
            .unwrap_or("")
            .trim_end_matches(is_js_whitespace);
        let keyword = last.to_ascii_lowercase();
        return Some(format!(
            "dangling `{keyword}` after `{field} {op} {before}`: add the clause it joins, as in `{field} {op} {before} {keyword} capability equals x`, or quote a value that holds it: `{field} {op} {}`",
            quote(value)
        ));
    }
    None
}

/// Why an `in` list cannot stand as written: 8gent splits the whole
/// condition on `and`/`or` before it reads lists, so an unquoted list holding
/// one is a rule 8gent skips (and never one value, as dk would read it).
fn list_problem(field: &str, op: &str, inner: &str, items: &[SynValue<'_>]) -> Option<String> {
    if inner.contains('"') {
        // Quoted items are a dk extension; 8gent never reads such a list.
        return None;
    }
    let separators = separators_in(inner);
    let (_, keyword, _) = separators.first()?;
    let keyword = keyword.to_ascii_lowercase();
    let mut written = Vec::new();
    for item in items {
        let mut from = 0;
        for (start, _, end) in separators_in(&item.text) {
            written.push(item.text.get(from..start).unwrap_or("").trim().to_owned());
            from = end;
        }
        written.push(item.text.get(from..).unwrap_or("").trim().to_owned());
    }
    written.retain(|w| !w.is_empty() && !w.chars().any(is_line_terminator));
    let op = op.to_ascii_lowercase();
    Some(format!(
        "`{op}` takes a list separated by commas, not `{keyword}`: write `{field} {op} [{}]`, or quote an item that holds `{keyword}`",
        written.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_consume_whitespace_runs() {
        let text = "a equals b \t and\n c equals d";
        let (tree, errors) = parse(text, 0, text.len());
        assert!(errors.is_empty(), "{errors:?}");
        assert!(matches!(tree, Syn::And(ref items) if items.len() == 2));
    }
}
