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

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dk_device::samples::{Desktop, Lamp, Lock, Thermostat, VOICE_FRAME_MS, Voice};
use dk_device::{
    ClientOptions, ConnectionEvent, DEFAULT_STREAM_QUEUE, Device, Notice, ServeOptions,
    StreamSendError, StreamSender, run_client, stream_channel,
};
use serde_json::Value;

use crate::input::printable;

/// How often the simulated thermostat reads its temperature and reports it.
const THERMOSTAT_PERIOD: Duration = Duration::from_secs(3);
/// How often the simulated desktop takes a screenshot.
const SCREENSHOT_PERIOD: Duration = Duration::from_millis(500);
/// The simulated desktop's screen: 640 x 360 RGBA, 921,600 bytes a
/// screenshot, within the default 1 MiB chunk cap.
const SCREEN: (u32, u32) = (640, 360);
/// How often a streaming simulator prints what it sent.
const STREAM_REPORT_PERIOD: Duration = Duration::from_secs(10);

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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.device {
        SimulatedDevice::Lamp => {
            let device = Lamp::new().device();
            let options = options(args, &device, ServeOptions::new());
            runtime.block_on(serve(&device, options, std::future::pending()))
        }
        SimulatedDevice::Lock => {
            let device = Lock::new().device();
            let options = options(args, &device, ServeOptions::new());
            runtime.block_on(serve(&device, options, std::future::pending()))
        }
        SimulatedDevice::Thermostat => {
            let thermostat = Thermostat::new();
            let device = thermostat.device();
            let (events, receiver) = device.events(16);
            let options = options(args, &device, ServeOptions::new().events(receiver));
            let drift = async move { thermostat.drift(&events, THERMOSTAT_PERIOD).await };
            runtime.block_on(serve(&device, options, drift))
        }
        SimulatedDevice::Voice => {
            let voice = Voice::new();
            let device = voice.device();
            let (chunks, outbox) = stream_channel(DEFAULT_STREAM_QUEUE);
            let options = options(args, &device, ServeOptions::new()).streams(outbox);
            let period = Duration::from_millis(u64::from(VOICE_FRAME_MS));
            let microphone = stream("microphone", chunks, period, move |i| voice.frame(i));
            runtime.block_on(serve(&device, options, microphone))
        }
        SimulatedDevice::Desktop => {
            let desktop = Desktop::new(SCREEN.0, SCREEN.1);
            let device = desktop.device();
            let (chunks, outbox) = stream_channel(DEFAULT_STREAM_QUEUE);
            let options = options(args, &device, ServeOptions::new()).streams(outbox);
            let screen = stream("screen", chunks, SCREENSHOT_PERIOD, move |i| {
                desktop.screenshot(i)
            });
            runtime.block_on(serve(&device, options, screen))
        }
    };
    match result {
        Ok(()) => {
            println!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", printable(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Client options for `device`: the channel, the key or token file, the
/// pairing code and each call printed.
fn options(args: &SimulateArgs, device: &Device, serve: ServeOptions) -> ClientOptions {
    let id = device.manifest().id();
    println!(
        "{} ({}) connecting to {} over {}",
        device.manifest().name(),
        id,
        printable(&args.vessel),
        if args.v1 {
            "v1 (NOT encrypted)"
        } else {
            "dk/2 (encrypted)"
        }
    );
    let options = ClientOptions::new(args.vessel.clone());
    let options = if args.v1 {
        let token_file = args
            .token_file
            .clone()
            .unwrap_or_else(|| default_file(id, "token"));
        println!(
            "token file: {}",
            printable(&token_file.display().to_string())
        );
        options.v1().token_file(token_file)
    } else {
        let key_file = args
            .key_file
            .clone()
            .unwrap_or_else(|| default_file(id, "key"));
        println!("key file: {}", printable(&key_file.display().to_string()));
        let options = options.key_file(key_file).on_vessel_pinned(|fingerprint| {
            println!("paired over dk/2; the vessel's key is pinned: {fingerprint}");
            println!("(compare it with the fingerprint `dk vessel` printed at start)");
        });
        if args.forget_vessel {
            options.forget_vessel()
        } else {
            options
        }
    };
    println!("Ctrl-C to stop");
    let serve = serve.on_notice(|notice| match notice {
        Notice::Invoked {
            capability, input, ..
        } => println!(
            "call: {} {}",
            printable(&capability),
            printable(&Value::Object(input).to_string())
        ),
        Notice::Revoked {
            capability: Some(capability),
        } => println!("revoked: {}", printable(&capability)),
        Notice::Revoked { capability: None } => println!("the vessel ended the pairing"),
        _ => {}
    });
    let options = match &args.tls_root {
        Some(path) => match std::fs::read(path) {
            Ok(pem) => options.tls_root(pem),
            Err(e) => {
                eprintln!(
                    "error: cannot read the TLS root {}: {e}",
                    printable(&path.display().to_string())
                );
                std::process::exit(1);
            }
        },
        None => options,
    };
    // Whether the device was connected before: a connection after a
    // disconnect is a reconnect.
    let was_connected = std::sync::atomic::AtomicBool::new(false);
    options
        .on_connection(move |event| match event {
            ConnectionEvent::Connected => {
                if was_connected.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    println!("reconnected to the vessel");
                } else {
                    println!("connected to the vessel");
                }
            }
            ConnectionEvent::Disconnected { why, retry_in } => println!(
                "disconnected: {}; trying again in {:.1} s",
                printable(why),
                retry_in.as_secs_f64()
            ),
            _ => {}
        })
        .on_code(|code| {
            println!();
            println!("    Pairing code: {code} — check it matches the vessel's prompt");
            println!();
        })
        .serve(serve)
}

/// The default key (`ext` "key") or token ("token") file of device `id`
/// ([`device_file`]); exits when there is none to name.
fn default_file(id: &str, ext: &str) -> PathBuf {
    match device_file(id, ext) {
        Ok(path) => path,
        Err(why) => {
            for line in why.lines() {
                eprintln!("error: {line}");
            }
            std::process::exit(1);
        }
    }
}

/// The default key (`ext` "key") or token ("token") file of device `id`:
/// `devices/<id>.<ext>` in dk's home (`DK_HOME`, else the XDG data
/// directory), the same from any directory. A file an older dk left in
/// `./.dk/` is not used silently: the error says what to do with it. Also
/// the default of every device `dk bridge mqtt` serves.
pub(crate) fn device_file(id: &str, ext: &str) -> Result<PathBuf, String> {
    let name = format!("{id}.{ext}");
    let home = crate::home::Home::locate()
        .map_err(|e| format!("{e}; or name the {ext} file with --{ext}-file"))?;
    let path = home.root().join("devices").join(&name);
    let old = PathBuf::from(".dk").join(&name);
    if std::fs::symlink_metadata(&path).is_err() && std::fs::symlink_metadata(&old).is_ok() {
        let (old, path) = (
            printable(&old.display().to_string()),
            printable(&path.display().to_string()),
        );
        return Err(format!(
            "`{old}` is where an older dk kept this device's {ext} file, in the current directory; dk now keeps it in `{path}`\nif `{old}` is yours and nobody else could have written it, move it there (mv {old} {path}) or name it with --{ext}-file {old} (for the bridge, `keyFile` in its configuration); else remove it and pair again"
        ));
    }
    Ok(path)
}

/// Makes a chunk every `period` and queues it on `stream`, printing now and
/// then how many went out and how many were dropped (the queue was full: not
/// connected, not admitted, or the connection too slow). Never ends.
async fn stream(
    name: &'static str,
    chunks: StreamSender,
    period: Duration,
    mut make: impl FnMut(u64) -> Vec<u8>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut report = tokio::time::Instant::now() + STREAM_REPORT_PERIOD;
    let mut index: u64 = 0;
    loop {
        tick.tick().await;
        if let Err(StreamSendError::Closed) = chunks.try_send(name, make(index)) {
            return std::future::pending().await;
        }
        index += 1;
        if tokio::time::Instant::now() >= report {
            report += STREAM_REPORT_PERIOD;
            println!(
                "{name}: {index} chunks made, {} dropped before sending",
                chunks.dropped()
            );
        }
    }
}

/// Runs the client until Ctrl-C, with `alongside` (which does not end on
/// its own) next to it.
async fn serve(
    device: &Device,
    options: ClientOptions,
    alongside: impl Future<Output = ()>,
) -> Result<(), dk_device::ClientError> {
    let ctrl_c = async {
        // Without a signal handler, run until the process is killed.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = run_client(device, options, ctrl_c) => result,
        () = alongside => Ok(()),
    }
}
