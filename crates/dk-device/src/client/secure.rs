//! The device's end of dk/2 under the connection's state machine: the
//! negotiation and the handshake (the vessel's key checked against the pin
//! before the device says anything about itself), then a sink that seals
//! every outgoing frame into records and a stream that opens incoming
//! records back into frames. The state machine above reads and writes the
//! same messages as on v1.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use dk_channel::{
    FrameKind, Initiator, MAX_MESSAGE, OpenedFrame, Opener, PublicKey, RecordLimits, Sealer,
    StaticKey,
};
use dk_proto::MAX_FRAME_BYTES;
use futures::{Sink, SinkExt as _, Stream, StreamExt as _};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

use super::error::ClientError;

/// What the handshake established: the records both ways, the handshake
/// hash the pairing code is computed from, and the vessel's static key.
pub(super) struct Handshaken {
    pub(super) sealer: Sealer,
    pub(super) opener: Opener,
    pub(super) handshake_hash: [u8; 32],
    pub(super) vessel: PublicKey,
}

/// Runs the initiator's side of the handshake on an upgraded socket. A
/// vessel key other than `pinned` stops before message 3, so an impostor
/// learns neither the device's key nor anything after it.
pub(super) async fn handshake<K, S>(
    sink: &mut K,
    stream: &mut S,
    key: &StaticKey,
    pinned: Option<&PublicKey>,
) -> Result<Handshaken, ClientError>
where
    K: Sink<Message, Error = tungstenite::Error> + Unpin,
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    let broken =
        |why: &dyn std::fmt::Display| ClientError::Connect(format!("dk/2 handshake: {why}"));
    let mut initiator = Initiator::new(key).map_err(|e| broken(&e))?;
    let first = initiator.first_message().map_err(|e| broken(&e))?;
    sink.send(Message::binary(first))
        .await
        .map_err(|e| broken(&e))?;
    let second = loop {
        match stream.next().await {
            Some(Ok(Message::Binary(bytes))) => break bytes,
            Some(Ok(Message::Close(frame))) => {
                let said = frame.map_or_else(String::new, |f| format!(" ({})", u16::from(f.code)));
                return Err(broken(&format!("the vessel closed the connection{said}")));
            }
            Some(Ok(Message::Text(_))) => return Err(broken(&"the vessel sent text")),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(broken(&e)),
            None => return Err(broken(&"the vessel hung up")),
        }
    };
    let vessel = match initiator.read_second(&second) {
        Ok(vessel) => vessel,
        Err(error) => {
            // A message 2 that does not hold (a low-order key among them):
            // the device closes 4012 as the vessel would, and says why.
            tracing::warn!(%error, "the vessel's dk/2 handshake failed: closing 4012");
            let frame = CloseFrame {
                code: CloseCode::from(dk_proto::CloseCode::SecureChannel.code()),
                reason: dk_proto::CloseCode::SecureChannel
                    .reason()
                    .unwrap_or_default()
                    .into(),
            };
            let _ = sink.send(Message::Close(Some(frame))).await;
            return Err(broken(&error));
        }
    };
    if let Some(pinned) = pinned
        && !pinned.ct_eq(&vessel)
    {
        return Err(ClientError::VesselKeyChanged {
            pinned: pinned.fingerprint(),
            presented: vessel.fingerprint(),
        });
    }
    let (third, established) = initiator.third_message().map_err(|e| broken(&e))?;
    sink.send(Message::binary(third))
        .await
        .map_err(|e| broken(&e))?;
    let handshake_hash = established.handshake_hash;
    let (sealer, opener) = established.split(RecordLimits {
        max_text: MAX_FRAME_BYTES,
        max_binary: MAX_FRAME_BYTES,
    });
    Ok(Handshaken {
        sealer,
        opener,
        handshake_hash,
        vessel,
    })
}

/// Largest WebSocket message on an established dk/2 connection: one Noise
/// message.
pub(super) const MAX_SECURE_MESSAGE: usize = MAX_MESSAGE;

/// Why the channel failed, carried inside the `io::Error` of a
/// [`tungstenite::Error::Io`] so the state machine can tell it from a
/// dropped connection and close 4012.
#[derive(Debug)]
pub(super) struct ChannelFailed(String);

impl std::fmt::Display for ChannelFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "secure channel failed: {}", self.0)
    }
}

impl std::error::Error for ChannelFailed {}

fn channel_failed(why: impl std::fmt::Display) -> tungstenite::Error {
    tungstenite::Error::Io(io::Error::other(ChannelFailed(why.to_string())))
}

/// Whether `error` is a failure of the channel (a record that does not
/// open, a text message or one too large), not of the connection.
pub(super) fn is_channel_failure(error: &tungstenite::Error) -> bool {
    matches!(error, tungstenite::Error::Io(io) if io.get_ref().is_some_and(|e| e.is::<ChannelFailed>()))
}

/// Seals each text or binary message into records, sent in order, in the
/// connection's own task (no queue to another thread). Close, ping and
/// pong go out as they are: WebSocket control frames travel outside Noise.
pub(super) struct Sealing<K> {
    inner: K,
    sealer: Sealer,
    queue: VecDeque<Message>,
}

impl<K> Sealing<K> {
    pub(super) fn new(inner: K, sealer: Sealer) -> Self {
        Sealing {
            inner,
            sealer,
            queue: VecDeque::new(),
        }
    }
}

impl<K> Sealing<K>
where
    K: Sink<Message, Error = tungstenite::Error> + Unpin,
{
    fn send_queued(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), tungstenite::Error>> {
        while !self.queue.is_empty() {
            ready!(self.inner.poll_ready_unpin(cx))?;
            if let Some(message) = self.queue.pop_front() {
                self.inner.start_send_unpin(message)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<K> Sink<Message> for Sealing<K>
where
    K: Sink<Message, Error = tungstenite::Error> + Unpin,
{
    type Error = tungstenite::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().send_queued(cx)
    }

    fn start_send(self: Pin<&mut Self>, message: Message) -> Result<(), Self::Error> {
        let this = self.get_mut();
        let (kind, bytes) = match &message {
            Message::Text(text) => (FrameKind::Text, text.as_bytes()),
            Message::Binary(bytes) => (FrameKind::Binary, &bytes[..]),
            _ => {
                this.queue.push_back(message);
                return Ok(());
            }
        };
        let records = this.sealer.seal(kind, bytes).map_err(channel_failed)?;
        this.queue.extend(records.into_iter().map(Message::binary));
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        ready!(this.send_queued(cx))?;
        this.inner.poll_flush_unpin(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let this = self.get_mut();
        ready!(this.send_queued(cx))?;
        this.inner.poll_close_unpin(cx)
    }
}

/// Opens records back into whole text and binary messages. A record that
/// does not open, a text message or one over a Noise message's size is a
/// channel failure: an error, after which the opener refuses everything.
pub(super) struct Opening<S> {
    inner: S,
    opener: Opener,
    failed: bool,
}

impl<S> Opening<S> {
    pub(super) fn new(inner: S, opener: Opener) -> Self {
        Opening {
            inner,
            opener,
            failed: false,
        }
    }
}

impl<S> Stream for Opening<S>
where
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    type Item = Result<Message, tungstenite::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.failed {
                return Poll::Ready(None);
            }
            let message = match ready!(this.inner.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(message)) => message,
            };
            let failed = |this: &mut Self, why: &str| {
                this.failed = true;
                Poll::Ready(Some(Err(channel_failed(why))))
            };
            match message {
                Message::Binary(bytes) => {
                    if bytes.len() > MAX_SECURE_MESSAGE {
                        return failed(this, "a message over the Noise limit");
                    }
                    match this.opener.open(&bytes) {
                        Ok(None) => {}
                        Ok(Some(OpenedFrame::Text(text))) => {
                            return Poll::Ready(Some(Ok(Message::text(text))));
                        }
                        Ok(Some(OpenedFrame::Binary(bytes))) => {
                            return Poll::Ready(Some(Ok(Message::binary(bytes))));
                        }
                        Err(e) => {
                            this.failed = true;
                            return Poll::Ready(Some(Err(channel_failed(e))));
                        }
                    }
                }
                Message::Text(_) => return failed(this, "a text message after the handshake"),
                other => return Poll::Ready(Some(Ok(other))),
            }
        }
    }
}
