//! Image results: a device result object whose `image` member is exactly
//! `{"type": "image", "mimeType": M, "data": D}`, with M a format named
//! here, D standard base64 (with padding) that decodes, and the decoded
//! bytes starting with that format's signature, reaches the agent as MCP
//! image content. The rest of the result stays JSON, with the image's
//! `data` replaced by `"bytes": <decoded length>`, so that the text a model
//! reads (and `read_more` pages) never holds the picture as base64.
//! Anything else that merely looks like an image (data that does not
//! decode, bytes of another format, a MIME type not named here, the image
//! one level deeper, a member more or less) stays ordinary JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

/// The member of a device result that may carry an image.
pub(crate) const IMAGE_MEMBER: &str = "image";

/// The image formats a result may carry: MIME type and the bytes every
/// image of the format starts with.
const FORMATS: [(&str, &[u8]); 2] = [
    ("image/png", b"\x89PNG\r\n\x1a\n"),
    ("image/jpeg", b"\xff\xd8\xff"),
];

/// A device result that carries an image: the image as the device sent it,
/// and the rest of the result with the image's data replaced by its length.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ImageResult {
    /// The image's standard base64, as the device sent it.
    pub(crate) data: String,
    /// One of the MIME types of [`FORMATS`].
    pub(crate) mime_type: String,
    /// The result, its `image` member now `{"type": "image", "mimeType":
    /// M, "bytes": N}` with N the decoded length.
    pub(crate) described: Map<String, Value>,
}

/// The MIME type and decoded length of `image` when it is exactly
/// `{"type": "image", "mimeType": M, "data": D}` with D standard base64 of
/// an image of the format M names; `None` otherwise.
fn checked(image: &Map<String, Value>) -> Option<(String, usize)> {
    if image.len() != 3 || image.get("type")?.as_str()? != "image" {
        return None;
    }
    let mime_type = image.get("mimeType")?.as_str()?;
    let data = image.get("data")?.as_str()?;
    let (_, signature) = FORMATS.iter().find(|(name, _)| *name == mime_type)?;
    let bytes = STANDARD.decode(data).ok()?;
    bytes
        .starts_with(signature)
        .then(|| (mime_type.to_owned(), bytes.len()))
}

/// Takes the image out of `result` when its `image` member is one (see the
/// module's documentation); gives `result` back untouched when it is not.
pub(crate) fn split_image(
    mut result: Map<String, Value>,
) -> Result<ImageResult, Map<String, Value>> {
    let Some(Value::Object(image)) = result.get_mut(IMAGE_MEMBER) else {
        return Err(result);
    };
    let Some((mime_type, bytes)) = checked(image) else {
        return Err(result);
    };
    let Some(Value::String(data)) = image.get_mut("data") else {
        return Err(result);
    };
    let data = std::mem::take(data);
    // Rewritten in place, so the member keeps its place in the result.
    *image = Map::from_iter([
        ("type".to_owned(), Value::from("image")),
        ("mimeType".to_owned(), Value::from(mime_type.as_str())),
        ("bytes".to_owned(), Value::from(bytes)),
    ]);
    Ok(ImageResult {
        data,
        mime_type,
        described: result,
    })
}
