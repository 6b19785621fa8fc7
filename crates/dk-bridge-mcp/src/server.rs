//! The MCP server: a child process the bridge starts, with only the
//! environment variables named, spoken to over its standard input and
//! output by rmcp's client (the `initialize` handshake, MCP 2025-11-25),
//! through the [`filter`](crate::filter). Its standard error is logged a
//! line at a time, each cut to [`STDERR_LINE`] characters, at most
//! [`STDERR_LINES`] lines in [`STDERR_WINDOW`]; the rest are counted.
//!
//! The client offers the server nothing: no sampling, no roots, no
//! elicitation. A server that asks for them anyway is refused
//! (`method not found`) and the refusal is logged.
//!
//! A server that exits (or closes its output, or fails the handshake) is
//! started again after a pause that doubles from [`FIRST_PAUSE`] to
//! [`LAST_PAUSE`], and starts over once a run lasted [`STABLE`]. Calls in
//! flight when it stopped fail, saying so; calls while it is down fail at
//! once. Each start lists the tools again, and so does each
//! `notifications/tools/list_changed`; every listing is published.

#![expect(
    deprecated,
    reason = "sampling and roots are deprecated in MCP; the bridge names them only to refuse them"
)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use dk_device::HandlerError;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequestParams, ElicitResult, Implementation, ListRootsResult,
    ProtocolVersion, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService, ServiceError};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::filter::{self, Seen};

/// First pause before starting a stopped server again.
pub const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// Longest pause before starting a stopped server again.
pub const LAST_PAUSE: Duration = Duration::from_secs(30);
/// How long a run must last for the pause to start over.
pub const STABLE: Duration = Duration::from_secs(60);
/// How long the server has to answer the handshake and the tool list.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest standard error line logged, in characters.
pub const STDERR_LINE: usize = 500;
/// Standard error lines logged in one [`STDERR_WINDOW`].
pub const STDERR_LINES: u32 = 50;
/// The window [`STDERR_LINES`] counts in.
pub const STDERR_WINDOW: Duration = Duration::from_secs(10);

/// How to start the server.
#[derive(Debug, Clone, Default)]
pub struct ServerCommand {
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Its whole environment: the variables named, nothing else.
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory, when not the bridge's.
    pub dir: Option<PathBuf>,
}

impl ServerCommand {
    /// The command line as the person reads it.
    pub fn shown(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|part| {
                let part = part.to_string_lossy();
                if part.is_empty() || part.contains(char::is_whitespace) {
                    format!("'{part}'")
                } else {
                    part.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// One listing of the server's tools.
#[derive(Debug, Clone)]
pub struct Listing {
    /// Its tools.
    pub tools: Vec<Tool>,
    /// What it says it is.
    pub server: Option<Implementation>,
}

/// The running server, as the device's handlers reach it.
#[derive(Clone)]
pub struct Upstream {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("command", &self.shared.command.shown())
            .finish_non_exhaustive()
    }
}

struct Shared {
    command: ServerCommand,
    peer: RwLock<Option<Peer<RoleClient>>>,
    listing: watch::Sender<Option<Arc<Listing>>>,
    changed: Arc<Notify>,
    seen: Arc<Seen>,
    refused: Arc<AtomicU64>,
    starts: AtomicU64,
    down: Mutex<Option<String>>,
}

/// What the bridge knows of the server, for `server_info`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Whether it runs now.
    pub running: bool,
    /// How many times it was started.
    pub starts: u64,
    /// Why it last stopped.
    pub last_stop: Option<String>,
    /// Its messages over the size limit, refused.
    pub oversized_messages: u64,
    /// Its messages nested too deep, refused.
    pub too_deep_messages: u64,
    /// Its notifications and requests dropped over the rate.
    pub dropped_notifications: u64,
    /// Its requests for sampling, roots or elicitation, refused.
    pub refused_requests: u64,
}

impl Upstream {
    /// Starts `command` and keeps it running (see the module).
    pub fn start(command: ServerCommand) -> Upstream {
        let (listing, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            command,
            peer: RwLock::new(None),
            listing,
            changed: Arc::new(Notify::new()),
            seen: Arc::new(Seen::default()),
            refused: Arc::new(AtomicU64::new(0)),
            starts: AtomicU64::new(0),
            down: Mutex::new(None),
        });
        tokio::spawn(supervise(Arc::clone(&shared)));
        Upstream { shared }
    }

    /// The listings, the latest first.
    pub fn listings(&self) -> watch::Receiver<Option<Arc<Listing>>> {
        self.shared.listing.subscribe()
    }

    /// The command line.
    pub fn command(&self) -> &ServerCommand {
        &self.shared.command
    }

    /// What the bridge knows of the server now.
    pub fn health(&self) -> Health {
        let seen = &self.shared.seen;
        Health {
            running: self.peer().is_some(),
            starts: self.shared.starts.load(Ordering::Relaxed),
            last_stop: self
                .shared
                .down
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            oversized_messages: seen.oversized.load(Ordering::Relaxed),
            too_deep_messages: seen.too_deep.load(Ordering::Relaxed),
            dropped_notifications: seen.dropped.load(Ordering::Relaxed),
            refused_requests: self.shared.refused.load(Ordering::Relaxed)
                + seen.refused.load(Ordering::Relaxed),
        }
    }

    fn peer(&self) -> Option<Peer<RoleClient>> {
        self.shared
            .peer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Calls `tool` with `input`, waiting at most `timeout`: the answer
    /// (a `CallToolResult` as JSON), or why there is none.
    pub async fn call(
        &self,
        tool: &str,
        input: Map<String, Value>,
        timeout: Duration,
    ) -> Result<Value, HandlerError> {
        let Some(peer) = self.peer() else {
            let why = self
                .shared
                .down
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .unwrap_or_else(|| "it is starting".to_owned());
            return Err(HandlerError::new(format!(
                "the MCP server is not running ({why}); it is being started again: nothing was sent"
            )));
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(input);
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Err(_) => Err(HandlerError::new(format!(
                "the MCP server did not answer within {} s: the call was cancelled there",
                timeout.as_secs()
            ))),
            Ok(Err(ServiceError::McpError(error))) => Err(HandlerError::new(format!(
                "the MCP server refused the call: {}",
                crate::manifest::shown_long(&error.message)
            ))),
            Ok(Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                Err(HandlerError::new(
                    "the MCP server stopped during the call (it is being started again): whether it acted is not known",
                ))
            }
            Ok(Err(error)) => Err(HandlerError::new(format!(
                "the MCP server's answer could not be read: {error}"
            ))),
            Ok(Ok(result)) => serde_json::to_value(result)
                .map_err(|e| HandlerError::new(format!("the MCP server's answer: {e}"))),
        }
    }
}

/// Runs the server, again and again.
async fn supervise(shared: Arc<Shared>) {
    let mut pause = FIRST_PAUSE;
    loop {
        let started = Instant::now();
        shared.starts.fetch_add(1, Ordering::Relaxed);
        let why = run_once(&shared).await;
        *shared.peer.write().unwrap_or_else(PoisonError::into_inner) = None;
        if started.elapsed() >= STABLE {
            pause = FIRST_PAUSE;
        }
        tracing::warn!(
            why = %why,
            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "the MCP server stopped: starting it again"
        );
        *shared.down.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LAST_PAUSE);
    }
}

/// One run of the server: why it ended.
async fn run_once(shared: &Arc<Shared>) -> String {
    let command = &shared.command;
    let mut process = Command::new(&command.program);
    process
        .args(&command.args)
        .env_clear()
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = &command.dir {
        process.current_dir(dir);
    }
    let mut child = match process.spawn() {
        Ok(child) => child,
        Err(e) => return format!("it could not be started: {e}"),
    };
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return "its standard streams could not be opened".to_owned();
    };
    tokio::spawn(log_stderr(stderr));
    // The server's output reaches rmcp through the filter; its input takes
    // rmcp's lines and the filter's own answers, a whole line at a time.
    let (read, write) = tokio::io::duplex(256 * 1024);
    let (answers, answered) = mpsc::channel(64);
    let mut filtered = tokio::spawn(filter::run(
        stdout,
        write,
        answers,
        Arc::clone(&shared.seen),
    ));
    let (to_server, from_client) = tokio::io::duplex(256 * 1024);
    let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
    tokio::spawn(copy_lines(from_client, Arc::clone(&stdin)));
    tokio::spawn(send_answers(answered, stdin));
    let client = ClientSide {
        changed: Arc::clone(&shared.changed),
        refused: Arc::clone(&shared.refused),
    };
    let service = match tokio::time::timeout(START_TIMEOUT, client.serve((read, to_server))).await {
        Ok(Ok(service)) => service,
        Ok(Err(e)) => return ended(&mut child, format!("the MCP handshake failed: {e}")).await,
        Err(_) => {
            return ended(
                &mut child,
                format!(
                    "it did not answer the MCP handshake within {} s",
                    START_TIMEOUT.as_secs()
                ),
            )
            .await;
        }
    };
    if let Err(why) = list(shared, &service).await {
        return ended(&mut child, why).await;
    }
    *shared.peer.write().unwrap_or_else(PoisonError::into_inner) = Some(service.peer().clone());
    loop {
        tokio::select! {
            status = child.wait() => {
                let _ = service.cancel().await;
                return match status {
                    Ok(status) => format!("it exited ({status})"),
                    Err(e) => format!("it could not be waited for: {e}"),
                };
            }
            _ = &mut filtered => {
                let _ = service.cancel().await;
                return ended(&mut child, "it closed its output".to_owned()).await;
            }
            () = shared.changed.notified() => {
                if let Err(why) = list(shared, &service).await {
                    tracing::warn!(%why, "the MCP server's tools could not be listed again");
                }
            }
        }
    }
}

/// Lists the tools and publishes them.
async fn list(
    shared: &Shared,
    service: &RunningService<RoleClient, ClientSide>,
) -> Result<(), String> {
    let tools = tokio::time::timeout(START_TIMEOUT, service.peer().list_all_tools())
        .await
        .map_err(|_| {
            format!(
                "it did not list its tools within {} s",
                START_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("its tools could not be listed: {e}"))?;
    let server = service
        .peer()
        .peer_info()
        .and_then(|info| info.server_info.clone());
    tracing::info!(tools = tools.len(), "listed the MCP server's tools");
    shared
        .listing
        .send_replace(Some(Arc::new(Listing { tools, server })));
    Ok(())
}

/// Copies rmcp's lines to the server's input, each whole.
async fn copy_lines(from: tokio::io::DuplexStream, to: Arc<tokio::sync::Mutex<ChildStdin>>) {
    let mut lines = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let mut stdin = to.lock().await;
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            break;
        }
    }
    let _ = to.lock().await.shutdown().await;
}

/// Sends the filter's own answers to the server's input.
async fn send_answers(
    mut answers: mpsc::Receiver<Vec<u8>>,
    to: Arc<tokio::sync::Mutex<ChildStdin>>,
) {
    while let Some(answer) = answers.recv().await {
        let mut stdin = to.lock().await;
        if stdin.write_all(&answer).await.is_err() || stdin.flush().await.is_err() {
            break;
        }
    }
}

/// Stops `child` and says `why`.
async fn ended(child: &mut Child, why: String) -> String {
    let _ = child.start_kill();
    let _ = child.wait().await;
    why
}

/// Logs the server's standard error, bounded (see the module).
async fn log_stderr(stderr: tokio::process::ChildStderr) {
    let mut lines = BufReader::new(stderr);
    let mut line = Vec::new();
    let mut window = Instant::now();
    let mut logged = 0u32;
    let mut skipped = 0u64;
    loop {
        line.clear();
        // Read a line, keeping at most a little more than is logged.
        let mut reader = (&mut lines).take(64 * 1024);
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") && line.len() >= 64 * 1024 {
            // The rest of an overlong line.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let mut more = (&mut lines).take(64 * 1024);
                match more.read_until(b'\n', &mut rest).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) if rest.ends_with(b"\n") => break,
                    Ok(_) => {}
                }
            }
        }
        if window.elapsed() >= STDERR_WINDOW {
            if skipped > 0 {
                tracing::info!(skipped, "MCP server stderr: lines not logged");
            }
            window = Instant::now();
            logged = 0;
            skipped = 0;
        }
        if logged >= STDERR_LINES {
            skipped += 1;
            continue;
        }
        logged += 1;
        let text = String::from_utf8_lossy(&line);
        let text: String = text.trim_end().chars().take(STDERR_LINE).collect();
        tracing::info!(line = %crate::manifest::shown_long(&text), "MCP server stderr");
    }
}

/// The bridge's side of MCP: it offers nothing, refuses what the server
/// asks of it, and hears of changed tools.
struct ClientSide {
    changed: Arc<Notify>,
    refused: Arc<AtomicU64>,
}

impl ClientSide {
    fn refuse(&self, what: &str) -> ErrorData {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("the MCP server asked for {what}, which the bridge does not offer: refused");
        ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("the client offers no {what}"),
            None,
        )
    }
}

impl ClientHandler for ClientSide {
    fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<CreateMessageResult, ErrorData>> + Send + '_ {
        std::future::ready(Err(self.refuse("sampling")))
    }

    fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<ListRootsResult, ErrorData>> + Send + '_ {
        std::future::ready(Err(self.refuse("roots")))
    }

    fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<ElicitResult, ErrorData>> + Send + '_ {
        std::future::ready(Err(self.refuse("elicitation")))
    }

    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.changed.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("dk-bridge-mcp", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}
