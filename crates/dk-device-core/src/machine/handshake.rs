//! dk/2's handshake, the device's side: message 1 sent at `connect`,
//! message 2 read here with the vessel's key checked against the pin
//! before message 3 says anything about the device, then the first frame
//! inside the channel (`device:auth` by key, or `device:hello` to pair).

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use core::fmt;

use dk_channel::{FrameKind, RecordLimits};
use dk_proto::{CloseCode, CloseFrame, DeviceFrame};

use super::phase::{Link, PairStep, Phase, Secure};
use super::{DeviceCore, End, Message, Output, Received, Retry, Stop};
use crate::credentials::Credentials;

impl DeviceCore {
    /// One step of the handshake: the vessel's message 2, or the
    /// connection's end before it.
    pub(super) fn handshake(&mut self, message: Received<'_>) {
        let failed =
            |why: &dyn fmt::Display| End::Retry(Retry::Handshake(format!("dk/2 handshake: {why}")));
        let second = match message {
            Received::Binary(bytes) => bytes,
            Received::Text(_) => return self.end(failed(&"the vessel sent text")),
            Received::Close(frame) => {
                let said = frame.map_or_else(String::new, |(code, _)| format!(" ({code})"));
                return self.end(failed(&format!("the vessel closed the connection{said}")));
            }
            Received::Lost => return self.end(failed(&"the vessel hung up")),
        };
        let Phase::Handshake { initiator, .. } = core::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let mut initiator = *initiator;
        let vessel = match initiator.read_second(second) {
            Ok(vessel) => vessel,
            Err(error) => {
                // A message 2 that does not hold (a low-order key among
                // them): the device closes 4012 as the vessel would.
                self.send(Message::Close(Some(CloseFrame::canonical(
                    CloseCode::SecureChannel,
                ))));
                return self.end(failed(&error));
            }
        };
        let pinned = self.credentials.as_ref().and_then(|c| c.pinned().copied());
        if let Some(pinned) = pinned
            && !pinned.ct_eq(&vessel)
        {
            // Closed before message 3: nothing about the device was sent.
            self.send(Message::Close(None));
            return self.end(End::Stop(Stop::VesselKeyChanged {
                pinned: pinned.fingerprint(),
                presented: vessel.fingerprint(),
            }));
        }
        let (third, established) = match initiator.third_message() {
            Ok(done) => done,
            Err(error) => return self.end(failed(&error)),
        };
        self.send(Message::Binary(third));
        let handshake_hash = established.handshake_hash;
        let limit = self.config.max_frame_bytes;
        let (sealer, opener) = established.split(RecordLimits {
            max_text: limit,
            max_binary: limit,
        });
        let mut secure = Box::new(Secure {
            sealer,
            opener,
            handshake_hash,
            vessel,
            closing: None,
        });
        self.outputs.push_back(Output::Connected);
        let paired = self
            .credentials
            .as_ref()
            .is_some_and(Credentials::is_paired);
        let first = if paired {
            DeviceFrame::KeyAuth {
                device_id: Cow::Borrowed(&self.device_id),
                manifest: Cow::Borrowed(&self.manifest_json),
            }
            .to_json()
        } else {
            self.hello()
        };
        // A frame of the device's own manifest, which the vessel takes.
        let _ = secure.seal(FrameKind::Text, first.as_bytes(), &mut self.outputs);
        self.phase = if paired {
            Phase::Serving {
                link: Link::Dk2(secure),
                stream_cap: 0,
                stop_by: None,
            }
        } else {
            Phase::Pairing(PairStep::AwaitCommit(secure))
        };
    }
}
