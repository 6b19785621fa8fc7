//! A connection once paired or authenticated: each vessel frame read once
//! (a call's input left in the frame's buffer) and given to the calls'
//! rules, a streaming admission and dropped chunks noted, refusals
//! announced inside the channel kept for the close that follows; stream
//! chunks out within the vessel's cap.

use alloc::borrow::Cow;
use alloc::format;

use dk_channel::FrameKind;
use dk_proto::{FrameLimits, StreamChunk, VesselFrame, VesselRead};

use super::phase::{Link, Phase};
use super::{Break, ChunkRefusal, DeviceCore, Message, Notice, Output, printable};
use crate::calls::{Accepted, Input, SetAside, Taking, range_in};

impl DeviceCore {
    /// One frame once paired or authenticated: a call, a streaming
    /// admission, a refusal announced (dk/2), or something to log. The
    /// frame is read once; a call's input stays in the frame's buffer.
    pub(super) fn serve(&mut self, text: Cow<'_, str>) -> Result<(), Break> {
        let channel = self.config.channel;
        let read =
            VesselFrame::parse_keeping_input(text.as_bytes(), FrameLimits::default(), channel);
        let frame = match read {
            Ok(VesselRead::Invoke(invoke)) => {
                // The input is cut out of the frame's own buffer when the
                // core holds it (dk/2), copied out of a frame lent (v1).
                let kept = match (&text, range_in(&text, invoke.input.get())) {
                    (Cow::Owned(_), Some(range)) => Err(range),
                    _ => Ok(Input::copy(invoke.input.get())),
                };
                let (call_id, capability) = (
                    Cow::Owned(invoke.call_id.into_owned()),
                    Cow::Owned(invoke.capability.into_owned()),
                );
                let input = kept.unwrap_or_else(|range| Input::cut(text.into_owned(), range));
                let taking = match self.phase {
                    Phase::Serving { stop_by: None, .. } => Taking::Yes,
                    _ => Taking::No,
                };
                let accepted = self.calls.accept_call(call_id, capability, input, taking);
                self.take(accepted);
                return Ok(());
            }
            Ok(VesselRead::Frame(frame)) => frame,
            Err(error) => {
                // dk/2: a pairing frame once paired or authenticated ends
                // the connection (the order rule), malformed or not.
                if let Some(kind) = self.dk2_pairing(VesselFrame::pairing_type(&text)) {
                    return Err(Break::Pairing(format!(
                        "an unexpected {kind} frame after pairing"
                    )));
                }
                self.notice(Notice::SetAside(SetAside::Refused(error)));
                return Ok(());
            }
        };
        match frame {
            VesselFrame::Error { error } => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))));
            }
            VesselFrame::Closing { code, reason } => {
                if let Some(secure) = self.phase.secure_mut() {
                    secure.closing = Some((code, printable(&reason)));
                }
            }
            frame @ (VesselFrame::PairCommit { .. } | VesselFrame::PairReveal { .. })
                if self.dk2_pairing(Some(frame.type_name())).is_some() =>
            {
                return Err(Break::Pairing(format!(
                    "an unexpected {} frame after pairing",
                    frame.type_name()
                )));
            }
            VesselFrame::Streaming(admitted) => {
                if let Phase::Serving { stream_cap, .. } = &mut self.phase {
                    *stream_cap = admitted.max_chunk_bytes;
                }
                self.notice(Notice::StreamingAdmitted {
                    kind: printable(&admitted.kind),
                    max_chunk_bytes: admitted.max_chunk_bytes,
                });
            }
            VesselFrame::StreamDropped(dropped) => {
                self.notice(Notice::StreamChunkDropped {
                    stream: printable(&dropped.stream),
                    seq: dropped.seq,
                    bytes: dropped.bytes,
                    marker: printable(&dropped.marker),
                });
            }
            frame => {
                let accepted = self.calls.accept(VesselRead::Frame(frame));
                self.take(accepted);
            }
        }
        Ok(())
    }

    /// `kind` when this connection is dk/2's (where a pairing frame once
    /// serving breaks the pairing's order).
    fn dk2_pairing(&mut self, kind: Option<&'static str>) -> Option<&'static str> {
        match self.phase {
            Phase::Serving {
                link: Link::Dk2(_), ..
            } => kind,
            _ => None,
        }
    }

    /// Does what the calls' rules made of a frame.
    fn take(&mut self, accepted: Accepted) {
        match accepted {
            Accepted::Run(invocation) => self.outputs.push_back(Output::Invoke(invocation)),
            Accepted::Reply { frame, .. } => self.send_frame(frame),
            Accepted::SetAside(SetAside::VesselError(error)) => {
                self.notice(Notice::SetAside(SetAside::VesselError(printable(&error))));
            }
            Accepted::SetAside(aside) => self.notice(Notice::SetAside(aside)),
        }
    }

    /// Sends a stream chunk, once the vessel admitted a streaming session
    /// and within its cap.
    pub fn send_chunk(&mut self, chunk: &StreamChunk<'_>) -> Result<(), ChunkRefusal> {
        let Phase::Serving {
            link, stream_cap, ..
        } = &mut self.phase
        else {
            return Err(ChunkRefusal::NotConnected);
        };
        if *stream_cap == 0 {
            return Err(ChunkRefusal::NotAdmitted);
        }
        if chunk.payload.len() as u64 > *stream_cap {
            self.outputs
                .push_back(Output::Notice(Notice::ChunkOverCap { seq: chunk.seq }));
            return Err(ChunkRefusal::OverCap);
        }
        let Some(bytes) = chunk.encode() else {
            return Err(ChunkRefusal::Malformed);
        };
        match link {
            Link::V1 => self.outputs.push_back(Output::Send(Message::Binary(bytes))),
            Link::Dk2(secure) => secure
                .seal(FrameKind::Binary, &bytes, &mut self.outputs)
                .map_err(|()| ChunkRefusal::Malformed)?,
        }
        Ok(())
    }
}
