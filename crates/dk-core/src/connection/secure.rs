//! dk/2 on the vessel's side: the Noise handshake over WebSocket binary
//! messages, then every frame sealed into records on the way out and opened
//! back on the way in, so the connection logic runs unchanged on the frames
//! inside the channel.
//!
//! The handshake must finish, and the first frame arrive, within the
//! handshake deadline counted from the connect. Whatever fails in the
//! channel (a handshake message of the wrong length or that does not
//! decrypt, a record replayed, reordered or altered, a text message after
//! the handshake, a Noise message over 65,535 bytes) closes with one code,
//! 4012 `secure channel failed`: the device learns nothing of which check
//! it failed. Pings, pongs and the close travel outside the channel, as
//! WebSocket control frames; before every close it makes after the
//! handshake, the vessel sends the code and reason inside the channel
//! (`device:closing`), so the device can tell a refusal from a close forged
//! on the path.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use dk_channel::{Established, FrameKind, OpenError, OpenedFrame, Opener, RecordLimits, Sealer};
use dk_proto::{CloseCode, CloseFrame, CloseWhy, VesselFrame};
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::time::Instant;

use super::serve::{ConnectionOutcome, Secured, WireMessage, close, going_away, serve_on};
use crate::metrics::HandshakeFailure;
use crate::vessel::{ConnectionPermit, Vessel};

/// Records a device may send per frame the frame rate allows: a frame in
/// pieces costs up to this many records before it costs more than a frame.
const RECORDS_PER_FRAME: u32 = 16;

/// The close a channel failure makes, whatever failed.
fn channel_failed() -> CloseFrame {
    CloseFrame::canonical(CloseCode::SecureChannel)
}

/// Serves one dk/2 device connection until it ends: the handshake with the
/// vessel's static key ([`Vessel::identity`]), then the connection as
/// [`serve_connection`](super::serve_connection) serves it, on the frames
/// inside the channel: pairing by commit, nonce and reveal, reconnects
/// authenticated by the channel's key. `permit` comes from
/// [`Vessel::admit`].
pub async fn serve_secure_connection<S, K>(
    vessel: &Arc<Vessel>,
    permit: ConnectionPermit,
    mut incoming: S,
    mut outgoing: K,
) -> ConnectionOutcome
where
    S: Stream<Item = WireMessage> + Unpin,
    K: Sink<WireMessage> + Unpin,
{
    let deadline = permit.connected_at() + vessel.limits().handshake_timeout;
    let handshake = tokio::select! {
        result = tokio::time::timeout_at(deadline, handshake(vessel, &mut incoming, &mut outgoing)) => {
            match result {
                Ok(Ok(established)) => Ok(established),
                Ok(Err(Unfinished::Left)) => {
                    vessel.metrics().handshake_failed(HandshakeFailure::Closed);
                    return ConnectionOutcome::default();
                }
                Ok(Err(Unfinished::Failed(why))) => {
                    vessel.metrics().handshake_failed(why);
                    count_failure(vessel);
                    Err(channel_failed())
                }
                Err(_) => {
                    vessel.metrics().handshake_failed(HandshakeFailure::Timeout);
                    Err(CloseFrame::canonical(CloseCode::HandshakeTimeout))
                }
            }
        }
        () = vessel.shutting_down() => Err(going_away()),
    };
    let established = match handshake {
        Ok(established) => established,
        Err(frame) => {
            let _ = outgoing.send(WireMessage::Close(Some(frame.clone()))).await;
            let _ = outgoing.close().await;
            return ConnectionOutcome {
                closed_with: Some(frame),
                ..ConnectionOutcome::default()
            };
        }
    };
    vessel
        .stats()
        .secure_handshakes
        .fetch_add(1, Ordering::Relaxed);
    let secured = Secured {
        remote: *established.remote.as_bytes(),
        handshake_hash: established.handshake_hash,
    };
    let limits = vessel.limits();
    let (sealer, opener) = established.split(RecordLimits {
        max_text: limits.max_frame_bytes,
        max_binary: vessel.largest_stream_message().unwrap_or(0),
    });
    let failure: Arc<Mutex<Option<CloseFrame>>> = Arc::new(Mutex::new(None));
    let records = RecordBucket::new(
        limits
            .max_frames_per_second
            .saturating_mul(RECORDS_PER_FRAME),
    );
    let opened = Box::pin(open_records(
        incoming,
        opener,
        records,
        Arc::clone(&failure),
    ));
    let sealing = SealingSink::new(outgoing, sealer, Arc::clone(&failure));
    let mut outcome = serve_on(vessel, permit, opened, sealing, Some(secured)).await;
    if let Some(frame) = failed(&failure) {
        if frame.code == CloseCode::SecureChannel.code() {
            count_failure(vessel);
        }
        outcome.closed_with = Some(frame);
    }
    outcome
}

fn count_failure(vessel: &Vessel) {
    vessel
        .stats()
        .channel_failures
        .fetch_add(1, Ordering::Relaxed);
}

/// Why the handshake did not finish.
enum Unfinished {
    /// The device left.
    Left,
    /// A message that does not hold, or none the vessel can answer: the
    /// channel failed.
    Failed(HandshakeFailure),
}

/// The responder's side of the handshake: message 1 in, message 2 out,
/// message 3 in, each one WebSocket binary message.
async fn handshake<S, K>(
    vessel: &Vessel,
    incoming: &mut S,
    outgoing: &mut K,
) -> Result<Established, Unfinished>
where
    S: Stream<Item = WireMessage> + Unpin,
    K: Sink<WireMessage> + Unpin,
{
    let key = vessel
        .identity()
        .ok_or(Unfinished::Failed(HandshakeFailure::NoKey))?;
    let mut responder = dk_channel::Responder::new(&key).map_err(failed_handshake)?;
    let first = next_binary(incoming).await?;
    responder.read_first(&first).map_err(failed_handshake)?;
    let second = responder.second_message().map_err(failed_handshake)?;
    outgoing
        .send(WireMessage::Binary(second))
        .await
        .map_err(|_| Unfinished::Left)?;
    let third = next_binary(incoming).await?;
    responder.read_third(&third).map_err(failed_handshake)
}

/// A handshake step that failed: logged with what failed (a low-order key,
/// a message of the wrong length, one that does not decrypt), while the
/// device is told only 4012.
fn failed_handshake(error: dk_channel::ChannelError) -> Unfinished {
    tracing::info!(%error, "a dk/2 handshake failed: closing 4012");
    Unfinished::Failed(HandshakeFailure::BadMessage)
}

/// The next handshake message: a binary message (pings and pongs are
/// skipped; anything else fails the channel).
async fn next_binary<S>(incoming: &mut S) -> Result<Vec<u8>, Unfinished>
where
    S: Stream<Item = WireMessage> + Unpin,
{
    loop {
        match incoming.next().await {
            None | Some(WireMessage::Close(_)) => return Err(Unfinished::Left),
            Some(WireMessage::Ping(_) | WireMessage::Pong(_)) => {}
            Some(WireMessage::Binary(message)) => return Ok(message),
            Some(WireMessage::Text(_)) => {
                return Err(Unfinished::Failed(HandshakeFailure::NotBinary));
            }
        }
    }
}

/// The failure noted, if the channel failed.
fn failed(failure: &Mutex<Option<CloseFrame>>) -> Option<CloseFrame> {
    failure
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

fn note(failure: &Mutex<Option<CloseFrame>>, frame: CloseFrame) {
    let mut noted = failure.lock().unwrap_or_else(PoisonError::into_inner);
    if noted.is_none() {
        *noted = Some(frame);
    }
}

/// A token bucket of records: `rate` a second, bursts of twice that.
struct RecordBucket {
    /// The records a second, as configured (and named in the close).
    limit: u32,
    rate: f64,
    tokens: f64,
    refilled: Instant,
}

impl RecordBucket {
    fn new(rate: u32) -> RecordBucket {
        let limit = rate;
        let rate = f64::from(rate);
        RecordBucket {
            limit,
            rate,
            tokens: rate * 2.0,
            refilled: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate * 2.0);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// The frames inside the device's records, as the connection logic reads
/// them. A failure ends the stream and is noted for the writer, which
/// closes with it.
fn open_records<S>(
    incoming: S,
    opener: Opener,
    records: RecordBucket,
    failure: Arc<Mutex<Option<CloseFrame>>>,
) -> impl Stream<Item = WireMessage>
where
    S: Stream<Item = WireMessage> + Unpin,
{
    futures::stream::unfold(
        Some((incoming, opener, records, failure)),
        |state| async move {
            let (mut incoming, mut opener, mut records, failure) = state?;
            loop {
                let message = match incoming.next().await? {
                    WireMessage::Binary(message) => message,
                    WireMessage::Text(_) => {
                        note(&failure, channel_failed());
                        return None;
                    }
                    other => return Some((other, Some((incoming, opener, records, failure)))),
                };
                if !records.take() {
                    let limit = records.limit;
                    note(
                        &failure,
                        close(CloseCode::Rate, CloseWhy::OverRecordRate(limit).to_string()),
                    );
                    return None;
                }
                let frame = match opener.open(&message) {
                    Ok(None) => continue,
                    Ok(Some(OpenedFrame::Text(text))) => WireMessage::Text(text),
                    Ok(Some(OpenedFrame::Binary(bytes))) => WireMessage::Binary(bytes),
                    Err(OpenError::TooLarge {
                        kind: FrameKind::Text,
                        max,
                    }) => {
                        let reason = CloseWhy::FrameTooLarge(max).to_string();
                        note(&failure, close(CloseCode::TooLarge, reason));
                        return None;
                    }
                    Err(OpenError::TooLarge { max, .. }) => {
                        let reason = CloseWhy::StreamMessageTooLarge(max).to_string();
                        note(&failure, close(CloseCode::TooLarge, reason));
                        return None;
                    }
                    Err(_) => {
                        note(&failure, channel_failed());
                        return None;
                    }
                };
                return Some((frame, Some((incoming, opener, records, failure))));
            }
        },
    )
}

/// The connection logic's sink on dk/2: each text or binary message it
/// sends goes out sealed as its records; pings, pongs and the close go as
/// they are, the close after its code and reason inside the channel
/// (`device:closing`). When the logic closes the sink without a close of
/// its own, the channel failed (or the device left): the failure noted, if
/// any, is the close.
///
/// Sealing happens in the connection's own task, as the logic sends: no
/// queue and no second task between the logic and the socket, so a frame
/// costs its encryption and nothing more.
struct SealingSink<K> {
    sink: K,
    sealer: Sealer,
    /// Messages sealed and waiting for the socket to take them.
    queue: VecDeque<WireMessage>,
    failure: Arc<Mutex<Option<CloseFrame>>>,
    /// Whether the close is queued or sent: nothing goes after it.
    closed: bool,
}

impl<K> SealingSink<K>
where
    K: Sink<WireMessage> + Unpin,
{
    fn new(sink: K, sealer: Sealer, failure: Arc<Mutex<Option<CloseFrame>>>) -> Self {
        SealingSink {
            sink,
            sealer,
            queue: VecDeque::new(),
            failure,
            closed: false,
        }
    }

    /// Queues one frame's records; a frame that cannot be sealed ends the
    /// channel (the close is queued in its place).
    fn seal(&mut self, kind: FrameKind, frame: &[u8]) {
        match self.sealer.seal(kind, frame) {
            Ok(records) => self
                .queue
                .extend(records.into_iter().map(WireMessage::Binary)),
            Err(_) => {
                note(&self.failure, channel_failed());
                self.close_with(None);
            }
        }
    }

    /// Queues the close with `frame`, told inside the channel first.
    fn close_with(&mut self, frame: Option<CloseFrame>) {
        if self.closed {
            return;
        }
        self.closed = true;
        if let Some(frame) = &frame {
            let closing = VesselFrame::Closing {
                code: frame.code,
                reason: Cow::Borrowed(&frame.reason),
            }
            .to_json();
            if let Ok(records) = self.sealer.seal(FrameKind::Text, closing.as_bytes()) {
                self.queue
                    .extend(records.into_iter().map(WireMessage::Binary));
            }
        }
        self.queue.push_back(WireMessage::Close(frame));
    }

    /// Hands every queued message to the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), K::Error>> {
        while !self.queue.is_empty() {
            ready!(self.sink.poll_ready_unpin(cx))?;
            if let Some(message) = self.queue.pop_front() {
                self.sink.start_send_unpin(message)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<K> Sink<WireMessage> for SealingSink<K>
where
    K: Sink<WireMessage> + Unpin,
{
    type Error = K::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), K::Error>> {
        self.poll_drain(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, message: WireMessage) -> Result<(), K::Error> {
        if self.closed {
            return Ok(());
        }
        match message {
            WireMessage::Text(text) => self.seal(FrameKind::Text, text.as_bytes()),
            WireMessage::Binary(bytes) => self.seal(FrameKind::Binary, &bytes),
            WireMessage::Close(frame) => self.close_with(frame),
            control => self.queue.push_back(control),
        }
        Ok(())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), K::Error>> {
        ready!(self.poll_drain(cx))?;
        self.sink.poll_flush_unpin(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), K::Error>> {
        if !self.closed
            && let Some(frame) = failed(&self.failure)
        {
            self.close_with(Some(frame));
        }
        ready!(self.poll_drain(cx))?;
        self.sink.poll_close_unpin(cx)
    }
}
