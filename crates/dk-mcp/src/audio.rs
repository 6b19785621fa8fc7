//! Audio results: a member of a device result object that is, by its type,
//! dk-proto's [`AudioContent`](dk_proto::media::AudioContent) (read with
//! [`Media::read`]: `{"type": "audio", "mimeType": M, "data": D}`, no
//! member more or less), with D standard base64 that decodes to bytes
//! starting as M's format does, reaches the agent as MCP audio content,
//! whatever the member's name. The rest of the result stays JSON, that
//! member's `data` replaced by `"bytes": <decoded length>`, so the text a
//! model reads (and `read_more` pages) never holds the sound as base64.
//! Anything else that merely looks like audio stays ordinary JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use dk_proto::media::Media;

use crate::image::Described;
use serde_json::{Map, Value};

/// One sound taken out of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Audio {
    /// Its standard base64, as the device sent it.
    pub(crate) data: String,
    /// Its MIME type.
    pub(crate) mime_type: &'static str,
}

/// Takes every audio member out of `result` (in the members' order), each
/// member rewritten in place to `{"type": "audio", "mimeType": M, "bytes":
/// N}`; none when no member is audio.
pub(crate) fn split_audio(result: &mut Map<String, Value>) -> Vec<Audio> {
    let mut taken = Vec::new();
    for member in result.values_mut() {
        let Some(Media::Audio(audio)) = Media::read(member) else {
            continue;
        };
        let Ok(bytes) = STANDARD.decode(&audio.data) else {
            continue;
        };
        if !audio.mime_type.starts(&bytes) {
            continue;
        }
        let mime_type = audio.mime_type.as_str();
        *member = Described::audio(&audio, bytes.len()).to_value();
        taken.push(Audio {
            data: audio.data,
            mime_type,
        });
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use dk_proto::media::{AudioContent, AudioMime};
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    const WAV: &[u8] = b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0";

    #[test]
    fn audio_is_taken_by_its_type_whatever_its_name() {
        let data = STANDARD.encode(WAV);
        let audio = serde_json::to_value(AudioContent::new(AudioMime::Wav, data.clone()))
            .unwrap_or(Value::Null);
        let mut result = object(json!({"duration_ms": 5, "recording": audio, "ended": "silence"}));
        let taken = split_audio(&mut result);
        assert_eq!(
            taken,
            [Audio {
                data,
                mime_type: "audio/wav"
            }]
        );
        assert_eq!(
            Value::Object(result),
            json!({"duration_ms": 5, "recording": {"type": "audio", "mimeType": "audio/wav", "bytes": WAV.len()}, "ended": "silence"})
        );
    }

    #[test]
    fn what_merely_looks_like_audio_stays_json() {
        let wav = STANDARD.encode(WAV);
        for result in [
            // Not base64, or not what the type says.
            json!({"audio": {"type": "audio", "mimeType": "audio/wav", "data": "not base64!"}}),
            json!({"audio": {"type": "audio", "mimeType": "audio/wav", "data": STANDARD.encode(b"OggS\0\0")}}),
            json!({"audio": {"type": "audio", "mimeType": "audio/ogg", "data": wav}}),
            // A type not named, a member more, one level deeper.
            json!({"audio": {"type": "audio", "mimeType": "audio/mpeg", "data": wav}}),
            json!({"audio": {"type": "audio", "mimeType": "audio/wav", "data": wav, "x": 1}}),
            json!({"deeper": {"audio": {"type": "audio", "mimeType": "audio/wav", "data": wav}}}),
            json!({"audio": "RIFF"}),
        ] {
            let mut map = object(result.clone());
            assert_eq!(split_audio(&mut map), []);
            assert_eq!(Value::Object(map), result);
        }
    }
}
