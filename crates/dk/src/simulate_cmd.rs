//! `dk device simulate`: run a sample device (the desk lamp, the front door
//! lock, the hall thermostat, the kitchen voice satellite or the office
//! desktop bridge) against a vessel. The voice satellite streams 20 ms PCM
//! frames of a sine and the desktop bridge screenshots, once the vessel
//! admits them (`dk vessel --config`, see docs/CONFIG.md). The devices speak
//! dk/2 (encrypted, the code computed on both sides) unless `--v1` is given.
//! The first run pairs and prints the code to compare with the vessel's
//! prompt; the device key (dk/2) or token (v1) is kept in a file (in dk's
//! home, `devices/<id>.key`, unless `--key-file` names one) so later runs
//! reconnect on their own. Each call received is printed, and each
//! disconnect (with why) and reconnect. Ctrl-C closes
//! the connection and exits.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dk_device::samples::{Desktop, Lamp, Lock, Thermostat, VOICE_FRAME_MS, Voice};
use dk_device::{DEFAULT_STREAM_QUEUE, Device, ServeOptions, stream_channel};

use crate::device_run::{self, Channel, Connect, WhenFull, serve, stream};

/// How often the simulated thermostat reads its temperature and reports it.
const THERMOSTAT_PERIOD: Duration = Duration::from_secs(3);
/// How often the simulated desktop takes a screenshot.
const SCREENSHOT_PERIOD: Duration = Duration::from_millis(500);
/// The simulated desktop's screen: 640 x 360 RGBA, 921,600 bytes a
/// screenshot, within the default 1 MiB chunk cap.
const SCREEN: (u32, u32) = (640, 360);

/// A sample device to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimulatedDevice {
    /// 8DK's reference desk lamp (`desk-lamp`): read_light, set_light, strobe.
    Lamp,
    /// A front door lock (`front-door`), locked at start: read_lock, lock, unlock.
    Lock,
    /// A hall thermostat (`hall-thermostat`): read_temperature, set_target;
    /// reports its temperature as events.
    Thermostat,
    /// A kitchen voice satellite (`kitchen-voice`, kind voice): streams its
    /// microphone (20 ms frames of 16 kHz PCM, a 440 Hz tone); read_status,
    /// set_volume, mute, speak.
    Voice,
    /// An office desktop bridge (`office-desktop`, kind desktop-control):
    /// streams 640x360 screenshots; read_screen, move_pointer, and click and
    /// type_text, which ask the person every time.
    Desktop,
}

/// Arguments of `dk device simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The sample device to run.
    #[arg(value_enum)]
    pub device: SimulatedDevice,
    /// The vessel's device route, e.g. ws://127.0.0.1:7777/device.
    #[arg(long)]
    pub vessel: String,
    /// Another address of the vessel (or of another member of its fleet),
    /// tried in turn when one cannot be reached; may be given more than
    /// once.
    #[arg(long, value_name = "URL")]
    pub also_at: Vec<String>,
    /// Speak 8DK v1 (in clear, a bearer token) instead of dk/2: for vessels
    /// that speak nothing else, on loopback.
    #[arg(long)]
    pub v1: bool,
    /// Where to keep the dk/2 device key and the vessel key it pins (by
    /// default `devices/<device-id>.key` in dk's home: `DK_HOME`, else
    /// `$XDG_DATA_HOME/dk`, else `~/.local/share/dk`). It must be a regular
    /// file of this user with mode 0600, never a link.
    #[arg(long, conflicts_with = "v1")]
    pub key_file: Option<PathBuf>,
    /// Forget the pinned vessel key (and the pairing) first: only when the
    /// vessel was really replaced.
    #[arg(long, conflicts_with = "v1")]
    pub forget_vessel: bool,
    /// For a `wss://` vessel URL: trust only the certificates in this PEM
    /// file (a private CA, or the TLS proxy's self-signed certificate)
    /// instead of the platform's roots.
    #[arg(long)]
    pub tls_root: Option<PathBuf>,
    /// Where to keep the v1 device token (by default
    /// `devices/<device-id>.token` in dk's home); with `--v1` only.
    #[arg(long, requires = "v1")]
    pub token_file: Option<PathBuf>,
}

/// Runs the simulated device until Ctrl-C: 0 when stopped by Ctrl-C, 1 when
/// the client stopped with an error (pairing refused, token refused,
/// manifest changed, unpaired, bad URL, token file trouble).
pub fn run(args: &SimulateArgs) -> ExitCode {
    let connect = Connect {
        vessel: &args.vessel,
        also_at: &args.also_at,
        channel: if args.v1 {
            Channel::V1 {
                token_file: args.token_file.clone(),
            }
        } else {
            Channel::Dk2 {
                key_file: args.key_file.clone(),
                forget_vessel: args.forget_vessel,
            }
        },
        tls_root: args.tls_root.as_deref(),
    };
    let options =
        |device: &Device, serve: ServeOptions| device_run::options(&connect, device, serve);
    match args.device {
        SimulatedDevice::Lamp => {
            let device = Lamp::new().device();
            let options = options(&device, ServeOptions::new());
            device_run::block_on(serve(&device, options, std::future::pending()))
        }
        SimulatedDevice::Lock => {
            let device = Lock::new().device();
            let options = options(&device, ServeOptions::new());
            device_run::block_on(serve(&device, options, std::future::pending()))
        }
        SimulatedDevice::Thermostat => {
            let thermostat = Thermostat::new();
            let device = thermostat.device();
            let (events, receiver) = device.events(16);
            let options = options(&device, ServeOptions::new().events(receiver));
            let drift = async move { thermostat.drift(&events, THERMOSTAT_PERIOD).await };
            device_run::block_on(serve(&device, options, drift))
        }
        SimulatedDevice::Voice => {
            let voice = Voice::new();
            let device = voice.device();
            let (chunks, outbox) = stream_channel(DEFAULT_STREAM_QUEUE);
            let options = options(&device, ServeOptions::new()).streams(outbox);
            let period = Duration::from_millis(u64::from(VOICE_FRAME_MS));
            let microphone = stream("microphone", chunks, period, WhenFull::Drop, move |i| {
                std::future::ready(Some(voice.frame(i)))
            });
            device_run::block_on(serve(&device, options, microphone))
        }
        SimulatedDevice::Desktop => {
            let desktop = Desktop::new(SCREEN.0, SCREEN.1);
            let device = desktop.device();
            let (chunks, outbox) = stream_channel(DEFAULT_STREAM_QUEUE);
            let options = options(&device, ServeOptions::new()).streams(outbox);
            let screen = stream(
                "screen",
                chunks,
                SCREENSHOT_PERIOD,
                WhenFull::Drop,
                move |i| std::future::ready(Some(desktop.screenshot(i))),
            );
            device_run::block_on(serve(&device, options, screen))
        }
    }
}
