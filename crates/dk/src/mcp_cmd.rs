//! `dk mcp`: a stdio bridge to a running vessel's MCP server, for MCP
//! clients that launch a command instead of connecting over HTTP. It
//! reaches the vessel on the MCP socket in its data directory (found through
//! dk's home, `home.rs`), after checking the socket is this user's, so the
//! agent's credential goes to no other listener; `--vessel URL` sends it to
//! the HTTP endpoint the person names instead.
//!
//! It is a faithful JSON-RPC proxy: each line on standard input is one
//! JSON-RPC message, POSTed as it is to the vessel's `/mcp` with the agent's
//! credential; each message of the answer (plain JSON or an SSE stream) is
//! written to standard output as one line. Both lifecycles pass unchanged:
//!
//! - `initialize` (legacy): the bridge waits for its answer before reading
//!   on, keeps the `Mcp-Session-Id` and the negotiated protocol version and
//!   sends them on every later request; once `notifications/initialized` is
//!   accepted it opens the session's GET stream, so server notifications
//!   such as `notifications/tools/list_changed` reach the client;
//! - `server/discover` (2026-07-28): each request names its protocol version
//!   in `_meta`; the bridge sends it as `MCP-Protocol-Version` with the
//!   `Mcp-Method` and `Mcp-Name` headers that revision asks for, and a
//!   `notifications/cancelled` for a request in flight drops its POST.
//!
//! Requests run concurrently, so a long one (`subscriptions/listen`, a call
//! waiting for the person's yes) does not hold up the others. The credential
//! comes from `DK_AGENT_CREDENTIAL` or `--credential-file`, never from the
//! command line, which other users can read. Only JSON-RPC goes to standard
//! output; a vessel that cannot be reached or refuses the credential is one
//! line on standard error and a JSON-RPC error answer to each request. On
//! end of input the bridge lets the requests in flight finish for a moment,
//! ends the session with `DELETE` and exits 0.

mod endpoint;
mod events;
mod headers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use dk_http::connect_private_socket;

use crate::home::{data_dir_or_home, no_vessel};
use crate::input::printable;
use endpoint::{Endpoint, Place};
use events::event_data;
use headers::{is_modern, standard_headers};

/// The environment variable holding the agent credential.
pub const CREDENTIAL_ENV: &str = "DK_AGENT_CREDENTIAL";

/// Longest line read from standard input, and longest answer or SSE event
/// read from the vessel (16 MiB): past it the message is refused, not kept.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How long connecting to the vessel may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// After end of input: how long requests in flight may still finish
/// (less than the two seconds clients commonly wait before a SIGTERM).
const END_GRACE: Duration = Duration::from_secs(1);

/// How long an exchange the bridge waits for before reading on may take:
/// `initialize`, a notification, the opening of the GET stream.
const INLINE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the closing `DELETE` of the session may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// The `_meta` key in which 2026-07-28 requests name their protocol version.
const META_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// The JSON-RPC error code of the answers the bridge makes itself: the
/// vessel could not be reached, refused the credential, or answered
/// something that is not JSON-RPC.
const BRIDGE_ERROR: i64 = -32000;

/// JSON-RPC's code for a line that is not JSON.
const PARSE_ERROR: i64 = -32700;

/// JSON-RPC's code for JSON that is not a message.
const INVALID_REQUEST: i64 = -32600;

/// `dk mcp`.
#[derive(clap::Args)]
pub struct McpArgs {
    /// The vessel's MCP endpoint over HTTP (`http://127.0.0.1:7779/mcp`),
    /// which gets the credential whoever listens there. [default: the MCP
    /// socket in the vessel's data directory]
    #[arg(long, value_name = "URL")]
    vessel: Option<String>,
    /// The vessel's data directory, whose MCP socket the bridge uses.
    /// [default: `vessel` in dk's home: $DK_HOME, else $XDG_DATA_HOME/dk,
    /// else ~/.local/share/dk]
    #[arg(long, value_name = "DIR", conflicts_with = "vessel")]
    data_dir: Option<PathBuf>,
    /// A file holding the agent credential (`dka_...`), used instead of the
    /// `DK_AGENT_CREDENTIAL` environment variable.
    #[arg(long, value_name = "PATH")]
    credential_file: Option<PathBuf>,
}

/// Runs the bridge until standard input ends.
pub fn run(args: &McpArgs) -> ExitCode {
    let endpoint = match &args.vessel {
        Some(url) => Endpoint::parse(url),
        None => data_dir_or_home(args.data_dir.as_deref())
            .map(|(dir, home)| Endpoint::socket(&dir, &no_vessel(&dir, home.as_ref())))
            .map_err(|e| e.to_string()),
    };
    let prepared = endpoint.and_then(|endpoint| {
        let bearer = bearer(args.credential_file.as_deref())?;
        Ok((endpoint, bearer))
    });
    let (endpoint, bearer) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            eprintln!("dk mcp: {}", printable(&e));
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dk mcp: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(bridge(endpoint, bearer))
}

/// The `Authorization` header, from the credential file or the environment.
fn bearer(file: Option<&std::path::Path>) -> Result<HeaderValue, String> {
    let credential = match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the credential file `{}`: {e}", path.display()))?,
        None => std::env::var(CREDENTIAL_ENV).unwrap_or_default(),
    };
    let credential = credential.trim();
    if credential.is_empty() {
        return Err(format!(
            "no agent credential: set {CREDENTIAL_ENV} or pass --credential-file PATH \
             (dk agents add NAME prints one)"
        ));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {credential}"))
        .map_err(|_| "the agent credential holds characters a header cannot carry".to_owned())?;
    value.set_sensitive(true);
    Ok(value)
}

/// What the bridge keeps of the session.
#[derive(Debug, Default)]
struct Session {
    /// `Mcp-Session-Id`, from the answer to `initialize`.
    id: Option<HeaderValue>,
    /// The protocol version the client negotiated: from the answer to
    /// `initialize`, or the last one a request named in its `_meta`.
    version: Option<String>,
    /// Whether the session's GET stream was opened.
    listening: bool,
}

/// The state every request task shares.
struct Bridge {
    endpoint: Endpoint,
    bearer: HeaderValue,
    session: Mutex<Session>,
    /// Lines for standard output, written by one task in order.
    out: mpsc::Sender<String>,
    /// The last problem told on standard error, so a vessel that stays down
    /// is reported once, not once per request.
    last_problem: Mutex<Option<String>>,
}

/// How a request to the vessel failed before an answer could be used.
#[derive(Debug)]
enum Failure {
    /// No connection, or it broke: the vessel is not there.
    Unreachable(String),
    /// The vessel answered, but not with JSON-RPC.
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// What it said.
        message: String,
    },
}

impl Failure {
    fn message(&self) -> String {
        match self {
            Failure::Unreachable(message) => message.clone(),
            Failure::Refused { message, .. } => message.clone(),
        }
    }

    fn data(&self) -> Value {
        match self {
            Failure::Unreachable(_) => json!({"reachable": false}),
            Failure::Refused { status, .. } => json!({"httpStatus": status.as_u16()}),
        }
    }
}

/// One exchange in progress: the answer's head, and the connection's task,
/// which this exchange owns (dropping it closes the connection).
struct Exchange {
    response: Response<Incoming>,
    _connection: JoinSet<()>,
}

/// Requests in flight, by their JSON-RPC id (as JSON text), with the
/// protocol version they were sent with.
type InFlight = HashMap<String, (tokio::task::Id, AbortHandle, Option<String>)>;

async fn bridge(endpoint: Endpoint, bearer: HeaderValue) -> ExitCode {
    let (out, mut lines) = mpsc::channel::<String>(64);
    let mut writer = JoinSet::new();
    writer.spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines.recv().await {
            let written = async {
                stdout.write_all(line.as_bytes()).await?;
                stdout.write_all(b"\n").await?;
                stdout.flush().await
            };
            if written.await.is_err() {
                // The client is gone; what is left has nowhere to go.
                break;
            }
        }
    });
    let bridge = Arc::new(Bridge {
        endpoint,
        bearer,
        session: Mutex::new(Session::default()),
        out,
        last_problem: Mutex::new(None),
    });

    let mut requests: JoinSet<()> = JoinSet::new();
    let mut in_flight: InFlight = HashMap::new();
    let mut listener: JoinSet<()> = JoinSet::new();
    let mut reader: JoinSet<()> = JoinSet::new();
    let mut input = read_input(tokio::io::stdin(), &mut reader);
    let stop = stop_signal();
    tokio::pin!(stop);
    let mut interrupted = false;
    loop {
        tokio::select! {
            read = input.recv() => match read {
                None => break,
                Some(Ok(line)) => {
                    bridge
                        .take_line(&line, &mut requests, &mut in_flight, &mut listener)
                        .await;
                }
                Some(Err(e)) => {
                    bridge.tell(&format!("cannot read standard input: {e}"));
                    break;
                }
            },
            Some(done) = requests.join_next_with_id(), if !requests.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                in_flight.retain(|_, (task, _, _)| *task != id);
            }
            () = &mut stop => {
                interrupted = true;
                break;
            }
        }
    }

    // End of input: what is in flight may still finish, briefly, unless
    // a signal says to stop now.
    reader.shutdown().await;
    listener.shutdown().await;
    if !interrupted {
        let drain = async { while requests.join_next().await.is_some() {} };
        tokio::select! {
            _ = tokio::time::timeout(END_GRACE, drain) => {}
            () = &mut stop => {}
        }
    }
    requests.shutdown().await;
    bridge.end_session().await;
    drop(bridge);
    while writer.join_next().await.is_some() {}
    ExitCode::SUCCESS
}

/// Resolves on SIGINT or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What the reader of standard input hands over: one whole line, or the
/// error that ended reading. End of input closes the channel.
type InputLine = std::io::Result<Vec<u8>>;

/// Reads `input` line by line in a task of its own (kept in `tasks`) and
/// hands each whole line over the returned channel.
///
/// The bridge's loop waits on input, on requests finishing and on signals
/// at once; a line read there directly would be dropped half-read whenever
/// a request finished while the client was still writing it (a client that
/// writes a message and its newline separately, or one longer than a pipe's
/// buffer). Here nothing read is ever dropped: the channel's receive is the
/// only thing the loop waits on. The channel holds one line, so a client
/// writing faster than the bridge takes lines is held back by the pipe.
fn read_input(
    input: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    tasks: &mut JoinSet<()>,
) -> mpsc::Receiver<InputLine> {
    let (lines, receiver) = mpsc::channel(1);
    tasks.spawn(async move {
        let mut input = BufReader::new(input);
        loop {
            let mut line = Vec::new();
            match read_line(&mut input, &mut line).await {
                Ok(0) => break,
                Ok(_) => {
                    if lines.send(Ok(line)).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = lines.send(Err(e)).await;
                    break;
                }
            }
        }
    });
    receiver
}

/// Reads one line (without its end) of at most [`MAX_MESSAGE_BYTES`];
/// a longer one is read to its end and comes back empty but counted.
async fn read_line(
    input: &mut (impl AsyncBufReadExt + Unpin),
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let chunk = input.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(total);
        }
        let (taken, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(end) => (end + 1, true),
            None => (chunk.len(), false),
        };
        if line.len() <= MAX_MESSAGE_BYTES {
            line.extend(chunk.iter().take(taken));
        }
        input.consume(taken);
        total += taken;
        if done {
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(total);
        }
    }
}

impl Bridge {
    /// One line from the client.
    async fn take_line(
        self: &Arc<Self>,
        line: &[u8],
        requests: &mut JoinSet<()>,
        in_flight: &mut InFlight,
        listener: &mut JoinSet<()>,
    ) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        if line.len() > MAX_MESSAGE_BYTES {
            self.answer_error(
                &Value::Null,
                PARSE_ERROR,
                &format!("message longer than {MAX_MESSAGE_BYTES} bytes"),
                Value::Null,
            )
            .await;
            return;
        }
        let message: Value = match serde_json::from_slice(line) {
            Ok(message) => message,
            Err(e) => {
                self.answer_error(
                    &Value::Null,
                    PARSE_ERROR,
                    &format!("parse error: {e}"),
                    Value::Null,
                )
                .await;
                return;
            }
        };
        if !(message.is_object() || message.is_array()) {
            self.answer_error(
                &Value::Null,
                INVALID_REQUEST,
                "invalid request: a JSON-RPC message is an object",
                Value::Null,
            )
            .await;
            return;
        }
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id").filter(|_| method.is_some()).cloned();
        let version = self.version_for(&message);
        match (method, id) {
            (Some("initialize"), Some(id)) => {
                // Nothing else means anything before the session exists.
                let handshake = self.request(message, id.clone(), None, true);
                if tokio::time::timeout(INLINE_TIMEOUT, handshake)
                    .await
                    .is_err()
                {
                    let problem = format!(
                        "the vessel at {} did not answer initialize within {} seconds",
                        self.endpoint.url,
                        INLINE_TIMEOUT.as_secs()
                    );
                    self.tell(&problem);
                    // A session the vessel opened meanwhile is of no use to
                    // a client told the handshake failed: end it.
                    self.end_session().await;
                    self.answer_error(&id, BRIDGE_ERROR, &problem, Value::Null)
                        .await;
                }
            }
            (Some(_), Some(id)) => {
                let bridge = Arc::clone(self);
                let key = id.to_string();
                let sent_version = version.clone();
                let handle = requests
                    .spawn(async move { bridge.request(message, id, version, false).await });
                in_flight.insert(key, (handle.id(), handle, sent_version));
            }
            (Some("notifications/cancelled"), None) if self.cancel_modern(&message, in_flight) => {}
            (method, None) => {
                // Notifications and the client's answers to server requests:
                // sent in order, before the next line is read.
                let initialized = method == Some("notifications/initialized");
                let delivered =
                    tokio::time::timeout(INLINE_TIMEOUT, self.deliver(message, version))
                        .await
                        .unwrap_or_else(|_| {
                            self.tell(&format!(
                                "the vessel at {} did not take a notification within {} seconds",
                                self.endpoint.url,
                                INLINE_TIMEOUT.as_secs()
                            ));
                            false
                        });
                if delivered && initialized {
                    self.listen(listener).await;
                }
            }
            (None, Some(_)) => {}
        }
    }

    /// A 2026-07-28 request is cancelled by dropping its POST: true when
    /// `message` cancels such a request in flight (then it is not sent).
    fn cancel_modern(&self, message: &Value, in_flight: &mut InFlight) -> bool {
        let Some(key) = message.pointer("/params/requestId").map(Value::to_string) else {
            return false;
        };
        let modern = in_flight
            .get(&key)
            .is_some_and(|(_, _, version)| is_modern(version.as_deref()));
        if modern && let Some((_, handle, _)) = in_flight.remove(&key) {
            handle.abort();
        }
        modern
    }

    /// The protocol version to send with `message`: the one its `_meta`
    /// names (remembered for later notifications), or the negotiated one.
    fn version_for(&self, message: &Value) -> Option<String> {
        let named = message
            .pointer("/params/_meta")
            .and_then(|meta| meta.get(META_VERSION_KEY))
            .and_then(Value::as_str);
        let mut session = self.session();
        if let Some(named) = named {
            session.version = Some(named.to_owned());
        }
        session.version.clone()
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// POSTs `message` and writes every message of the answer; true when
    /// the answer to `id` (if any) was among them.
    async fn post(
        &self,
        message: &Value,
        id: Option<&Value>,
        version: Option<&str>,
        initialize: bool,
    ) -> Result<bool, Failure> {
        let body = Bytes::from(message.to_string());
        let exchange = self
            .send(hyper::Method::POST, body, message, version, initialize)
            .await?;
        self.relay(exchange, id, initialize).await
    }

    /// Sends one request and writes every message of its answer; when no
    /// answer to it comes, writes an error answer in its place.
    async fn request(&self, message: Value, id: Value, version: Option<String>, initialize: bool) {
        let version = if initialize { None } else { version };
        match self
            .post(&message, Some(&id), version.as_deref(), initialize)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                self.answer_error(
                    &id,
                    BRIDGE_ERROR,
                    "the vessel ended its answer without a result",
                    Value::Null,
                )
                .await;
            }
            Err(failure) => {
                self.tell(&failure.message());
                self.answer_error(&id, BRIDGE_ERROR, &failure.message(), failure.data())
                    .await;
            }
        }
    }

    /// Sends a notification or an answer to a server request; true when
    /// the vessel accepted it.
    async fn deliver(&self, message: Value, version: Option<String>) -> bool {
        match self.post(&message, None, version.as_deref(), false).await {
            Ok(_) => true,
            Err(failure) => {
                self.tell(&failure.message());
                false
            }
        }
    }

    /// Opens the session's GET stream once, for the server's notifications.
    /// Its answer's head is awaited before the next line is read, so that
    /// no change made after the handshake goes unheard.
    async fn listen(self: &Arc<Self>, listener: &mut JoinSet<()>) {
        let version = {
            let mut session = self.session();
            if session.id.is_none() || session.listening {
                return;
            }
            session.listening = true;
            session.version.clone()
        };
        let opening = self.send(
            hyper::Method::GET,
            Bytes::new(),
            &Value::Null,
            version.as_deref(),
            false,
        );
        let exchange = match tokio::time::timeout(INLINE_TIMEOUT, opening).await {
            Ok(Ok(exchange)) if exchange.response.status() == StatusCode::METHOD_NOT_ALLOWED => {
                return;
            }
            Ok(Ok(exchange)) => exchange,
            Err(_) => {
                self.tell("no server notifications: the vessel did not open the stream in time");
                return;
            }
            Ok(Err(failure)) => {
                self.tell(&format!("no server notifications: {}", failure.message()));
                return;
            }
        };
        let bridge = Arc::clone(self);
        listener.spawn(async move {
            match bridge.relay(exchange, None, false).await {
                Ok(_) => bridge.tell("the vessel closed the stream of server notifications"),
                Err(failure) => {
                    bridge.tell(&format!("no server notifications: {}", failure.message()));
                }
            }
        });
    }

    /// Ends the session, if there is one, and forgets it.
    async fn end_session(&self) {
        let version = {
            let session = self.session();
            if session.id.is_none() {
                return;
            }
            session.version.clone()
        };
        let delete = self.send(
            hyper::Method::DELETE,
            Bytes::new(),
            &Value::Null,
            version.as_deref(),
            false,
        );
        let _ = tokio::time::timeout(DELETE_TIMEOUT, delete).await;
        self.session().id = None;
    }

    /// Sends one HTTP request to the vessel with the headers MCP asks for.
    async fn send(
        &self,
        method: hyper::Method,
        body: Bytes,
        message: &Value,
        version: Option<&str>,
        initialize: bool,
    ) -> Result<Exchange, Failure> {
        let unreachable = |e: &dyn std::fmt::Display| {
            Failure::Unreachable(format!(
                "cannot reach the vessel at {}: {e}",
                self.endpoint.url
            ))
        };
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(&self.endpoint.target)
            .header(hyper::header::HOST, &self.endpoint.authority)
            .header(hyper::header::AUTHORIZATION, self.bearer.clone());
        builder = if method == hyper::Method::GET {
            builder.header(hyper::header::ACCEPT, "text/event-stream")
        } else {
            builder.header(hyper::header::ACCEPT, "application/json, text/event-stream")
        };
        if method == hyper::Method::POST {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if !initialize {
            if let Some(id) = self.session().id.clone() {
                builder = builder.header("mcp-session-id", id);
            }
            if let Some(version) = version.and_then(|v| HeaderValue::from_str(v).ok()) {
                builder = builder.header("mcp-protocol-version", version);
            }
        }
        if is_modern(version) && !initialize {
            for (name, value) in standard_headers(message) {
                builder = builder.header(name, value);
            }
        }
        let request = builder.body(Full::new(body)).map_err(|e| unreachable(&e))?;

        let (mut sender, driver) = match &self.endpoint.place {
            Place::Tcp(address) => {
                let connect = tokio::net::TcpStream::connect(address);
                let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => return Err(unreachable(&e)),
                    Err(_) => return Err(unreachable(&"no connection within 10 seconds")),
                };
                let _ = stream.set_nodelay(true);
                open(stream).await.map_err(|e| unreachable(&e))?
            }
            Place::Unix { socket, absent } => {
                let connect = connect_private_socket(socket);
                let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) if e.is_absent() => return Err(unreachable(absent)),
                    Ok(Err(e)) => return Err(unreachable(&e)),
                    Err(_) => return Err(unreachable(&"no connection within 10 seconds")),
                };
                open(stream).await.map_err(|e| unreachable(&e))?
            }
        };
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(&e))?;
        if response.status() == StatusCode::UNAUTHORIZED {
            return Err(Failure::Refused {
                status: StatusCode::UNAUTHORIZED,
                message: format!(
                    "the vessel at {} refused the agent credential (401); \
                     check {CREDENTIAL_ENV} or --credential-file",
                    self.endpoint.url
                ),
            });
        }
        Ok(Exchange {
            response,
            _connection: driver,
        })
    }

    /// Writes every JSON-RPC message of an answer to standard output.
    /// `Ok(true)` when the answer to `id` was among them (always true
    /// without an `id`).
    async fn relay(
        &self,
        exchange: Exchange,
        id: Option<&Value>,
        initialize: bool,
    ) -> Result<bool, Failure> {
        let Exchange {
            response,
            _connection,
        } = exchange;
        let status = response.status();
        if initialize && let Some(session) = response.headers().get("mcp-session-id") {
            let mut kept = self.session();
            kept.id = Some(session.clone());
            kept.listening = false;
        }
        let event_stream = response
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        let mut body = response.into_body();
        let mut answered = id.is_none();
        let broken = |e: &dyn std::fmt::Display| {
            Failure::Unreachable(format!(
                "the connection to the vessel at {} broke: {e}",
                self.endpoint.url
            ))
        };

        if event_stream && status.is_success() {
            let events = event_data(body.into_data_stream(), MAX_MESSAGE_BYTES);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let event = event.map_err(|message| broken(&message))?;
                answered |= self.forward(&event, id, initialize).await;
                if initialize && answered {
                    // The handshake's answer is all that stream carries:
                    // nothing after it may hold the bridge (or make the
                    // answer look late).
                    break;
                }
            }
            self.resolved();
            return Ok(answered);
        }

        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| broken(&e))?;
            if let Ok(data) = frame.into_data() {
                if bytes.len() + data.len() > MAX_MESSAGE_BYTES {
                    return Err(broken(&format!(
                        "answer longer than {MAX_MESSAGE_BYTES} bytes"
                    )));
                }
                bytes.extend_from_slice(&data);
            }
        }
        let parsed = serde_json::from_slice::<Value>(&bytes).ok();
        let is_json_rpc = |value: &Value| match value {
            Value::Object(map) => map.contains_key("jsonrpc"),
            Value::Array(items) => items.iter().all(|i| i.get("jsonrpc").is_some()),
            _ => false,
        };
        match parsed {
            Some(value) if is_json_rpc(&value) => {
                if status.is_success() {
                    self.resolved();
                }
                let messages = match value {
                    Value::Array(items) => items,
                    one => vec![one],
                };
                for message in messages {
                    answered |= self.forward_value(message, id, initialize).await;
                }
                Ok(answered)
            }
            _ if status.is_success() => {
                self.resolved();
                Ok(answered)
            }
            parsed => {
                let said = parsed
                    .as_ref()
                    .and_then(|v| v.get("error"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).trim().to_owned());
                let hint = if status == StatusCode::NOT_FOUND && self.session().id.is_some() {
                    " (the vessel no longer knows this session, perhaps it restarted: reconnect)"
                } else {
                    ""
                };
                Err(Failure::Refused {
                    status,
                    message: format!("the vessel answered {status}: {said}{hint}"),
                })
            }
        }
    }

    /// One SSE event's data: written when it is JSON; true when it answers `id`.
    async fn forward(&self, data: &str, id: Option<&Value>, initialize: bool) -> bool {
        if data.trim().is_empty() {
            // A priming event: it carries only an event id.
            return false;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(message) => self.forward_value(message, id, initialize).await,
            Err(_) => {
                self.tell("the vessel sent an event that is not JSON; it was left out");
                false
            }
        }
    }

    /// Writes one message; true when it answers `id`.
    async fn forward_value(&self, message: Value, id: Option<&Value>, initialize: bool) -> bool {
        let answers = id.is_some_and(|id| {
            message.get("id") == Some(id)
                && (message.get("result").is_some() || message.get("error").is_some())
        });
        if answers
            && initialize
            && let Some(version) = message
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
        {
            self.session().version = Some(version.to_owned());
        }
        let _ = self.out.send(message.to_string()).await;
        answers
    }

    /// Writes an error answer made by the bridge.
    async fn answer_error(&self, id: &Value, code: i64, message: &str, data: Value) {
        let mut error = json!({"code": code, "message": message});
        if !data.is_null()
            && let Some(map) = error.as_object_mut()
        {
            map.insert("data".to_owned(), data);
        }
        let answer = json!({"jsonrpc": "2.0", "id": id, "error": error});
        let _ = self.out.send(answer.to_string()).await;
    }

    /// Tells the person on standard error, once per distinct problem.
    fn tell(&self, problem: &str) {
        let mut last = self
            .last_problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.as_deref() != Some(problem) {
            eprintln!("dk mcp: {}", printable(problem));
            *last = Some(problem.to_owned());
        }
    }

    /// An exchange went through: a later problem is worth telling again.
    fn resolved(&self) {
        *self
            .last_problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// The HTTP/1.1 handshake over `stream`: the sending half, and the task
/// driving the connection (dropping it closes the connection).
async fn open<S>(
    stream: S,
) -> Result<
    (
        hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        JoinSet<()>,
    ),
    hyper::Error,
>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let mut driver = JoinSet::new();
    driver.spawn(async move {
        let _ = connection.await;
    });
    Ok((sender, driver))
}
