//! The voice device measured end to end (`cargo xtask bench voice`, or
//! `cargo bench -p dk-tests --bench voice`): a PulseAudio server of the
//! bench's own, a vessel in this process admitting the voice kind, and the
//! device (dk-voice behind dk-device's client, as `dk device voice` runs
//! it) in a process of its own, this bench started again, so its CPU and
//! memory are its alone.
//!
//! - `voice/stream_latency_beyond_chunk`: how long after a `listen_stream`
//!   chunk's last sample reached the microphone the chunk reaches the
//!   vessel's subscriber (the agent's side), beyond the chunk's own
//!   duration. The microphone hears a tone switched on every 600 ms; a
//!   recording of the same source in this process, read 5 ms at a time,
//!   says when each onset reached the source; the chunk holding it says
//!   where in it the onset is, so when its last sample was there. Median,
//!   p90 and extremes over every onset of 15 s of chunks of 100 ms.
//! - `voice/say_start_latency`: from the agent's `say "hello"` going to
//!   the vessel to the first speech on the speaker's monitor: the first
//!   call (espeak-ng loading its voice) on its own, then the median of the
//!   10 after it.
//! - `voice/device_cpu_streaming` and `voice/device_cpu_idle`: the device
//!   process's CPU time (user and system, from `/proc/<pid>/stat`) over
//!   10 s of streaming, and over 3 s connected and idle, as a share of one
//!   core.
//! - `voice/device_memory`: the device process's resident memory (VmRSS)
//!   and its peak (VmHWM) after streaming and speaking.
//!
//! Times are reported, never asserted on. Without PulseAudio the bench
//! says so and measures nothing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "a benchmark: anything that fails stops it, saying what"
)]

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dk_core::adapter::CallContext;
use dk_core::person::{ApprovalAnswer, Prompt};
use dk_core::registry::ConsentDecision;
use dk_device::{ClientOptions, ServeOptions, run_client, stream_channel};
use dk_policy::PolicySet;
use dk_testkit::pulse::{Feed, MIC_SOURCE, Pulse, SPEAKER_MONITOR, SPEAKER_SINK, pulse_or_skip};
use dk_vessel::config::VesselConfig;
use dk_vessel::{Limits, Vessel};
use dk_voice::{Endpoints, Voice, VoiceConfig};
use libpulse_binding::def::BufferAttr;
use libpulse_binding::sample::{Format, Spec};
use libpulse_binding::stream::Direction;
use libpulse_simple_binding::Simple;
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The device's side: set in the environment of the process this bench
/// starts again as the device.
const DEVICE_URL: &str = "DK_VOICE_BENCH_DEVICE";
const DEVICE_SERVER: &str = "DK_VOICE_BENCH_SERVER";
const DEVICE_KEY: &str = "DK_VOICE_BENCH_KEY";

const CONFIG: &str = "[streaming.voice]\nenabled = true\nrequireApproval = false\n\
                      sandbox = \"s\"\n[streaming.voice.limits]\nmaxChunkBytes = 65536\n";
const RATE: u32 = 16_000;
const CHUNK_MS: u32 = 100;
const CHUNK_SAMPLES: usize = (RATE * CHUNK_MS / 1000) as usize;
/// The reference recording's reads: 5 ms.
const REFERENCE_READ: usize = 80;
const STREAM_SECONDS: u64 = 15;
const SAYS: usize = 10;

fn main() -> Result<(), BoxError> {
    if let Ok(url) = std::env::var(DEVICE_URL) {
        return device(&url);
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty()
        && !filter
            .iter()
            .any(|f| "voice/".contains(f.as_str()) || f.starts_with("voice"))
    {
        return Ok(());
    }
    let Some(binary) = pulse_or_skip("voice bench") else {
        println!("voice/skipped: pulseaudio is not installed (cargo xtask peers)");
        return Ok(());
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(&binary))
}

/// The device process: the voice device served to the vessel until its
/// standard input closes.
fn device(url: &str) -> Result<(), BoxError> {
    let server = std::env::var(DEVICE_SERVER)?;
    let key = std::env::var(DEVICE_KEY)?;
    let voice = Voice::new(VoiceConfig {
        endpoints: Endpoints {
            server: Some(server),
            source: Some(MIC_SOURCE.to_owned()),
            sink: Some(SPEAKER_SINK.to_owned()),
        },
        ..VoiceConfig::default()
    })?;
    let device = voice.device().clone();
    let (events, receiver) = device.events(16);
    voice.set_events(events);
    let (chunks, outbox) = stream_channel(dk_device::DEFAULT_STREAM_QUEUE);
    voice.set_stream(chunks);
    let options = ClientOptions::new(url)
        .key_file(key)
        .serve(ServeOptions::new().events(receiver))
        .streams(outbox);
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = closed_tx.send(());
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_client(&device, options, async {
            let _ = closed_rx.await;
        }))?;
    Ok(())
}

/// Reads of a source, each with the moment it returned.
type Reads = Arc<Mutex<Vec<(Instant, Vec<i16>)>>>;

/// Samples read from a source 5 ms at a time, each read with the moment
/// it returned.
struct Reference {
    done: Arc<AtomicBool>,
    reads: Reads,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reference {
    fn start(pulse: &Pulse, source: &str) -> Reference {
        let attr = BufferAttr {
            maxlength: u32::MAX,
            tlength: u32::MAX,
            prebuf: u32::MAX,
            minreq: u32::MAX,
            fragsize: (REFERENCE_READ * 2) as u32,
        };
        let spec = Spec {
            format: Format::S16le,
            channels: 1,
            rate: RATE,
        };
        let input = Simple::new(
            Some(&pulse.server()),
            "dk bench",
            Direction::Record,
            Some(source),
            "reference",
            &spec,
            None,
            Some(&attr),
        )
        .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reads: Reads = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (done, reads) = (Arc::clone(&done), Arc::clone(&reads));
            std::thread::spawn(move || {
                let mut bytes = vec![0u8; REFERENCE_READ * 2];
                while !done.load(Ordering::Acquire) {
                    input.read(&mut bytes).unwrap();
                    let at = Instant::now();
                    let samples = bytes
                        .chunks_exact(2)
                        .map(|p| i16::from_le_bytes([p[0], p[1]]))
                        .collect();
                    reads.lock().unwrap().push((at, samples));
                }
            })
        };
        Reference {
            done,
            reads,
            thread: Some(thread),
        }
    }

    /// When each sample reached the source: a read's last sample when the
    /// read returned, the others a sample's time earlier each.
    fn finish(mut self) -> Vec<(Instant, i16)> {
        self.done.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        let reads = std::mem::take(&mut *self.reads.lock().unwrap());
        let mut out = Vec::new();
        for (at, samples) in reads {
            let n = samples.len();
            for (j, s) in samples.into_iter().enumerate() {
                out.push((at - sample_time(n - 1 - j), s));
            }
        }
        out
    }
}

fn sample_time(samples: usize) -> Duration {
    Duration::from_secs_f64(samples as f64 / f64::from(RATE))
}

/// Where a sound starts after at least 50 ms of quiet, as indexes.
fn onsets(samples: impl Iterator<Item = i16>) -> Vec<usize> {
    let mut quiet = 0usize;
    let mut out = Vec::new();
    for (i, s) in samples.enumerate() {
        if s.unsigned_abs() >= 2000 {
            if quiet >= (RATE / 20) as usize {
                out.push(i);
            }
            quiet = 0;
        } else if s.unsigned_abs() < 500 {
            quiet += 1;
        }
    }
    out
}

/// The device process's CPU time so far (user and system), from
/// `/proc/<pid>/stat`.
fn cpu_time(pid: u32, ticks_per_second: f64) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's name in parentheses: state is field 3, utime 14
    // and stime 15 of the whole line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at]
}

/// Answers the next approval on the person channel with a yes.
async fn approve(vessel: &Vessel) {
    let id = dk_testkit::eventually_some("an approval", || {
        vessel
            .person()
            .pending()
            .into_iter()
            .find(|p| matches!(p.prompt, Prompt::Approval(_)))
            .map(|p| p.id)
    })
    .await;
    vessel
        .person()
        .answer_approval_with(id, ApprovalAnswer::Once)
        .unwrap();
}

/// An agent's call, the person's channel as its approver.
async fn call(vessel: &Arc<Vessel>, tool: &'static str, input: Value) -> Value {
    let vessel = Arc::clone(vessel);
    tokio::spawn(async move {
        let ctx = CallContext {
            agent_id: Some("bench"),
            approver: Some(vessel.person().as_ref()),
            timeout: Some(Duration::from_secs(60)),
            ..CallContext::default()
        };
        let outcome = vessel.adapter().execute(tool, input, ctx).await;
        serde_json::to_value(outcome).unwrap()
    })
    .await
    .unwrap()
}

async fn run(binary: &std::path::Path) -> Result<(), BoxError> {
    let pulse = Pulse::start(binary);
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    vessel.set_streaming(VesselConfig::parse(CONFIG)?.streaming);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("ws://{}/device", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(dk_http::serve_devices(
        listener,
        Arc::clone(&vessel),
        async {
            let _ = stopped.await;
        },
    ));
    let dir = tempfile::tempdir()?;
    let mut child: Child = Command::new(std::env::current_exe()?)
        .env(DEVICE_URL, &url)
        .env(DEVICE_SERVER, pulse.server())
        .env(DEVICE_KEY, dir.path().join("voice.key"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id();
    let consent = dk_testkit::eventually_some("the device's pairing", || {
        vessel
            .person()
            .pending()
            .into_iter()
            .find(|p| matches!(p.prompt, Prompt::Consent(_)))
            .map(|p| p.id)
    })
    .await;
    vessel.person().answer_consent(
        consent,
        ConsentDecision::approve(["listen", "listen_stream", "say", "play", "stop"]),
    )?;
    dk_testkit::eventually("the device connected", || {
        vessel.links().is_connected("voice")
    })
    .await;
    let ticks = clock_ticks();

    // Idle, connected.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (idle_from, idle_at) = (cpu_time(pid, ticks), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = (cpu_time(pid, ticks) - idle_from).as_secs_f64() / idle_at.elapsed().as_secs_f64();

    // Streaming: the microphone hears a tone switched on every 600 ms.
    let feed = Feed::start(&pulse, Duration::from_millis(20));
    let toggling = Arc::new(AtomicBool::new(true));
    let toggler = {
        let toggling = Arc::clone(&toggling);
        let feed = Arc::new(feed);
        let held = Arc::clone(&feed);
        let thread = std::thread::spawn(move || {
            while toggling.load(Ordering::Acquire) {
                feed.tone(440.0, 12_000);
                std::thread::sleep(Duration::from_millis(300));
                feed.silence();
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        (thread, held)
    };
    let reference = Reference::start(&pulse, MIC_SOURCE);
    let mut chunks = vessel.subscribe_stream("voice");
    let asked = {
        let vessel = Arc::clone(&vessel);
        tokio::spawn(async move {
            call(
                &vessel,
                "device__voice__listen_stream",
                json!({"max_seconds": STREAM_SECONDS + 5, "chunk_ms": CHUNK_MS}),
            )
            .await
        })
    };
    approve(&vessel).await;
    let started = asked.await?;
    assert_eq!(started["ok"], json!(true), "{started}");
    let mut received: Vec<(Instant, Vec<i16>)> = Vec::new();
    let mut cpu_window = None;
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(STREAM_SECONDS) {
        let chunk = tokio::time::timeout(Duration::from_secs(5), chunks.recv())
            .await?
            .ok_or("the stream ended")?;
        let at = Instant::now();
        assert!(chunk.verdict().accepted(), "{:?}", chunk.verdict());
        received.push((at, dk_voice::audio::samples(chunk.payload())));
        if cpu_window.is_none() && began.elapsed() >= Duration::from_secs(2) {
            cpu_window = Some((cpu_time(pid, ticks), Instant::now()));
        }
    }
    let (cpu_from, cpu_at) = cpu_window.ok_or("no CPU window")?;
    let streaming =
        (cpu_time(pid, ticks) - cpu_from).as_secs_f64() / cpu_at.elapsed().as_secs_f64();
    let stopped_call = call(&vessel, "device__voice__stop", json!({})).await;
    assert_eq!(stopped_call["ok"], json!(true), "{stopped_call}");
    toggling.store(false, Ordering::Release);
    toggler.0.join().unwrap();
    let reference = reference.finish();

    let ref_onsets: Vec<Instant> = onsets(reference.iter().map(|(_, s)| *s))
        .into_iter()
        .map(|i| reference[i].0)
        .collect();
    let chunk_samples: Vec<i16> = received
        .iter()
        .flat_map(|(_, s)| s.iter().copied())
        .collect();
    let mut latencies = Vec::new();
    for onset in onsets(chunk_samples.iter().copied()) {
        let (chunk, offset) = (onset / CHUNK_SAMPLES, onset % CHUNK_SAMPLES);
        let Some((arrived, samples)) = received.get(chunk) else {
            continue;
        };
        if samples.len() != CHUNK_SAMPLES {
            continue;
        }
        // When the onset would have reached the source, had the chunk come
        // the moment its last sample did.
        let complete_after = sample_time(CHUNK_SAMPLES - offset);
        let Some(predicted) = arrived.checked_sub(complete_after) else {
            continue;
        };
        let nearest = ref_onsets.iter().min_by_key(|r| {
            if **r > predicted {
                **r - predicted
            } else {
                predicted - **r
            }
        });
        if let Some(at_source) = nearest {
            let beyond = predicted.saturating_duration_since(*at_source);
            let before = at_source.saturating_duration_since(predicted);
            if before > Duration::ZERO {
                // The chunk came before the reference heard the onset: the
                // reference's own reads were late; counted as zero.
                latencies.push(0.0);
            } else if beyond < Duration::from_millis(250) {
                latencies.push(beyond.as_secs_f64() * 1000.0);
            }
        }
    }
    latencies.sort_by(f64::total_cmp);

    // say: from the call to the first speech on the speaker's monitor.
    let mut says = Vec::new();
    for _ in 0..=SAYS {
        let speaker = Reference::start(&pulse, SPEAKER_MONITOR);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked_at = Instant::now();
        let said = call(&vessel, "device__voice__say", json!({"text": "hello"})).await;
        assert_eq!(said["ok"], json!(true), "{said}");
        let heard = speaker.finish();
        let first = heard
            .iter()
            .find(|(at, s)| *at >= asked_at && s.unsigned_abs() >= 1000)
            .ok_or("no speech heard")?;
        says.push((first.0 - asked_at).as_secs_f64() * 1000.0);
    }
    let first_say = says.remove(0);
    says.sort_by(f64::total_cmp);
    let rss = status_kib(pid, "VmRSS:");
    let peak = status_kib(pid, "VmHWM:");

    println!(
        "voice/stream_latency_beyond_chunk: median {:.1} ms, p90 {:.1} ms, min {:.1} ms, max {:.1} ms \
         ({} onsets in {} chunks of {CHUNK_MS} ms: from a chunk's last sample at the microphone to the \
         chunk at the vessel's subscriber)",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        latencies.first().copied().unwrap_or_default(),
        latencies.last().copied().unwrap_or_default(),
        latencies.len(),
        received.len()
    );
    println!(
        "voice/say_start_latency: median {:.0} ms, min {:.0} ms, max {:.0} ms ({SAYS} calls of say \"hello\" \
         after the first, which took {first_say:.0} ms: the call to the first speech on the speaker)",
        percentile(&says, 0.5),
        says.first().copied().unwrap_or_default(),
        says.last().copied().unwrap_or_default()
    );
    println!(
        "voice/device_cpu_streaming: {:.2}% of one core (the device process, streaming chunks of {CHUNK_MS} ms)",
        streaming * 100.0
    );
    println!(
        "voice/device_cpu_idle: {:.2}% of one core (the device process, connected and idle)",
        idle * 100.0
    );
    println!(
        "voice/device_memory: {rss} KiB resident, {peak} KiB at most (the device process, after streaming and speaking)"
    );

    drop(child.stdin.take());
    let _ = child.wait();
    let _ = stop.send(());
    let _ = server.await;
    drop(toggler.1);
    Ok(())
}
