//! `input.<param>` clauses: the field's name, typed values (numbers, booleans, text), and matching a call's input.
//!
//! What a clause expects is read from how it is written:
//! - `>`, `>=`, `<`, `<=` expect a number: the value must be a number
//!   literal (`25`, `-3.5`, `1e3`), or the file is refused;
//! - `equals` and `in` read a bare `true`/`false` as a boolean and a bare
//!   number as a number, anything else (and anything quoted) as text;
//! - `contains`, `starts_with`, `ends_with` compare text.
//!
//! A param of another type than the value (a number compared with text), or
//! one the call does not carry, makes the clause false. Text compares
//! lower-cased on both sides, as every other field does. Numbers compare
//! exactly when both are integers, else as 64-bit floats.

use std::cmp::Ordering;

use serde_json::Value as Json;

use crate::lower;

/// How an `input.` field is written: `input.<param>`.
pub(crate) const INPUT_PREFIX: &str = "input.";

/// The longest param name a manifest may declare (dk-proto's limit), in bytes
/// (param names are ASCII).
const MAX_PARAM_NAME: usize = 30;

/// An ordering operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Comparison {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

impl Comparison {
    pub(crate) fn of(op: &str) -> Option<Comparison> {
        match op {
            ">" => Some(Comparison::Greater),
            ">=" => Some(Comparison::GreaterOrEqual),
            "<" => Some(Comparison::Less),
            "<=" => Some(Comparison::LessOrEqual),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Comparison::Greater => ">",
            Comparison::GreaterOrEqual => ">=",
            Comparison::Less => "<",
            Comparison::LessOrEqual => "<=",
        }
    }

    /// Whether `param` compared with the value as `ordering` satisfies it.
    pub(super) fn holds(self, ordering: Ordering) -> bool {
        match self {
            Comparison::Greater => ordering == Ordering::Greater,
            Comparison::GreaterOrEqual => ordering != Ordering::Less,
            Comparison::Less => ordering == Ordering::Less,
            Comparison::LessOrEqual => ordering != Ordering::Greater,
        }
    }
}

/// A number literal: its text as written, its value, and its exact value
/// when written as an integer.
#[derive(Clone, Debug)]
pub(crate) struct Number {
    pub(crate) text: String,
    pub(crate) value: f64,
    pub(crate) integer: Option<i128>,
}

impl PartialEq for Number {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Number {}

impl Number {
    /// Reads `-?digits(.digits)?([eE][+-]?digits)?`. `Err(None)`: not a
    /// number; `Err(Some(message))`: a number too large for a float.
    pub(crate) fn parse(text: &str) -> Result<Number, Option<String>> {
        if !is_number_text(text) {
            return Err(None);
        }
        let value: f64 = text.parse().map_err(|_| None::<String>)?;
        if !value.is_finite() {
            return Err(Some(format!(
                "the number `{text}` is too large (at most about 1.8e308)"
            )));
        }
        let integer = if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
            text.parse::<i128>().ok()
        } else {
            None
        };
        Ok(Number {
            text: text.to_owned(),
            value,
            integer,
        })
    }

    /// How the JSON number `json` compares with this one.
    pub(super) fn compare(&self, json: &serde_json::Number) -> Option<Ordering> {
        let exact = json
            .as_i64()
            .map(i128::from)
            .or_else(|| json.as_u64().map(i128::from));
        if let (Some(param), Some(literal)) = (exact, self.integer) {
            return Some(param.cmp(&literal));
        }
        json.as_f64()?.partial_cmp(&self.value)
    }
}

/// JSON's number grammar, leading zeros allowed.
fn is_number_text(text: &str) -> bool {
    let digits = |s: &str| -> usize { s.bytes().take_while(u8::is_ascii_digit).count() };
    let rest = text.strip_prefix('-').unwrap_or(text);
    let whole = digits(rest);
    if whole == 0 {
        return false;
    }
    let mut rest = rest.get(whole..).unwrap_or("");
    if let Some(after) = rest.strip_prefix('.') {
        let fraction = digits(after);
        if fraction == 0 {
            return false;
        }
        rest = after.get(fraction..).unwrap_or("");
    }
    if let Some(after) = rest.strip_prefix(['e', 'E']) {
        let after = after.strip_prefix(['+', '-']).unwrap_or(after);
        let exponent = digits(after);
        if exponent == 0 {
            return false;
        }
        rest = after.get(exponent..).unwrap_or("");
    }
    rest.is_empty()
}

/// What an `equals` or `in` value of an `input.` field is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Literal {
    /// Text: compared lower-cased with a string param.
    Text,
    /// A number: compared with a number param.
    Number(Number),
    /// `true` or `false`: compared with a boolean param.
    Bool(bool),
}

impl Literal {
    /// How a bare value reads.
    pub(crate) fn of(text: &str) -> Literal {
        if text.eq_ignore_ascii_case("true") {
            return Literal::Bool(true);
        }
        if text.eq_ignore_ascii_case("false") {
            return Literal::Bool(false);
        }
        match Number::parse(text) {
            Ok(number) => Literal::Number(number),
            Err(_) => Literal::Text,
        }
    }
}

/// Why a field name with a `.` cannot stand: only `input.<param>` is
/// dotted, and `<param>` is a param name a manifest can declare.
pub(crate) fn field_problem(field: &str) -> Option<String> {
    if !field.contains('.') {
        return None;
    }
    let Some(param) = field.strip_prefix(INPUT_PREFIX) else {
        return Some(format!(
            "unknown field `{field}`: the only dotted fields are `input.<param>`, as in `input.target`"
        ));
    };
    if param.contains('.') {
        return Some(format!(
            "`{field}`: nested params are not supported; `input.<param>` names a top-level param of the call's input"
        ));
    }
    if !is_param_name(param) {
        return Some(format!(
            "`{param}` can never be a param name, so `{field}` never matches: a param is lower case letters and digits in words joined by `_`, starting with a letter, at most {MAX_PARAM_NAME} characters"
        ));
    }
    None
}

/// A manifest's param name: `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`, at most 30.
fn is_param_name(name: &str) -> bool {
    name.len() <= MAX_PARAM_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.split('_').all(|word| {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

pub(super) fn as_text(param: &Json) -> Option<&str> {
    match param {
        Json::String(s) => Some(s),
        _ => None,
    }
}

pub(super) fn equals(param: &Json, literal: &Literal, lowered: &str) -> bool {
    match (literal, param) {
        (Literal::Text, Json::String(s)) => lower::equals(s, lowered),
        (Literal::Bool(b), Json::Bool(p)) => b == p,
        (Literal::Number(n), Json::Number(p)) => n.compare(p) == Some(Ordering::Equal),
        _ => false,
    }
}
