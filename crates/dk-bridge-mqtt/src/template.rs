//! Payloads built from a call's input. A template is JSON; a string that is
//! exactly `{name}` stands for the input's value of `name`, placed as a
//! JSON value (a string stays a string, with its quotes and escapes), so
//! an input can never add a key, close a string or change the payload's
//! structure. A placeholder whose input was not given is left out with its
//! key (or its array element). Nothing else is substituted. A payload that
//! fills to a single string is published as that text (Tasmota's
//! `cmnd/<device>/POWER` takes `ON`): the whole payload is then the value,
//! with no structure around it to break.

use serde_json::{Map, Value};

/// Why a template could not be filled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template's top level is a placeholder whose input is missing.
    #[error("the payload is `{{{0}}}` and no `{0}` was given")]
    Empty(String),
}

/// The name a string placeholder stands for, if it is one.
fn placeholder(text: &str) -> Option<&str> {
    let name = text.strip_prefix('{')?.strip_suffix('}')?;
    (!name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then_some(name)
}

/// `template` with every placeholder replaced by `input`'s value.
pub fn fill(template: &Value, input: &Map<String, Value>) -> Result<Value, TemplateError> {
    match fill_value(template, input) {
        Some(value) => Ok(value),
        None => Err(TemplateError::Empty(
            template
                .as_str()
                .and_then(placeholder)
                .unwrap_or_default()
                .to_owned(),
        )),
    }
}

/// `None` when the value is a placeholder whose input is missing.
fn fill_value(template: &Value, input: &Map<String, Value>) -> Option<Value> {
    match template {
        Value::String(text) => match placeholder(text) {
            Some(name) => input.get(name).cloned(),
            None => Some(template.clone()),
        },
        Value::Array(items) => Some(Value::Array(
            items.iter().filter_map(|v| fill_value(v, input)).collect(),
        )),
        Value::Object(fields) => Some(Value::Object(
            fields
                .iter()
                .filter_map(|(k, v)| fill_value(v, input).map(|v| (k.clone(), v)))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::{TemplateError, fill};

    fn input(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn values_are_placed_as_json_never_spliced() {
        let template = json!({"state": "{state}", "brightness": "{level}", "fixed": "on",
                              "list": ["{state}", "{absent}"], "note": "x {state} y"});
        let hostile = "ON\", \"lock\": \"open";
        let filled = fill(&template, &input(json!({"state": hostile, "level": 7}))).unwrap();
        assert_eq!(
            filled,
            json!({"state": hostile, "brightness": 7, "fixed": "on",
                   "list": [hostile], "note": "x {state} y"})
        );
        // The text on the wire keeps the structure: one `state`, no `lock`.
        let wire = filled.to_string();
        let back: Value = serde_json::from_str(&wire).unwrap();
        assert!(back.get("lock").is_none());
        let filled = fill(&template, &input(json!({"state": "OFF"}))).unwrap();
        assert!(
            filled.get("brightness").is_none(),
            "left out when not given"
        );
        assert_eq!(
            fill(&json!("{state}"), &input(json!({}))),
            Err(TemplateError::Empty("state".to_owned()))
        );
        assert_eq!(fill(&json!("ON"), &input(json!({}))).unwrap(), json!("ON"));
    }
}
