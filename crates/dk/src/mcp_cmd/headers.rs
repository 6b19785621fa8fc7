//! The request headers of the 2026-07-28 protocol revision: `Mcp-Method`,
//! and `Mcp-Name` for the methods that name something (Base64-wrapped when
//! not plain visible ASCII).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hyper::header::{HeaderName, HeaderValue};
use serde_json::Value;

/// The first protocol revision whose requests carry `Mcp-Method` and
/// `Mcp-Name` headers (revisions are dates, so they compare as text).
const STANDARD_HEADERS_VERSION: &str = "2026-07-28";

/// Methods whose `Mcp-Name` header is `params.name`, `params.uri` or
/// `params.taskId`.
const NAMED_METHODS: [(&str, &str); 8] = [
    ("tools/call", "name"),
    ("prompts/get", "name"),
    ("resources/read", "uri"),
    ("resources/subscribe", "uri"),
    ("resources/unsubscribe", "uri"),
    ("tasks/get", "taskId"),
    ("tasks/update", "taskId"),
    ("tasks/cancel", "taskId"),
];

/// Whether `version` uses the 2026-07-28 request headers.
pub(super) fn is_modern(version: Option<&str>) -> bool {
    version.is_some_and(|v| v >= STANDARD_HEADERS_VERSION)
}

/// `Mcp-Method` and, for the methods that name something, `Mcp-Name`
/// (Base64-wrapped as `=?base64?...?=` when not plain visible ASCII).
pub(super) fn standard_headers(message: &Value) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::new();
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return headers;
    };
    if let Ok(value) = HeaderValue::from_str(method) {
        headers.push((HeaderName::from_static("mcp-method"), value));
    }
    let name = NAMED_METHODS
        .iter()
        .find(|(m, _)| *m == method)
        .and_then(|(_, key)| message.get("params")?.get(*key)?.as_str());
    if let Some(name) = name
        && let Ok(value) = HeaderValue::from_str(&header_text(name))
    {
        headers.push((HeaderName::from_static("mcp-name"), value));
    }
    headers
}

/// `text` as a header value: as it is when it is visible ASCII without
/// space at its ends, else Base64 in the `=?base64?...?=` wrapper.
fn header_text(text: &str) -> String {
    let padded = text.starts_with([' ', '\t']) || text.ends_with([' ', '\t']);
    let visible = text.chars().all(|c| (' '..='~').contains(&c));
    let wrapped = text.starts_with("=?base64?") && text.ends_with("?=");
    let plain = visible && !padded && !wrapped;
    if plain {
        text.to_owned()
    } else {
        format!("=?base64?{}?=", STANDARD.encode(text))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{header_text, standard_headers};

    #[test]
    fn header_values() {
        let cases = [
            (
                "device__desk_lamp__set_light",
                "device__desk_lamp__set_light",
            ),
            (" x", "=?base64?IHg=?="),
            ("Küche", "=?base64?S8O8Y2hl?="),
            ("f", "f"),
            ("=?base64?Zg==?=", "=?base64?PT9iYXNlNjQ/Wmc9PT89?="),
        ];
        for (text, expected) in cases {
            assert_eq!(header_text(text), expected, "{text:?}");
        }
        let headers = standard_headers(&json!({"method": "tools/call", "params": {"name": "t"}}));
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            headers,
            [
                ("mcp-method".to_owned(), "tools/call".to_owned()),
                ("mcp-name".to_owned(), "t".to_owned())
            ]
        );
        assert_eq!(standard_headers(&json!({"method": "tools/list"})).len(), 1);
    }
}
