//! The audit chain: canonical entry text, entry hashes, chaining a batch of
//! events onto a head, verification of a stored log, the redaction
//! helper that keeps secrets and long values out of entries, and the log
//! event each stored entry makes ([`log_appended`]).

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::{AuditEvent, AuditText, StoreError};

mod chain;
mod verify;

pub use chain::GENESIS_HASH;
#[cfg(test)]
pub(crate) use chain::entry_hash;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use chain::links;
pub(crate) use chain::{Hashing, KEYED_KIND, RawRow, chain};
pub(crate) use verify::*;

/// The largest canonical JSON text of one audit entry, in bytes (64 KiB).
pub const MAX_AUDIT_ENTRY_BYTES: usize = 64 * 1024;

/// `redact_for_audit` cuts strings longer than this many characters.
pub const MAX_AUDIT_STRING: usize = 256;

/// `redact_for_audit` keeps at most this many items of an array or object.
pub const MAX_AUDIT_ITEMS: usize = 64;

/// `redact_for_audit` replaces values nested deeper than this.
pub const MAX_AUDIT_DEPTH: usize = 8;

/// The longest audit kind, in bytes.
const MAX_KIND: usize = 32;

/// One INFO event (target `dk_store::audit`, message `audit entry`) per
/// entry of `events`, now stored, the first under `first_seq`: its `seq`
/// and `kind`, and, named as in the entry, those of its fields that say who
/// and what a call, a pairing or a grant change is about and what was
/// decided (`deviceId`, `agentId`, `capability`, `tool`, `allowed`,
/// `reason`, `rule`, `channel`, `sessionId`), when the entry has them.
/// Entries hold no secret (their makers redact them); an entry's input and
/// other nested values are left out.
pub(crate) fn log_appended<E: Logged>(first_seq: u64, events: &[E]) {
    if !tracing::enabled!(target: "dk_store::audit", tracing::Level::INFO) {
        return;
    }
    for (seq, event) in (first_seq..).zip(events) {
        let entry = event.details();
        let text = |name: &str| entry.get(name).and_then(Value::as_str);
        let allowed = entry.get("allowed").and_then(Value::as_bool);
        tracing::info!(
            target: "dk_store::audit",
            seq,
            kind = event.kind(),
            "deviceId" = text("deviceId"),
            "agentId" = text("agentId"),
            capability = text("capability"),
            tool = text("tool"),
            allowed,
            reason = text("reason"),
            rule = text("rule"),
            channel = text("channel"),
            "sessionId" = text("sessionId"),
            "audit entry"
        );
    }
}

/// What [`log_appended`] reads of an appended event.
pub(crate) trait Logged {
    /// The event's kind.
    fn kind(&self) -> &str;
    /// The event's details.
    fn details(&self) -> Cow<'_, Value>;
}

impl Logged for AuditEvent {
    fn kind(&self) -> &str {
        &self.kind
    }

    fn details(&self) -> Cow<'_, Value> {
        Cow::Borrowed(&self.entry)
    }
}

impl Logged for AuditText {
    fn kind(&self) -> &str {
        &self.kind
    }

    /// Read back from the text: only when the entries are logged.
    fn details(&self) -> Cow<'_, Value> {
        Cow::Owned(serde_json::from_str(&self.text).unwrap_or(Value::Null))
    }
}

impl AuditText {
    /// The text of `event`, or why no store can take it: a kind not
    /// `[a-z0-9._-]{1,32}`, details over [`MAX_AUDIT_ENTRY_BYTES`], a time
    /// past `i64`.
    pub fn of(event: &AuditEvent) -> Result<AuditText, StoreError> {
        let (at_ms, text) = checked(event)?;
        let field = |name: &str| {
            event
                .entry
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Ok(AuditText {
            at_ms,
            kind: event.kind.clone(),
            text,
            device_id: field(crate::entry::fields::DEVICE_ID),
            agent_id: field(crate::entry::fields::AGENT_ID),
            allowed: event
                .entry
                .get(crate::entry::fields::ALLOWED)
                .and_then(Value::as_bool),
        })
    }

    /// The text of a `decision` entry at `at_ms`, written from the record
    /// itself: the same as [`AuditText::of`] the event
    /// [`AuditEvent::of`] makes of it, without building its [`Value`].
    /// The record must already be redacted and cut, as every event is.
    pub fn decision(
        at_ms: u64,
        decision: &crate::entry::Decision,
    ) -> Result<AuditText, StoreError> {
        let mut out = Vec::with_capacity(512);
        write_decision(decision, &mut out);
        // serde_json writes UTF-8 only.
        let text = String::from_utf8(out).unwrap_or_default();
        if text.len() > MAX_AUDIT_ENTRY_BYTES {
            return Err(too_large(text.len()));
        }
        Ok(AuditText {
            at_ms: to_i64(at_ms, "audit time")?,
            kind: crate::entry::kinds::DECISION.to_owned(),
            text,
            device_id: decision.device_id.clone(),
            agent_id: decision.agent_id.clone(),
            allowed: Some(decision.allowed),
        })
    }
}

/// Writes a decision's canonical JSON into `out`: its keys in byte order,
/// each as serde gives it (`null` for the texts it always has, left out
/// for the parts it may not have), the input canonical.
fn write_decision(decision: &crate::entry::Decision, out: &mut Vec<u8>) {
    fn key(out: &mut Vec<u8>, first: &mut bool, name: &str) {
        if !std::mem::take(first) {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
    }
    fn json(out: &mut Vec<u8>, value: &impl serde::Serialize) {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, value);
    }
    let mut first = true;
    out.push(b'{');
    key(out, &mut first, "agentId");
    json(out, &decision.agent_id);
    if let Some(allowance) = &decision.allowance {
        key(out, &mut first, "allowance");
        out.push(b'{');
        let mut inner = true;
        if allowance.created {
            key(out, &mut inner, "created");
            out.extend_from_slice(b"true");
        }
        key(out, &mut inner, "id");
        json(out, &allowance.id);
        out.push(b'}');
    }
    key(out, &mut first, "allowed");
    json(out, &decision.allowed);
    if let Some(by) = &decision.by {
        key(out, &mut first, "by");
        // Its fields (`frontEnd`, then `session`) are declared in byte order.
        json(out, by);
    }
    if let Some(caller) = &decision.caller {
        key(out, &mut first, "caller");
        json(out, caller);
    }
    key(out, &mut first, "capability");
    json(out, &decision.capability);
    if let Some(channel) = &decision.channel {
        key(out, &mut first, "channel");
        json(out, channel);
    }
    key(out, &mut first, "deviceId");
    json(out, &decision.device_id);
    if let Some(input) = &decision.input {
        key(out, &mut first, "input");
        write_canonical(input, out);
    }
    if let Some(person) = &decision.person {
        key(out, &mut first, "person");
        json(out, person);
    }
    key(out, &mut first, "reason");
    json(out, &decision.reason);
    key(out, &mut first, "rule");
    json(out, &decision.rule);
    key(out, &mut first, "sessionId");
    json(out, &decision.session_id);
    key(out, &mut first, "tool");
    json(out, &decision.tool);
    out.push(b'}');
}

/// A copy of `value` cut for the audit log: strings longer than
/// [`MAX_AUDIT_STRING`] characters are cut, arrays and objects keep their
/// first [`MAX_AUDIT_ITEMS`] items, and values deeper than
/// [`MAX_AUDIT_DEPTH`] are replaced; every cut says how much was left out.
/// Secrets are not its business: redact before or after.
pub fn cut_for_audit(value: &Value) -> Value {
    cut_for_audit_with(value, 0, &mut |text: &str| text.to_owned())
}

/// Like [`cut_for_audit`], with every string and object key that is kept
/// passed through `redact` first. A string longer than [`MAX_AUDIT_STRING`]
/// is given to `redact` with `lookahead` characters more than what is kept
/// (one less than the longest secret), so a secret across the cut is
/// redacted whole; then what comes back loses its tail after the last
/// replacement, up to `lookahead` characters: a secret starting there and
/// running past what was read never reaches the entry, not even in part.
/// The cut's marker counts the characters of the original past the first
/// [`MAX_AUDIT_STRING`].
pub fn cut_for_audit_with(
    value: &Value,
    lookahead: usize,
    redact: &mut dyn FnMut(&str) -> String,
) -> Value {
    cut(value, 0, lookahead, redact)
}

fn cut(
    value: &Value,
    depth: usize,
    lookahead: usize,
    redact: &mut dyn FnMut(&str) -> String,
) -> Value {
    match value {
        Value::String(text) => Value::String(cut_text(text, lookahead, redact)),
        Value::Array(_) | Value::Object(_) if depth >= MAX_AUDIT_DEPTH => {
            Value::String("[cut: nested too deep]".to_owned())
        }
        Value::Array(items) => {
            let mut out: Vec<Value> = items
                .iter()
                .take(MAX_AUDIT_ITEMS)
                .map(|item| cut(item, depth + 1, lookahead, redact))
                .collect();
            if items.len() > MAX_AUDIT_ITEMS {
                out.push(Value::String(format!(
                    "[cut: {} more items]",
                    items.len() - MAX_AUDIT_ITEMS
                )));
            }
            Value::Array(out)
        }
        Value::Object(fields) => {
            let mut out = Map::with_capacity(fields.len().min(MAX_AUDIT_ITEMS + 1));
            for (key, item) in fields.iter().take(MAX_AUDIT_ITEMS) {
                out.insert(
                    cut_text(key, lookahead, redact),
                    cut(item, depth + 1, lookahead, redact),
                );
            }
            if fields.len() > MAX_AUDIT_ITEMS {
                out.insert(
                    "[cut]".to_owned(),
                    Value::String(format!("{} more fields", fields.len() - MAX_AUDIT_ITEMS)),
                );
            }
            Value::Object(out)
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
    }
}

/// Cuts `value` for the audit log where it stands: the same value
/// [`cut_for_audit_with`] makes as a copy, with `redact` called on the
/// same texts in the same order, but what needs no change is kept instead
/// of copied. `redact` gives `None` for a text with nothing to redact.
pub fn cut_for_audit_in_place(
    value: &mut Value,
    lookahead: usize,
    redact: &mut dyn FnMut(&str) -> Option<String>,
) {
    cut_in_place(value, 0, lookahead, redact);
}

fn cut_in_place(
    value: &mut Value,
    depth: usize,
    lookahead: usize,
    redact: &mut dyn FnMut(&str) -> Option<String>,
) {
    match value {
        Value::String(text) => {
            if let Some(changed) = cut_text_in_place(text, lookahead, redact) {
                *text = changed;
            }
        }
        Value::Array(_) | Value::Object(_) if depth >= MAX_AUDIT_DEPTH => {
            *value = Value::String("[cut: nested too deep]".to_owned());
        }
        Value::Array(items) => {
            let more = items.len().saturating_sub(MAX_AUDIT_ITEMS);
            items.truncate(MAX_AUDIT_ITEMS);
            for item in items.iter_mut() {
                cut_in_place(item, depth + 1, lookahead, redact);
            }
            if more > 0 {
                items.push(Value::String(format!("[cut: {more} more items]")));
            }
        }
        Value::Object(fields) => {
            let more = fields.len().saturating_sub(MAX_AUDIT_ITEMS);
            // Each key, then its value, as the copy does.
            let mut renamed = Vec::new();
            for (i, (key, item)) in fields.iter_mut().take(MAX_AUDIT_ITEMS).enumerate() {
                if let Some(changed) = cut_text_in_place(key, lookahead, redact) {
                    renamed.push((i, changed));
                }
                cut_in_place(item, depth + 1, lookahead, redact);
            }
            if more == 0 && renamed.is_empty() {
                return;
            }
            // A key changed or fields are left out: the object is rebuilt
            // as the copy builds it (a key redacted into another one's
            // name takes that one's place).
            let mut renamed = renamed.into_iter().peekable();
            let mut out = Map::with_capacity(fields.len().min(MAX_AUDIT_ITEMS + 1));
            for (i, (key, item)) in std::mem::take(fields)
                .into_iter()
                .take(MAX_AUDIT_ITEMS)
                .enumerate()
            {
                let key = match renamed.next_if(|(at, _)| *at == i) {
                    Some((_, changed)) => changed,
                    None => key,
                };
                out.insert(key, item);
            }
            if more > 0 {
                out.insert(
                    "[cut]".to_owned(),
                    Value::String(format!("{more} more fields")),
                );
            }
            *fields = out;
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `text` cut and redacted, `None` when that leaves it as it is.
fn cut_text_in_place(
    text: &str,
    lookahead: usize,
    redact: &mut dyn FnMut(&str) -> Option<String>,
) -> Option<String> {
    if text.len() <= MAX_AUDIT_STRING || text.chars().count() <= MAX_AUDIT_STRING {
        return redact(text);
    }
    Some(cut_text(text, lookahead, &mut |part: &str| {
        redact(part).unwrap_or_else(|| part.to_owned())
    }))
}

fn cut_text(text: &str, lookahead: usize, redact: &mut dyn FnMut(&str) -> String) -> String {
    let count = text.chars().count();
    if count <= MAX_AUDIT_STRING {
        return redact(text);
    }
    let read = MAX_AUDIT_STRING + lookahead;
    let (prefix, whole) = match text.char_indices().nth(read) {
        Some((at, _)) => (text.get(..at).unwrap_or(text), false),
        None => (text, true),
    };
    let redacted = redact(prefix);
    let usable = if whole {
        MAX_AUDIT_STRING
    } else {
        // The tail that redaction left as it was read may be the start of
        // a secret that runs past it: drop it, at most `lookahead`.
        let unchanged_tail = redacted
            .chars()
            .rev()
            .zip(prefix.chars().rev())
            .take_while(|(a, b)| a == b)
            .take(lookahead)
            .count();
        (redacted.chars().count() - unchanged_tail).min(MAX_AUDIT_STRING)
    };
    let mut out: String = redacted.chars().take(usable).collect();
    let _ = write!(out, "[cut: {} more characters]", count - MAX_AUDIT_STRING);
    out
}

/// Whether `value` as an entry's canonical JSON is at most
/// [`MAX_AUDIT_ENTRY_BYTES`]: a quick bound first (every character escaped
/// to six bytes), the exact text only when the bound is over.
pub fn fits_in_entry(value: &Value) -> bool {
    let mut bound = 0usize;
    if size_bound(value, &mut bound) {
        return true;
    }
    canonical_json(value).len() <= MAX_AUDIT_ENTRY_BYTES
}

/// Adds an upper bound of `value`'s canonical JSON size to `total`; false
/// once `total` passes [`MAX_AUDIT_ENTRY_BYTES`].
fn size_bound(value: &Value, total: &mut usize) -> bool {
    let text = |text: &str| 2 + 6 * text.len();
    *total += match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 32,
        Value::String(s) => text(s),
        Value::Array(items) => 2 + items.len(),
        Value::Object(fields) => 2 + fields.keys().map(|k| text(k) + 2).sum::<usize>(),
    };
    if *total > MAX_AUDIT_ENTRY_BYTES {
        return false;
    }
    match value {
        Value::Array(items) => items.iter().all(|item| size_bound(item, total)),
        Value::Object(fields) => fields.values().all(|item| size_bound(item, total)),
        _ => true,
    }
}

/// The canonical JSON text of a value: object keys sorted by their UTF-8
/// bytes, no insignificant whitespace, serde_json's escaping and numbers.
pub fn canonical_json(value: &Value) -> String {
    // Most entries (a decision, a grant) fit without growing the buffer.
    let mut out = Vec::with_capacity(512);
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// Writes `value` canonically into `out`: keys and scalars straight into the
/// text, as serde_json writes them, instead of a string of their own each
/// (the audit writer does this for every entry it stores).
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(fields) => {
            let mut sorted: Vec<(&String, &Value)> = fields.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

/// Converts a number for the database, which stores signed 64-bit integers.
pub(crate) fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::InvalidInput(format!("{what} {value} is too large")))
}

/// Checks an event and gives its time and canonical entry text.
fn checked(event: &AuditEvent) -> Result<(i64, String), StoreError> {
    let kind = &event.kind;
    let kind_ok = !kind.is_empty()
        && kind.len() <= MAX_KIND
        && kind.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if !kind_ok {
        return Err(StoreError::InvalidInput(format!(
            "audit kind `{}` is not [a-z0-9._-]{{1,{MAX_KIND}}}",
            kind.escape_debug()
        )));
    }
    let entry = canonical_json(&event.entry);
    if entry.len() > MAX_AUDIT_ENTRY_BYTES {
        return Err(too_large(entry.len()));
    }
    Ok((to_i64(event.at_ms, "audit time")?, entry))
}

fn too_large(bytes: usize) -> StoreError {
    StoreError::InvalidInput(format!(
        "audit entry of {bytes} bytes, more than {MAX_AUDIT_ENTRY_BYTES}"
    ))
}

/// The texts of `events`, each checked; the first refusal if any.
pub(crate) fn texts_of(events: &[AuditEvent]) -> Result<Vec<AuditText>, StoreError> {
    events.iter().map(AuditText::of).collect()
}

#[cfg(test)]
mod cut_tests;

#[cfg(test)]
mod text_tests;
