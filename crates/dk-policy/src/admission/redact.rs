//! Telemetry redaction: every occurrence of every known secret becomes `[REDACTED]`.

use std::borrow::Cow;
use std::fmt;

use serde_json::{Map, Value};

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// What a value nested deeper than [`MAX_TELEMETRY_DEPTH`] is replaced with.
pub const MAX_DEPTH_MARKER: &str = "[MaxDepth]";

/// How deep redacted telemetry may nest: the top-level value is at depth 0,
/// an element or member of it at depth 1, and so on; a value (of any type) at
/// a depth greater than this becomes the string [`MAX_DEPTH_MARKER`].
pub const MAX_TELEMETRY_DEPTH: usize = 32;

/// Replaces known secrets (device, admin and agent tokens, host-registered
/// secrets) in telemetry before it is emitted or stored.
///
/// Empty secrets are ignored and duplicates kept once. Secrets are grouped by
/// their first byte, longest first: the text is scanned once, and only at a
/// byte some secret starts with are that byte's secrets compared, so a text
/// with no secret in it costs one pass and no allocation. Every occurrence of
/// every secret is covered, overlapping occurrences included: a maximal run
/// of overlapping occurrences becomes one [`REDACTED`], and occurrences that
/// merely touch become one marker each. So no byte of any occurrence
/// survives, and no secret occurs in the output, except through the marker
/// itself (a secret such as `RED`, a part of `[REDACTED]`, cannot be kept out
/// of text that contains markers).
///
/// `Debug` shows how many secrets there are, never the secrets.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Indexed by first byte: the secrets starting with it, longest first.
    by_first_byte: Vec<Vec<Box<str>>>,
    count: usize,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.count)
            .finish()
    }
}

impl Redactor {
    /// A redactor for these secrets (empty ones ignored).
    pub fn new<I, S>(secrets: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut by_first_byte: Vec<Vec<Box<str>>> = vec![Vec::new(); 256];
        let mut count = 0;
        for secret in secrets {
            let secret = secret.as_ref();
            let Some(&first) = secret.as_bytes().first() else {
                continue;
            };
            if let Some(bucket) = by_first_byte.get_mut(usize::from(first))
                && !bucket.iter().any(|known| &**known == secret)
            {
                bucket.push(secret.into());
                count += 1;
            }
        }
        for bucket in &mut by_first_byte {
            bucket.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        }
        Redactor {
            by_first_byte,
            count,
        }
    }

    /// How many distinct non-empty secrets this redactor knows.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it knows no secret (it then changes nothing).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The length of the longest secret occurring at `at`, if any.
    fn longest_at(&self, bytes: &[u8], at: usize) -> Option<usize> {
        let rest = bytes.get(at..)?;
        let bucket = self.by_first_byte.get(usize::from(*rest.first()?))?;
        bucket
            .iter()
            .find(|secret| rest.starts_with(secret.as_bytes()))
            .map(|secret| secret.len())
    }

    /// `text` with every secret replaced; borrowed when there was none.
    pub fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.is_empty() {
            return Cow::Borrowed(text);
        }
        let bytes = text.as_bytes();
        let mut out: Option<String> = None;
        // Bytes of `text` before `copied` are in `out` (or replaced).
        let mut copied = 0;
        // The current run of overlapping occurrences: start and end.
        let mut run: Option<(usize, usize)> = None;
        for at in 0..bytes.len() {
            if let Some((start, end)) = run
                && at >= end
            {
                flush(&mut out, text, &mut copied, start, end);
                run = None;
            }
            // A secret is valid UTF-8, so it can only match at a char boundary
            // and ends at one: every slice below is on boundaries.
            if let Some(len) = self.longest_at(bytes, at) {
                let end = at.saturating_add(len);
                run = match run {
                    Some((start, run_end)) if at < run_end => Some((start, run_end.max(end))),
                    _ => Some((at, end)),
                };
            }
        }
        if let Some((start, end)) = run {
            flush(&mut out, text, &mut copied, start, end);
        }
        match out {
            None => Cow::Borrowed(text),
            Some(mut out) => {
                out.push_str(text.get(copied..).unwrap_or_default());
                Cow::Owned(out)
            }
        }
    }

    /// `value` with every secret replaced in every string and every object key,
    /// recursively; values deeper than [`MAX_TELEMETRY_DEPTH`] become
    /// [`MAX_DEPTH_MARKER`]. Should two keys of one object become equal, the
    /// later member wins.
    pub fn redact_json(&self, value: &Value) -> Value {
        self.redact_at(value, 0)
    }

    fn redact_at(&self, value: &Value, depth: usize) -> Value {
        if depth > MAX_TELEMETRY_DEPTH {
            return Value::String(MAX_DEPTH_MARKER.to_owned());
        }
        match value {
            Value::String(text) => Value::String(self.redact_str(text).into_owned()),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.redact_at(item, depth + 1))
                    .collect(),
            ),
            Value::Object(members) => {
                let mut out = Map::with_capacity(members.len());
                for (key, member) in members {
                    out.insert(
                        self.redact_str(key).into_owned(),
                        self.redact_at(member, depth + 1),
                    );
                }
                Value::Object(out)
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        }
    }
}

fn flush(out: &mut Option<String>, text: &str, copied: &mut usize, start: usize, end: usize) {
    let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
    out.push_str(text.get(*copied..start).unwrap_or_default());
    out.push_str(REDACTED);
    *copied = end;
}

/// Telemetry as it may be emitted: redacted by `redactor`, or, without one,
/// unchanged (no redaction and no depth cap: a host that registers no secrets
/// has nothing to hide, as in Prism's `redactDeviceTelemetry`).
pub fn redact_telemetry(redactor: Option<&Redactor>, telemetry: &Value) -> Value {
    match redactor {
        Some(redactor) => redactor.redact_json(telemetry),
        None => telemetry.clone(),
    }
}
