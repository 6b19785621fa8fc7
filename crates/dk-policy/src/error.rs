//! Errors: a condition's errors with their spans, and a rule file's errors with rule, line and column.

use std::fmt;
use std::ops::Range;

/// A line and column in a rule file, both counted from 1, as the YAML parser reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {} column {}", self.line, self.column)
    }
}

/// One error in a condition: what is wrong and where, as a byte range of the condition text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (bytes {}..{})", span.start, span.end)]
pub struct ConditionError {
    span: Range<usize>,
    message: String,
}

impl ConditionError {
    pub(crate) fn new(span: Range<usize>, message: impl Into<String>) -> Self {
        Self {
            span,
            message: message.into(),
        }
    }

    /// The byte range of the condition text the error is about.
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }

    /// What is wrong, one line.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Every error found in one condition, in the order of the text. Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionErrors {
    errors: Vec<ConditionError>,
}

impl ConditionErrors {
    pub(crate) fn new(errors: Vec<ConditionError>) -> Self {
        Self { errors }
    }

    /// The errors, in the order of the text.
    pub fn errors(&self) -> &[ConditionError] {
        &self.errors
    }
}

impl fmt::Display for ConditionErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConditionErrors {}

/// One error in a rule file.
///
/// Carries what is known: the rule's index in `policies` and its name, the
/// line and column in the file (when the YAML parser gives them), the byte
/// range inside the rule's condition text (for condition errors), and the
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub(crate) rule_index: Option<usize>,
    pub(crate) rule_name: Option<String>,
    pub(crate) location: Option<Location>,
    pub(crate) condition_span: Option<Range<usize>>,
    pub(crate) message: String,
}

impl PolicyError {
    pub(crate) fn file(message: impl Into<String>) -> Self {
        Self {
            rule_index: None,
            rule_name: None,
            location: None,
            condition_span: None,
            message: message.into(),
        }
    }

    pub(crate) fn rule(index: usize, name: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            rule_index: Some(index),
            rule_name: name.map(str::to_owned),
            location: None,
            condition_span: None,
            message: message.into(),
        }
    }

    /// The index of the rule in `policies`, from 0, when the error is about one rule.
    pub fn rule_index(&self) -> Option<usize> {
        self.rule_index
    }

    /// The rule's name, when the error is about one rule and its name could be read.
    pub fn rule_name(&self) -> Option<&str> {
        self.rule_name.as_deref()
    }

    /// Where in the file, when the YAML parser gives it.
    pub fn location(&self) -> Option<Location> {
        self.location
    }

    /// The byte range inside the rule's condition text, for an error in a condition.
    pub fn condition_span(&self) -> Option<Range<usize>> {
        self.condition_span.clone()
    }

    /// What is wrong, one line.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(location) = self.location {
            write!(f, "{location}: ")?;
        }
        if let Some(index) = self.rule_index {
            write!(f, "policies[{index}]")?;
            if let Some(name) = &self.rule_name {
                write!(f, " `{name}`")?;
            }
            f.write_str(": ")?;
        }
        if let Some(span) = &self.condition_span {
            write!(f, "condition bytes {}..{}: ", span.start, span.end)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PolicyError {}

/// Why a rule file was refused: every error found, in file order. Never empty.
///
/// A file with any error is refused whole (fail closed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyFileError {
    errors: Vec<PolicyError>,
}

impl PolicyFileError {
    pub(crate) fn new(errors: Vec<PolicyError>) -> Self {
        Self { errors }
    }

    pub(crate) fn one(error: PolicyError) -> Self {
        Self {
            errors: vec![error],
        }
    }

    /// The errors, in file order.
    pub fn errors(&self) -> &[PolicyError] {
        &self.errors
    }
}

impl fmt::Display for PolicyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyFileError {}
