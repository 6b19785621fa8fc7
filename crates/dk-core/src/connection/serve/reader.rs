//! A connection's reading side as the handshake and the session loop share
//! it: the [`Reader`] with its outgoing side ([`Out`]) and its session, how
//! it ends, the closes it sends, and its charge to the frame rate.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use dk_policy::{AdmissionError, DeviceClass};
use dk_proto::{Channel, CloseCode, CloseFrame, CloseWhy, FrameLimits, VesselFrame};
use futures::Stream;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::connection::frames::Frames;
use crate::store::entry::{AdmissionOutcome, StreamAdmission};
use crate::stream::StreamSession;
use crate::vessel::{ConnectionPermit, Vessel};

/// A WebSocket message, whatever library carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireMessage {
    /// A text message: every dk frame is one.
    Text(String),
    /// A binary message: a stream chunk from an admitted streaming device;
    /// from any other device, a malformed frame.
    Binary(Vec<u8>),
    /// A ping.
    Ping(Vec<u8>),
    /// A pong.
    Pong(Vec<u8>),
    /// A close, with its code and reason when given.
    Close(Option<CloseFrame>),
}

/// What happened on a connection, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionOutcome {
    /// The device, once it paired or authenticated.
    pub device_id: Option<String>,
    /// The close the vessel sent, if it closed the connection.
    pub closed_with: Option<CloseFrame>,
    /// Malformed frames seen.
    pub malformed: u32,
}

/// The one way the vessel makes a close: the reason is cut to fit.
pub(crate) fn close(code: CloseCode, reason: impl Into<String>) -> CloseFrame {
    CloseFrame::new(code, reason)
}

/// A pairing ended by a frame out of order (4001).
pub(super) fn not_paired(why: &str) -> CloseFrame {
    close(
        CloseCode::PairingRefused,
        CloseWhy::PairingDidNotHappen(why.to_owned()).to_string(),
    )
}

pub(crate) fn going_away() -> CloseFrame {
    CloseFrame::canonical(CloseCode::GoingAway)
}

/// How the reading side of a connection ends.
#[derive(Debug)]
pub(super) enum Ending {
    /// The device left (it closed, or the connection dropped): nothing to send.
    Left,
    /// The vessel closes the connection with this frame.
    Close(CloseFrame),
}

/// The outgoing side, as the reader sees it: frames to send, and one close.
pub(super) struct Out {
    pub(super) frames: Frames,
    pub(super) close: Option<oneshot::Sender<CloseFrame>>,
}

impl Out {
    pub(super) fn frame(&self, frame: &VesselFrame<'_>) {
        // A full queue means the device is not reading; the ping deadline
        // will end the connection.
        let _ = self.frames.send(frame.to_json());
    }

    pub(super) fn text(&self, text: String) {
        let _ = self.frames.send(text);
    }

    pub(super) fn error(&self, message: &str) {
        self.frame(&VesselFrame::Error {
            error: Cow::Borrowed(message),
        });
    }

    pub(super) fn close(&mut self, frame: CloseFrame) -> CloseFrame {
        if let Some(tx) = self.close.take() {
            let _ = tx.send(frame.clone());
        }
        frame
    }
}

pub(super) struct Reader<'v, S> {
    pub(super) vessel: &'v Arc<Vessel>,
    pub(super) permit: ConnectionPermit,
    pub(super) incoming: S,
    pub(super) out: Out,
    pub(super) outcome: ConnectionOutcome,
    pub(super) malformed: u32,
    pub(super) tokens: f64,
    pub(super) refilled: Instant,
    /// What the dk/2 handshake established; `None` on v1.
    pub(super) secured: Option<Secured>,
}

/// What a dk/2 handshake established: the device's static key and the
/// handshake hash its pairing code is computed from.
#[derive(Clone, Copy)]
pub(crate) struct Secured {
    pub(crate) remote: [u8; 32],
    pub(crate) handshake_hash: [u8; 32],
}

/// The device a connection speaks for, once paired or authenticated.
pub(super) struct Session {
    pub(super) device_id: String,
    pub(super) generation: u64,
    /// How it got here: the person's consent to pair is the approval its
    /// admission needs; a reconnect must be approved afresh.
    pub(super) paired_now: bool,
    /// The admitted streaming session, for a streaming device.
    pub(super) stream: Option<StreamSession>,
}

impl<S> Reader<'_, S>
where
    S: Stream<Item = WireMessage> + Unpin,
{
    /// The channel the connection speaks.
    pub(super) fn channel(&self) -> Channel {
        if self.secured.is_some() {
            Channel::Dk2
        } else {
            Channel::V1
        }
    }

    pub(super) fn frame_limits(&self) -> FrameLimits {
        FrameLimits {
            max_bytes: self.vessel.limits().max_frame_bytes,
            max_depth: self.vessel.limits().max_depth,
        }
    }

    /// Charges a message the device sent unasked to the frame rate (a token
    /// bucket: `max_frames_per_second`, bursts of twice that); the close to
    /// send when the device is over it.
    ///
    /// Everything a device sends is charged except what answers the vessel:
    /// a result that settles a pending call (bounded by the calls in flight)
    /// and a pong. Events, results for calls that are not pending, pings,
    /// stream chunks, malformed frames and anything sent while the person
    /// is asked are charged.
    pub(super) fn charge(&mut self) -> Result<(), CloseFrame> {
        let rate = f64::from(self.vessel.limits().max_frames_per_second);
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate).min(rate * 2.0);
        if self.tokens < 1.0 {
            return Err(self.over_rate());
        }
        self.tokens -= 1.0;
        Ok(())
    }

    /// [`Reader::charge`], for the session loop: over the rate, the
    /// connection closes.
    pub(super) fn charged(&mut self) -> ControlFlow<Ending> {
        match self.charge() {
            Ok(()) => ControlFlow::Continue(()),
            Err(close) => ControlFlow::Break(Ending::Close(close)),
        }
    }

    /// A message that arrived while the vessel waits (for the person):
    /// set aside, but charged to the rate.
    pub(super) fn set_aside(&mut self, message: Option<WireMessage>) -> Result<(), Ending> {
        match message {
            None | Some(WireMessage::Close(_)) => Err(Ending::Left),
            Some(WireMessage::Pong(_)) => Ok(()),
            Some(_) => self.charge().map_err(Ending::Close),
        }
    }

    /// A malformed frame: answered with an error frame; past the limit, the
    /// connection closes.
    pub(super) fn malformed(&mut self, why: &str) -> ControlFlow<Ending> {
        self.malformed += 1;
        self.vessel
            .stats()
            .malformed_frames
            .fetch_add(1, Ordering::Relaxed);
        self.out.error(why);
        if self.malformed > self.vessel.limits().max_malformed_frames {
            return ControlFlow::Break(Ending::Close(CloseFrame::canonical(CloseCode::Malformed)));
        }
        ControlFlow::Continue(())
    }

    /// A refused admission: counted, audited, and the close to send.
    pub(super) fn refuse(
        &self,
        device_id: &str,
        class: DeviceClass,
        stage: &str,
        error: &AdmissionError,
    ) -> CloseFrame {
        self.vessel
            .stream_stats()
            .refused
            .fetch_add(1, Ordering::Relaxed);
        let code = error.code();
        self.vessel.record(StreamAdmission {
            device_id: device_id.to_owned(),
            kind: class.as_str().to_owned(),
            stage: stage.to_owned(),
            admitted: false,
            outcome: AdmissionOutcome::Refused {
                code: code.as_str().to_owned(),
                message: error.to_string(),
            },
        });
        CloseFrame::admission_refused(code, &error.to_string())
    }

    pub(super) fn over_rate(&self) -> CloseFrame {
        close(
            CloseCode::Rate,
            CloseWhy::OverRate(self.vessel.limits().max_frames_per_second).to_string(),
        )
    }
}
