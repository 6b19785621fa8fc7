//! `dk device desktop`: this machine's X11 desktop as a dk device (kind
//! `desktop-control`, dk-desktop): screenshots and zoom, the pointer, the
//! wheel and the keyboard, in screenshot pixels; `key` and `type` ask the
//! person every time. Windows (by class or title) and screen regions listed
//! with `--blackout-*` or in `--config` are black in every image and refuse
//! the pointer and the keyboard; the list is shown in the pairing prompt.
//! It speaks dk/2 and prints the same lines as `dk device simulate` (the
//! pairing code, each call, each disconnect and reconnect). With
//! `--stream-every` it also streams PNG screenshots on `screen` once the
//! vessel admits it. Ctrl-C closes the connection and exits.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dk_desktop::{Desktop, DesktopConfig, MAX_CONFIG_BYTES, Region, Size, check_display};
use dk_device::{ServeOptions, stream_channel};

use crate::device_run::{self, Channel, Connect, WhenFull, serve, stream};
use crate::input::printable;

/// Screenshots waiting to be sent at most: each is up to a megabyte, and a
/// stale one is worth little.
const STREAM_QUEUE: usize = 2;

/// Arguments of `dk device desktop`.
#[derive(Debug, Args)]
pub struct DesktopArgs {
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
    /// The X display, e.g. :1 [default: $DISPLAY].
    #[arg(long)]
    pub display: Option<String>,
    /// The size screenshots are scaled down to fit, keeping the aspect
    /// ratio (never enlarged) [default: 1280x800].
    #[arg(long)]
    pub size: Option<Size>,
    /// The device id [default: desktop].
    #[arg(long)]
    pub id: Option<String>,
    /// The device name the person sees [default: Desktop].
    #[arg(long)]
    pub name: Option<String>,
    /// Black out windows of this WM_CLASS (instance or class,
    /// case-insensitive); repeatable.
    #[arg(long, value_name = "CLASS")]
    pub blackout_class: Vec<String>,
    /// Black out windows whose title matches this pattern (`*` and `?`,
    /// case-insensitive); repeatable.
    #[arg(long, value_name = "GLOB")]
    pub blackout_title: Vec<String>,
    /// Black out this region of the screen, X,Y,W,H in screen pixels;
    /// repeatable.
    #[arg(long, value_name = "X,Y,W,H")]
    pub blackout_region: Vec<Region>,
    /// Let clicks, scrolls and drags start on the bare desktop (the root
    /// window), where window managers open their menus; refused unless
    /// given.
    #[arg(long)]
    pub root_clicks: bool,
    /// A TOML file with the same settings (`display`, `size`, `id`, `name`,
    /// `root_clicks`, `[blackout] classes`, `titles`, `regions`); flags given
    /// too override its values and add to its blackout lists.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Stream a PNG screenshot on `screen` every MS milliseconds while the
    /// vessel admits the device.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
    pub stream_every: Option<u64>,
}

/// The settings from the file (if any), then the flags.
fn settings(args: &DesktopArgs) -> Result<DesktopConfig, String> {
    let mut config = match &args.config {
        Some(path) => {
            let shown = printable(&path.display().to_string());
            let text = read_config(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
            DesktopConfig::parse(&text).map_err(|e| format!("{shown}: {e}"))?
        }
        None => DesktopConfig::default(),
    };
    if let Some(display) = &args.display {
        config.display = Some(check_display(display).map_err(|e| e.to_string())?);
    }
    if let Some(size) = args.size {
        config.size = size;
    }
    if let Some(id) = &args.id {
        config.id.clone_from(id);
    }
    if let Some(name) = &args.name {
        config.name.clone_from(name);
    }
    config.root_clicks |= args.root_clicks;
    let mut blackout = config.blackout;
    for class in &args.blackout_class {
        blackout = blackout.class(class).map_err(|e| e.to_string())?;
    }
    for title in &args.blackout_title {
        blackout = blackout.title(title).map_err(|e| e.to_string())?;
    }
    for &region in &args.blackout_region {
        blackout = blackout.region(region);
    }
    config.blackout = blackout;
    Ok(config)
}

fn read_config(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Runs the desktop device until Ctrl-C: 0 when stopped by Ctrl-C, 1 when
/// the settings are refused or the client stopped with an error.
pub fn run(args: &DesktopArgs) -> ExitCode {
    let config = match settings(args) {
        Ok(config) => config,
        Err(why) => {
            eprintln!("error: {}", printable(&why));
            return ExitCode::FAILURE;
        }
    };
    let every = args.stream_every.map(Duration::from_millis);
    let desktop = match Desktop::new(&config, every) {
        Ok(desktop) => desktop,
        Err(e) => {
            eprintln!("error: {}", printable(&e.to_string()));
            return ExitCode::FAILURE;
        }
    };
    let display = config
        .display
        .clone()
        .or_else(|| std::env::var("DISPLAY").ok())
        .unwrap_or_default();
    println!(
        "display {}; screenshots fit {}",
        printable(&display),
        config.size
    );
    println!("{}", printable(&config.blackout.describe()));
    let connect = Connect {
        vessel: &args.vessel,
        also_at: &args.also_at,
        channel: Channel::Dk2 {
            key_file: args.key_file.clone(),
            forget_vessel: args.forget_vessel,
        },
        tls_root: args.tls_root.as_deref(),
    };
    let device = desktop.device().clone();
    match every {
        None => {
            let options = device_run::options(&connect, &device, ServeOptions::new());
            device_run::block_on(serve(&device, options, std::future::pending()))
        }
        Some(every) => {
            let (chunks, outbox) = stream_channel(STREAM_QUEUE);
            let options =
                device_run::options(&connect, &device, ServeOptions::new()).streams(outbox);
            let screen = stream("screen", chunks, every, WhenFull::Wait, move |_| {
                let desktop = desktop.clone();
                async move { desktop.screenshot_png().await.ok() }
            });
            device_run::block_on(serve(&device, options, screen))
        }
    }
}
