//! The listener over real loopback sockets: caps counted from `accept`, the
//! header-read deadline, the idle timeout, and a request being answered
//! never taken for idling.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;

use super::{Accepted, ListenerLimits, ListenerStats, serve_http};

/// A listener serving `/` (answers at once) and `/slow` (after 600 ms),
/// and `/accepted` (whether the request carries its accept instant).
struct Served {
    addr: SocketAddr,
    stats: Arc<ListenerStats>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(limits: ListenerLimits) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/", get(|| async { "ok" }))
            .route(
                "/slow",
                get(|| async {
                    // A slow answer: the handler holds its connection 600 ms.
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "slow"
                }),
            )
            .route(
                "/accepted",
                get(|accepted: Option<axum::Extension<Accepted>>| async move {
                    if accepted.is_some() { "yes" } else { "no" }
                }),
            );
        let stats = Arc::new(ListenerStats::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_http(
            listener,
            router,
            limits,
            Arc::clone(&stats),
            async move {
                let _ = stopped.await;
            },
        ));
        Served {
            addr,
            stats,
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
}

fn limits() -> ListenerLimits {
    ListenerLimits {
        max_connections: 6,
        max_connections_per_address: 4,
        header_read_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_secs(30),
    }
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("any 127/8 address is loopback on this system");
    socket.connect(to).await.unwrap()
}

/// Reads until the peer closes; returns what came (an error counts as a
/// close: a reset is how some closes arrive).
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
    }
}

/// Whether the peer closed `stream` within `patience` (it reads nothing
/// else meanwhile).
async fn closed_within(stream: &mut TcpStream, patience: Duration) -> bool {
    tokio::time::timeout(patience, read_to_close(stream))
        .await
        .is_ok()
}

async fn get_once(stream: &mut TcpStream, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if text
            .split_once("\r\n\r\n")
            .is_some_and(|(_, body)| !body.is_empty())
        {
            return text;
        }
    }
}

#[tokio::test]
async fn caps_per_address_and_in_total_hold_from_accept() {
    let served = Served::start(limits()).await;
    // Four half-sent requests from one address are held; the fifth is
    // closed before it can send anything useful.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = connect_from([127, 0, 0, 2], served.addr).await;
        stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(stream);
    }
    let mut fifth = connect_from([127, 0, 0, 2], served.addr).await;
    assert!(closed_within(&mut fifth, Duration::from_secs(5)).await);
    // Another address still gets in, up to the total of six.
    let mut other = Vec::new();
    for _ in 0..2 {
        other.push(connect_from([127, 0, 0, 3], served.addr).await);
    }
    let answer = get_once(other.first_mut().unwrap(), "/").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut seventh = connect_from([127, 0, 0, 4], served.addr).await;
    assert!(closed_within(&mut seventh, Duration::from_secs(5)).await);
    assert_eq!(served.stats.refused_at_accept.load(Ordering::Relaxed), 2);
    assert_eq!(served.stats.open.load(Ordering::Relaxed), 6);
    assert_eq!(served.stats.peak.load(Ordering::Relaxed), 6);
    // Slots come back when connections close.
    drop(other);
    drop(held);
    let again = dk_testkit::eventually_async("a slot again", || async {
        let mut stream = connect_from([127, 0, 0, 2], served.addr).await;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        stream.read_exact(&mut buf).await.ok().map(|_| buf)
    })
    .await;
    assert_eq!(&again[..], &b"HTTP/1.1 200"[..]);
    served.stop().await;
}

#[tokio::test]
async fn headers_that_never_finish_are_cut_at_the_deadline() {
    let served = Served::start(limits()).await;
    // Sends nothing at all.
    let mut silent = connect_from([127, 0, 0, 5], served.addr).await;
    // Half a request, then nothing.
    let mut half = connect_from([127, 0, 0, 5], served.addr).await;
    half.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // One byte at a time, never finishing: the deadline counts from the
    // accept, not from the last byte.
    let mut dribble = connect_from([127, 0, 0, 6], served.addr).await;
    let dribbling = tokio::spawn(async move {
        let request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ".repeat(20);
        for byte in request {
            if dribble.write_all(&[byte]).await.is_err() {
                return true;
            }
            // Paces the dribble: a byte every 50 ms.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    });
    let patience = Duration::from_secs(10);
    assert!(closed_within(&mut silent, patience).await);
    assert!(closed_within(&mut half, patience).await);
    assert!(
        dribbling.await.unwrap(),
        "the dribbling request was never cut off"
    );
    // A request that arrives whole is answered.
    let mut good = connect_from([127, 0, 0, 7], served.addr).await;
    let answer = get_once(&mut good, "/accepted").await;
    assert!(answer.ends_with("yes"), "{answer}");
    served.stop().await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_but_one_being_answered_is_not() {
    let served = Served::start(ListenerLimits {
        // Long enough that only the idle timeout can close the connection.
        header_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_millis(300),
        ..limits()
    })
    .await;
    // The answer takes twice the idle timeout: the connection is busy, not
    // idle.
    let mut busy = connect_from([127, 0, 0, 8], served.addr).await;
    let answer = get_once(&mut busy, "/slow").await;
    assert!(answer.ends_with("slow"), "{answer}");
    // Then it sits: closed for idling.
    assert!(closed_within(&mut busy, Duration::from_secs(10)).await);
    assert!(served.stats.idle_closed.load(Ordering::Relaxed) >= 1);
    served.stop().await;
}

#[tokio::test]
async fn a_stopping_listener_ends_its_connections() {
    let served = Served::start(limits()).await;
    let mut open = connect_from([127, 0, 0, 9], served.addr).await;
    let answer = get_once(&mut open, "/").await;
    assert!(answer.ends_with("ok"), "{answer}");
    served.stop().await;
    assert!(closed_within(&mut open, Duration::from_secs(10)).await);
}
