//! Log output: lines go to standard error with every secret the running
//! vessel knows replaced by `[REDACTED]` first
//! ([`dk_core::redact::redacting_log_writer`]). `DK_LOG` sets the level: `error`,
//! `warn` (the default), `info`, `debug` or `trace`. `--log-format` (or
//! `DK_LOG_FORMAT`) sets the shape: `text` (the default), or `json`, one
//! object a line per event: `timestamp`, `level`, `target`, `message` and
//! the event's own fields beside them ([`LogFormat`]).
//!
//! A few events rmcp logs at ERROR are not errors: they say that an MCP
//! client hung up (an agent closing its `subscriptions/listen` stream, or
//! any streamed answer it stopped reading), which is how such a stream
//! normally ends. They are written only at `debug` and `trace`
//! ([`CLIENT_GONE`]); every other ERROR stays an ERROR.
//!
//! At `debug` and `trace` rmcp also echoes every MCP answer whole, device
//! results included: a screenshot would be a megabyte of base64 on one
//! line, and a picture of the person's screen kept in a log file. Those
//! echoes ([`ECHOES`]) are never written. The requests rmcp logs stay, but
//! for a tool call's ([`is_tool_call_echo`]): its arguments are the agent's
//! input, which may hold anything the person would not want in a log (a
//! lock's code, a message's text); the call is logged as its audit entry,
//! without the input, instead.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// rmcp's ERROR events that mean only "the HTTP client went away", as
/// (target, message, `error` field). A request of the 2026-07-28 lifecycle
/// (`subscriptions/listen` above all) is answered over a channel that rmcp
/// closes when its client disconnects; the handler, cancelled by that
/// disconnect, still returns its final answer, and rmcp 3.11 logs the failed
/// send at ERROR (from its serve loop, or from the drain after it). The
/// error text is tokio's for a closed channel, so a failure of any other
/// kind is still logged.
const CLIENT_GONE: &[(&str, &str, &str)] = &[
    (
        "rmcp::service",
        "failed to send pending response during drain",
        "channel closed",
    ),
    (
        "rmcp::service",
        "fail to response message",
        "channel closed",
    ),
];

/// rmcp's events that echo a whole MCP answer, as (target, level, the field
/// holding it): the `response message` of every request served, the
/// serve loop's `new event` (an answer on its way out among them), and the
/// streamable HTTP transport's dump of every message it sends (its only
/// events at TRACE in rmcp 3.11).
const ECHOES: &[(&str, Level, &str)] = &[
    ("rmcp::service", Level::DEBUG, "result"),
    ("rmcp::service", Level::TRACE, "evt"),
    (
        "rmcp::transport::streamable_http_server::tower",
        Level::TRACE,
        "message",
    ),
];

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// A line of text per event, for a person at a terminal.
    #[default]
    Text,
    /// A JSON object per line per event, for a log collector: `timestamp`
    /// (RFC 3339, UTC), `level`, `target`, `message`, and the event's
    /// fields at the same level (an audit entry's are named as in the
    /// entry: `deviceId`, `agentId`, `capability`, ...).
    Json,
}

/// The format the process's logger was installed with.
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Whether the process logs JSON lines: then nothing else may be written to
/// standard error, since a collector reads every line as an object.
pub fn json() -> bool {
    FORMAT.get() == Some(&LogFormat::Json)
}

/// Installs the logger for the whole process (once; a second call changes nothing).
pub fn init(format: LogFormat) {
    let _ = FORMAT.set(format);
    let level = std::env::var("DK_LOG")
        .ok()
        .and_then(|level| level.parse::<Level>().ok())
        .unwrap_or(Level::WARN);
    let _ = subscriber(level, format, || {
        dk_core::redact::redacting_log_writer(std::io::stderr())
    })
    .try_init();
}

/// Events at `level` and above, formatted to `writer` as `format` says,
/// with the [`CLIENT_GONE`] events left out unless `level` is `debug` or
/// `trace`, and the [`ECHOES`] always.
fn subscriber<W>(
    level: Level,
    format: LogFormat,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync + 'static>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let client_gone = ClientGone {
        shown: level >= Level::DEBUG,
    };
    let fmt = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(fmt.finish().with(client_gone).with(NoEchoes)),
        LogFormat::Json => Box::new(
            fmt.json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish()
                .with(client_gone)
                .with(NoEchoes),
        ),
    }
}

/// Leaves out the [`ECHOES`] and rmcp's echo of a tool call's request,
/// whatever the level.
struct NoEchoes;

impl<S: Subscriber> Layer<S> for NoEchoes {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        !is_echo(event) && !is_tool_call_echo(event)
    }
}

/// rmcp's event that echoes a request it received, as (target, level, the
/// field holding it).
const REQUEST_ECHO: (&str, Level, &str) = ("rmcp::service", Level::DEBUG, "request");

/// Whether `event` is rmcp's echo of a `tools/call` request, arguments and
/// all. Told by its callsite first; only that event's request is formatted
/// to decide (and only when rmcp's DEBUG events are written at all).
fn is_tool_call_echo(event: &Event<'_>) -> bool {
    let metadata = event.metadata();
    let (target, level, field) = REQUEST_ECHO;
    if metadata.target() != target
        || *metadata.level() != level
        || metadata.fields().field(field).is_none()
    {
        return false;
    }
    let mut request = Request::default();
    event.record(&mut request);
    request.0.starts_with("CallToolRequest(")
}

/// The `request` field of an event, as its `Debug` text.
#[derive(Default)]
struct Request(String);

impl Visit for Request {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == REQUEST_ECHO.2 {
            self.0 = format!("{value:?}");
        }
    }
}

/// Whether `event` is one of the [`ECHOES`]: told by its callsite alone, so
/// the answer is never formatted to decide.
fn is_echo(event: &Event<'_>) -> bool {
    let metadata = event.metadata();
    ECHOES.iter().any(|&(target, level, field)| {
        metadata.target() == target
            && *metadata.level() == level
            && metadata.fields().field(field).is_some()
    })
}

/// Leaves out the [`CLIENT_GONE`] events unless `shown`.
struct ClientGone {
    shown: bool,
}

impl<S: Subscriber> Layer<S> for ClientGone {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        self.shown || !is_client_gone(event)
    }
}

fn is_client_gone(event: &Event<'_>) -> bool {
    let metadata = event.metadata();
    if *metadata.level() != Level::ERROR || !metadata.target().starts_with("rmcp") {
        return false;
    }
    let mut fields = MessageAndError::default();
    event.record(&mut fields);
    CLIENT_GONE.iter().any(|&(target, message, error)| {
        metadata.target() == target && fields.message == message && fields.error == error
    })
}

/// The `message` and `error` fields of an event, as text.
#[derive(Default)]
struct MessageAndError {
    message: String,
    error: String,
}

impl Visit for MessageAndError {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            // Recorded with `%`: its `Debug` is the error's `Display`.
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use dk_core::agents::{AgentDirectory, AgentRole, AgentScope};
    use dk_mcp::serve_mcp;
    use dk_policy::PolicySet;
    use dk_vessel::{Limits, Vessel};
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper_util::rt::TokioIo;
    use serde_json::json;

    use super::*;

    /// The lines a subscriber wrote.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `emit` writes under the dk logger at `level`.
    fn logged(level: Level, emit: fn()) -> String {
        logged_as(level, LogFormat::Text, emit)
    }

    /// What `emit` writes under the dk logger at `level` in `format`.
    fn logged_as(level: Level, format: LogFormat, emit: fn()) -> String {
        let lines = Lines::default();
        let sink = lines.clone();
        tracing::subscriber::with_default(subscriber(level, format, move || sink.clone()), emit);
        lines.text()
    }

    #[test]
    fn json_is_an_object_a_line_with_the_fields_beside_the_message() {
        let text = logged_as(Level::INFO, LogFormat::Json, || {
            tracing::info!(target: "dk_store::audit", seq = 7_u64, kind = "decision",
                "deviceId" = Some("desk-lamp"), allowed = Some(false), rule = None::<&str>,
                "audit entry");
            tracing::warn!(error = %"a \"quoted\"\nline", "two\nlines");
            tracing::debug!("not at info");
        });
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let first = &lines[0];
        assert!(
            first["timestamp"].as_str().unwrap().ends_with('Z'),
            "{first}"
        );
        let mut first = first.clone();
        first.as_object_mut().unwrap().remove("timestamp");
        assert_eq!(
            first,
            json!({"level": "INFO", "target": "dk_store::audit", "message": "audit entry",
                   "seq": 7, "kind": "decision", "deviceId": "desk-lamp", "allowed": false})
        );
        assert_eq!(lines[1]["message"], "two\nlines");
        assert_eq!(lines[1]["error"], "a \"quoted\"\nline");
        // The filters apply to JSON too.
        assert_eq!(
            logged_as(Level::TRACE, LogFormat::Json, || {
                tracing::trace!(target: "rmcp::service", evt = ?"screenshot", "new event");
            }),
            ""
        );
    }

    #[test]
    fn only_a_client_hanging_up_is_left_out() {
        let gone: fn() = || {
            tracing::error!(target: "rmcp::service", error = %"channel closed", "failed to send pending response during drain");
            tracing::error!(target: "rmcp::service", error = %"channel closed", "fail to response message");
        };
        // Real errors: another error, another event, another target.
        let real: [fn(); 4] = [
            || tracing::error!(target: "rmcp::service", error = %"broken pipe", "failed to send pending response during drain"),
            || tracing::error!(target: "rmcp::service", error = %"channel closed", "fail to close sink"),
            || tracing::error!(target: "dk_mcp", error = %"channel closed", "fail to response message"),
            || tracing::error!("the audit log could not be written"),
        ];
        assert_eq!(logged(Level::WARN, gone), "");
        assert_eq!(logged(Level::INFO, gone), "");
        assert_eq!(logged(Level::DEBUG, gone).matches(" ERROR ").count(), 2);
        for emit in real {
            for level in [Level::ERROR, Level::WARN, Level::DEBUG] {
                let text = logged(level, emit);
                assert_eq!(text.matches(" ERROR ").count(), 1, "{level}: {text:?}");
            }
        }
    }

    #[test]
    fn answers_are_never_echoed_and_requests_still_are() {
        let echoes: fn() = || {
            let screenshot = "iVBORw0KGgo".repeat(1000);
            tracing::debug!(target: "rmcp::service", id = %1, result = ?screenshot, "response message");
            tracing::trace!(target: "rmcp::service", evt = ?screenshot, "new event");
            tracing::trace!(target: "rmcp::transport::streamable_http_server::tower", message = ?screenshot);
        };
        let kept: fn() = || {
            tracing::debug!(target: "rmcp::service", id = %1, request = ?"tools/call", "received request");
            tracing::debug!(target: "rmcp::service", id = %1, request = %"ListToolsRequest(Request { .. })", "received request");
            tracing::debug!(target: "dk_mcp", result = ?"ok", "a result of our own");
            tracing::trace!(target: "rmcp::service", "task cancelled");
        };
        for level in [Level::ERROR, Level::INFO, Level::DEBUG, Level::TRACE] {
            assert_eq!(logged(level, echoes), "", "{level}");
        }
        let text = logged(Level::TRACE, kept);
        assert_eq!(text.lines().count(), 4, "{text}");
        // A tool call's request carries the agent's input.
        let call: fn() = || {
            let request = "CallToolRequest(Request { params: { arguments: Some({\"code\": String(\"4711\")}) } })";
            tracing::debug!(target: "rmcp::service", id = %2, request = %request, "received request");
        };
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(logged_as(Level::TRACE, format, call), "", "{format:?}");
        }
    }

    /// Posts `subscriptions/listen` to the MCP server at `address` as a
    /// 2026-07-28 client, reads the acknowledgment, then hangs up.
    async fn listen_then_hang_up(address: SocketAddr, credential: &str) {
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        let connection = tokio::spawn(connection);
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        });
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
            "params": {"notifications": {"toolsListChanged": true}, "_meta": meta}});
        let request = hyper::Request::post("/mcp")
            .header("host", address.to_string())
            .header("authorization", format!("Bearer {credential}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "subscriptions/listen")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let mut response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let first = response.body_mut().frame().await.unwrap().unwrap();
        let first = String::from_utf8(first.into_data().unwrap().to_vec()).unwrap();
        assert!(
            first.contains("notifications/subscriptions/acknowledged"),
            "{first}"
        );
        drop(response);
        drop(sender);
        connection.abort();
    }

    #[tokio::test]
    async fn an_agent_closing_its_listen_stream_logs_no_error() {
        // At `info`, so rmcp's own line saying the listen's loop is over shows.
        let lines = Lines::default();
        let sink = lines.clone();
        let _default =
            tracing::subscriber::set_default(subscriber(Level::INFO, LogFormat::Text, move || {
                sink.clone()
            }));
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        let agents = Arc::new(AgentDirectory::new());
        let (_, credential) = agents
            .add("main", AgentScope::AllDevices, AgentRole::User)
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_mcp(listener, vessel, agents, async move {
            let _ = stopped.await;
        }));
        for _ in 0..3 {
            listen_then_hang_up(address, credential.expose()).await;
        }
        // rmcp says `serve finished` once it has sent (or failed to send)
        // the listen's final answer: by then any ERROR about it is written.
        dk_testkit::eventually("three `serve finished`", || {
            lines
                .text()
                .matches("serve finished quit_reason=Cancelled")
                .count()
                >= 3
        })
        .await;
        let text = lines.text();
        let finished = text.matches("serve finished quit_reason=Cancelled").count();
        assert_eq!(finished, 3, "{text}");
        assert!(!text.contains(" ERROR "), "{text}");
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
