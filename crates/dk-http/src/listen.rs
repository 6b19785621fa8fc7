//! How every HTTP listener of the vessel (the `/device` route, the admin
//! API, `/mcp`, on TCP and on the Unix sockets of the data directory)
//! accepts connections, instead of `axum::serve`:
//!
//! - connections are counted from `accept`, in total and per remote address,
//!   before a single byte of a request is read; one over a cap is closed at
//!   once;
//! - a request's headers must be complete within the header-read deadline,
//!   counted from `accept` for the first request and from the first byte for
//!   the next ones on a kept-alive connection (hyper's own deadline, with a
//!   timer);
//! - a connection that moves no byte for the idle timeout while no request
//!   is being answered is closed;
//! - a slot is held for as long as the socket lives, an upgraded WebSocket
//!   included;
//! - on shutdown nothing new is accepted and open connections are asked to
//!   finish, then dropped after a patience.
//!
//! Each request carries axum's `ConnectInfo<SocketAddr>` and `Accepted`,
//! the instant its connection was accepted.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use crate::listener::ListenerStats;
use crate::vessel::Limits;

/// Caps and deadlines one listener applies to its connections, from
/// `accept` on. [`HttpLimits`] holds those of the `/device` route and the
/// admin API; dk-mcp's `McpOptions` those of `/mcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections held at once, counted from `accept`.
    pub max_connections: usize,
    /// Connections held at once from one remote address.
    pub max_connections_per_address: usize,
    /// How long a request's headers may take to arrive in full.
    pub header_read_timeout: Duration,
    /// How long a connection may move no byte while nothing is being
    /// answered.
    pub idle_timeout: Duration,
}

/// Caps on the connections one listener holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// In total.
    pub total: usize,
    /// From one remote address.
    pub per_address: usize,
}

/// How long a request's headers may take to arrive in full, on every
/// listener, by default (`limits.headerReadTimeoutMs`).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection on any listener may move no byte while nothing is
/// being answered, by default (`limits.idleTimeoutMs`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the HTTP layer's listeners apply besides the core's admission: the
/// deadlines of every listener, the admin API's connection caps and the
/// `Origin` values the `/device` route allows. The `/device` listener's
/// caps are the core's connection counts ([`Limits::max_connections`],
/// [`Limits::max_connections_per_address`]). `dk vessel`'s configuration
/// file sets them (`[limits]`, `docs/CONFIG.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a request's headers may take to arrive in full, on every
    /// listener (devices, admin API, MCP): from `accept` for a connection's
    /// first request, from its first byte for the next ones (default 10 s).
    pub header_read_timeout: Duration,
    /// How long a connection on any listener may move no byte while no
    /// request on it is being answered (default 60 s).
    pub idle_timeout: Duration,
    /// Connections the admin API's TCP listener (and its Unix socket) holds
    /// at once, in total and from one address, counted from `accept`
    /// (default 512, 128 per address).
    pub admin_connections: ConnectionCaps,
    /// `Origin` values allowed on a `/device` upgrade. Native devices send
    /// none; a request that carries one not listed here (a web page acting
    /// as a device) is refused. Empty by default.
    pub device_origins: Vec<String>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            admin_connections: ConnectionCaps {
                total: 512,
                per_address: 128,
            },
            device_origins: Vec::new(),
        }
    }
}

impl HttpLimits {
    /// What the `/device` listener applies from `accept` on: the core's
    /// connection caps (`limits`), the header-read deadline and the idle
    /// timeout.
    pub fn device_listener(&self, limits: &Limits) -> ListenerLimits {
        self.listener(ConnectionCaps {
            total: limits.max_connections,
            per_address: limits.max_connections_per_address,
        })
    }

    /// What the admin API's listener applies from `accept` on.
    pub fn admin_listener(&self) -> ListenerLimits {
        self.listener(self.admin_connections)
    }

    /// What a listener capped at `caps` applies from `accept` on, with
    /// these deadlines.
    pub fn listener(&self, caps: ConnectionCaps) -> ListenerLimits {
        ListenerLimits {
            max_connections: caps.total,
            max_connections_per_address: caps.per_address,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// The instant a request's connection was accepted: a request extension
/// every listener of the vessel sets, so a deadline can count from the
/// connect (the device handshake does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Accepted(pub(crate) Instant);

/// A listening socket [`serve_http`] accepts from.
pub trait Accept: Send {
    /// A connection's stream.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection and the address it counts under.
    fn next(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;

    async fn next(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        let (stream, remote) = self.accept().await?;
        // An answer goes out as several small writes (headers, an event, the
        // end of a stream): without TCP_NODELAY a client that delays its ACK
        // holds each up for tens of milliseconds.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        Ok((stream, remote))
    }
}

/// The address every connection over a Unix socket counts under (and what
/// `ConnectInfo` says of it): the socket has no remote address, and only
/// the vessel's own user can reach it.
const UNIX_PEER: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

impl Accept for UnixListener {
    type Io = tokio::net::UnixStream;

    async fn next(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, UNIX_PEER))
    }
}

/// How long a stopping listener lets its connections finish.
const SHUTDOWN_PATIENCE: Duration = Duration::from_secs(5);

/// How long the accept loop pauses after an error such as "too many open
/// files", so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The connections a listener holds: in total and per address.
#[derive(Debug, Default)]
struct Gate {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// One listener's gate, limits and counters.
#[derive(Debug)]
struct Slots {
    limits: ListenerLimits,
    gate: Mutex<Gate>,
    stats: Arc<ListenerStats>,
}

impl Slots {
    /// A slot for a connection from `address`, or `None` over a cap.
    fn take(self: &Arc<Self>, address: IpAddr) -> Option<Slot> {
        let mut gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        let here = gate.per_address.get(&address).copied().unwrap_or(0);
        if gate.total >= self.limits.max_connections
            || here >= self.limits.max_connections_per_address
        {
            return None;
        }
        gate.total += 1;
        gate.per_address.insert(address, here + 1);
        self.stats.open.store(gate.total, Ordering::Relaxed);
        self.stats.peak.fetch_max(gate.total, Ordering::Relaxed);
        Some(Slot {
            slots: Arc::clone(self),
            address,
        })
    }
}

/// A connection's place under the caps; given back when dropped.
#[derive(Debug)]
struct Slot {
    slots: Arc<Slots>,
    address: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut gate = self
            .slots
            .gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        gate.total = gate.total.saturating_sub(1);
        self.slots.stats.open.store(gate.total, Ordering::Relaxed);
        if let Some(count) = gate.per_address.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                gate.per_address.remove(&self.address);
            }
        }
    }
}

/// What a connection did last: shared by its socket, its service and its
/// idle watch.
#[derive(Debug)]
struct Activity {
    /// When the connection was accepted; times below count from it.
    start: Instant,
    /// Milliseconds from `start` to the last byte read or written.
    last_ms: AtomicU64,
    /// Requests being answered now.
    in_flight: AtomicUsize,
}

impl Activity {
    fn new(start: Instant) -> Activity {
        Activity {
            start,
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Marks a request being answered; the connection is not idle meanwhile.
struct Answering(Arc<Activity>);

impl Answering {
    fn begin(activity: &Arc<Activity>) -> Answering {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Answering(Arc::clone(activity))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The socket of one connection: notes every byte moved, and holds the
/// connection's slot for as long as it lives (through an upgrade too).
struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
    _slot: Slot,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The router as one connection's hyper service: every request gets the
/// connection's remote address and accept instant, and counts as being
/// answered until its response is ready.
#[derive(Clone)]
struct ConnectionService {
    router: TowerToHyperService<Router>,
    activity: Arc<Activity>,
    remote: SocketAddr,
}

type ServiceFuture = Pin<
    Box<dyn Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send>,
>;

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = ServiceFuture;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        let answering = Answering::begin(&self.activity);
        request.extensions_mut().insert(ConnectInfo(self.remote));
        request
            .extensions_mut()
            .insert(Accepted(self.activity.start));
        let answer = self.router.call(request);
        Box::pin(async move {
            let response = answer.await;
            drop(answering);
            response
        })
    }
}

/// Marks a listener serving ([`ListenerStats::serving`]) while it lives:
/// cleared when the accept loop ends, returns or is dropped.
struct Serving(Arc<ListenerStats>);

impl Serving {
    fn start(stats: Arc<ListenerStats>) -> Serving {
        stats.serving.store(true, Ordering::Relaxed);
        Serving(stats)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.store(false, Ordering::Relaxed);
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves:
/// then nothing new is accepted, open connections are asked to finish and
/// are dropped after a patience of a few seconds. Connections upgraded to
/// another protocol live on in their own tasks, still counted.
pub async fn serve_http(
    mut listener: impl Accept,
    router: Router,
    limits: ListenerLimits,
    stats: Arc<ListenerStats>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let _serving = Serving::start(Arc::clone(&stats));
    let slots = Arc::new(Slots {
        limits,
        gate: Mutex::new(Gate::default()),
        stats: Arc::clone(&stats),
    });
    let service = TowerToHyperService::new(router);
    let (stopping_tx, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            // Finished connection tasks are reaped as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.next() => accepted,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Some(slot) = slots.take(remote.ip()) else {
            stats.refused_at_accept.fetch_add(1, Ordering::Relaxed);
            // Dropping the stream closes it before any byte is read.
            drop(stream);
            continue;
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(Instant::now()));
        let io = Watched {
            inner: stream,
            activity: Arc::clone(&activity),
            _slot: slot,
        };
        let service = ConnectionService {
            router: service.clone(),
            activity: Arc::clone(&activity),
            remote,
        };
        connections.spawn(serve_one(
            io,
            service,
            activity,
            limits,
            Arc::clone(&stats),
            stopping.clone(),
        ));
    }
    stopping_tx.send_replace(true);
    let patience = tokio::time::sleep(SHUTDOWN_PATIENCE);
    tokio::pin!(patience);
    loop {
        tokio::select! {
            next = connections.join_next() => if next.is_none() { break },
            () = &mut patience => {
                connections.abort_all();
                while connections.join_next().await.is_some() {}
                break;
            }
        }
    }
    Ok(())
}

/// One connection: HTTP/1.1 with upgrades, a header-read deadline, the idle
/// watch, and a graceful end when the listener stops.
async fn serve_one<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: Watched<T>,
    service: ConnectionService,
    activity: Arc<Activity>,
    limits: ListenerLimits,
    stats: Arc<ListenerStats>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let connection = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => {
            if let Err(error) = served {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        () = idle(&activity, limits.idle_timeout) => {
            stats.idle_closed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("idle connection closed");
        }
        () = stopped(&mut stopping) => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                () = idle(&activity, limits.idle_timeout) => {}
            }
        }
    }
}

/// Resolves once the listener stops (or its sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Resolves once the connection has moved no byte for `timeout` while no
/// request was being answered.
async fn idle(activity: &Activity, timeout: Duration) {
    loop {
        let due = activity.last() + timeout;
        tokio::time::sleep_until(due).await;
        if activity.in_flight.load(Ordering::Acquire) == 0 && activity.last().elapsed() >= timeout {
            return;
        }
        if activity.in_flight.load(Ordering::Acquire) > 0 {
            // Answering: look again a timeout from now.
            tokio::time::sleep(timeout).await;
        }
    }
}

#[cfg(test)]
mod tests;
