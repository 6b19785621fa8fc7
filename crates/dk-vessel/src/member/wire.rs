//! What members say to each other, as types: requests ([`Ask`]) and their
//! replies ([`Reply`]), events ([`Said`]). Each message is JSON with a
//! version (`"v"`) and the message (`"m"`), named by its kind:
//! `{"v":1,"m":{"invoke":{...}}}` (a kind with nothing more is its name
//! alone, `"m":"prompts"`). A member reading a kind or version it does not
//! know (a newer member, during a rolling upgrade) says so by name instead
//! of dropping it. Unknown fields are read past, so a newer member may add
//! optional ones within the same version. Nothing is read twice: a
//! device's result is carried as the JSON text it came in.

use dk_core::by::By;
use dk_proto::InvokeError;
use dk_proto::admin::{self as api, AllowanceScope};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

/// The version of the messages this member speaks.
pub(crate) const VERSION: u32 = 1;

/// A message with its version.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope<T> {
    v: u32,
    m: T,
}

/// The version and kind of a message that was not understood.
#[derive(Debug, Deserialize)]
struct Head {
    #[serde(default)]
    v: u32,
    #[serde(default)]
    m: Value,
}

/// A message that was not understood, by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a fleet message of kind `{kind}`, version {version}, not understood (this member speaks version {VERSION})"
)]
pub(crate) struct NotUnderstood {
    /// The kind it says it is.
    pub(crate) kind: String,
    /// The version it says it is.
    pub(crate) version: u32,
}

/// `body` as a message of this version.
pub(crate) fn encode<T: Serialize>(body: &T) -> Vec<u8> {
    serde_json::to_vec(&Envelope {
        v: VERSION,
        m: body,
    })
    .unwrap_or_default()
}

/// The message `bytes` hold, or which one could not be read.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, NotUnderstood> {
    match serde_json::from_slice::<Envelope<T>>(bytes) {
        Ok(envelope) if envelope.v == VERSION => Ok(envelope.m),
        _ => {
            let head = serde_json::from_slice::<Head>(bytes).unwrap_or(Head {
                v: 0,
                m: Value::Null,
            });
            let kind = match &head.m {
                Value::String(kind) => kind.as_str(),
                Value::Object(map) => map.keys().next().map_or("", String::as_str),
                _ => "",
            };
            Err(NotUnderstood {
                kind: kind.chars().take(64).collect(),
                version: head.v,
            })
        }
    }
}

/// A yes the person remembered, carried to the member that raised the
/// prompt (which makes the allowance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Remembered {
    pub(crate) scope: AllowanceScope,
    pub(crate) minutes: u32,
}

/// A request from one member to another.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Ask {
    /// Carry a call, already decided by the sender, to a device held here.
    #[serde(rename_all = "camelCase")]
    Invoke {
        device: String,
        capability: String,
        input: Map<String, Value>,
        timeout_ms: u64,
    },
    /// The person's answer to a pairing prompt raised here, with the digest
    /// of what the person was shown ([`digest`]).
    #[serde(rename_all = "camelCase")]
    Consent {
        id: u64,
        digest: String,
        answer: api::ConsentAnswer,
        by: Option<By>,
    },
    /// The person's answer to an approval prompt raised here, with the
    /// digest of what the person was shown.
    #[serde(rename_all = "camelCase")]
    Approval {
        id: u64,
        digest: String,
        approved: bool,
        remember: Option<Remembered>,
        by: Option<By>,
    },
    /// The prompts raised here and open now (asked by a member that
    /// joined, or saw this one again).
    Prompts,
}

/// The reply to an [`Ask`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Reply {
    /// The device's answer to a carried call.
    Invoked { result: Option<Box<RawValue>> },
    /// The carried call failed, as a local call would have.
    Failed { error: InvokeError },
    /// The answer was taken (and made this allowance, for a yes remembered).
    Taken { allowance: Option<api::Allowance> },
    /// The answer was not taken, and why.
    NotTaken { why: String },
    /// The prompts open here.
    Prompts { prompts: Vec<api::Pending> },
    /// The request was not understood.
    #[serde(rename_all = "camelCase")]
    NotUnderstood { kind: String, version: u32 },
}

/// An event for every other member.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Said {
    /// Read this device's pairing and grants again.
    Changed { device: String },
    /// Read the agents again.
    Agents,
    /// The person remembered a yes here: keep a copy.
    #[serde(rename_all = "camelCase")]
    Allowance {
        allowance: api::Allowance,
        generation: u64,
        read_only: bool,
    },
    /// The person revoked the allowance `id` that `member` made.
    Revoked { member: String, id: u64 },
    /// A prompt raised here, as `GET /v1/pending` lists it.
    Asked { prompt: api::Pending },
    /// A prompt raised here left the queue.
    Closed { id: u64 },
}

/// The digest of a prompt as the person is shown it: SHA-256 over its
/// JSON, in hex. The member that raised the prompt and the one that showed
/// it compute it each from their own copy; an answer whose digest differs
/// is not taken.
pub(crate) fn digest(prompt: &api::Prompt) -> String {
    let bytes = serde_json::to_vec(prompt).unwrap_or_default();
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    dk_channel::to_hex32(&digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_with_their_version() {
        let bytes = encode(&Ask::Prompts);
        assert_eq!(bytes, br#"{"v":1,"m":"prompts"}"#);
        assert!(matches!(decode::<Ask>(&bytes), Ok(Ask::Prompts)));
        // A device's result crosses as the text it was.
        let result = RawValue::from_string(r#"{"on": true}"#.to_owned()).unwrap();
        let bytes = encode(&Reply::Invoked {
            result: Some(result),
        });
        assert_eq!(bytes, br#"{"v":1,"m":{"invoked":{"result":{"on": true}}}}"#);
        match decode::<Reply>(&bytes) {
            Ok(Reply::Invoked { result: Some(r) }) => assert_eq!(r.get(), r#"{"on": true}"#),
            other => panic!("{other:?}"),
        }
        let bytes = encode(&Reply::Failed {
            error: InvokeError::Timeout(std::time::Duration::from_millis(5000)),
        });
        match decode::<Reply>(&bytes) {
            Ok(Reply::Failed { error }) => {
                assert_eq!(error.to_string(), "device did not answer within 5000ms");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_kind_or_version_is_named() {
        assert_eq!(
            decode::<Ask>(br#"{"v":1,"m":{"reboot":{"now":true}}}"#).unwrap_err(),
            NotUnderstood {
                kind: "reboot".into(),
                version: 1
            }
        );
        assert_eq!(
            decode::<Ask>(br#"{"v":2,"m":"prompts"}"#).unwrap_err(),
            NotUnderstood {
                kind: "prompts".into(),
                version: 2
            }
        );
        assert_eq!(decode::<Ask>(b"not json").unwrap_err().version, 0);
        // A field a newer member adds within the version is read past.
        assert!(matches!(
            decode::<Said>(br#"{"v":1,"m":{"changed":{"device":"lamp","why":"renamed"}}}"#),
            Ok(Said::Changed { device }) if device == "lamp"
        ));
    }
}
