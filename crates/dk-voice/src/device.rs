//! The voice device: its manifest, one handler per capability (each input
//! checked before anything reaches the sound server), the microphone's
//! state that every front end reads, and the stop that ends everything.
//!
//! The microphone is open for one call at a time (`listen` or a
//! `listen_stream` session). While it is open the device says so: an event
//! on the capability (`{"microphone": "live", ...}`, then `"off"` with why
//! it ended) that the vessel shows the person and agents, and
//! [`Voice::live`] for this machine's terminal. A stop (the `stop`
//! capability, or [`Voice::stop`]) sets the flags the capture and playback
//! threads check between 20 ms frames and wakes the call at once; a frame
//! read after the stop is never handed on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use base64::Engine as _;
use dk_device::{DefineError, Device, EventSender, HandlerError, StreamSender};
use dk_proto::media::{AudioContent, AudioMime};
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, watch};

use crate::audio::{self, FRAME_MS, FRAME_SAMPLES, RATE};
use crate::pulse::{self, Endpoints};
use crate::vad::{Ended, Vad, VadSettings};

/// The manifest's kind.
pub const KIND: &str = "voice";
/// Longest `listen`, in seconds: its WAV (32,000 bytes a second), in
/// base64, fits a result's frame of 1 MiB.
pub const MAX_LISTEN_SECONDS: u32 = 20;
/// Longest `listen_stream` session, in seconds.
pub const MAX_STREAM_SECONDS: u32 = 600;
/// A `listen_stream` chunk's length when the call names none, in ms.
pub const DEFAULT_CHUNK_MS: u32 = 100;
/// Longest `listen_stream` chunk, in ms.
pub const MAX_CHUNK_MS: u32 = 1000;
/// Longest text `say` speaks, in characters (UTF-16 units, as the vessel
/// counts them).
pub const MAX_SAY_TEXT: usize = dk_proto::limits::INPUT_STRING;
/// Longest sound `play` plays, in seconds.
pub const MAX_PLAY_SECONDS: u32 = 15;
/// The stream `listen_stream` sends its chunks on.
pub const STREAM: &str = "listen_stream";
/// Frames waiting between the capture thread and the call.
const CAPTURE_QUEUE: usize = 64;

/// Why the device could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The manifest was refused (an id or name out of bounds).
    #[error("{0}")]
    Manifest(#[from] DefineError),
}

/// The device's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceConfig {
    /// The device id.
    pub id: String,
    /// The name the person sees.
    pub name: String,
    /// The sound server, source and sink.
    pub endpoints: Endpoints,
    /// espeak-ng's voice and rate for `say`.
    pub voice: dk_espeak::Voice,
    /// When `listen` ends by itself.
    pub vad: VadSettings,
}

impl Default for VoiceConfig {
    fn default() -> Self {
        VoiceConfig {
            id: "voice".to_owned(),
            name: "Voice".to_owned(),
            endpoints: Endpoints::default(),
            voice: dk_espeak::Voice::default(),
            vad: VadSettings::default(),
        }
    }
}

/// The microphone while it is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMic {
    /// `listen` or `listen_stream`.
    pub capability: &'static str,
    /// The most it stays open, in seconds.
    pub max_seconds: u32,
}

/// What a stop ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stopped {
    /// The microphone was open.
    pub microphone: bool,
    /// The speaker was playing.
    pub speaker: bool,
}

/// One open microphone: its flag for the capture thread and the wake-up
/// for the call.
struct Mic {
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
}

struct Shared {
    config: VoiceConfig,
    mic: Mutex<Option<Mic>>,
    speaker: Mutex<Option<Arc<AtomicBool>>>,
    live: watch::Sender<Option<LiveMic>>,
    /// Samples the microphone's current (or last) recording captured.
    heard: AtomicU64,
    events: Mutex<Option<EventSender>>,
    chunks: Mutex<Option<StreamSender>>,
}

/// The voice device: its [`Device`] and the state behind it. Cheap to
/// clone.
#[derive(Clone)]
pub struct Voice {
    device: Device,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Voice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Voice")
            .field("id", &self.shared.config.id)
            .field("live", &*self.shared.live.borrow())
            .finish_non_exhaustive()
    }
}

fn refuse(why: impl Into<String>) -> HandlerError {
    HandlerError::new(why)
}

impl Voice {
    /// Makes the device of `config`. Nothing is opened until a call.
    pub fn new(config: VoiceConfig) -> Result<Self, StartError> {
        let manifest = manifest(&config);
        let (live, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            config,
            mic: Mutex::new(None),
            speaker: Mutex::new(None),
            live,
            heard: AtomicU64::new(0),
            events: Mutex::new(None),
            chunks: Mutex::new(None),
        });
        let builder = Device::define(&manifest);
        let on = |shared: &Arc<Shared>, action: Action| {
            let shared = Arc::clone(shared);
            move |input: Map<String, Value>| {
                let shared = Arc::clone(&shared);
                async move { action(shared, input).await }
            }
        };
        let device = builder
            .handler("listen", on(&shared, |s, i| Box::pin(listen(s, i))))
            .handler(STREAM, on(&shared, |s, i| Box::pin(listen_stream(s, i))))
            .handler("say", on(&shared, |s, i| Box::pin(say(s, i))))
            .handler("play", on(&shared, |s, i| Box::pin(play(s, i))))
            .handler(
                "stop",
                on(&shared, |s, _| {
                    Box::pin(async move {
                        let stopped = stop(&s);
                        Ok(json!({"microphone": stopped.microphone, "speaker": stopped.speaker}))
                    })
                }),
            )
            .build()?;
        Ok(Voice { device, shared })
    }

    /// The dk device, to serve with dk-device's client.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Where the microphone's events go: give the sender of
    /// [`Device::events`] (its receiver to the serve options).
    pub fn set_events(&self, events: EventSender) {
        *self
            .shared
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(events);
    }

    /// Where `listen_stream` sends its chunks: the sender of
    /// [`dk_device::stream_channel`] (its receiver to the serve options).
    pub fn set_stream(&self, chunks: StreamSender) {
        *self
            .shared
            .chunks
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(chunks);
    }

    /// The microphone's state, now and as it changes.
    pub fn live(&self) -> watch::Receiver<Option<LiveMic>> {
        self.shared.live.subscribe()
    }

    /// How much sound the microphone's current recording has captured so
    /// far (or its last one's, once closed), in milliseconds: what the
    /// call has taken from the source, not how long it has been open.
    pub fn recorded_ms(&self) -> u64 {
        let samples = self.shared.heard.load(Ordering::Acquire);
        samples.saturating_mul(1000) / u64::from(RATE)
    }

    /// Ends whatever the device is doing at once: the person's stop.
    pub fn stop(&self) -> Stopped {
        stop(&self.shared)
    }
}

fn stop(shared: &Shared) -> Stopped {
    let mut stopped = Stopped::default();
    if let Some(mic) = shared
        .mic
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        mic.stop.store(true, Ordering::Release);
        mic.wake.notify_one();
        stopped.microphone = true;
    }
    if let Some(flag) = shared
        .speaker
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        flag.store(true, Ordering::Release);
        stopped.speaker = true;
    }
    stopped
}

/// A handler's work, given the shared state and the call's input.
type Action = fn(
    Arc<Shared>,
    Map<String, Value>,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, HandlerError>> + Send>>;

/// The manifest: in the dk extension, so every number is bounded there and
/// the vessel refuses one out of range before the person is asked (the
/// handlers check each again).
fn manifest(config: &VoiceConfig) -> Value {
    json!({
        "dk": 1,
        "id": config.id,
        "name": config.name,
        "kind": KIND,
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": [
            {"name": "listen", "kind": "sensor", "confirm": true,
             "description": format!("Record from the microphone until the speaker stops ({} ms of quiet after sound; {} s of nothing ends it too) or max_seconds, and return it as WAV (16 kHz mono) with its duration and level. Asks the person every time; the microphone shows as live while it records.", config.vad.hangover.as_millis(), config.vad.patience.as_secs()),
             "params": {"max_seconds": {"type": "number", "required": true, "integer": true, "minimum": 1, "maximum": MAX_LISTEN_SECONDS, "unit": "s", "description": format!("longest recording, 1 to {MAX_LISTEN_SECONDS} seconds: the person is told it when asked")}}},
            {"name": STREAM, "kind": "sensor", "confirm": true,
             "description": "Open the microphone and stream it live as chunks of 16 kHz mono 16-bit PCM on this stream, until stop, max_seconds, silence (when asked) or the person's stop. Asks the person every time; the microphone shows as live while it streams.",
             "params": {
                 "max_seconds": {"type": "number", "required": true, "integer": true, "minimum": 1, "maximum": MAX_STREAM_SECONDS, "unit": "s", "description": format!("longest session, 1 to {MAX_STREAM_SECONDS} seconds: the person is told it when asked")},
                 "chunk_ms": {"type": "number", "integer": true, "minimum": FRAME_MS, "maximum": MAX_CHUNK_MS, "unit": "ms", "description": format!("milliseconds of sound a chunk holds, {FRAME_MS} to {MAX_CHUNK_MS} in steps of {FRAME_MS} (default {DEFAULT_CHUNK_MS})")},
                 "end_at_silence": {"type": "boolean", "description": format!("end the session as listen ends a recording: {} ms of quiet after sound, or {} s of nothing (default false)", config.vad.hangover.as_millis(), config.vad.patience.as_secs())}}},
            {"name": "say", "kind": "actuator",
             "description": "Speak text aloud through the speaker with the device's own speech engine (espeak-ng).",
             "params": {"text": {"type": "string", "required": true, "minLength": 1, "maxLength": MAX_SAY_TEXT, "description": format!("what to say, at most {MAX_SAY_TEXT} characters")}}},
            {"name": "play", "kind": "actuator",
             "description": format!("Play sound through the speaker: a WAV file (16-bit PCM, one or two channels, 8 to 48 kHz, at most {MAX_PLAY_SECONDS} s), in base64."),
             "params": {"audio": {"type": "string", "required": true, "base64": true, "maxLength": dk_proto::limits::INPUT_BASE64, "description": "the WAV file's bytes in standard base64"}}},
            {"name": "stop", "kind": "actuator",
             "description": "Stop at once whatever the device is doing: recording, streaming, speaking or playing."},
        ],
    })
}

/// `max_seconds`, a whole number of seconds from 1 to `max`: required, so
/// the person is always told how long the microphone may stay open.
fn seconds(input: &Map<String, Value>, max: u32) -> Result<u32, HandlerError> {
    if input.get("max_seconds").is_none_or(Value::is_null) {
        return Err(refuse(format!(
            "max_seconds is required: the longest the microphone stays open, 1 to {max}"
        )));
    }
    whole(input, "max_seconds", 1, max, max, 1)
}

fn whole(
    input: &Map<String, Value>,
    name: &str,
    min: u32,
    max: u32,
    default: u32,
    step: u32,
) -> Result<u32, HandlerError> {
    let Some(value) = input.get(name).filter(|v| !v.is_null()) else {
        return Ok(default);
    };
    let n = value.as_f64().unwrap_or(f64::NAN);
    let ok = n.is_finite()
        && n.fract() == 0.0
        && n >= f64::from(min)
        && n <= f64::from(max)
        && (n as u32).is_multiple_of(step);
    if !ok {
        let shown = match value {
            Value::Number(n) => n.to_string().chars().take(24).collect::<String>(),
            _ => "not a number".to_owned(),
        };
        let steps = if step > 1 {
            format!(" in steps of {step}")
        } else {
            String::new()
        };
        return Err(refuse(format!(
            "{name} must be a whole number from {min} to {max}{steps}, not {shown}"
        )));
    }
    Ok(n as u32)
}

/// Opens the microphone for one call, or says what holds it.
fn open_mic(shared: &Arc<Shared>, live: LiveMic) -> Result<MicGuard, HandlerError> {
    let mut mic = shared.mic.lock().unwrap_or_else(PoisonError::into_inner);
    if mic.is_some() {
        let holder = shared
            .live
            .borrow()
            .as_ref()
            .map_or("another call", |l| l.capability);
        return Err(refuse(format!(
            "the microphone is already open ({holder}): one recording at a time"
        )));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    *mic = Some(Mic {
        stop: Arc::clone(&stop),
        wake: Arc::clone(&wake),
    });
    drop(mic);
    let capability = live.capability;
    let max_seconds = live.max_seconds;
    shared.heard.store(0, Ordering::Release);
    shared.live.send_replace(Some(live));
    emit(
        shared,
        capability,
        json!({"microphone": "live", "max_seconds": max_seconds}),
    );
    tracing::info!(capability, max_seconds, "microphone live");
    Ok(MicGuard {
        shared: Arc::clone(shared),
        capability,
        stop,
        wake,
    })
}

/// The microphone held by one call; dropping it closes it and says so.
struct MicGuard {
    shared: Arc<Shared>,
    capability: &'static str,
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
}

impl MicGuard {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Counts `samples` captured by this recording.
    fn heard(&self, samples: usize) {
        let samples = u64::try_from(samples).unwrap_or(u64::MAX);
        self.shared.heard.fetch_add(samples, Ordering::AcqRel);
    }

    fn close(self, ended: &str, duration_ms: u64) {
        emit(
            &self.shared,
            self.capability,
            json!({"microphone": "off", "ended": ended, "duration_ms": duration_ms}),
        );
        tracing::info!(
            capability = self.capability,
            ended,
            duration_ms,
            "microphone off"
        );
        drop(self);
    }
}

impl Drop for MicGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        *self
            .shared
            .mic
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.shared.live.send_replace(None);
    }
}

fn emit(shared: &Shared, capability: &str, data: Value) {
    if let Some(events) = shared
        .events
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        && let Err(e) = events.try_emit(capability, data)
    {
        tracing::warn!(capability, "microphone event not sent: {e}");
    }
}

/// Keeps the frames the capture queued before a stop: each was read before
/// the stop was set (the capture sends nothing read after it), so it is
/// sound from before the person's Stop, which a busy task had not taken yet.
fn keep_queued(frames: &mut tokio::sync::mpsc::Receiver<pulse::Captured>, recorded: &mut Vec<i16>) {
    while let Ok(Ok(frame)) = frames.try_recv() {
        recorded.extend_from_slice(&frame);
    }
}

/// Why a recording ended, as results and events say it.
fn ended_text(ended: Option<Ended>, stopped: bool) -> &'static str {
    match (stopped, ended) {
        (true, _) => "stopped",
        (false, Some(Ended::Silence)) => "silence",
        (false, Some(Ended::NothingHeard)) => "nothing_heard",
        (false, None) => "max_seconds",
    }
}

async fn listen(shared: Arc<Shared>, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let max_seconds = seconds(&input, MAX_LISTEN_SECONDS)?;
    let mic = open_mic(
        &shared,
        LiveMic {
            capability: "listen",
            max_seconds,
        },
    )?;
    let mut frames = match pulse::capture(
        shared.config.endpoints.clone(),
        Arc::clone(&mic.stop),
        CAPTURE_QUEUE,
    ) {
        Ok(frames) => frames,
        Err(why) => {
            mic.close("failed", 0);
            return Err(refuse(why));
        }
    };
    let most = max_seconds as usize * RATE as usize;
    let mut recorded: Vec<i16> = Vec::with_capacity(most.min(RATE as usize * 5));
    let mut vad = Vad::new(shared.config.vad);
    let mut ended = None;
    let mut failed = None;
    while recorded.len() < most && ended.is_none() {
        tokio::select! {
            biased;
            () = mic.wake.notified() => {
                keep_queued(&mut frames, &mut recorded);
                break;
            }
            frame = frames.recv() => match frame {
                Some(Ok(frame)) if !mic.stopped() => {
                    ended = vad.push(&frame);
                    recorded.extend_from_slice(&frame);
                    mic.heard(frame.len());
                }
                Some(Ok(frame)) => {
                    recorded.extend_from_slice(&frame);
                    keep_queued(&mut frames, &mut recorded);
                    break;
                }
                Some(Err(why)) => {
                    failed = Some(why);
                    break;
                }
                None => break,
            },
        }
    }
    let stopped = mic.stopped();
    drop(frames);
    recorded.truncate(most);
    let duration_ms = audio::duration_ms(recorded.len());
    if let Some(why) = failed {
        mic.close("failed", duration_ms);
        return Err(refuse(why));
    }
    let ended = ended_text(ended, stopped);
    mic.close(ended, duration_ms);
    let level = audio::round_level(audio::level_dbfs(&recorded));
    let file = audio::wav(&recorded);
    let bytes = file.len();
    let content = AudioContent::new(
        AudioMime::Wav,
        base64::engine::general_purpose::STANDARD.encode(&file),
    );
    Ok(json!({
        "audio": content,
        "duration_ms": duration_ms,
        "level_dbfs": level,
        "heard": vad.heard(),
        "ended": ended,
        "bytes": bytes,
    }))
}

async fn listen_stream(
    shared: Arc<Shared>,
    input: Map<String, Value>,
) -> Result<Value, HandlerError> {
    let max_seconds = seconds(&input, MAX_STREAM_SECONDS)?;
    let chunk_ms = whole(
        &input,
        "chunk_ms",
        FRAME_MS,
        MAX_CHUNK_MS,
        DEFAULT_CHUNK_MS,
        FRAME_MS,
    )?;
    let end_at_silence = match input.get("end_at_silence") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(refuse("end_at_silence must be true or false")),
    };
    let Some(chunks) = shared
        .chunks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    else {
        return Err(refuse("this device was started without streaming"));
    };
    let mic = open_mic(
        &shared,
        LiveMic {
            capability: STREAM,
            max_seconds,
        },
    )?;
    let frames = match pulse::capture(
        shared.config.endpoints.clone(),
        Arc::clone(&mic.stop),
        CAPTURE_QUEUE,
    ) {
        Ok(frames) => frames,
        Err(why) => {
            mic.close("failed", 0);
            return Err(refuse(why));
        }
    };
    let vad = end_at_silence.then(|| Vad::new(shared.config.vad));
    // The session outlives the call, which answers at once. It is owned by
    // the microphone it holds: the stop (the capability's or the
    // person's) ends it at once, and so do its budget, silence when asked,
    // a failed source, and the client going away (its next chunk finds the
    // stream's queue closed).
    tokio::spawn(stream_session(
        mic,
        frames,
        chunks,
        Session {
            max_seconds,
            chunk_ms,
            vad,
        },
    ));
    Ok(json!({
        "stream": STREAM,
        "format": "pcm_s16le",
        "rate": RATE,
        "channels": 1,
        "chunk_ms": chunk_ms,
        "max_seconds": max_seconds,
    }))
}

/// What a `listen_stream` session was asked for.
struct Session {
    max_seconds: u32,
    chunk_ms: u32,
    /// Ends the session at silence, as `listen` ends.
    vad: Option<Vad>,
}

/// Sends the microphone's frames as chunks of `chunk_ms` until the
/// session ends. A chunk unfinished at the end is sent when the session
/// ran out or fell silent, never after a stop.
async fn stream_session(
    mic: MicGuard,
    mut frames: tokio::sync::mpsc::Receiver<pulse::Captured>,
    chunks: StreamSender,
    session: Session,
) {
    let Session {
        max_seconds,
        chunk_ms,
        mut vad,
    } = session;
    let frames_a_chunk = (chunk_ms / FRAME_MS).max(1) as usize;
    let most = max_seconds as usize * RATE as usize;
    let mut captured = 0usize;
    let mut sent = 0usize;
    let mut chunk: Vec<u8> = Vec::with_capacity(frames_a_chunk * FRAME_SAMPLES * 2);
    let mut in_chunk = 0usize;
    let mut why = "max_seconds";
    while captured < most {
        tokio::select! {
            biased;
            () = mic.wake.notified() => break,
            frame = frames.recv() => match frame {
                Some(Ok(frame)) if !mic.stopped() => {
                    chunk.extend(frame.iter().flat_map(|s| s.to_le_bytes()));
                    in_chunk += 1;
                    captured += frame.len();
                    mic.heard(frame.len());
                    let silent = vad.as_mut().and_then(|vad| vad.push(&frame));
                    if in_chunk == frames_a_chunk || captured >= most || silent.is_some() {
                        let payload = std::mem::replace(
                            &mut chunk,
                            Vec::with_capacity(frames_a_chunk * FRAME_SAMPLES * 2),
                        );
                        in_chunk = 0;
                        sent += payload.len() / 2;
                        // A full queue drops the chunk (counted by the
                        // sender): live sound is better lost than late.
                        if let Err(dk_device::StreamSendError::Closed) = chunks.try_send(STREAM, payload) {
                            why = "disconnected";
                            break;
                        }
                    }
                    if let Some(ended) = silent {
                        why = ended_text(Some(ended), false);
                        break;
                    }
                }
                Some(Ok(_)) | None => break,
                Some(Err(e)) => {
                    tracing::warn!("listen_stream ended: {e}");
                    why = "failed";
                    break;
                }
            },
        }
    }
    if mic.stopped() {
        why = "stopped";
    }
    drop(frames);
    mic.close(why, audio::duration_ms(sent));
}

/// Marks the speaker busy with a flag of its own, or says it is.
fn take_speaker(shared: &Shared) -> Result<Arc<AtomicBool>, HandlerError> {
    let mut speaker = shared
        .speaker
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if speaker.is_some() {
        return Err(refuse("the speaker is busy: one say or play at a time"));
    }
    let flag = Arc::new(AtomicBool::new(false));
    *speaker = Some(Arc::clone(&flag));
    Ok(flag)
}

fn free_speaker(shared: &Shared) {
    *shared
        .speaker
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = None;
}

async fn say(shared: Arc<Shared>, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let text = match input.get("text") {
        Some(Value::String(text)) => text.clone(),
        _ => return Err(refuse("text is required")),
    };
    let units = dk_proto::utf16_len(&text);
    if units > MAX_SAY_TEXT {
        return Err(refuse(format!(
            "the text is {units} characters; at most {MAX_SAY_TEXT} are spoken at once"
        )));
    }
    let voice = shared.config.voice.clone();
    dk_espeak::check(&text, &voice).map_err(|e| refuse(e.to_string()))?;
    let rate = tokio::task::spawn_blocking(dk_espeak::sample_rate)
        .await
        .map_err(|_| refuse("the speech engine could not start"))?
        .map_err(|e| refuse(e.to_string()))?;
    let stop = take_speaker(&shared)?;
    let started = Instant::now();
    let (rate_tx, rate_rx) = tokio::sync::oneshot::channel();
    let (pieces_tx, pieces_rx) = std::sync::mpsc::sync_channel::<Vec<i16>>(8);
    let synth_stop = Arc::clone(&stop);
    let synth = std::thread::Builder::new()
        .name("dk-voice-say".to_owned())
        .spawn(move || {
            let _ = rate_tx.send(dk_espeak::speak(&text, &voice, pieces_tx, &synth_stop));
        });
    if let Err(e) = synth {
        free_speaker(&shared);
        return Err(refuse(format!("cannot start speaking: {e}")));
    }
    let played = pulse::play(
        shared.config.endpoints.clone(),
        rate,
        "say",
        pieces_rx,
        Arc::clone(&stop),
        None,
    )
    .await;
    stop.store(true, Ordering::Release);
    let said = rate_rx.await;
    free_speaker(&shared);
    let played = played.map_err(refuse)?;
    match said {
        Ok(Err(e)) => return Err(refuse(e.to_string())),
        Err(_) => return Err(refuse("the speech engine ended without a word")),
        Ok(Ok(_)) => {}
    }
    Ok(json!({
        "spoken_ms": played.samples * 1000 / u64::from(rate.max(1)),
        "stopped": played.stopped,
        "took_ms": started.elapsed().as_millis() as u64,
    }))
}

async fn play(shared: Arc<Shared>, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let Some(Value::String(data)) = input.get("audio") else {
        return Err(refuse("audio is required"));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| refuse("audio must be standard base64"))?;
    let sound = audio::read_wav(&bytes, MAX_PLAY_SECONDS).map_err(|e| refuse(e.to_string()))?;
    let stop = take_speaker(&shared)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let total = sound.len();
    // One piece: the playing thread writes it 20 ms at a time.
    let _ = tx.send(sound);
    drop(tx);
    let played = pulse::play(
        shared.config.endpoints.clone(),
        RATE,
        "play",
        rx,
        Arc::clone(&stop),
        None,
    )
    .await;
    free_speaker(&shared);
    let played = played.map_err(refuse)?;
    Ok(json!({
        "played_ms": audio::duration_ms(played.samples as usize),
        "of_ms": audio::duration_ms(total),
        "stopped": played.stopped,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_is_valid() {
        let config = VoiceConfig::default();
        let checked = dk_proto::validate_manifest(&manifest(&config));
        let Ok(checked) = checked else {
            unreachable!("{checked:?}")
        };
        assert_eq!(checked.kind(), KIND);
        let names: Vec<&str> = checked.capabilities().iter().map(|c| c.name()).collect();
        assert_eq!(names, ["listen", STREAM, "say", "play", "stop"]);
        let play = checked.capability("play").and_then(|c| c.param("audio"));
        assert!(play.is_some_and(|p| p.base64()));
    }

    #[test]
    fn numbers_are_checked() {
        let input = |v: Value| {
            let mut map = Map::new();
            map.insert("max_seconds".to_owned(), v);
            map
        };
        assert_eq!(
            seconds(&Map::new(), 30).map_err(|e| e.message().to_owned()),
            Err(
                "max_seconds is required: the longest the microphone stays open, 1 to 30"
                    .to_owned()
            )
        );
        assert_eq!(seconds(&input(json!(30)), 30).ok(), Some(30));
        for (bad, shown) in [
            (json!(0), "0"),
            (json!(31), "31"),
            (json!(2.5), "2.5"),
            (json!(-1), "-1"),
            (json!(1e300), "1e+300"),
        ] {
            assert_eq!(
                seconds(&input(bad), 30).map_err(|e| e.message().to_owned()),
                Err(format!(
                    "max_seconds must be a whole number from 1 to 30, not {shown}"
                ))
            );
        }
        let mut chunk = Map::new();
        chunk.insert("chunk_ms".to_owned(), json!(30));
        assert_eq!(
            whole(&chunk, "chunk_ms", 20, 1000, 100, 20).map_err(|e| e.message().to_owned()),
            Err(
                "chunk_ms must be a whole number from 20 to 1000 in steps of 20, not 30".to_owned()
            )
        );
    }
}
