//! The `/device` route over real loopback sockets: who may open it, and a
//! handshake deadline that counts from the connect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dk_policy::PolicySet;
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::serve_devices_with;
use crate::connection::{WireMessage, serve_connection};
use crate::listen::HttpLimits;
use crate::vessel::{Limits, Vessel};
use dk_proto::CloseCode;

struct Served {
    vessel: Arc<Vessel>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(limits: Limits) -> Served {
        Served::start_with(limits, HttpLimits::default()).await
    }

    async fn start_with(limits: Limits, http: HttpLimits) -> Served {
        let vessel = Vessel::new(PolicySet::empty(), limits);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let serve = Arc::clone(&vessel);
        let task = tokio::spawn(async move {
            serve_devices_with(listener, serve, http, async move {
                let _ = stopped.await;
            })
            .await
        });
        Served {
            vessel,
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.unwrap().unwrap();
    }

    /// Opens `/device` with `headers` set (or replaced); the HTTP status of
    /// the answer (101 when upgraded).
    async fn upgrade_status(&self, headers: &[(&str, &str)]) -> u16 {
        let mut request = format!("ws://{}/device", self.addr)
            .into_client_request()
            .unwrap();
        for (name, value) in headers {
            let name =
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes())
                    .unwrap();
            request
                .headers_mut()
                .insert(name, HeaderValue::from_str(value).unwrap());
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((_, response)) => response.status().as_u16(),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                response.status().as_u16()
            }
            Err(other) => panic!("unexpected failure: {other}"),
        }
    }
}

#[track_caller]
fn check(status: u16, expected: u16, headers: &[(&str, &str)]) {
    assert_eq!(status, expected, "{headers:?}");
}

#[tokio::test]
async fn a_web_page_cannot_open_the_device_route() {
    let served = Served::start(Limits::default()).await;
    let own = served.addr.to_string();
    let port = served.addr.port();
    let localhost = format!("localhost:{port}");
    let cases: Vec<(Vec<(&str, &str)>, u16)> = vec![
        // A native device: no Origin, the listener's own Host.
        (vec![], 101),
        (vec![("Host", localhost.as_str())], 101),
        // A page in the person's browser.
        (vec![("Origin", "https://evil.example")], 403),
        (vec![("Origin", "null")], 403),
        (vec![("Origin", "http://127.0.0.1")], 403),
        // A rebinding DNS name pointing at loopback.
        (vec![("Host", "evil.example")], 403),
        (vec![("Host", "evil.example:7777")], 403),
        (
            vec![("Host", own.as_str()), ("Origin", "https://evil.example")],
            403,
        ),
    ];
    for (headers, expected) in &cases {
        check(served.upgrade_status(headers).await, *expected, headers);
    }
    // Nothing the refused requests did reached the person.
    assert!(served.vessel.person().pending().is_empty());
    served.stop().await;
}

#[tokio::test]
async fn an_origin_the_person_allowed_may_open_it() {
    let served = Served::start_with(
        Limits::default(),
        HttpLimits {
            device_origins: vec!["https://bridge.example".to_owned()],
            ..HttpLimits::default()
        },
    )
    .await;
    let allowed = [("Origin", "https://bridge.example")];
    check(served.upgrade_status(&allowed).await, 101, &allowed);
    let other = [("Origin", "https://evil.example")];
    check(served.upgrade_status(&other).await, 403, &other);
    served.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_handshake_deadline_counts_from_the_connect() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let timeout = vessel.limits().handshake_timeout;
    let mut permit = vessel.admit(None).unwrap();
    // The connection was accepted most of the deadline ago (a slow
    // upgrade): only the rest is left for the first frame.
    let accepted = tokio::time::Instant::now() - (timeout - Duration::from_secs(1));
    permit.accepted_at(accepted);
    let started = tokio::time::Instant::now();
    let incoming = futures::stream::pending::<WireMessage>();
    let (sink, _sent) = futures::channel::mpsc::unbounded::<WireMessage>();
    let outcome = serve_connection(&vessel, permit, incoming.boxed(), sink).await;
    assert_eq!(
        outcome.closed_with.map(|c| c.code),
        Some(CloseCode::HandshakeTimeout.code())
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test]
async fn a_second_or_unreadable_origin_or_host_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let served = Served::start(Limits::default()).await;
    let addr = served.addr;
    let upgrade = |extra: &str| {
        format!(
            "GET /device HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
        )
        .into_bytes()
    };
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (upgrade(""), "101"),
        (upgrade("Host: evil.example\r\n"), "403"),
        (
            upgrade("Origin: https://evil.example\r\nOrigin: null\r\n"),
            "403",
        ),
    ];
    let mut non_ascii = upgrade("");
    let end = non_ascii.len() - 2;
    non_ascii.splice(
        end..end,
        b"Origin: https://\xc3\xa9vil.example\r\n".iter().copied(),
    );
    cases.push((non_ascii, "403"));
    for (request, expected) in cases {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(&request).await.unwrap();
        let mut answer = [0u8; 12];
        stream.read_exact(&mut answer).await.unwrap();
        let status = String::from_utf8_lossy(&answer[9..12]).into_owned();
        assert_eq!(status, expected, "{}", String::from_utf8_lossy(&request));
    }
    served.stop().await;
}

/// Sends `request` as it is on a fresh connection; the answer's status, its
/// header block (lower-cased) and its body (none to a `HEAD`).
async fn raw_answer(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut read = Vec::new();
    let head_end = loop {
        if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the answer's head");
        read.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(read[..head_end].to_vec())
        .unwrap()
        .to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .filter(|_| !request.starts_with(b"HEAD "))
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |n| n.trim().parse().unwrap());
    let mut body = read[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the answer's body");
        body.extend_from_slice(&chunk[..n]);
    }
    (status, head, String::from_utf8(body).unwrap())
}

#[tokio::test]
async fn a_request_that_is_no_websocket_upgrade_is_answered_as_http() {
    let served = Served::start(Limits::default()).await;
    let addr = served.addr;
    // An upgrade request with `drop` header lines left out and `extra` ones
    // added, on `method` and `version`.
    let request = |method: &str, version: &str, drop: &[&str], extra: &str| {
        let lines = [
            format!("Host: {addr}"),
            "Connection: Upgrade".to_owned(),
            "Upgrade: websocket".to_owned(),
            "Sec-WebSocket-Version: 13".to_owned(),
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==".to_owned(),
        ];
        let kept: String = lines
            .iter()
            .filter(|line| !drop.iter().any(|d| line.starts_with(d)))
            .map(|line| format!("{line}\r\n"))
            .collect();
        format!("{method} /device {version}\r\n{kept}{extra}\r\n").into_bytes()
    };
    let connection = "Connection: keep-alive\r\n";
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (
            request("GET", "HTTP/1.1", &["Connection"], ""),
            400,
            "Connection header did not include 'upgrade'",
        ),
        (
            request("GET", "HTTP/1.1", &["Connection"], connection),
            400,
            "Connection header did not include 'upgrade'",
        ),
        (
            request("GET", "HTTP/1.1", &["Upgrade"], ""),
            400,
            "`Upgrade` header did not include 'websocket'",
        ),
        (
            request("GET", "HTTP/1.1", &["Upgrade"], "Upgrade: h2c\r\n"),
            400,
            "`Upgrade` header did not include 'websocket'",
        ),
        (
            request("GET", "HTTP/1.1", &["Sec-WebSocket-Version"], ""),
            400,
            "`Sec-WebSocket-Version` header did not include '13'",
        ),
        (
            request(
                "GET",
                "HTTP/1.1",
                &["Sec-WebSocket-Version"],
                "Sec-WebSocket-Version: 8\r\n",
            ),
            400,
            "`Sec-WebSocket-Version` header did not include '13'",
        ),
        (
            request("GET", "HTTP/1.1", &["Sec-WebSocket-Key"], ""),
            400,
            "`Sec-WebSocket-Key` header missing",
        ),
        // The upgrade is checked before the Origin.
        (
            request(
                "GET",
                "HTTP/1.1",
                &["Sec-WebSocket-Key"],
                "Origin: https://evil.example\r\n",
            ),
            400,
            "`Sec-WebSocket-Key` header missing",
        ),
        // HTTP/1.0 has no upgrade.
        (
            request("GET", "HTTP/1.0", &[], ""),
            426,
            "WebSocket request couldn't be upgraded since no upgrade state was present",
        ),
        (request("POST", "HTTP/1.1", &[], ""), 405, ""),
    ];
    for (sent, status, body) in &cases {
        let (got, head, got_body) = raw_answer(addr, sent).await;
        let sent = String::from_utf8_lossy(sent);
        assert_eq!((got, got_body.as_str()), (*status, *body), "{sent}");
        if !body.is_empty() {
            assert!(
                head.contains("content-type: text/plain; charset=utf-8\r\n"),
                "{sent}{head}"
            );
        }
    }
    // A HEAD is routed as a GET, and refused as no upgrade.
    let (got, _, _) = raw_answer(addr, &request("HEAD", "HTTP/1.1", &[], "")).await;
    assert_eq!(got, 405);
    // A good upgrade: the accept key of RFC 6455's example, no subprotocol.
    let (got, head, _) = raw_answer(addr, &request("GET", "HTTP/1.1", &[], "")).await;
    assert_eq!(got, 101, "{head}");
    for line in [
        "connection: upgrade\r\n",
        "upgrade: websocket\r\n",
        "sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n",
    ] {
        assert!(head.contains(line), "{line} in {head}");
    }
    assert!(!head.contains("sec-websocket-protocol"), "{head}");
    served.stop().await;
}
