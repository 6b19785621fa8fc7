//! The dk manifest extension, opted in by a top-level `"dk": 1`.
//!
//! An 8DK vessel reads a manifest's known fields and drops the rest, and
//! its digest covers only what it read, so a v1 manifest that happens to
//! carry `enum` or `min` in a param is read by dk exactly as 8DK reads it:
//! those keys mean nothing and the digest is 8DK's. A manifest that says
//! `"dk": 1` asks for more, and gets it whole:
//!
//! - per param: `minimum`, `maximum` and `integer` (number params), `enum`
//!   (the values allowed, of the param's type), `minLength` (string
//!   params), `unit` (shown to the person beside a number);
//! - per capability: `title`, `annotations` (the MCP tool hints, a claim of
//!   the device shown as such), `inputSchema` (a JSON Schema of the input,
//!   instead of `params`, for tools whose input params cannot describe),
//!   `outputSchema`, and `tool` (the name the device knows the capability
//!   by, when it is not a dk name);
//! - per manifest: `events`, each a name, a description and payload params,
//!   which the person grants as capabilities are granted.
//!
//! The vessel enforces the bounds at the input check, before the person is
//! asked, and the device checks them again before its handler. The digest
//! of such a manifest is the SHA-256 of its stored JSON, so every field,
//! the extension's included, is part of what the person consents to.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write as _;

use serde_json::{Map, Number, Value};

use crate::text::{has_unsafe_char, is_js_blank, utf16_len, write_json_str as json_str};

/// The value of `dk` that opts a manifest in.
pub const VERSION: u64 = 1;

/// A number param's `unit`, in UTF-16 code units.
pub const UNIT: usize = 16;
/// Values in a param's `enum`.
pub const ENUM: usize = 32;
/// A capability's `title`, in UTF-16 code units (a device's name's limit).
pub const TITLE: usize = 80;
/// A capability's `tool`, the name the device knows it by (MCP's own limit
/// on a tool's name).
pub const TOOL: usize = 128;
/// A capability's `inputSchema` or `outputSchema` as stored, in bytes.
pub const SCHEMA_BYTES: usize = 16 * 1024;
/// How deep a capability's `inputSchema` or `outputSchema` may nest.
pub const SCHEMA_DEPTH: usize = 16;
/// Events a device declares.
pub const EVENTS: usize = 32;

/// A field of the extension that is not as the extension defines it: the
/// manifest's validation gives it as its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The field, named as in 8DK's messages.
    pub(crate) field: String,
    /// What it must be.
    pub(crate) why: String,
}

/// What the bounds of a param depend on: its type and its longest string.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// A number param.
    pub(crate) number: bool,
    /// A string param.
    pub(crate) string: bool,
    /// Its longest string (its `maxLength` or the input limit).
    pub(crate) max_length: usize,
}

/// What the extension adds to a param: the bounds a value must keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    pub(crate) minimum: Option<Number>,
    pub(crate) maximum: Option<Number>,
    pub(crate) integer: bool,
    pub(crate) one_of: Vec<Value>,
    pub(crate) min_length: Option<usize>,
    pub(crate) unit: Option<String>,
}

impl Bounds {
    /// The smallest number allowed, when declared.
    pub fn minimum(&self) -> Option<f64> {
        self.minimum.as_ref().and_then(Number::as_f64)
    }
    /// The largest number allowed, when declared.
    pub fn maximum(&self) -> Option<f64> {
        self.maximum.as_ref().and_then(Number::as_f64)
    }
    /// The smallest number allowed as declared.
    pub(crate) fn minimum_number(&self) -> Option<&Number> {
        self.minimum.as_ref()
    }
    /// The largest number allowed as declared.
    pub(crate) fn maximum_number(&self) -> Option<&Number> {
        self.maximum.as_ref()
    }
    /// Whether a number must be whole.
    pub fn integer(&self) -> bool {
        self.integer
    }
    /// The values allowed (`enum`); empty when any value of the type is.
    pub fn one_of(&self) -> &[Value] {
        &self.one_of
    }
    /// The shortest string allowed (UTF-16 units), when declared.
    pub fn min_length(&self) -> Option<usize> {
        self.min_length
    }
    /// The unit of a number, shown to the person (`°C`, `%`).
    pub fn unit(&self) -> Option<&str> {
        self.unit.as_deref()
    }
    /// Whether nothing is declared.
    pub fn is_empty(&self) -> bool {
        *self == Bounds::default()
    }
    /// The bounds in words for a person (`from 10 to 30 °C, whole`, `one
    /// of "heat", "cool"`, `at least 2 characters`); `None` when none is
    /// declared.
    pub fn summary(&self) -> Option<String> {
        let mut parts: Vec<String> = Vec::new();
        match (&self.minimum, &self.maximum) {
            (Some(min), Some(max)) => parts.push(format!("from {min} to {}", self.with_unit(max))),
            (Some(min), None) => parts.push(format!("at least {}", self.with_unit(min))),
            (None, Some(max)) => parts.push(format!("at most {}", self.with_unit(max))),
            (None, None) => {
                if let Some(unit) = &self.unit {
                    parts.push(format!("in {unit}"));
                }
            }
        }
        if self.integer {
            parts.push("whole".to_owned());
        }
        if !self.one_of.is_empty() {
            let values: Vec<String> = self.one_of.iter().map(ToString::to_string).collect();
            parts.push(format!("one of {}", values.join(", ")));
        }
        if let Some(n) = self.min_length {
            parts.push(format!("at least {n} characters"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// `n` as the person reads it: the number, then the unit if any.
    pub(crate) fn with_unit(&self, n: &Number) -> String {
        match &self.unit {
            Some(unit) => format!("{n} {unit}"),
            None => n.to_string(),
        }
    }
}

/// The MCP tool hints a capability may carry: the device's claims about
/// what it does, shown to the person as claims, never trusted as checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Annotations {
    /// `readOnlyHint`: it changes nothing.
    pub read_only: Option<bool>,
    /// `destructiveHint`: what it changes may be lost.
    pub destructive: Option<bool>,
    /// `idempotentHint`: calling it twice does no more than once.
    pub idempotent: Option<bool>,
    /// `openWorldHint`: it reaches beyond the device (the internet).
    pub open_world: Option<bool>,
}

impl Annotations {
    /// The claims in words for a person (`read-only`, `changes things`,
    /// `destructive`, `not destructive`, `idempotent`, `reaches the open
    /// world`, `stays within its own world`): what the device says, never
    /// checked.
    pub fn claims(&self) -> Vec<String> {
        let said = [
            (self.read_only, "read-only", "changes things"),
            (self.destructive, "destructive", "not destructive"),
            (self.idempotent, "idempotent", "not idempotent"),
            (
                self.open_world,
                "reaches the open world",
                "stays within its own world",
            ),
        ];
        said.iter()
            .filter_map(|(value, yes, no)| value.map(|v| if v { *yes } else { *no }.to_owned()))
            .collect()
    }

    const KEYS: [&'static str; 4] = [
        "readOnlyHint",
        "destructiveHint",
        "idempotentHint",
        "openWorldHint",
    ];

    fn slots(&mut self) -> [&mut Option<bool>; 4] {
        [
            &mut self.read_only,
            &mut self.destructive,
            &mut self.idempotent,
            &mut self.open_world,
        ]
    }

    fn values(&self) -> [Option<bool>; 4] {
        [
            self.read_only,
            self.destructive,
            self.idempotent,
            self.open_world,
        ]
    }
}

/// What the extension adds to a capability.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ToolExtras {
    pub(crate) title: Option<String>,
    pub(crate) annotations: Option<Annotations>,
    pub(crate) input_schema: Option<Value>,
    pub(crate) output_schema: Option<Value>,
    pub(crate) tool: Option<String>,
    /// Whether its manifest has the extension (its input schema then
    /// carries the params' bounds).
    pub(crate) extended: bool,
}

/// Whether `m` opts in: `None` when it has no `dk`, an error when `dk` is
/// anything but [`VERSION`].
pub(crate) fn opted_in(m: &Map<String, Value>) -> Result<bool, Refused> {
    match m.get("dk") {
        None => Ok(false),
        Some(v) if v.as_u64() == Some(VERSION) => Ok(true),
        Some(_) => Err(bad("dk", "must be 1")),
    }
}

fn bad(field: &str, why: &str) -> Refused {
    Refused {
        field: field.to_owned(),
        why: why.to_owned(),
    }
}

/// A text field: a string, not blank, at most `max` UTF-16 units, with no
/// unsafe character (the rules of 8DK's text fields, in their words).
fn plain_text<'v>(at: &str, value: &'v Value, max: usize) -> Result<&'v str, Refused> {
    match value {
        Value::String(s) if !is_js_blank(s) && utf16_len(s) <= max => {
            if has_unsafe_char(s) {
                Err(bad(
                    at,
                    "contains control, escape, invisible or bidirectional characters",
                ))
            } else {
                Ok(s)
            }
        }
        _ => Err(Refused {
            field: at.to_owned(),
            why: format!("must be a non-empty string of at most {max} characters"),
        }),
    }
}

/// Reads a param's bounds from its spec (`owner` names the capability or
/// event, as in errors), each field in its order: minimum and maximum,
/// integer, minLength, unit, enum (which must keep the others).
pub(crate) fn read_bounds(
    owner: &str,
    name: &str,
    shape: Shape,
    spec: &Map<String, Value>,
) -> Result<Bounds, Refused> {
    let param = ParamAt { owner, name };
    let given = Given::of(spec);
    let mut bounds = Bounds::default();
    (bounds.minimum, bounds.maximum) = range(&param, shape, &given)?;
    bounds.integer = integer(&param, shape, given.integer)?;
    bounds.min_length = min_length(&param, shape, given.min_length)?;
    bounds.unit = unit(&param, shape, given.unit)?;
    if let Some(value) = given.one_of {
        bounds.one_of = one_of(&param, shape, &bounds, value)?;
    }
    Ok(bounds)
}

/// The param whose bounds are read, as errors name it.
struct ParamAt<'a> {
    owner: &'a str,
    name: &'a str,
}

impl ParamAt<'_> {
    /// The refusal of its field `what`. Named only when refused: a valid
    /// manifest formats nothing.
    fn refused(&self, what: &str, why: &str) -> Refused {
        bad(
            &format!("{} param \"{}\" {what}", self.owner, self.name),
            why,
        )
    }
}

/// The bounds' fields a spec gives, as sent.
#[derive(Default)]
struct Given<'v> {
    minimum: Option<&'v Value>,
    maximum: Option<&'v Value>,
    integer: Option<&'v Value>,
    min_length: Option<&'v Value>,
    unit: Option<&'v Value>,
    one_of: Option<&'v Value>,
}

impl<'v> Given<'v> {
    /// One pass over the spec's few keys, rather than a lookup for each
    /// field; a repeated key keeps its last value.
    fn of(spec: &'v Map<String, Value>) -> Given<'v> {
        let mut given = Given::default();
        for (key, value) in spec {
            let slot = match key.as_str() {
                "minimum" => &mut given.minimum,
                "maximum" => &mut given.maximum,
                "integer" => &mut given.integer,
                "minLength" => &mut given.min_length,
                "unit" => &mut given.unit,
                "enum" => &mut given.one_of,
                _ => continue,
            };
            *slot = Some(value);
        }
        given
    }
}

/// `minimum` and `maximum`: numbers on a number param, the first not above
/// the second.
fn range(
    param: &ParamAt<'_>,
    shape: Shape,
    given: &Given<'_>,
) -> Result<(Option<Number>, Option<Number>), Refused> {
    let number = |key: &str, value: Option<&Value>| match value {
        None => Ok(None),
        Some(Value::Number(n)) if shape.number => Ok(Some(n.clone())),
        Some(_) => Err(param.refused(key, "must be a number on a number param")),
    };
    let minimum = number("minimum", given.minimum)?;
    let maximum = number("maximum", given.maximum)?;
    if let (Some(min), Some(max)) = (
        minimum.as_ref().and_then(Number::as_f64),
        maximum.as_ref().and_then(Number::as_f64),
    ) && min > max
    {
        return Err(param.refused("minimum", "must not be above its maximum"));
    }
    Ok((minimum, maximum))
}

/// `integer`: true or false, true only on a number param.
fn integer(param: &ParamAt<'_>, shape: Shape, value: Option<&Value>) -> Result<bool, Refused> {
    match value {
        None | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) if shape.number => Ok(true),
        Some(_) => Err(param.refused("integer", "must be true or false on a number param")),
    }
}

/// `minLength`: a whole number up to the param's longest string, on a
/// string param.
fn min_length(
    param: &ParamAt<'_>,
    shape: Shape,
    value: Option<&Value>,
) -> Result<Option<usize>, Refused> {
    let Some(value) = value else {
        return Ok(None);
    };
    let n = value
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| shape.string && *n <= shape.max_length);
    n.map(Some).ok_or_else(|| {
        param.refused(
            "minLength",
            "must be a whole number up to its maxLength on a string param",
        )
    })
}

/// `unit`: a short plain text on a number param.
fn unit(
    param: &ParamAt<'_>,
    shape: Shape,
    value: Option<&Value>,
) -> Result<Option<String>, Refused> {
    match value {
        None => Ok(None),
        Some(Value::String(s))
            if shape.number
                && !s.trim().is_empty()
                && utf16_len(s) <= UNIT
                && !has_unsafe_char(s) =>
        {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(param.refused("unit", "must be a short plain text on a number param")),
    }
}

/// `enum`: 1 to [`ENUM`] distinct values of the param's type, each within
/// the `bounds` read before it.
fn one_of(
    param: &ParamAt<'_>,
    shape: Shape,
    bounds: &Bounds,
    value: &Value,
) -> Result<Vec<Value>, Refused> {
    let refused = || {
        param.refused(
            "enum",
            "must be a list of 1 to 32 distinct values of the param's type within its bounds",
        )
    };
    let Value::Array(values) = value else {
        return Err(refused());
    };
    if values.is_empty() || values.len() > ENUM || !(shape.number || shape.string) {
        return Err(refused());
    }
    for (i, value) in values.iter().enumerate() {
        let fits = match value {
            Value::String(s) => {
                shape.string
                    && !has_unsafe_char(s)
                    && utf16_len(s) <= shape.max_length
                    && bounds.min_length.is_none_or(|min| utf16_len(s) >= min)
            }
            Value::Number(n) => shape.number && within(bounds, n),
            _ => false,
        };
        if !fits || values.iter().take(i).any(|earlier| earlier == value) {
            return Err(refused());
        }
    }
    Ok(values.clone())
}

/// Whether `n` keeps `bounds`' minimum, maximum and `integer`.
pub(crate) fn within(bounds: &Bounds, n: &Number) -> bool {
    let Some(f) = n.as_f64() else {
        return false;
    };
    bounds.minimum().is_none_or(|min| f >= min)
        && bounds.maximum().is_none_or(|max| f <= max)
        && (!bounds.integer || is_whole(f))
}

/// Whether the finite `f` is a whole number (without `std`'s `fract`):
/// every float from 2^53 on is.
pub(crate) fn is_whole(f: f64) -> bool {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_precision_loss,
        reason = "below 2^53 in magnitude the cast is exact for whole numbers"
    )]
    let whole = |f: f64| (f as i64) as f64 == f;
    !(-EXACT..=EXACT).contains(&f) || whole(f)
}

/// Reads a capability's extras.
pub(crate) fn read_tool(
    owner: &str,
    has_params: bool,
    c: &Map<String, Value>,
) -> Result<ToolExtras, Refused> {
    let mut extras = ToolExtras::default();
    if let Some(value) = c.get("title") {
        extras.title = Some(plain_text(&format!("{owner} title"), value, TITLE)?.to_owned());
    }
    if let Some(value) = c.get("tool") {
        extras.tool = Some(plain_text(&format!("{owner} tool"), value, TOOL)?.to_owned());
    }
    if let Some(value) = c.get("annotations") {
        let why = "must be an object of readOnlyHint, destructiveHint, idempotentHint and openWorldHint, each true or false";
        let Value::Object(given) = value else {
            return Err(bad(&format!("{owner} annotations"), why));
        };
        let mut annotations = Annotations::default();
        for (key, value) in given {
            let slot = Annotations::KEYS.iter().position(|k| k == key);
            match (slot, value) {
                (Some(i), Value::Bool(b)) => {
                    if let Some(slot) = annotations.slots().into_iter().nth(i) {
                        *slot = Some(*b);
                    }
                }
                _ => return Err(bad(&format!("{owner} annotations"), why)),
            }
        }
        extras.annotations = Some(annotations);
    }
    for (key, slot) in [
        ("inputSchema", &mut extras.input_schema),
        ("outputSchema", &mut extras.output_schema),
    ] {
        if let Some(value) = c.get(key) {
            let at = format!("{owner} {key}");
            check_schema(&at, value)?;
            *slot = Some(value.clone());
        }
    }
    if extras.input_schema.is_some() && has_params {
        return Err(bad(
            &format!("{owner} inputSchema"),
            "must not be given beside params",
        ));
    }
    Ok(extras)
}

/// A schema: a JSON object, at most [`SCHEMA_DEPTH`] deep and
/// [`SCHEMA_BYTES`] long as stored, whose every key and string
/// holds no unsafe character (a schema's text reaches the model as a
/// description does).
fn check_schema(at: &str, value: &Value) -> Result<(), Refused> {
    let why = "must be a JSON Schema object of at most 16 KiB and 16 levels, with no control, invisible or bidirectional characters";
    if !value.is_object() || !plain(value, SCHEMA_DEPTH) {
        return Err(bad(at, why));
    }
    let mut out = String::new();
    canonical(&mut out, value);
    if out.len() > SCHEMA_BYTES {
        return Err(bad(at, why));
    }
    Ok(())
}

/// Whether `value` is at most `depth` levels deep with only safe text.
fn plain(value: &Value, depth: usize) -> bool {
    match value {
        Value::String(s) => !has_unsafe_char(s),
        Value::Array(items) => depth > 0 && items.iter().all(|v| plain(v, depth - 1)),
        Value::Object(map) => {
            depth > 0
                && map
                    .iter()
                    .all(|(k, v)| !has_unsafe_char(k) && plain(v, depth - 1))
        }
        _ => true,
    }
}

/// Appends a param's bounds to its stored JSON.
pub(crate) fn write_bounds(out: &mut String, bounds: &Bounds) {
    if let Some(n) = &bounds.minimum {
        let _ = write!(out, ",\"minimum\":{n}");
    }
    if let Some(n) = &bounds.maximum {
        let _ = write!(out, ",\"maximum\":{n}");
    }
    if bounds.integer {
        out.push_str(",\"integer\":true");
    }
    if !bounds.one_of.is_empty() {
        out.push_str(",\"enum\":");
        canonical(out, &Value::Array(bounds.one_of.clone()));
    }
    if let Some(n) = bounds.min_length {
        let _ = write!(out, ",\"minLength\":{n}");
    }
    if let Some(unit) = &bounds.unit {
        out.push_str(",\"unit\":");
        json_str(out, unit);
    }
}

/// Appends a capability's extras to its stored JSON.
pub(crate) fn write_tool(out: &mut String, extras: &ToolExtras) {
    if let Some(title) = &extras.title {
        out.push_str(",\"title\":");
        json_str(out, title);
    }
    if let Some(tool) = &extras.tool {
        out.push_str(",\"tool\":");
        json_str(out, tool);
    }
    if let Some(annotations) = &extras.annotations {
        out.push_str(",\"annotations\":{");
        let mut first = true;
        for (key, value) in Annotations::KEYS.iter().zip(annotations.values()) {
            if let Some(b) = value {
                if !first {
                    out.push(',');
                }
                first = false;
                let _ = write!(out, "\"{key}\":{b}");
            }
        }
        out.push('}');
    }
    if let Some(schema) = &extras.input_schema {
        out.push_str(",\"inputSchema\":");
        canonical(out, schema);
    }
    if let Some(schema) = &extras.output_schema {
        out.push_str(",\"outputSchema\":");
        canonical(out, schema);
    }
}

/// Appends `value` as compact JSON with every object's keys sorted, so the
/// same value gives the same bytes whatever order it was sent in.
pub(crate) fn canonical(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => json_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Keys are distinct, so a map orders them (no sort linked in).
            // (Inserted one by one: collecting into a map sorts first.)
            let mut sorted: BTreeMap<&str, &Value> = BTreeMap::new();
            for (key, value) in map {
                sorted.insert(key, value);
            }
            out.push('{');
            for (i, (key, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_str(out, key);
                out.push(':');
                canonical(out, value);
            }
            out.push('}');
        }
    }
}
