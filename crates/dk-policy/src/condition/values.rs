//! Values a `device_use` field can never hold: a clause comparing with one never matches, so it is refused.
//!
//! Comparisons lower-case both sides, so a value is judged lower-cased:
//! - `deviceId`: a device id, `^[a-z0-9]+(-[a-z0-9]+)*$` (dk-proto's
//!   manifest rule); `starts_with`, `ends_with` and `contains` take a piece of one;
//! - `capability`: a capability name, `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`, or a piece of one;
//! - `capabilityKind`: `sensor` or `actuator`, or a piece of one;
//! - `agentId`, `sessionId`: no control, format or line-separator character;
//! - `weekday`: `mon` ... `sun`, with `equals` or `in`;
//! - `time`: only a window, `time in HH:MM..HH:MM`;
//! - any field: `in []`, an empty list, matches nothing.

use super::{Clause, Condition, KnownField, Op, Value};
use crate::error::ConditionError;
use crate::time::weekday_problem;

/// The capability kinds a manifest declares.
const KINDS: [&str; 2] = ["sensor", "actuator"];

/// How a clause compares, for judging its value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Compare {
    Whole,
    Prefix,
    Suffix,
    Inside,
}

impl Condition {
    /// Every value of a `device_use` field that no call can hold, with how
    /// to write it.
    pub(crate) fn device_use_value_errors(&self) -> Vec<ConditionError> {
        let mut errors = Vec::new();
        self.root.visit_clauses(&mut |clause| {
            let field = clause.field.name.as_str();
            let (name, compare, values): (&str, Compare, &[Value]) = match &clause.op {
                Op::Equals(v) => ("equals", Compare::Whole, std::slice::from_ref(v)),
                Op::In(values) => ("in", Compare::Whole, values),
                Op::StartsWith(v) => ("starts_with", Compare::Prefix, std::slice::from_ref(v)),
                Op::EndsWith(v) => ("ends_with", Compare::Suffix, std::slice::from_ref(v)),
                Op::Contains(v) => ("contains", Compare::Inside, std::slice::from_ref(v)),
                Op::Compare(..) | Op::Window(_) => return,
            };
            if clause.field.known == KnownField::Time {
                errors.push(ConditionError::new(
                    clause.field_span.clone(),
                    format!(
                        "`time {name}` never matches a device call: `time` takes a window, as in `time in 23:00..06:00`"
                    ),
                ));
                return;
            }
            if clause.field.known == KnownField::Weekday && compare != Compare::Whole {
                errors.push(ConditionError::new(
                    clause.field_span.clone(),
                    format!(
                        "`weekday {name}`: a weekday is compared whole, as in `weekday in [sat, sun]` or `weekday equals mon`"
                    ),
                ));
                return;
            }
            if let Op::In(values) = &clause.op
                && values.is_empty()
            {
                errors.push(ConditionError::new(
                    clause.field_span.start..clause.field_span.end,
                    format!(
                        "`{field} in []` never matches, so the rule would do nothing: list at least one value, as in `{}`, or remove the rule",
                        in_example(clause.field.known, field)
                    ),
                ));
                return;
            }
            for value in values {
                if let Some(message) = problem(clause, name, compare, value) {
                    errors.push(ConditionError::new(value.span.clone(), message));
                }
            }
        });
        errors
    }
}

fn problem(clause: &Clause, op: &str, compare: Compare, value: &Value) -> Option<String> {
    let field = clause.field.name.as_str();
    let shown = value.text.escape_debug().to_string();
    let lower = value.lower.as_str();
    if lower.is_empty() && compare != Compare::Whole {
        // Matches every call: not a silent no-op.
        return None;
    }
    let write = |suggestion: &str| {
        if op == "in" {
            format!("`{field} in [{suggestion}]`")
        } else {
            format!("`{field} {op} {suggestion}`")
        }
    };
    match clause.field.known {
        KnownField::DeviceId => (!piece_of(lower, '-', compare, false)).then(|| {
            format!(
                "`{shown}` can never be a device id, so this clause never matches: a device id is lower case letters and digits in words joined by `-`; write {}",
                write(&suggest(lower, '-', "desk-lamp"))
            )
        }),
        KnownField::Capability => (!piece_of(lower, '_', compare, true)).then(|| {
            format!(
                "`{shown}` can never be a capability name, so this clause never matches: a capability is lower case letters and digits in words joined by `_`; write {}",
                write(&suggest(lower, '_', "turn_on"))
            )
        }),
        KnownField::CapabilityKind => {
            let fits = |kind: &&str| match compare {
                Compare::Whole => *kind == lower,
                Compare::Prefix => kind.starts_with(lower),
                Compare::Suffix => kind.ends_with(lower),
                Compare::Inside => kind.contains(lower),
            };
            (!KINDS.iter().any(fits)).then(|| {
                let kind = if lower.starts_with('s') {
                    "sensor"
                } else {
                    "actuator"
                };
                format!(
                    "`{shown}` is not a capability kind, so this clause never matches: `capabilityKind` is `sensor` or `actuator`; write {}",
                    write(kind)
                )
            })
        }
        KnownField::AgentId | KnownField::SessionId => {
            value.text.chars().find(|c| is_invisible(*c)).map(|c| {
                format!(
                    "`{shown}` holds U+{:04X}, a control, format or line-separator character no `{field}` holds: write the {} without it",
                    u32::from(c),
                    if field == "agentId" { "agent id" } else { "session id" },
                )
            })
        }
        KnownField::Weekday => weekday_problem(lower),
        KnownField::Input | KnownField::Time | KnownField::Other => None,
    }
}

/// A one-value `in` list for `field`, for messages.
fn in_example(known: KnownField, field: &str) -> String {
    let value = match known {
        KnownField::DeviceId => "desk-lamp",
        KnownField::Capability => "turn_on",
        KnownField::CapabilityKind => "actuator",
        KnownField::Weekday => "sat",
        _ => "x",
    };
    format!("{field} in [{value}]")
}

impl Condition {
    /// Clauses that only a device call can satisfy (`input.` params, time
    /// windows), for a rule of another action, where they would never match.
    pub(crate) fn device_call_only_errors(&self) -> Vec<ConditionError> {
        let mut errors = Vec::new();
        self.root.visit_clauses(&mut |clause| {
            let what = if clause.field.known == KnownField::Input {
                "`input.` params"
            } else if matches!(clause.op, Op::Window(_)) {
                "time windows"
            } else {
                return;
            };
            errors.push(ConditionError::new(
                clause.field_span.clone(),
                format!(
                    "{what} exist only in device calls, so `{}` never matches this action: use `action: device_use` (or `*`)",
                    clause.field.name
                ),
            ));
        });
        errors
    }

    /// Whether some clause reads the call's local time (`time` windows,
    /// `weekday`).
    pub(crate) fn reads_time(&self) -> bool {
        let mut reads = false;
        self.root.visit_clauses(&mut |clause| {
            reads |=
                matches!(clause.op, Op::Window(_)) || clause.field.known == KnownField::Weekday;
        });
        reads
    }

    /// The time windows of the condition, each with its clause's field span.
    pub(crate) fn windows(&self) -> Vec<(crate::time::TimeWindow, std::ops::Range<usize>)> {
        let mut out = Vec::new();
        self.root.visit_clauses(&mut |clause| {
            if let Op::Window(window) = &clause.op {
                out.push((*window, clause.field_span.clone()));
            }
        });
        out
    }
}

/// Whether `text` is a name made of lower-case ASCII letters and digits in
/// words joined by `joint` (`first_letter`: the first character is a letter),
/// or, per `compare`, a piece of one.
fn piece_of(text: &str, joint: char, compare: Compare, first_letter: bool) -> bool {
    let mut core = text;
    if matches!(compare, Compare::Suffix | Compare::Inside) {
        core = core.strip_prefix(joint).unwrap_or(core);
    }
    if matches!(compare, Compare::Prefix | Compare::Inside) {
        core = core.strip_suffix(joint).unwrap_or(core);
    }
    if core.is_empty() {
        // `-` alone is inside many ids; an empty name is none.
        return compare == Compare::Inside && !text.is_empty();
    }
    let starts_well = !first_letter
        || matches!(compare, Compare::Suffix | Compare::Inside)
        || core.starts_with(|c: char| c.is_ascii_lowercase());
    starts_well
        && core.split(joint).all(|word| {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `text` made into a name: ASCII letters and digits kept, every other run
/// turned into one `joint`; `fallback` when nothing is left.
fn suggest(text: &str, joint: char, fallback: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with(joint) {
            out.push(joint);
        }
    }
    while out.ends_with(joint) {
        out.pop();
    }
    if out.is_empty() || (joint == '_' && !out.starts_with(|c: char| c.is_ascii_lowercase())) {
        return fallback.to_owned();
    }
    out
}

/// Control, format (general category Cf) and line or paragraph separator
/// characters: none is in an id a vessel hands out.
fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{06DD}'
                | '\u{070F}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{110BD}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
        )
}
