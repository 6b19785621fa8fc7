//! Rule files: YAML text -> raw form -> checked [`Rule`]s, every error reported, fail closed.
//!
//! Choices where `policy.md` is silent:
//! - `version` is required and must be the number 1.
//! - `timezone` is optional: an IANA zone name, the zone `time` and
//!   `weekday` conditions are read in; an unknown name is an error.
//! - `policies` is required and must be a list; an empty list is fine.
//! - Two rules with the same name are an error: decisions name rules.
//! - `name` and `action` must not be empty, and `name` holds no control
//!   characters (it is printed in reasons and logs).
//! - An optional key written with no value (`enabled:`) counts as absent;
//!   an empty `agentScope` counts as absent, as in 8gent.
//! - A duplicate key inside a rule is an error.
//! - Files larger than [`MAX_FILE_BYTES`], with more than [`MAX_RULES`]
//!   rules, or expanding through aliases past the node or byte budgets of
//!   the reader are refused.

mod locate;
mod raw;
mod surrogates;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use serde::de::DeserializeSeed;

use crate::condition::{Condition, DEVICE_USE_FIELDS};
use crate::error::{Location, PolicyError, PolicyFileError};
use crate::rate::RateLimit;
use crate::rule::{DEVICE_USE, Rule, RuleDecision};
use crate::time::Zone;
use locate::{Target, locate};
use raw::{Budget, FileSeed, Raw, RawEntry, RawFile, RawKey, RawTop};

pub use raw::{MAX_RULES, MAX_SCALAR_BYTES, MAX_YAML_NODES};

/// The largest rule file read, in bytes.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// At most this many errors of one file get a line and column (each costs a
/// read of the file); the rest are reported without.
const MAX_LOCATED_ERRORS: usize = 16;

/// At most this many errors are reported for one file.
const MAX_REPORTED_ERRORS: usize = 200;

/// The fields a `device_use` call has beyond [`DEVICE_USE_FIELDS`] and
/// `input.<param>`: its local time and weekday.
const DEVICE_CALL_FIELDS: [&str; 2] = ["time", "weekday"];

const RULE_KEYS: [&str; 10] = [
    "name",
    "action",
    "condition",
    "decision",
    "message",
    "enabled",
    "agentScope",
    "environments",
    "immutable",
    "limit",
];

/// A rule file that loaded: its rules, and the zone it names.
#[derive(Debug)]
pub(crate) struct LoadedFile {
    pub(crate) rules: Vec<Rule>,
    pub(crate) zone: Option<Zone>,
}

pub(crate) fn load_path(path: &Path) -> Result<LoadedFile, PolicyFileError> {
    load_str(&read_rule_file(path)?)
}

/// The text of the rule file at `path`, as [`PolicySet::load`] reads it: at
/// most the largest rule file, UTF-8; for a host that also records what it
/// loaded (its digest), then parses it with [`PolicySet::from_yaml_str`].
///
/// [`PolicySet::load`]: crate::PolicySet::load
/// [`PolicySet::from_yaml_str`]: crate::PolicySet::from_yaml_str
pub fn read_rule_file(path: &Path) -> Result<String, PolicyFileError> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| {
        PolicyFileError::one(PolicyError::file(format!("cannot read `{shown}`: {e}")))
    })?;
    let mut bytes = Vec::new();
    let limit = u64::try_from(MAX_FILE_BYTES)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    file.take(limit).read_to_end(&mut bytes).map_err(|e| {
        PolicyFileError::one(PolicyError::file(format!("cannot read `{shown}`: {e}")))
    })?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        PolicyFileError::one(PolicyError::file(format!(
            "`{shown}` is not UTF-8 (at byte {})",
            e.utf8_error().valid_up_to()
        )))
    })?;
    Ok(text)
}

fn too_large() -> PolicyFileError {
    PolicyFileError::one(PolicyError::file(format!(
        "the file is larger than {MAX_FILE_BYTES} bytes"
    )))
}

/// Where the rule at `index` of `policies` starts in `text`, if the parser
/// gives a position (one read of the file per call).
pub(crate) fn locate_rule(text: &str, index: usize) -> Option<Location> {
    let prepared = surrogates::prepare(text).ok()?;
    locate(prepared.text(), &Target::Rule(index)).map(|l| prepared.original(l))
}

pub(crate) fn load_str(text: &str) -> Result<LoadedFile, PolicyFileError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let prepared = surrogates::prepare(text).map_err(PolicyFileError::one)?;
    let text = prepared.text();
    let budget = Budget::for_text(text.len());
    let deserializer = yaml_serde::Deserializer::from_str(text);
    let raw = match (FileSeed { budget: &budget }).deserialize(deserializer) {
        Ok(raw) => raw,
        Err(error) => {
            let message = match budget.stopped.borrow_mut().take() {
                Some(message) => message,
                None if error.to_string().contains("repetition limit exceeded") => {
                    "yaml aliases expand too much (repetition limit exceeded)".to_owned()
                }
                None => format!("invalid yaml: {}", prepared.message(&error.to_string())),
            };
            let mut error_out = PolicyError::file(message);
            error_out.location = error.location().map(|l| {
                prepared.original(Location {
                    line: l.line(),
                    column: l.column(),
                })
            });
            return Err(PolicyFileError::one(error_out));
        }
    };
    let mut checker = Checker::default();
    let rules = checker.file(raw);
    if checker.errors.is_empty() {
        return Ok(LoadedFile {
            rules,
            zone: checker.zone,
        });
    }
    let mut errors = checker.errors;
    errors.truncate(MAX_REPORTED_ERRORS);
    let mut cache: HashMap<Target, Option<Location>> = HashMap::new();
    let mut out = Vec::with_capacity(errors.len());
    for (mut error, target) in errors {
        if let Some(target) = target {
            if let Some(location) = cache.get(&target) {
                error.location = *location;
            } else if cache.len() < MAX_LOCATED_ERRORS {
                let location = locate(text, &target).map(|l| prepared.original(l));
                cache.insert(target, location);
                error.location = location;
            }
        }
        out.push(error);
    }
    // File order: top-level errors, then each rule's errors by position.
    out.sort_by_key(|e| {
        let at = e.location.map_or((usize::MAX, 0), |l| (l.line, l.column));
        (e.rule_index, at)
    });
    Err(PolicyFileError::new(out))
}

#[derive(Default)]
struct Checker {
    errors: Vec<(PolicyError, Option<Target>)>,
    /// The file's `timezone:`, once read.
    zone: Option<Zone>,
}

/// The fields of one rule entry, as far as they could be read.
#[derive(Default)]
struct Fields {
    name: Option<String>,
    action: Option<String>,
    condition: Option<String>,
    decision: Option<RuleDecision>,
    message: Option<String>,
    enabled: Option<bool>,
    agent_scope: Option<String>,
    environments: Vec<String>,
    immutable: Option<bool>,
    limit: Option<RateLimit>,
    /// A present key whose value was wrong: do not also report it missing.
    bad: Vec<&'static str>,
}

/// What a rule file's top level held: whether `version` and `policies`
/// were there, and the entries of `policies`.
#[derive(Default)]
struct Top {
    version_seen: bool,
    policies_seen: bool,
    policies: Option<Vec<RawEntry>>,
}

impl Checker {
    fn push(&mut self, error: PolicyError, target: Option<Target>) {
        self.errors.push((error, target));
    }

    fn file(&mut self, raw: RawFile) -> Vec<Rule> {
        let Some(entries) = self.file_mapping(raw) else {
            return Vec::new();
        };
        let mut top = Top::default();
        let mut key_counts: HashMap<Option<String>, usize> = HashMap::new();
        for (key, value) in entries {
            if let Some(name) = self.top_key(key, &mut key_counts) {
                self.top_value(name, value, &mut top);
            }
        }
        if !top.version_seen {
            self.push(PolicyError::file("missing `version: 1`"), None);
        }
        if !top.policies_seen {
            self.push(PolicyError::file("missing `policies`"), None);
        }
        let mut rules = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        for (index, entry) in top.policies.unwrap_or_default().into_iter().enumerate() {
            if let Some(rule) = self.rule(index, entry, &mut names) {
                rules.push(rule);
            }
        }
        rules
    }

    /// The entries of a rule file's top-level mapping; `None` after
    /// pushing the error when it is no mapping.
    fn file_mapping(&mut self, raw: RawFile) -> Option<Vec<(RawKey, RawTop)>> {
        match raw {
            RawFile::Map(entries) => Some(entries),
            RawFile::Other(raw) => {
                let found = raw.kind();
                self.push(
                    PolicyError::file(format!(
                        "a rule file is a mapping with `version: 1` and `policies`, found {found}"
                    )),
                    None,
                );
                None
            }
        }
    }

    /// A top-level key's name, counted in `key_counts`; `None` after
    /// pushing the error when it is not a string or was seen before.
    fn top_key(
        &mut self,
        key: RawKey,
        key_counts: &mut HashMap<Option<String>, usize>,
    ) -> Option<String> {
        let key_text = match &key {
            RawKey::Str(text) => Some(text.clone()),
            RawKey::Other(_) => None,
        };
        let count = key_counts.entry(key_text.clone()).or_default();
        let nth = *count;
        *count += 1;
        let target_key = Target::TopKey(key_text, nth);
        let name = match key {
            RawKey::Str(name) => name,
            RawKey::Other(kind) => {
                self.push(
                    PolicyError::file(format!("keys must be strings, found {kind}")),
                    Some(target_key),
                );
                return None;
            }
        };
        if nth > 0 {
            self.push(
                PolicyError::file(format!("duplicate key `{name}`")),
                Some(target_key),
            );
            return None;
        }
        Some(name)
    }

    /// Takes the value of the top-level key `name` (seen once) into `top`,
    /// or the file's zone; pushes what is wrong with it.
    fn top_value(&mut self, name: String, value: RawTop, top: &mut Top) {
        match (name.as_str(), value) {
            ("version", RawTop::Value(raw)) => {
                top.version_seen = true;
                self.version(raw);
            }
            ("timezone", RawTop::Value(raw)) => self.timezone(raw),
            ("policies", RawTop::Policies(list)) => {
                top.policies_seen = true;
                top.policies = Some(list);
            }
            ("policies", RawTop::Value(other)) => {
                top.policies_seen = true;
                let found = other.kind();
                self.push(
                    PolicyError::file(format!(
                        "`policies` must be a list of rules (`[]` for none), found {found}"
                    )),
                    Some(Target::TopValue(name)),
                );
            }
            (_, _) => {
                let error = PolicyError::file(format!(
                    "unknown key `{name}` (a rule file has `version`, `policies` and optionally `timezone`)"
                ));
                self.push(error, Some(Target::TopKey(Some(name), 0)));
            }
        }
    }

    /// `version`, which must be 1.
    fn version(&mut self, raw: Raw) {
        let found = match raw {
            Raw::Int(1) => return,
            Raw::Int(n) => format!("{n}"),
            other => other.kind().to_owned(),
        };
        self.push(
            PolicyError::file(format!("`version` must be 1, found {found}")),
            Some(Target::TopValue("version".to_owned())),
        );
    }

    /// `timezone`, an IANA zone name: the zone the file's rules read time in.
    fn timezone(&mut self, raw: Raw) {
        let error = match raw {
            Raw::Str(Some(zone_name)) => match Zone::named(&zone_name) {
                Ok(zone) => {
                    self.zone = Some(zone);
                    return;
                }
                Err(error) => format!("`timezone`: {error}"),
            },
            other => format!(
                "`timezone` must be an IANA zone name such as `Europe/Berlin`, found {}",
                other.kind()
            ),
        };
        self.push(
            PolicyError::file(error),
            Some(Target::TopValue("timezone".to_owned())),
        );
    }

    /// One entry of `policies` as a checked rule, or `None` after pushing
    /// every error found in it: its mapping, then its keys one by one, the
    /// required keys, its name's uniqueness, its `limit` and its condition.
    fn rule(
        &mut self,
        index: usize,
        entry: RawEntry,
        names: &mut HashMap<String, usize>,
    ) -> Option<Rule> {
        let raw_fields = self.rule_mapping(index, entry)?;
        // The name first, so every error of the rule can carry it.
        let name_hint = name_hint(&raw_fields);
        let name_hint = name_hint.as_deref();
        let errors_before = self.errors.len();
        let fields = self.rule_fields(index, name_hint, raw_fields);
        self.check_required(index, name_hint, &fields);
        self.check_unique_name(index, name_hint, &fields, names);
        self.check_limit(index, name_hint, &fields);
        let condition = fields
            .condition
            .as_deref()
            .and_then(|text| self.condition(index, name_hint, text, fields.action.as_deref()));
        if self.errors.len() > errors_before {
            return None;
        }
        fields.into_rule(index, condition?)
    }

    /// The key-value pairs of a rule entry, or an error when it is not a
    /// mapping.
    fn rule_mapping(&mut self, index: usize, entry: RawEntry) -> Option<Vec<(RawKey, Raw)>> {
        match entry {
            RawEntry::Rule(fields) => Some(fields),
            RawEntry::Other(raw) => {
                let found = raw.kind();
                self.push(
                    PolicyError::rule(
                        index,
                        None,
                        format!("a rule must be a mapping, found {found}"),
                    ),
                    Some(Target::Rule(index)),
                );
                None
            }
        }
    }

    /// Reads each key of a rule in the file's order, with an error for a
    /// key that is not a string, a duplicate, an unknown key or a wrong
    /// value.
    fn rule_fields(
        &mut self,
        index: usize,
        name_hint: Option<&str>,
        raw_fields: Vec<(RawKey, Raw)>,
    ) -> Fields {
        let mut fields = Fields::default();
        let mut key_counts: HashMap<Option<String>, usize> = HashMap::new();
        for (key, value) in raw_fields {
            let key_text = match &key {
                RawKey::Str(text) => Some(text.clone()),
                RawKey::Other(_) => None,
            };
            let count = key_counts.entry(key_text.clone()).or_default();
            let nth = *count;
            *count += 1;
            let key_target = Target::RuleKey(index, key_text, nth);
            let key = match key {
                RawKey::Str(key) => key,
                RawKey::Other(kind) => {
                    self.push(
                        PolicyError::rule(
                            index,
                            name_hint,
                            format!("keys must be strings, found {kind}"),
                        ),
                        Some(key_target),
                    );
                    continue;
                }
            };
            if nth > 0 {
                self.push(
                    PolicyError::rule(index, name_hint, format!("duplicate key `{key}`")),
                    Some(key_target),
                );
                continue;
            }
            let Some(known) = RULE_KEYS.iter().copied().find(|k| *k == key) else {
                self.push(
                    PolicyError::rule(
                        index,
                        name_hint,
                        format!(
                            "unknown key `{key}` (expected name, action, condition, decision, message, enabled, agentScope, environments, immutable or limit)"
                        ),
                    ),
                    Some(key_target),
                );
                continue;
            };
            if let Err(message) = fields.set(known, value) {
                fields.bad.push(known);
                self.push(
                    PolicyError::rule(index, name_hint, message),
                    Some(Target::RuleValue(index, key)),
                );
            }
        }
        fields
    }

    /// An error for each required key a rule lacks (not for one present
    /// with a wrong value: that one is reported already).
    fn check_required(&mut self, index: usize, name_hint: Option<&str>, fields: &Fields) {
        for required in ["name", "action", "condition", "decision", "message"] {
            let present = match required {
                "name" => fields.name.is_some(),
                "action" => fields.action.is_some(),
                "condition" => fields.condition.is_some(),
                "decision" => fields.decision.is_some(),
                _ => fields.message.is_some(),
            };
            if !present && !fields.bad.contains(&required) {
                self.push(
                    PolicyError::rule(index, name_hint, format!("missing `{required}`")),
                    Some(Target::Rule(index)),
                );
            }
        }
    }

    /// An error when an earlier rule has the same name; else the name is
    /// recorded in `names`.
    fn check_unique_name(
        &mut self,
        index: usize,
        name_hint: Option<&str>,
        fields: &Fields,
        names: &mut HashMap<String, usize>,
    ) {
        if let Some(name) = &fields.name {
            if let Some(first) = names.get(name) {
                self.push(
                    PolicyError::rule(
                        index,
                        name_hint,
                        format!("duplicate rule name `{name}` (also policies[{first}])"),
                    ),
                    Some(Target::RuleValue(index, "name".to_owned())),
                );
            } else {
                names.insert(name.clone(), index);
            }
        }
    }

    /// An error when a rule's `limit` could never count: on an allow rule,
    /// or on an action other than `device_use` (or `*`).
    fn check_limit(&mut self, index: usize, name_hint: Option<&str>, fields: &Fields) {
        if fields.limit.is_some() {
            let why = match (fields.decision, fields.action.as_deref()) {
                (Some(RuleDecision::Allow), _) => Some(
                    "`limit` on an allow rule changes nothing (rules only narrow): give the rule `decision: block` or `require_approval`",
                ),
                (_, Some(action)) if action != DEVICE_USE && action != "*" => {
                    Some("`limit` counts device calls: it needs `action: device_use` (or `*`)")
                }
                _ => None,
            };
            if let Some(why) = why {
                self.push(
                    PolicyError::rule(index, name_hint, why.to_owned()),
                    Some(Target::RuleValue(index, "limit".to_owned())),
                );
            }
        }
    }

    fn condition(
        &mut self,
        index: usize,
        name: Option<&str>,
        text: &str,
        action: Option<&str>,
    ) -> Option<Condition> {
        let target = Target::RuleValue(index, "condition".to_owned());
        match Condition::parse(text) {
            Ok(condition) => {
                let mut ok = true;
                if matches!(action, Some(DEVICE_USE | "*")) {
                    for (field, span) in condition.fields() {
                        let known = DEVICE_USE_FIELDS.contains(&field)
                            || DEVICE_CALL_FIELDS.contains(&field)
                            || field.starts_with("input.");
                        if !known {
                            ok = false;
                            let mut error = PolicyError::rule(
                                index,
                                name,
                                format!(
                                    "unknown field `{field}` for a device_use rule (expected deviceId, capability, capabilityKind, agentId, sessionId, input.<param>, time or weekday)"
                                ),
                            );
                            error.condition_span = Some(span);
                            self.push(error, Some(target.clone()));
                        }
                    }
                    for e in condition.device_use_value_errors() {
                        ok = false;
                        let mut error = PolicyError::rule(index, name, e.message());
                        error.condition_span = Some(e.span());
                        self.push(error, Some(target.clone()));
                    }
                }
                if !matches!(action, Some(DEVICE_USE | "*")) {
                    // Other actions' contexts hold strings only: no input,
                    // no instant. Such a clause would never match.
                    for e in condition.device_call_only_errors() {
                        ok = false;
                        let mut error = PolicyError::rule(index, name, e.message());
                        error.condition_span = Some(e.span());
                        self.push(error, Some(target.clone()));
                    }
                }
                ok.then_some(condition)
            }
            Err(errors) => {
                for e in errors.errors() {
                    let mut error = PolicyError::rule(index, name, e.message());
                    error.condition_span = Some(e.span());
                    self.push(error, Some(target.clone()));
                }
                None
            }
        }
    }
}

/// A rule's `name`, when it is a usable one, read before its other keys so
/// that every error of the rule can carry it.
fn name_hint(raw_fields: &[(RawKey, Raw)]) -> Option<String> {
    raw_fields
        .iter()
        .find(|(k, _)| matches!(k, RawKey::Str(k) if k == "name"))
        .and_then(|(_, v)| match v {
            Raw::Str(Some(v)) if !v.is_empty() && !v.chars().any(char::is_control) => {
                Some(v.clone())
            }
            _ => None,
        })
}

impl Fields {
    /// The checked rule, when every required field and the `condition`
    /// were read.
    fn into_rule(self, index: usize, condition: Condition) -> Option<Rule> {
        let (Some(name), Some(action), Some(condition_text), Some(decision), Some(message)) = (
            self.name,
            self.action,
            self.condition,
            self.decision,
            self.message,
        ) else {
            return None;
        };
        let reason = format!("[{name}] {message}");
        Some(Rule {
            index,
            name,
            action,
            decision,
            message,
            enabled: self.enabled.unwrap_or(true),
            agent_scope: self.agent_scope.filter(|s| !s.is_empty()),
            condition,
            condition_text,
            environments: self.environments,
            immutable: self.immutable.unwrap_or(false),
            limit: self.limit,
            location: None,
            reason,
        })
    }

    /// Records a known key's value, or says what is wrong with it.
    fn set(&mut self, key: &'static str, value: Raw) -> Result<(), String> {
        let found = value.kind();
        match (key, value) {
            ("name", Raw::Str(Some(text))) => {
                if text.trim().is_empty() {
                    return Err("`name` must not be empty".to_owned());
                }
                if text.chars().any(char::is_control) {
                    return Err("`name` must not hold control characters".to_owned());
                }
                self.name = Some(text);
            }
            ("action", Raw::Str(Some(text))) => {
                if text.is_empty() {
                    return Err("`action` must not be empty".to_owned());
                }
                if text != DEVICE_USE && is_device_use_misspelt(&text) {
                    let shown = text.escape_debug();
                    return Err(format!(
                        "`action` `{shown}` is not `{DEVICE_USE}`, so the rule would never apply: write `action: {DEVICE_USE}`"
                    ));
                }
                self.action = Some(text);
            }
            ("condition", Raw::Str(Some(text))) => self.condition = Some(text),
            ("message", Raw::Str(Some(text))) => self.message = Some(text),
            ("decision", Raw::Str(Some(text))) => match RuleDecision::parse(&text) {
                Some(decision) => self.decision = Some(decision),
                None => {
                    return Err(format!(
                        "`decision` must be block, require_approval or allow, found `{text}`"
                    ));
                }
            },
            ("enabled", Raw::Bool(b)) => self.enabled = Some(b),
            ("immutable", Raw::Bool(b)) => self.immutable = Some(b),
            ("agentScope", Raw::Str(Some(text))) => self.agent_scope = Some(text),
            ("limit", Raw::Str(Some(text))) => {
                self.limit = Some(RateLimit::parse(&text).map_err(|e| e.to_string())?)
            }
            (
                "environments",
                Raw::Seq {
                    all_strings: true,
                    strings,
                    ..
                },
            ) => self.environments = strings,
            ("enabled" | "immutable" | "agentScope" | "environments" | "limit", Raw::Null) => {}
            ("enabled" | "immutable", _) => {
                return Err(format!("`{key}` must be true or false, found {found}"));
            }
            ("environments", _) => {
                return Err(format!(
                    "`environments` must be a list of strings, found {found}"
                ));
            }
            (_, _) => return Err(format!("`{key}` must be a string, found {found}")),
        }
        Ok(())
    }
}

/// Whether `action`, lower-cased, trimmed of whitespace, `-` and `_`, and
/// with `-` and whitespace read as `_`, is `device_use`: a near miss no call
/// ever names (actions compare exactly).
fn is_device_use_misspelt(action: &str) -> bool {
    let lower = action.to_lowercase();
    let trimmed = lower.trim_matches(|c: char| c.is_whitespace() || c == '-' || c == '_');
    let folded: String = trimmed
        .chars()
        .map(|c| {
            if c == '-' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    folded == DEVICE_USE || folded == "deviceuse"
}

#[cfg(test)]
mod tests;
