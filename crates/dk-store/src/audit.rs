//! The audit chain: canonical entry text, entry hashes, chaining a batch of
//! events onto a head, verification of a stored log, the redaction
//! helper that keeps secrets and long values out of entries, and the log
//! event each stored entry makes ([`log_appended`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::key::AuditKey;
use super::{
    AuditEntry, AuditEvent, AuditProblem, AuditText, ProblemKind, StoreError, VerifyReport,
};
use dk_files::hex::encode as hex;

/// The `prev_hash` of the first entry: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

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

/// How far from its stored `seq` an entry's content is looked for when its
/// hash does not match: this tells a renumbered entry from an edited one.
const MAX_SHIFT: i64 = 8;

/// How many mismatching entries are compared pairwise to find swapped
/// content; past this, they are reported as edited.
const MAX_SWAP_CANDIDATES: usize = 256;

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

/// The hash of one entry (see the module documentation of `store`).
pub(crate) fn entry_hash(prev_hash: &str, seq: i64, at_ms: i64, kind: &str, entry: &str) -> String {
    let mut hasher = Sha256::new();
    for part in entry_parts(prev_hash, &seq.to_string(), &at_ms.to_string(), kind, entry) {
        hasher.update(part);
    }
    hex(&hasher.finalize())
}

/// The text an entry's hash is taken of, in parts.
fn entry_parts<'a>(
    prev_hash: &'a str,
    seq: &'a str,
    at_ms: &'a str,
    kind: &'a str,
    entry: &'a str,
) -> [&'a [u8]; 9] {
    [
        prev_hash.as_bytes(),
        b"\n",
        seq.as_bytes(),
        b"\n",
        at_ms.as_bytes(),
        b"\n",
        kind.as_bytes(),
        b"\n",
        entry.as_bytes(),
    ]
}

/// The kind of the entry that starts a keyed chain: its own hash and every
/// later one are HMACs under the key whose id it holds (`{"keyId": ...}`).
pub(crate) const KEYED_KIND: &str = crate::entry::kinds::AUDIT_KEYED;

/// How an entry's hash is made: SHA-256, or HMAC-SHA256 under the key.
#[derive(Clone, Copy)]
pub(crate) enum Hashing<'k> {
    Plain,
    Keyed(&'k AuditKey),
}

impl Hashing<'_> {
    /// The hash of one entry.
    pub fn of(self, prev_hash: &str, seq: i64, at_ms: i64, kind: &str, entry: &str) -> String {
        match self {
            Hashing::Plain => entry_hash(prev_hash, seq, at_ms, kind, entry),
            Hashing::Keyed(key) => key.mac(&entry_parts(
                prev_hash,
                &seq.to_string(),
                &at_ms.to_string(),
                kind,
                entry,
            )),
        }
    }
}

/// An audit entry as stored, with the entry as its stored text. Numbers are
/// signed because that is what the database holds, whatever was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRow {
    pub seq: i64,
    pub at_ms: i64,
    pub kind: String,
    pub entry: String,
    pub prev_hash: String,
    pub hash: String,
}

impl RawRow {
    /// The row as an [`AuditEntry`], checking what the database gave back.
    pub(crate) fn to_entry(&self) -> Result<AuditEntry, StoreError> {
        let seq = u64::try_from(self.seq)
            .map_err(|_| StoreError::Corrupt(format!("audit entry with seq {}", self.seq)))?;
        let at_ms = u64::try_from(self.at_ms).map_err(|_| {
            StoreError::Corrupt(format!("audit entry {seq}: time {} ms", self.at_ms))
        })?;
        let entry = serde_json::from_str(&self.entry).map_err(|error| {
            StoreError::Corrupt(format!("audit entry {seq}: entry is not JSON: {error}"))
        })?;
        Ok(AuditEntry {
            seq,
            at_ms,
            kind: self.kind.clone(),
            entry,
            prev_hash: self.prev_hash.clone(),
            hash: self.hash.clone(),
        })
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

/// The `seq` and hash each of `texts` takes, chained onto the head (`seq`,
/// `hash`) of a log and hashed as `hashing` says, in order: each entry's
/// `prev_hash` is the hash before it.
pub(crate) fn links(
    head_seq: i64,
    head_hash: &str,
    texts: &[AuditText],
    hashing: Hashing<'_>,
) -> Result<Vec<(i64, String)>, StoreError> {
    let mut links: Vec<(i64, String)> = Vec::with_capacity(texts.len());
    for text in texts {
        let (prev_seq, prev_hash) = links
            .last()
            .map_or((head_seq, head_hash), |(seq, hash)| (*seq, hash.as_str()));
        let seq = prev_seq
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt("audit seq overflow".to_owned()))?;
        let hash = hashing.of(prev_hash, seq, text.at_ms, &text.kind, &text.text);
        links.push((seq, hash));
    }
    Ok(links)
}

/// Chains `texts` onto the head (`seq`, `hash`) of a log, each hashed as
/// `hashing` says: the rows to append, in order.
pub(crate) fn chain(
    head_seq: i64,
    head_hash: &str,
    texts: &[AuditText],
    hashing: Hashing<'_>,
) -> Result<Vec<RawRow>, StoreError> {
    let links = links(head_seq, head_hash, texts, hashing)?;
    let mut prev_hash = head_hash.to_owned();
    Ok(texts
        .iter()
        .zip(links)
        .map(|(text, (seq, hash))| RawRow {
            seq,
            at_ms: text.at_ms,
            kind: text.kind.clone(),
            entry: text.text.clone(),
            prev_hash: std::mem::replace(&mut prev_hash, hash.clone()),
            hash,
        })
        .collect())
}

/// What the verifier keeps of each entry.
struct Meta {
    seq: i64,
    /// The `seq` under which the entry's content gives its stored hash: its
    /// own when untouched, a nearby one when renumbered, none when edited.
    content_seq: Option<i64>,
    prev_hash: String,
    hash: String,
}

/// Verifies a log fed to it entry by entry in stored order. Keeps the hashes
/// of every entry (about 160 bytes each), and the content only of entries
/// whose hash does not match. Entries from an `audit-keyed` entry on are
/// checked under the key given, when it is that entry's; without it only
/// their links are checked, and the report says so.
pub(crate) struct Verifier<'k> {
    key: Option<&'k AuditKey>,
    /// The given key's id.
    key_id: Option<String>,
    /// Where the chain turned keyed and with which key id, once met.
    keyed: Option<(i64, String)>,
    /// What the store's table says about it, when it has one.
    recorded: Option<Option<(i64, String)>>,
    metas: Vec<Meta>,
    /// Entries whose hash matches their content under no nearby seq, with
    /// their position (content kept for the first [`MAX_SWAP_CANDIDATES`]).
    mismatched: Vec<(usize, i64, Option<RawRow>)>,
}

impl<'k> Verifier<'k> {
    /// A verifier checking keyed entries under `key`, when given.
    pub fn new(key: Option<&'k AuditKey>) -> Verifier<'k> {
        Verifier {
            key,
            key_id: key.map(AuditKey::id),
            keyed: None,
            recorded: None,
            metas: Vec::new(),
            mismatched: Vec::new(),
        }
    }

    /// What the store records of the chain's key (the entry that keyed it
    /// and the key's id), to be checked against the chain. Only the SQLite
    /// store records it.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn recorded_key(&mut self, recorded: Option<(i64, String)>) {
        self.recorded = Some(recorded);
    }

    /// How the entry stored at `seq` is hashed; `None` when it is keyed and
    /// the key at hand is not the chain's.
    fn hashing(&self, seq: i64) -> Option<Hashing<'k>> {
        hashing_at(&self.keyed, self.key, self.key_id.as_deref(), seq)
    }

    /// Takes the next entry in stored order.
    pub fn push(&mut self, row: RawRow) {
        note_keyed(&mut self.keyed, &row);
        let position = self.metas.len();
        let content_seq = match self.hashing(row.seq) {
            // Without the key nothing can be said of the content.
            None => Some(row.seq),
            Some(hashing) => {
                let matches = |seq: i64| {
                    hashing.of(&row.prev_hash, seq, row.at_ms, &row.kind, &row.entry) == row.hash
                };
                if matches(row.seq) {
                    Some(row.seq)
                } else {
                    (1..=MAX_SHIFT)
                        .flat_map(|d| [row.seq.saturating_sub(d), row.seq.saturating_add(d)])
                        .find(|&seq| seq >= 1 && matches(seq))
                }
            }
        };
        if content_seq.is_none() {
            let keep = self.mismatched.len() < MAX_SWAP_CANDIDATES;
            let seq = row.seq;
            self.mismatched
                .push((position, seq, keep.then(|| row.clone())));
        }
        self.metas.push(Meta {
            seq: row.seq,
            content_seq,
            prev_hash: row.prev_hash,
            hash: row.hash,
        });
    }

    /// The problems with the chain's key (see [`key_problems`]).
    fn key_problems(&self) -> Vec<AuditProblem> {
        key_problems(&self.keyed, self.key_id.as_deref(), self.recorded.as_ref())
    }

    /// The report over everything pushed.
    pub fn finish(&self) -> VerifyReport {
        let metas = &self.metas;
        let count = metas.len();
        let mut problems: Vec<AuditProblem> = Vec::new();
        let mut problem = |seq: i64, what: ProblemKind, detail: String| {
            problems.push(AuditProblem {
                seq: u64::try_from(seq).unwrap_or(0),
                what,
                detail,
            });
        };
        // Entries already reported for their content.
        let mut reported = vec![false; count];

        // Content swapped between entries: an entry's content hashes to
        // another mismatching entry's hash under that entry's seq and
        // prev_hash.
        for (position, seq, row) in &self.mismatched {
            let found = row.as_ref().and_then(|row| {
                self.mismatched.iter().find_map(|(other, _, _)| {
                    let meta = metas.get(*other)?;
                    let hashing = self.hashing(meta.seq)?;
                    (other != position
                        && hashing.of(&meta.prev_hash, meta.seq, row.at_ms, &row.kind, &row.entry)
                            == meta.hash)
                        .then_some(meta.seq)
                })
            });
            match found {
                Some(other) => problem(
                    *seq,
                    ProblemKind::OutOfOrder,
                    format!("it holds the content of entry {other}"),
                ),
                None => problem(
                    *seq,
                    ProblemKind::Edited,
                    "its hash does not match its content".to_owned(),
                ),
            }
            if let Some(flag) = reported.get_mut(*position) {
                *flag = true;
            }
        }

        // The chain: each entry's prev_hash against the hash of the entry
        // stored before it.
        let mut by_hash: HashMap<&str, usize> = HashMap::with_capacity(count);
        for (position, meta) in metas.iter().enumerate() {
            by_hash.entry(meta.hash.as_str()).or_insert(position);
        }
        let seq_at = |position: usize| metas.get(position).map_or(0, |meta| meta.seq);
        let mut unlinked = vec![false; count];
        let mut prev_hash = GENESIS_HASH;
        let mut prev_seq: Option<i64> = None;
        let mut max_seq: i64 = 0;
        for (i, meta) in metas.iter().enumerate() {
            if let Some(before) = prev_seq.filter(|&before| meta.seq <= before) {
                problem(
                    meta.seq,
                    ProblemKind::Inserted,
                    format!("it is stored after entry {before}"),
                );
                if let Some(flag) = unlinked.get_mut(i) {
                    *flag = true;
                }
                continue;
            }
            let seq = meta.content_seq.unwrap_or(meta.seq);
            if meta.prev_hash != prev_hash {
                if let Some(flag) = unlinked.get_mut(i) {
                    *flag = true;
                }
                // The position of the entry this one was chained to; -1 is
                // the start of the chain.
                let pred: Option<isize> = if meta.prev_hash == GENESIS_HASH {
                    Some(-1)
                } else {
                    by_hash
                        .get(meta.prev_hash.as_str())
                        .and_then(|&p| isize::try_from(p).ok())
                };
                let here = isize::try_from(i).unwrap_or(isize::MAX);
                let before_unlinked = i
                    .checked_sub(1)
                    .and_then(|b| unlinked.get(b))
                    .copied()
                    .unwrap_or(false);
                if before_unlinked {
                    // Explained by the problem reported at the entry before.
                } else if let Some(p) = pred.filter(|&p| p > here) {
                    let after = usize::try_from(p).map_or(0, seq_at);
                    problem(
                        meta.seq,
                        ProblemKind::OutOfOrder,
                        format!("it follows entry {after}, which is stored after it"),
                    );
                } else if seq > max_seq.saturating_add(1) {
                    let first = max_seq.saturating_add(1);
                    let last = seq - 1;
                    problem(
                        first,
                        ProblemKind::Missing,
                        if first == last {
                            format!("entry {} is chained to it", meta.seq)
                        } else {
                            format!("entries {first} to {last} are gone")
                        },
                    );
                } else if let Some(p) = pred.filter(|&p| p < here - 1) {
                    let first = usize::try_from(p + 1).map_or(0, seq_at);
                    let last = prev_seq.unwrap_or(first);
                    let from = if p < 0 {
                        "the start of the chain".to_owned()
                    } else {
                        format!("entry {}", usize::try_from(p).map_or(0, seq_at))
                    };
                    problem(
                        first,
                        ProblemKind::Inserted,
                        if first == last {
                            format!("entry {} is chained to {from}", meta.seq)
                        } else {
                            format!(
                                "entries {first} to {last} are not in the chain: entry {} is chained to {from}",
                                meta.seq
                            )
                        },
                    );
                } else if i == 0 {
                    problem(
                        meta.seq,
                        ProblemKind::Edited,
                        "it does not start the chain".to_owned(),
                    );
                } else if !i
                    .checked_sub(1)
                    .and_then(|b| reported.get(b))
                    .copied()
                    .unwrap_or(false)
                {
                    problem(
                        prev_seq.unwrap_or(0),
                        ProblemKind::Edited,
                        format!(
                            "its hash was rewritten: entry {} is chained to a different one",
                            meta.seq
                        ),
                    );
                }
            }
            prev_hash = meta.hash.as_str();
            prev_seq = Some(meta.seq);
            max_seq = max_seq.max(seq);
        }
        problems.extend(self.key_problems());
        problems.sort_by_key(|problem| problem.seq);
        let (entries, head) = metas.last().map_or((0, GENESIS_HASH.to_owned()), |meta| {
            (u64::try_from(meta.seq).unwrap_or(0), meta.hash.clone())
        });
        VerifyReport {
            entries,
            head,
            problems,
        }
    }
}

/// Notes where the chain turned keyed, and with which key id, when `row`
/// is the first `audit-keyed` entry.
fn note_keyed(keyed: &mut Option<(i64, String)>, row: &RawRow) {
    if row.kind == KEYED_KIND && keyed.is_none() {
        let id = serde_json::from_str::<Value>(&row.entry)
            .ok()
            .and_then(|entry| entry.get("keyId")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        *keyed = Some((row.seq, id));
    }
}

/// How the entry stored at `seq` is hashed, in a chain keyed as `keyed`
/// says, checked with `key` (whose id is `key_id`): `None` when it is keyed
/// and that key is not the chain's (its content cannot be checked).
fn hashing_at<'k>(
    keyed: &Option<(i64, String)>,
    key: Option<&'k AuditKey>,
    key_id: Option<&str>,
    seq: i64,
) -> Option<Hashing<'k>> {
    match keyed {
        Some((from, id)) if seq >= *from => match (key, key_id) {
            (Some(key), Some(given)) if given == id => Some(Hashing::Keyed(key)),
            _ => None,
        },
        _ => Some(Hashing::Plain),
    }
}

/// The problems with the chain's key: keyed but not checkable with the key
/// at hand (`key_id`), a key given for a chain nobody keyed, or the store's
/// record of the key (`recorded`, when it keeps one) that does not match
/// the chain.
fn key_problems(
    keyed: &Option<(i64, String)>,
    key_id: Option<&str>,
    recorded: Option<&Option<(i64, String)>>,
) -> Vec<AuditProblem> {
    let mut problems = Vec::new();
    let mut problem = |seq: i64, detail: String| {
        problems.push(AuditProblem {
            seq: u64::try_from(seq).unwrap_or(0),
            what: ProblemKind::Key,
            detail,
        });
    };
    match (keyed, key_id) {
        (Some((from, id)), None) => problem(
            *from,
            format!(
                "the chain is keyed from here with key {id}: its entries can be checked only with that key"
            ),
        ),
        (Some((from, id)), Some(given)) if id != given => problem(
            *from,
            format!("the chain is keyed with key {id}, not with the key given ({given})"),
        ),
        (None, Some(given)) => problem(
            0,
            format!(
                "a key was given ({given}) but no entry keys the chain: it was never keyed, or it was rewritten without the key"
            ),
        ),
        _ => {}
    }
    if let Some(recorded) = recorded
        && recorded != keyed
    {
        let said = |keyed: &Option<(i64, String)>| match keyed {
            Some((seq, id)) => format!("keyed from entry {seq} with key {id}"),
            None => "not keyed".to_owned(),
        };
        problem(
            recorded
                .as_ref()
                .or(keyed.as_ref())
                .map_or(0, |(seq, _)| *seq),
            format!(
                "the store records the chain as {}, the chain is {}",
                said(recorded),
                said(keyed)
            ),
        );
    }
    problems
}

/// The first of a verification's two passes over a log read in stored
/// order: it keeps nothing of an entry once the next is read (the last
/// position and hash, where the chain turned keyed), so a log of any size
/// is checked in the same memory. Every entry must follow the one before
/// it (its `seq` the next, its `prev_hash` that one's hash) and hash to its
/// own hash. When all do, the log is whole and its report is
/// [`QuickCheck::finish`]'s; at the first that does not, it stops looking,
/// and a second pass through a [`Verifier`], which keeps about 160 bytes
/// of every entry, says what is wrong and where.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct QuickCheck<'k> {
    key: Option<&'k AuditKey>,
    key_id: Option<String>,
    keyed: Option<(i64, String)>,
    /// The last entry's position and hash.
    last: Option<(i64, String)>,
    whole: bool,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<'k> QuickCheck<'k> {
    /// A check of keyed entries under `key`, when given.
    pub fn new(key: Option<&'k AuditKey>) -> QuickCheck<'k> {
        QuickCheck {
            key,
            key_id: key.map(AuditKey::id),
            keyed: None,
            last: None,
            whole: true,
        }
    }

    /// Takes the next entry in stored order.
    pub fn push(&mut self, row: &RawRow) {
        if !self.whole {
            return;
        }
        note_keyed(&mut self.keyed, row);
        let (seq, prev_hash) = match &self.last {
            Some((seq, hash)) => (seq.checked_add(1), hash.as_str()),
            None => (Some(1), GENESIS_HASH),
        };
        let linked = seq == Some(row.seq) && row.prev_hash == prev_hash;
        let hashed = match hashing_at(&self.keyed, self.key, self.key_id.as_deref(), row.seq) {
            // Without the chain's key nothing can be said of the content.
            None => true,
            Some(hashing) => {
                hashing.of(&row.prev_hash, row.seq, row.at_ms, &row.kind, &row.entry) == row.hash
            }
        };
        if !(linked && hashed) {
            self.whole = false;
            return;
        }
        match &mut self.last {
            Some((seq, hash)) => {
                *seq = row.seq;
                hash.clone_from(&row.hash);
            }
            None => self.last = Some((row.seq, row.hash.clone())),
        }
    }

    /// The report, when every entry followed the one before it (only the
    /// chain's key may then be a problem, as [`Verifier::finish`] would
    /// say): with `recorded`, what the store records of the chain's key.
    /// `None` when one did not: a second pass must say what is wrong.
    pub fn finish(self, recorded: Option<Option<(i64, String)>>) -> Option<VerifyReport> {
        if !self.whole {
            return None;
        }
        let mut problems = key_problems(&self.keyed, self.key_id.as_deref(), recorded.as_ref());
        problems.sort_by_key(|problem| problem.seq);
        let (entries, head) = self
            .last
            .map_or((0, GENESIS_HASH.to_owned()), |(seq, hash)| {
                (u64::try_from(seq).unwrap_or(0), hash)
            });
        Some(VerifyReport {
            entries,
            head,
            problems,
        })
    }
}

#[cfg(test)]
mod cut_tests;

#[cfg(test)]
mod text_tests;
