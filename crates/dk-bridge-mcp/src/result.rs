//! A tool's answer as the device's result.
//!
//! `isError` is the call's error, its text that of the answer's text
//! content. Otherwise the result is an object: `content`, the answer's
//! content blocks as MCP gives them (text, resource links, embedded
//! resources); the first PNG or JPEG picture as `image` and the first WAV
//! or Ogg sound as `audio` (dk-proto's [`ImageContent`] and
//! [`AudioContent`], which dk's MCP server hands an agent as MCP image and
//! audio content), their place in `content` holding `{"type", "mimeType",
//! "member"}`; and `structuredContent`, checked first against the tool's
//! output schema when it has one. A result larger than a device result may
//! be is refused with its size, never cut.

use dk_device::HandlerError;
use dk_proto::media::{AudioContent, AudioMime, ImageContent, ImageMime};
use serde_json::{Map, Value};

use crate::schema::mismatch;

/// Largest result the device sends (its JSON): a frame's 1 MiB less room
/// for the frame around it.
pub const MAX_RESULT_BYTES: usize = dk_proto::MAX_FRAME_BYTES - 8 * 1024;

/// Longest error text sent; a longer one says how much is not shown.
pub const MAX_ERROR_CHARS: usize = 4000;

/// The device's answer to a call whose tool answered `answer` (a
/// `CallToolResult` as JSON), checking `structuredContent` against
/// `output` when given.
pub fn to_result(
    answer: Value,
    output: Option<&jsonschema::Validator>,
) -> Result<Value, HandlerError> {
    let Value::Object(mut answer) = answer else {
        return Err(HandlerError::new("the server's answer is not an object"));
    };
    let content = match answer.remove("content") {
        Some(Value::Array(blocks)) => blocks,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(HandlerError::new("the server's answer has no content list")),
    };
    if answer.get("isError") == Some(&Value::Bool(true)) {
        return Err(HandlerError::new(error_text(&content)));
    }
    let mut result = Map::new();
    let mut blocks = Vec::with_capacity(content.len());
    for block in content {
        blocks.push(place_media(block, &mut result));
    }
    result.insert("content".to_owned(), Value::Array(blocks));
    if let Some(structured) = answer.remove("structuredContent") {
        if let Some(output) = output
            && let Some(why) = mismatch(output, &structured)
        {
            return Err(HandlerError::new(format!(
                "the server's structured answer does not match the output schema the person agreed to ({why}): refused"
            )));
        }
        result.insert("structuredContent".to_owned(), structured);
    } else if output.is_some() {
        return Err(HandlerError::new(
            "the tool declares an output schema but the server's answer has no structured content: refused",
        ));
    }
    let result = Value::Object(result);
    let size = serde_json::to_string(&result).map_or(usize::MAX, |text| text.len());
    if size > MAX_RESULT_BYTES {
        return Err(HandlerError::new(format!(
            "the server's answer is {} KiB, more than the {} KiB a device result may carry: refused whole, nothing was cut",
            size.div_ceil(1024),
            MAX_RESULT_BYTES / 1024
        )));
    }
    Ok(result)
}

/// `block` as it stays in `content`: a picture or a sound of a format dk
/// carries, the first of its kind, moves to `result` and leaves its
/// description.
fn place_media(block: Value, result: &mut Map<String, Value>) -> Value {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let mime = block.get("mimeType").and_then(Value::as_str).unwrap_or("");
    let data = block.get("data").and_then(Value::as_str);
    let (member, media) = match (kind, data) {
        ("image", Some(data)) if !result.contains_key("image") => {
            let format = match mime {
                "image/png" => Some(ImageMime::Png),
                "image/jpeg" => Some(ImageMime::Jpeg),
                _ => None,
            };
            (
                "image",
                format
                    .and_then(|f| serde_json::to_value(ImageContent::new(f, data.to_owned())).ok()),
            )
        }
        ("audio", Some(data)) if !result.contains_key("audio") => {
            let format = match mime {
                "audio/wav" | "audio/x-wav" | "audio/wave" => Some(AudioMime::Wav),
                "audio/ogg" => Some(AudioMime::Ogg),
                _ => None,
            };
            (
                "audio",
                format
                    .and_then(|f| serde_json::to_value(AudioContent::new(f, data.to_owned())).ok()),
            )
        }
        _ => return block,
    };
    match media {
        Some(media) => {
            result.insert(member.to_owned(), media);
            let mut described = Map::new();
            described.insert("type".to_owned(), Value::from(kind));
            described.insert("mimeType".to_owned(), Value::from(mime));
            described.insert("member".to_owned(), Value::from(member));
            Value::Object(described)
        }
        None => block,
    }
}

/// The text of an error answer: its text blocks joined, at most
/// [`MAX_ERROR_CHARS`] characters and then how many more there were.
fn error_text(content: &[Value]) -> String {
    let text: Vec<&str> = content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    let text = text.join("\n");
    if text.trim().is_empty() {
        return "the server said the tool failed, without saying why".to_owned();
    }
    let total = text.chars().count();
    if total <= MAX_ERROR_CHARS {
        return format!("the server: {text}");
    }
    let shown: String = text.chars().take(MAX_ERROR_CHARS).collect();
    format!(
        "the server: {shown} ({} more characters not shown)",
        total - MAX_ERROR_CHARS
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::compile;

    #[test]
    fn content_media_and_structured_content_come_through() {
        let answer = json!({
            "content": [
                {"type": "text", "text": "here"},
                {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
                {"type": "image", "mimeType": "image/gif", "data": "R0lG"},
                {"type": "resource_link", "uri": "file:///a", "name": "a"},
            ],
            "structuredContent": {"n": 1},
        });
        let schema = compile(&json!({"type": "object", "required": ["n"]})).unwrap();
        let result = to_result(answer, Some(&schema)).unwrap();
        assert_eq!(
            result["image"],
            json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="})
        );
        assert_eq!(
            result["content"][1],
            json!({"type": "image", "mimeType": "image/png", "member": "image"})
        );
        assert_eq!(result["content"][2]["mimeType"], "image/gif");
        assert_eq!(result["content"][3]["type"], "resource_link");
        assert_eq!(result["structuredContent"], json!({"n": 1}));
    }

    #[test]
    fn errors_mismatches_and_oversized_answers_are_refused() {
        let failed = to_result(
            json!({"isError": true, "content": [{"type": "text", "text": "no such file"}]}),
            None,
        )
        .unwrap_err();
        assert_eq!(failed.message(), "the server: no such file");
        let schema = compile(&json!({"type": "object", "required": ["n"]})).unwrap();
        let wrong = to_result(
            json!({"content": [], "structuredContent": {"m": 1}}),
            Some(&schema),
        )
        .unwrap_err();
        assert!(wrong.message().contains("does not match"), "{wrong}");
        let missing = to_result(json!({"content": []}), Some(&schema)).unwrap_err();
        assert!(
            missing.message().contains("no structured content"),
            "{missing}"
        );
        let big = "x".repeat(MAX_RESULT_BYTES);
        let refused =
            to_result(json!({"content": [{"type": "text", "text": big}]}), None).unwrap_err();
        assert!(
            refused.message().contains("refused whole, nothing was cut"),
            "{refused}"
        );
        let long = "y".repeat(MAX_ERROR_CHARS + 10);
        let said = to_result(
            json!({"isError": true, "content": [{"type": "text", "text": long}]}),
            None,
        )
        .unwrap_err();
        assert!(said.message().ends_with("(10 more characters not shown)"));
    }
}
