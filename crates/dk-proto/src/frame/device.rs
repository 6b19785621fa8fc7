//! Reading and writing the frames a device sends ([`DeviceFrame`]).

use alloc::borrow::Cow;
use alloc::string::String;

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::fields::{Reader, frame_type, is_object, required_hex, required_str};
use super::raw::{RawFrame, Scalar, read_raw};
use super::{
    AUTH, Channel, DeviceFrame, EVENT, FrameError, FrameLimits, HELLO, PAIR_NONCE, RESULT,
};

impl<'a> DeviceFrame<'a> {
    /// Parses an untrusted frame from a device with the default limits.
    pub fn parse(bytes: &'a [u8]) -> Result<DeviceFrame<'a>, FrameError> {
        Self::parse_with(bytes, FrameLimits::default())
    }

    /// Parses an untrusted frame from a device. Follows 8DK's rules: hello
    /// needs an object manifest; auth a non-empty string deviceId and token;
    /// result a non-empty string callId and a boolean ok (`result` kept
    /// whenever the key is present, `error` only when it is a string); event a
    /// non-empty string capability. A frame only a vessel sends is refused.
    pub fn parse_with(bytes: &'a [u8], limits: FrameLimits) -> Result<DeviceFrame<'a>, FrameError> {
        Self::parse_on(bytes, limits, Channel::V1)
    }

    /// [`DeviceFrame::parse_with`] for a connection on `channel`. On v1 it is
    /// exactly that. On dk/2 `device:auth` carries no token (one sent is
    /// ignored) and needs its `manifest` ([`DeviceFrame::KeyAuth`]), and
    /// `device:pair-nonce` is known.
    pub fn parse_on(
        bytes: &'a [u8],
        limits: FrameLimits,
        channel: Channel,
    ) -> Result<DeviceFrame<'a>, FrameError> {
        let mut raw = RawFrame::default();
        read_raw(bytes, limits, &mut raw)?;
        match frame_type(raw.kind, channel, Reader::Vessel)? {
            AUTH if channel == Channel::Dk2 => Ok(DeviceFrame::KeyAuth {
                device_id: required_str(raw.device_id, AUTH, "deviceId")?,
                manifest: Cow::Borrowed(raw.manifest.ok_or(FrameError::MissingField {
                    frame: AUTH,
                    field: "manifest",
                })?),
            }),
            PAIR_NONCE => Ok(DeviceFrame::PairNonce {
                nonce: required_hex(raw.nonce, PAIR_NONCE, "nonce")?,
            }),
            RESULT => {
                let call_id = required_str(raw.call_id, RESULT, "callId")?;
                let ok = match raw.ok {
                    Some(Scalar::Bool(ok)) => ok,
                    Some(_) => {
                        return Err(FrameError::WrongType {
                            frame: RESULT,
                            field: "ok",
                            expected: "a boolean",
                        });
                    }
                    None => {
                        return Err(FrameError::MissingField {
                            frame: RESULT,
                            field: "ok",
                        });
                    }
                };
                Ok(DeviceFrame::Result {
                    call_id,
                    ok,
                    result: raw.result.map(Cow::Borrowed),
                    error: raw.error.and_then(Scalar::into_str),
                })
            }
            HELLO => match raw.manifest {
                // `typeof x === "object"` holds for arrays too; validation refuses them.
                Some(m) if is_object(m) || m.get().starts_with('[') => Ok(DeviceFrame::Hello {
                    manifest: Cow::Borrowed(m),
                }),
                Some(_) => Err(FrameError::WrongType {
                    frame: HELLO,
                    field: "manifest",
                    expected: "an object",
                }),
                None => Err(FrameError::MissingField {
                    frame: HELLO,
                    field: "manifest",
                }),
            },
            AUTH => Ok(DeviceFrame::Auth {
                device_id: required_str(raw.device_id, AUTH, "deviceId")?,
                token: required_str(raw.token, AUTH, "token")?,
                manifest: raw.manifest.map(Cow::Borrowed),
            }),
            EVENT => Ok(DeviceFrame::Event {
                capability: required_str(raw.capability, EVENT, "capability")?,
                data: raw.data.map(Cow::Borrowed),
            }),
            other => Err(FrameError::WrongSide(other)),
        }
    }

    /// The frame's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            DeviceFrame::Hello { .. } => HELLO,
            DeviceFrame::Auth { .. } => AUTH,
            DeviceFrame::Result { .. } => RESULT,
            DeviceFrame::Event { .. } => EVENT,
            DeviceFrame::KeyAuth { .. } => AUTH,
            DeviceFrame::PairNonce { .. } => PAIR_NONCE,
        }
    }

    /// The frame as compact JSON text, as 8DK writes it.
    pub fn to_json(&self) -> String {
        // Serialising strings and raw JSON into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The same frame, owning its data.
    pub fn into_owned(self) -> DeviceFrame<'static> {
        match self {
            DeviceFrame::Hello { manifest } => DeviceFrame::Hello {
                manifest: Cow::Owned(manifest.into_owned()),
            },
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => DeviceFrame::Auth {
                device_id: Cow::Owned(device_id.into_owned()),
                token: Cow::Owned(token.into_owned()),
                manifest: manifest.map(|m| Cow::Owned(m.into_owned())),
            },
            DeviceFrame::Result {
                call_id,
                ok,
                result,
                error,
            } => DeviceFrame::Result {
                call_id: Cow::Owned(call_id.into_owned()),
                ok,
                result: result.map(|r| Cow::Owned(r.into_owned())),
                error: error.map(|e| Cow::Owned(e.into_owned())),
            },
            DeviceFrame::Event { capability, data } => DeviceFrame::Event {
                capability: Cow::Owned(capability.into_owned()),
                data: data.map(|d| Cow::Owned(d.into_owned())),
            },
            DeviceFrame::KeyAuth {
                device_id,
                manifest,
            } => DeviceFrame::KeyAuth {
                device_id: Cow::Owned(device_id.into_owned()),
                manifest: Cow::Owned(manifest.into_owned()),
            },
            DeviceFrame::PairNonce { nonce } => DeviceFrame::PairNonce {
                nonce: Cow::Owned(nonce.into_owned()),
            },
        }
    }
}

impl Serialize for DeviceFrame<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.type_name())?;
        match self {
            DeviceFrame::Hello { manifest } => map.serialize_entry("manifest", manifest)?,
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => {
                map.serialize_entry("deviceId", device_id)?;
                map.serialize_entry("token", token)?;
                if let Some(manifest) = manifest {
                    map.serialize_entry("manifest", manifest)?;
                }
            }
            DeviceFrame::Result {
                call_id,
                ok,
                result,
                error,
            } => {
                map.serialize_entry("callId", call_id)?;
                map.serialize_entry("ok", ok)?;
                if let Some(result) = result {
                    map.serialize_entry("result", result)?;
                }
                if let Some(error) = error {
                    map.serialize_entry("error", error)?;
                }
            }
            DeviceFrame::Event { capability, data } => {
                map.serialize_entry("capability", capability)?;
                if let Some(data) = data {
                    map.serialize_entry("data", data)?;
                }
            }
            DeviceFrame::KeyAuth {
                device_id,
                manifest,
            } => {
                map.serialize_entry("deviceId", device_id)?;
                map.serialize_entry("manifest", manifest)?;
            }
            DeviceFrame::PairNonce { nonce } => map.serialize_entry("nonce", nonce)?,
        }
        map.end()
    }
}
