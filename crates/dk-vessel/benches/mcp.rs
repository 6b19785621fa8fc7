//! What the MCP layer costs: an allowed lamp call as an MCP `tools/call`
//! over streamable HTTP on loopback, next to the same call through
//! `adapter().execute` in the same run (over a link that answers at once, so
//! the difference is MCP, HTTP and the session), and `tools/list` with 100
//! paired devices of 8 granted capabilities each; and, for scale, a bare
//! HTTP POST echo through axum on loopback over one kept-alive connection
//! (the floor any HTTP transport pays). Prints medians. Run with
//! `cargo bench -p dk-vessel --bench mcp`.

#[path = "../../dk-core/benches/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use dk_core::adapter::CallContext;
use dk_core::agents::{AgentDirectory, AgentRole, AgentScope};
use dk_mcp::serve_mcp;
use dk_policy::PolicySet;
use dk_vessel::Vessel;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use common::{LAMP, median, micros, pair};
const TOOL: &str = "device__desk_lamp__set_light";
const CALLS: usize = 2_000;
const LISTS: usize = 200;
const WARM_UP: usize = 200;

/// A bare HTTP POST echo through axum on loopback, the floor any HTTP
/// transport pays: the same client, the same listener set-up, no MCP.
struct Echo {
    client: RawClient,
    server: tokio::task::JoinHandle<()>,
    body: String,
}

impl Echo {
    async fn start(body: &str) -> Option<Echo> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.ok()?;
        let local = listener.local_addr().ok()?;
        let app =
            axum::Router::new().route("/mcp", axum::routing::post(|body: String| async { body }));
        // As `serve_mcp` sets up its listener, TCP_NODELAY included.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client = RawClient::connect(local, "none").await?;
        Some(Echo {
            client,
            server,
            body: body.to_owned(),
        })
    }

    async fn round_trip(&mut self) -> Option<Duration> {
        let start = Instant::now();
        self.client.post(self.body.clone(), &[]).await?;
        Some(start.elapsed())
    }

    async fn stop(self) {
        self.client.close().await;
        self.server.abort();
        let _ = self.server.await;
    }
}

/// A bare MCP client: hyper on one kept-alive connection, with TCP_NODELAY,
/// sending the JSON-RPC text and reading each answer (SSE or JSON) whole.
/// The thinnest client there can be, so what it measures is the vessel's
/// side of MCP (HTTP, rmcp, the session, the handler), not a client stack.
struct RawClient {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>,
    driver: tokio::task::JoinHandle<()>,
    host: String,
    bearer: String,
    /// The legacy session, after `initialize`; `None` for the 2026-07-28
    /// lifecycle, which has no sessions.
    session: Option<String>,
    next_id: u64,
}

impl RawClient {
    async fn connect(local: std::net::SocketAddr, credential: &str) -> Option<RawClient> {
        let stream = tokio::net::TcpStream::connect(local).await.ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .ok()?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Some(RawClient {
            sender,
            driver,
            host: local.to_string(),
            bearer: format!("Bearer {credential}"),
            session: None,
            next_id: 0,
        })
    }

    /// Opens a legacy session with the `initialize` handshake.
    async fn initialize(&mut self) -> Option<()> {
        let initialize = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#;
        let (headers, _) = self.post(initialize.to_owned(), &[]).await?;
        let session = headers.get("mcp-session-id")?.to_str().ok()?.to_owned();
        self.session = Some(session);
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        self.post(initialized.to_owned(), &[]).await?;
        Some(())
    }

    async fn post(
        &mut self,
        body: String,
        extra: &[(&str, &str)],
    ) -> Option<(hyper::HeaderMap, hyper::body::Bytes)> {
        use http_body_util::{BodyExt, Full};
        let mut builder = hyper::Request::post("/mcp")
            .header("host", self.host.as_str())
            .header("authorization", self.bearer.as_str())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(session) = &self.session {
            builder = builder
                .header("mcp-session-id", session.as_str())
                .header("mcp-protocol-version", "2025-06-18");
        }
        for (name, value) in extra {
            builder = builder.header(*name, *value);
        }
        let request = builder.body(Full::new(body.into())).ok()?;
        self.sender.ready().await.ok()?;
        let response = self.sender.send_request(request).await.ok()?;
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((headers, body))
    }

    /// One `tools/call` of the lamp, timed from sending to the last byte
    /// of the answer; `None` if the answer is not a successful result.
    async fn call(&mut self) -> Option<Duration> {
        self.next_id += 1;
        let id = self.next_id;
        let (body, extra): (String, &[(&str, &str)]) = if self.session.is_some() {
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{TOOL}","arguments":{{"on":true,"brightness":40}}}}}}"#
                ),
                &[],
            )
        } else {
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{TOOL}","arguments":{{"on":true,"brightness":40}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"bench","version":"0"}}}}}}}}"#
                ),
                &[
                    ("mcp-protocol-version", "2026-07-28"),
                    ("mcp-method", "tools/call"),
                    ("mcp-name", TOOL),
                ],
            )
        };
        let start = Instant::now();
        let (_, answer) = self.post(body, extra).await?;
        let took = start.elapsed();
        let text = String::from_utf8_lossy(&answer);
        if !text.contains("\"result\"") || text.contains("\"isError\":true") {
            eprintln!("unexpected answer: {text}");
            return None;
        }
        Some(took)
    }

    async fn close(self) {
        drop(self.sender);
        let _ = self.driver.await;
    }
}

/// A manifest with `caps` sensors, for the listing benchmark.
fn manifest(index: usize, caps: usize) -> Value {
    let capabilities: Vec<Value> = (0..caps)
        .map(|c| json!({"name": format!("read_{c}"), "kind": "sensor", "description": format!("Reading {c}.")}))
        .collect();
    json!({"id": format!("sensor-{index}"), "name": format!("Sensor {index}"), "kind": "sensor",
           "version": "1.0.0", "capabilities": capabilities})
}

async fn run() -> Option<()> {
    let vessel = Vessel::new(PolicySet::empty(), common::unbudgeted());
    let lamp: Value = serde_json::from_str(LAMP).ok()?;
    pair(vessel.registry(), &lamp, vec!["set_light".into()])
        .await
        .ok()?;
    common::connect_instant_lamp(vessel.links()).ok()?;
    let agents = Arc::new(AgentDirectory::new());
    let (_, credential) = agents
        .add("bench", AgentScope::AllDevices, AgentRole::User)
        .ok()?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.ok()?;
    let local = listener.local_addr().ok()?;
    let url = format!("http://{local}/mcp");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_mcp(
        listener,
        Arc::clone(&vessel),
        Arc::clone(&agents),
        async move {
            let _ = stopped.await;
        },
    ));
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .auth_header(credential.expose().to_owned());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.ok()?;
    let mut legacy = RawClient::connect(local, credential.expose()).await?;
    legacy.initialize().await?;
    let mut stateless = RawClient::connect(local, credential.expose()).await?;
    let mut echo = Echo::start(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"device__desk_lamp__set_light","arguments":{"on":true,"brightness":40}}}"#,
    )
    .await?;

    let input = json!({"on": true, "brightness": 40});
    let Value::Object(arguments) = input.clone() else {
        return None;
    };
    let request = CallToolRequestParams::new(TOOL).with_arguments(arguments);
    let ctx = CallContext {
        agent_id: Some("bench"),
        session_id: Some("s1"),
        ..CallContext::default()
    };
    // Interleaved, one of each per round, so that whatever else the
    // machine does falls on every column alike.
    let mut samples: [Vec<Duration>; 5] = Default::default();
    for round in 0..WARM_UP + CALLS {
        let start = Instant::now();
        let result = client.call_tool(request.clone()).await.ok()?;
        let with_rmcp = start.elapsed();
        if result.is_error != Some(false) {
            return None;
        }
        let over_legacy = legacy.call().await?;
        let over_stateless = stateless.call().await?;
        let start = Instant::now();
        let outcome = vessel.adapter().execute(TOOL, input.clone(), ctx).await;
        let direct = start.elapsed();
        if !outcome.is_ok() {
            return None;
        }
        let floor = echo.round_trip().await?;
        if round >= WARM_UP {
            for (column, sample) in
                samples
                    .iter_mut()
                    .zip([direct, over_legacy, over_stateless, with_rmcp, floor])
            {
                column.push(sample);
            }
        }
    }
    let [direct, over_legacy, over_stateless, with_rmcp, floor] =
        samples.map(|mut column| median(&mut column));
    let row = |what: &str, took: Duration| {
        println!(
            "{what:<50} median {:>8.1} µs  ({:>6.1}x direct, adds {:>6.1} µs)",
            micros(took),
            took.as_secs_f64() / direct.as_secs_f64().max(f64::MIN_POSITIVE),
            micros(took.saturating_sub(direct)),
        );
    };
    println!(
        "{:<50} median {:>8.1} µs",
        "adapter().execute in process (direct)",
        micros(direct)
    );
    row("tools/call in an MCP session (initialize)", over_legacy);
    row(
        "tools/call, 2026-07-28 lifecycle (no session)",
        over_stateless,
    );
    row("tools/call through rmcp's client (session)", with_rmcp);
    row("bare HTTP POST echo, same client and listener", floor);
    println!(
        "the MCP layer adds {:.1} µs at the median (session, bare client; target: at most 200 µs)",
        micros(over_legacy.saturating_sub(direct))
    );
    legacy.close().await;
    stateless.close().await;
    echo.stop().await;

    for index in 0..100 {
        let grants = (0..8).map(|c| format!("read_{c}")).collect();
        pair(vessel.registry(), &manifest(index, 8), grants)
            .await
            .ok()?;
    }
    let mut lists = Vec::with_capacity(LISTS);
    for _ in 0..LISTS {
        let start = Instant::now();
        let tools = client.list_all_tools().await.ok()?;
        lists.push(start.elapsed());
        if tools
            .iter()
            .filter(|t| t.name.starts_with("device__"))
            .count()
            != 801
        {
            return None;
        }
    }
    println!(
        "tools/list, 100 devices x 8 granted (801 device tools): median {:>9.1} µs",
        micros(median(&mut lists))
    );

    client.cancel().await.ok()?;
    let _ = stop.send(());
    server.await.ok()?.ok()?;
    Some(())
}

fn main() {
    let Ok(runtime) = common::multi_thread(Some(2)) else {
        eprintln!("no runtime");
        return;
    };
    if runtime.block_on(run()).is_none() {
        eprintln!("the MCP benchmark could not run");
        std::process::exit(1);
    }
}
