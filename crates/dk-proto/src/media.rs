//! Media in a device's result: pictures and sound, each a typed value
//! (`{"type": "image" | "audio", "mimeType": M, "data": D}`, D standard
//! base64) that a device writes into its result object and the MCP server
//! hands the agent as MCP image or audio content. The type, not the name of
//! the member holding it, says what it is: a device writes these values
//! with [`ImageContent`] and [`AudioContent`], and the server reads them
//! back with the same types ([`Media::read`]), so both ends hold one
//! contract.
//!
//! ```
//! use dk_proto::media::{AudioContent, AudioMime, Media};
//!
//! let audio = AudioContent::new(AudioMime::Wav, "UklGRg==".to_owned());
//! let value = serde_json::to_value(&audio)?;
//! assert_eq!(value["type"], "audio");
//! assert_eq!(value["mimeType"], "audio/wav");
//! assert!(matches!(Media::read(&value), Some(Media::Audio(_))));
//! # Ok::<(), serde_json::Error>(())
//! ```

use alloc::string::String;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The picture formats a result may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageMime {
    /// `image/png`.
    #[serde(rename = "image/png")]
    Png,
    /// `image/jpeg`.
    #[serde(rename = "image/jpeg")]
    Jpeg,
}

/// The sound formats a result may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AudioMime {
    /// `audio/wav`: RIFF WAVE.
    #[serde(rename = "audio/wav")]
    Wav,
    /// `audio/ogg`: Ogg (Opus inside).
    #[serde(rename = "audio/ogg")]
    Ogg,
}

impl ImageMime {
    /// The MIME type's text.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageMime::Png => "image/png",
            ImageMime::Jpeg => "image/jpeg",
        }
    }

    /// The bytes every image of the format starts with.
    pub fn signature(self) -> &'static [u8] {
        match self {
            ImageMime::Png => b"\x89PNG\r\n\x1a\n",
            ImageMime::Jpeg => b"\xff\xd8\xff",
        }
    }

    /// Whether `bytes` start as an image of this format does.
    pub fn starts(self, bytes: &[u8]) -> bool {
        bytes.starts_with(self.signature())
    }
}

impl AudioMime {
    /// The MIME type's text.
    pub fn as_str(self) -> &'static str {
        match self {
            AudioMime::Wav => "audio/wav",
            AudioMime::Ogg => "audio/ogg",
        }
    }

    /// Whether `bytes` start as a file of this format does (`RIFF....WAVE`,
    /// or `OggS`).
    pub fn starts(self, bytes: &[u8]) -> bool {
        match self {
            AudioMime::Wav => {
                bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WAVE".as_slice())
            }
            AudioMime::Ogg => bytes.starts_with(b"OggS"),
        }
    }
}

/// The `type` of an [`ImageContent`]: always `"image"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum ImageTag {
    #[serde(rename = "image")]
    Image,
}

/// The `type` of an [`AudioContent`]: always `"audio"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum AudioTag {
    #[serde(rename = "audio")]
    Audio,
}

/// A picture in a result: `{"type": "image", "mimeType": M, "data": D}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageContent {
    #[serde(rename = "type")]
    kind: ImageTag,
    /// Its format.
    pub mime_type: ImageMime,
    /// Its bytes, in standard base64 with padding.
    pub data: String,
}

/// Sound in a result: `{"type": "audio", "mimeType": M, "data": D}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AudioContent {
    #[serde(rename = "type")]
    kind: AudioTag,
    /// Its format.
    pub mime_type: AudioMime,
    /// Its bytes, in standard base64 with padding.
    pub data: String,
}

impl ImageContent {
    /// A picture of `mime_type` whose bytes are `data` in base64.
    pub fn new(mime_type: ImageMime, data: String) -> Self {
        ImageContent {
            kind: ImageTag::Image,
            mime_type,
            data,
        }
    }
}

impl AudioContent {
    /// Sound of `mime_type` whose bytes are `data` in base64.
    pub fn new(mime_type: AudioMime, data: String) -> Self {
        AudioContent {
            kind: AudioTag::Audio,
            mime_type,
            data,
        }
    }
}

/// A media value of a result, read by its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Media {
    /// A picture.
    Image(ImageContent),
    /// Sound.
    Audio(AudioContent),
}

impl Media {
    /// `value` as media, when it is exactly an [`ImageContent`] or an
    /// [`AudioContent`] (its `type`, a format named here, no member more or
    /// less). Whether `data` decodes and holds that format is the reader's
    /// to check.
    pub fn read(value: &Value) -> Option<Media> {
        let kind = value.as_object()?.get("type")?.as_str()?;
        match kind {
            "image" => ImageContent::deserialize(value).ok().map(Media::Image),
            "audio" => AudioContent::deserialize(value).ok().map(Media::Audio),
            _ => None,
        }
    }

    /// The MIME type's text.
    pub fn mime_type(&self) -> &'static str {
        match self {
            Media::Image(image) => image.mime_type.as_str(),
            Media::Audio(audio) => audio.mime_type.as_str(),
        }
    }

    /// The base64 of its bytes.
    pub fn data(&self) -> &str {
        match self {
            Media::Image(image) => &image.data,
            Media::Audio(audio) => &audio.data,
        }
    }

    /// Whether `bytes` (the decoded data) start as its format does.
    pub fn starts(&self, bytes: &[u8]) -> bool {
        match self {
            Media::Image(image) => image.mime_type.starts(bytes),
            Media::Audio(audio) => audio.mime_type.starts(bytes),
        }
    }

    /// `"image"` or `"audio"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Media::Image(_) => "image",
            Media::Audio(_) => "audio",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn media_is_read_by_its_type() {
        let image = json!({"type": "image", "mimeType": "image/png", "data": "iVBORw=="});
        assert_eq!(
            Media::read(&image),
            Some(Media::Image(ImageContent::new(
                ImageMime::Png,
                "iVBORw==".into()
            )))
        );
        let audio = json!({"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="});
        let read = Media::read(&audio);
        assert_eq!(
            read,
            Some(Media::Audio(AudioContent::new(
                AudioMime::Wav,
                "UklGRg==".into()
            )))
        );
        assert_eq!(read.map(|m| m.mime_type()), Some("audio/wav"));
        // Written back, the same value.
        assert_eq!(
            serde_json::to_value(AudioContent::new(AudioMime::Wav, "UklGRg==".into())).ok(),
            Some(audio)
        );
        for not in [
            json!({"type": "audio", "mimeType": "audio/mp3", "data": "AA=="}),
            json!({"type": "audio", "mimeType": "audio/wav"}),
            json!({"type": "audio", "mimeType": "audio/wav", "data": "AA==", "more": 1}),
            json!({"type": "video", "mimeType": "audio/wav", "data": "AA=="}),
            json!({"type": "image", "mimeType": "audio/wav", "data": "AA=="}),
            json!({"mimeType": "audio/wav", "data": "AA=="}),
            json!("audio"),
            json!({"type": 1}),
        ] {
            assert_eq!(Media::read(&not), None, "{not}");
        }
    }

    #[test]
    fn formats_are_told_by_their_first_bytes() {
        assert!(AudioMime::Wav.starts(b"RIFF\x24\0\0\0WAVEfmt "));
        assert!(!AudioMime::Wav.starts(b"RIFF\x24\0\0\0AVI "));
        assert!(!AudioMime::Wav.starts(b"RIFF"));
        assert!(AudioMime::Ogg.starts(b"OggS\0"));
        assert!(ImageMime::Png.starts(b"\x89PNG\r\n\x1a\nrest"));
        assert!(!ImageMime::Jpeg.starts(b"\x89PNG"));
    }
}
