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

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// A 2x1 PNG: a red pixel, then a blue one.
    pub(crate) const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x02\0\0\0\x01\x08\x02\0\0\0\x7b\x40\xe8\xdd\0\0\0\x0dIDAT\x78\xda\x63\xf8\xcf\x00\x04\xff\x01\x07\x00\x01\xff\x3d\x7d\x8c\x49\0\0\0\0IEND\xae\x42\x60\x82";

    /// A JPEG's first bytes (start of image, then an APP0 marker).
    const JPEG: &[u8] = b"\xff\xd8\xff\xe0\0\x10JFIF\0";

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    /// `result` is an image result: its data, type and what remains.
    #[track_caller]
    fn image(result: Value, mime_type: &str, data: &str, described: Value) {
        let split = split_image(object(result)).unwrap();
        assert_eq!(split.mime_type, mime_type);
        assert_eq!(split.data, data);
        assert_eq!(Value::Object(split.described), described);
    }

    /// `result` stays ordinary JSON, untouched.
    #[track_caller]
    fn not_image(result: Value) {
        assert_eq!(split_image(object(result.clone())), Err(object(result)));
    }

    #[test]
    fn a_png_or_jpeg_member_is_an_image_and_the_rest_says_its_length() {
        let png = STANDARD.encode(PNG);
        image(
            json!({"width": 2, "height": 1, "image": {"type": "image", "mimeType": "image/png", "data": png}, "blacked_out": 0}),
            "image/png",
            &png,
            json!({"width": 2, "height": 1, "image": {"type": "image", "mimeType": "image/png", "bytes": PNG.len()}, "blacked_out": 0}),
        );
        let jpeg = STANDARD.encode(JPEG);
        image(
            json!({"image": {"data": jpeg, "mimeType": "image/jpeg", "type": "image"}}),
            "image/jpeg",
            &jpeg,
            json!({"image": {"type": "image", "mimeType": "image/jpeg", "bytes": JPEG.len()}}),
        );
    }

    #[test]
    fn the_image_keeps_its_place_among_the_members() {
        let png = STANDARD.encode(PNG);
        let split = split_image(object(json!({"z": 1, "image": {"type": "image", "mimeType": "image/png", "data": png}, "a": 2}))).unwrap();
        let keys: Vec<&str> = split.described.keys().map(String::as_str).collect();
        assert_eq!(keys, ["z", "image", "a"]);
        assert_eq!(
            Value::Object(split.described).to_string(),
            format!(
                r#"{{"z":1,"image":{{"type":"image","mimeType":"image/png","bytes":{}}},"a":2}}"#,
                PNG.len()
            )
        );
    }

    #[test]
    fn what_merely_looks_like_an_image_stays_json() {
        let png = STANDARD.encode(PNG);
        let jpeg = STANDARD.encode(JPEG);
        let unpadded = png.trim_end_matches('=');
        assert_ne!(unpadded, png, "the fixture's base64 ends in padding");
        for result in [
            // No image member, or not an object.
            json!({"width": 1}),
            json!({"image": png}),
            json!({"image": null}),
            // Bad base64: unpadded, URL-safe alphabet, white space, not base64.
            json!({"image": {"type": "image", "mimeType": "image/png", "data": unpadded}}),
            json!({"image": {"type": "image", "mimeType": "image/png", "data": png.replace('+', "-").replace('/', "_") + "-_"}}),
            json!({"image": {"type": "image", "mimeType": "image/png", "data": format!("{}\n{}", &png[..8], &png[8..])}}),
            json!({"image": {"type": "image", "mimeType": "image/png", "data": "not base64!"}}),
            json!({"image": {"type": "image", "mimeType": "image/png", "data": ""}}),
            // Wrong signature for the type, or no format's.
            json!({"image": {"type": "image", "mimeType": "image/png", "data": jpeg}}),
            json!({"image": {"type": "image", "mimeType": "image/jpeg", "data": png}}),
            json!({"image": {"type": "image", "mimeType": "image/png", "data": STANDARD.encode(b"GIF89a")}}),
            // An unknown or differently spelt type.
            json!({"image": {"type": "image", "mimeType": "image/gif", "data": png}}),
            json!({"image": {"type": "image", "mimeType": "IMAGE/PNG", "data": png}}),
            json!({"image": {"type": "image", "mimeType": "image/svg+xml", "data": png}}),
            json!({"image": {"type": "audio", "mimeType": "image/png", "data": png}}),
            json!({"image": {"mimeType": "image/png", "data": png}}),
            json!({"image": {"type": "image", "data": png}}),
            json!({"image": {"type": "image", "mimeType": "image/png"}}),
            json!({"image": {"type": "image", "mimeType": "image/png", "data": 12}}),
            // A member more.
            json!({"image": {"type": "image", "mimeType": "image/png", "data": png, "bytes": 3}}),
            // Nested one level deeper, or under another name.
            json!({"screen": {"image": {"type": "image", "mimeType": "image/png", "data": png}}}),
            json!({"picture": {"type": "image", "mimeType": "image/png", "data": png}}),
            json!({"result": [{"type": "image", "mimeType": "image/png", "data": png}]}),
        ] {
            not_image(result);
        }
    }
}
