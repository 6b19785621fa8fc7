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
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::{Map, Number, Value};

use super::{
    Capability, ManifestError, Param, ParamType, field, is_snake_name, json_str, limits, text,
    validate_params,
};
use crate::text::{has_unsafe_char, utf16_len};

/// The value of `dk` that opts a manifest in.
pub const VERSION: u64 = 1;

/// What the extension adds to a param: the bounds a value must keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    pub(super) minimum: Option<Number>,
    pub(super) maximum: Option<Number>,
    pub(super) integer: bool,
    pub(super) one_of: Vec<Value>,
    pub(super) min_length: Option<usize>,
    pub(super) unit: Option<String>,
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
    pub(super) title: Option<String>,
    pub(super) annotations: Option<Annotations>,
    pub(super) input_schema: Option<Value>,
    pub(super) output_schema: Option<Value>,
    pub(super) tool: Option<String>,
    /// Whether its manifest has the extension (its input schema then
    /// carries the params' bounds).
    pub(super) extended: bool,
}

/// An event a device declares it may send (`device:event` with this name
/// as its `capability`), with the params of its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    pub(super) name: String,
    pub(super) description: String,
    pub(super) params: Vec<Param>,
}

impl EventSpec {
    /// Lower snake case, unique among the device's events and capabilities.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What it tells, shown to the person and the model.
    pub fn description(&self) -> &str {
        &self.description
    }
    /// The params of its data, in declared order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }
}

/// Whether `m` opts in: `None` when it has no `dk`, an error when `dk` is
/// anything but [`VERSION`].
pub(super) fn opted_in(m: &Map<String, Value>) -> Result<bool, ManifestError> {
    match field(m, "dk") {
        None => Ok(false),
        Some(v) if v.as_u64() == Some(VERSION) => Ok(true),
        Some(_) => Err(bad("dk", "must be 1")),
    }
}

fn bad(field: &str, why: &str) -> ManifestError {
    ManifestError::BadExtension {
        field: field.to_owned(),
        why: why.to_owned(),
    }
}

/// Reads a param's bounds from its spec (`owner` names the capability or
/// event, as in errors).
pub(super) fn read_bounds(
    owner: &str,
    param: &Param,
    spec: &Map<String, Value>,
) -> Result<Bounds, ManifestError> {
    let at = |what: &str| format!("{owner} param \"{}\" {what}", param.name);
    let number = param.ty == ParamType::Number;
    let string = param.ty == ParamType::String;
    let mut bounds = Bounds::default();
    for (key, slot) in [
        ("minimum", &mut bounds.minimum),
        ("maximum", &mut bounds.maximum),
    ] {
        if let Some(value) = field(spec, key) {
            match value {
                Value::Number(n) if number => *slot = Some(n.clone()),
                _ => return Err(bad(&at(key), "must be a number on a number param")),
            }
        }
    }
    if let (Some(min), Some(max)) = (bounds.minimum(), bounds.maximum())
        && min > max
    {
        return Err(bad(&at("minimum"), "must not be above its maximum"));
    }
    bounds.integer = match field(spec, "integer") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) if number => true,
        Some(_) => {
            return Err(bad(
                &at("integer"),
                "must be true or false on a number param",
            ));
        }
    };
    if let Some(value) = field(spec, "minLength") {
        let n = value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| string && *n <= param.max_length());
        bounds.min_length = Some(n.ok_or_else(|| {
            bad(
                &at("minLength"),
                "must be a whole number up to its maxLength on a string param",
            )
        })?);
    }
    if let Some(value) = field(spec, "unit") {
        let unit = match value {
            Value::String(s)
                if number
                    && !s.trim().is_empty()
                    && utf16_len(s) <= limits::UNIT
                    && !has_unsafe_char(s) =>
            {
                s.clone()
            }
            _ => {
                return Err(bad(
                    &at("unit"),
                    "must be a short plain text on a number param",
                ));
            }
        };
        bounds.unit = Some(unit);
    }
    if let Some(value) = field(spec, "enum") {
        let why = "must be a list of 1 to 32 distinct values of the param's type within its bounds";
        let Value::Array(values) = value else {
            return Err(bad(&at("enum"), why));
        };
        if values.is_empty() || values.len() > limits::ENUM || param.ty == ParamType::Boolean {
            return Err(bad(&at("enum"), why));
        }
        for (i, value) in values.iter().enumerate() {
            let fits = match value {
                Value::String(s) => {
                    string
                        && !has_unsafe_char(s)
                        && utf16_len(s) <= param.max_length()
                        && bounds.min_length.is_none_or(|min| utf16_len(s) >= min)
                }
                Value::Number(n) => number && within(&bounds, n),
                _ => false,
            };
            if !fits || values.iter().take(i).any(|earlier| earlier == value) {
                return Err(bad(&at("enum"), why));
            }
        }
        bounds.one_of = values.clone();
    }
    Ok(bounds)
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
pub(super) fn read_tool(
    capability: &Capability,
    c: &Map<String, Value>,
) -> Result<ToolExtras, ManifestError> {
    let owner = format!("capability \"{}\"", capability.name);
    let mut extras = ToolExtras::default();
    if field(c, "title").is_some() {
        let name = || format!("{owner} title");
        extras.title = Some(text(field(c, "title"), limits::NAME, name)?.to_owned());
    }
    if let Some(value) = field(c, "tool") {
        let name = || format!("{owner} tool");
        extras.tool = Some(text(Some(value), limits::TOOL, name)?.to_owned());
    }
    if let Some(value) = field(c, "annotations") {
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
        if let Some(value) = field(c, key) {
            let at = format!("{owner} {key}");
            check_schema(&at, value)?;
            *slot = Some(value.clone());
        }
    }
    if extras.input_schema.is_some() && !capability.params.is_empty() {
        return Err(bad(
            &format!("{owner} inputSchema"),
            "must not be given beside params",
        ));
    }
    Ok(extras)
}

/// A schema: a JSON object, at most [`limits::SCHEMA_DEPTH`] deep and
/// [`limits::SCHEMA_BYTES`] long as stored, whose every key and string
/// holds no unsafe character (a schema's text reaches the model as a
/// description does).
fn check_schema(at: &str, value: &Value) -> Result<(), ManifestError> {
    let why = "must be a JSON Schema object of at most 16 KiB and 16 levels, with no control, invisible or bidirectional characters";
    if !value.is_object() || !plain(value, limits::SCHEMA_DEPTH) {
        return Err(bad(at, why));
    }
    let mut out = String::new();
    canonical(&mut out, value);
    if out.len() > limits::SCHEMA_BYTES {
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

/// Reads a manifest's `events`; `capabilities` are those already read, whose
/// names an event may not take.
pub(super) fn read_events(
    m: &Map<String, Value>,
    capabilities: &[Capability],
) -> Result<Vec<EventSpec>, ManifestError> {
    let Some(raw) = field(m, "events") else {
        return Ok(Vec::new());
    };
    let why = "must be a list of at most 32 events, each with a lower snake case name of its own";
    let Value::Array(list) = raw else {
        return Err(bad("events", why));
    };
    if list.len() > limits::EVENTS {
        return Err(bad("events", why));
    }
    let mut events: Vec<EventSpec> = Vec::with_capacity(list.len());
    let empty = Map::new();
    for raw in list {
        let e = raw.as_object().unwrap_or(&empty);
        let name = text(field(e, "name"), limits::CAPABILITY_NAME, || {
            "event name".to_owned()
        })?;
        let taken = events.iter().any(|other| other.name == name)
            || capabilities.iter().any(|c| c.name == name);
        if !is_snake_name(name) || taken {
            return Err(bad(&format!("event \"{name}\""), why));
        }
        let owner = format!("event \"{name}\"");
        let description = text(
            field(e, "description"),
            limits::CAPABILITY_DESCRIPTION,
            || format!("{owner} description"),
        )?;
        let mut params =
            validate_params(name, field(e, "params")).map_err(|error| match error {
                ManifestError::BadParam { key, .. } => bad(
                    &format!("{owner} param \"{key}\""),
                    "must be lower snake case with type string, number or boolean",
                ),
                ManifestError::TooManyParams(_) => bad(&owner, "declares more than 16 params"),
                other => other,
            })?;
        if let Some(Value::Object(specs)) = field(e, "params") {
            super::read_param_extensions(name, &owner, &mut params, specs, true)?;
        }
        events.push(EventSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            params,
        });
    }
    Ok(events)
}

/// Appends a param's bounds to its stored JSON.
pub(super) fn write_bounds(out: &mut String, bounds: &Bounds) {
    if let Some(n) = &bounds.minimum {
        out.push_str(&format!(",\"minimum\":{n}"));
    }
    if let Some(n) = &bounds.maximum {
        out.push_str(&format!(",\"maximum\":{n}"));
    }
    if bounds.integer {
        out.push_str(",\"integer\":true");
    }
    if !bounds.one_of.is_empty() {
        out.push_str(",\"enum\":");
        canonical(out, &Value::Array(bounds.one_of.clone()));
    }
    if let Some(n) = bounds.min_length {
        out.push_str(&format!(",\"minLength\":{n}"));
    }
    if let Some(unit) = &bounds.unit {
        out.push_str(",\"unit\":");
        json_str(out, unit);
    }
}

/// Appends a capability's extras to its stored JSON.
pub(super) fn write_tool(out: &mut String, extras: &ToolExtras) {
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
                out.push_str(&format!("\"{key}\":{b}"));
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
        Value::Number(n) => out.push_str(&n.to_string()),
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
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_str(out, key);
                out.push(':');
                if let Some(value) = map.get(key) {
                    canonical(out, value);
                }
            }
            out.push('}');
        }
    }
}
