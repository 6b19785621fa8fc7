//! What the MCP layer costs: an allowed lamp call as an MCP `tools/call`
//! over streamable HTTP on loopback, next to the same call through
//! `adapter().execute` in the same run (over a link that answers at once, so
//! the difference is MCP, HTTP and the session), and `tools/list` with 100
//! paired devices of 8 granted capabilities each; and, for scale, a bare
//! HTTP POST echo through axum on loopback over one kept-alive connection
//! (the floor any HTTP transport pays). Prints medians. Run with
//! `cargo bench -p dk-vessel --bench mcp`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dk_policy::PolicySet;
use dk_vessel::{
    AgentDirectory, AgentRole, AgentScope, CallContext, ConsentDecision, DeviceLink, InvokeResult,
    Limits, Vessel, serve_mcp,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

const LAMP: &str = include_str!("../../../fixtures/manifests/valid/desk-lamp.json");
const TOOL: &str = "device__desk_lamp__set_light";
const CALLS: usize = 2_000;
const LISTS: usize = 200;

/// Answers every call at once with a ready-made result.
struct Answer(Box<RawValue>);

impl DeviceLink for Answer {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        _: &'a Map<String, Value>,
        _: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        let result = self.0.clone();
        async move { Ok(Some(result)) }.boxed()
    }
}

/// Median of `CALLS` bare HTTP POST round trips to an axum echo route.
async fn http_floor(body: &str) -> Option<Duration> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.ok()?;
    let local = listener.local_addr().ok()?;
    let app =
        axum::Router::new().route("/echo", axum::routing::post(|body: String| async { body }));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let stream = tokio::net::TcpStream::connect(local).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    let driver = tokio::spawn(connection);
    let mut samples = Vec::with_capacity(CALLS);
    for i in 0..CALLS + 200 {
        let request = hyper::Request::post("/echo")
            .header("host", local.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .ok()?;
        sender.ready().await.ok()?;
        let start = Instant::now();
        let response = sender.send_request(request).await.ok()?;
        let _ = response.into_body().collect().await.ok()?;
        if i >= 200 {
            samples.push(start.elapsed());
        }
    }
    drop(sender);
    let _ = driver.await;
    server.abort();
    let _ = server.await;
    Some(median(samples))
}

/// Median of `CALLS` `tools/call` POSTs sent by a bare hyper client on one
/// kept-alive connection, reading each SSE answer whole: the server's share
/// of the MCP cost, without rmcp's client.
async fn raw_mcp_calls(local: std::net::SocketAddr, credential: &str) -> Option<Duration> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let stream = tokio::net::TcpStream::connect(local).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    let driver = tokio::spawn(connection);
    let bearer = format!("Bearer {credential}");
    let post = |body: String, session: Option<&str>| {
        let mut builder = hyper::Request::post("/mcp")
            .header("host", local.to_string())
            .header("authorization", bearer.as_str())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(session) = session {
            builder = builder
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-06-18");
        }
        builder.body(Full::new(Bytes::from(body))).ok()
    };
    let initialize = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#;
    sender.ready().await.ok()?;
    let response = sender
        .send_request(post(initialize.to_owned(), None)?)
        .await
        .ok()?;
    let session = response
        .headers()
        .get("mcp-session-id")?
        .to_str()
        .ok()?
        .to_owned();
    let _ = response.into_body().collect().await.ok()?;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    sender.ready().await.ok()?;
    let response = sender
        .send_request(post(initialized.to_owned(), Some(&session))?)
        .await
        .ok()?;
    let _ = response.into_body().collect().await.ok()?;
    let mut samples = Vec::with_capacity(CALLS);
    for i in 1..=CALLS + 200 {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"{TOOL}","arguments":{{"on":true,"brightness":40}}}}}}"#
        );
        let request = post(body, Some(&session))?;
        sender.ready().await.ok()?;
        let start = Instant::now();
        let response = sender.send_request(request).await.ok()?;
        let answer = response.into_body().collect().await.ok()?.to_bytes();
        if i > 200 {
            samples.push(start.elapsed());
        }
        if !answer.windows(8).any(|w| w == b"\"result\"") {
            return None;
        }
    }
    drop(sender);
    let _ = driver.await;
    Some(median(samples))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A manifest with `caps` sensors, for the listing benchmark.
fn manifest(index: usize, caps: usize) -> Value {
    let capabilities: Vec<Value> = (0..caps)
        .map(|c| json!({"name": format!("read_{c}"), "kind": "sensor", "description": format!("Reading {c}.")}))
        .collect();
    json!({"id": format!("sensor-{index}"), "name": format!("Sensor {index}"), "kind": "sensor",
           "version": "1.0.0", "capabilities": capabilities})
}

async fn pair(vessel: &Vessel, manifest: &Value, grants: Vec<String>) -> Option<()> {
    vessel
        .registry()
        .pair(
            manifest,
            |_| {},
            move |_| async move { Ok::<_, ()>(ConsentDecision::approve(grants)) },
            Duration::from_secs(1),
        )
        .await
        .ok()
        .map(|_| ())
}

async fn run() -> Option<()> {
    // Thousands of calls in one session: past any run budget, so none is charged.
    let limits = Limits {
        run_limits: None,
        ..Limits::default()
    };
    let vessel = Vessel::new(PolicySet::empty(), limits);
    let lamp: Value = serde_json::from_str(LAMP).ok()?;
    pair(&vessel, &lamp, vec!["set_light".into()]).await?;
    let result = RawValue::from_string(r#"{"on":true,"brightness":40}"#.to_owned()).ok()?;
    vessel
        .links()
        .connect("desk-lamp", Arc::new(Answer(result)));
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

    let input = json!({"on": true, "brightness": 40});
    let Value::Object(arguments) = input.clone() else {
        return None;
    };
    let request = CallToolRequestParams::new(TOOL).with_arguments(arguments);
    for _ in 0..200 {
        client.call_tool(request.clone()).await.ok()?;
    }
    let mut over_mcp = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let request = request.clone();
        let start = Instant::now();
        let result = client.call_tool(request).await.ok()?;
        over_mcp.push(start.elapsed());
        if result.is_error != Some(false) {
            return None;
        }
    }

    let ctx = CallContext {
        agent_id: Some("bench"),
        session_id: Some("s1"),
        ..CallContext::default()
    };
    let mut direct = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let input = input.clone();
        let start = Instant::now();
        let outcome = vessel.adapter().execute(TOOL, input, ctx).await;
        direct.push(start.elapsed());
        if !outcome.is_ok() {
            return None;
        }
    }
    let (mcp, direct) = (median(over_mcp), median(direct));
    println!(
        "tools/call over MCP (streamable HTTP, loopback): median {:>9.1} µs",
        micros(mcp)
    );
    println!(
        "adapter().execute in process:                    median {:>9.1} µs",
        micros(direct)
    );
    println!(
        "MCP adds:                                        median {:>9.1} µs (target: at most 200 µs)",
        micros(mcp.saturating_sub(direct))
    );

    let server_side = raw_mcp_calls(local, credential.expose()).await?;
    println!(
        "tools/call, bare HTTP client, same POSTs:        median {:>9.1} µs",
        micros(server_side)
    );
    let floor = http_floor(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"device__desk_lamp__set_light","arguments":{"on":true,"brightness":40}}}"#,
    )
    .await?;
    println!(
        "bare HTTP POST echo (axum, loopback, keep-alive): median {:>9.1} µs",
        micros(floor)
    );

    for index in 0..100 {
        let grants = (0..8).map(|c| format!("read_{c}")).collect();
        pair(&vessel, &manifest(index, 8), grants).await?;
    }
    let mut lists = Vec::with_capacity(LISTS);
    for _ in 0..LISTS {
        let start = Instant::now();
        let tools = client.list_all_tools().await.ok()?;
        lists.push(start.elapsed());
        if tools.len() != 801 {
            return None;
        }
    }
    println!(
        "tools/list, 100 devices x 8 granted (801 tools):  median {:>9.1} µs",
        micros(median(lists))
    );

    client.cancel().await.ok()?;
    let _ = stop.send(());
    server.await.ok()?.ok()?;
    Some(())
}

fn main() {
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    else {
        eprintln!("no runtime");
        return;
    };
    if runtime.block_on(run()).is_none() {
        eprintln!("the MCP benchmark could not run");
        std::process::exit(1);
    }
}
