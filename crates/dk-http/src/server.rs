//! The `/device` WebSocket route: refuses an upgrade a web page could have
//! made (an `Origin` not allowed, a `Host` that does not name a loopback
//! listener), admits a connection (total and per-address limits), upgrades
//! it, and hands it to [`serve_secure_connection`](crate::connection::serve_secure_connection)
//! when the device asks for dk/2 (the subprotocol `dk.2`), else to
//! [`serve_connection`](crate::serve_connection) for 8DK v1, which is
//! refused (403, before the upgrade) where the vessel does not allow it:
//! by default anywhere but loopback. The upgrade itself (RFC 6455's
//! handshake on hyper, the connection then handed to tokio-tungstenite) is
//! done here too. axum, hyper and tungstenite types stay inside this
//! module.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use dk_proto::CloseFrame;
use futures::{SinkExt, StreamExt};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame as WsClose, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

use crate::connection::{WireMessage, serve_connection, serve_secure_connection};
use crate::listen::{Accepted, HttpLimits, serve_http};
use crate::origins::{LocalOrigins, single};
use crate::vessel::Vessel;
use dk_core::limits::PlainV1;

/// Initial read buffer per device connection, and the most read from the
/// socket at once. Every idle connection keeps it, so it is sized for the
/// frames a connection mostly carries (calls, results, events: a few
/// hundred bytes), not the largest: a frame longer than it has its whole
/// length reserved once its header is read.
const READ_BUFFER_BYTES: usize = 2 * 1024;

/// How long a shutting-down vessel waits for its connections to close.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// What the `/device` route needs besides the vessel.
#[derive(Clone)]
struct Devices {
    vessel: Arc<Vessel>,
    /// The `Host` values accepted when the listener is on loopback; `None`
    /// when it listens on another address, where devices name it as they
    /// please.
    hosts: Option<Arc<LocalOrigins>>,
    /// The `Origin` values allowed ([`HttpLimits::device_origins`]).
    origins: Arc<[String]>,
}

/// The router with the `/device` route for a listener bound to `local`, for
/// embedding in a larger app. The app must provide `ConnectInfo<SocketAddr>`
/// (axum's `into_make_service_with_connect_info`). An upgrade may carry
/// one of `origins`.
pub(crate) fn device_router(vessel: Arc<Vessel>, local: SocketAddr, origins: &[String]) -> Router {
    let hosts = local
        .ip()
        .is_loopback()
        .then(|| Arc::new(LocalOrigins::for_listener(local)));
    Router::new()
        .route("/device", get(device_route))
        .with_state(Devices {
            vessel,
            hosts,
            origins: origins.into(),
        })
}

/// Serves the `/device` route on `listener` with [`HttpLimits::default`]
/// until `shutdown` resolves; then every device connection is closed (code
/// 1001) and awaited.
pub async fn serve_devices(
    listener: TcpListener,
    vessel: Arc<Vessel>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_devices_with(listener, vessel, HttpLimits::default(), shutdown).await
}

/// [`serve_devices`] with `limits`: connections are counted and capped from
/// `accept` (the vessel's [`Limits`](dk_core::Limits)), a request's headers
/// have a deadline and an idle connection is closed ([`HttpLimits`]), and
/// an upgrade may carry only an allowed `Origin`.
pub async fn serve_devices_with(
    listener: TcpListener,
    vessel: Arc<Vessel>,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let app = device_router(Arc::clone(&vessel), local, &limits.device_origins);
    let closing = Arc::clone(&vessel);
    let result = serve_http(
        listener,
        app,
        limits.device_listener(vessel.limits()),
        Arc::clone(&vessel.stats().device_listener),
        async move {
            shutdown.await;
            closing.shut_down();
        },
    )
    .await;
    vessel.shut_down();
    vessel.drained(DRAIN_PATIENCE).await;
    result
}

/// Why an upgrade's headers are refused, if they are: an `Origin` that is
/// not allowed (native devices send none), or on a loopback listener a
/// `Host` that does not name it.
fn refusal(devices: &Devices, headers: &HeaderMap) -> Option<&'static str> {
    let (origin, host) = match (
        single(headers, header::ORIGIN),
        single(headers, header::HOST),
    ) {
        (Ok(origin), Ok(host)) => (origin, host),
        (Err(why), _) | (_, Err(why)) => return Some(why),
    };
    if let Some(origin) = origin {
        let allowed = devices
            .origins
            .iter()
            .any(|a| a.eq_ignore_ascii_case(origin));
        if !allowed {
            return Some(
                "a device connection carries no Origin: requests from web pages are refused",
            );
        }
    }
    if let Some(local) = &devices.hosts
        && !host.is_some_and(|h| local.hosts.iter().any(|a| a.eq_ignore_ascii_case(h)))
    {
        return Some("the Host header must name this loopback listener");
    }
    None
}

/// The `Retry-After` of a `/device` upgrade refused at a connection cap, in
/// seconds.
const BUSY_RETRY_AFTER_SECS: &str = "1";

/// The `/device` handler. Its `Upgrade` is extracted before it runs: a
/// request that is no WebSocket upgrade is answered (400, 405, 426) before
/// any check of its Origin or Host, as it always was.
async fn device_route(
    State(devices): State<Devices>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    accepted: Option<axum::Extension<Accepted>>,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Response {
    if let Some(why) = refusal(&devices, &headers) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let vessel = devices.vessel;
    // A proxy header says the peer is elsewhere, whatever the listener.
    let off_loopback = devices.hosts.is_none()
        || headers.contains_key(header::FORWARDED)
        || headers.contains_key("x-forwarded-for");
    let secure = offers_dk2(&headers) && vessel.identity().is_some();
    if !secure && !plain_v1_allowed(vessel.limits().plain_v1, off_loopback) {
        vessel
            .stats()
            .plain_v1_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = dk_proto::admin::ErrorBody {
            error: "this vessel accepts devices here only over dk/2, the encrypted channel: \
                    the device must ask for the WebSocket subprotocol `dk.2`"
                .to_owned(),
        };
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    // An upgrade over the address's cap on unauthenticated connections
    // waits its turn for up to half the handshake deadline, which counts
    // from the connect.
    let patience = vessel.limits().handshake_timeout / 2;
    let mut permit = match vessel.admit_waiting(Some(remote.ip()), patience).await {
        Ok(permit) => permit,
        // The vessel is up and at a connection cap: `Retry-After` tells the
        // device to come back soon rather than back off as from a vessel
        // that is down (docs/PROTOCOL.md, "Connection caps").
        Err(why) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, BUSY_RETRY_AFTER_SECS)],
                why.to_string(),
            )
                .into_response();
        }
    };
    if let Some(axum::Extension(Accepted(at))) = accepted {
        permit.accepted_at(at);
    }
    if off_loopback {
        permit.off_loopback();
    }
    // One byte over the limit still reaches the frame parser, which closes
    // with 1009 and a reason; anything larger is refused by the socket layer.
    // A vessel that admits streaming kinds reads binary messages up to twice
    // the largest chunk cap, so a chunk over its cap is dropped and reported
    // rather than ending the connection. Over dk/2 every message is one
    // Noise message: one byte over its limit reaches the channel, which
    // fails it.
    let max = if secure {
        dk_channel::MAX_MESSAGE + 1
    } else {
        vessel
            .limits()
            .max_frame_bytes
            .max(vessel.largest_stream_message().unwrap_or(0))
            .saturating_add(1)
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
        // The socket layer's default read buffer (128 KiB, zero-filled) would
        // dominate an idle connection's memory; it grows when a frame needs it.
        .read_buffer_size(READ_BUFFER_BYTES);
    let protocol = secure.then_some(dk_channel::SUBPROTOCOL);
    upgrade.accept(protocol, config, move |socket| async move {
        serve_socket(&vessel, permit, socket, secure).await;
    })
}

/// Why a request to `/device` is no WebSocket upgrade, answered as axum's
/// upgrade extractor answered it (status and text), so clients see what
/// they always saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotAnUpgrade {
    /// A method other than `GET` (a `HEAD` is routed as a `GET`).
    MethodNotGet,
    /// No `upgrade` in the `Connection` header.
    Connection,
    /// An `Upgrade` header other than `websocket`.
    UpgradeHeader,
    /// No `Sec-WebSocket-Key` header.
    MissingKey,
    /// A `Sec-WebSocket-Version` other than 13.
    Version,
    /// hyper cannot hand the connection over (an HTTP/1.0 request).
    NotUpgradable,
}

impl NotAnUpgrade {
    fn status(self) -> StatusCode {
        match self {
            NotAnUpgrade::MethodNotGet => StatusCode::METHOD_NOT_ALLOWED,
            NotAnUpgrade::NotUpgradable => StatusCode::UPGRADE_REQUIRED,
            NotAnUpgrade::Connection
            | NotAnUpgrade::UpgradeHeader
            | NotAnUpgrade::MissingKey
            | NotAnUpgrade::Version => StatusCode::BAD_REQUEST,
        }
    }

    fn text(self) -> &'static str {
        match self {
            NotAnUpgrade::MethodNotGet => "Request method must be `GET`",
            NotAnUpgrade::Connection => "Connection header did not include 'upgrade'",
            NotAnUpgrade::UpgradeHeader => "`Upgrade` header did not include 'websocket'",
            NotAnUpgrade::MissingKey => "`Sec-WebSocket-Key` header missing",
            NotAnUpgrade::Version => "`Sec-WebSocket-Version` header did not include '13'",
            NotAnUpgrade::NotUpgradable => {
                "WebSocket request couldn't be upgraded since no upgrade state was present"
            }
        }
    }
}

impl IntoResponse for NotAnUpgrade {
    fn into_response(self) -> Response {
        (self.status(), self.text()).into_response()
    }
}

/// A request that asks for a WebSocket as RFC 6455 (section 4.2.1) says,
/// with what answering it takes: its key and hyper's handle on the
/// connection once the answer is out.
struct Upgrade {
    key: HeaderValue,
    on_upgrade: OnUpgrade,
}

/// The first `name` header, if any.
fn first<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a [u8]> {
    headers.get(name).map(HeaderValue::as_bytes)
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = NotAnUpgrade;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Upgrade, NotAnUpgrade> {
        if parts.method != Method::GET {
            return Err(NotAnUpgrade::MethodNotGet);
        }
        let headers = &parts.headers;
        // `upgrade` anywhere in the first `Connection` header, in any case.
        let connection_upgrade = first(headers, &header::CONNECTION)
            .and_then(|value| std::str::from_utf8(value).ok())
            .is_some_and(|value| value.to_ascii_lowercase().contains("upgrade"));
        if !connection_upgrade {
            return Err(NotAnUpgrade::Connection);
        }
        if !first(headers, &header::UPGRADE).is_some_and(|v| v.eq_ignore_ascii_case(b"websocket")) {
            return Err(NotAnUpgrade::UpgradeHeader);
        }
        let key = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .cloned()
            .ok_or(NotAnUpgrade::MissingKey)?;
        if !first(headers, &header::SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v.eq_ignore_ascii_case(b"13"))
        {
            return Err(NotAnUpgrade::Version);
        }
        let on_upgrade = parts
            .extensions
            .remove::<OnUpgrade>()
            .ok_or(NotAnUpgrade::NotUpgradable)?;
        Ok(Upgrade { key, on_upgrade })
    }
}

/// The socket of an upgraded device connection.
type Socket = WebSocketStream<TokioIo<Upgraded>>;

impl Upgrade {
    /// Answers 101 with the accept key and `protocol` chosen, and once hyper
    /// hands the connection over runs `serve` on it as a WebSocket with
    /// `config`. The task holds whatever `serve` holds (the connection's
    /// permit): the vessel's drain awaits it; a connection that goes away
    /// before the handover ends it.
    fn accept<F, Fut>(
        self,
        protocol: Option<&'static str>,
        config: WebSocketConfig,
        serve: F,
    ) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Ok(accept) = HeaderValue::try_from(derive_accept_key(self.key.as_bytes())) else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let on_upgrade = self.on_upgrade;
        tokio::spawn(async move {
            let upgraded = match on_upgrade.await {
                Ok(upgraded) => upgraded,
                Err(error) => {
                    tracing::debug!(%error, "a device connection went away during the upgrade");
                    return;
                }
            };
            let socket = WebSocketStream::from_raw_socket(
                TokioIo::new(upgraded),
                Role::Server,
                Some(config),
            )
            .await;
            serve(socket).await;
        });
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        if let Some(protocol) = protocol {
            headers.insert(
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_static(protocol),
            );
        }
        response
    }
}

/// Whether the upgrade asks for dk/2: `dk.2` among the offered subprotocols
/// (an offer that lists it among others selects it).
fn offers_dk2(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|offered| offered.trim() == dk_channel::SUBPROTOCOL)
}

/// Whether a v1 upgrade may go on: as the vessel's configuration says, and
/// by default only on loopback.
fn plain_v1_allowed(policy: PlainV1, off_loopback: bool) -> bool {
    match policy {
        PlainV1::Never => false,
        PlainV1::Loopback => !off_loopback,
        PlainV1::Everywhere => true,
    }
}

async fn serve_socket(
    vessel: &Arc<Vessel>,
    permit: crate::vessel::ConnectionPermit,
    socket: Socket,
    secure: bool,
) {
    let (sink, stream) = socket.split();
    let outgoing = sink.with(|message: WireMessage| {
        std::future::ready(Ok::<_, tungstenite::Error>(to_ws(message)))
    });
    // A raw frame is never read; were one, it is passed over.
    let stream = stream.filter_map(|message| {
        std::future::ready(match message {
            Ok(message) => from_ws(message).map(Ok),
            Err(error) => Some(Err(error)),
        })
    });
    let outcome = if secure {
        // A message the socket layer refused (over the size limit) fails the
        // channel: it is passed on as the one thing dk/2 never accepts, a
        // text message, and the stream ends there.
        let incoming = stream
            .scan(false, |failed, message| {
                if *failed {
                    return std::future::ready(None);
                }
                *failed = message.is_err();
                std::future::ready(Some(
                    message.unwrap_or_else(|_| WireMessage::Text(String::new())),
                ))
            })
            .boxed();
        serve_secure_connection(vessel, permit, incoming, outgoing).await
    } else {
        // A socket error ends the stream: the connection is gone.
        let incoming = stream
            .take_while(|message| std::future::ready(message.is_ok()))
            .filter_map(|message| std::future::ready(message.ok()));
        serve_connection(vessel, permit, Box::pin(incoming), outgoing).await
    };
    // Plain values, each its own field: no Rust debug text in a log.
    let closed = outcome.closed_with.as_ref();
    tracing::debug!(
        device = outcome.device_id.as_deref(),
        close_code = closed.map(|c| c.code),
        close_reason = closed.map(|c| c.reason.as_str()),
        "device connection ended"
    );
}

/// The message as the vessel's connection reads it; `None` for a raw frame,
/// which reading never yields.
fn from_ws(message: Message) -> Option<WireMessage> {
    Some(match message {
        Message::Text(text) => WireMessage::Text(text.as_str().to_owned()),
        Message::Binary(bytes) => WireMessage::Binary(bytes.to_vec()),
        Message::Ping(bytes) => WireMessage::Ping(bytes.to_vec()),
        Message::Pong(bytes) => WireMessage::Pong(bytes.to_vec()),
        Message::Close(frame) => WireMessage::Close(frame.map(|f| CloseFrame {
            code: f.code.into(),
            reason: f.reason.as_str().to_owned(),
        })),
        Message::Frame(_) => return None,
    })
}

fn to_ws(message: WireMessage) -> Message {
    match message {
        WireMessage::Text(text) => Message::Text(text.into()),
        WireMessage::Binary(bytes) => Message::Binary(bytes.into()),
        WireMessage::Ping(bytes) => Message::Ping(bytes.into()),
        WireMessage::Pong(bytes) => Message::Pong(bytes.into()),
        WireMessage::Close(frame) => Message::Close(frame.map(|f| WsClose {
            code: f.code.into(),
            reason: f.reason.into(),
        })),
    }
}

#[cfg(test)]
mod redact_tests;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
