//! End to end: a tool call through `DeviceToolAdapter::execute` to the
//! reference lamp connected over a real WebSocket (`serve_devices` on
//! loopback, a tokio-tungstenite device), against a bare WebSocket echo round
//! trip of the same size over the same stack. Blocks of each alternate so
//! both see the same machine; the median and p99 of each and their ratios are
//! printed. Run with `cargo xtask bench` (or `cargo bench -p dk-vessel --bench
//! e2e`). Times are reported, never asserted on.

#[path = "../../dk-core/benches/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::{Message as AxumMessage, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use dk_policy::PolicySet;
use dk_vessel::{
    Vessel, adapter::CallContext, http::serve_devices, person::Prompt, registry::ConsentDecision,
};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

use common::{BoxError, LAMP, micros, stopped};

const TOOL: &str = "device__desk_lamp__set_light";
const CALL_NAME: &str = "e2e/tool_call_over_websocket";
const ECHO_NAME: &str = "e2e/bare_websocket_echo";
const RATIO_NAME: &str = "e2e/ratio";

/// Rounds of each kind before measuring.
const WARM_UP: usize = 500;
/// Rounds of one kind in a row before switching to the other.
const BLOCK: usize = 200;
/// Blocks of each kind measured.
const BLOCKS: usize = 25;
/// How long setting up or tearing down may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(10);

fn main() -> Result<(), BoxError> {
    if common::filtered_out(&[CALL_NAME, ECHO_NAME, RATIO_NAME]) {
        return Ok(());
    }
    common::multi_thread(None)?.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks: JoinSet<Result<(), BoxError>> = JoinSet::new();

    // The rate limit would close a device answering thousands of calls a
    // second; every other limit is the default.
    let vessel = Vessel::new(PolicySet::empty(), common::unthrottled());
    let devices = TcpListener::bind("127.0.0.1:0").await?;
    let device_addr = devices.local_addr()?;
    let serving = Arc::clone(&vessel);
    let shutdown = stopped(stop_rx.clone());
    tasks.spawn(async move { Ok(serve_devices(devices, serving, shutdown).await?) });

    let echo = TcpListener::bind("127.0.0.1:0").await?;
    let echo_addr = echo.local_addr()?;
    let shutdown = stopped(stop_rx.clone());
    tasks.spawn(async move {
        let app = Router::new().route("/echo", get(echo_route));
        Ok(axum::serve(echo, app)
            .with_graceful_shutdown(shutdown)
            .await?)
    });

    let invoke_len = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&invoke_len);
    tasks.spawn(async move { run_device(device_addr, seen).await });
    // The caller is a task on the runtime, as an agent's would be.
    let caller = Arc::clone(&vessel);
    let outcome = tokio::spawn(async move { measure(&caller, echo_addr, &invoke_len).await })
        .await
        .map_err(BoxError::from)
        .and_then(|samples| samples);

    stop_tx.send_replace(true);
    let finished = tokio::time::timeout(PATIENCE, async {
        let mut failure: Option<BoxError> = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(error)) => failure = Some(error),
                Err(error) => failure = Some(Box::new(error)),
            }
        }
        failure
    })
    .await;
    // Anything still running after the patience is aborted and awaited.
    tasks.shutdown().await;
    let samples = outcome?;
    if let Ok(Some(error)) = finished {
        return Err(format!("a task failed: {error}").into());
    }
    samples.print();
    Ok(())
}

/// The bare route: each text message comes back as it is.
async fn echo_route(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            if let AxumMessage::Text(text) = message
                && socket.send(AxumMessage::Text(text)).await.is_err()
            {
                break;
            }
        }
    })
}

/// The reference lamp: pairs, then answers every invoke at once. Records the
/// size of the invoke frames so the echo can send the same.
async fn run_device(addr: SocketAddr, invoke_len: Arc<AtomicUsize>) -> Result<(), BoxError> {
    let (mut ws, _) = connect_async(format!("ws://{addr}/device")).await?;
    ws.send(Message::text(format!(
        r#"{{"type":"device:hello","manifest":{LAMP}}}"#
    )))
    .await?;
    // A read error ends the loop: the vessel closed the connection.
    while let Some(Ok(message)) = ws.next().await {
        // Pings are answered by tungstenite on the next read or write.
        let Message::Text(text) = message else {
            continue;
        };
        let frame: Value = serde_json::from_str(text.as_str())?;
        if frame.get("type").and_then(Value::as_str) != Some("device:invoke") {
            continue;
        }
        invoke_len.store(text.len(), Ordering::Relaxed);
        let call_id = frame.get("callId").and_then(Value::as_str).unwrap_or("");
        let result = json!({
            "type": "device:result",
            "callId": call_id,
            "ok": true,
            "result": {"on": true, "brightness": 40},
        });
        ws.send(Message::text(result.to_string())).await?;
    }
    Ok(())
}

/// Pairs the lamp as the person, then measures both kinds of round trip.
async fn measure(
    vessel: &Arc<Vessel>,
    echo_addr: SocketAddr,
    invoke_len: &AtomicUsize,
) -> Result<Samples, BoxError> {
    approve_lamp(vessel).await?;

    // The invoke frame's size is known after the first call.
    call(vessel).await?;
    let size = invoke_len.load(Ordering::Relaxed);
    let payload = "x".repeat(size);
    let (mut echo, _) = connect_async(format!("ws://{echo_addr}/echo")).await?;

    let mut calls = Vec::with_capacity(BLOCK * BLOCKS);
    let mut echoes = Vec::with_capacity(BLOCK * BLOCKS);
    for _ in 0..WARM_UP {
        call(vessel).await?;
        echo_once(&mut echo, &payload).await?;
    }
    for _ in 0..BLOCKS {
        for _ in 0..BLOCK {
            let started = Instant::now();
            call(vessel).await?;
            calls.push(started.elapsed());
        }
        for _ in 0..BLOCK {
            let started = Instant::now();
            echo_once(&mut echo, &payload).await?;
            echoes.push(started.elapsed());
        }
    }
    echo.close(None).await?;
    // Read to the end so the close handshake completes.
    while let Some(Ok(_)) = echo.next().await {}
    Ok(Samples {
        calls,
        echoes,
        frame_bytes: size,
    })
}

/// Answers the lamp's pairing request and waits until it is connected.
async fn approve_lamp(vessel: &Arc<Vessel>) -> Result<(), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let consent = vessel
            .person()
            .pending()
            .into_iter()
            .find(|p| matches!(p.prompt, Prompt::Consent(_)));
        if let Some(prompt) = consent {
            vessel.person().answer_consent(
                prompt.id,
                ConsentDecision::approve(["read_light", "set_light"]),
            )?;
            break;
        }
        if Instant::now() > deadline {
            return Err("the lamp did not ask to pair".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while !vessel.links().is_connected("desk-lamp") {
        if Instant::now() > deadline {
            return Err("the lamp did not connect after pairing".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// One allowed call, end to end.
async fn call(vessel: &Vessel) -> Result<(), BoxError> {
    let outcome = vessel
        .adapter()
        .execute(
            TOOL,
            json!({"on": true, "brightness": 40}),
            CallContext::default(),
        )
        .await;
    if outcome.is_ok() {
        Ok(())
    } else {
        Err(format!("the call failed: {:?}", outcome.reason()).into())
    }
}

/// One echo round trip.
async fn echo_once<S>(echo: &mut S, payload: &str) -> Result<(), BoxError>
where
    S: futures::Sink<Message, Error = tokio_tungstenite::tungstenite::Error>
        + futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
{
    echo.send(Message::text(payload)).await?;
    loop {
        match echo.next().await {
            Some(Ok(Message::Text(text))) if text.len() == payload.len() => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => return Err("the echo route closed".into()),
        }
    }
}

struct Samples {
    calls: Vec<Duration>,
    echoes: Vec<Duration>,
    frame_bytes: usize,
}

impl Samples {
    fn print(mut self) {
        let (Some(call), Some(echo)) = (summary(&mut self.calls), summary(&mut self.echoes)) else {
            println!("e2e: no samples");
            return;
        };
        println!(
            "\ne2e: {} rounds of each ({BLOCKS} alternating blocks of {BLOCK} after {WARM_UP} warm-up), frames of {} bytes",
            self.calls.len(),
            self.frame_bytes
        );
        println!(
            "{CALL_NAME:<32}median {:>7.1} µs   p99 {:>7.1} µs",
            micros(call.median),
            micros(call.p99)
        );
        println!(
            "{ECHO_NAME:<32}median {:>7.1} µs   p99 {:>7.1} µs",
            micros(echo.median),
            micros(echo.p99)
        );
        println!(
            "{RATIO_NAME:<32}median {:>7.2}x     p99 {:>7.2}x",
            call.median.as_secs_f64() / echo.median.as_secs_f64(),
            call.p99.as_secs_f64() / echo.p99.as_secs_f64()
        );
    }
}

struct Summary {
    median: Duration,
    p99: Duration,
}

fn summary(samples: &mut [Duration]) -> Option<Summary> {
    samples.sort_unstable();
    let n = samples.len();
    Some(Summary {
        median: *samples.get(n / 2)?,
        p99: *samples.get((n * 99 / 100).min(n.saturating_sub(1)))?,
    })
}
