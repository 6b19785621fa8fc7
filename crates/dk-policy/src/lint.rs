//! `dk policy lint`: warnings about a rule file that loaded, for rules that can never decide.
//!
//! A warning never refuses a file: the rules still apply as written. Only
//! what can be decided soundly and simply is reported; when unsure, nothing.
//! Two rules with the same name are not a warning here: the loader already
//! refuses such a file whole.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::condition::{Condition, Expr, KnownField, Literal, Op};
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
    /// A `time in HH:MM..HH:MM` window whose start equals its end: it holds
    /// no instant, so the clause is always false.
    EmptyTimeWindow {
        /// The window as written, `HH:MM..HH:MM`.
        window: String,
    },
    /// An `input.<param>` that no declared capability has (among those the
    /// rule requires, when it requires some): the clause is always false.
    /// Only reported when lint is told the declared params.
    UndeclaredParam {
        /// The param, without `input.`.
        param: String,
        /// The capabilities the rule requires (lower-cased), empty when it
        /// requires none.
        capabilities: Vec<String>,
        /// The params those capabilities (all, when it requires none) do
        /// declare, sorted: what the person may have meant.
        declared: Vec<String>,
    },
    /// A `deviceId` the rule requires (`equals` or `in`) that no known
    /// device has: that part of the rule never matches. Only reported when
    /// lint is told the devices (`dk policy lint --paired`, `--manifests`).
    UnknownDevice {
        /// The id, lower-cased.
        device: String,
        /// The ids of the devices lint knows, sorted.
        known: Vec<String>,
    },
    /// A `capability` the rule requires that none of the devices it may
    /// apply to has (all known devices, or those its `deviceId` names).
    /// Only reported when lint is told the devices.
    UnknownCapability {
        /// The capability, lower-cased.
        capability: String,
        /// The known devices the rule requires, empty when it names none.
        devices: Vec<String>,
        /// The capabilities those devices (all known, when it names none)
        /// have, sorted.
        known: Vec<String>,
    },
    /// An `input.<param>` compared with a value of another type than every
    /// capability that declares it (and that the rule may apply to) gives
    /// it: the clause is always false. Only reported when lint is told the
    /// declared params.
    ParamType {
        /// The param, without `input.`.
        param: String,
        /// What the clause compares it with: `text`, `a number`, `a boolean`.
        compared_with: &'static str,
        /// The type the capabilities declare.
        declared: InputType,
    },
}

impl LintKind {
    /// A short stable name: `shadowed`, `empty_time_window`,
    /// `undeclared_param`, `unknown_device`, `unknown_capability`,
    /// `param_type`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LintKind::Shadowed { .. } => "shadowed",
            LintKind::EmptyTimeWindow { .. } => "empty_time_window",
            LintKind::UndeclaredParam { .. } => "undeclared_param",
            LintKind::UnknownDevice { .. } => "unknown_device",
            LintKind::UnknownCapability { .. } => "unknown_capability",
            LintKind::ParamType { .. } => "param_type",
        }
    }
}

/// A param type a manifest declares (dk-proto's `ParamType`, which this
/// crate does not depend on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InputType {
    /// A JSON string.
    String,
    /// A JSON number.
    Number,
    /// `true` or `false`.
    Boolean,
}

impl InputType {
    /// `string`, `number` or `boolean`.
    pub fn as_str(self) -> &'static str {
        match self {
            InputType::String => "string",
            InputType::Number => "number",
            InputType::Boolean => "boolean",
        }
    }
}

/// The input params that devices declare, per capability: what lint checks
/// `input.<param>` clauses against. Build it from manifests (every
/// capability's params) or from the paired devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeclaredParams {
    /// Capability name -> param name -> the types declared for it (two
    /// devices may declare the same capability differently).
    by_capability: BTreeMap<String, BTreeMap<String, BTreeSet<InputType>>>,
    /// Device id -> its capabilities (both lower-cased), when lint is told
    /// the devices.
    devices: BTreeMap<String, BTreeSet<String>>,
}

impl DeclaredParams {
    /// None declared yet.
    pub fn new() -> DeclaredParams {
        DeclaredParams::default()
    }

    /// Records that a capability named `capability` declares the param
    /// `param` of type `ty`.
    pub fn declare(&mut self, capability: &str, param: &str, ty: InputType) {
        self.by_capability
            .entry(capability.to_lowercase())
            .or_default()
            .entry(param.to_owned())
            .or_default()
            .insert(ty);
    }

    /// Records that the device `device` has the capability `capability`
    /// (whatever its params): with devices known, lint warns about a
    /// `deviceId` or `capability` none of them has.
    pub fn declare_device(&mut self, device: &str, capability: &str) {
        let capability = capability.to_lowercase();
        self.by_capability.entry(capability.clone()).or_default();
        self.devices
            .entry(device.to_lowercase())
            .or_default()
            .insert(capability);
    }

    /// The params the capabilities `capabilities` declare (all when
    /// `None`), sorted, each once.
    fn params_of(&self, capabilities: Option<&[&str]>) -> Vec<String> {
        let names: BTreeSet<&String> = self
            .by_capability
            .iter()
            .filter(|(name, _)| capabilities.is_none_or(|caps| caps.contains(&name.as_str())))
            .flat_map(|(_, params)| params.keys())
            .collect();
        names.into_iter().cloned().collect()
    }

    /// The types declared for `param` by the capabilities `capabilities`
    /// (lower-cased; all capabilities when `None`).
    fn types(&self, param: &str, capabilities: Option<&[&str]>) -> BTreeSet<InputType> {
        self.by_capability
            .iter()
            .filter(|(name, _)| capabilities.is_none_or(|caps| caps.contains(&name.as_str())))
            .filter_map(|(_, params)| params.get(param))
            .flatten()
            .copied()
            .collect()
    }
}

/// What lint is told beyond the rules.
#[derive(Clone, Copy, Debug, Default)]
pub struct LintOptions<'a> {
    /// The params devices declare: with them, lint warns about `input.`
    /// params no capability declares, or compared with the wrong type.
    /// `None`: those checks are skipped.
    pub declared_params: Option<&'a DeclaredParams>,
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
            LintKind::EmptyTimeWindow { window } => format!(
                "`time in {window}` is an empty window (it starts where it ends), so the clause is always false: write `time in 00:00..24:00` for the whole day"
            ),
            LintKind::UndeclaredParam {
                param,
                capabilities,
                declared,
            } => match capabilities.as_slice() {
                [] => format!(
                    "`input.{param}`: no capability declares a param `{param}` (declared: {}), so the clause is always false",
                    listed(declared)
                ),
                caps => format!(
                    "`input.{param}`: no capability `{}` declares a param `{param}` (declared: {}), so the clause is always false",
                    caps.join("`, `"),
                    listed(declared)
                ),
            },
            LintKind::UnknownDevice { device, known } => format!(
                "`deviceId` `{device}`: no device has this id (devices: {}), so the clause never holds for it",
                listed(known)
            ),
            LintKind::UnknownCapability {
                capability,
                devices,
                known,
            } => match devices.as_slice() {
                [] => format!(
                    "`capability` `{capability}`: no device has this capability (capabilities: {}), so the clause never holds for it",
                    listed(known)
                ),
                devices => format!(
                    "`capability` `{capability}`: device `{}` has no such capability (capabilities: {}), so the clause never holds for it",
                    devices.join("`, `"),
                    listed(known)
                ),
            },
            LintKind::ParamType {
                param,
                compared_with,
                declared,
            } => format!(
                "`input.{param}` is compared with {compared_with}, but it is declared a {}, so the clause is always false",
                declared.as_str()
            ),
        }
    }
}

/// Names in backticks joined with `, `, or `none`.
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    quoted.join(", ")
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

/// Lints checked rules, in file order, without declared params. Pure: the
/// line of each warning is the rule's own [`Rule::location`].
pub fn lint(rules: &[Rule]) -> Vec<LintWarning> {
    lint_with(rules, &LintOptions::default())
}

/// Lints checked rules, in file order, with what `options` tells. Pure.
pub fn lint_with(rules: &[Rule], options: &LintOptions<'_>) -> Vec<LintWarning> {
    let mut warnings = Vec::new();
    for rule in rules.iter().filter(|r| r.enabled) {
        let mut warn = |kind: LintKind| {
            warnings.push(LintWarning {
                index: rule.index,
                rule: rule.name.clone(),
                location: rule.location,
                kind,
            });
        };
        for (window, _) in rule.condition.windows() {
            if window.is_empty() {
                warn(LintKind::EmptyTimeWindow {
                    window: window.to_string(),
                });
            }
        }
        if let Some(declared) = options.declared_params {
            devices(rule, declared, &mut warn);
            params(rule, declared, &mut warn);
        }
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
    lint_yaml_str_with(text, &LintOptions::default())
}

/// [`lint_yaml_str`] with what `options` tells (the declared params).
pub fn lint_yaml_str_with(
    text: &str,
    options: &LintOptions<'_>,
) -> Result<Vec<LintWarning>, PolicyFileError> {
    let rules = crate::file::load_str(text)?.rules;
    let mut warnings = lint_with(&rules, options);
    for warning in warnings.iter_mut().take(MAX_LOCATED_WARNINGS) {
        if warning.location.is_none() {
            warning.location = crate::file::locate_rule(text, warning.index);
        }
    }
    Ok(warnings)
}

/// Warnings about the `deviceId` and `capability` values `rule` requires
/// that no known device has, when the devices are known.
fn devices(rule: &Rule, declared: &DeclaredParams, warn: &mut dyn FnMut(LintKind)) {
    if declared.devices.is_empty() || !(rule.action == "device_use" || rule.action == "*") {
        return;
    }
    let known: Vec<String> = declared.devices.keys().cloned().collect();
    let required = rule.condition.required_values(KnownField::DeviceId);
    let mut named = Vec::new();
    for device in required.iter().flatten() {
        if declared.devices.contains_key(*device) {
            named.push((*device).to_owned());
        } else {
            warn(LintKind::UnknownDevice {
                device: (*device).to_owned(),
                known: known.clone(),
            });
        }
    }
    // A rule whose devices are all unknown says nothing more.
    if required.is_some() && named.is_empty() {
        return;
    }
    let capabilities: BTreeSet<&String> = declared
        .devices
        .iter()
        .filter(|(id, _)| named.is_empty() || named.contains(id))
        .flat_map(|(_, caps)| caps)
        .collect();
    for capability in rule
        .condition
        .required_values(KnownField::Capability)
        .iter()
        .flatten()
    {
        if !capabilities.iter().any(|c| c.as_str() == *capability) {
            warn(LintKind::UnknownCapability {
                capability: (*capability).to_owned(),
                devices: named.clone(),
                known: capabilities.iter().map(|c| (*c).clone()).collect(),
            });
        }
    }
}

/// Warnings about `rule`'s `input.` clauses against the declared params:
/// once per param (undeclared), once per param and type (mismatch).
fn params(rule: &Rule, declared: &DeclaredParams, warn: &mut dyn FnMut(LintKind)) {
    let capabilities = rule.condition.required_values(KnownField::Capability);
    let mut seen: Vec<(String, Option<&'static str>)> = Vec::new();
    let mut check = |param: &str, compared: Option<(&'static str, InputType)>| {
        let types = declared.types(param, capabilities.as_deref());
        if types.is_empty() {
            if !seen.iter().any(|(p, c)| p == param && c.is_none()) {
                seen.push((param.to_owned(), None));
                warn(LintKind::UndeclaredParam {
                    param: param.to_owned(),
                    capabilities: capabilities
                        .iter()
                        .flatten()
                        .map(|c| (*c).to_owned())
                        .collect(),
                    declared: declared.params_of(capabilities.as_deref()),
                });
            }
            return;
        }
        let Some((compared_with, wanted)) = compared else {
            return;
        };
        // Sure only when every declaration disagrees, and all the same way.
        let mut iter = types.iter();
        if let (Some(&only), None) = (iter.next(), iter.next())
            && only != wanted
            && !seen
                .iter()
                .any(|(p, c)| p == param && *c == Some(compared_with))
        {
            seen.push((param.to_owned(), Some(compared_with)));
            warn(LintKind::ParamType {
                param: param.to_owned(),
                compared_with,
                declared: only,
            });
        }
    };
    let mut clauses = Vec::new();
    rule.condition.root.visit_clauses(&mut |clause| {
        if clause.field.known == KnownField::Input {
            clauses.push(clause);
        }
    });
    for clause in clauses {
        let param = clause.field.param();
        let literal_type = |literal: &Literal| match literal {
            Literal::Text => ("text", InputType::String),
            Literal::Number(_) => ("a number", InputType::Number),
            Literal::Bool(_) => ("a boolean", InputType::Boolean),
        };
        match &clause.op {
            Op::Equals(v) => check(param, Some(literal_type(&v.literal))),
            Op::In(values) => {
                let mut kinds = values.iter().map(|v| literal_type(&v.literal));
                let first = kinds.next();
                // A list mixing types matches some param type: no warning.
                let same = first.filter(|f| kinds.all(|k| k == *f));
                check(param, same);
            }
            Op::Contains(_) | Op::StartsWith(_) | Op::EndsWith(_) => {
                check(param, Some(("text", InputType::String)));
            }
            Op::Compare(..) => check(param, Some(("a number", InputType::Number))),
            Op::Window(_) => check(param, None),
        }
    }
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
