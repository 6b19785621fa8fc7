//! The condition language: text -> syntax tree -> checked [`Condition`], its printer, and matching.
//!
//! See `policy.md` for the grammar. Compatible with 8gent's conditions on
//! every condition 8gent accepts that uses no quotes or parentheses; `not`,
//! parentheses and quoted values are dk extensions.

mod input;
mod syntax;
mod values;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Range;

use dk_proto::{is_js_whitespace, utf16_len};

use crate::error::{ConditionError, ConditionErrors};
use crate::lower::{self, js_trim};
use crate::time::{LocalTime, TimeWindow};

pub(crate) use input::{Comparison, INPUT_PREFIX, Literal, Number};

pub use syntax::MAX_NESTING;

/// Where rule conditions read fields from.
pub trait Context {
    /// The field's value, or `None` when the context has no such field (it
    /// then reads as the empty string).
    fn get(&self, field: &str) -> Option<&str>;
}

impl Context for BTreeMap<String, String> {
    fn get(&self, field: &str) -> Option<&str> {
        BTreeMap::get(self, field).map(String::as_str)
    }
}

impl<S: BuildHasher> Context for HashMap<String, String, S> {
    fn get(&self, field: &str) -> Option<&str> {
        HashMap::get(self, field).map(String::as_str)
    }
}

/// The longest condition, in UTF-16 code units as JavaScript's `.length`
/// counts them (the same as characters for text outside the astral planes).
pub const MAX_CONDITION_LENGTH: usize = 2000;

/// The longest `contains` value, counted as [`MAX_CONDITION_LENGTH`] is.
pub const MAX_CONTAINS_LENGTH: usize = 200;

/// A checked condition: parsed, with every value also stored lower-cased.
///
/// [`Condition::parse`] builds one; `Display` prints it back as text that
/// parses to an equal condition. Equality ignores where in the text things
/// were.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub(crate) root: Expr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Expr {
    Clause(Clause),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

#[derive(Clone, Debug)]
pub(crate) struct Clause {
    pub(crate) field: Field,
    pub(crate) field_span: Range<usize>,
    pub(crate) op: Op,
}

impl PartialEq for Clause {
    fn eq(&self, other: &Self) -> bool {
        self.field == other.field && self.op == other.op
    }
}

impl Eq for Clause {}

/// A context key a clause reads, resolved once for the device_use fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) name: String,
    pub(crate) known: KnownField,
}

impl Field {
    /// The param an `input.<param>` field reads (empty for other fields).
    pub(crate) fn param(&self) -> &str {
        self.name.strip_prefix(INPUT_PREFIX).unwrap_or("")
    }
}

/// The fields of a `device_use` context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KnownField {
    DeviceId,
    Capability,
    CapabilityKind,
    AgentId,
    SessionId,
    /// `input.<param>`: a param of the call's input.
    Input,
    /// `time`: with `in HH:MM..HH:MM`, the call's local time of day.
    Time,
    /// `weekday`: the call's local weekday, `mon` ... `sun`.
    Weekday,
    Other,
}

/// The fields a `device_use` (or `*`) rule's condition may name.
pub const DEVICE_USE_FIELDS: [&str; 5] = [
    "deviceId",
    "capability",
    "capabilityKind",
    "agentId",
    "sessionId",
];

impl KnownField {
    fn of(name: &str) -> Self {
        match name {
            "deviceId" => Self::DeviceId,
            "capability" => Self::Capability,
            "capabilityKind" => Self::CapabilityKind,
            "agentId" => Self::AgentId,
            "sessionId" => Self::SessionId,
            "time" => Self::Time,
            "weekday" => Self::Weekday,
            _ if name.starts_with(INPUT_PREFIX) => Self::Input,
            _ => Self::Other,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Equals(Value),
    Contains(Value),
    StartsWith(Value),
    EndsWith(Value),
    In(Vec<Value>),
    /// `input.<param> > n` (and `>=`, `<`, `<=`): only for `input.` fields.
    Compare(Comparison, Number),
    /// `time in HH:MM..HH:MM`.
    Window(TimeWindow),
}

#[derive(Clone, Debug)]
pub(crate) struct Value {
    pub(crate) text: String,
    pub(crate) lower: String,
    /// What the value is for an `input.` field's `equals` and `in`: a
    /// number, a boolean, or text; always text for other fields.
    pub(crate) literal: Literal,
    /// Where the value was written (quotes included); not part of equality.
    pub(crate) span: Range<usize>,
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.literal == other.literal
    }
}

impl Eq for Value {}

impl Value {
    fn new(text: String, span: Range<usize>) -> Self {
        let lower = text.to_lowercase();
        Self {
            text,
            lower,
            literal: Literal::Text,
            span,
        }
    }
}

/// Where a clause reads its field from.
pub(crate) trait Fields {
    /// The field's value; a missing field reads as the empty string.
    fn field(&self, field: &Field) -> &str;

    /// The call's input param `param`, if the call carries it.
    fn input(&self, _param: &str) -> Option<&serde_json::Value> {
        None
    }

    /// The call's local time, if the caller gave an instant.
    fn local_time(&self) -> Option<LocalTime> {
        None
    }
}

impl Condition {
    /// Parses and checks a condition, reporting every error found.
    ///
    /// No text makes this panic; nesting of `not` and parentheses is bounded
    /// by [`MAX_NESTING`] and length by [`MAX_CONDITION_LENGTH`].
    pub fn parse(text: &str) -> Result<Condition, ConditionErrors> {
        let trimmed = js_trim(text);
        if trimmed.is_empty() {
            return Err(ConditionErrors::new(vec![ConditionError::new(
                0..text.len(),
                "Empty condition",
            )]));
        }
        if utf16_len(trimmed) > MAX_CONDITION_LENGTH {
            return Err(ConditionErrors::new(vec![ConditionError::new(
                0..text.len(),
                "Condition too long (max 2000 chars)",
            )]));
        }
        let start = text.len() - text.trim_start_matches(is_js_whitespace).len();
        let end = start + trimmed.len();
        let (tree, mut errors) = syntax::parse(text, start, end);
        let root = check(tree, &mut errors);
        match root {
            Some(root) if errors.is_empty() => Ok(Condition { root }),
            _ => {
                errors.sort_by_key(|e| (e.span().start, e.span().end));
                if errors.is_empty() {
                    errors.push(ConditionError::new(0..text.len(), "invalid condition"));
                }
                Err(ConditionErrors::new(errors))
            }
        }
    }

    /// Whether the condition holds in `ctx` (a missing field reads as the empty string).
    pub fn matches(&self, ctx: &dyn Context) -> bool {
        self.root.matches(&ctx)
    }

    pub(crate) fn matches_fields<F: Fields + ?Sized>(&self, fields: &F) -> bool {
        self.root.matches(fields)
    }

    /// Every field the condition reads, with its byte range in the parsed
    /// text, in text order.
    pub fn fields(&self) -> Vec<(&str, Range<usize>)> {
        let mut out = Vec::new();
        self.root.visit_clauses(&mut |clause| {
            out.push((clause.field.name.as_str(), clause.field_span.clone()));
        });
        out
    }

    /// The lower-cased values a top-level conjunct requires `known` to equal
    /// (`field equals x` or `field in [..]`), if there is one: the rule
    /// cannot match unless the field is one of them.
    pub(crate) fn required_values(&self, known: KnownField) -> Option<Vec<&str>> {
        let conjuncts: &[Expr] = match &self.root {
            Expr::And(items) => items,
            other => std::slice::from_ref(other),
        };
        conjuncts.iter().find_map(|expr| match expr {
            Expr::Clause(clause) if clause.field.known == known => match &clause.op {
                Op::Equals(value) => Some(vec![value.lower.as_str()]),
                Op::In(values) => Some(values.iter().map(|v| v.lower.as_str()).collect()),
                _ => None,
            },
            _ => None,
        })
    }
}

impl Expr {
    fn matches<F: Fields + ?Sized>(&self, fields: &F) -> bool {
        match self {
            Expr::Clause(clause) => clause.matches(fields),
            Expr::Not(inner) => !inner.matches(fields),
            Expr::And(items) => items.iter().all(|e| e.matches(fields)),
            Expr::Or(items) => items.iter().any(|e| e.matches(fields)),
        }
    }

    pub(crate) fn visit_clauses<'s>(&'s self, visit: &mut dyn FnMut(&'s Clause)) {
        match self {
            Expr::Clause(clause) => visit(clause),
            Expr::Not(inner) => inner.visit_clauses(visit),
            Expr::And(items) | Expr::Or(items) => {
                for item in items {
                    item.visit_clauses(visit);
                }
            }
        }
    }
}

/// Whether the input param `param` satisfies `op`.
fn input_matches(param: &serde_json::Value, op: &Op) -> bool {
    match op {
        Op::Equals(v) => input::equals(param, &v.literal, &v.lower),
        Op::In(values) => values
            .iter()
            .any(|v| input::equals(param, &v.literal, &v.lower)),
        Op::Contains(v) => input::as_text(param).is_some_and(|s| lower::contains(s, &v.lower)),
        Op::StartsWith(v) => input::as_text(param).is_some_and(|s| lower::starts_with(s, &v.lower)),
        Op::EndsWith(v) => input::as_text(param).is_some_and(|s| lower::ends_with(s, &v.lower)),
        Op::Compare(comparison, number) => match param {
            serde_json::Value::Number(n) => number.compare(n).is_some_and(|o| comparison.holds(o)),
            _ => false,
        },
        Op::Window(_) => false,
    }
}

impl Clause {
    fn matches<F: Fields + ?Sized>(&self, fields: &F) -> bool {
        if self.field.known == KnownField::Input {
            // A param the call does not carry makes the clause false.
            return fields
                .input(self.field.param())
                .is_some_and(|value| input_matches(value, &self.op));
        }
        let hay = match &self.op {
            Op::Window(window) => {
                return fields
                    .local_time()
                    .is_some_and(|local| window.contains(local.second));
            }
            Op::Compare(..) => return false,
            _ => fields.field(&self.field),
        };
        match &self.op {
            Op::Equals(v) => lower::equals(hay, &v.lower),
            Op::Contains(v) => lower::contains(hay, &v.lower),
            Op::StartsWith(v) => lower::starts_with(hay, &v.lower),
            Op::EndsWith(v) => lower::ends_with(hay, &v.lower),
            Op::In(values) => values.iter().any(|v| lower::equals(hay, &v.lower)),
            Op::Compare(..) | Op::Window(_) => false,
        }
    }
}

impl Fields for &dyn Context {
    fn field(&self, field: &Field) -> &str {
        self.get(&field.name).unwrap_or("")
    }
}

fn check(tree: syntax::Syn<'_>, errors: &mut Vec<ConditionError>) -> Option<Expr> {
    use syntax::Syn;
    match tree {
        Syn::Error => None,
        Syn::Not(inner) => check(*inner, errors).map(|e| Expr::Not(Box::new(e))),
        Syn::And(items) | Syn::Or(items) if items.is_empty() => None,
        Syn::And(items) => check_list(items, errors, true),
        Syn::Or(items) => check_list(items, errors, false),
        Syn::Clause(clause) => check_clause(clause, errors).map(Expr::Clause),
    }
}

/// Checks every item (so every error is reported) and flattens nested
/// lists of the same kind, so printing and parsing again gives the same tree.
fn check_list(
    items: Vec<syntax::Syn<'_>>,
    errors: &mut Vec<ConditionError>,
    and: bool,
) -> Option<Expr> {
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        match check(item, errors) {
            Some(Expr::And(inner)) if and => out.extend(inner),
            Some(Expr::Or(inner)) if !and => out.extend(inner),
            Some(expr) => out.push(expr),
            None => ok = false,
        }
    }
    if !ok {
        return None;
    }
    Some(if and { Expr::And(out) } else { Expr::Or(out) })
}

fn check_clause(clause: syntax::SynClause<'_>, errors: &mut Vec<ConditionError>) -> Option<Clause> {
    let syntax::SynClause {
        field,
        field_span,
        op,
        op_span,
        rhs,
    } = clause;
    if let Some(message) = input::field_problem(field) {
        errors.push(ConditionError::new(field_span, message));
        return None;
    }
    let known = KnownField::of(field);
    let operator = Operator {
        field,
        op,
        name: op.to_ascii_lowercase(),
        span: op_span.clone(),
        on_input: known == KnownField::Input,
    };
    let Some(checked) = operator.check(rhs, errors).ok()? else {
        errors.push(ConditionError::new(
            op_span,
            format!("`{op}` is missing its value"),
        ));
        return None;
    };
    Some(Clause {
        field: Field {
            name: field.to_owned(),
            known,
        },
        field_span,
        op: checked,
    })
}

/// A clause's operator was refused; what is wrong is reported already
/// (or, for a value of the wrong shape, left to the syntax's report).
struct Refused;

/// Reports `message` at `span`, refusing the clause.
fn refuse(
    errors: &mut Vec<ConditionError>,
    span: Range<usize>,
    message: impl Into<String>,
) -> Refused {
    errors.push(ConditionError::new(span, message));
    Refused
}

/// A clause's operator as written, and the field it applies to.
struct Operator<'a> {
    field: &'a str,
    /// As written.
    op: &'a str,
    /// Lower case.
    name: String,
    span: Range<usize>,
    /// The field is an `input.` field.
    on_input: bool,
}

impl Operator<'_> {
    /// The operation the operator and `rhs` make: `None` when the value
    /// is missing.
    fn check(
        &self,
        rhs: syntax::SynRhs<'_>,
        errors: &mut Vec<ConditionError>,
    ) -> Result<Option<Op>, Refused> {
        match self.name.as_str() {
            "equals" => Ok(self.single(rhs, true).map(Op::Equals)),
            "starts_with" => Ok(self.single(rhs, false).map(Op::StartsWith)),
            "ends_with" => Ok(self.single(rhs, false).map(Op::EndsWith)),
            "contains" => self.contains(rhs, errors),
            "in" => self.within(rhs, errors),
            ">" | ">=" | "<" | "<=" => self.compare(rhs, errors),
            "has_secret" => Err(refuse(
                errors,
                self.span.clone(),
                "`has_secret` has no meaning for device calls and is not supported",
            )),
            _ => Err(refuse(
                errors,
                self.span.clone(),
                format!(
                    "unknown operator `{}` (expected equals, contains, starts_with, ends_with, in, or for `input.` fields >, >=, <, <=)",
                    self.op
                ),
            )),
        }
    }

    /// A value as the clause holds it. For an `input.` field, `equals`
    /// and `in` (`typed`) read a bare value as a number or boolean when
    /// it is one.
    fn value(&self, v: syntax::SynValue<'_>, typed: bool) -> Value {
        let mut out = Value::new(v.text.into_owned(), v.span);
        if typed && self.on_input && !v.quoted {
            out.literal = Literal::of(&out.text);
        }
        out
    }

    /// The one value `rhs` holds, if it holds one.
    fn single(&self, rhs: syntax::SynRhs<'_>, typed: bool) -> Option<Value> {
        match rhs {
            syntax::SynRhs::Value(v) => Some(self.value(v, typed)),
            syntax::SynRhs::List(_) | syntax::SynRhs::Nothing => None,
        }
    }

    /// `contains`: one value, at most [`MAX_CONTAINS_LENGTH`] characters.
    fn contains(
        &self,
        rhs: syntax::SynRhs<'_>,
        errors: &mut Vec<ConditionError>,
    ) -> Result<Option<Op>, Refused> {
        let v = self.single(rhs, false).ok_or(Refused)?;
        if utf16_len(&v.text) > MAX_CONTAINS_LENGTH {
            return Err(refuse(
                errors,
                v.span,
                format!("`contains` value longer than {MAX_CONTAINS_LENGTH} characters"),
            ));
        }
        Ok(Some(Op::Contains(v)))
    }

    /// `in`: a list of values, or a time window written without quotes.
    fn within(
        &self,
        rhs: syntax::SynRhs<'_>,
        errors: &mut Vec<ConditionError>,
    ) -> Result<Option<Op>, Refused> {
        let v = match rhs {
            syntax::SynRhs::List(items) => {
                let values = items.into_iter().map(|item| self.value(item, true));
                return Ok(Some(Op::In(values.collect())));
            }
            syntax::SynRhs::Value(v) => v,
            syntax::SynRhs::Nothing => return Ok(None),
        };
        match TimeWindow::parse(&v.text) {
            Ok(window) if !v.quoted => Ok(Some(Op::Window(window))),
            Ok(_) => Err(refuse(
                errors,
                v.span,
                "write a time window without quotes, as in `time in 23:00..06:00`",
            )),
            Err(message) => Err(refuse(errors, v.span, message)),
        }
    }

    /// `>`, `>=`, `<`, `<=`: an `input.` field against a number written
    /// without quotes.
    fn compare(
        &self,
        rhs: syntax::SynRhs<'_>,
        errors: &mut Vec<ConditionError>,
    ) -> Result<Option<Op>, Refused> {
        let op = &self.name;
        let comparison = Comparison::of(op).ok_or(Refused)?;
        if !self.on_input {
            return Err(refuse(
                errors,
                self.span.clone(),
                format!(
                    "`{op}` compares numbers and applies only to `input.<param>` fields, as in `input.target {op} 25`"
                ),
            ));
        }
        let syntax::SynRhs::Value(v) = rhs else {
            return Err(Refused);
        };
        match (v.quoted, Number::parse(&v.text)) {
            (false, Ok(number)) => Ok(Some(Op::Compare(comparison, number))),
            (_, Err(Some(message))) => Err(refuse(errors, v.span, message)),
            (_, _) => Err(refuse(
                errors,
                v.span,
                format!(
                    "`{}` expects a number: `{op}` compares numbers, so write one without quotes, as in `{} {op} 25`",
                    self.field, self.field
                ),
            )),
        }
    }
}

// ---- printer ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum Parent {
    Top,
    And,
    Or,
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        print_expr(&self.root, Parent::Top, f)
    }
}

fn print_expr(expr: &Expr, parent: Parent, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match expr {
        Expr::Or(items) => {
            let paren = parent == Parent::And;
            if paren {
                f.write_str("(")?;
            }
            print_joined(items, " or ", Parent::Or, f)?;
            if paren {
                f.write_str(")")?;
            }
            Ok(())
        }
        Expr::And(items) => print_joined(items, " and ", Parent::And, f),
        Expr::Not(inner) => {
            f.write_str("not (")?;
            print_expr(inner, Parent::Top, f)?;
            f.write_str(")")
        }
        Expr::Clause(clause) => print_clause(clause, f),
    }
}

fn print_joined(
    items: &[Expr],
    separator: &str,
    parent: Parent,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(separator)?;
        }
        print_expr(item, parent, f)?;
    }
    Ok(())
}

fn print_clause(clause: &Clause, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    // A field spelled like a keyword reads as one in some places; parentheses
    // make it a clause everywhere.
    let keyword_like = ["and", "or", "not"]
        .iter()
        .any(|k| k.eq_ignore_ascii_case(&clause.field.name));
    if keyword_like {
        f.write_str("(")?;
    }
    f.write_str(&clause.field.name)?;
    let input = clause.field.known == KnownField::Input;
    match &clause.op {
        Op::Equals(v) => print_op_value(" equals ", v, input, f)?,
        Op::Contains(v) => print_op_value(" contains ", v, input, f)?,
        Op::StartsWith(v) => print_op_value(" starts_with ", v, input, f)?,
        Op::EndsWith(v) => print_op_value(" ends_with ", v, input, f)?,
        Op::In(values) => {
            f.write_str(" in [")?;
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                print_value(v, input, f)?;
            }
            f.write_str("]")?;
        }
        Op::Compare(comparison, number) => {
            write!(f, " {} {}", comparison.as_str(), number.text)?;
        }
        Op::Window(window) => write!(f, " in {window}")?,
    }
    if keyword_like {
        f.write_str(")")?;
    }
    Ok(())
}

fn print_op_value(op: &str, value: &Value, input: bool, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.write_str(op)?;
    print_value(value, input, f)
}

/// A value prints bare when that cannot be misread: no whitespace, no
/// character the grammar gives a meaning, not a separator word.
pub(crate) fn is_bare_safe(text: &str) -> bool {
    !text.is_empty()
        && !text.eq_ignore_ascii_case("and")
        && !text.eq_ignore_ascii_case("or")
        && text.chars().all(|c| {
            !is_js_whitespace(c)
                && !c.is_whitespace()
                && !c.is_control()
                && !matches!(c, '"' | '(' | ')' | '[' | ']' | ',' | '\\')
        })
}

fn print_value(value: &Value, input: bool, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    // Text that would read as a number or boolean for an `input.` field is
    // quoted, so that it prints back as text.
    let typed_when_bare =
        input && value.literal == Literal::Text && Literal::of(&value.text) != Literal::Text;
    if is_bare_safe(&value.text) && !typed_when_bare {
        return f.write_str(&value.text);
    }
    f.write_str("\"")?;
    for c in value.text.chars() {
        if c == '"' || c == '\\' {
            f.write_str("\\")?;
        }
        fmt::Write::write_char(f, c)?;
    }
    f.write_str("\"")
}

#[cfg(test)]
mod tests;
