//! End to end: a tool call through `DeviceToolAdapter::execute` to the
//! reference lamp connected over a real WebSocket (`serve_devices` on
//! loopback, a tokio-tungstenite device reading and answering frames
//! through dk-proto, as dk-device does), once over v1 and once over dk/2
//! (a second lamp on the same vessel, its frames sealed in records), against
//! a bare WebSocket echo round trip of the v1 call's frame size over the same
//! stack. Blocks of each kind alternate so all three see the same machine;
//! the median and p99 of each and their ratios are printed. Run with
//! `cargo xtask bench` (or `cargo bench -p dk-vessel --bench e2e`). Times
//! are reported, never asserted on.

#[path = "bare_socket/mod.rs"]
mod bare_socket;
#[path = "../../dk-core/benches/common/mod.rs"]
mod common;
#[path = "dk2_device/mod.rs"]
mod dk2_device;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::get;
use dk_core::adapter::CallContext;
use dk_core::person::Prompt;
use dk_core::registry::ConsentDecision;
use dk_http::serve_devices;
use dk_policy::PolicySet;
use dk_proto::{Channel, DeviceFrame, FrameLimits, VesselFrame};
use dk_vessel::Vessel;
use futures::{SinkExt, StreamExt};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

use common::{BoxError, LAMP, micros, stopped};

const TOOL: &str = "device__desk_lamp__set_light";
/// The dk/2 lamp: the reference lamp under another id.
const DK2_ID: &str = "desk-lamp-2";
const DK2_TOOL: &str = "device__desk_lamp_2__set_light";
const CALL_NAME: &str = "e2e/tool_call_over_websocket";
const DK2_NAME: &str = "e2e/tool_call_over_dk2";
const ECHO_NAME: &str = "e2e/bare_websocket_echo";
const RATIO_NAME: &str = "e2e/ratio";
const DK2_V1_NAME: &str = "e2e/ratio_dk2_to_v1";
const DK2_ECHO_NAME: &str = "e2e/ratio_dk2_to_echo";

/// Rounds of each kind before measuring.
const WARM_UP: usize = 500;
/// Rounds of one kind in a row before switching to the other.
const BLOCK: usize = 200;
/// Blocks of each kind measured.
const BLOCKS: usize = 25;
/// How long setting up or tearing down may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(10);

fn main() -> Result<(), BoxError> {
    if common::filtered_out(&[
        CALL_NAME,
        DK2_NAME,
        ECHO_NAME,
        RATIO_NAME,
        DK2_V1_NAME,
        DK2_ECHO_NAME,
    ]) {
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
    tasks.spawn(async move { run_dk2_device(device_addr).await });
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
async fn echo_route(request: Request) -> Response {
    bare_socket::upgrade(request, |mut socket| async move {
        while let Some(Ok(message)) = socket.next().await {
            if let Message::Text(text) = message
                && socket.send(Message::Text(text)).await.is_err()
            {
                break;
            }
        }
    })
}

/// The reference lamp: pairs, then answers every invoke at once. Records the
/// size of the invoke frames so the echo can send the same. It reads and
/// writes frames through dk-proto, as dk-device does.
async fn run_device(addr: SocketAddr, invoke_len: Arc<AtomicUsize>) -> Result<(), BoxError> {
    let (mut ws, _) = connect_async(format!("ws://{addr}/device")).await?;
    ws.send(Message::text(format!(
        r#"{{"type":"device:hello","manifest":{LAMP}}}"#
    )))
    .await?;
    // A read error ends the loop: the vessel closed the connection (a frame
    // the lamp cannot read is an error too: the vessel sends none).
    while let Some(Ok(message)) = ws.next().await {
        // Pings are answered by tungstenite on the next read or write.
        let Message::Text(text) = message else {
            continue;
        };
        let Some(result) = answer(text.as_str(), Channel::V1)? else {
            continue;
        };
        invoke_len.store(text.len(), Ordering::Relaxed);
        ws.send(Message::text(result)).await?;
    }
    Ok(())
}

/// The lamp's answer to a vessel frame on `channel`: a `device:result` for
/// an invoke, nothing for anything else.
fn answer(text: &str, channel: Channel) -> Result<Option<String>, BoxError> {
    let frame = VesselFrame::parse_on(text.as_bytes(), FrameLimits::default(), channel)?;
    let VesselFrame::Invoke { call_id, .. } = frame else {
        return Ok(None);
    };
    let result = RawValue::from_string(r#"{"on":true,"brightness":40}"#.to_owned())?;
    Ok(Some(
        DeviceFrame::Result {
            call_id,
            ok: true,
            result: Some(Cow::Owned(result)),
            error: None,
        }
        .to_json(),
    ))
}

/// The same lamp over dk/2: pairs by the exchange, then answers every
/// invoke at once, as the v1 lamp does.
async fn run_dk2_device(addr: SocketAddr) -> Result<(), BoxError> {
    let mut manifest: Value = serde_json::from_str(LAMP)?;
    if let Some(object) = manifest.as_object_mut() {
        object.insert("id".to_owned(), json!(DK2_ID));
    }
    let mut device = dk2_device::connect(&format!("ws://{addr}/device")).await?;
    device.hello(&manifest).await?;
    // `None` ends the loop: the vessel closed the connection.
    while let Some(text) = device.next_text().await? {
        if let Some(result) = answer(&text, Channel::Dk2)? {
            device.send_text(&result).await?;
        }
    }
    Ok(())
}

/// Pairs both lamps as the person, then measures the three kinds of round
/// trip.
async fn measure(
    vessel: &Arc<Vessel>,
    echo_addr: SocketAddr,
    invoke_len: &AtomicUsize,
) -> Result<Samples, BoxError> {
    approve_lamp(vessel, "desk-lamp").await?;
    approve_lamp(vessel, DK2_ID).await?;

    // The invoke frame's size is known after the first call.
    call(vessel, TOOL).await?;
    let size = invoke_len.load(Ordering::Relaxed);
    let payload = "x".repeat(size);
    let (mut echo, _) = connect_async(format!("ws://{echo_addr}/echo")).await?;

    let mut calls = Vec::with_capacity(BLOCK * BLOCKS);
    let mut dk2_calls = Vec::with_capacity(BLOCK * BLOCKS);
    let mut echoes = Vec::with_capacity(BLOCK * BLOCKS);
    for _ in 0..WARM_UP {
        call(vessel, TOOL).await?;
        call(vessel, DK2_TOOL).await?;
        echo_once(&mut echo, &payload).await?;
    }
    for _ in 0..BLOCKS {
        for _ in 0..BLOCK {
            let started = Instant::now();
            call(vessel, TOOL).await?;
            calls.push(started.elapsed());
        }
        for _ in 0..BLOCK {
            let started = Instant::now();
            call(vessel, DK2_TOOL).await?;
            dk2_calls.push(started.elapsed());
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
        dk2_calls,
        echoes,
        frame_bytes: size,
    })
}

/// Answers the pairing request of the lamp `id` and waits until it is
/// connected.
async fn approve_lamp(vessel: &Arc<Vessel>, id: &str) -> Result<(), BoxError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let consent = vessel
            .person()
            .pending()
            .into_iter()
            .find(|p| matches!(&p.prompt, Prompt::Consent(c) if c.device_id == id));
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
    while !vessel.links().is_connected(id) {
        if Instant::now() > deadline {
            return Err("the lamp did not connect after pairing".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// One allowed call of `tool`, end to end.
async fn call(vessel: &Vessel, tool: &str) -> Result<(), BoxError> {
    let outcome = vessel
        .adapter()
        .execute(
            tool,
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
    dk2_calls: Vec<Duration>,
    echoes: Vec<Duration>,
    frame_bytes: usize,
}

impl Samples {
    fn print(mut self) {
        let (Some(call), Some(dk2), Some(echo)) = (
            summary(&mut self.calls),
            summary(&mut self.dk2_calls),
            summary(&mut self.echoes),
        ) else {
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
            "{DK2_NAME:<32}median {:>7.1} µs   p99 {:>7.1} µs",
            micros(dk2.median),
            micros(dk2.p99)
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
        // The budgets: dk/2 at most 1.15x v1 and 1.3x the bare echo, by
        // their medians.
        let verdict = |ratio: f64, budget: f64| if ratio <= budget { "within" } else { "OVER" };
        let to_v1 = dk2.median.as_secs_f64() / call.median.as_secs_f64();
        println!(
            "{DK2_V1_NAME:<32}median {to_v1:>7.2}x     p99 {:>7.2}x   budget 1.15x: {}",
            dk2.p99.as_secs_f64() / call.p99.as_secs_f64(),
            verdict(to_v1, 1.15)
        );
        let to_echo = dk2.median.as_secs_f64() / echo.median.as_secs_f64();
        println!(
            "{DK2_ECHO_NAME:<32}median {to_echo:>7.2}x     p99 {:>7.2}x   budget 1.3x: {}",
            dk2.p99.as_secs_f64() / echo.p99.as_secs_f64(),
            verdict(to_echo, 1.3)
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
