//! `dk policy lint`: warnings about a rule file that loaded, for rules that can never decide.
//!
//! A warning never refuses a file: the rules still apply as written. Only
//! what can be decided soundly and simply is reported; when unsure, nothing.
//! Two rules with the same name are not a warning here: the loader already
//! refuses such a file whole.

use std::fmt;

use crate::condition::{Condition, Expr};
use crate::error::{Location, PolicyFileError};
use crate::rule::{Rule, RuleDecision};

/// At most this many warnings of one file get a line (each costs a read of the file).
pub const MAX_LOCATED_WARNINGS: usize = 64;

/// What a lint warning is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LintKind {
    /// The rule can never decide: an enabled `block` rule applies whenever it
    /// does and matches every call it matches. For a `block` rule the
    /// shadowing rule comes earlier in the file; a `require_approval` or
    /// `allow` rule loses to a matching block wherever it is.
    Shadowed {
        /// The index in `policies` of the block rule that decides instead.
        by_index: usize,
        /// That rule's name.
        by_name: String,
    },
}

impl LintKind {
    /// A short stable name: `shadowed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LintKind::Shadowed { .. } => "shadowed",
        }
    }
}

/// One warning about one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LintWarning {
    /// The rule's index in `policies`, from 0.
    pub index: usize,
    /// The rule's name.
    pub rule: String,
    /// Where the rule starts in its file, when known.
    pub location: Option<Location>,
    /// What the warning is about.
    pub kind: LintKind,
}

impl LintWarning {
    /// A one-line, lower-case message.
    pub fn message(&self) -> String {
        match &self.kind {
            LintKind::Shadowed { by_index, by_name } => format!(
                "never decides: block rule `{by_name}` (policies[{by_index}]) matches every call it matches"
            ),
        }
    }
}

impl fmt::Display for LintWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(at) = self.location {
            write!(f, "line {}: ", at.line)?;
        }
        write!(
            f,
            "policies[{}] `{}`: {}",
            self.index,
            self.rule,
            self.message()
        )
    }
}

/// Lints checked rules, in file order. Pure: the line of each warning is
/// the rule's own [`Rule::location`].
pub fn lint(rules: &[Rule]) -> Vec<LintWarning> {
    let mut warnings = Vec::new();
    for rule in rules.iter().filter(|r| r.enabled) {
        let shadow = rules
            .iter()
            .filter(|b| b.index != rule.index)
            .filter(|b| b.index < rule.index || rule.decision != RuleDecision::Block)
            .find(|b| shadows(b, rule));
        if let Some(by) = shadow {
            warnings.push(LintWarning {
                index: rule.index,
                rule: rule.name.clone(),
                location: rule.location,
                kind: LintKind::Shadowed {
                    by_index: by.index,
                    by_name: by.name.clone(),
                },
            });
        }
    }
    warnings
}

/// Reads a rule file's text and lints it, giving each warning its line (the
/// first [`MAX_LOCATED_WARNINGS`]). A file with errors is refused as
/// [`crate::PolicySet::from_yaml_str`] refuses it.
pub fn lint_yaml_str(text: &str) -> Result<Vec<LintWarning>, PolicyFileError> {
    let rules = crate::file::load_str(text)?;
    let mut warnings = lint(&rules);
    for warning in warnings.iter_mut().take(MAX_LOCATED_WARNINGS) {
        if warning.location.is_none() {
            warning.location = crate::file::locate_rule(text, warning.index);
        }
    }
    Ok(warnings)
}

/// Whether `block` decides every call `rule` would match: an enabled block
/// that applies whenever `rule` applies, whose condition is a conjunction
/// of clauses all found in `rule`'s conjunction.
fn shadows(block: &Rule, rule: &Rule) -> bool {
    block.enabled
        && block.decision == RuleDecision::Block
        && (block.action == rule.action || block.action == "*")
        && match (&block.agent_scope, &rule.agent_scope) {
            (None, _) => true,
            (Some(wide), Some(narrow)) => wide == narrow,
            (Some(_), None) => false,
        }
        && wider_or_equal(&block.condition, &rule.condition)
}

/// True only when `wide` surely holds whenever `narrow` does: every
/// conjunct of `wide` is equal to a conjunct of `narrow`.
fn wider_or_equal(wide: &Condition, narrow: &Condition) -> bool {
    let mut narrow_parts = Vec::new();
    conjuncts(&narrow.root, &mut narrow_parts);
    let mut wide_parts = Vec::new();
    conjuncts(&wide.root, &mut wide_parts);
    wide_parts.iter().all(|w| narrow_parts.contains(w))
}

fn conjuncts<'e>(expr: &'e Expr, out: &mut Vec<&'e Expr>) {
    match expr {
        Expr::And(items) => items.iter().for_each(|item| conjuncts(item, out)),
        other => out.push(other),
    }
}

#[cfg(test)]
mod tests;
