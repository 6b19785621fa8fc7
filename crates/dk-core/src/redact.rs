//! The vessel's one redactor: every known secret is removed from telemetry
//! (audit entries, device events, stream metadata, log lines) before it
//! leaves the vessel's memory.
//!
//! Secrets are known two ways:
//!
//! - in clear: the admin token, agent credentials made by this process,
//!   whatever a host registers ([`SecretRedactor::add_secret`]); every
//!   occurrence is replaced, in strings and object keys, by dk-policy's
//!   [`Redactor`] (the admission contract's);
//! - by their SHA-256 only: device tokens (64 lower-case hex characters) and,
//!   after a restart, agent credentials (`dka_` and 64 hex characters). In a
//!   run of hex characters every 64-character window is hashed and looked up
//!   among those hashes, so a token glued to more hex digits is still found;
//!   only a window that is a token is replaced, and hex that is no secret (a
//!   digest, a key the agent sent, any long run) is kept as it is. One call
//!   hashes at most [`MAX_HASHED_WINDOWS`] windows, so no input can make
//!   redaction slow; the rest of a run met after them is cut, with a marker
//!   saying how many characters were left out (`[cut: N hex characters past
//!   the redaction budget]`): never kept unchecked, never passed off as a
//!   secret.
//!
//! Either way the marker is [`REDACTED`] (`[REDACTED]`), and JSON nested
//! deeper than [`MAX_TELEMETRY_DEPTH`] becomes [`MAX_DEPTH_MARKER`], as the
//! admission contract says.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};

use dk_policy::{MAX_DEPTH_MARKER, MAX_TELEMETRY_DEPTH, REDACTED, Redactor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::agents::{AGENT_CREDENTIAL_PREFIX, AgentDirectory};
use crate::registry::DeviceRegistry;
use crate::store::entry as schema;

/// The length of a device token, and of an agent credential's hex part.
const TOKEN_LEN: usize = 64;

/// The most 64-character windows one redaction call (one string, one JSON
/// value, one event) hashes and looks up; what is left of a hex run after
/// them is cut, with a marker saying how much.
pub const MAX_HASHED_WINDOWS: usize = 1024;

/// The secrets known in clear, and the redactor made of them.
#[derive(Default)]
struct Known {
    secrets: Vec<Box<str>>,
    /// The longest of them, in characters.
    longest: usize,
    redactor: Arc<Redactor>,
}

/// Where secrets known only by their hashes are looked up.
struct Hashed {
    registry: Weak<DeviceRegistry>,
    agents: Weak<AgentDirectory>,
}

#[derive(Default)]
struct Shared {
    known: RwLock<Known>,
    hashed: OnceLock<Hashed>,
}

/// The vessel's redactor. Cheap to clone: clones share their secrets, so a
/// secret added through one is removed by all (the vessel's audit writer, its
/// event path and a log writer hold clones of [`Vessel::redactor`](crate::Vessel::redactor)).
///
/// `Debug` shows how many secrets it knows, never the secrets.
#[derive(Clone, Default)]
pub struct SecretRedactor {
    shared: Arc<Shared>,
}

impl fmt::Debug for SecretRedactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretRedactor")
            .field("secrets", &self.known().len())
            .field("token_hashes", &self.shared.hashed.get().is_some())
            .finish()
    }
}

impl SecretRedactor {
    /// A redactor that knows no secret yet (it then changes nothing but JSON
    /// nested deeper than the cap).
    pub fn new() -> SecretRedactor {
        SecretRedactor::default()
    }

    /// Also looks up device tokens in `registry` and agent credentials in
    /// `agents` by their hashes (held weakly: a redactor keeps neither alive).
    /// Set once; later calls change nothing.
    pub(crate) fn watch_tokens(
        &self,
        registry: &Arc<DeviceRegistry>,
        agents: &Arc<AgentDirectory>,
    ) {
        let _ = self.shared.hashed.set(Hashed {
            registry: Arc::downgrade(registry),
            agents: Arc::downgrade(agents),
        });
    }

    /// Adds a secret known in clear; from now on every occurrence is
    /// replaced. Empty and repeated secrets are ignored.
    pub fn add_secret(&self, secret: &str) {
        if secret.is_empty() {
            return;
        }
        let mut known = self
            .shared
            .known
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if known.secrets.iter().any(|s| &**s == secret) {
            return;
        }
        known.longest = known.longest.max(secret.chars().count());
        known.secrets.push(secret.into());
        known.redactor = Arc::new(Redactor::new(known.secrets.iter()));
    }

    /// The redactor of the secrets known in clear, as it is now.
    fn known(&self) -> Arc<Redactor> {
        Arc::clone(
            &self
                .shared
                .known
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .redactor,
        )
    }

    /// The longest secret that can be found, in characters: a device token,
    /// or a longer secret known in clear.
    fn longest_secret(&self) -> usize {
        let known = self
            .shared
            .known
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .longest;
        known.max(TOKEN_LEN)
    }

    /// `value` fit for an audit entry, cut as every entry is (strings at 256
    /// characters, 64 items, 8 levels, each cut saying how much it left out)
    /// with every string and key that is kept redacted first. A long string
    /// is redacted over what is kept and as many characters more as the
    /// longest secret, so a secret across the cut is found whole, and what
    /// redaction left of those extra characters is dropped (see
    /// [`cut_for_audit_with`](crate::store::cut_for_audit_with)). Redaction
    /// checks only what the entry keeps, so the window budget goes to that.
    pub(crate) fn redact_for_audit(&self, value: &Value) -> Value {
        let known = self.known();
        let lookahead = self.longest_secret().saturating_sub(1);
        let mut windows = window_budget();
        crate::store::cut_for_audit_with(value, lookahead, &mut |text: &str| {
            self.redact_str_with(&known, text, &mut windows)
                .into_owned()
        })
    }

    /// [`SecretRedactor::redact_for_audit`] of a value the caller gives
    /// up: the same result, with what needs no change kept instead of
    /// copied (a decision's record, built only to be logged).
    pub(crate) fn redact_owned_for_audit(&self, mut value: Value) -> Value {
        let known = self.known();
        let lookahead = self.longest_secret().saturating_sub(1);
        let mut windows = window_budget();
        crate::store::cut_for_audit_in_place(&mut value, lookahead, &mut |text: &str| match self
            .redact_str_with(&known, text, &mut windows)
        {
            Cow::Borrowed(_) => None,
            Cow::Owned(changed) => Some(changed),
        });
        value
    }

    /// Redacts a decision's record (its input aside) in place for the audit
    /// log, as [`SecretRedactor::redact_owned_for_audit`] redacts the record's
    /// JSON: each key and each text in the order that JSON holds them, under
    /// one window budget. False, the record then partly redacted and to be
    /// thrown away, when the record needs what only the JSON path does: a
    /// text to cut (longer than [`MAX_AUDIT_STRING`](dk_store::MAX_AUDIT_STRING)
    /// bytes), or a key or a named value (`person`, `caller`, `frontEnd`)
    /// that redaction would change.
    pub(crate) fn redact_decision_for_audit(&self, record: &mut schema::Decision) -> bool {
        let mut pass = Pass {
            redactor: self,
            known: self.known(),
            windows: window_budget(),
        };
        let texts = pass.field("tool", Some(&mut record.tool))
            && pass.field("deviceId", record.device_id.as_mut())
            && pass.field("capability", record.capability.as_mut())
            && pass.field("allowed", None)
            && pass.field("reason", Some(&mut record.reason))
            && pass.field("agentId", record.agent_id.as_mut())
            && pass.field("sessionId", record.session_id.as_mut())
            && pass.field("rule", record.rule.as_mut());
        texts
            && record.person.is_none_or(|person| {
                pass.fixed("person")
                    && pass.fixed(match person {
                        schema::PersonAnswer::Approved => "approved",
                        schema::PersonAnswer::Refused => "refused",
                        schema::PersonAnswer::Remembered => "remembered",
                    })
            })
            && record.allowance.is_none_or(|allowance| {
                pass.fixed("allowance")
                    && pass.fixed("id")
                    && (!allowance.created || pass.fixed("created"))
            })
            && record.caller.is_none_or(|caller| {
                pass.fixed("caller")
                    && pass.fixed(match caller {
                        schema::Caller::Person => "person",
                    })
            })
            && pass.field("channel", record.channel.as_mut())
            && record.by.as_mut().is_none_or(|by| {
                pass.fixed("by")
                    && pass.fixed("frontEnd")
                    && pass.fixed(match by.front_end {
                        schema::FrontEnd::Terminal => "terminal",
                        schema::FrontEnd::AdminApi => "adminApi",
                        schema::FrontEnd::Console => "console",
                    })
                    && pass.field("session", by.session.as_mut())
            })
    }

    /// `text` with every known secret replaced by [`REDACTED`]; borrowed when
    /// nothing was.
    pub fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let known = self.known();
        self.redact_str_with(&known, text, &mut window_budget())
    }

    fn redact_str_with<'a>(
        &self,
        known: &Redactor,
        text: &'a str,
        windows: &mut usize,
    ) -> Cow<'a, str> {
        match known.redact_str(text) {
            Cow::Borrowed(text) => self.hide_hex_tokens(text, windows),
            Cow::Owned(text) => Cow::Owned(self.hide_hex_tokens(&text, windows).into_owned()),
        }
    }

    /// `value` with every known secret replaced in every string and object
    /// key, recursively; a value nested deeper than [`MAX_TELEMETRY_DEPTH`]
    /// becomes [`MAX_DEPTH_MARKER`]. This is the call for any telemetry the
    /// vessel emits: stream metadata, event data, audit details.
    pub fn redact_json(&self, value: &Value) -> Value {
        let known = self.known();
        self.redact_at(&known, value, 0, &mut window_budget())
    }

    fn redact_at(
        &self,
        known: &Redactor,
        value: &Value,
        depth: usize,
        windows: &mut usize,
    ) -> Value {
        if depth > MAX_TELEMETRY_DEPTH {
            return Value::String(MAX_DEPTH_MARKER.to_owned());
        }
        match value {
            Value::String(text) => {
                Value::String(self.redact_str_with(known, text, windows).into_owned())
            }
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.redact_at(known, item, depth + 1, windows))
                    .collect(),
            ),
            Value::Object(members) => {
                let mut out = Map::with_capacity(members.len());
                for (key, member) in members {
                    out.insert(
                        self.redact_str_with(known, key, windows).into_owned(),
                        self.redact_at(known, member, depth + 1, windows),
                    );
                }
                Value::Object(out)
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        }
    }

    /// Raw JSON (a device event's data, as the device sent it) with every
    /// known secret replaced, or `None` when it needs no change. Text with no
    /// escape and no secret in it is passed on as it is, without parsing;
    /// otherwise it is parsed, redacted and written again.
    pub(crate) fn redact_raw(&self, raw: &RawValue) -> Option<Box<RawValue>> {
        let text = raw.get();
        let known = self.known();
        // Without a backslash every string and key is a substring of the
        // text, so a text with no secret holds none. Depth is checked too.
        if !text.contains('\\')
            && matches!(
                self.redact_str_with(&known, text, &mut window_budget()),
                Cow::Borrowed(_)
            )
            && nesting(text) <= MAX_TELEMETRY_DEPTH
        {
            return None;
        }
        let value: Value = match serde_json::from_str(text) {
            Ok(value) => value,
            // Not JSON after all: nothing of it is passed on.
            Err(_) => return RawValue::from_string(format!("\"{REDACTED}\"")).ok(),
        };
        let redacted = self.redact_at(&known, &value, 0, &mut window_budget());
        if redacted == value {
            return None;
        }
        serde_json::value::to_raw_value(&redacted).ok()
    }

    /// A writer that passes what is written to `inner` line by line, each
    /// line redacted first (a partial line waits for its end, a flush or the
    /// writer's drop). For log output: wrap the logger's writer in this.
    pub fn writer<W: Write>(&self, inner: W) -> RedactingWriter<W> {
        RedactingWriter {
            inner,
            source: Source::One(self.clone()),
            pending: Vec::new(),
        }
    }

    /// Hides tokens known only by their hashes in `text`: in every run of at
    /// least 64 hex characters, each 64-character window is hashed and looked
    /// up while `windows` lasts, and a window that is a token is replaced by
    /// [`REDACTED`]; the rest of the run is kept as it is. What is left of a
    /// run once `windows` is spent is cut with a marker saying how many
    /// characters it held. Without token hashes to look in, nothing changes.
    fn hide_hex_tokens<'a>(&self, text: &'a str, windows: &mut usize) -> Cow<'a, str> {
        let Some(hashed) = self.shared.hashed.get() else {
            return Cow::Borrowed(text);
        };
        let is_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        let bytes = text.as_bytes();
        if bytes.len() < TOKEN_LEN {
            return Cow::Borrowed(text);
        }
        let mut lookup: Option<Lookup> = None;
        let mut out: Option<String> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            if !bytes.get(i).copied().is_some_and(is_hex) {
                i += 1;
                continue;
            }
            let run_start = i;
            while bytes.get(i).copied().is_some_and(is_hex) {
                i += 1;
            }
            if i - run_start < TOKEN_LEN {
                continue;
            }
            // Hex is ASCII, so every index in the run is a char boundary.
            let run = text.get(run_start..i).unwrap_or_default();
            let lookup = lookup.get_or_insert_with(|| Lookup::new(hashed));
            if let Some(replacement) = lookup.hide(run, windows) {
                let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
                out.push_str(text.get(copied..run_start).unwrap_or_default());
                out.push_str(&replacement);
                copied = i;
            }
        }
        match out {
            None => Cow::Borrowed(text),
            Some(mut out) => {
                out.push_str(text.get(copied..).unwrap_or_default());
                Cow::Owned(out)
            }
        }
    }
}

/// The registry and agent directory a redaction call looks tokens up in,
/// taken once per call.
struct Lookup {
    registry: Option<Arc<DeviceRegistry>>,
    agents: Option<Arc<AgentDirectory>>,
    /// `dka_` and the window being looked up, reused.
    credential: String,
}

impl Lookup {
    fn new(hashed: &Hashed) -> Lookup {
        Lookup {
            registry: hashed.registry.upgrade(),
            agents: hashed.agents.upgrade(),
            credential: String::with_capacity(AGENT_CREDENTIAL_PREFIX.len() + TOKEN_LEN),
        }
    }

    /// Whether `window` (64 hex characters) is a device token or the hex
    /// part of an agent credential.
    fn is_token(&mut self, window: &str) -> bool {
        if self
            .registry
            .as_ref()
            .is_some_and(|r| r.is_device_token(window))
        {
            return true;
        }
        let Some(agents) = &self.agents else {
            return false;
        };
        self.credential.clear();
        self.credential.push_str(AGENT_CREDENTIAL_PREFIX);
        self.credential.push_str(window);
        agents.is_credential(&self.credential)
    }

    /// `run` (all hex, at least 64 characters) with every token window
    /// replaced, checking windows while `windows` lasts; `None` when it holds
    /// no token and was checked to its end. Once `windows` is spent, what no
    /// checked window covers is cut: a token there would start in it, so
    /// none of it is kept.
    fn hide(&mut self, run: &str, windows: &mut usize) -> Option<String> {
        let checks = run.len() + 1 - TOKEN_LEN;
        let allowed = checks.min(*windows);
        *windows -= allowed;
        let mut out = String::new();
        let mut found = false;
        let mut at = 0;
        let mut copied = 0;
        while at < allowed {
            let window = run.get(at..at + TOKEN_LEN).unwrap_or_default();
            if self.is_token(window) {
                out.push_str(run.get(copied..at).unwrap_or_default());
                out.push_str(REDACTED);
                at += TOKEN_LEN;
                copied = at;
                found = true;
            } else {
                at += 1;
            }
        }
        if allowed < checks {
            // Windows from `at` on were not looked at: cut from there.
            out.push_str(run.get(copied..at).unwrap_or_default());
            out.push_str(&budget_cut(run.len() - at));
            return Some(out);
        }
        if !found {
            return None;
        }
        out.push_str(run.get(copied..).unwrap_or_default());
        Some(out)
    }
}

/// The marker for `count` hex characters cut because the call's window
/// budget was spent.
fn budget_cut(count: usize) -> String {
    format!("[cut: {count} hex characters past the redaction budget]")
}

/// One pass of [`SecretRedactor::redact_decision_for_audit`]: the
/// redactor's secrets and what is left of its window budget.
struct Pass<'r> {
    redactor: &'r SecretRedactor,
    known: Arc<Redactor>,
    windows: usize,
}

impl Pass<'_> {
    /// Whether `text`, a key or a named value, is kept as it is.
    fn fixed(&mut self, text: &str) -> bool {
        text.len() <= dk_store::MAX_AUDIT_STRING
            && matches!(
                self.redactor
                    .redact_str_with(&self.known, text, &mut self.windows),
                Cow::Borrowed(_)
            )
    }

    /// Redacts the field `key` (kept as it is) and its text, when it has
    /// one: false when either needs the JSON path.
    fn field(&mut self, key: &str, text: Option<&mut String>) -> bool {
        if !self.fixed(key) {
            return false;
        }
        let Some(text) = text else { return true };
        if text.len() > dk_store::MAX_AUDIT_STRING {
            return false;
        }
        if let Cow::Owned(changed) =
            self.redactor
                .redact_str_with(&self.known, text, &mut self.windows)
        {
            *text = changed;
        }
        true
    }
}

/// A fresh budget of windows for one redaction call.
fn window_budget() -> usize {
    MAX_HASHED_WINDOWS
}

/// How deep `text` (JSON) nests: the most brackets open at once, outside
/// strings.
fn nesting(text: &str) -> usize {
    let mut depth: usize = 0;
    let mut deepest = 0;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    // The top-level value is at depth 0; its members at depth 1.
    deepest.saturating_sub(1)
}

// ------------------------------------------------------------------ logs

/// Every live vessel's redactor, for log writers made before any vessel.
static LOG_REDACTORS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Makes `redactor` one of those [`redacting_log_writer`] uses, for as long
/// as it lives.
pub(crate) fn redact_logs_with(redactor: &SecretRedactor) {
    let mut all = LOG_REDACTORS.lock().unwrap_or_else(PoisonError::into_inner);
    all.retain(|weak| weak.strong_count() > 0);
    all.push(Arc::downgrade(&redactor.shared));
}

/// A writer for log output that redacts each line with the redactor of
/// every vessel alive in the process when the line is written, so a logger
/// can be set up before the vessel exists. The `dk` binary's log goes through
/// this; a host embedding a vessel can do the same, or use
/// [`SecretRedactor::writer`].
pub fn redacting_log_writer<W: Write>(inner: W) -> RedactingWriter<W> {
    RedactingWriter {
        inner,
        source: Source::EveryVessel,
        pending: Vec::new(),
    }
}

enum Source {
    One(SecretRedactor),
    EveryVessel,
}

impl Source {
    fn redact<'a>(&self, line: &'a str) -> Cow<'a, str> {
        match self {
            Source::One(redactor) => redactor.redact_str(line),
            Source::EveryVessel => {
                let redactors: Vec<SecretRedactor> = LOG_REDACTORS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter_map(Weak::upgrade)
                    .map(|shared| SecretRedactor { shared })
                    .collect();
                let mut line = Cow::Borrowed(line);
                for redactor in &redactors {
                    if let Cow::Owned(redacted) = redactor.redact_str(&line) {
                        line = Cow::Owned(redacted);
                    }
                }
                line
            }
        }
    }
}

/// A [`Write`] that redacts complete lines before passing them on (see
/// [`SecretRedactor::writer`] and [`redacting_log_writer`]). What is not yet a
/// whole line is held until its newline, a flush or the drop; bytes that are
/// not UTF-8 are written as U+FFFD.
pub struct RedactingWriter<W: Write> {
    inner: W,
    source: Source,
    pending: Vec<u8>,
}

impl<W: Write> fmt::Debug for RedactingWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedactingWriter")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl<W: Write> RedactingWriter<W> {
    /// Writes `bytes` (whole lines, or the last part) redacted.
    fn pass_on(&mut self, bytes: &[u8]) -> io::Result<()> {
        let text = String::from_utf8_lossy(bytes);
        let redacted = self.source.redact(&text);
        self.inner.write_all(redacted.as_bytes())
    }

    /// Writes out what is held, then hands back the inner writer.
    pub fn into_inner(mut self) -> io::Result<W>
    where
        W: Default,
    {
        self.flush()?;
        Ok(std::mem::take(&mut self.inner))
    }
}

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if let Some(last_newline) = self.pending.iter().rposition(|&b| b == b'\n') {
            let rest = self.pending.split_off(last_newline + 1);
            let lines = std::mem::replace(&mut self.pending, rest);
            self.pass_on(&lines)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.pass_on(&rest)?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for RedactingWriter<W> {
    fn drop(&mut self) {
        // Nowhere to report an error from a drop; the log line is lost.
        let _ = self.flush();
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// A copy of `value` fit for the audit log: every occurrence of one of
/// `secrets` (in strings and object keys) is replaced by `[REDACTED]`, then
/// strings longer than [`MAX_AUDIT_STRING`](dk_store::MAX_AUDIT_STRING) characters are cut, arrays and
/// objects keep their first [`MAX_AUDIT_ITEMS`](dk_store::MAX_AUDIT_ITEMS) items, and values deeper than
/// [`MAX_AUDIT_DEPTH`](dk_store::MAX_AUDIT_DEPTH) are replaced; every cut says how much was left out.
/// Empty secrets are ignored. The
/// vessel's own entries go through its [`SecretRedactor`]
/// instead, which also knows the tokens it holds only by their hashes.
pub fn redact_for_audit(value: &Value, secrets: &[&str]) -> Value {
    dk_store::cut_for_audit(&dk_policy::Redactor::new(secrets).redact_json(value))
}
