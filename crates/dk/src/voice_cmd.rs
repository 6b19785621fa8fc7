//! `dk device voice`: this machine's microphone and speaker as a dk device
//! (kind `voice`, dk-voice), through PulseAudio (or PipeWire's PulseAudio
//! server): `listen` and `listen_stream` (both ask the person every time),
//! `say` (espeak-ng), `play` (a WAV) and `stop`. While the microphone is
//! open the terminal says so on a line of its own, and Enter stops it (and
//! anything playing) at once; the device also tells the vessel, which
//! shows it to the person and agents. It speaks dk/2 and prints the same
//! lines as `dk device simulate`. Ctrl-C closes the connection and exits.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dk_device::{DEFAULT_STREAM_QUEUE, ServeOptions, stream_channel};
use dk_voice::vad::VadSettings;
use dk_voice::{Endpoints, Voice, VoiceConfig};

use crate::device_run::{self, Channel, Connect, serve};
use crate::input::printable;

/// Events waiting to be sent at most: the microphone's live and off.
const EVENT_QUEUE: usize = 16;

/// Arguments of `dk device voice`.
#[derive(Debug, Args)]
pub struct VoiceArgs {
    /// The vessel's device route, e.g. ws://127.0.0.1:7777/device.
    #[arg(long)]
    pub vessel: String,
    /// Another address of the vessel (or of another member of its fleet),
    /// tried in turn when one cannot be reached; may be given more than
    /// once.
    #[arg(long, value_name = "URL")]
    pub also_at: Vec<String>,
    /// Where to keep the dk/2 device key and the vessel key it pins (by
    /// default `devices/<device-id>.key` in dk's home). It must be a
    /// regular file of this user with mode 0600, never a link.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Forget the pinned vessel key (and the pairing) first: only when the
    /// vessel was really replaced.
    #[arg(long)]
    pub forget_vessel: bool,
    /// For a `wss://` vessel URL: trust only the certificates in this PEM
    /// file instead of the platform's roots.
    #[arg(long)]
    pub tls_root: Option<PathBuf>,
    /// The PulseAudio server, e.g. unix:/run/user/1000/pulse/native
    /// [default: libpulse's, $PULSE_SERVER or the user's].
    #[arg(long)]
    pub server: Option<String>,
    /// The source (microphone) to record from, by its name (`pactl list
    /// short sources`) [default: the server's].
    #[arg(long)]
    pub source: Option<String>,
    /// The sink (speaker) to play to, by its name (`pactl list short
    /// sinks`) [default: the server's].
    #[arg(long)]
    pub sink: Option<String>,
    /// The device id [default: voice].
    #[arg(long)]
    pub id: Option<String>,
    /// The device name the person sees [default: Voice].
    #[arg(long)]
    pub name: Option<String>,
    /// espeak-ng's voice for `say` (`espeak-ng --voices`) [default: en].
    #[arg(long)]
    pub voice: Option<String>,
    /// Words a minute `say` speaks, 80 to 450 [default: 175].
    #[arg(long, value_parser = clap::value_parser!(u32).range(80..=450))]
    pub rate: Option<u32>,
    /// Milliseconds of quiet after sound that end `listen`, 200 to 5000
    /// [default: 800].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(200..=5000))]
    pub hangover_ms: Option<u64>,
    /// The level in dBFS at or above which a 20 ms frame counts as sound,
    /// -90 to -10 [default: -45].
    #[arg(long, value_name = "DBFS", allow_hyphen_values = true, value_parser = clap::value_parser!(i32).range(-90..=-10))]
    pub threshold: Option<i32>,
}

fn config(args: &VoiceArgs) -> VoiceConfig {
    let mut config = VoiceConfig {
        endpoints: Endpoints {
            server: args.server.clone(),
            source: args.source.clone(),
            sink: args.sink.clone(),
        },
        ..VoiceConfig::default()
    };
    if let Some(id) = &args.id {
        config.id.clone_from(id);
    }
    if let Some(name) = &args.name {
        config.name.clone_from(name);
    }
    if let Some(voice) = &args.voice {
        config.voice.name.clone_from(voice);
    }
    if let Some(rate) = args.rate {
        config.voice.rate = rate;
    }
    config.vad = VadSettings {
        hangover: args
            .hangover_ms
            .map_or(config.vad.hangover, Duration::from_millis),
        threshold_dbfs: args.threshold.map_or(config.vad.threshold_dbfs, f64::from),
        ..config.vad
    };
    config
}

/// Prints the microphone's state as it changes, and stops the device at
/// each line read from the terminal.
async fn show_and_stop(voice: Voice) {
    let stopper = voice.clone();
    // A line typed at the terminal is the person's stop.
    let _ = std::thread::Builder::new()
        .name("dk-voice-stdin".to_owned())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                if line.is_err() {
                    break;
                }
                let stopped = stopper.stop();
                if stopped.microphone || stopped.speaker {
                    println!("stopped by you");
                }
            }
        });
    let mut live = voice.live();
    loop {
        let now = live.borrow_and_update().clone();
        match now {
            Some(mic) => println!(
                "● MICROPHONE LIVE ({}, up to {} s): press Enter to stop",
                mic.capability, mic.max_seconds
            ),
            None => println!("○ microphone off"),
        }
        if live.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs the voice device until Ctrl-C: 0 when stopped by Ctrl-C, 1 when
/// the device could not be made or the client stopped with an error.
pub fn run(args: &VoiceArgs) -> ExitCode {
    let config = config(args);
    if let Err(e) = dk_espeak::check("", &config.voice) {
        eprintln!("error: {}", printable(&e.to_string()));
        return ExitCode::FAILURE;
    }
    let voice = match Voice::new(config.clone()) {
        Ok(voice) => voice,
        Err(e) => {
            eprintln!("error: {}", printable(&e.to_string()));
            return ExitCode::FAILURE;
        }
    };
    let named = |name: &Option<String>| {
        name.as_deref()
            .map_or_else(|| "the default".to_owned(), printable)
    };
    println!(
        "microphone: {} source; speaker: {} sink; server: {}",
        named(&config.endpoints.source),
        named(&config.endpoints.sink),
        named(&config.endpoints.server)
    );
    println!("sound is never kept: each recording goes to the call that asked for it");
    let connect = Connect {
        vessel: &args.vessel,
        also_at: &args.also_at,
        channel: Channel::Dk2 {
            key_file: args.key_file.clone(),
            forget_vessel: args.forget_vessel,
        },
        tls_root: args.tls_root.as_deref(),
    };
    let device = voice.device().clone();
    let (events, receiver) = device.events(EVENT_QUEUE);
    voice.set_events(events);
    let (chunks, outbox) = stream_channel(DEFAULT_STREAM_QUEUE);
    voice.set_stream(chunks);
    let options = device_run::options(&connect, &device, ServeOptions::new().events(receiver))
        .streams(outbox);
    device_run::block_on(serve(&device, options, show_and_stop(voice)))
}
