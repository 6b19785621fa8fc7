//! A bare WebSocket route for the benches' baselines: the upgrade answered
//! on hyper under an axum router, as dk-http's `/device` route answers it,
//! then tokio-tungstenite's socket with its default limits. Included with
//! `#[path]` by the benches that compare the vessel with a bare route.

use std::future::Future;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// The socket of an upgraded connection.
pub type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// Answers the upgrade `request` with 101 and runs `serve` on the socket
/// once hyper hands the connection over; 400 to a request without a
/// `Sec-WebSocket-Key` or one hyper cannot upgrade.
pub fn upgrade<F, Fut>(mut request: Request, serve: F) -> Response
where
    F: FnOnce(Socket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let accept = request
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|key| HeaderValue::try_from(derive_accept_key(key.as_bytes())).ok());
    let Some(accept) = accept else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let socket =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            serve(socket).await;
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    response
}
