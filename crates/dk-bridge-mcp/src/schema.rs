//! JSON Schema as the bridge checks it: compiled once per tool, offline
//! (a `$ref` outside the schema is refused, never fetched), with the
//! linear-time `regex` engine for `pattern`, draft 2020-12 unless the
//! schema names another draft with `$schema`.

use jsonschema::{PatternOptions, Validator};
use serde_json::Value;

/// Most bytes a compiled `pattern` may take.
const REGEX_BYTES: usize = 1 << 20;

/// `schema` compiled; or why it cannot be (`is not ...`).
pub fn compile(schema: &Value) -> Result<Validator, String> {
    jsonschema::options()
        .offline()
        .with_pattern_options(PatternOptions::regex().size_limit(REGEX_BYTES))
        .build(schema)
        .map_err(|e| format!("is not a JSON Schema this bridge can check: {}", e.masked()))
}

/// Why `value` does not match `validator`, when it does not: its first
/// error, where it is and what is wrong, without the value itself.
pub fn mismatch(validator: &Validator, value: &Value) -> Option<String> {
    validator.iter_errors(value).next().map(|e| {
        let at = e.instance_path().to_string();
        if at.is_empty() {
            e.masked().to_string()
        } else {
            format!("at {at}: {}", e.masked())
        }
    })
}
