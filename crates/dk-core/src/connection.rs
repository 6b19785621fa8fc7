//! One device connection, from the first frame to the close: the handshake
//! (`device:hello` to pair, `device:auth` to reconnect), then calls, events
//! and revocations, with every limit enforced.
//!
//! The logic is written against a `Stream` and a `Sink` of [`WireMessage`]s,
//! so the WebSocket route and the tests (through channels) run the same code.
//!
//! A device whose manifest kind is a streaming class (`voice`,
//! `desktop-control`) is admitted under the vessel's streaming policy after
//! it paired or authenticated, on every connection (a resume is admitted
//! afresh); a refusal closes 4011 with the admission code and message. An
//! admitted session is told so (`device:streaming`) and may send stream
//! chunks as binary messages (see `stream.rs`).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dk_policy::{AdmissionError, DeviceClass};
use dk_proto::{DeviceFrame, FrameError, FrameLimits, StreamChunk, StreamingFrame, VesselFrame};
use futures::{Sink, SinkExt, Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;

use crate::link::{CallCorrelator, DeviceEvent, DeviceLink, Handled};
use crate::registry::{AuthError, PairedDevice, RegistryEvent};
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

/// Why a connection was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    /// The close code.
    pub code: u16,
    /// A short reason, for people.
    pub reason: String,
}

impl fmt::Display for CloseFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.reason)
    }
}

/// Close codes the vessel uses (documented in `docs/PROTOCOL.md`).
pub mod close_code {
    /// The device closed, or the vessel shut down.
    pub const NORMAL: u16 = 1000;
    /// A frame was larger than the limit.
    pub const TOO_LARGE: u16 = 1009;
    /// No `device:hello` or `device:auth` within the handshake deadline.
    pub const HANDSHAKE_TIMEOUT: u16 = 4000;
    /// Pairing did not happen (the person said no, or the manifest is invalid).
    pub const PAIRING_REFUSED: u16 = 4001;
    /// Wrong device id or token.
    pub const AUTH_FAILED: u16 = 4002;
    /// The device's manifest is not the one the person approved: pair again.
    pub const MANIFEST_CHANGED: u16 = 4003;
    /// The first frame was not `device:hello` or `device:auth`.
    pub const BAD_HANDSHAKE: u16 = 4004;
    /// Too many malformed frames.
    pub const MALFORMED: u16 = 4005;
    /// Frames came faster than the limit.
    pub const RATE: u16 = 4006;
    /// The person unpaired the device.
    pub const UNPAIRED: u16 = 4007;
    /// A newer connection of the same device, or a new pairing, replaced this one.
    pub const REPLACED: u16 = 4008;
    /// The device stopped answering pings.
    pub const DEAD: u16 = 4009;
    /// The vessel is shutting down.
    pub const GOING_AWAY: u16 = 1001;
    /// A pairing limit: one waiting request per device, caps per address and
    /// overall, attempts per minute per address.
    pub const PAIRING_LIMIT: u16 = 4010;
    /// A streaming device (kind `voice` or `desktop-control`) was refused
    /// admission; the reason is the admission code and message, e.g.
    /// `ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1`.
    pub const ADMISSION_REFUSED: u16 = 4011;
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

/// The longest close reason, in bytes: a close frame's payload is at most
/// 125 bytes (RFC 6455, section 5.5), two of them the code. Strict clients
/// refuse a longer one and see the connection drop (1006) instead.
const MAX_CLOSE_REASON_BYTES: usize = 123;

/// Marks a reason that was cut to fit.
const CUT_MARK: char = '…';

/// The one way the vessel makes a close: the reason is cut to fit.
fn close(code: u16, reason: impl Into<String>) -> CloseFrame {
    CloseFrame {
        code,
        reason: fit_close_reason(reason.into()),
    }
}

/// `reason` itself when it fits in a close frame; otherwise its longest
/// prefix, cut at a character boundary, that fits with [`CUT_MARK`] after it.
fn fit_close_reason(mut reason: String) -> String {
    if reason.len() <= MAX_CLOSE_REASON_BYTES {
        return reason;
    }
    let cut = reason.floor_char_boundary(MAX_CLOSE_REASON_BYTES - CUT_MARK.len_utf8());
    reason.truncate(cut);
    reason.push(CUT_MARK);
    reason
}

fn going_away() -> CloseFrame {
    close(close_code::GOING_AWAY, "vessel shutting down")
}

/// The outgoing side, as the reader sees it: frames to send, and one close.
struct Out {
    frames: mpsc::Sender<String>,
    close: Option<oneshot::Sender<CloseFrame>>,
}

impl Out {
    fn frame(&self, frame: &VesselFrame<'_>) {
        // A full queue means the device is not reading; the ping deadline
        // will end the connection.
        let _ = self.frames.try_send(frame.to_json());
    }

    fn text(&self, text: String) {
        let _ = self.frames.try_send(text);
    }

    fn error(&self, message: &str) {
        let _ = self
            .frames
            .try_send(json!({"type": "device:error", "error": message}).to_string());
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
    let limits = vessel.limits();
    let (frames_tx, frames_rx) = mpsc::channel(limits.max_pending_calls + 16);
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
    };
    let writer = write_loop(outgoing, frames_rx, close_rx, limits.ping_interval);
    let (outcome, ()) = tokio::join!(reader.run(), writer);
    outcome
}

/// Sends queued frames, pings, and finally the close.
async fn write_loop<K>(
    mut sink: K,
    mut frames: mpsc::Receiver<String>,
    mut close_rx: oneshot::Receiver<CloseFrame>,
    ping_interval: Duration,
) where
    K: Sink<WireMessage> + Unpin,
{
    let mut ping = tokio::time::interval_at(Instant::now() + ping_interval, ping_interval);
    loop {
        tokio::select! {
            biased;
            Some(text) = frames.recv() => {
                if sink.send(WireMessage::Text(text)).await.is_err() {
                    return;
                }
            }
            closing = &mut close_rx => {
                // Frames queued before the close go first.
                while let Ok(text) = frames.try_recv() {
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

struct Reader<'v, S> {
    vessel: &'v Arc<Vessel>,
    permit: ConnectionPermit,
    incoming: S,
    out: Out,
    outcome: ConnectionOutcome,
    malformed: u32,
    tokens: f64,
    refilled: Instant,
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
        let mut session = match self.handshake().await {
            Ok(session) => session,
            Err(frame) => {
                self.outcome.closed_with = frame.map(|f| self.out.close(f));
                return self.finish();
            }
        };
        self.outcome.device_id = Some(session.device_id.clone());
        self.permit.authenticated();
        if let Err(frame) = self.admit_streaming(&mut session).await {
            self.outcome.closed_with = frame.map(|f| self.out.close(f));
            return self.finish();
        }
        let ended = self.session(&session).await;
        self.outcome.closed_with = ended.map(|f| self.out.close(f));
        self.finish()
    }

    fn finish(mut self) -> ConnectionOutcome {
        // Dropping the close sender without a frame ends the writer too.
        self.out.close.take();
        self.outcome.malformed = self.malformed;
        self.outcome
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

    /// A message that arrived while the vessel waits (for the person):
    /// set aside, but charged to the rate. `Err(None)`: the device left.
    fn set_aside(&mut self, message: Option<WireMessage>) -> Result<(), Option<CloseFrame>> {
        match message {
            None | Some(WireMessage::Close(_)) => Err(None),
            Some(WireMessage::Pong(_)) => Ok(()),
            Some(_) => self.charge().map_err(Some),
        }
    }

    /// A malformed frame: answered with an error frame; past the limit, the
    /// close to send.
    fn malformed(&mut self, why: &str) -> Option<CloseFrame> {
        self.malformed += 1;
        self.vessel
            .stats()
            .malformed_frames
            .fetch_add(1, Ordering::Relaxed);
        self.out.error(why);
        (self.malformed > self.vessel.limits().max_malformed_frames)
            .then(|| close(close_code::MALFORMED, "too many malformed frames"))
    }

    /// Waits for the first frame and pairs or authenticates. `Err(None)`: the
    /// device left; `Err(Some(close))`: the vessel closes.
    async fn handshake(&mut self) -> Result<Session, Option<CloseFrame>> {
        // Counted from the connect, so the upgrade is inside the deadline.
        let deadline = self.permit.connected_at() + self.vessel.limits().handshake_timeout;
        let text = loop {
            let message = tokio::select! {
                message = tokio::time::timeout_at(deadline, self.incoming.next()) => message,
                () = self.vessel.shutting_down() => return Err(Some(going_away())),
            };
            match message {
                Err(_) => {
                    return Err(Some(close(
                        close_code::HANDSHAKE_TIMEOUT,
                        "send device:hello or device:auth first",
                    )));
                }
                Ok(None | Some(WireMessage::Close(_))) => return Err(None),
                Ok(Some(WireMessage::Pong(_))) => {}
                Ok(Some(WireMessage::Ping(_))) => self.charge().map_err(Some)?,
                Ok(Some(WireMessage::Binary(_))) => {
                    return Err(Some(close(
                        close_code::BAD_HANDSHAKE,
                        "frames are JSON text",
                    )));
                }
                Ok(Some(WireMessage::Text(text))) => break text,
            }
        };
        let frame = match DeviceFrame::parse_with(text.as_bytes(), self.frame_limits()) {
            Ok(frame) => frame,
            Err(FrameError::TooLarge { max, .. }) => {
                return Err(Some(close(
                    close_code::TOO_LARGE,
                    format!("frames are at most {max} bytes"),
                )));
            }
            Err(e) => {
                self.out.error(&e.to_string());
                return Err(Some(close(
                    close_code::BAD_HANDSHAKE,
                    "expected device:hello or device:auth",
                )));
            }
        };
        match frame {
            DeviceFrame::Hello { manifest } => {
                let manifest: Value = serde_json::from_str(manifest.get()).unwrap_or(Value::Null);
                let address = self.permit.address();
                let limit = |why: &str| Some(close(close_code::PAIRING_LIMIT, why));
                self.vessel.note_pairing_attempt(address).map_err(limit)?;
                // An invalid manifest never reaches the person, so it takes no place.
                let _waiting = match dk_proto::validate_manifest(&manifest) {
                    Ok(valid) => {
                        // A streaming kind the vessel would refuse never
                        // reaches the person.
                        if let Some(class) = streaming_class(valid.kind()) {
                            let budget = self.vessel.session_budget();
                            if let Err(error) =
                                self.vessel
                                    .streams()
                                    .precheck(valid.id(), class, budget.as_ref())
                            {
                                return Err(Some(self.refuse(valid.id(), class, "pair", &error)));
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
                self.pair(&manifest).await
            }
            DeviceFrame::Auth {
                device_id,
                token,
                manifest,
            } => {
                let manifest: Option<Value> =
                    manifest.map(|m| serde_json::from_str(m.get()).unwrap_or(Value::Null));
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
                    Err(AuthError::ManifestChanged) => Err(Some(close(
                        close_code::MANIFEST_CHANGED,
                        "manifest changed since pairing: pair again",
                    ))),
                    Err(_) => Err(Some(close(
                        close_code::AUTH_FAILED,
                        "authentication failed",
                    ))),
                }
            }
            _ => Err(Some(close(
                close_code::BAD_HANDSHAKE,
                "expected device:hello or device:auth",
            ))),
        }
    }

    /// Pairs: the code goes to the device, the question to the person. The
    /// device leaving withdraws the question.
    async fn pair(&mut self, manifest: &Value) -> Result<Session, Option<CloseFrame>> {
        let person = Arc::clone(self.vessel.person());
        let consent_timeout = self.vessel.limits().consent_timeout;
        let frames = self.out.frames.clone();
        let pairing = self.vessel.registry().pair(
            manifest,
            |code| {
                let frame = VesselFrame::Pairing {
                    code: Cow::Borrowed(code),
                };
                let _ = frames.try_send(frame.to_json());
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
                () = self.vessel.shutting_down() => return Err(Some(going_away())),
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
            Err(e) => Err(Some(close(close_code::PAIRING_REFUSED, e.to_string()))),
        }
    }

    /// Serves an authenticated device until it leaves or must be closed.
    async fn session(&mut self, session: &Session) -> Option<CloseFrame> {
        let limits = self.vessel.limits().clone();
        let correlator = Arc::new(CallCorrelator::with_max_pending(
            self.out.frames.clone(),
            limits.max_pending_calls,
        ));
        let link: Arc<dyn DeviceLink> = correlator.clone();
        let mut changes = self.vessel.registry().subscribe();
        // A newer connection replaces the older one; a streaming device's
        // sessions (as many as its policy admits) all stay open, and calls go
        // to the newest.
        if let Some(old) = self
            .vessel
            .links()
            .connect(&session.device_id, Arc::clone(&link))
            && session.stream.is_none()
        {
            old.close("replaced by a newer connection");
        }
        let silence = limits.ping_interval * 2;
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
                    if let Some(frame) = self.on_message(message, session, &correlator) {
                        break frame;
                    }
                }
                reason = &mut replaced => break Some(close(close_code::REPLACED, reason)),
                change = changes.recv() => {
                    if let Some(frame) = self.on_change(change, session) {
                        break Some(frame);
                    }
                }
                () = &mut shutdown => break Some(going_away()),
                () = &mut deadline => {
                    // Re-armed lazily: a message since the last arming moves it on.
                    if last_seen + silence > Instant::now() {
                        deadline.as_mut().reset(last_seen + silence);
                    } else {
                        break Some(close(close_code::DEAD, "no answer to pings"));
                    }
                }
            }
        };
        correlator.close("device disconnected");
        self.vessel.links().disconnect(&session.device_id, &link);
        ended
    }

    /// One message in a session. `Some(None)`: the device left;
    /// `Some(Some(close))`: the vessel closes; `None`: carry on.
    fn on_message(
        &mut self,
        message: Option<WireMessage>,
        session: &Session,
        correlator: &CallCorrelator,
    ) -> Option<Option<CloseFrame>> {
        let text = match message {
            None | Some(WireMessage::Close(_)) => return Some(None),
            // The answer to the vessel's ping.
            Some(WireMessage::Pong(_)) => return None,
            Some(WireMessage::Ping(_)) => return self.charge().err().map(Some),
            Some(WireMessage::Binary(message)) => {
                if let Err(close) = self.charge() {
                    return Some(Some(close));
                }
                return self.on_chunk(message, session);
            }
            Some(WireMessage::Text(text)) => text,
        };
        let frame = match DeviceFrame::parse_with(text.as_bytes(), self.frame_limits()) {
            Ok(frame) => frame,
            Err(FrameError::TooLarge { max, .. }) => {
                return Some(Some(close(
                    close_code::TOO_LARGE,
                    format!("frames are at most {max} bytes"),
                )));
            }
            Err(e) => {
                if let Err(close) = self.charge() {
                    return Some(Some(close));
                }
                return self.malformed(&e.to_string()).map(Some);
            }
        };
        // A result to a pending call answers the vessel: it is bounded by the
        // calls in flight, not by the rate. Anything else was sent unasked.
        let handled = correlator.handle(&frame);
        if handled != Handled::Settled
            && let Err(close) = self.charge()
        {
            return Some(Some(close));
        }
        match handled {
            Handled::Settled => None,
            Handled::UnknownCall => {
                self.vessel
                    .stats()
                    .unknown_results
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
            Handled::NotAResult => match frame {
                DeviceFrame::Event { capability, data } => {
                    let declared = self
                        .vessel
                        .registry()
                        .get(&session.device_id)
                        .is_some_and(|d| d.manifest().capability(&capability).is_some());
                    if !declared {
                        return self
                            .malformed(&format!("event for undeclared capability {capability:?}"))
                            .map(Some);
                    }
                    self.vessel.publish_event(DeviceEvent {
                        device_id: session.device_id.clone(),
                        capability: capability.into_owned(),
                        data: data.map(|d| d.into_owned()),
                    });
                    None
                }
                _ => self.malformed("already paired and authenticated").map(Some),
            },
        }
    }

    /// A binary message: a stream chunk when the session was admitted as a
    /// streaming session, else malformed (as for any v1 device). Over twice
    /// the cap closes 1009; a chunk that does not parse, or names a stream
    /// that is not one of the device's sensors, is malformed; over the cap
    /// it is dropped and reported to the device; otherwise it goes to the
    /// subscribers (when its capability is granted).
    fn on_chunk(&mut self, message: Vec<u8>, session: &Session) -> Option<Option<CloseFrame>> {
        let Some(stream) = &session.stream else {
            return self.malformed("frames are JSON text").map(Some);
        };
        let limit = message_limit(stream.policy().max_chunk_bytes());
        if message.len() > limit {
            return Some(Some(close(
                close_code::TOO_LARGE,
                format!("stream messages are at most {limit} bytes"),
            )));
        }
        let (name, seq) = match StreamChunk::parse(&message) {
            Ok(chunk) => (chunk.stream.to_owned(), chunk.seq),
            Err(e) => return self.malformed(&e.to_string()).map(Some),
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
            return self
                .malformed(&format!(
                    "stream {name:?} is not a sensor capability of the device"
                ))
                .map(Some);
        }
        match self.vessel.take_chunk(stream, message, &name, seq, granted) {
            ChunkOutcome::Forwarded | ChunkOutcome::NotGranted => {}
            ChunkOutcome::Dropped(report) => self.out.text(report.to_json()),
        }
        None
    }

    /// Admits a streaming device's session (nothing to do for other kinds),
    /// asking the person first on a reconnect when the policy requires
    /// approval. `Err(None)`: the device left while the person was asked.
    async fn admit_streaming(&mut self, session: &mut Session) -> Result<(), Option<CloseFrame>> {
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
            return Err(Some(self.refuse(&id, class, stage, &error)));
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
                self.vessel.audit(
                    "stream_admission",
                    json!({
                        "deviceId": id, "kind": class.as_str(), "stage": stage,
                        "admitted": true, "maxChunkBytes": policy.max_chunk_bytes(),
                        "maxToolCalls": admitted.admitted().run_limits()
                            .get(dk_policy::RunLimit::MaxToolCalls),
                    }),
                );
                session.stream = Some(admitted);
                Ok(())
            }
            Err(error) => Err(Some(self.refuse(&id, class, stage, &error))),
        }
    }

    /// Asks the person to admit a streaming device's reconnect; a no, no
    /// answer in time or an error is a no. The device leaving withdraws it.
    async fn ask_person(
        &mut self,
        device: &PairedDevice,
        class: DeviceClass,
    ) -> Result<bool, Option<CloseFrame>> {
        let manifest = device.manifest();
        let request = crate::adapter::ApprovalRequest {
            tool: format!("stream:{class}"),
            device_id: manifest.id().to_owned(),
            capability: String::new(),
            input: serde_json::Map::new(),
            reason: format!(
                "{class} device side effect requires approval: {:?} reconnects to stream",
                manifest.name()
            ),
            agent_id: None,
            session_id: None,
        };
        let person = Arc::clone(self.vessel.person());
        let asking = person.ask_approval(request, self.vessel.limits().consent_timeout);
        tokio::pin!(asking);
        loop {
            tokio::select! {
                approved = &mut asking => return Ok(approved),
                () = self.vessel.shutting_down() => return Err(Some(going_away())),
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
        let code = error.code().as_str();
        self.vessel.audit(
            "stream_admission",
            json!({
                "deviceId": device_id, "kind": class.as_str(), "stage": stage,
                "admitted": false, "code": code, "message": error.to_string(),
            }),
        );
        close(close_code::ADMISSION_REFUSED, format!("{code}: {error}"))
    }

    fn over_rate(&self) -> CloseFrame {
        close(
            close_code::RATE,
            format!(
                "more than {} frames per second",
                self.vessel.limits().max_frames_per_second
            ),
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
                Some(close(close_code::UNPAIRED, "unpaired by the person"))
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
            Some(_) => Some(close(close_code::REPLACED, "paired again")),
            None => {
                self.out.frame(&VesselFrame::Revoked { capability: None });
                Some(close(close_code::UNPAIRED, "unpaired by the person"))
            }
        }
    }
}

#[cfg(test)]
mod tests;
