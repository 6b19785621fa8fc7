//! One connection to the vessel: the driver around dk-device-core's state
//! machine, which holds everything the device does on the wire. The driver
//! opens the WebSocket (TLS, the `dk.2` subprotocol, the connect timeout;
//! an HTTP 403 or an upgrade without `dk.2` is read here, before the core
//! hears of the connection), then feeds the core what comes: the socket's
//! messages, its timer, the handlers' outcomes, queued events and stream
//! chunks, and the shutdown. After each it does what the core asks, in
//! order: send, show the code, keep the key or token, run a handler, log,
//! and at the end say what the end means.

use std::future::Future;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dk_device_core::{
    ChunkRefusal, DeviceCore, End, Message as Out, Notice, Output, Received, Retry, State, Stop,
    StreamChunk,
};
use dk_proto::{Channel, MAX_FRAME_BYTES};
use futures::{FutureExt as _, SinkExt as _, StreamExt as _};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

pub(super) use dk_device_core::printable;

use super::error::ClientError;
use super::options::{ClientOptions, ConnectionEvent};
use super::token_file::{read_token, token_file_error, write_token};
use crate::Device;
use crate::serve::{Handlers, set_aside, take_call};

/// The WebSocket read buffer a connection starts with (8 KiB).
const READ_BUFFER_BYTES: usize = 8 * 1024;

/// How long opening a connection (TCP and the WebSocket upgrade) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for the other side's close once the connection is ending.
const CLOSE_TIMEOUT: Duration = dk_device_core::CLOSE_TIMEOUT;

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
    // What the device keeps is read (or made) before connecting: a broken
    // key or token file stops the client before the vessel hears from it.
    let (credentials, token) = match channel {
        Channel::V1 => (None, options.stored_token()?),
        Channel::Dk2 => (Some(options.key_state()?.clone()), None),
    };
    let max_message = match channel {
        Channel::V1 => MAX_MESSAGE_BYTES,
        Channel::Dk2 => dk_channel::MAX_MESSAGE,
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
    let tls = if request
        .uri()
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("wss"))
    {
        Some(super::tls::connector(options.tls_root.as_deref())?)
    } else {
        None
    };
    // TCP_NODELAY: without it a small frame waits on the vessel's delayed
    // acknowledgement (40 ms), the dk/2 handshake's last message first.
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
    let mut core = options.take_core(device, channel)?;
    core.core.reload(credentials, token);
    let mut driver = Driver {
        options: &mut *options,
        socket,
        open: true,
        closing: false,
        handlers: Handlers::new(device.clone()),
        origin: core.origin,
        failed: None,
    };
    let ended = driver.run(&mut core.core, shutdown.as_mut()).await;
    driver.handlers.stop().await;
    options.put_core(core);
    ended
}

/// Refuses, before any connection, a URL that is not `ws://host...` or
/// `wss://host...`.
pub(super) fn check_url(url: &str) -> Result<(), ClientError> {
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
        tungstenite::Error::Http(response) if response.status().as_u16() == 503 => {
            ClientError::Busy {
                retry_after: retry_after(response.headers()),
            }
        }
        tungstenite::Error::Http(response) => ClientError::Connect(format!(
            "the vessel answered HTTP {} instead of a WebSocket",
            response.status()
        )),
        other => ClientError::Connect(other.to_string()),
    }
}

/// A 503's `Retry-After` as a wait ([`dk_device_core::reconnect::retry_after`]:
/// whole seconds from 1 s to 60 s, 1 s when missing or not a number).
pub(super) fn retry_after(headers: &tungstenite::http::HeaderMap) -> Duration {
    let text = headers
        .get(tungstenite::http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok());
    dk_device_core::reconnect::retry_after(text)
}

/// One open connection, driving the core.
struct Driver<'a> {
    options: &'a mut ClientOptions,
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    /// Whether the socket may still be read: no end or error came yet.
    open: bool,
    /// Whether a close was sent or received: the socket is then read to
    /// its end before it is dropped.
    closing: bool,
    handlers: Handlers,
    origin: tokio::time::Instant,
    /// Why the device's key or token could not be kept: the client ends
    /// with it whatever the core says.
    failed: Option<ClientError>,
}

impl Driver<'_> {
    /// The core's clock: milliseconds since the client's start.
    fn now(&self) -> dk_device_core::Instant {
        let millis = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        dk_device_core::Instant::from_millis(millis)
    }

    /// The tokio instant of the core's `at` (a year away when past the
    /// clock's end).
    fn deadline(&self, at: dk_device_core::Instant) -> tokio::time::Instant {
        let year = Duration::from_secs(365 * 24 * 3600);
        self.origin
            .checked_add(Duration::from_millis(at.as_millis()))
            .unwrap_or_else(|| tokio::time::Instant::now() + year)
    }

    async fn run<F>(
        &mut self,
        core: &mut DeviceCore,
        mut shutdown: std::pin::Pin<&mut futures::future::Fuse<F>>,
    ) -> Result<SessionEnd, ClientError>
    where
        F: Future<Output = ()>,
    {
        core.connect(self.now());
        loop {
            while let Some(output) = core.poll() {
                if let Some(end) = self.act(core, output).await {
                    return self.ended(end).await;
                }
            }
            let timer = core.poll_timeout().map(|at| self.deadline(at));
            let serving = core.state() == State::Serving;
            let admitted = serving && core.stream_cap() > 0;
            let grace = self.options.serve.grace_period();
            let options = &mut *self.options;
            tokio::select! {
                // Running calls get the grace period, as the core rules.
                () = &mut shutdown => core.shutdown(self.now(), grace),
                message = self.socket.next(), if self.open => {
                    let now = self.now();
                    match message {
                        None => {
                            self.open = false;
                            core.receive(now, Received::Lost);
                        }
                        Some(Err(error)) => {
                            tracing::debug!(%error, "connection lost");
                            self.open = false;
                            core.receive(now, Received::Lost);
                        }
                        Some(Ok(Message::Text(text))) => core.receive(now, Received::Text(&text)),
                        Some(Ok(Message::Binary(bytes))) => {
                            core.receive(now, Received::Binary(&bytes));
                        }
                        Some(Ok(Message::Close(frame))) => {
                            if let Some(frame) = &frame {
                                let (code, reason) = (u16::from(frame.code), printable(&frame.reason));
                                tracing::info!(code, %reason, "the vessel closed the connection");
                            }
                            self.closing = true;
                            let frame = frame.as_ref().map(|f| (u16::from(f.code), f.reason.as_str()));
                            core.receive(now, Received::Close(frame));
                        }
                        // The library answers pings as it reads.
                        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                    }
                }
                () = sleep_until(timer), if timer.is_some() => core.handle_timeout(self.now()),
                Some((call_id, outcome)) = self.handlers.next(), if !self.handlers.is_empty() => {
                    core.answer(&call_id, outcome.as_deref().map_err(String::as_str));
                }
                event = next_event(options.serve.events_mut()), if serving && options.serve.events_mut().is_some() => {
                    match event {
                        Some(frame) => {
                            if let Err(why) = core.send_device_frame(frame) {
                                tracing::debug!(%why, "an event was not sent");
                            }
                        }
                        None => *options.serve.events_mut() = None,
                    }
                }
                chunk = next_chunk(&mut options.streams), if admitted && options.streams.is_some() => {
                    match chunk {
                        Some(chunk) => {
                            let sent = core.send_chunk(&StreamChunk {
                                stream: &chunk.stream,
                                seq: chunk.seq,
                                payload: &chunk.payload,
                            });
                            if sent == Err(ChunkRefusal::OverCap)
                                && let Some(streams) = options.streams.as_ref()
                            {
                                streams.dropped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => options.streams = None,
                    }
                }
            }
        }
    }

    /// Does one thing the core asks; the end, when the connection ended.
    async fn act(&mut self, core: &mut DeviceCore, output: Output) -> Option<End> {
        match output {
            Output::Send(message) => {
                if !self.open {
                    return None;
                }
                self.closing |= matches!(message, Out::Close(_));
                let message = match message {
                    Out::Text(text) => Message::text(text),
                    Out::Binary(bytes) => Message::binary(bytes),
                    Out::Close(frame) => Message::Close(frame.map(|frame| {
                        if frame.code == dk_proto::CloseCode::SecureChannel.code() {
                            tracing::warn!("the secure channel failed: closing 4012");
                        }
                        CloseFrame {
                            code: CloseCode::from(frame.code),
                            reason: frame.reason.into(),
                        }
                    })),
                };
                let close = matches!(message, Message::Close(_));
                if let Err(error) = self.socket.send(message).await {
                    tracing::debug!(%error, "a message could not be sent");
                    self.open = false;
                    core.receive(self.now(), Received::Lost);
                }
                // A close ends the calls that still run: the core dropped
                // them and the vessel fails them.
                if close {
                    self.handlers.stop().await;
                }
            }
            Output::Connected => self.options.tell(&ConnectionEvent::Connected),
            Output::ShowCode(code) => match &self.options.on_code {
                Some(show) => show(&code),
                None => tracing::info!(code, "pairing code: check it matches the vessel's prompt"),
            },
            Output::Store(credentials) => {
                self.options.key = Some(credentials);
                if let Err(error) = self.options.save_key() {
                    self.failed = Some(error);
                    core.storage_failed(self.now());
                }
            }
            Output::Pinned(vessel) => {
                let fingerprint = vessel.fingerprint();
                tracing::info!(%fingerprint, "paired over dk/2: the vessel's key is pinned");
                if let Some(show) = &self.options.on_vessel_pinned {
                    show(&fingerprint);
                }
            }
            Output::StoreToken(token) => {
                if let Err(error) = self.keep_token(token).await {
                    self.failed = Some(error);
                    core.storage_failed(self.now());
                }
            }
            Output::ForgetToken(token) => {
                if let Err(error) = self.forget_token(&token) {
                    self.failed = Some(error);
                }
            }
            Output::Invoke(invocation) => {
                let accepted = dk_device_core::Accepted::Run(invocation);
                take_call(&mut self.handlers, &mut self.options.serve, accepted);
            }
            Output::Notice(notice) => self.notice(notice),
            Output::Ended(end) => return Some(end),
        }
        None
    }

    fn notice(&mut self, notice: Notice) {
        match notice {
            Notice::SetAside(aside) => set_aside(&mut self.options.serve, aside),
            Notice::Ignored(frame) => {
                tracing::warn!(frame, "ignored a frame sent before pairing ended");
            }
            Notice::InvalidCode(code) => {
                tracing::warn!(%code, "ignored a pairing code that is not 6 digits");
            }
            Notice::StreamingAdmitted {
                kind,
                max_chunk_bytes,
            } => tracing::info!(%kind, max_chunk_bytes, "admitted as a streaming session"),
            Notice::StreamChunkDropped {
                stream,
                seq,
                bytes,
                marker,
            } => tracing::warn!(
                %stream,
                seq,
                bytes,
                %marker,
                "the vessel dropped a stream chunk"
            ),
            Notice::ChunkOverCap { seq } => {
                tracing::debug!(seq, "dropped a chunk over the vessel's cap");
            }
            Notice::UnannouncedClose(code) => {
                tracing::info!(
                    code,
                    "a close not announced inside the channel: reconnecting"
                );
            }
            Notice::IgnoredBinary => tracing::debug!("ignored a binary message from the vessel"),
            _ => {}
        }
    }

    /// Keeps the token from `device:paired`: in the token file, or in memory.
    async fn keep_token(&mut self, token: String) -> Result<(), ClientError> {
        match &self.options.token_file {
            Some(path) => {
                let (path, owned) = (path.clone(), token.clone());
                let written = tokio::task::spawn_blocking(move || write_token(&path, &owned))
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e)));
                if let Err(source) = written {
                    return Err(token_file_error(&self.options.token_file, source));
                }
            }
            None => self.options.remembered = Some(token),
        }
        tracing::info!("paired: device token kept");
        Ok(())
    }

    /// Forgets the v1 token the vessel refused: from memory, and from the
    /// token file unless the file now holds another one.
    fn forget_token(&mut self, token: &str) -> Result<(), ClientError> {
        if self.options.remembered.as_deref() == Some(token) {
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

    /// What the connection's end means for the client, once the socket is
    /// done (reading on sends the reply to the vessel's close, or reads the
    /// vessel's reply to the device's).
    async fn ended(&mut self, end: End) -> Result<SessionEnd, ClientError> {
        if self.open && self.closing {
            let socket = &mut self.socket;
            let drain = async { while let Some(Ok(_)) = socket.next().await {} };
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, drain).await;
            self.open = false;
        }
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        match end {
            End::Shutdown => Ok(SessionEnd::Shutdown),
            End::Retry(Retry::Lost) => Ok(SessionEnd::Lost),
            End::Retry(Retry::Closed { code, reason }) => Ok(SessionEnd::Closed { code, reason }),
            End::Retry(Retry::Handshake(why)) => Err(ClientError::Connect(why)),
            End::Stop(stop) => Err(match stop {
                Stop::PairingRefused(why) => ClientError::PairingRefused(why),
                Stop::AuthFailed => ClientError::AuthFailed,
                Stop::ManifestChanged => ClientError::ManifestChanged,
                Stop::Unpaired => ClientError::Unpaired,
                Stop::AdmissionRefused(why) => ClientError::AdmissionRefused(why),
                Stop::PairingBroken(why) => ClientError::PairingBroken(why),
                Stop::VesselKeyChanged { pinned, presented } => {
                    ClientError::VesselKeyChanged { pinned, presented }
                }
                other => ClientError::Protocol(other.to_string()),
            }),
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn next_event(events: &mut Option<crate::EventReceiver>) -> Option<String> {
    match events {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_chunk(
    streams: &mut Option<crate::stream::StreamReceiver>,
) -> Option<crate::stream::OutChunk> {
    match streams {
        Some(streams) => streams.rx.recv().await,
        None => std::future::pending().await,
    }
}
