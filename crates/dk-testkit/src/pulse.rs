//! A PulseAudio server of a test's own (Debian's `pulseaudio`, run as a
//! user daemon with no configuration of the machine's): its socket and
//! state in a temporary directory, two null sinks, `dk_mic` (what a test
//! plays into it is heard on its monitor, `dk_mic.monitor`, the device's
//! microphone) and `dk_speaker` (the device's speaker; a test records its
//! monitor, `dk_speaker.monitor`). Stopped, and the directory removed,
//! when dropped. Without the server a test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set (`cargo xtask peers` installs it). With the
//! feature `audio`, `Feed` plays into the microphone (a tone switched
//! on and off at any moment, within 5 ms) and `Recording` records the
//! speaker, through libpulse.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The sink a test plays into: the device's microphone is its monitor.
pub const MIC_SINK: &str = "dk_mic";
/// The device's microphone: the monitor of [`MIC_SINK`].
pub const MIC_SOURCE: &str = "dk_mic.monitor";
/// The device's speaker.
pub const SPEAKER_SINK: &str = "dk_speaker";
/// What the speaker plays, as a source a test records.
pub const SPEAKER_MONITOR: &str = "dk_speaker.monitor";

/// Where Debian's packages put the daemon and its control tool.
const PULSEAUDIO: &str = "/usr/bin/pulseaudio";
const PACTL: &str = "/usr/bin/pactl";

/// The value of `result`, or the test fails saying `what` went wrong.
#[expect(
    clippy::panic,
    reason = "test support: a failure here fails the test that asked"
)]
fn or_fail<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The daemon's path, or `None` (said on stderr) when it or `pactl` is
/// missing and not required.
pub fn pulse_or_skip(test: &str) -> Option<PathBuf> {
    let found = Path::new(PULSEAUDIO).is_file() && Path::new(PACTL).is_file();
    crate::peer_or_skip(
        test,
        "pulseaudio (and pactl)",
        found.then(|| PathBuf::from(PULSEAUDIO)),
    )
}

/// A running PulseAudio daemon of the test's own.
pub struct Pulse {
    dir: tempfile::TempDir,
    child: Child,
}

impl Pulse {
    /// Starts a daemon with the two null sinks and waits until it answers.
    ///
    /// # Panics
    ///
    /// When it does not start.
    pub fn start(binary: &Path) -> Pulse {
        let dir = or_fail(tempfile::tempdir(), "the server's directory");
        let root = dir.path();
        for sub in ["run", "state", "home"] {
            or_fail(
                std::fs::create_dir_all(root.join(sub)),
                "the server's directories",
            );
        }
        let socket = root.join("native");
        let log = or_fail(
            std::fs::File::create(root.join("pulse.log")),
            "the server's log",
        );
        let child = or_fail(
            Command::new(binary)
                .args([
                    "-n",
                    "--daemonize=no",
                    "--use-pid-file=no",
                    "--exit-idle-time=-1",
                    "--log-target=stderr",
                    "--log-level=warning",
                ])
                .arg(format!(
                    "--load=module-native-protocol-unix socket={} auth-anonymous=1",
                    socket.display()
                ))
                .arg(format!(
                    "--load=module-null-sink sink_name={MIC_SINK} rate=16000 channels=1"
                ))
                .arg(format!(
                    "--load=module-null-sink sink_name={SPEAKER_SINK} rate=16000 channels=1"
                ))
                .env("HOME", root.join("home"))
                .env("XDG_RUNTIME_DIR", root.join("run"))
                .env("PULSE_RUNTIME_PATH", root.join("run"))
                .env("PULSE_STATE_PATH", root.join("state"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn(),
            "pulseaudio",
        );
        let pulse = Pulse { dir, child };
        let deadline = Instant::now() + crate::PATIENCE;
        while !pulse.answers() {
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(pulse.dir.path().join("pulse.log")).unwrap_or_default();
                or_fail::<(), String>(Err(log), "pulseaudio did not answer");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        pulse
    }

    /// The server as libpulse names it: `unix:<socket>`.
    pub fn server(&self) -> String {
        format!("unix:{}", self.dir.path().join("native").display())
    }

    fn answers(&self) -> bool {
        self.pactl(&["list", "short", "sinks"])
            .is_some_and(|sinks| sinks.contains(SPEAKER_SINK))
    }

    /// Runs `pactl` against this server; its output when it succeeded.
    pub fn pactl(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(PACTL)
            .arg("--server")
            .arg(self.server())
            .args(args)
            .env("HOME", self.dir.path().join("home"))
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Unloads the module that made `sink` (so it and its monitor go
    /// away); whether one did.
    pub fn remove_sink(&self, sink: &str) -> bool {
        let Some(modules) = self.pactl(&["list", "short", "modules"]) else {
            return false;
        };
        let needle = format!("sink_name={sink} ");
        let id = modules.lines().find_map(|line| {
            let mut fields = line.split('\t');
            let id = fields.next()?;
            let rest: String = fields.collect::<Vec<_>>().join(" ");
            (rest.contains(&needle) || rest.ends_with(&format!("sink_name={sink}")))
                .then(|| id.to_owned())
        });
        id.is_some_and(|id| self.pactl(&["unload-module", &id]).is_some())
    }

    /// Adds a null sink named `sink` again (after [`Pulse::remove_sink`]).
    pub fn add_sink(&self, sink: &str) -> bool {
        self.pactl(&[
            "load-module",
            "module-null-sink",
            &format!("sink_name={sink}"),
            "rate=16000",
            "channels=1",
        ])
        .is_some()
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ms` milliseconds of a sine of `hz` at `rate`, peaking at `amplitude`.
pub fn tone(hz: f64, ms: u32, rate: u32, amplitude: i16) -> Vec<i16> {
    let count = u64::from(rate) * u64::from(ms) / 1000;
    (0..count)
        .map(|i| {
            let t = i as f64 / f64::from(rate);
            (f64::from(amplitude) * (2.0 * std::f64::consts::PI * hz * t).sin()) as i16
        })
        .collect()
}

/// The frequency of the tone in `samples` (at `rate`), from the times its
/// rising zero crossings fall at (placed between samples), when it has at
/// least ten cycles louder than `floor`.
pub fn tone_hz(samples: &[i16], rate: u32, floor: i16) -> Option<f64> {
    let loud: Vec<f64> = samples.iter().map(|&s| f64::from(s)).collect();
    let mut crossings = Vec::new();
    for (i, pair) in loud.windows(2).enumerate() {
        if let [a, b] = pair
            && *a < 0.0
            && *b >= 0.0
        {
            crossings.push(i as f64 + (-a) / (b - a));
        }
    }
    let peak = samples.iter().map(|s| s.unsigned_abs()).max().unwrap_or(0);
    if crossings.len() < 11 || peak < floor.unsigned_abs() {
        return None;
    }
    let (first, last) = (crossings.first()?, crossings.last()?);
    let cycles = (crossings.len() - 1) as f64;
    Some(cycles * f64::from(rate) / (last - first))
}

#[cfg(feature = "audio")]
pub use audio::{Feed, Recording};

/// Sound into and out of a test's server through libpulse (feature
/// `audio`): a feed into the microphone's sink that a test can switch
/// between a tone and silence at any moment, and a recording of the
/// speaker's monitor.
#[cfg(feature = "audio")]
mod audio {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, PoisonError};
    use std::thread::JoinHandle;
    use std::time::Duration;

    use libpulse_binding::def::BufferAttr;
    use libpulse_binding::sample::{Format, Spec};
    use libpulse_binding::stream::Direction;
    use libpulse_simple_binding::Simple;

    use super::{MIC_SINK, Pulse, SPEAKER_MONITOR, or_fail};

    /// The rate of everything played and recorded here.
    const RATE: u32 = 16_000;
    /// Samples written at a time: 5 ms, so a switch lands within 5 ms.
    const BLOCK: usize = 80;

    fn spec() -> Spec {
        Spec {
            format: Format::S16le,
            channels: 1,
            rate: RATE,
        }
    }

    fn bytes(samples: &[i16]) -> Vec<u8> {
        samples.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    /// What the feed plays next.
    enum Sound {
        Silence,
        Tone { hz: f64, amplitude: f64 },
    }

    struct State {
        sound: Sound,
        /// Played before `sound`.
        queued: VecDeque<i16>,
        /// The tone's phase, in cycles, so a change of tone is continuous.
        phase: f64,
    }

    impl State {
        fn next_block(&mut self, out: &mut [i16]) {
            for sample in out.iter_mut() {
                if let Some(queued) = self.queued.pop_front() {
                    *sample = queued;
                    continue;
                }
                *sample = match self.sound {
                    Sound::Silence => 0,
                    Sound::Tone { hz, amplitude } => {
                        let value = amplitude * (2.0 * std::f64::consts::PI * self.phase).sin();
                        self.phase = (self.phase + hz / f64::from(RATE)).fract();
                        value as i16
                    }
                };
            }
        }
    }

    /// Sound played into the microphone's sink ([`MIC_SINK`]) on a thread
    /// of its own, 5 ms at a time, with at most the given buffer in the
    /// server: silence until told otherwise. Stopped when dropped.
    pub struct Feed {
        state: Arc<Mutex<State>>,
        done: Arc<AtomicBool>,
        latency_us: Arc<AtomicU64>,
        thread: Option<JoinHandle<()>>,
    }

    impl Feed {
        /// Starts feeding silence, with `buffer` of sound at most waiting
        /// in the server (the less, the sooner a change is heard).
        ///
        /// # Panics
        ///
        /// When the server does not take the stream.
        pub fn start(pulse: &Pulse, buffer: Duration) -> Feed {
            let server = pulse.server();
            let state = Arc::new(Mutex::new(State {
                sound: Sound::Silence,
                queued: VecDeque::new(),
                phase: 0.0,
            }));
            let done = Arc::new(AtomicBool::new(false));
            let latency_us = Arc::new(AtomicU64::new(0));
            let target = u32::try_from(buffer.as_millis())
                .unwrap_or(1000)
                .saturating_mul(RATE * 2 / 1000)
                .max(BLOCK as u32 * 2);
            let attr = BufferAttr {
                maxlength: u32::MAX,
                tlength: target,
                prebuf: BLOCK as u32 * 2,
                minreq: u32::MAX,
                fragsize: u32::MAX,
            };
            let out = or_fail(
                Simple::new(
                    Some(&server),
                    "dk test",
                    Direction::Playback,
                    Some(MIC_SINK),
                    "feed",
                    &spec(),
                    None,
                    Some(&attr),
                ),
                "the feed's stream",
            );
            let thread = {
                let (state, done, latency_us) = (
                    Arc::clone(&state),
                    Arc::clone(&done),
                    Arc::clone(&latency_us),
                );
                std::thread::spawn(move || {
                    let mut block = [0i16; BLOCK];
                    while !done.load(Ordering::Acquire) {
                        state
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .next_block(&mut block);
                        if out.write(&bytes(&block)).is_err() {
                            break;
                        }
                        if let Ok(latency) = out.get_latency() {
                            latency_us.store(latency.0, Ordering::Release);
                        }
                    }
                })
            };
            Feed {
                state,
                done,
                latency_us,
                thread: Some(thread),
            }
        }

        /// From the next 5 ms on, a sine of `hz` peaking at `amplitude`
        /// (its phase carried on from any tone before).
        pub fn tone(&self, hz: f64, amplitude: i16) {
            self.lock().sound = Sound::Tone {
                hz,
                amplitude: f64::from(amplitude),
            };
        }

        /// From the next 5 ms on, silence.
        pub fn silence(&self) {
            self.lock().sound = Sound::Silence;
        }

        /// Plays `samples` (16 kHz mono) next, then what was playing.
        pub fn play(&self, samples: &[i16]) {
            self.lock().queued.extend(samples.iter().copied());
        }

        /// Whether everything given to [`Feed::play`] was written.
        pub fn played(&self) -> bool {
            self.lock().queued.is_empty()
        }

        /// How long what is written now takes to be heard, as the server
        /// said after the last write.
        pub fn latency(&self) -> Duration {
            Duration::from_micros(self.latency_us.load(Ordering::Acquire))
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl Drop for Feed {
        fn drop(&mut self) {
            self.done.store(true, Ordering::Release);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// What the speaker plays, recorded from [`SPEAKER_MONITOR`] on a
    /// thread of its own until [`Recording::finish`].
    pub struct Recording {
        done: Arc<AtomicBool>,
        thread: Option<JoinHandle<Vec<i16>>>,
    }

    impl Recording {
        /// Starts recording (16 kHz mono).
        ///
        /// # Panics
        ///
        /// When the server does not take the stream.
        pub fn start(pulse: &Pulse) -> Recording {
            let server = pulse.server();
            let input = or_fail(
                Simple::new(
                    Some(&server),
                    "dk test",
                    Direction::Record,
                    Some(SPEAKER_MONITOR),
                    "record",
                    &spec(),
                    None,
                    None,
                ),
                "the recording's stream",
            );
            let done = Arc::new(AtomicBool::new(false));
            let stop = Arc::clone(&done);
            let thread = std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut chunk = vec![0u8; BLOCK * 8];
                while !stop.load(Ordering::Acquire) {
                    if input.read(&mut chunk).is_err() {
                        break;
                    }
                    got.extend(chunk.chunks_exact(2).map(|pair| match pair {
                        [lo, hi] => i16::from_le_bytes([*lo, *hi]),
                        _ => 0,
                    }));
                }
                got
            });
            Recording {
                done,
                thread: Some(thread),
            }
        }

        /// Stops recording; what was heard.
        ///
        /// # Panics
        ///
        /// When the recording thread panicked.
        pub fn finish(mut self) -> Vec<i16> {
            self.done.store(true, Ordering::Release);
            let thread = self.thread.take();
            thread.map_or_else(Vec::new, |t| {
                or_fail(t.join().map_err(|_| "panicked"), "the recording")
            })
        }
    }

    impl Drop for Recording {
        fn drop(&mut self) {
            self.done.store(true, Ordering::Release);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}
