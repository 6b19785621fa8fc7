//! The `/device` WebSocket route: admits a connection (total and
//! per-address limits), upgrades it, and hands it to
//! [`serve_connection`](crate::serve_connection). axum and tungstenite types
//! stay inside this module.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{CloseFrame as WsClose, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;

use crate::connection::{CloseFrame, WireMessage, serve_connection};
use crate::vessel::Vessel;

/// Initial read buffer per device connection.
const READ_BUFFER_BYTES: usize = 4 * 1024;

/// How long a shutting-down vessel waits for its connections to close.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// The router with the `/device` route, for embedding in a larger app.
pub fn device_router(vessel: Arc<Vessel>) -> Router {
    Router::new()
        .route("/device", get(device_route))
        .with_state(vessel)
}

/// Serves the `/device` route on `listener` until `shutdown` resolves; then
/// every device connection is closed (code 1001) and awaited.
pub async fn serve_devices(
    listener: TcpListener,
    vessel: Arc<Vessel>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app =
        device_router(Arc::clone(&vessel)).into_make_service_with_connect_info::<SocketAddr>();
    let closing = Arc::clone(&vessel);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            closing.shut_down();
        })
        .await;
    vessel.shut_down();
    vessel.drained(DRAIN_PATIENCE).await;
    result
}

async fn device_route(
    upgrade: WebSocketUpgrade,
    State(vessel): State<Arc<Vessel>>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
) -> Response {
    let permit = match vessel.admit(Some(remote.ip())) {
        Ok(permit) => permit,
        Err(why) => return (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    };
    // One byte over the limit still reaches the frame parser, which closes
    // with 1009 and a reason; anything larger is refused by the socket layer.
    // A vessel that admits streaming kinds reads binary messages up to twice
    // the largest chunk cap, so a chunk over its cap is dropped and reported
    // rather than ending the connection.
    let max = vessel
        .limits()
        .max_frame_bytes
        .max(vessel.streams().largest_message().unwrap_or(0))
        .saturating_add(1);
    upgrade
        .max_message_size(max)
        .max_frame_size(max)
        // The socket layer's default read buffer (128 KiB, zero-filled) would
        // dominate an idle connection's memory; it grows when a frame needs it.
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            serve_socket(&vessel, permit, socket).await;
        })
}

async fn serve_socket(
    vessel: &Arc<Vessel>,
    permit: crate::vessel::ConnectionPermit,
    socket: WebSocket,
) {
    let (sink, stream) = socket.split();
    // A socket error ends the stream: the connection is gone.
    let incoming = stream
        .take_while(|message| std::future::ready(message.is_ok()))
        .filter_map(|message| std::future::ready(message.ok().map(from_ws)));
    let outgoing =
        sink.with(|message: WireMessage| std::future::ready(Ok::<_, axum::Error>(to_ws(message))));
    let incoming = Box::pin(incoming);
    let outcome = serve_connection(vessel, permit, incoming, outgoing).await;
    tracing::debug!(device = ?outcome.device_id, closed = ?outcome.closed_with, "device connection ended");
}

fn from_ws(message: Message) -> WireMessage {
    match message {
        Message::Text(text) => WireMessage::Text(text.as_str().to_owned()),
        Message::Binary(bytes) => WireMessage::Binary(bytes.to_vec()),
        Message::Ping(bytes) => WireMessage::Ping(bytes.to_vec()),
        Message::Pong(bytes) => WireMessage::Pong(bytes.to_vec()),
        Message::Close(frame) => WireMessage::Close(frame.map(|f| CloseFrame {
            code: f.code,
            reason: f.reason.as_str().to_owned(),
        })),
    }
}

fn to_ws(message: WireMessage) -> Message {
    match message {
        WireMessage::Text(text) => Message::Text(text.into()),
        WireMessage::Binary(bytes) => Message::Binary(bytes.into()),
        WireMessage::Ping(bytes) => Message::Ping(bytes.into()),
        WireMessage::Pong(bytes) => Message::Pong(bytes.into()),
        WireMessage::Close(frame) => Message::Close(frame.map(|f| WsClose {
            code: f.code,
            reason: f.reason.into(),
        })),
    }
}
