//! A small client for the admin API, over HTTP/1.1 on a Unix socket (what
//! the `dk` command line uses) or on loopback TCP (what tests also use).
//! Bodies are `dk_proto::admin`'s types, the ones the server uses.

use std::net::SocketAddr;
use std::path::PathBuf;

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::admin::AdminToken;
use crate::unix::{PrivateFileError, connect_private_socket};

/// Why a request to the admin API failed before an answer came.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminClientError {
    /// The vessel could not be reached.
    #[error("cannot reach the vessel at {addr}: {source}")]
    Connect {
        /// Where it was looked for.
        addr: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The vessel's socket was refused (not a socket of this user) or
    /// nothing answers on it.
    #[error("cannot reach the vessel: {0}")]
    Socket(#[source] PrivateFileError),
    /// The HTTP exchange failed.
    #[error("admin request failed: {0}")]
    Http(String),
    /// A request body could not be written, or an answer's body does not
    /// read as what the route answers.
    #[error("the admin API's body does not read: {0}")]
    Body(#[from] serde_json::Error),
}

/// An answer: the status code and the JSON body (`null` when empty).
#[derive(Debug, Clone, PartialEq)]
pub struct AdminAnswer {
    /// HTTP status.
    pub status: u16,
    /// The body as JSON, `Value::Null` when empty or not JSON.
    pub body: Value,
}

impl AdminAnswer {
    /// Whether the status is a success (2xx).
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body read as `T`, one of `dk_proto::admin`'s answers.
    pub fn read<T: DeserializeOwned>(&self) -> Result<T, AdminClientError> {
        Ok(T::deserialize(&self.body)?)
    }

    /// The vessel's reason for a refusal (`{"error": ...}`), if it gave one.
    pub fn error(&self) -> Option<String> {
        if self.is_success() {
            return None;
        }
        self.read::<dk_proto::admin::ErrorBody>()
            .ok()
            .map(|body| body.error)
    }
}

/// Where the admin API is.
#[derive(Debug, Clone)]
enum Place {
    /// A loopback TCP listener.
    Tcp(SocketAddr),
    /// A Unix socket, used only once it is shown to be this user's.
    Unix(PathBuf),
}

/// Talks to one vessel's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    place: Place,
    token: AdminToken,
}

impl AdminClient {
    /// A client for the admin API at `addr`. Whatever listens there gets
    /// the token: the person's commands use [`AdminClient::over_socket`].
    pub fn new(addr: SocketAddr, token: AdminToken) -> AdminClient {
        AdminClient {
            place: Place::Tcp(addr),
            token,
        }
    }

    /// A client for the admin API on the Unix socket at `socket`. Each
    /// request first checks that the socket is owned by this user, so the
    /// token goes only to a vessel this user runs.
    pub fn over_socket(socket: impl Into<PathBuf>, token: AdminToken) -> AdminClient {
        AdminClient {
            place: Place::Unix(socket.into()),
            token,
        }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<AdminAnswer, AdminClientError> {
        self.send("GET", path, None, &[]).await
    }

    /// `POST path` with a JSON body (a `dk_proto::admin` request).
    pub async fn post(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<AdminAnswer, AdminClientError> {
        let body = serde_json::to_value(body)?;
        self.send("POST", path, Some(&body), &[]).await
    }

    /// `PUT path` with a JSON body (a `dk_proto::admin` request).
    pub async fn put_body(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<AdminAnswer, AdminClientError> {
        let body = serde_json::to_value(body)?;
        self.send("PUT", path, Some(&body), &[]).await
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
        let bearer = format!("Bearer {}", self.token.expose());
        let host = match &self.place {
            Place::Tcp(addr) => addr.to_string(),
            Place::Unix(_) => "localhost".to_owned(),
        };
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
        match &self.place {
            Place::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|source| AdminClientError::Connect {
                        addr: *addr,
                        source,
                    })?;
                exchange(stream, request).await
            }
            Place::Unix(path) => {
                let stream = connect_private_socket(path)
                    .await
                    .map_err(AdminClientError::Socket)?;
                exchange(stream, request).await
            }
        }
    }
}

/// Sends `request` over `stream` and reads the answer.
async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<AdminAnswer, AdminClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
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
