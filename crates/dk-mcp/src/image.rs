//! Image results: a device result object whose `image` member is exactly
//! dk-proto's [`ImageContent`] (read with [`Media::read`]: `{"type":
//! "image", "mimeType": M, "data": D}`, no member more or less), with M a
//! format dk-proto names, D standard base64 (with padding) that decodes, and the decoded
//! bytes starting with that format's signature, reaches the agent as MCP
//! image content. The rest of the result stays JSON, with the image's
//! `data` replaced by `"bytes": <decoded length>`, so that the text a model
//! reads (and `read_more` pages) never holds the picture as base64.
//! Anything else that merely looks like an image (data that does not
//! decode, bytes of another format, a MIME type not named there, the image
//! one level deeper, a member more or less) stays ordinary JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use dk_proto::media::{AudioContent, ImageContent, Media};
use serde::Serialize;
use serde_json::{Map, Value};

/// The member of a device result that may carry an image.
pub(crate) const IMAGE_MEMBER: &str = "image";

/// A device result that carries an image: the image as the device sent it,
/// and the rest of the result with the image's data replaced by its length.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ImageResult {
    /// The image's standard base64, as the device sent it.
    pub(crate) data: String,
    /// One of the MIME types dk-proto's [`ImageMime`](dk_proto::media::ImageMime) names.
    pub(crate) mime_type: String,
    /// The result, its `image` member now `{"type": "image", "mimeType":
    /// M, "bytes": N}` with N the decoded length.
    pub(crate) described: Map<String, Value>,
}

/// What stays of a picture or a sound in the JSON an agent reads:
/// `{"type": "image" | "audio", "mimeType": M, "bytes": N}`, N the decoded
/// length, in place of the media value.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Described {
    /// `image` or `audio`, as the media's own `type`.
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// Its MIME type.
    pub(crate) mime_type: &'static str,
    /// How many bytes its data decodes to.
    pub(crate) bytes: usize,
}

impl Described {
    /// `image` described, its data `bytes` long once decoded.
    pub(crate) fn image(image: &ImageContent, bytes: usize) -> Described {
        Described {
            kind: "image",
            mime_type: image.mime_type.as_str(),
            bytes,
        }
    }

    /// `audio` described, its data `bytes` long once decoded.
    pub(crate) fn audio(audio: &AudioContent, bytes: usize) -> Described {
        Described {
            kind: "audio",
            mime_type: audio.mime_type.as_str(),
            bytes,
        }
    }

    /// As the JSON value that takes the media's place.
    pub(crate) fn to_value(self) -> Value {
        // Strings and a number: nothing here fails to serialize.
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The picture `value` holds and its decoded length, when it is exactly
/// dk-proto's [`ImageContent`] with data in standard base64 that decodes to
/// an image of the format it names; `None` otherwise.
fn checked(value: &Value) -> Option<(ImageContent, usize)> {
    let Some(Media::Image(image)) = Media::read(value) else {
        return None;
    };
    let bytes = STANDARD.decode(&image.data).ok()?;
    image
        .mime_type
        .starts(&bytes)
        .then_some((image, bytes.len()))
}

/// Takes the image out of `result` when its `image` member is one (see the
/// module's documentation); gives `result` back untouched when it is not.
pub(crate) fn split_image(
    mut result: Map<String, Value>,
) -> Result<ImageResult, Map<String, Value>> {
    let Some(member) = result.get_mut(IMAGE_MEMBER) else {
        return Err(result);
    };
    let Some((image, bytes)) = checked(member) else {
        return Err(result);
    };
    // Rewritten in place, so the member keeps its place in the result.
    *member = Described::image(&image, bytes).to_value();
    Ok(ImageResult {
        mime_type: image.mime_type.as_str().to_owned(),
        data: image.data,
        described: result,
    })
}
