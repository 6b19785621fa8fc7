//! Validation of an untrusted manifest with 8DK v1's rules, in its order
//! and with its messages, then dk's extensions (`noScreen`, params'
//! `maxLength`, `multiline` and `base64`, and with `"dk": 1` the
//! extension's fields and `events`).

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::{Map, Value};

use super::extension::{self, Bounds, ToolExtras};
use super::limits;
use super::{Capability, CapabilityKind, EventSpec, Manifest, ManifestError, Param, ParamType};
use crate::text::{has_unsafe_char, is_js_blank, utf16_len, utf16_prefix};

/// Parses `text` as JSON and validates it with [`validate_manifest`].
pub fn validate_manifest_json(text: &str) -> Result<Manifest, ManifestError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ManifestError::NotJson(e.to_string()))?;
    validate_manifest(&value)
}

/// Validates an untrusted manifest with 8DK v1's rules, in its order, and
/// returns the validated copy (unknown keys dropped). The first failure wins.
pub fn validate_manifest(input: &Value) -> Result<Manifest, ManifestError> {
    // JavaScript treats an array as an object with none of the named fields.
    let empty = Map::new();
    let m = match input {
        Value::Object(map) => map,
        Value::Array(_) => &empty,
        _ => return Err(ManifestError::NotAnObject),
    };
    let id = text(field(m, "id"), limits::ID, || "id".to_owned())?;
    if !is_device_id(id) {
        return Err(ManifestError::BadId(id.to_owned()));
    }
    let raw_capabilities = match field(m, "capabilities") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        _ => return Err(ManifestError::NoCapabilities),
    };
    if raw_capabilities.len() > limits::CAPABILITIES {
        return Err(ManifestError::TooManyCapabilities);
    }
    let mut capabilities: Vec<Capability> = Vec::with_capacity(raw_capabilities.len());
    for raw in raw_capabilities {
        let capability = validate_capability(raw, &capabilities, &empty)?;
        capabilities.push(capability);
    }
    let mut manifest = Manifest {
        id: id.to_owned(),
        name: text(field(m, "name"), limits::NAME, || "name".to_owned())?.to_owned(),
        kind: text(field(m, "kind"), limits::KIND, || "kind".to_owned())?.to_owned(),
        version: text(field(m, "version"), limits::VERSION, || {
            "version".to_owned()
        })?
        .to_owned(),
        capabilities,
        no_screen: false,
        extended: false,
        events: Vec::new(),
    };
    // dk's extensions are checked last, so every manifest 8DK refuses gets
    // 8DK's first error.
    manifest.no_screen = match field(m, "noScreen") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ManifestError::BadNoScreen),
    };
    manifest.extended = extension::opted_in(m)?;
    for (capability, raw) in manifest.capabilities.iter_mut().zip(raw_capabilities) {
        let c = raw.as_object().unwrap_or(&empty);
        if let Some(Value::Object(specs)) = field(c, "params") {
            let owner = format!("capability \"{}\"", capability.name);
            let name = capability.name.clone();
            read_param_extensions(
                &name,
                &owner,
                &mut capability.params,
                specs,
                manifest.extended,
            )?;
        }
        if manifest.extended {
            let owner = format!("capability \"{}\"", capability.name);
            capability.extras = extension::read_tool(&owner, !capability.params.is_empty(), c)?;
            capability.extras.extended = true;
        }
    }
    if manifest.extended {
        manifest.events = read_events(m, &manifest.capabilities)?;
    }
    Ok(manifest)
}

/// Reads dk's param fields of `params` from their `specs`: `multiline`,
/// `base64` and `maxLength` always (errors name the capability `name`), the
/// extension's bounds when `extended` (errors name `owner`).
fn read_param_extensions(
    name: &str,
    owner: &str,
    params: &mut [Param],
    specs: &Map<String, Value>,
    extended: bool,
) -> Result<(), ManifestError> {
    for param in params {
        let spec = specs.get(&param.name).and_then(Value::as_object);
        param.multiline = match spec.and_then(|spec| field(spec, "multiline")) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) if param.ty == ParamType::String => true,
            Some(_) => {
                return Err(ManifestError::BadMultiline {
                    capability: name.to_owned(),
                    key: param.name.clone(),
                });
            }
        };
        let raw_max = spec.and_then(|spec| field(spec, "maxLength"));
        param.base64 = match spec.and_then(|spec| field(spec, "base64")) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) if param.ty == ParamType::String && raw_max.is_some() => true,
            Some(_) => {
                return Err(ManifestError::BadBase64 {
                    capability: name.to_owned(),
                    key: param.name.clone(),
                });
            }
        };
        if let Some(raw_max) = raw_max {
            let most = if param.base64 {
                limits::INPUT_BASE64
            } else {
                limits::INPUT_STRING
            };
            let max = raw_max
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=most).contains(n) && param.ty == ParamType::String);
            param.max_length = Some(max.ok_or_else(|| ManifestError::BadMaxLength {
                capability: name.to_owned(),
                key: param.name.clone(),
            })?);
        }
        if let (true, Some(spec)) = (extended, spec) {
            let shape = extension::Shape {
                number: param.ty == ParamType::Number,
                string: param.ty == ParamType::String,
                max_length: param.max_length(),
            };
            param.bounds = extension::read_bounds(owner, &param.name, shape, spec)?;
        }
    }
    Ok(())
}

/// Reads a manifest's `events`; `capabilities` are those already read, whose
/// names an event may not take.
fn read_events(
    m: &Map<String, Value>,
    capabilities: &[Capability],
) -> Result<Vec<EventSpec>, ManifestError> {
    let Some(raw) = field(m, "events") else {
        return Ok(Vec::new());
    };
    let why = "must be a list of at most 32 events, each with a lower snake case name of its own";
    let Value::Array(list) = raw else {
        return Err(extension_error("events", why));
    };
    if list.len() > limits::EVENTS {
        return Err(extension_error("events", why));
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
            return Err(extension_error(&format!("event \"{name}\""), why));
        }
        let owner = format!("event \"{name}\"");
        let description = text(
            field(e, "description"),
            limits::CAPABILITY_DESCRIPTION,
            || format!("{owner} description"),
        )?;
        let mut params =
            validate_params(name, field(e, "params")).map_err(|error| match error {
                ManifestError::BadParam { key, .. } => extension_error(
                    &format!("{owner} param \"{key}\""),
                    "must be lower snake case with type string, number or boolean",
                ),
                ManifestError::TooManyParams(_) => {
                    extension_error(&owner, "declares more than 16 params")
                }
                other => other,
            })?;
        if let Some(Value::Object(specs)) = field(e, "params") {
            read_param_extensions(name, &owner, &mut params, specs, true)?;
        }
        events.push(EventSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            params,
        });
    }
    Ok(events)
}

/// The error of a field of the dk extension.
fn extension_error(field: &str, why: &str) -> ManifestError {
    ManifestError::BadExtension {
        field: field.to_owned(),
        why: why.to_owned(),
    }
}

impl From<extension::Refused> for ManifestError {
    fn from(refused: extension::Refused) -> ManifestError {
        ManifestError::BadExtension {
            field: refused.field,
            why: refused.why,
        }
    }
}

/// Validates one capability, in 8DK's order: name, duplicate, kind, params
/// (count, then each key and type, then its description), description, confirm.
fn validate_capability(
    raw: &Value,
    seen: &[Capability],
    empty: &Map<String, Value>,
) -> Result<Capability, ManifestError> {
    // A capability that is not an object has none of the fields.
    let c = raw.as_object().unwrap_or(empty);
    let name = text(field(c, "name"), limits::CAPABILITY_NAME, || {
        "capability name".to_owned()
    })?;
    if !is_snake_name(name) {
        return Err(ManifestError::BadCapabilityName(name.to_owned()));
    }
    if seen.iter().any(|other| other.name == name) {
        return Err(ManifestError::DuplicateCapability(name.to_owned()));
    }
    let kind = field(c, "kind")
        .and_then(Value::as_str)
        .and_then(CapabilityKind::parse)
        .ok_or_else(|| ManifestError::BadCapabilityKind(name.to_owned()))?;
    let params = validate_params(name, field(c, "params"))?;
    let description = text(
        field(c, "description"),
        limits::CAPABILITY_DESCRIPTION,
        || format!("capability \"{name}\" description"),
    )?;
    Ok(Capability {
        name: name.to_owned(),
        kind,
        description: description.to_owned(),
        params,
        confirm: field(c, "confirm") == Some(&Value::Bool(true)),
        extras: ToolExtras::default(),
    })
}

/// Validates a capability's `params` the way 8DK walks `Object.entries` of it:
/// an array or a string has index keys (which never pass the name rule), a
/// number or boolean has none.
fn validate_params(capability: &str, raw: Option<&Value>) -> Result<Vec<Param>, ManifestError> {
    let bad = |key: &str| ManifestError::BadParam {
        capability: capability.to_owned(),
        key: utf16_prefix(key, limits::PARAM_NAME).to_owned(),
    };
    let map = match raw {
        Some(Value::Object(map)) => map,
        Some(Value::Array(list)) if !list.is_empty() => {
            return Err(if list.len() > limits::PARAMS {
                ManifestError::TooManyParams(capability.to_owned())
            } else {
                bad("0")
            });
        }
        Some(Value::String(s)) if !s.is_empty() => {
            return Err(if utf16_len(s) > limits::PARAMS {
                ManifestError::TooManyParams(capability.to_owned())
            } else {
                bad("0")
            });
        }
        _ => return Ok(Vec::new()),
    };
    if map.len() > limits::PARAMS {
        return Err(ManifestError::TooManyParams(capability.to_owned()));
    }
    let mut params = Vec::with_capacity(map.len());
    for (key, spec) in js_key_order(map) {
        let ty = match spec {
            Value::Object(spec) if utf16_len(key) <= limits::PARAM_NAME && is_snake_name(key) => {
                ParamType::from_value(field(spec, "type"))
            }
            _ => None,
        };
        let (Some(ty), Value::Object(spec)) = (ty, spec) else {
            return Err(bad(key));
        };
        let description = if truthy(field(spec, "description")) {
            let name = || format!("capability \"{capability}\" param \"{key}\" description");
            Some(text(field(spec, "description"), limits::PARAM_DESCRIPTION, name)?.to_owned())
        } else {
            None
        };
        params.push(Param {
            name: key.to_owned(),
            ty,
            description,
            required: truthy(field(spec, "required")),
            max_length: None,
            multiline: false,
            base64: false,
            bounds: Bounds::default(),
        });
    }
    Ok(params)
}

/// `map[key]` by a linear scan: manifests' objects are small, and a scan
/// beats hashing the key for a handful of entries. Keys are unique in the map.
fn field<'v>(map: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    if map.len() > 8 {
        return map.get(key);
    }
    map.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
}

/// Reads a text field: a string, not blank by JavaScript's `trim`, at most
/// `max` UTF-16 units, with no unsafe character.
fn text(
    value: Option<&Value>,
    max: usize,
    field: impl FnOnce() -> String,
) -> Result<&str, ManifestError> {
    let s = match value {
        Some(Value::String(s)) if !is_js_blank(s) && utf16_len(s) <= max => s.as_str(),
        _ => {
            return Err(ManifestError::TextLength {
                field: field(),
                max,
            });
        }
    };
    if has_unsafe_char(s) {
        return Err(ManifestError::UnsafeText { field: field() });
    }
    Ok(s)
}

/// `^[a-z0-9]+(-[a-z0-9]+)*$`
pub(crate) fn is_device_id(s: &str) -> bool {
    !s.is_empty()
        && s.split('-').all(|word| {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`: lower snake case, never `__`, no
/// leading digit, no trailing `_`.
pub(crate) fn is_snake_name(s: &str) -> bool {
    match s.as_bytes().first() {
        Some(b) if b.is_ascii_lowercase() => {}
        _ => return false,
    }
    s.split('_').all(|word| {
        !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// JavaScript truthiness of a JSON value.
fn truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// True for a canonical array index (`0`, or digits without a leading zero,
/// below 2^32 - 1): JavaScript enumerates such keys first, in numeric order.
pub(crate) fn array_index(key: &str) -> Option<u32> {
    if key.is_empty()
        || (key.len() > 1 && key.starts_with('0'))
        || !key.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    key.parse::<u32>().ok().filter(|&n| n != u32::MAX)
}

/// The keys of a JSON object in the order JavaScript's `Object.entries`
/// gives them: array-index keys ascending, then the rest as sent.
pub(crate) fn js_key_order(map: &Map<String, Value>) -> Vec<(&str, &Value)> {
    // Array indices are distinct numbers, so a map orders them; it keeps a
    // sort out of the firmware's code.
    let mut indexed: BTreeMap<u32, (&str, &Value)> = BTreeMap::new();
    let mut named: Vec<(&str, &Value)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        match array_index(key) {
            Some(n) => {
                indexed.insert(n, (key, value));
            }
            None => named.push((key, value)),
        }
    }
    if indexed.is_empty() {
        return named;
    }
    indexed.into_values().chain(named).collect()
}
