//! The connection's logic, shared by the plain (v1) and the secure (dk/2)
//! channel: the frame reader, its session and the writer.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dk_policy::DeviceClass;
use dk_proto::{
    AskReason, CloseCode, CloseFrame, CloseWhy, DeviceFrame, FrameError, LinkClosed, Malformed,
    StreamChunk, StreamingFrame, VesselFrame,
};
use futures::future::BoxFuture;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::{broadcast, oneshot};
use tokio::time::Instant;

use super::frames::{Queued, frames};
use crate::link::{CallCorrelator, DeviceEvent, DeviceLink, Handled};
use crate::registry::{PairedDevice, RegistryEvent};
use crate::store::entry::{AdmissionOutcome, StreamAdmission};
use crate::stream::{ChunkOutcome, message_limit, streaming_class};
use crate::vessel::{ConnectionPermit, Vessel};

mod handshake;
mod reader;

pub use reader::{ConnectionOutcome, WireMessage};
use reader::{Ending, Out, Reader, Session};
pub(super) use reader::{Secured, close, going_away};

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
