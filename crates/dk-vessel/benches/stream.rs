//! Stream throughput: 64 KiB chunks from one voice device, over a real
//! WebSocket on loopback (`serve_devices`, a tokio-tungstenite device),
//! through the vessel's admission, cap and grant checks to one
//! `Vessel::subscribe_stream` subscriber; next to the same messages sent to
//! a bare WebSocket route (axum, hyper and tokio-tungstenite) that hands
//! each one to a bounded channel, measured in the same run. Blocks of each
//! alternate so both see the same machine; the median MiB/s of each, the
//! median time per chunk and their ratio are printed. Run with `cargo
//! xtask bench` (or `cargo bench -p dk-vessel --bench stream`). Times are
//! reported, never asserted on.

#[path = "bare_socket/mod.rs"]
mod bare_socket;
#[path = "../../dk-core/benches/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::get;
use dk_core::registry::ConsentDecision;
use dk_http::serve_devices;
use dk_policy::PolicySet;
use dk_proto::StreamChunk;
use dk_vessel::{Vessel, config::VesselConfig};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

use common::{BoxError, median, stopped};

const VOICE: &str = include_str!("../../../fixtures/manifests/valid/kitchen-voice.json");
const VESSEL_NAME: &str = "e2e/stream_64k_through_vessel";
const BARE_NAME: &str = "e2e/stream_64k_bare_websocket";
const RATIO_NAME: &str = "e2e/stream_ratio";

/// Payload bytes of each chunk.
const CHUNK: usize = 64 * 1024;
/// Chunks sent before waiting for the subscriber to have them all (below
/// the subscriber queue, so none is lost).
const WINDOW: usize = 32;
/// Blocks of each kind before measuring.
const WARM_UP: usize = 20;
/// Blocks of each kind measured.
const BLOCKS: usize = 60;
/// How long setting up may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(10);

fn main() -> Result<(), BoxError> {
    if common::filtered_out(&[VESSEL_NAME, BARE_NAME, RATIO_NAME]) {
        return Ok(());
    }
    common::multi_thread(None)?.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let (stop_tx, stop_rx) = watch::channel(false);

    // The vessel: voice admitted with a 64 KiB cap; the frame rate raised
    // (a device sending thousands of chunks a second would be closed).
    let vessel = Vessel::new(PolicySet::empty(), common::unthrottled());
    let config = VesselConfig::parse(&format!(
        "[streaming.voice]\nenabled = true\nrequireApproval = false\nsandbox = \"bench\"\n\
         [streaming.voice.limits]\nmaxChunkBytes = {CHUNK}\n"
    ))?;
    vessel.set_streaming(config.streaming);
    let manifest: serde_json::Value = serde_json::from_str(VOICE)?;
    let paired = vessel
        .registry()
        .pair(
            &manifest,
            |_| {},
            |_| async {
                Ok::<_, std::convert::Infallible>(ConsentDecision::approve(["microphone"]))
            },
            PATIENCE,
        )
        .await?;
    let devices = TcpListener::bind("127.0.0.1:0").await?;
    let device_url = format!("ws://{}/device", devices.local_addr()?);
    let serving = Arc::clone(&vessel);
    let vessel_server = tokio::spawn(serve_devices(devices, serving, stopped(stop_rx.clone())));

    // The bare route: every binary message into a bounded channel.
    let (bare_tx, mut bare_rx) = mpsc::channel::<Vec<u8>>(64);
    let bare = TcpListener::bind("127.0.0.1:0").await?;
    let bare_url = format!("ws://{}/bare", bare.local_addr()?);
    let app = Router::new().route(
        "/bare",
        get(move |request: Request| {
            let tx = bare_tx.clone();
            async move { bare_route(request, tx) }
        }),
    );
    let bare_stop = stopped(stop_rx.clone());
    let bare_server = tokio::spawn(async move {
        axum::serve(bare, app)
            .with_graceful_shutdown(bare_stop)
            .await
    });

    // The device: authenticates and waits to be admitted.
    let (mut device, _) = tokio::time::timeout(PATIENCE, connect_async(&device_url)).await??;
    let auth = json!({"type": "device:auth", "deviceId": "kitchen-voice",
                      "token": paired.token.expose(), "manifest": manifest});
    device.send(Message::text(auth.to_string())).await?;
    loop {
        match tokio::time::timeout(PATIENCE, device.next()).await? {
            Some(Ok(Message::Text(text))) if text.contains("device:streaming") => break,
            Some(Ok(_)) => {}
            other => return Err(format!("not admitted: {other:?}").into()),
        }
    }
    let mut subscription = vessel.subscribe_stream("kitchen-voice");
    let (mut bare_device, _) = tokio::time::timeout(PATIENCE, connect_async(&bare_url)).await??;

    let payload = vec![0x5a_u8; CHUNK];
    let mut seq = 0u64;
    let mut next_chunk = || {
        seq += 1;
        StreamChunk {
            stream: "microphone",
            seq,
            payload: &payload,
        }
        .encode()
        .unwrap_or_default()
    };

    let mut through_vessel = Vec::with_capacity(BLOCKS);
    let mut through_bare = Vec::with_capacity(BLOCKS);
    for block in 0..WARM_UP + BLOCKS {
        let started = Instant::now();
        for _ in 0..WINDOW {
            device.feed(Message::binary(next_chunk())).await?;
        }
        device.flush().await?;
        for _ in 0..WINDOW {
            let event = subscription.recv().await.ok_or("the vessel stopped")?;
            if event.payload().len() != CHUNK || event.lost_before() != 0 {
                return Err("a chunk was dropped or lost".into());
            }
        }
        let vessel_time = started.elapsed();

        let started = Instant::now();
        for _ in 0..WINDOW {
            bare_device.feed(Message::binary(next_chunk())).await?;
        }
        bare_device.flush().await?;
        for _ in 0..WINDOW {
            let message = bare_rx.recv().await.ok_or("the bare route stopped")?;
            if message.len() < CHUNK {
                return Err("a bare message was cut".into());
            }
        }
        let bare_time = started.elapsed();
        if block >= WARM_UP {
            through_vessel.push(vessel_time);
            through_bare.push(bare_time);
        }
    }

    let vessel_median = median(&mut through_vessel);
    let bare_median = median(&mut through_bare);
    report(VESSEL_NAME, vessel_median);
    report(BARE_NAME, bare_median);
    println!(
        "{RATIO_NAME:<34}  vessel/bare time {:.2}x  ({} chunks of {} KiB a block, {} blocks each)",
        vessel_median.as_secs_f64() / bare_median.as_secs_f64(),
        WINDOW,
        CHUNK / 1024,
        BLOCKS
    );
    let stats = vessel.stream_stats();
    let forwarded = stats
        .chunks_forwarded
        .load(std::sync::atomic::Ordering::Relaxed);
    let lost = stats.chunks_lost.load(std::sync::atomic::Ordering::Relaxed);
    println!("{RATIO_NAME:<34}  forwarded {forwarded} chunks, lost {lost}");

    let _ = device.close(None).await;
    let _ = bare_device.close(None).await;
    stop_tx.send_replace(true);
    vessel_server.await??;
    bare_server.await??;
    Ok(())
}

fn bare_route(request: Request, tx: mpsc::Sender<Vec<u8>>) -> Response {
    bare_socket::upgrade(request, move |mut socket| async move {
        while let Some(Ok(message)) = socket.next().await {
            if let Message::Binary(bytes) = message
                && tx.send(bytes.to_vec()).await.is_err()
            {
                return;
            }
        }
    })
}

/// One line: the median time per chunk (which `cargo xtask bench` keeps)
/// and the throughput it makes.
fn report(name: &str, block: Duration) {
    let per_chunk = block / WINDOW as u32;
    let mib = (WINDOW * CHUNK) as f64 / (1024.0 * 1024.0);
    println!(
        "{name:<34}  median {:>8.1} µs per chunk  {:>8.1} MiB/s",
        per_chunk.as_secs_f64() * 1e6,
        mib / block.as_secs_f64()
    );
}
