//! Tests of the stream path over real WebSocket connections on loopback:
//! every admission row reached through a connect, chunk bounds, hostile
//! messages, slow subscribers, session caps, resumes admitted afresh.

use std::sync::Arc;

use dk_policy::PolicySet;
use dk_proto::{STREAM_HEADER_BYTES, StreamChunk};
use dk_testkit::{eventually, eventually_some};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::stream::*;
use crate::vessel::Vessel;
use std::sync::atomic::Ordering;

use crate::config::{StreamingConfig, VesselConfig};
use crate::registry::ConsentDecision;
use crate::vessel::Limits;
use dk_proto::CloseCode;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

fn manifest(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/manifests/valid")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn voice() -> Value {
    manifest("kitchen-voice.json")
}

const VOICE: &str = "kitchen-voice";

/// `[streaming.voice]` with the given lines, cap 1024 unless they say.
fn voice_config(lines: &str) -> StreamingConfig {
    VesselConfig::parse(&format!("[streaming.voice]\n{lines}"))
        .unwrap()
        .streaming
}

const OPEN: &str = "enabled = true\nrequireApproval = false\nsandbox = \"s\"\n\
                    [streaming.voice.limits]\nmaxChunkBytes = 1024\n\
                    [streaming.voice.runLimits]\nmaxToolCalls = 8\n";

struct Running {
    vessel: Arc<Vessel>,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.server.await.unwrap().unwrap();
    }
}

async fn start_with(limits: Limits, streaming: StreamingConfig) -> Running {
    let vessel = Vessel::new(PolicySet::empty(), limits);
    vessel.set_streaming(streaming);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/device", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::serve_devices(listener, Arc::clone(&vessel), async {
        let _ = stopped.await;
    }));
    Running {
        vessel,
        url,
        stop: Some(stop),
        server,
    }
}

async fn start(streaming: StreamingConfig) -> Running {
    start_with(Limits::default(), streaming).await
}

/// Pairs `manifest` straight through the registry; returns the token.
async fn pair(vessel: &Vessel, manifest: &Value, grant: &[&str]) -> String {
    let grant: Vec<String> = grant.iter().map(|g| (*g).to_owned()).collect();
    let paired = vessel
        .registry()
        .pair(
            manifest,
            |_| {},
            |_| async move { Ok::<_, std::convert::Infallible>(ConsentDecision::approve(grant)) },
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap();
    paired.token.expose().to_owned()
}

async fn open(url: &str) -> Ws {
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

async fn auth(url: &str, id: &str, token: &str, manifest: &Value) -> Ws {
    let mut ws = open(url).await;
    let frame =
        json!({"type": "device:auth", "deviceId": id, "token": token, "manifest": manifest});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    ws
}

/// The next text frame, or the close (code, reason).
async fn next(ws: &mut Ws) -> Result<Value, (u16, String)> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => return Ok(serde_json::from_str(&text).unwrap()),
            Some(Ok(Message::Close(Some(frame)))) => {
                return Err((frame.code.into(), frame.reason.as_str().to_owned()));
            }
            Some(Ok(Message::Close(None))) | None | Some(Err(_)) => {
                return Err((0, String::new()));
            }
            Some(Ok(_)) => {}
        }
    }
}

async fn closed(ws: &mut Ws) -> (u16, String) {
    loop {
        if let Err(close) = next(ws).await {
            return close;
        }
    }
}

/// Waits for `device:streaming` and returns it.
async fn admitted(ws: &mut Ws) -> Value {
    let frame = next(ws).await.unwrap();
    assert_eq!(frame["type"], json!("device:streaming"), "{frame}");
    frame
}

fn chunk(stream: &str, seq: u64, payload: &[u8]) -> Message {
    Message::binary(
        StreamChunk {
            stream,
            seq,
            payload,
        }
        .encode()
        .unwrap(),
    )
}

async fn audit_kinds(vessel: &Vessel, kind: &str) -> Vec<Value> {
    vessel.flush_audit().unwrap();
    vessel
        .registry()
        .store()
        .read_audit(0, 10_000)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.entry)
        .collect()
}

/// Answers the next approval prompt.
async fn answer_approval(vessel: &Vessel, yes: bool) -> crate::adapter::ApprovalRequest {
    let (id, request) = eventually_some("an approval prompt", || {
        vessel
            .person()
            .pending()
            .into_iter()
            .find_map(|prompt| match prompt.prompt {
                crate::person::Prompt::Approval(request) => Some((prompt.id, request)),
                _ => None,
            })
    })
    .await;
    vessel.person().answer_approval(id, yes).unwrap();
    request
}

#[track_caller]
fn refused_with(close: (u16, String), code: &str, message: &str) {
    assert_eq!(close.0, CloseCode::AdmissionRefused.code(), "{close:?}");
    assert_eq!(close.1, format!("{code}: {message}"));
}

/// Connects the paired voice device under `config` and returns its close.
async fn resume_under(config: StreamingConfig, limits: Limits) -> (Running, (u16, String)) {
    let running = start_with(limits, config).await;
    let token = pair(&running.vessel, &voice(), &["microphone"]).await;
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    let close = closed(&mut ws).await;
    (running, close)
}

#[tokio::test]
async fn every_admission_row_is_reached_through_a_connect() {
    // Not configured at all: deny by default.
    let (running, close) = resume_under(StreamingConfig::deny_all(), Limits::default()).await;
    refused_with(
        close,
        "ERR_PRISM_DEVICE_DISABLED",
        "voice device is disabled by default",
    );
    let audited = audit_kinds(&running.vessel, "stream_admission").await;
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0]["admitted"], json!(false));
    assert_eq!(audited[0]["code"], json!("ERR_PRISM_DEVICE_DISABLED"));
    assert_eq!(audited[0]["stage"], json!("resume"));
    assert_eq!(
        running
            .vessel
            .stream_stats()
            .refused
            .load(Ordering::Relaxed),
        1
    );
    running.stop().await;

    // Configured but not enabled.
    let (running, close) = resume_under(
        voice_config("enabled = false\nsandbox = \"s\""),
        Limits::default(),
    )
    .await;
    refused_with(
        close,
        "ERR_PRISM_DEVICE_DISABLED",
        "voice device is disabled by default",
    );
    running.stop().await;

    // Enabled without a sandbox.
    let (running, close) = resume_under(voice_config("enabled = true"), Limits::default()).await;
    refused_with(
        close,
        "ERR_PRISM_DEVICE_DISABLED",
        "voice device requires an explicit sandbox",
    );
    running.stop().await;

    // No run limits anywhere: neither the policy nor the vessel charges calls.
    let limits = Limits {
        run_limits: None,
        ..Limits::default()
    };
    let (running, close) = resume_under(
        voice_config("enabled = true\nrequireApproval = false\nsandbox = \"s\""),
        limits,
    )
    .await;
    refused_with(
        close,
        "ERR_PRISM_DEVICE_RUN_LIMITS",
        "voice device must consume shared RunLimits",
    );
    running.stop().await;

    // The vessel charging every call to a run budget is shared run limits.
    let running = start(voice_config(
        "enabled = true\nrequireApproval = false\nsandbox = \"s\"",
    ))
    .await;
    let token = pair(&running.vessel, &voice(), &[]).await;
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    running.stop().await;
}

#[tokio::test]
async fn approval_is_asked_on_every_resume_and_a_no_refuses() {
    let running = start(voice_config(
        "enabled = true\nsandbox = \"s\"\n[streaming.voice.runLimits]\n",
    ))
    .await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;

    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    let asked = answer_approval(&vessel, false).await;
    assert_eq!(asked.device_id, VOICE);
    assert_eq!(asked.tool, "stream:voice");
    refused_with(
        closed(&mut ws).await,
        "ERR_PRISM_DEVICE_APPROVAL",
        "voice device side effect requires approval",
    );

    // Approved this time: admitted, and told its cap.
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    answer_approval(&vessel, true).await;
    let frame = admitted(&mut ws).await;
    assert_eq!(frame["kind"], json!("voice"));
    assert_eq!(frame["maxChunkBytes"], json!(1_048_576));
    assert_eq!(frame["maxConcurrentSessions"], json!(1));
    ws.close(None).await.unwrap();
    eventually("the voice session closed", || {
        vessel.stream_sessions(VOICE) == 0
    })
    .await;

    // The next resume asks again.
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    answer_approval(&vessel, true).await;
    admitted(&mut ws).await;
    let audited = audit_kinds(&vessel, "stream_admission").await;
    let outcomes: Vec<&Value> = audited.iter().map(|e| &e["admitted"]).collect();
    assert_eq!(outcomes, [&json!(false), &json!(true), &json!(true)]);
    running.stop().await;
}

#[tokio::test]
async fn pairing_is_admitted_after_the_persons_yes_and_refused_before_asking() {
    // Disabled: refused at hello, the person never asked.
    let running = start(StreamingConfig::deny_all()).await;
    let mut ws = open(&running.url).await;
    let hello = json!({"type": "device:hello", "manifest": voice()});
    ws.send(Message::text(hello.to_string())).await.unwrap();
    refused_with(
        closed(&mut ws).await,
        "ERR_PRISM_DEVICE_DISABLED",
        "voice device is disabled by default",
    );
    assert!(running.vessel.person().pending().is_empty());
    assert!(!running.vessel.registry().is_paired(VOICE));
    running.stop().await;

    // Enabled with approval required: the consent to pair is the approval.
    let running = start(voice_config(
        "enabled = true\nsandbox = \"s\"\n[streaming.voice.runLimits]\n",
    ))
    .await;
    let mut ws = open(&running.url).await;
    ws.send(Message::text(hello.to_string())).await.unwrap();
    let pairing = next(&mut ws).await.unwrap();
    assert_eq!(pairing["type"], json!("device:pairing"));
    let prompt = eventually_some("the consent prompt", || {
        running.vessel.person().pending().into_iter().next()
    })
    .await;
    running
        .vessel
        .person()
        .answer_consent(prompt.id, ConsentDecision::approve(["microphone"]))
        .unwrap();
    assert_eq!(next(&mut ws).await.unwrap()["type"], json!("device:paired"));
    admitted(&mut ws).await;
    let audited = audit_kinds(&running.vessel, "stream_admission").await;
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0]["stage"], json!("pair"));
    running.stop().await;
}

#[tokio::test]
async fn sessions_at_the_cap_are_admitted_and_over_it_refused() {
    let running = start(voice_config(&format!(
        "{OPEN}maxConcurrentSessions = 2\n"
    )
    .replace(
        "maxChunkBytes = 1024\n[streaming.voice.runLimits]\nmaxToolCalls = 8\nmaxConcurrentSessions = 2\n",
        "maxChunkBytes = 1024\nmaxConcurrentSessions = 2\n[streaming.voice.runLimits]\nmaxToolCalls = 8\n",
    )))
    .await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    let mut first = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut first).await;
    let mut second = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut second).await;
    assert_eq!(vessel.stream_sessions(VOICE), 2);
    let mut third = auth(&running.url, VOICE, &token, &voice()).await;
    refused_with(
        closed(&mut third).await,
        "ERR_PRISM_DEVICE_SESSIONS",
        "concurrent voice sessions capped at 2",
    );
    // A place freed is a place taken again.
    second.close(None).await.unwrap();
    eventually("one voice session left", || {
        vessel.stream_sessions(VOICE) == 1
    })
    .await;
    let mut fourth = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut fourth).await;
    assert_eq!(vessel.stream_sessions(VOICE), 2);
    running.stop().await;
}

#[tokio::test]
async fn a_resume_is_admitted_afresh_under_the_config_of_the_moment() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    ws.close(None).await.unwrap();
    eventually("the voice session closed", || {
        vessel.stream_sessions(VOICE) == 0
    })
    .await;
    vessel.set_streaming(voice_config("enabled = false"));
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    refused_with(
        closed(&mut ws).await,
        "ERR_PRISM_DEVICE_DISABLED",
        "voice device is disabled by default",
    );
    running.stop().await;
}

#[tokio::test]
async fn a_v1_device_is_unaffected_and_its_binary_is_malformed() {
    let running = start(StreamingConfig::deny_all()).await;
    let lamp = dk_testkit::lamp();
    let token = pair(&running.vessel, &lamp, &["read_light"]).await;
    let mut ws = auth(&running.url, "desk-lamp", &token, &lamp).await;
    ws.send(chunk("read_light", 0, b"x")).await.unwrap();
    let error = next(&mut ws).await.unwrap();
    assert_eq!(
        error,
        json!({"type": "device:error", "error": "frames are JSON text"})
    );
    assert_eq!(running.vessel.stream_sessions("desk-lamp"), 0);
    running.stop().await;
}

#[tokio::test]
async fn chunks_at_every_edge_of_the_cap() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    let mut subscription = vessel.subscribe_stream(VOICE);
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    let cap = 1024usize;
    for (seq, len) in [0usize, cap - 1, cap].into_iter().enumerate() {
        let payload: Vec<u8> = (0..len).map(|i| (i % 256) as u8).collect();
        ws.send(chunk("microphone", seq as u64, &payload))
            .await
            .unwrap();
        let event = subscription.recv().await.unwrap();
        assert_eq!(event.seq(), seq as u64);
        assert!(event.verdict().accepted());
        assert_eq!(event.payload(), payload.as_slice());
        assert_eq!(event.stream(), "microphone");
        assert_eq!(event.device_id(), VOICE);
    }
    // One byte over: dropped, never forwarded, reported to the device and
    // to subscribers with the marker.
    ws.send(chunk("microphone", 3, &vec![7; cap + 1]))
        .await
        .unwrap();
    let report = next(&mut ws).await.unwrap();
    assert_eq!(
        report,
        json!({"stream": "microphone", "seq": 3, "accepted": false, "bytes": cap + 1,
               "marker": "dropped_oversize", "type": "device:stream-dropped"})
    );
    let event = subscription.recv().await.unwrap();
    assert!(!event.verdict().accepted());
    assert_eq!(event.verdict().marker(), Some("dropped_oversize"));
    assert!(event.payload().is_empty());
    let metadata = vessel.stream_metadata(&event);
    assert_eq!(metadata["marker"], json!("dropped_oversize"));
    assert_eq!(metadata["bytes"], json!(cap + 1));
    // Twice the cap is still read and dropped; more closes the connection.
    ws.send(chunk("microphone", 4, &vec![0; 2 * cap]))
        .await
        .unwrap();
    assert_eq!(next(&mut ws).await.unwrap()["bytes"], json!(2 * cap));
    let stats = vessel.stream_stats();
    assert_eq!(stats.chunks_forwarded.load(Ordering::Relaxed), 3);
    assert_eq!(
        stats.bytes_forwarded.load(Ordering::Relaxed),
        (2 * cap - 1) as u64
    );
    assert_eq!(stats.chunks_dropped_oversize.load(Ordering::Relaxed), 2);
    ws.send(chunk("microphone", 5, &vec![0; 2 * cap + 100]))
        .await
        .unwrap();
    let (code, reason) = closed(&mut ws).await;
    assert_eq!(code, 1009);
    assert_eq!(
        reason,
        format!("stream messages are at most {} bytes", 2 * cap + 46)
    );
    running.stop().await;
}

#[tokio::test]
async fn hostile_chunks_are_malformed_and_never_forwarded() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    let mut subscription = vessel.subscribe_stream(VOICE);
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    let good = StreamChunk {
        stream: "microphone",
        seq: 1,
        payload: b"hello",
    }
    .encode()
    .unwrap();
    // A header claiming more than the message holds.
    let mut truncated = good.clone();
    truncated.pop();
    ws.send(Message::binary(truncated)).await.unwrap();
    let error = next(&mut ws).await.unwrap();
    assert_eq!(error["type"], json!("device:error"));
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("declares 31 bytes but the message holds 30")
    );
    // A header claiming 4 GiB.
    let mut huge = good.clone();
    huge[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
    ws.send(Message::binary(huge)).await.unwrap();
    assert!(
        next(&mut ws).await.unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("declares")
    );
    // Truncated inside the header.
    ws.send(Message::binary(good[..STREAM_HEADER_BYTES - 1].to_vec()))
        .await
        .unwrap();
    assert!(
        next(&mut ws).await.unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("shorter")
    );
    // A stream that is an actuator, not a sensor: malformed too; the fourth
    // malformed message closes the connection.
    ws.send(chunk("set_volume", 2, b"x")).await.unwrap();
    assert_eq!(closed(&mut ws).await.0, CloseCode::Malformed.code());
    // Nothing reached the subscriber.
    assert!(subscription.try_recv().is_none());
    assert_eq!(
        vessel
            .stream_stats()
            .chunks_forwarded
            .load(Ordering::Relaxed),
        0
    );
    running.stop().await;
}

#[tokio::test]
async fn a_stream_not_granted_is_dropped() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    // The person granted read_status, not microphone.
    let token = pair(&vessel, &voice(), &["read_status"]).await;
    let mut subscription = vessel.subscribe_stream(VOICE);
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    ws.send(chunk("microphone", 1, b"secret audio"))
        .await
        .unwrap();
    ws.send(chunk("read_status", 2, b"ok")).await.unwrap();
    let event = subscription.recv().await.unwrap();
    assert_eq!(event.seq(), 2);
    assert_eq!(
        vessel
            .stream_stats()
            .chunks_not_granted
            .load(Ordering::Relaxed),
        1
    );
    running.stop().await;
}

#[tokio::test]
async fn a_slow_subscriber_loses_chunks_and_is_told_how_many() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    let mut slow = vessel.subscribe_stream(VOICE);
    let mut fast = vessel.subscribe_stream(VOICE);
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    let extra = 5;
    let total = STREAM_SUBSCRIBER_QUEUE + extra;
    let reader = tokio::spawn(async move {
        let mut seqs = Vec::new();
        while seqs.len() < total + 1 {
            let event = fast.recv().await.unwrap();
            assert_eq!(event.lost_before(), 0);
            seqs.push(event.seq());
        }
        seqs
    });
    for seq in 0..total as u64 {
        ws.send(chunk("microphone", seq, &[1; 640])).await.unwrap();
    }
    eventually("every chunk forwarded", || {
        vessel
            .stream_stats()
            .chunks_forwarded
            .load(Ordering::Relaxed)
            == total as u64
    })
    .await;
    // The slow one holds exactly its queue; the rest were lost, not kept.
    for seq in 0..STREAM_SUBSCRIBER_QUEUE as u64 {
        let event = slow.try_recv().unwrap();
        assert_eq!(event.seq(), seq);
        assert_eq!(event.lost_before(), 0);
    }
    assert!(slow.try_recv().is_none());
    assert_eq!(slow.lost(), extra as u64);
    ws.send(chunk("microphone", 999, &[1; 640])).await.unwrap();
    let event = slow.recv().await.unwrap();
    assert_eq!(event.seq(), 999);
    assert_eq!(event.lost_before(), extra as u64);
    let seqs = reader.await.unwrap();
    assert_eq!(seqs.len(), total + 1);
    assert_eq!(
        vessel.stream_stats().chunks_lost.load(Ordering::Relaxed),
        extra as u64
    );
    running.stop().await;
}

#[tokio::test]
async fn stream_metadata_goes_through_the_redactor() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    // A host secret that happens to be the stream's name.
    vessel.add_secret("microphone");
    let mut subscription = vessel.subscribe_stream(VOICE);
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    ws.send(chunk("microphone", 1, b"pcm")).await.unwrap();
    let event = subscription.recv().await.unwrap();
    let metadata = vessel.stream_metadata(&event);
    assert_eq!(metadata["stream"], json!("[REDACTED]"));
    assert_eq!(metadata["deviceId"], json!(VOICE));
    assert_eq!(metadata["accepted"], json!(true));
    running.stop().await;
}

#[tokio::test]
async fn nothing_is_kept_for_a_device_nobody_streams_or_watches() {
    let running = start(voice_config(OPEN)).await;
    let vessel = Arc::clone(&running.vessel);
    let token = pair(&vessel, &voice(), &["microphone"]).await;
    for id in ["nobody", "nobody-else", VOICE] {
        drop(vessel.subscribe_stream(id));
    }
    assert_eq!(vessel.stream_devices_tracked(), 0);
    let watching = vessel.subscribe_stream(VOICE);
    let mut ws = auth(&running.url, VOICE, &token, &voice()).await;
    admitted(&mut ws).await;
    assert_eq!(vessel.stream_devices_tracked(), 1);
    drop(watching);
    assert_eq!(vessel.stream_devices_tracked(), 1);
    ws.close(None).await.unwrap();
    eventually("no stream device tracked", || {
        vessel.stream_devices_tracked() == 0
    })
    .await;
    running.stop().await;
}
