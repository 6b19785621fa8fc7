//! PulseAudio (and PipeWire's PulseAudio server), through libpulse's
//! simple API: one blocking stream per thread. A capture thread reads 20 ms
//! frames from the source into a bounded queue and ends at the stop flag or
//! when the queue's reader is gone; a playback thread writes pieces of at
//! most 20 ms to the sink, checking the stop flag between them, and drains
//! at the end. Every failure of the server (none running, a source or sink
//! that does not exist or goes away) comes back as text naming it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use libpulse_binding::def::BufferAttr;
use libpulse_binding::sample::{Format, Spec};
use libpulse_binding::stream::Direction;
use libpulse_simple_binding::Simple;
use tokio::sync::mpsc;

use crate::audio::{FRAME_SAMPLES, RATE};

/// The client name the server shows.
const CLIENT: &str = "dk voice";

/// Where sound comes from and goes to: the server (`None`: libpulse's
/// default, `PULSE_SERVER` or the user's), the source and the sink (`None`:
/// the server's defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    /// The server, as libpulse names one (`unix:/run/user/1000/pulse/native`).
    pub server: Option<String>,
    /// The source (microphone) to record from.
    pub source: Option<String>,
    /// The sink (speaker) to play to.
    pub sink: Option<String>,
}

fn spec(rate: u32) -> Spec {
    Spec {
        format: Format::S16le,
        channels: 1,
        rate,
    }
}

fn shown(name: Option<&str>, what: &str) -> String {
    match name {
        Some(name) => format!("{what} {:?}", name.chars().take(80).collect::<String>()),
        None => format!("the default {what}"),
    }
}

/// Opens a recording stream of 16 kHz mono frames.
fn open_capture(endpoints: &Endpoints) -> Result<Simple, String> {
    let frame_bytes = (FRAME_SAMPLES * 2) as u32;
    let attr = BufferAttr {
        maxlength: u32::MAX,
        tlength: u32::MAX,
        prebuf: u32::MAX,
        minreq: u32::MAX,
        fragsize: frame_bytes,
    };
    Simple::new(
        endpoints.server.as_deref(),
        CLIENT,
        Direction::Record,
        endpoints.source.as_deref(),
        "listen",
        &spec(RATE),
        None,
        Some(&attr),
    )
    .map_err(|e| {
        format!(
            "cannot record from {}: {e}",
            shown(endpoints.source.as_deref(), "source")
        )
    })
}

/// Opens a playback stream of mono 16-bit sound at `rate`.
fn open_playback(endpoints: &Endpoints, rate: u32, name: &str) -> Result<Simple, String> {
    // About 100 ms queued in the server: a stop is heard soon after.
    let target = rate / 10 * 2;
    let attr = BufferAttr {
        maxlength: u32::MAX,
        tlength: target,
        prebuf: u32::MAX,
        minreq: u32::MAX,
        fragsize: u32::MAX,
    };
    Simple::new(
        endpoints.server.as_deref(),
        CLIENT,
        Direction::Playback,
        endpoints.sink.as_deref(),
        name,
        &spec(rate),
        None,
        Some(&attr),
    )
    .map_err(|e| {
        format!(
            "cannot play to {}: {e}",
            shown(endpoints.sink.as_deref(), "sink")
        )
    })
}

/// What a capture thread sends: a frame of [`FRAME_SAMPLES`] samples, or
/// why it stopped.
pub type Captured = Result<Vec<i16>, String>;

/// Starts recording on a thread of its own: frames go to the returned
/// queue (`queue` of them at most; the thread waits for room) until `stop`
/// is set or the queue is dropped. A failure is the last thing sent.
pub fn capture(
    endpoints: Endpoints,
    stop: Arc<AtomicBool>,
    queue: usize,
) -> Result<mpsc::Receiver<Captured>, String> {
    let (tx, rx) = mpsc::channel(queue.max(1));
    std::thread::Builder::new()
        .name("dk-voice-capture".to_owned())
        .spawn(move || {
            let stream = match open_capture(&endpoints) {
                Ok(stream) => stream,
                Err(why) => {
                    let _ = tx.blocking_send(Err(why));
                    return;
                }
            };
            let mut bytes = vec![0u8; FRAME_SAMPLES * 2];
            while !stop.load(Ordering::Acquire) && !tx.is_closed() {
                if let Err(e) = stream.read(&mut bytes) {
                    let _ = tx.blocking_send(Err(format!(
                        "recording from {} failed: {e}",
                        shown(endpoints.source.as_deref(), "source")
                    )));
                    return;
                }
                // Read after the stop: never handed on.
                if stop.load(Ordering::Acquire) {
                    break;
                }
                if tx.blocking_send(Ok(crate::audio::samples(&bytes))).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| format!("cannot start recording: {e}"))?;
    Ok(rx)
}

/// How a playback ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Played {
    /// Samples written to the server.
    pub samples: u64,
    /// Whether the stop flag ended it early.
    pub stopped: bool,
}

/// Plays what `pieces` yields (mono 16-bit at `rate`) on a thread of its
/// own until it ends or `stop` is set; `started` is told when the first
/// samples are written. Returns once everything written was played (or
/// flushed, when stopped).
pub async fn play(
    endpoints: Endpoints,
    rate: u32,
    name: &'static str,
    pieces: std::sync::mpsc::Receiver<Vec<i16>>,
    stop: Arc<AtomicBool>,
    started: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<Played, String> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("dk-voice-play".to_owned())
        .spawn(move || {
            let _ = done_tx.send(play_blocking(
                &endpoints, rate, name, &pieces, &stop, started,
            ));
        })
        .map_err(|e| format!("cannot start playing: {e}"))?;
    done_rx
        .await
        .map_err(|_| "the playing thread ended without a word".to_owned())?
}

fn play_blocking(
    endpoints: &Endpoints,
    rate: u32,
    name: &str,
    pieces: &std::sync::mpsc::Receiver<Vec<i16>>,
    stop: &AtomicBool,
    mut started: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<Played, String> {
    let stream = open_playback(endpoints, rate, name)?;
    let step = (rate / 50).max(1) as usize;
    let mut played = Played {
        samples: 0,
        stopped: false,
    };
    let failed = |e| {
        format!(
            "playing to {} failed: {e}",
            shown(endpoints.sink.as_deref(), "sink")
        )
    };
    for piece in pieces.iter() {
        for part in piece.chunks(step) {
            if stop.load(Ordering::Acquire) {
                played.stopped = true;
                let _ = stream.flush();
                return Ok(played);
            }
            stream.write(&crate::audio::pcm(part)).map_err(failed)?;
            played.samples += part.len() as u64;
            if let Some(started) = started.take() {
                let _ = started.send(());
            }
        }
    }
    if stop.load(Ordering::Acquire) {
        played.stopped = true;
        let _ = stream.flush();
        return Ok(played);
    }
    stream.drain().map_err(failed)?;
    Ok(played)
}
