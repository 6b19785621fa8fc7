//! A PulseAudio server of a test's own (Debian's `pulseaudio`, run as a
//! user daemon with no configuration of the machine's): its socket and
//! state in a temporary directory, two null sinks, `dk_mic` (what a test
//! plays into it is heard on its monitor, `dk_mic.monitor`, the device's
//! microphone) and `dk_speaker` (the device's speaker; a test records its
//! monitor, `dk_speaker.monitor`). Stopped, and the directory removed,
//! when dropped. Without the server a test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set (`cargo xtask peers` installs it).

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
