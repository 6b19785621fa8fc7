//! A small client for the admin API, over HTTP/1.1 on loopback: what the
//! `dk` command line and the tests use.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::admin::AdminToken;

/// Why a request to the admin API failed before an answer came.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    /// The vessel could not be reached.
    #[error("cannot reach the vessel at {addr}: {source}")]
    Connect {
        /// Where it was looked for.
        addr: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("admin request failed: {0}")]
    Http(String),
}

/// An answer: the status code and the JSON body (`null` when empty).
#[derive(Debug, Clone, PartialEq)]
pub struct AdminAnswer {
    /// HTTP status.
    pub status: u16,
    /// The body as JSON, `Value::Null` when empty or not JSON.
    pub body: Value,
}

/// Talks to one vessel's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    addr: SocketAddr,
    token: AdminToken,
}

impl AdminClient {
    /// A client for the admin API at `addr`.
    pub fn new(addr: SocketAddr, token: AdminToken) -> AdminClient {
        AdminClient { addr, token }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<AdminAnswer, AdminClientError> {
        self.send("GET", path, None, &[]).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<AdminAnswer, AdminClientError> {
        self.send("POST", path, Some(body), &[]).await
    }

    /// `PUT path`.
    pub async fn put(&self, path: &str) -> Result<AdminAnswer, AdminClientError> {
        self.send("PUT", path, None, &[]).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<AdminAnswer, AdminClientError> {
        self.send("DELETE", path, None, &[]).await
    }

    /// Any request; `headers` replace the defaults (`Host`, `Authorization`)
    /// of the same name, which is how tests forge a foreign Origin or Host.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<AdminAnswer, AdminClientError> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|source| AdminClientError::Connect {
                addr: self.addr,
                source,
            })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| AdminClientError::Http(e.to_string()))?;
        let bearer = format!("Bearer {}", self.token.expose());
        let host = self.addr.to_string();
        let mut builder = Request::builder().method(method).uri(path);
        let overridden = |name: &str| headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(name));
        if !overridden("host") {
            builder = builder.header("host", host.as_str());
        }
        if !overridden("authorization") {
            builder = builder.header("authorization", bearer.as_str());
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let payload = match body {
            Some(value) => {
                builder = builder.header("content-type", "application/json");
                Bytes::from(value.to_string())
            }
            None => Bytes::new(),
        };
        let request = builder
            .body(Full::new(payload))
            .map_err(|e| AdminClientError::Http(e.to_string()))?;
        let exchange = async move {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| AdminClientError::Http(e.to_string()))?;
            let status = response.status().as_u16();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| AdminClientError::Http(e.to_string()))?
                .to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            Ok(AdminAnswer { status, body })
        };
        // The connection is driven until the answer is read; if it ends
        // first, the exchange reports how.
        tokio::pin!(exchange);
        tokio::select! {
            biased;
            answer = &mut exchange => answer,
            _ = connection => exchange.await,
        }
    }
}
