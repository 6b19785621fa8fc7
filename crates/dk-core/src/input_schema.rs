//! Check 4's second half for a capability that declares an `inputSchema`
//! (the dk manifest extension): after dk-proto's object, depth and text
//! checks, the input is validated against the schema with a JSON Schema
//! validator, before the person is asked. Draft 2020-12 unless the
//! schema's `$schema` names another draft; offline, so a `$ref` outside
//! the schema is refused, never fetched; `pattern` run by the linear-time
//! regex engine with a size limit. A schema that does not compile refuses
//! every call, saying why. Compiled schemas are kept by the SHA-256 of
//! their JSON, at most [`CACHED`] of them.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use dk_proto::InputError;
use jsonschema::{PatternOptions, Validator};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Compiled schemas kept; past it the cache starts over.
pub(crate) const CACHED: usize = 512;

/// Most bytes a compiled `pattern` may take.
const REGEX_BYTES: usize = 1 << 20;

/// A schema, compiled or not.
type Compiled = Arc<Result<Validator, String>>;

static SCHEMAS: LazyLock<Mutex<HashMap<[u8; 32], Compiled>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether `input` matches `schema`; the first mismatch, where and why,
/// without the value.
pub(crate) fn check(schema: &Value, input: &Value) -> Result<(), InputError> {
    let compiled = compiled(schema);
    let validator = match compiled.as_ref() {
        Ok(validator) => validator,
        Err(why) => {
            return Err(InputError::SchemaMismatch(format!(
                "the schema cannot be checked ({why})"
            )));
        }
    };
    match validator.iter_errors(input).next() {
        None => Ok(()),
        Some(error) => {
            let at = error.instance_path().to_string();
            let what = error.masked().to_string();
            Err(InputError::SchemaMismatch(if at.is_empty() {
                what
            } else {
                format!("at {at}: {what}")
            }))
        }
    }
}

/// `schema` compiled, from the cache when it was before.
fn compiled(schema: &Value) -> Compiled {
    let key: [u8; 32] = Sha256::digest(schema.to_string().as_bytes()).into();
    if let Some(found) = SCHEMAS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Arc::clone(found);
    }
    let compiled = Arc::new(
        jsonschema::options()
            .offline()
            .with_pattern_options(PatternOptions::regex().size_limit(REGEX_BYTES))
            .build(schema)
            .map_err(|e| e.masked().to_string()),
    );
    let mut cache = SCHEMAS.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= CACHED {
        cache.clear();
    }
    cache.insert(key, Arc::clone(&compiled));
    compiled
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check;

    #[test]
    fn input_is_checked_against_its_schema_without_quoting_it() {
        let schema = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "pattern": "^/srv/"},
                "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
            },
            "required": ["path"],
            "additionalProperties": false,
        });
        assert_eq!(check(&schema, &json!({"path": "/srv/a"})), Ok(()));
        let refused = |input| check(&schema, &input).unwrap_err().to_string();
        assert!(
            refused(json!({})).contains("\"path\" is a required property"),
            "{}",
            refused(json!({}))
        );
        let secret = refused(json!({"path": "/etc/shadow-secret"}));
        assert!(
            secret.starts_with("input does not match the capability's inputSchema: at /path:"),
            "{secret}"
        );
        assert!(!secret.contains("shadow-secret"), "{secret}");
        // 2020-12's prefixItems applies when no $schema is named.
        let pair = refused(json!({"path": "/srv/a", "pair": ["x", "y"]}));
        assert!(pair.contains("/pair/0"), "{pair}");
        let more = refused(json!({"path": "/srv/a", "more": 1}));
        assert!(more.contains("Additional properties"), "{more}");
        let remote = json!({"$ref": "https://example.invalid/s.json"});
        let cannot = check(&remote, &json!({})).unwrap_err().to_string();
        assert!(cannot.contains("the schema cannot be checked"), "{cannot}");
        let draft7 = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                            "properties": {"n": {"type": "number", "maximum": 3}}});
        assert!(check(&draft7, &json!({"n": 4})).is_err());
        assert_eq!(check(&draft7, &json!({"n": 3})), Ok(()));
    }
}
