//! The connection's logic, shared by the plain (v1) and the secure (dk/2)
//! channel: the frame reader, its session and the writer.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dk_policy::{AdmissionError, DeviceClass};
use dk_proto::{
    AskReason, Channel, CloseCode, CloseFrame, CloseWhy, DeviceFrame, FrameError, FrameLimits,
    LinkClosed, Malformed, PairingLimit, StreamChunk, StreamingFrame, VesselFrame,
};
use futures::future::BoxFuture;
use futures::{Sink, SinkExt, Stream, StreamExt};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};
use tokio::time::Instant;

use super::frames::{Frames, Queued, frames};
use crate::link::{CallCorrelator, DeviceEvent, DeviceLink, Handled};
use crate::registry::{AuthError, PairError, PairedDevice, RegistryEvent};
use crate::store::entry::{AdmissionOutcome, StreamAdmission};
use crate::stream::{ChunkOutcome, StreamSession, message_limit, streaming_class};
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
pub(super) fn close(code: CloseCode, reason: impl Into<String>) -> CloseFrame {
    CloseFrame::new(code, reason)
}

/// A pairing ended by a frame out of order (4001).
fn not_paired(why: &str) -> CloseFrame {
    close(
        CloseCode::PairingRefused,
        CloseWhy::PairingDidNotHappen(why.to_owned()).to_string(),
    )
}

pub(super) fn going_away() -> CloseFrame {
    CloseFrame::canonical(CloseCode::GoingAway)
}

/// How the reading side of a connection ends.
#[derive(Debug)]
enum Ending {
    /// The device left (it closed, or the connection dropped): nothing to send.
    Left,
    /// The vessel closes the connection with this frame.
    Close(CloseFrame),
}

/// The outgoing side, as the reader sees it: frames to send, and one close.
struct Out {
    frames: Frames,
    close: Option<oneshot::Sender<CloseFrame>>,
}

impl Out {
    fn frame(&self, frame: &VesselFrame<'_>) {
        // A full queue means the device is not reading; the ping deadline
        // will end the connection.
        let _ = self.frames.send(frame.to_json());
    }

    fn text(&self, text: String) {
        let _ = self.frames.send(text);
    }

    fn error(&self, message: &str) {
        self.frame(&VesselFrame::Error {
            error: Cow::Borrowed(message),
        });
    }

    fn close(&mut self, frame: CloseFrame) -> CloseFrame {
        if let Some(tx) = self.close.take() {
            let _ = tx.send(frame.clone());
        }
        frame
    }
}

/// Serves one device connection until it ends. `permit` comes from
/// [`Vessel::admit`]. Returns what happened.
pub async fn serve_connection<S, K>(
    vessel: &Arc<Vessel>,
    permit: ConnectionPermit,
    incoming: S,
    outgoing: K,
) -> ConnectionOutcome
where
    S: Stream<Item = WireMessage> + Unpin,
    K: Sink<WireMessage> + Unpin,
{
    serve_on(vessel, permit, incoming, outgoing, None).await
}

/// [`serve_connection`], with the frames inside a dk/2 channel when
/// `secured` says what its handshake established.
pub(super) async fn serve_on<S, K>(
    vessel: &Arc<Vessel>,
    permit: ConnectionPermit,
    incoming: S,
    outgoing: K,
    secured: Option<Secured>,
) -> ConnectionOutcome
where
    S: Stream<Item = WireMessage> + Unpin,
    K: Sink<WireMessage> + Unpin,
{
    let limits = vessel.limits();
    let (frames_tx, frames_rx) = frames(limits.max_pending_calls + 16);
    let (close_tx, close_rx) = oneshot::channel();
    let out = Out {
        frames: frames_tx,
        close: Some(close_tx),
    };
    let reader = Reader {
        vessel,
        permit,
        incoming,
        out,
        outcome: ConnectionOutcome::default(),
        malformed: 0,
        tokens: f64::from(limits.max_frames_per_second) * 2.0,
        refilled: Instant::now(),
        secured,
    };
    let writer = write_loop(outgoing, frames_rx, close_rx, limits.ping_interval);
    let (outcome, ()) = tokio::join!(reader.run(), writer);
    outcome
}

/// Sends queued frames, pings, and finally the close.
async fn write_loop<K>(
    mut sink: K,
    frames: Queued,
    mut close_rx: oneshot::Receiver<CloseFrame>,
    ping_interval: Duration,
) where
    K: Sink<WireMessage> + Unpin,
{
    let mut ping = tokio::time::interval_at(Instant::now() + ping_interval, ping_interval);
    loop {
        tokio::select! {
            biased;
            text = frames.next() => {
                if sink.send(WireMessage::Text(text)).await.is_err() {
                    return;
                }
            }
            closing = &mut close_rx => {
                // Frames queued before the close go first.
                while let Some(text) = frames.try_next() {
                    if sink.send(WireMessage::Text(text)).await.is_err() {
                        return;
                    }
                }
                if let Ok(frame) = closing {
                    let _ = sink.send(WireMessage::Close(Some(frame))).await;
                }
                let _ = sink.close().await;
                return;
            }
            _ = ping.tick() => {
                if sink.send(WireMessage::Ping(Vec::new())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The next change of the registry, and the receiver to wait for the one
/// after with.
fn next_change(
    mut receiver: broadcast::Receiver<RegistryEvent>,
) -> BoxFuture<
    'static,
    (
        Result<RegistryEvent, broadcast::error::RecvError>,
        broadcast::Receiver<RegistryEvent>,
    ),
> {
    Box::pin(async move {
        let change = receiver.recv().await;
        (change, receiver)
    })
}

struct Reader<'v, S> {
    vessel: &'v Arc<Vessel>,
    permit: ConnectionPermit,
    incoming: S,
    out: Out,
    outcome: ConnectionOutcome,
    malformed: u32,
    tokens: f64,
    refilled: Instant,
    /// What the dk/2 handshake established; `None` on v1.
    secured: Option<Secured>,
}

/// What a dk/2 handshake established: the device's static key and the
/// handshake hash its pairing code is computed from.
#[derive(Clone, Copy)]
pub(super) struct Secured {
    pub(super) remote: [u8; 32],
    pub(super) handshake_hash: [u8; 32],
}

/// The device a connection speaks for, once paired or authenticated.
struct Session {
    device_id: String,
    generation: u64,
    /// How it got here: the person's consent to pair is the approval its
    /// admission needs; a reconnect must be approved afresh.
    paired_now: bool,
    /// The admitted streaming session, for a streaming device.
    stream: Option<StreamSession>,
}

impl<S> Reader<'_, S>
where
    S: Stream<Item = WireMessage> + Unpin,
{
    async fn run(mut self) -> ConnectionOutcome {
        // The handshake and the admission run once per connection, while the
        // session loop runs for as long as the device stays: boxed, their
        // state (a pairing's is the largest) is freed once they finish
        // instead of sizing every idle connection's task.
        let mut session = match Box::pin(self.handshake()).await {
            Ok(session) => session,
            Err(ending) => return self.end(ending),
        };
        self.outcome.device_id = Some(session.device_id.clone());
        self.permit.authenticated();
        if let Err(ending) = Box::pin(self.admit_streaming(&mut session)).await {
            return self.end(ending);
        }
        let ending = self.session(&session).await;
        self.end(ending)
    }

    /// Sends the close, if the vessel closes, and finishes.
    fn end(mut self, ending: Ending) -> ConnectionOutcome {
        if let Ending::Close(frame) = ending {
            self.outcome.closed_with = Some(self.out.close(frame));
        }
        self.finish()
    }

    fn finish(mut self) -> ConnectionOutcome {
        // Dropping the close sender without a frame ends the writer too.
        self.out.close.take();
        self.outcome.malformed = self.malformed;
        self.outcome
    }

    /// The channel the connection speaks.
    fn channel(&self) -> Channel {
        if self.secured.is_some() {
            Channel::Dk2
        } else {
            Channel::V1
        }
    }

    fn frame_limits(&self) -> FrameLimits {
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
    fn charge(&mut self) -> Result<(), CloseFrame> {
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
    fn charged(&mut self) -> ControlFlow<Ending> {
        match self.charge() {
            Ok(()) => ControlFlow::Continue(()),
            Err(close) => ControlFlow::Break(Ending::Close(close)),
        }
    }

    /// A message that arrived while the vessel waits (for the person):
    /// set aside, but charged to the rate.
    fn set_aside(&mut self, message: Option<WireMessage>) -> Result<(), Ending> {
        match message {
            None | Some(WireMessage::Close(_)) => Err(Ending::Left),
            Some(WireMessage::Pong(_)) => Ok(()),
            Some(_) => self.charge().map_err(Ending::Close),
        }
    }

    /// A malformed frame: answered with an error frame; past the limit, the
    /// connection closes.
    fn malformed(&mut self, why: &str) -> ControlFlow<Ending> {
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

    /// Waits for the first frame and pairs or authenticates.
    async fn handshake(&mut self) -> Result<Session, Ending> {
        // Counted from the connect, so the upgrade is inside the deadline.
        let deadline = self.permit.connected_at() + self.vessel.limits().handshake_timeout;
        let text = loop {
            let message = tokio::select! {
                message = tokio::time::timeout_at(deadline, self.incoming.next()) => message,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
            };
            match message {
                Err(_) => {
                    return Err(Ending::Close(CloseFrame::canonical(
                        CloseCode::HandshakeTimeout,
                    )));
                }
                Ok(None | Some(WireMessage::Close(_))) => return Err(Ending::Left),
                Ok(Some(WireMessage::Pong(_))) => {}
                Ok(Some(WireMessage::Ping(_))) => self.charge().map_err(Ending::Close)?,
                Ok(Some(WireMessage::Binary(_))) => {
                    return Err(Ending::Close(close(
                        CloseCode::BadHandshake,
                        "frames are JSON text",
                    )));
                }
                Ok(Some(WireMessage::Text(text))) => break text,
            }
        };
        let frame =
            match DeviceFrame::parse_on(text.as_bytes(), self.frame_limits(), self.channel()) {
                Ok(frame) => frame,
                Err(FrameError::TooLarge { max, .. }) => {
                    return Err(Ending::Close(close(
                        CloseCode::TooLarge,
                        CloseWhy::FrameTooLarge(max).to_string(),
                    )));
                }
                Err(e) => {
                    self.out.error(&e.to_string());
                    return Err(Ending::Close(close(
                        CloseCode::BadHandshake,
                        "expected device:hello or device:auth",
                    )));
                }
            };
        match frame {
            DeviceFrame::Hello { manifest } => {
                let manifest: Value = serde_json::from_str(manifest.get()).unwrap_or(Value::Null);
                let address = self.permit.address();
                let limit = |limit: PairingLimit| Ending::Close(limit.into());
                self.vessel.note_pairing_attempt(address).map_err(limit)?;
                // An invalid manifest never reaches the person, so it takes no place.
                let _waiting = match dk_proto::validate_manifest(&manifest) {
                    Ok(valid) => {
                        // Off loopback a relay could claim to have no
                        // screen and so skip the comparison.
                        if valid.no_screen()
                            && self.permit.is_off_loopback()
                            && !self.vessel.limits().no_screen_off_loopback
                        {
                            return Err(Ending::Close(close(
                                CloseCode::PairingRefused,
                                "no-screen pairing is off on this listener",
                            )));
                        }
                        // A streaming kind the vessel would refuse never
                        // reaches the person.
                        if let Some(class) = streaming_class(valid.kind()) {
                            let budget = self.vessel.session_budget();
                            if let Err(error) =
                                self.vessel
                                    .streams()
                                    .precheck(valid.id(), class, budget.as_ref())
                            {
                                return Err(Ending::Close(self.refuse(
                                    valid.id(),
                                    class,
                                    "pair",
                                    &error,
                                )));
                            }
                        }
                        Some(
                            self.vessel
                                .begin_pairing(valid.id(), address)
                                .map_err(limit)?,
                        )
                    }
                    Err(_) => None,
                };
                match self.secured {
                    Some(secured) => self.pair_secured(&manifest, secured).await,
                    None => self.pair(&manifest).await,
                }
            }
            DeviceFrame::KeyAuth {
                device_id,
                manifest,
            } => {
                let Some(secured) = self.secured else {
                    return Err(Ending::Close(CloseFrame::canonical(CloseCode::AuthFailed)));
                };
                let manifest: Value = serde_json::from_str(manifest.get()).unwrap_or(Value::Null);
                self.vessel.registry().recall(&device_id).await;
                match self.vessel.registry().authenticate_key(
                    &device_id,
                    &secured.remote,
                    &manifest,
                ) {
                    Ok(device) => Ok(Session {
                        device_id: device.device_id().to_owned(),
                        generation: device.generation(),
                        paired_now: false,
                        stream: None,
                    }),
                    Err(AuthError::ManifestChanged) => Err(Ending::Close(CloseFrame::canonical(
                        CloseCode::ManifestChanged,
                    ))),
                    Err(_) => Err(Ending::Close(CloseFrame::canonical(CloseCode::AuthFailed))),
                }
            }
            DeviceFrame::PairNonce { .. } => Err(Ending::Close(not_paired(
                "device:pair-nonce before device:hello",
            ))),
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => {
                let manifest: Option<Value> =
                    manifest.map(|m| serde_json::from_str(m.get()).unwrap_or(Value::Null));
                self.vessel.registry().recall(&device_id).await;
                match self
                    .vessel
                    .registry()
                    .authenticate(&device_id, &token, manifest.as_ref())
                {
                    Ok(device) => Ok(Session {
                        device_id: device.device_id().to_owned(),
                        generation: device.generation(),
                        paired_now: false,
                        stream: None,
                    }),
                    Err(AuthError::ManifestChanged) => Err(Ending::Close(CloseFrame::canonical(
                        CloseCode::ManifestChanged,
                    ))),
                    Err(_) => Err(Ending::Close(CloseFrame::canonical(CloseCode::AuthFailed))),
                }
            }
            _ => Err(Ending::Close(CloseFrame::canonical(
                CloseCode::BadHandshake,
            ))),
        }
    }

    /// Pairs: the code goes to the device, the question to the person. The
    /// device leaving withdraws the question.
    async fn pair(&mut self, manifest: &Value) -> Result<Session, Ending> {
        let person = Arc::clone(self.vessel.person());
        let consent_timeout = self.vessel.limits().consent_timeout;
        let frames = self.out.frames.clone();
        let pairing = self.vessel.registry().pair(
            manifest,
            |code| {
                let frame = VesselFrame::Pairing {
                    code: Cow::Borrowed(code),
                };
                let _ = frames.send(frame.to_json());
            },
            |request| async move {
                Ok::<_, std::convert::Infallible>(
                    person.ask_consent(request, consent_timeout).await,
                )
            },
            consent_timeout,
        );
        tokio::pin!(pairing);
        let result = loop {
            tokio::select! {
                result = &mut pairing => break result,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
                // Anything else while the person decides is set aside.
                message = self.incoming.next() => self.set_aside(message)?,
            }
        };
        match result {
            Ok(paired) => {
                self.out.frame(&VesselFrame::Paired {
                    device_token: Cow::Borrowed(paired.token.expose()),
                });
                Ok(Session {
                    device_id: paired.device_id,
                    generation: paired.generation,
                    paired_now: true,
                    stream: None,
                })
            }
            Err(e) => Err(Ending::Close(close(
                CloseCode::PairingRefused,
                e.to_string(),
            ))),
        }
    }

    /// Pairs over dk/2: the vessel commits to its nonce, takes the device's,
    /// reveals its own, and only then asks the person, showing the code
    /// both sides compute from the channel; nothing sends the code. A yes
    /// pins the channel's key to the device id. Each side's pairing frame
    /// comes once and in order: anything else ends the pairing (4001).
    async fn pair_secured(
        &mut self,
        manifest: &Value,
        secured: Secured,
    ) -> Result<Session, Ending> {
        let valid = match dk_proto::validate_manifest(manifest) {
            Ok(valid) => valid,
            Err(e) => {
                return Err(Ending::Close(close(
                    CloseCode::PairingRefused,
                    PairError::InvalidManifest(e).to_string(),
                )));
            }
        };
        let Ok(nv) = dk_channel::random_nonce() else {
            return Err(Ending::Close(CloseFrame::canonical(
                CloseCode::SecureChannel,
            )));
        };
        let commitment = dk_channel::commitment(&nv, &secured.handshake_hash);
        self.out.frame(&VesselFrame::PairCommit {
            commitment: Cow::Owned(dk_channel::to_hex32(&commitment)),
        });
        let nd = self.pairing_nonce().await?;
        self.out.frame(&VesselFrame::PairReveal {
            nonce: Cow::Owned(dk_channel::to_hex32(&nv)),
        });
        let code = dk_channel::pairing_code(&secured.handshake_hash, &nd, &nv);
        let person = Arc::clone(self.vessel.person());
        let consent_timeout = self.vessel.limits().consent_timeout;
        let pairing = self.vessel.registry().pair_with_key(
            valid,
            code,
            secured.remote,
            |request| async move {
                Ok::<_, std::convert::Infallible>(
                    person.ask_consent(request, consent_timeout).await,
                )
            },
            consent_timeout,
        );
        tokio::pin!(pairing);
        let result = loop {
            tokio::select! {
                result = &mut pairing => break result,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
                // Anything else while the person decides is set aside, but
                // a second nonce ends the pairing.
                message = self.incoming.next() => {
                    if let Some(WireMessage::Text(text)) = &message
                        && let Ok(DeviceFrame::PairNonce { .. }) = DeviceFrame::parse_on(
                            text.as_bytes(),
                            self.frame_limits(),
                            Channel::Dk2,
                        )
                    {
                        return Err(Ending::Close(not_paired("a second device:pair-nonce")));
                    }
                    self.set_aside(message)?;
                }
            }
        };
        match result {
            Ok(paired) => {
                self.out.frame(&VesselFrame::KeyPaired);
                Ok(Session {
                    device_id: paired.device_id,
                    generation: paired.generation,
                    paired_now: true,
                    stream: None,
                })
            }
            Err(e) => Err(Ending::Close(close(
                CloseCode::PairingRefused,
                e.to_string(),
            ))),
        }
    }

    /// Waits for the device's `device:pair-nonce`, the one frame it may
    /// send after the commitment, within the handshake deadline.
    async fn pairing_nonce(&mut self) -> Result<[u8; 32], Ending> {
        let deadline = Instant::now() + self.vessel.limits().handshake_timeout;
        loop {
            let message = tokio::select! {
                message = tokio::time::timeout_at(deadline, self.incoming.next()) => message,
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
            };
            let text = match message {
                Err(_) => return Err(Ending::Close(not_paired("no device:pair-nonce in time"))),
                Ok(None | Some(WireMessage::Close(_))) => return Err(Ending::Left),
                Ok(Some(WireMessage::Pong(_))) => continue,
                Ok(Some(WireMessage::Ping(_))) => {
                    self.charge().map_err(Ending::Close)?;
                    continue;
                }
                Ok(Some(WireMessage::Binary(_))) => {
                    return Err(Ending::Close(not_paired("expected device:pair-nonce")));
                }
                Ok(Some(WireMessage::Text(text))) => text,
            };
            return match DeviceFrame::parse_on(text.as_bytes(), self.frame_limits(), Channel::Dk2) {
                Ok(DeviceFrame::PairNonce { nonce }) => dk_channel::from_hex32(&nonce)
                    .ok_or_else(|| Ending::Close(not_paired("expected device:pair-nonce"))),
                _ => Err(Ending::Close(not_paired("expected device:pair-nonce"))),
            };
        }
    }

    /// Serves an authenticated device until it leaves or must be closed.
    async fn session(&mut self, session: &Session) -> Ending {
        // The two limits the loop needs, not a copy of them all: what is held
        // across the loop's awaits is kept by every idle connection.
        let (max_pending_calls, ping_interval) = {
            let limits = self.vessel.limits();
            (limits.max_pending_calls, limits.ping_interval)
        };
        let correlator = Arc::new(CallCorrelator::with_max_pending(
            self.out.frames.clone(),
            max_pending_calls,
        ));
        let link: Arc<dyn DeviceLink> = correlator.clone();
        // The registry's changes, waited for by one future that lives until a
        // change comes: a `recv()` made afresh for every message would join
        // and leave the registry's channel, shared by every connection,
        // under its lock, each time.
        let mut changes = next_change(self.vessel.registry().subscribe());
        // A newer connection replaces the older one; a streaming device's
        // sessions (as many as its policy admits) all stay open, and calls go
        // to the newest.
        if let Some(old) = self
            .vessel
            .links()
            .connect(&session.device_id, Arc::clone(&link))
            && session.stream.is_none()
        {
            old.close(LinkClosed::Replaced);
        }
        let silence = ping_interval * 2;
        let mut last_seen = Instant::now();
        // The futures that do not change per message are made once: the loop
        // runs for every frame and should not rebuild timers or subscriptions.
        let vessel = Arc::clone(self.vessel);
        let replaced = correlator.closed();
        let shutdown = vessel.shutting_down();
        let deadline = tokio::time::sleep_until(last_seen + silence);
        tokio::pin!(replaced, shutdown, deadline);
        let ended = loop {
            tokio::select! {
                message = self.incoming.next() => {
                    last_seen = Instant::now();
                    if let ControlFlow::Break(ending) = self.on_message(message, session, &correlator) {
                        break ending;
                    }
                }
                why = &mut replaced => break Ending::Close(close(CloseCode::Replaced, why.to_string())),
                (change, receiver) = &mut changes => {
                    changes = next_change(receiver);
                    if let Some(frame) = self.on_change(change, session) {
                        break Ending::Close(frame);
                    }
                }
                () = &mut shutdown => break Ending::Close(going_away()),
                () = &mut deadline => {
                    // Re-armed lazily: a message since the last arming moves it on.
                    if last_seen + silence > Instant::now() {
                        deadline.as_mut().reset(last_seen + silence);
                    } else {
                        break Ending::Close(CloseFrame::canonical(CloseCode::Dead));
                    }
                }
            }
        };
        correlator.close(LinkClosed::Disconnected);
        self.vessel.links().disconnect(&session.device_id, &link);
        // Nothing its microphone hears reaches the vessel any more.
        if !self.vessel.links().is_connected(&session.device_id) {
            self.vessel.microphones().forget(&session.device_id);
        }
        ended
    }

    /// One message in a session: carry on, or the connection ends.
    fn on_message(
        &mut self,
        message: Option<WireMessage>,
        session: &Session,
        correlator: &CallCorrelator,
    ) -> ControlFlow<Ending> {
        let text = match message {
            None | Some(WireMessage::Close(_)) => return ControlFlow::Break(Ending::Left),
            // The answer to the vessel's ping.
            Some(WireMessage::Pong(_)) => return ControlFlow::Continue(()),
            Some(WireMessage::Ping(_)) => return self.charged(),
            Some(WireMessage::Binary(message)) => {
                self.charged()?;
                return self.on_chunk(message, session);
            }
            Some(WireMessage::Text(text)) => text,
        };
        let frame =
            match DeviceFrame::parse_on(text.as_bytes(), self.frame_limits(), self.channel()) {
                Ok(frame) => frame,
                Err(FrameError::TooLarge { max, .. }) => {
                    return ControlFlow::Break(Ending::Close(close(
                        CloseCode::TooLarge,
                        CloseWhy::FrameTooLarge(max).to_string(),
                    )));
                }
                Err(e) => {
                    self.charged()?;
                    return self.malformed(&e.to_string());
                }
            };
        // A result to a pending call answers the vessel: it is bounded by the
        // calls in flight, not by the rate. Anything else was sent unasked.
        let handled = correlator.handle(&frame);
        if handled != Handled::Settled {
            self.charged()?;
        }
        match handled {
            Handled::Settled => ControlFlow::Continue(()),
            Handled::UnknownCall => {
                self.vessel
                    .stats()
                    .unknown_results
                    .fetch_add(1, Ordering::Relaxed);
                ControlFlow::Continue(())
            }
            Handled::NotAResult => match frame {
                DeviceFrame::Event { capability, data } => {
                    let device = self.vessel.registry().get(&session.device_id);
                    let manifest = device.as_ref().map(|d| d.manifest());
                    let event = manifest.and_then(|m| m.event(&capability));
                    let declared = event.is_some()
                        || manifest.is_some_and(|m| m.capability(&capability).is_some());
                    if !declared {
                        return self.malformed(
                            &Malformed::UndeclaredEvent(capability.into_owned()).to_string(),
                        );
                    }
                    // A declared event's data keeps its params, as a call's
                    // input does; an event that does not is dropped.
                    if let Some(event) = event {
                        let data: serde_json::Value = data
                            .as_deref()
                            .and_then(|d| serde_json::from_str(d.get()).ok())
                            .unwrap_or(serde_json::Value::Null);
                        if let Err(why) = dk_proto::check_event(event, &data) {
                            return self.malformed(
                                &Malformed::EventData {
                                    event: capability.into_owned(),
                                    why: why.to_string(),
                                }
                                .to_string(),
                            );
                        }
                    }
                    self.vessel.publish_event(DeviceEvent {
                        device_id: session.device_id.clone(),
                        capability: capability.into_owned(),
                        data: data.map(|d| d.into_owned()),
                    });
                    ControlFlow::Continue(())
                }
                _ => self.malformed("already paired and authenticated"),
            },
        }
    }

    /// A binary message: a stream chunk when the session was admitted as a
    /// streaming session, else malformed (as for any v1 device). Over twice
    /// the cap closes 1009; a chunk that does not parse, or names a stream
    /// that is not one of the device's sensors, is malformed; over the cap
    /// it is dropped and reported to the device; otherwise it goes to the
    /// subscribers (when its capability is granted).
    fn on_chunk(&mut self, message: Vec<u8>, session: &Session) -> ControlFlow<Ending> {
        let Some(stream) = &session.stream else {
            return self.malformed("frames are JSON text");
        };
        let limit = message_limit(stream.policy().max_chunk_bytes());
        if message.len() > limit {
            return ControlFlow::Break(Ending::Close(close(
                CloseCode::TooLarge,
                CloseWhy::StreamMessageTooLarge(limit).to_string(),
            )));
        }
        let (name, seq) = match StreamChunk::parse(&message) {
            Ok(chunk) => (chunk.stream.to_owned(), chunk.seq),
            Err(e) => return self.malformed(&e.to_string()),
        };
        let (sensor, granted) = match self
            .vessel
            .registry()
            .get_with_grant(&session.device_id, &name)
        {
            Some((device, granted)) => (
                device
                    .manifest()
                    .capability(&name)
                    .is_some_and(|c| c.kind() == dk_proto::CapabilityKind::Sensor),
                granted,
            ),
            None => (false, false),
        };
        if !sensor {
            return self.malformed(&Malformed::NotASensorStream(name).to_string());
        }
        match self.vessel.take_chunk(stream, message, &name, seq, granted) {
            ChunkOutcome::Forwarded | ChunkOutcome::NotGranted => {}
            ChunkOutcome::Dropped(report) => self.out.text(report.to_json()),
        }
        ControlFlow::Continue(())
    }

    /// Admits a streaming device's session (nothing to do for other kinds),
    /// asking the person first on a reconnect when the policy requires
    /// approval.
    async fn admit_streaming(&mut self, session: &mut Session) -> Result<(), Ending> {
        let Some(device) = self.vessel.registry().get(&session.device_id) else {
            // Unpaired meanwhile: the session loop sees it at once.
            return Ok(());
        };
        let Some(class) = streaming_class(device.manifest().kind()) else {
            return Ok(());
        };
        let id = session.device_id.clone();
        let stage = if session.paired_now { "pair" } else { "resume" };
        let budget = self.vessel.session_budget();
        let streams = self.vessel.streams();
        if let Err(error) = streams.precheck(&id, class, budget.as_ref()) {
            return Err(Ending::Close(self.refuse(&id, class, stage, &error)));
        }
        let approved = session.paired_now
            || !streams.requires_approval(class)
            || self.ask_person(&device, class).await?;
        match self
            .vessel
            .streams()
            .admit(&id, class, approved, budget.as_ref())
        {
            Ok(admitted) => {
                let policy = admitted.policy();
                self.out.text(
                    StreamingFrame {
                        kind: class.as_str().to_owned(),
                        max_chunk_bytes: policy.max_chunk_bytes(),
                        max_concurrent_sessions: policy.max_concurrent_sessions(),
                    }
                    .to_json(),
                );
                self.vessel
                    .stream_stats()
                    .admitted
                    .fetch_add(1, Ordering::Relaxed);
                self.vessel.record(StreamAdmission {
                    device_id: id.clone(),
                    kind: class.as_str().to_owned(),
                    stage: stage.to_owned(),
                    admitted: true,
                    outcome: AdmissionOutcome::Admitted {
                        max_chunk_bytes: policy.max_chunk_bytes(),
                        max_tool_calls: admitted
                            .admitted()
                            .run_limits()
                            .get(dk_policy::RunLimit::MaxToolCalls),
                    },
                });
                session.stream = Some(admitted);
                Ok(())
            }
            Err(error) => Err(Ending::Close(self.refuse(&id, class, stage, &error))),
        }
    }

    /// Asks the person to admit a streaming device's reconnect; a no, no
    /// answer in time or an error is a no. The device leaving withdraws it.
    async fn ask_person(
        &mut self,
        device: &PairedDevice,
        class: DeviceClass,
    ) -> Result<bool, Ending> {
        let manifest = device.manifest();
        let request = crate::adapter::ApprovalRequest {
            tool: AskReason::stream_tool(class.as_str()),
            device_id: manifest.id().to_owned(),
            capability: String::new(),
            input: serde_json::Map::new(),
            reason: AskReason::StreamReconnect {
                class: class.as_str(),
                device_name: manifest.name(),
            }
            .to_string(),
            agent_id: None,
            session_id: None,
            channel: device.channel(),
            microphone: None,
        };
        let person = Arc::clone(self.vessel.person());
        let asking = person.ask_approval(request, self.vessel.limits().consent_timeout);
        tokio::pin!(asking);
        loop {
            tokio::select! {
                approved = &mut asking => return Ok(approved),
                () = self.vessel.shutting_down() => return Err(Ending::Close(going_away())),
                // Anything else while the person decides is set aside.
                message = self.incoming.next() => self.set_aside(message)?,
            }
        }
    }

    /// A refused admission: counted, audited, and the close to send.
    fn refuse(
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

    fn over_rate(&self) -> CloseFrame {
        close(
            CloseCode::Rate,
            CloseWhy::OverRate(self.vessel.limits().max_frames_per_second).to_string(),
        )
    }

    /// A registry change: tell the device of revocations, close on unpairing
    /// or a new pairing of the same id.
    fn on_change(
        &mut self,
        change: Result<RegistryEvent, broadcast::error::RecvError>,
        session: &Session,
    ) -> Option<CloseFrame> {
        let ours = |id: &str| id == session.device_id;
        match change {
            Ok(RegistryEvent::Revoked {
                device_id,
                capability,
            }) if ours(&device_id) => {
                self.out.frame(&VesselFrame::Revoked {
                    capability: Some(Cow::Owned(capability)),
                });
                None
            }
            Ok(RegistryEvent::Unpaired { device_id }) if ours(&device_id) => {
                self.out.frame(&VesselFrame::Revoked { capability: None });
                Some(close(CloseCode::Unpaired, "unpaired by the person"))
            }
            Ok(RegistryEvent::Paired { device_id }) if ours(&device_id) => {
                self.still_current(session)
            }
            Ok(_) | Err(broadcast::error::RecvError::Closed) => None,
            // Missed changes: read the state instead.
            Err(broadcast::error::RecvError::Lagged(_)) => self.still_current(session),
        }
    }

    fn still_current(&mut self, session: &Session) -> Option<CloseFrame> {
        match self.vessel.registry().get(&session.device_id) {
            Some(device) if device.generation() == session.generation => None,
            Some(_) => Some(close(CloseCode::Replaced, "paired again")),
            None => {
                self.out.frame(&VesselFrame::Revoked { capability: None });
                Some(close(CloseCode::Unpaired, "unpaired by the person"))
            }
        }
    }
}
