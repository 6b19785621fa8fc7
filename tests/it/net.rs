//! A real vessel on loopback (the `/device` route and the admin API on
//! `127.0.0.1:0`), devices built with dk-device's client, and raw WebSocket
//! clients for misbehaving peers.

use std::net::SocketAddr;
use std::sync::Arc;

use dk_device::{ClientError, ClientOptions, Device, run_client};
use dk_http::{AdminClient, AdminToken, Console, serve_admin, serve_devices};
use dk_policy::PolicySet;
use dk_testkit::{eventually, eventually_async, eventually_some};
use dk_vessel::{ConsentDecision, Limits, Prompt, Vessel};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

pub type Socket = WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A vessel serving on loopback until dropped.
pub struct Running {
    pub vessel: Arc<Vessel>,
    pub device_url: String,
    pub admin: AdminClient,
    /// The console's sign-in state (for login links).
    pub console: Arc<Console>,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

pub async fn start(limits: Limits) -> Running {
    start_at("127.0.0.1:0", limits).await
}

/// A vessel whose `/device` route listens on `bind` (the admin API stays on
/// loopback). The URL names 127.0.0.1 with the port bound.
pub async fn start_at(bind: &str, limits: Limits) -> Running {
    let vessel = Vessel::new(PolicySet::empty(), limits);
    let devices = TcpListener::bind(bind).await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let device_addr: SocketAddr = devices.local_addr().unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let token = AdminToken::generate();
    let (stop, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (a, b) = (stopped(stop_rx.clone()), stopped(stop_rx));
    let (v1, v2, t) = (Arc::clone(&vessel), Arc::clone(&vessel), token.clone());
    let console = Console::new();
    let c = Arc::clone(&console);
    let server = tokio::spawn(async move {
        let (x, y) = tokio::join!(
            serve_devices(devices, v1, a),
            serve_admin(admin, v2, t, c, b)
        );
        x.unwrap();
        y.unwrap();
    });
    Running {
        vessel,
        device_url: format!("ws://127.0.0.1:{}/device", device_addr.port()),
        admin: AdminClient::new(admin_addr, token),
        console,
        stop,
        server: Some(server),
    }
}

impl Running {
    /// The same vessel, with devices reaching it at `url` (through a proxy).
    /// The `host:port` of the device route, for a proxy to forward to.
    pub fn device_addr(&self) -> String {
        self.device_url
            .trim_start_matches("ws://")
            .trim_end_matches("/device")
            .to_owned()
    }

    pub fn with_device_url(mut self, url: String) -> Running {
        self.device_url = url;
        self
    }

    /// Stops the vessel and waits for it.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(server) = self.server.take() {
            server.await.unwrap();
        }
    }

    /// Waits for the next pending consent, through the admin API.
    pub async fn next_consent(&self) -> Value {
        self.next_pending("consent").await
    }

    /// Waits for the next pending approval, through the admin API.
    pub async fn next_approval(&self) -> Value {
        self.next_pending("approval").await
    }

    /// Waits for the next pending prompt of `kind`, through the admin API.
    async fn next_pending(&self, kind: &str) -> Value {
        eventually_async(&format!("a pending {kind}"), || async {
            let pending = self.admin.get("/v1/pending").await.unwrap().body;
            pending
                .as_array()
                .and_then(|a| a.iter().find(|p| p["kind"] == kind))
                .cloned()
        })
        .await
    }

    /// Approves the next consent through the admin API.
    pub async fn approve_next(&self, grant: &[&str]) -> Value {
        let prompt = self.next_consent().await;
        let id = prompt["id"].as_u64().unwrap();
        let answer = self
            .admin
            .post(
                &format!("/v1/pending/{id}/consent"),
                &json!({"approved": true, "grant": grant}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 204);
        prompt
    }

    /// Answers the next consent directly on the person channel.
    pub async fn answer_next_directly(&self, decision: ConsentDecision) {
        let id = eventually_some("a consent prompt", || {
            self.vessel
                .person()
                .pending()
                .into_iter()
                .find(|p| matches!(p.prompt, Prompt::Consent(_)))
                .map(|p| p.id)
        })
        .await;
        self.vessel.person().answer_consent(id, decision).unwrap();
    }

    pub async fn wait_connected(&self, id: &str) {
        eventually(&format!("{id} connected"), || {
            self.vessel.links().is_connected(id)
        })
        .await;
    }

    pub async fn wait_disconnected(&self, id: &str) {
        eventually(&format!("{id} disconnected"), || {
            !self.vessel.links().is_connected(id)
        })
        .await;
    }

    /// An agent's call (agent `kitchen`, session `session-7`), made as MCP
    /// makes it, with the person's console as its approver, in its own
    /// task: its outcome as JSON. The call waits `timeout` for the device.
    pub fn agent_call(
        &self,
        tool: &'static str,
        input: Value,
        timeout: std::time::Duration,
    ) -> JoinHandle<Value> {
        let vessel = Arc::clone(&self.vessel);
        tokio::spawn(async move {
            let ctx = dk_core::adapter::CallContext {
                agent_id: Some("kitchen"),
                session_id: Some("session-7"),
                approver: Some(vessel.person().as_ref()),
                timeout: Some(timeout),
                ..dk_core::adapter::CallContext::default()
            };
            let outcome = vessel.adapter().execute(tool, input, ctx).await;
            serde_json::to_value(outcome).unwrap()
        })
    }

    /// Calls a tool through the admin API.
    pub async fn call(&self, tool: &str, input: Value, timeout_ms: u64) -> Value {
        self.admin
            .post(
                "/v1/tools/call",
                &json!({"tool": tool, "input": input, "timeoutMs": timeout_ms}),
            )
            .await
            .unwrap()
            .body
    }
}

/// A dk-device client running in the background until stopped.
pub struct DeviceRun {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ClientError>>,
}

impl DeviceRun {
    pub fn spawn(device: Device, options: ClientOptions) -> DeviceRun {
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            run_client(&device, options, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        DeviceRun {
            stop: Some(stop),
            task,
        }
    }

    /// Asks the client to stop and returns how it ended.
    pub async fn stop(mut self) -> Result<(), ClientError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.unwrap()
    }

    /// Waits for the client to end by itself.
    pub async fn ended(self) -> Result<(), ClientError> {
        let DeviceRun { stop, task } = self;
        let result = task.await.unwrap();
        drop(stop);
        result
    }
}

/// A fresh directory for token files, removed when dropped.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A raw WebSocket connection to the vessel, for peers that misbehave.
pub async fn raw(url: &str) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    tokio_tungstenite::connect_async(url)
        .await
        .map(|(socket, _)| socket)
}

pub async fn send<S>(socket: &mut WebSocketStream<S>, frame: Value)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    socket.send(Message::text(frame.to_string())).await.unwrap();
}

/// The next text frame as JSON, or the close (code, reason); `None` when the
/// socket ended without a close.
pub async fn next<S>(socket: &mut WebSocketStream<S>) -> Option<Result<Value, (u16, String)>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match socket.next().await? {
            Ok(Message::Text(text)) => {
                return Some(Ok(serde_json::from_str(text.as_str()).unwrap()));
            }
            Ok(Message::Close(frame)) => {
                return Some(Err(frame.map_or((1005, String::new()), |f| {
                    (u16::from(f.code), f.reason.as_str().to_owned())
                })));
            }
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// Reads until the vessel closes; returns the close code and reason.
pub async fn closed<S>(socket: &mut WebSocketStream<S>) -> Option<(u16, String)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match next(socket).await? {
            Ok(_) => {}
            Err(close) => return Some(close),
        }
    }
}

/// Pairs a raw device with `manifest`, answering the consent directly.
pub async fn pair_raw(running: &Running, manifest: Value, grant: &[&str]) -> Socket {
    pair_raw_with_token(running, manifest, grant).await.0
}

/// Pairs a raw device with `manifest`, answering the consent directly;
/// returns the socket and the device token.
pub async fn pair_raw_with_token(
    running: &Running,
    manifest: Value,
    grant: &[&str],
) -> (Socket, String) {
    let mut socket = raw(&running.device_url).await.unwrap();
    send(
        &mut socket,
        json!({"type": "device:hello", "manifest": manifest}),
    )
    .await;
    assert_eq!(
        next(&mut socket).await.unwrap().unwrap()["type"],
        "device:pairing"
    );
    running
        .answer_next_directly(ConsentDecision::approve(grant.iter().copied()))
        .await;
    let paired = next(&mut socket).await.unwrap().unwrap();
    assert_eq!(paired["type"], "device:paired");
    let token = paired["deviceToken"].as_str().unwrap().to_owned();
    (socket, token)
}

/// A lamp-like manifest with its own id.
pub fn manifest(id: &str) -> Value {
    json!({"id": id, "name": "Test device", "kind": "test", "version": "1",
           "capabilities": [{"name": "read_light", "kind": "sensor", "description": "Read."}]})
}

/// A raw WebSocket connection from a chosen loopback address (all of
/// 127.0.0.0/8 is this machine), to act as another host.
pub async fn raw_from(
    url: &str,
    local: std::net::Ipv4Addr,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let authority = url.trim_start_matches("ws://").trim_end_matches("/device");
    let remote: SocketAddr = authority.parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(local.into(), 0))?;
    let stream = socket.connect(remote).await?;
    let stream = tokio_tungstenite::MaybeTlsStream::Plain(stream);
    tokio_tungstenite::client_async(url, stream)
        .await
        .map(|(socket, _)| socket)
}
