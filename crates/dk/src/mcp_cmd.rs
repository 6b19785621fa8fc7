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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use dk_vessel::http::connect_private_socket;

use crate::home::{MCP_SOCKET, data_dir_or_home, no_vessel};
use crate::input::printable;

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

/// The first protocol revision whose requests carry `Mcp-Method` and
/// `Mcp-Name` headers (revisions are dates, so they compare as text).
const STANDARD_HEADERS_VERSION: &str = "2026-07-28";

/// The JSON-RPC error code of the answers the bridge makes itself: the
/// vessel could not be reached, refused the credential, or answered
/// something that is not JSON-RPC.
const BRIDGE_ERROR: i64 = -32000;

/// JSON-RPC's code for a line that is not JSON.
const PARSE_ERROR: i64 = -32700;

/// JSON-RPC's code for JSON that is not a message.
const INVALID_REQUEST: i64 = -32600;

/// Methods whose `Mcp-Name` header is `params.name`, `params.uri` or
/// `params.taskId`.
const NAMED_METHODS: [(&str, &str); 8] = [
    ("tools/call", "name"),
    ("prompts/get", "name"),
    ("resources/read", "uri"),
    ("resources/subscribe", "uri"),
    ("resources/unsubscribe", "uri"),
    ("tasks/get", "taskId"),
    ("tasks/update", "taskId"),
    ("tasks/cancel", "taskId"),
];

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

/// The vessel's MCP endpoint, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// The URL as given, or the socket's path, for messages.
    url: String,
    /// `host:port` as written in the URL (`localhost` on the socket): the
    /// `Host` header.
    authority: String,
    /// Where to connect.
    place: Place,
    /// The request target: path and query.
    target: String,
}

/// Where the bridge connects.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// The URL's authority with the port made explicit.
    Tcp(String),
    /// The vessel's MCP socket, used only once it is shown to be this
    /// user's.
    Unix {
        /// The socket.
        socket: PathBuf,
        /// What to say when nothing answers on it.
        absent: String,
    },
}

impl Endpoint {
    /// The MCP socket in the vessel's data directory `data_dir`; `absent`
    /// is what to say when no vessel answers there.
    fn socket(data_dir: &Path, absent: &str) -> Endpoint {
        let socket = data_dir.join(MCP_SOCKET);
        Endpoint {
            url: format!("`{}`", socket.display()),
            authority: "localhost".to_owned(),
            place: Place::Unix {
                socket,
                absent: absent.to_owned(),
            },
            target: "/mcp".to_owned(),
        }
    }

    /// Parses an `http://host[:port][/path]` URL.
    fn parse(url: &str) -> Result<Endpoint, String> {
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(if url.starts_with("https://") {
                format!(
                    "`{url}`: https is not supported; the vessel serves MCP over plain HTTP on loopback"
                )
            } else {
                format!("`{url}` is not an http:// URL")
            });
        };
        let (authority, target) = match rest.split_once('/') {
            Some((authority, path)) => (authority, format!("/{path}")),
            None => (rest, "/".to_owned()),
        };
        let target = target.split('#').next().unwrap_or("/").to_owned();
        if authority.is_empty() || authority.contains('@') {
            return Err(format!("`{url}` must name a host and no user"));
        }
        let has_port = match authority.rsplit_once(':') {
            Some((host, port)) => {
                !port.is_empty()
                    && port.bytes().all(|b| b.is_ascii_digit())
                    && (!host.starts_with('[') || host.ends_with(']'))
            }
            None => false,
        };
        let connect = if has_port {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok(Endpoint {
            url: url.to_owned(),
            authority: authority.to_owned(),
            place: Place::Tcp(connect),
            target,
        })
    }
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
    let mut stdin = BufReader::new(tokio::io::stdin());
    let stop = stop_signal();
    tokio::pin!(stop);
    let mut interrupted = false;
    loop {
        let mut line = Vec::new();
        tokio::select! {
            read = read_line(&mut stdin, &mut line) => match read {
                Ok(0) => break,
                Ok(_) => {
                    bridge
                        .take_line(&line, &mut requests, &mut in_flight, &mut listener)
                        .await;
                }
                Err(e) => {
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

    /// Ends the session, if there is one.
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
            let mut events = SseParser::default();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| broken(&e))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let mut found = Vec::new();
                events
                    .push(&data, |event| found.push(event))
                    .map_err(|message| broken(&message))?;
                for event in found {
                    answered |= self.forward(&event, id, initialize).await;
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

/// Whether `version` uses the 2026-07-28 request headers.
fn is_modern(version: Option<&str>) -> bool {
    version.is_some_and(|v| v >= STANDARD_HEADERS_VERSION)
}

/// `Mcp-Method` and, for the methods that name something, `Mcp-Name`
/// (Base64-wrapped as `=?base64?...?=` when not plain visible ASCII).
fn standard_headers(message: &Value) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::new();
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return headers;
    };
    if let Ok(value) = HeaderValue::from_str(method) {
        headers.push((HeaderName::from_static("mcp-method"), value));
    }
    let name = NAMED_METHODS
        .iter()
        .find(|(m, _)| *m == method)
        .and_then(|(_, key)| message.get("params")?.get(*key)?.as_str());
    if let Some(name) = name
        && let Ok(value) = HeaderValue::from_str(&header_text(name))
    {
        headers.push((HeaderName::from_static("mcp-name"), value));
    }
    headers
}

/// `text` as a header value: as it is when it is visible ASCII without
/// space at its ends, else Base64 in the `=?base64?...?=` wrapper.
fn header_text(text: &str) -> String {
    let padded = text.starts_with([' ', '\t']) || text.ends_with([' ', '\t']);
    let visible = text.chars().all(|c| (' '..='~').contains(&c));
    let wrapped = text.starts_with("=?base64?") && text.ends_with("?=");
    let plain = visible && !padded && !wrapped;
    if plain {
        text.to_owned()
    } else {
        format!("=?base64?{}?=", base64(text.as_bytes()))
    }
}

/// Standard Base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let symbol = |index: u32| {
        ALPHABET
            .get(usize::try_from(index & 63).unwrap_or(0))
            .map_or('A', |b| char::from(*b))
    };
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let mut word = 0u32;
        for (i, byte) in chunk.iter().enumerate() {
            word |= u32::from(*byte) << (16 - 8 * i);
        }
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(symbol(word >> (18 - 6 * i)));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Reads a `text/event-stream` as it arrives: each complete event's data
/// lines, joined with `\n`. Comments (keep-alive pings), `event`, `id` and
/// `retry` fields are skipped; an event cut off by the stream's end is
/// dropped, as the format says.
#[derive(Debug, Default)]
struct SseParser {
    /// Bytes of a line not yet ended.
    pending: Vec<u8>,
    /// The data of the event being read.
    data: String,
    /// Whether the event has a data field.
    has_data: bool,
}

impl SseParser {
    /// Takes the next bytes; calls `on_event` with each event's data.
    fn push(&mut self, bytes: &[u8], mut on_event: impl FnMut(String)) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            if line.is_empty() {
                if self.has_data {
                    let mut data = std::mem::take(&mut self.data);
                    if data.ends_with('\n') {
                        data.pop();
                    }
                    on_event(data);
                }
                self.has_data = false;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            if field == "data" {
                let value = value.strip_prefix(' ').unwrap_or(value);
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
        }
        if self.pending.len() + self.data.len() > MAX_MESSAGE_BYTES {
            return Err(format!("event longer than {MAX_MESSAGE_BYTES} bytes"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Endpoint, Place, SseParser, base64, header_text, standard_headers};
    use serde_json::json;

    #[track_caller]
    fn check_endpoint(url: &str, expected: Option<(&str, &str, &str)>) {
        let got = Endpoint::parse(url).ok();
        let got = got.as_ref().map(|e| {
            let connect = match &e.place {
                Place::Tcp(address) => address.as_str(),
                Place::Unix { .. } => "unix",
            };
            (e.authority.as_str(), connect, e.target.as_str())
        });
        assert_eq!(got, expected, "{url}");
    }

    #[test]
    fn endpoints() {
        check_endpoint(
            "http://127.0.0.1:7779/mcp",
            Some(("127.0.0.1:7779", "127.0.0.1:7779", "/mcp")),
        );
        check_endpoint(
            "http://localhost/mcp?x=1#frag",
            Some(("localhost", "localhost:80", "/mcp?x=1")),
        );
        check_endpoint("http://[::1]:9/", Some(("[::1]:9", "[::1]:9", "/")));
        check_endpoint("http://[::1]", Some(("[::1]", "[::1]:80", "/")));
        check_endpoint("https://127.0.0.1:7779/mcp", None);
        check_endpoint("ws://127.0.0.1:7779/mcp", None);
        check_endpoint("http://user@host/mcp", None);
        check_endpoint("http:///mcp", None);
        let socket = Endpoint::socket(std::path::Path::new("/h/vessel"), "none");
        assert_eq!(
            (socket.authority.as_str(), socket.target.as_str()),
            ("localhost", "/mcp")
        );
        assert_eq!(
            socket.place,
            Place::Unix {
                socket: "/h/vessel/mcp.sock".into(),
                absent: "none".to_owned()
            }
        );
    }

    #[track_caller]
    fn check_sse(chunks: &[&str], expected: &[&str]) {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for chunk in chunks {
            parser.push(chunk.as_bytes(), |e| events.push(e)).unwrap();
        }
        assert_eq!(events, expected, "{chunks:?}");
    }

    #[test]
    fn event_streams() {
        check_sse(&[], &[]);
        check_sse(&["data: {\"a\":1}\n\n"], &["{\"a\":1}"]);
        check_sse(&["id: 0\nretry: 3000\ndata:\n\n"], &[""]);
        check_sse(&[": ping\n\n", "event: message\r\ndata: x\r\n\r\n"], &["x"]);
        check_sse(
            &["data: {\"a\"", ":1}\n", "\n", "data: 2\n"],
            &["{\"a\":1}"],
        );
        check_sse(&["data: a\ndata: b\n\n"], &["a\nb"]);
        check_sse(&["data:no-space\n\n"], &["no-space"]);
    }

    #[test]
    fn header_values() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64("Küche".as_bytes()), "S8O8Y2hl");
        assert_eq!(
            header_text("device__desk_lamp__set_light"),
            "device__desk_lamp__set_light"
        );
        assert_eq!(header_text(" x"), "=?base64?IHg=?=");
        assert_eq!(header_text("Küche"), "=?base64?S8O8Y2hl?=");
        let headers = standard_headers(&json!({"method": "tools/call", "params": {"name": "t"}}));
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            headers,
            [
                ("mcp-method".to_owned(), "tools/call".to_owned()),
                ("mcp-name".to_owned(), "t".to_owned())
            ]
        );
        assert_eq!(standard_headers(&json!({"method": "tools/list"})).len(), 1);
    }
}
