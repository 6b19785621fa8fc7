//! Input checks (check 4 of a tool call): a call's input against the
//! capability's declared params, with 8DK v1's messages and order.

use alloc::borrow::ToOwned;
use alloc::string::String;

use serde_json::Value;

use crate::manifest::{Capability, ParamType, array_index};
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
    /// A param has the wrong type (numbers must be finite).
    #[error("\"{key}\" must be {ty}")]
    WrongType {
        /// The param.
        key: String,
        /// The type it must have.
        ty: ParamType,
    },
}

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
pub fn check_input(capability: &Capability, input: &Value) -> Result<(), InputError> {
    let Value::Object(values) = input else {
        return Err(InputError::NotAnObject);
    };
    let unknown = values
        .keys()
        .filter_map(|k| array_index(k).map(|n| (n, k)))
        .min()
        .map(|(_, k)| k)
        .or_else(|| values.keys().find(|k| capability.param(k).is_none()));
    if let Some(key) = unknown {
        return Err(InputError::UnknownParam(
            utf16_prefix(key, UNKNOWN_KEY_QUOTE).to_owned(),
        ));
    }
    for param in capability.params() {
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
    }
    Ok(())
}

/// Standard base64 with its padding: groups of four of `A-Z a-z 0-9 + /`,
/// the last ending in at most two `=`.
fn is_base64(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() % 4 != 0 {
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
