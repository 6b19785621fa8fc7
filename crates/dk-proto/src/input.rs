//! Input checks (check 4 of a tool call): a call's input against the
//! capability's declared params, with 8DK v1's messages and order.

use alloc::borrow::ToOwned;
use alloc::string::{String, ToString};

use serde_json::Value;

use crate::manifest::validate::array_index;
use crate::manifest::{Capability, EventSpec, Param, ParamType};
use crate::text::{has_unsafe_char, is_unsafe_char, utf16_len, utf16_prefix};

/// Why a call's input does not match its capability. `Display` gives 8DK
/// v1's exact text (the adapter prefixes it with `[8dk-deny] `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The input is not a JSON object.
    #[error("input must be an object")]
    NotAnObject,
    /// A key that is not a declared param; the key is cut to 64 UTF-16 units.
    #[error("unknown param \"{0}\"")]
    UnknownParam(String),
    /// A required param is missing.
    #[error("missing required \"{0}\"")]
    MissingRequired(String),
    /// A string value holds a character manifest text may not hold (a dk
    /// check; 8DK passed strings through unchecked).
    #[error("\"{0}\" contains control, escape, invisible or bidirectional characters")]
    UnsafeString(String),
    /// A string value of a param declared `base64` is not standard base64
    /// (a dk extension).
    #[error("\"{0}\" must be standard base64")]
    NotBase64(String),
    /// A string value is longer than its param allows (a dk check).
    #[error("\"{key}\" must be at most {max} characters")]
    StringTooLong {
        /// The param.
        key: String,
        /// Its limit, in UTF-16 code units.
        max: usize,
    },
    /// A string value is shorter than its param's `minLength` (the dk
    /// extension).
    #[error("\"{key}\" must be at least {min} characters")]
    StringTooShort {
        /// The param.
        key: String,
        /// Its least length, in UTF-16 code units.
        min: usize,
    },
    /// A number is below its param's `minimum` (the dk extension).
    #[error("\"{key}\" must be at least {min}")]
    BelowMinimum {
        /// The param.
        key: String,
        /// The minimum, with its unit when declared.
        min: String,
    },
    /// A number is above its param's `maximum` (the dk extension).
    #[error("\"{key}\" must be at most {max}")]
    AboveMaximum {
        /// The param.
        key: String,
        /// The maximum, with its unit when declared.
        max: String,
    },
    /// A number is not whole where its param says `integer` (the dk
    /// extension).
    #[error("\"{0}\" must be a whole number")]
    NotWhole(String),
    /// A value is not one of its param's `enum` (the dk extension).
    #[error("\"{key}\" must be one of {allowed}")]
    NotOneOf {
        /// The param.
        key: String,
        /// The values allowed, as JSON, joined by `, `.
        allowed: String,
    },
    /// The input of a capability with a declared `inputSchema` nests deeper
    /// than [`MAX_DEPTH`] levels.
    #[error("input must not nest deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// The input of a capability with a declared `inputSchema` does not
    /// match it: where and why, without the value (the vessel's JSON
    /// Schema check).
    #[error("input does not match the capability's inputSchema: {0}")]
    SchemaMismatch(String),
    /// A param has the wrong type (numbers must be finite).
    #[error("\"{key}\" must be {ty}")]
    WrongType {
        /// The param.
        key: String,
        /// The type it must have.
        ty: ParamType,
    },
}

/// How deep the input of a capability with a declared `inputSchema` may
/// nest (its schema is checked by the vessel after this).
pub const MAX_DEPTH: usize = 32;

/// How much of an unknown key an error quotes, in UTF-16 units.
const UNKNOWN_KEY_QUOTE: usize = 64;

/// Checks `input` against `capability`'s params. In order: the input must be
/// an object; the first key that is not a declared param is refused (keys are
/// taken in JavaScript's order: array-index keys like `"0"` first, which are
/// never param names); then each declared param in declaration order: missing
/// and required, or present with the wrong type. `__proto__`, `constructor`
/// and the like are ordinary unknown keys. A string holds no control,
/// invisible or bidirectional character, but new lines and tabs in a
/// `multiline` param.
///
/// With the dk extension, each value keeps its param's bounds (`minimum`,
/// `maximum`, `integer`, `enum`, `minLength`), checked after its type. A
/// capability that declares an `inputSchema` instead of params takes any
/// object at most [`MAX_DEPTH`] deep whose strings hold no character but
/// new lines and tabs that manifest text may not hold; its schema is the
/// vessel's to check.
pub fn check_input(capability: &Capability, input: &Value) -> Result<(), InputError> {
    if capability.declared_input_schema().is_some() {
        let Value::Object(values) = input else {
            return Err(InputError::NotAnObject);
        };
        for (key, value) in values {
            if !plain(value, MAX_DEPTH) || has_unsafe_char(key) {
                return Err(if depth_over(value, MAX_DEPTH) {
                    InputError::TooDeep
                } else {
                    InputError::UnsafeString(utf16_prefix(key, UNKNOWN_KEY_QUOTE).to_owned())
                });
            }
        }
        return Ok(());
    }
    check_params(capability.params(), input)
}

/// Checks the data of a declared event against its params, as a call's
/// input is checked: a device's event that does not keep them is dropped.
pub fn check_event(event: &EventSpec, data: &Value) -> Result<(), InputError> {
    check_params(event.params(), data)
}

/// Whether `value` is at most `depth` levels deep and its strings (and
/// keys) hold nothing unsafe but new lines and tabs.
fn plain(value: &Value, depth: usize) -> bool {
    let safe = |s: &str| {
        !s.chars()
            .any(|c| !matches!(c, '\n' | '\t') && is_unsafe_char(c))
    };
    match value {
        Value::String(s) => safe(s),
        Value::Array(items) => depth > 0 && items.iter().all(|v| plain(v, depth - 1)),
        Value::Object(map) => depth > 0 && map.iter().all(|(k, v)| safe(k) && plain(v, depth - 1)),
        _ => true,
    }
}

/// Whether `value` nests deeper than `depth`.
fn depth_over(value: &Value, depth: usize) -> bool {
    match value {
        Value::Array(items) => depth == 0 || items.iter().any(|v| depth_over(v, depth - 1)),
        Value::Object(map) => depth == 0 || map.values().any(|v| depth_over(v, depth - 1)),
        _ => false,
    }
}

/// Checks `input` against declared `params` (see [`check_input`]).
fn check_params(params: &[Param], input: &Value) -> Result<(), InputError> {
    let Value::Object(values) = input else {
        return Err(InputError::NotAnObject);
    };
    let unknown = values
        .keys()
        .filter_map(|k| array_index(k).map(|n| (n, k)))
        .min()
        .map(|(_, k)| k)
        .or_else(|| {
            values
                .keys()
                .find(|k| !params.iter().any(|p| p.name() == k.as_str()))
        });
    if let Some(key) = unknown {
        return Err(InputError::UnknownParam(
            utf16_prefix(key, UNKNOWN_KEY_QUOTE).to_owned(),
        ));
    }
    for param in params {
        // Inputs are small: a scan beats hashing every key (keys are unique).
        let found = if values.len() <= 8 {
            values
                .iter()
                .find(|(k, _)| k.as_str() == param.name())
                .map(|(_, v)| v)
        } else {
            values.get(param.name())
        };
        let Some(value) = found else {
            if param.required() {
                return Err(InputError::MissingRequired(param.name().to_owned()));
            }
            continue;
        };
        let ok = match param.ty() {
            ParamType::String => value.is_string(),
            ParamType::Boolean => value.is_boolean(),
            ParamType::Number => value.as_f64().is_some_and(f64::is_finite),
        };
        if !ok {
            return Err(InputError::WrongType {
                key: param.name().to_owned(),
                ty: param.ty(),
            });
        }
        if let Value::String(text) = value {
            if utf16_len(text) > param.max_length() {
                return Err(InputError::StringTooLong {
                    key: param.name().to_owned(),
                    max: param.max_length(),
                });
            }
            if param.base64() && !is_base64(text) {
                return Err(InputError::NotBase64(param.name().to_owned()));
            }
            let refused = if param.multiline() {
                text.chars()
                    .any(|c| !matches!(c, '\n' | '\t') && is_unsafe_char(c))
            } else {
                has_unsafe_char(text)
            };
            if refused {
                return Err(InputError::UnsafeString(param.name().to_owned()));
            }
        }
        check_bounds(param, value)?;
    }
    Ok(())
}

/// Checks a value of the right type against its param's bounds (the dk
/// extension; none without it).
fn check_bounds(param: &Param, value: &Value) -> Result<(), InputError> {
    let bounds = param.bounds();
    if bounds.is_empty() {
        return Ok(());
    }
    let key = || param.name().to_owned();
    match value {
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if let Some(min) = bounds.minimum_number()
                && min.as_f64().is_some_and(|min| f < min)
            {
                return Err(InputError::BelowMinimum {
                    key: key(),
                    min: bounds.with_unit(min),
                });
            }
            if let Some(max) = bounds.maximum_number()
                && max.as_f64().is_some_and(|max| f > max)
            {
                return Err(InputError::AboveMaximum {
                    key: key(),
                    max: bounds.with_unit(max),
                });
            }
            if bounds.integer() && !crate::manifest::is_whole(f) {
                return Err(InputError::NotWhole(key()));
            }
        }
        Value::String(text) => {
            if let Some(min) = bounds.min_length()
                && utf16_len(text) < min
            {
                return Err(InputError::StringTooShort { key: key(), min });
            }
        }
        _ => {}
    }
    let one_of = bounds.one_of();
    let matches = |allowed: &Value| match (allowed, value) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    };
    if !one_of.is_empty() && !one_of.iter().any(matches) {
        let allowed: alloc::vec::Vec<String> = one_of.iter().map(ToString::to_string).collect();
        return Err(InputError::NotOneOf {
            key: key(),
            allowed: allowed.join(", "),
        });
    }
    Ok(())
}

/// Standard base64 with its padding: groups of four of `A-Z a-z 0-9 + /`,
/// the last ending in at most two `=`.
fn is_base64(text: &str) -> bool {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return false;
    }
    let padding = bytes.iter().rev().take_while(|&&b| b == b'=').count();
    padding <= 2
        && bytes
            .iter()
            .take(bytes.len() - padding)
            .all(|&b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

#[cfg(test)]
mod tests;
