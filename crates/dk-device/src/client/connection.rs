//! One connection to the vessel, as a state machine: connect (on dk/2, the
//! handshake first), pair or authenticate, serve calls, and read what the
//! vessel's close means. On dk/2 the machine reads and writes through the
//! sealing sink and opening stream of `secure.rs`, so the same code serves
//! both channels; what differs is the pairing exchange and which closes
//! count (only those announced inside the channel).

use std::borrow::Cow;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use dk_channel::PublicKey;
use dk_proto::{
    Channel, DeviceFrame, FrameLimits, MAX_FRAME_BYTES, StreamDroppedFrame, StreamingFrame,
    VesselFrame,
};
use futures::future::Fuse;
use futures::{FutureExt as _, Sink, SinkExt as _, Stream, StreamExt as _};
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};

/// The WebSocket read buffer a connection starts with (8 KiB).
const READ_BUFFER_BYTES: usize = 8 * 1024;
use tokio_tungstenite::tungstenite::{self, Message};

use super::error::ClientError;
use super::options::{ClientOptions, ConnectionEvent};
use super::secure::{
    Handshaken, MAX_SECURE_MESSAGE, Opening, Sealing, handshake, is_channel_failure,
};
use super::token_file::{is_token, read_token, token_file_error, write_token};
use crate::serve::serve_session;
use crate::stream::StreamReceiver;
use crate::{Device, ServeError};

/// How long opening a connection (TCP and the WebSocket upgrade) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for the other side's close once the connection is ending.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Largest message accepted from the vessel: a frame at the protocol's
/// limit, with room for escaping.
const MAX_MESSAGE_BYTES: usize = 2 * MAX_FRAME_BYTES;

/// How one connection ended, when the client may connect again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The vessel closed the connection with this code and reason (the
    /// reason is shown with unsafe characters escaped).
    Closed {
        /// The close code (1005 when the vessel gave none).
        code: u16,
        /// The vessel's reason.
        reason: String,
    },
    /// The connection dropped without a close.
    Lost,
    /// The shutdown future resolved; the client closed with code 1000.
    Shutdown,
}

/// One connection: connects, sends `device:auth` when a token is kept (with
/// the device's manifest) or else `device:hello`, shows the pairing code and
/// keeps the token the vessel sends, then serves calls until the connection
/// ends or `shutdown` resolves.
///
/// Returns how the connection ended when connecting again makes sense, and
/// an error otherwise; see [`ClientError`] for the close codes that end the
/// client and what happens to the token file.
pub async fn connect_once(
    device: &Device,
    options: &mut ClientOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<SessionEnd, ClientError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ClientError::NoRuntime);
    }
    let shutdown = shutdown.fuse();
    tokio::pin!(shutdown);
    check_url(&options.url)?;
    let channel = if options.v1 {
        Channel::V1
    } else {
        Channel::Dk2
    };
    let token = match channel {
        Channel::V1 => options.stored_token()?,
        // The key is read (or made) before connecting: a broken key file
        // stops the client before the vessel hears from it.
        Channel::Dk2 => {
            options.key_state()?;
            None
        }
    };
    let max_message = match channel {
        Channel::V1 => MAX_MESSAGE_BYTES,
        Channel::Dk2 => MAX_SECURE_MESSAGE,
    };
    // tungstenite's read buffer starts at 128 KiB a connection; a device's
    // frames are small, and a bridge holds hundreds of connections. The
    // buffer still grows for a larger message.
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message));
    let mut request = {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        options
            .url
            .as_str()
            .into_client_request()
            .map_err(|e| connect_error(&options.url, e))?
    };
    if channel == Channel::Dk2 {
        request.headers_mut().insert(
            tungstenite::http::header::SEC_WEBSOCKET_PROTOCOL,
            tungstenite::http::HeaderValue::from_static(dk_channel::SUBPROTOCOL),
        );
    }
    // TCP_NODELAY: without it a small frame waits on the vessel's delayed
    // acknowledgement (40 ms), the dk/2 handshake's last message first.
    let tls = if request
        .uri()
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("wss"))
    {
        Some(super::tls::connector(options.tls_root.as_deref())?)
    } else {
        None
    };
    let connect = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, tls),
    );
    let (socket, _response) = tokio::select! {
        () = &mut shutdown => return Ok(SessionEnd::Shutdown),
        connected = connect => match connected {
            Err(_) => {
                return Err(ClientError::Connect(format!(
                    "no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
            Ok(Err(e)) => return Err(connect_error(&options.url, e)),
            Ok(Ok(connected)) => connected,
        },
    };
    tracing::debug!(url = %printable(&options.url), channel = channel.as_str(), "connected");
    // A vessel that answered without `dk.2` was refused by the upgrade
    // itself (see `connect_error`): this socket speaks the channel asked for.
    let (mut sink, mut stream) = socket.split();
    if channel == Channel::V1 {
        options.tell(&ConnectionEvent::Connected);
        return Connection::new(device, options, sink, stream, token, None)
            .run(shutdown.as_mut())
            .await;
    }
    let Some(state) = options.key.as_ref() else {
        return Err(ClientError::Protocol("no device key".to_owned()));
    };
    let pinned = state.vessel;
    let shaken = tokio::select! {
        () = &mut shutdown => return Ok(SessionEnd::Shutdown),
        shaken = tokio::time::timeout(
            CONNECT_TIMEOUT,
            handshake(&mut sink, &mut stream, &state.key, pinned.as_ref()),
        ) => match shaken {
            Err(_) => {
                return Err(ClientError::Connect(format!(
                    "no dk/2 handshake within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
            Ok(Err(ClientError::VesselKeyChanged { pinned, presented })) => {
                // Closed before message 3: nothing about the device was sent.
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.close()).await;
                return Err(ClientError::VesselKeyChanged { pinned, presented });
            }
            Ok(shaken) => shaken?,
        },
    };
    let Handshaken {
        sealer,
        opener,
        handshake_hash,
        vessel,
    } = shaken;
    options.tell(&ConnectionEvent::Connected);
    let secure = Secure {
        handshake_hash,
        vessel,
        commitment: None,
        nonce: None,
        code: None,
        closing: None,
    };
    let (sink, stream) = (Sealing::new(sink, sealer), Opening::new(stream, opener));
    Connection::new(device, options, sink, stream, None, Some(secure))
        .run(shutdown.as_mut())
        .await
}

/// A dk/2 connection's state: the handshake's results and the pairing
/// exchange so far.
struct Secure {
    handshake_hash: [u8; 32],
    /// The vessel's static key, as this handshake presented it.
    vessel: PublicKey,
    /// The vessel's commitment, once `device:pair-commit` came.
    commitment: Option<[u8; 32]>,
    /// The device's nonce, once sent.
    nonce: Option<[u8; 32]>,
    /// The code, once the reveal matched the commitment.
    code: Option<String>,
    /// The close the vessel announced inside the channel
    /// (`device:closing`): the only kind of close a dk/2 device acts on.
    closing: Option<(u16, String)>,
}

/// Refuses, before any connection, a URL that is not `ws://host...` or
/// `wss://host...`.
fn check_url(url: &str) -> Result<(), ClientError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let request = url
        .into_client_request()
        .map_err(|e| connect_error(url, e))?;
    let why = match request.uri().scheme_str() {
        Some(scheme) if scheme.eq_ignore_ascii_case("ws") => return Ok(()),
        Some(scheme) if scheme.eq_ignore_ascii_case("wss") => return Ok(()),
        _ => "the URL must start with ws:// or wss://",
    };
    Err(ClientError::InvalidUrl {
        url: printable(url),
        why: why.to_owned(),
    })
}

fn connect_error(url: &str, error: tungstenite::Error) -> ClientError {
    let invalid = |why: String| ClientError::InvalidUrl {
        url: printable(url),
        why,
    };
    match error {
        // Only a dk/2 request names a subprotocol: the vessel chose none.
        tungstenite::Error::Protocol(
            tungstenite::error::ProtocolError::SecWebSocketSubProtocolError(_),
        ) => ClientError::NotDk2,
        tungstenite::Error::Url(why) => invalid(why.to_string()),
        tungstenite::Error::HttpFormat(why) => invalid(why.to_string()),
        // 403 is a refusal of this device here (plain v1 beyond loopback,
        // a Host or Origin the listener does not take): retrying cannot help.
        tungstenite::Error::Http(response) if response.status().as_u16() == 403 => {
            let body = response
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            ClientError::Refused(printable(body.trim()))
        }
        tungstenite::Error::Http(response) => ClientError::Connect(format!(
            "the vessel answered HTTP {} instead of a WebSocket",
            response.status()
        )),
        other => ClientError::Connect(other.to_string()),
    }
}

/// How a connection ended, before the close code is read.
enum Ended {
    Closed {
        code: u16,
        reason: String,
    },
    Lost,
    /// dk/2: a record did not open (or a message broke the channel's rules).
    ChannelFailed,
    /// dk/2: a pairing frame where none may come.
    PairingBroken(String),
    Shutdown,
}

/// How a read error ends the connection.
fn read_failed(error: &tungstenite::Error) -> Ended {
    if is_channel_failure(error) {
        tracing::warn!(%error, "closing 4012");
        Ended::ChannelFailed
    } else {
        tracing::debug!(%error, "connection lost");
        Ended::Lost
    }
}

/// One open connection.
struct Connection<'a, K, S> {
    device: &'a Device,
    options: &'a mut ClientOptions,
    sink: K,
    stream: S,
    /// The token sent in `device:auth`, or received in `device:paired`
    /// (v1 only).
    token: Option<String>,
    /// The dk/2 state; `None` on v1.
    secure: Option<Secure>,
}

impl<'a, K, S> Connection<'a, K, S> {
    fn new(
        device: &'a Device,
        options: &'a mut ClientOptions,
        sink: K,
        stream: S,
        token: Option<String>,
        secure: Option<Secure>,
    ) -> Self {
        Connection {
            device,
            options,
            sink,
            stream,
            token,
            secure,
        }
    }
}

impl<K, S> Connection<'_, K, S>
where
    K: Sink<Message, Error = tungstenite::Error> + Unpin,
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    async fn run<F>(mut self, mut shutdown: Pin<&mut Fuse<F>>) -> Result<SessionEnd, ClientError>
    where
        F: Future<Output = ()>,
    {
        let key_paired = self.options.key.as_ref().is_some_and(|k| k.paired);
        let (first, pairing) = match (&self.secure, &self.token) {
            (None, Some(token)) => (auth_frame(self.device, token)?, false),
            (Some(_), _) if key_paired => (key_auth_frame(self.device)?, false),
            _ => (hello_frame(self.device)?, true),
        };
        if let Err(e) = self.sink.send(Message::text(first)).await {
            tracing::debug!(error = %e, "the first frame could not be sent");
            return Ok(SessionEnd::Lost);
        }
        if pairing {
            match self.pair(shutdown.as_mut()).await {
                Ok(None) => {}
                Ok(Some(ended)) => return self.finish(ended).await,
                Err(ClientError::PairingBroken(why)) => {
                    return self.finish(Ended::PairingBroken(why)).await;
                }
                Err(e) => {
                    let what = if self.secure.is_some() {
                        "cannot keep the device key"
                    } else {
                        "cannot keep the device token"
                    };
                    self.close(CloseCode::Error, what).await;
                    return Err(e);
                }
            }
        }
        let ended = self.serve(shutdown).await?;
        self.finish(ended).await
    }

    /// Waits for `device:paired`, showing the pairing code on the way.
    /// `Ok(None)` once the token is kept.
    async fn pair<F>(
        &mut self,
        mut shutdown: Pin<&mut Fuse<F>>,
    ) -> Result<Option<Ended>, ClientError>
    where
        F: Future<Output = ()>,
    {
        loop {
            let message = tokio::select! {
                () = &mut shutdown => return Ok(Some(Ended::Shutdown)),
                message = self.stream.next() => message,
            };
            let text = match message {
                None => return Ok(Some(Ended::Lost)),
                Some(Err(error)) => return Ok(Some(read_failed(&error))),
                Some(Ok(Message::Close(frame))) => return Ok(Some(closed(frame))),
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Binary(_))) => {
                    tracing::debug!("ignored a binary message from the vessel");
                    continue;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            };
            if self.secure.is_some() {
                if self.pair_secure(&text).await? {
                    return Ok(None);
                }
                continue;
            }
            match VesselFrame::parse(text.as_bytes()) {
                Ok(VesselFrame::Pairing { code }) => self.show_code(&code),
                Ok(VesselFrame::Paired { device_token }) => {
                    self.keep_token(&device_token).await?;
                    return Ok(None);
                }
                Ok(VesselFrame::Error { error }) => {
                    let message = printable(&error);
                    tracing::warn!(%message, "the vessel reported an error");
                }
                Ok(other) => {
                    tracing::warn!(
                        frame = other.type_name(),
                        "ignored a frame sent before pairing ended"
                    );
                }
                Err(error) => tracing::debug!(%error, "ignored a frame from the vessel"),
            }
        }
    }

    /// One frame of the dk/2 pairing exchange, read in the order the rules
    /// demand: commit, then the device's nonce, then the reveal (checked
    /// against the commitment), then `device:paired`. Anything repeated,
    /// early or out of order breaks the pairing. `Ok(true)` once paired.
    async fn pair_secure(&mut self, text: &str) -> Result<bool, ClientError> {
        let frame =
            match VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2) {
                Ok(frame) => frame,
                Err(error) => {
                    // A pairing frame that does not parse (a nonce that is
                    // not 64 hex digits, v1's code on dk/2) ends the pairing.
                    if let Some(kind) = VesselFrame::pairing_type(text) {
                        return Err(ClientError::PairingBroken(format!(
                            "a malformed or unexpected {kind} frame"
                        )));
                    }
                    tracing::debug!(%error, "ignored a frame from the vessel");
                    return Ok(false);
                }
            };
        let Some(secure) = self.secure.as_mut() else {
            return Ok(false);
        };
        let broken = |why: &str| Err(ClientError::PairingBroken(why.to_owned()));
        match frame {
            VesselFrame::PairCommit { commitment } => {
                if secure.commitment.is_some() {
                    return broken("a second commitment");
                }
                let Some(commitment) = dk_channel::from_hex32(&commitment) else {
                    return broken("a commitment that is not 64 hex digits");
                };
                secure.commitment = Some(commitment);
                let nonce = dk_channel::random_nonce()
                    .map_err(|e| ClientError::Protocol(format!("no random nonce: {e}")))?;
                secure.nonce = Some(nonce);
                let frame = DeviceFrame::PairNonce {
                    nonce: Cow::Owned(dk_channel::to_hex32(&nonce)),
                }
                .to_json();
                if let Err(e) = self.sink.send(Message::text(frame)).await {
                    tracing::debug!(error = %e, "the pairing nonce could not be sent");
                }
                Ok(false)
            }
            VesselFrame::PairReveal { nonce } => {
                let (Some(commitment), Some(nd)) = (secure.commitment, secure.nonce) else {
                    return broken("a reveal before the commitment");
                };
                if secure.code.is_some() {
                    return broken("a second reveal");
                }
                let Some(nv) = dk_channel::from_hex32(&nonce) else {
                    return broken("a reveal that is not 64 hex digits");
                };
                if !dk_channel::commitment_holds(&commitment, &nv, &secure.handshake_hash) {
                    return broken(
                        "the vessel's reveal does not match its commitment (a relay may be in the middle)",
                    );
                }
                let code = dk_channel::pairing_code(&secure.handshake_hash, &nd, &nv);
                secure.code = Some(code.clone());
                self.show_code(&code);
                Ok(false)
            }
            VesselFrame::KeyPaired => {
                if secure.code.is_none() {
                    return broken("paired before the codes were computed");
                }
                let vessel = secure.vessel;
                self.keep_pin(vessel)?;
                Ok(true)
            }
            VesselFrame::Closing { code, reason } => {
                secure.closing = Some((code, printable(&reason)));
                Ok(false)
            }
            VesselFrame::Error { error } => {
                let message = printable(&error);
                tracing::warn!(%message, "the vessel reported an error");
                Ok(false)
            }
            other => {
                tracing::warn!(
                    frame = other.type_name(),
                    "ignored a frame sent before pairing ended"
                );
                Ok(false)
            }
        }
    }

    /// Pins the vessel's key and marks the device key paired: in the key
    /// file, or in memory.
    fn keep_pin(&mut self, vessel: PublicKey) -> Result<(), ClientError> {
        if let Some(state) = self.options.key.as_mut() {
            state.vessel = Some(vessel);
            state.paired = true;
        }
        self.options.save_key()?;
        let fingerprint = vessel.fingerprint();
        tracing::info!(%fingerprint, "paired over dk/2: the vessel's key is pinned");
        if let Some(show) = &self.options.on_vessel_pinned {
            show(&fingerprint);
        }
        Ok(())
    }

    fn show_code(&self, code: &str) {
        if code.len() != 6 || !code.bytes().all(|b| b.is_ascii_digit()) {
            tracing::warn!(code = %printable(code), "ignored a pairing code that is not 6 digits");
            return;
        }
        match &self.options.on_code {
            Some(show) => show(code),
            None => tracing::info!(code, "pairing code: check it matches the vessel's prompt"),
        }
    }

    /// Keeps the token from `device:paired`: in the token file, or in memory.
    async fn keep_token(&mut self, token: &str) -> Result<(), ClientError> {
        if !is_token(token) {
            return Err(ClientError::Protocol(
                "device:paired carried a token that is not printable ASCII of at most 1024 bytes"
                    .to_owned(),
            ));
        }
        match &self.options.token_file {
            Some(path) => {
                let (path, owned) = (path.clone(), token.to_owned());
                let written = tokio::task::spawn_blocking(move || write_token(&path, &owned))
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e)));
                if let Err(source) = written {
                    return Err(token_file_error(&self.options.token_file, source));
                }
            }
            None => self.options.remembered = Some(token.to_owned()),
        }
        tracing::info!("paired: device token kept");
        self.token = Some(token.to_owned());
        Ok(())
    }

    /// Serves calls until the connection ends or `shutdown` resolves. One
    /// writer sends the serve loop's frames and, once the vessel admitted a
    /// streaming session, the queued stream chunks.
    async fn serve<F>(&mut self, shutdown: Pin<&mut Fuse<F>>) -> Result<Ended, ClientError>
    where
        F: Future<Output = ()>,
    {
        let mut ended = None;
        // The cap the vessel announced; 0 until it admits a streaming session.
        let (cap, mut cap_changes) = tokio::sync::watch::channel(0u64);
        let options = &mut *self.options;
        let sink = &mut self.sink;
        let mut closing = None;
        let secure = self.secure.is_some();
        let served = {
            let mut incoming = Incoming {
                stream: &mut self.stream,
                shutdown,
                ended: &mut ended,
                streaming_cap: &cap,
                closing: secure.then_some(&mut closing),
            };
            let (mut frames, mut queued) = futures::channel::mpsc::channel::<String>(FRAME_QUEUE);
            let serve = async {
                let served =
                    serve_session(self.device, &mut incoming, &mut frames, &mut options.serve)
                        .await;
                frames.close_channel();
                served
            };
            let write = write_frames(
                sink,
                &mut queued,
                options.streams.as_mut(),
                &mut cap_changes,
            );
            let (served, ()) = tokio::join!(serve, write);
            served
        };
        if let (Some(secure), Some(announced)) = (self.secure.as_mut(), closing) {
            secure.closing = Some(announced);
        }
        match served {
            Ok(()) => {}
            Err(ServeError::NoRuntime) => return Err(ClientError::NoRuntime),
            Err(ServeError::Send(error)) => tracing::debug!(%error, "a frame could not be sent"),
        }
        Ok(match ended {
            Some(ended) => ended,
            // Writing failed first: the vessel's close may be on its way.
            None => self.drain().await.unwrap_or(Ended::Lost),
        })
    }

    /// Ends the connection politely and reads what its end means.
    async fn finish(mut self, ended: Ended) -> Result<SessionEnd, ClientError> {
        match ended {
            Ended::Shutdown => {
                self.close(CloseCode::Normal, "device shutting down").await;
                Ok(SessionEnd::Shutdown)
            }
            Ended::Lost => Ok(SessionEnd::Lost),
            Ended::PairingBroken(why) => {
                let reason = dk_proto::CloseWhy::PairingDidNotHappen(why.clone()).to_string();
                self.close(CloseCode::Library(4001), &reason).await;
                Err(ClientError::PairingBroken(why))
            }
            Ended::ChannelFailed => {
                // One code whatever failed, as the vessel does.
                self.close(CloseCode::Library(4012), "secure channel failed")
                    .await;
                Ok(SessionEnd::Lost)
            }
            Ended::Closed { code, reason } => {
                // Reading on sends the reply to the vessel's close.
                let _ = self.drain().await;
                self.closed_with(code, reason)
            }
        }
    }

    /// What a close from the vessel means for the client: connect again
    /// when [`dk_proto::CloseFrame::retry`] says so, else end with the
    /// error the close stands for.
    fn closed_with(&mut self, code: u16, reason: String) -> Result<SessionEnd, ClientError> {
        use dk_proto::CloseCode as Vessel;
        tracing::info!(code, %reason, "the vessel closed the connection");
        // Over dk/2 a close travels outside the channel, where anyone on the
        // path can forge one: only a close announced inside it counts.
        let (code, reason) = match self.secure.as_mut() {
            None => (code, reason),
            Some(secure) => match secure.closing.take() {
                Some(announced) => announced,
                None => {
                    tracing::info!(
                        code,
                        "a close not announced inside the channel: reconnecting"
                    );
                    return Ok(SessionEnd::Closed { code, reason });
                }
            },
        };
        let frame = dk_proto::CloseFrame { code, reason };
        if frame.retry() {
            return Ok(SessionEnd::Closed {
                code,
                reason: frame.reason,
            });
        }
        match frame.close_code() {
            Some(Vessel::PairingRefused) => Err(ClientError::PairingRefused(frame.reason)),
            Some(Vessel::AuthFailed) => {
                self.forget_credential()?;
                Err(ClientError::AuthFailed)
            }
            Some(Vessel::ManifestChanged) => {
                // dk/2: the next run asks to pair again (with its pin kept),
                // as the close says, instead of sending device:auth forever.
                if self.secure.is_some() {
                    self.forget_credential()?;
                }
                Err(ClientError::ManifestChanged)
            }
            Some(Vessel::Unpaired) => {
                self.forget_credential()?;
                Err(ClientError::Unpaired)
            }
            // Not the session cap, which frees up when another session ends.
            Some(Vessel::AdmissionRefused) => Err(ClientError::AdmissionRefused(frame.reason)),
            _ => Ok(SessionEnd::Closed {
                code,
                reason: frame.reason,
            }),
        }
    }

    /// Forgets the credential this connection used. dk/2: marks the key
    /// unpaired (the key and the vessel's pin stay). v1: removes the token
    /// from memory and from the token file unless the file now holds
    /// another one.
    fn forget_credential(&mut self) -> Result<(), ClientError> {
        if self.secure.is_some() {
            // dk/2: the vessel forgot the key; the device keeps it (and the
            // vessel's pin) and pairs again on its next run.
            if let Some(state) = self.options.key.as_mut() {
                state.paired = false;
            }
            return self.options.save_key();
        }
        let Some(token) = self.token.take() else {
            return Ok(());
        };
        if self.options.remembered.as_deref() == Some(token.as_str()) {
            self.options.remembered = None;
        }
        let Some(path) = &self.options.token_file else {
            return Ok(());
        };
        let error = |source| token_file_error(&self.options.token_file, source);
        match read_token(path) {
            Ok(Some(kept)) if kept == token => match std::fs::remove_file(path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed the device token");
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(error(e)),
            },
            Ok(_) => Ok(()),
            Err(e) => Err(error(e)),
        }
    }

    /// Sends a close and waits briefly for the vessel's answer.
    async fn close(&mut self, code: CloseCode, reason: &str) {
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        let sent = tokio::time::timeout(CLOSE_TIMEOUT, self.sink.send(Message::Close(Some(frame))));
        if matches!(sent.await, Ok(Ok(()))) {
            let _ = self.drain().await;
        }
    }

    /// Reads until the connection ends, for a short while; the close the
    /// vessel sent, if one came.
    async fn drain(&mut self) -> Option<Ended> {
        let stream = &mut self.stream;
        let secure = &mut self.secure;
        let read = async move {
            loop {
                match stream.next().await {
                    None | Some(Err(_)) => return None,
                    Some(Ok(Message::Close(frame))) => return Some(closed(frame)),
                    // dk/2: a refusal announced while the writer failed.
                    Some(Ok(Message::Text(text))) => {
                        if let Some(secure) = secure.as_mut()
                            && let Some(announced) = announced_close(&text)
                        {
                            secure.closing = Some(announced);
                        }
                    }
                    Some(Ok(_)) => {}
                }
            }
        };
        tokio::time::timeout(CLOSE_TIMEOUT, read)
            .await
            .ok()
            .flatten()
    }
}

/// The vessel's messages as the serve loop reads them: text frames only.
/// Ends at a close, a dropped connection or `shutdown`, and says which in
/// `ended`; logs `device:error` frames and skips binary ones.
struct Incoming<'a, S, F> {
    stream: &'a mut S,
    shutdown: Pin<&'a mut Fuse<F>>,
    ended: &'a mut Option<Ended>,
    /// Set from `device:streaming`: the chunk cap of an admitted session.
    streaming_cap: &'a tokio::sync::watch::Sender<u64>,
    /// On dk/2: where a `device:closing` frame is kept.
    closing: Option<&'a mut Option<(u16, String)>>,
}

impl<S, F> Stream for Incoming<'_, S, F>
where
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
    F: Future<Output = ()>,
{
    type Item = String;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<String>> {
        let this = self.get_mut();
        if this.ended.is_some() {
            return Poll::Ready(None);
        }
        if this.shutdown.as_mut().poll(cx).is_ready() {
            *this.ended = Some(Ended::Shutdown);
            return Poll::Ready(None);
        }
        loop {
            let message = match this.stream.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(message) => message,
            };
            match message {
                None => *this.ended = Some(Ended::Lost),
                Some(Err(error)) => *this.ended = Some(read_failed(&error)),
                Some(Ok(Message::Close(frame))) => *this.ended = Some(closed(frame)),
                Some(Ok(Message::Text(text))) => {
                    let channel = match this.closing {
                        Some(_) => Channel::Dk2,
                        None => Channel::V1,
                    };
                    let frame =
                        VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), channel);
                    let pairing = match &frame {
                        Ok(VesselFrame::Error { error }) => {
                            let message = printable(error);
                            tracing::warn!(%message, "the vessel reported an error");
                            continue;
                        }
                        Ok(VesselFrame::Closing { code, reason }) => {
                            if let Some(closing) = this.closing.as_mut() {
                                **closing = Some((*code, printable(reason)));
                            }
                            continue;
                        }
                        Ok(
                            frame @ (VesselFrame::PairCommit { .. }
                            | VesselFrame::PairReveal { .. }),
                        ) => Some(frame.type_name()),
                        Ok(_) => None,
                        Err(_) => VesselFrame::pairing_type(&text),
                    };
                    // dk/2: a pairing frame once paired or authenticated
                    // ends the connection (the order rule).
                    if this.closing.is_some()
                        && let Some(kind) = pairing
                    {
                        *this.ended = Some(Ended::PairingBroken(format!(
                            "an unexpected {kind} frame after pairing"
                        )));
                        return Poll::Ready(None);
                    }
                    if let Some(admitted) = StreamingFrame::parse(&text) {
                        tracing::info!(
                            kind = %printable(&admitted.kind),
                            max_chunk_bytes = admitted.max_chunk_bytes,
                            "admitted as a streaming session"
                        );
                        this.streaming_cap.send_replace(admitted.max_chunk_bytes);
                        continue;
                    }
                    if let Some(dropped) = StreamDroppedFrame::parse(&text) {
                        tracing::warn!(
                            stream = %printable(&dropped.stream),
                            seq = dropped.seq,
                            bytes = dropped.bytes,
                            marker = %printable(&dropped.marker),
                            "the vessel dropped a stream chunk"
                        );
                        continue;
                    }
                    return Poll::Ready(Some(text.as_str().to_owned()));
                }
                Some(Ok(Message::Binary(_))) => {
                    tracing::debug!("ignored a binary message from the vessel");
                    continue;
                }
                // The library answers pings as it reads.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            }
            return Poll::Ready(None);
        }
    }
}

/// Frames from the serve loop waiting for the writer.
const FRAME_QUEUE: usize = 64;

/// Sends the serve loop's frames and, while the session is admitted as a
/// streaming one, queued stream chunks within the announced cap; ends when
/// the serve loop does or a send fails.
async fn write_frames<K>(
    sink: &mut K,
    frames: &mut futures::channel::mpsc::Receiver<String>,
    mut streams: Option<&mut StreamReceiver>,
    cap: &mut tokio::sync::watch::Receiver<u64>,
) where
    K: Sink<Message, Error = tungstenite::Error> + Unpin,
{
    loop {
        let admitted = *cap.borrow_and_update();
        let message = tokio::select! {
            biased;
            // Admitted (or not) since: look again.
            Ok(()) = cap.changed() => continue,
            text = frames.next() => match text {
                Some(text) => Message::text(text),
                None => return,
            },
            Some(chunk) = async {
                match streams.as_mut() {
                    Some(streams) => streams.rx.recv().await,
                    None => std::future::pending().await,
                }
            }, if admitted > 0 => {
                if chunk.payload.len() as u64 > admitted {
                    if let Some(streams) = streams.as_ref() {
                        streams.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(seq = chunk.seq, "dropped a chunk over the vessel's cap");
                    continue;
                }
                match chunk.encode() {
                    Some(bytes) => Message::binary(bytes),
                    None => continue,
                }
            }
        };
        if sink.send(message).await.is_err() {
            return;
        }
    }
}

fn closed(frame: Option<CloseFrame>) -> Ended {
    match frame {
        Some(frame) => Ended::Closed {
            code: frame.code.into(),
            reason: printable(&frame.reason),
        },
        None => Ended::Closed {
            code: dk_proto::CloseCode::NoStatus.code(),
            reason: String::new(),
        },
    }
}

/// The close a dk/2 vessel announced inside the channel
/// (`device:closing`), its reason made printable.
fn announced_close(text: &str) -> Option<(u16, String)> {
    match VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), Channel::Dk2) {
        Ok(VesselFrame::Closing { code, reason }) => Some((code, printable(&reason))),
        _ => None,
    }
}

fn hello_frame(device: &Device) -> Result<String, ClientError> {
    Ok(DeviceFrame::Hello {
        manifest: Cow::Owned(manifest_json(device)?),
    }
    .to_json())
}

/// dk/2's reconnect: the id and manifest, no token (the key is the
/// credential).
fn key_auth_frame(device: &Device) -> Result<String, ClientError> {
    Ok(DeviceFrame::KeyAuth {
        device_id: Cow::Borrowed(device.manifest().id()),
        manifest: Cow::Owned(manifest_json(device)?),
    }
    .to_json())
}

fn auth_frame(device: &Device, token: &str) -> Result<String, ClientError> {
    Ok(DeviceFrame::Auth {
        device_id: Cow::Borrowed(device.manifest().id()),
        token: Cow::Borrowed(token),
        manifest: Some(Cow::Owned(manifest_json(device)?)),
    }
    .to_json())
}

fn manifest_json(device: &Device) -> Result<Box<RawValue>, ClientError> {
    RawValue::from_string(device.manifest().to_json())
        .map_err(|e| ClientError::Protocol(format!("the manifest is not JSON: {e}")))
}

/// `text` with characters a device may not put in text (controls, escapes,
/// invisible and bidirectional characters) escaped, cut to 200 characters,
/// so logging or printing it cannot drive a terminal.
pub(super) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(256));
    for (i, c) in text.chars().enumerate() {
        if i == 200 {
            out.push('…');
            break;
        }
        if dk_proto::is_unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}
