//! What the commands that run a device against a vessel (`dk device
//! simulate`, `dk device desktop`) share: the client's options and the
//! lines they print (where it connects, the key file, the pairing code,
//! each call, each disconnect and reconnect), the default key file's place,
//! a stream fed at a steady pace, and serving until Ctrl-C. Tests parse
//! these lines, so both commands print them alike.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use dk_device::{
    ClientOptions, ConnectionEvent, Device, Notice, ServeOptions, StreamSendError, StreamSender,
    run_client,
};
use serde_json::Value;

use crate::input::printable;

/// How often a streaming device prints what it sent.
const STREAM_REPORT_PERIOD: Duration = Duration::from_secs(10);

/// How a device speaks to the vessel, and where it keeps its credential.
#[derive(Debug, Clone)]
pub(crate) enum Channel {
    /// dk/2: the device key and the vessel's pin in a key file.
    Dk2 {
        /// The key file, or the default in dk's home.
        key_file: Option<PathBuf>,
        /// Forget the pinned vessel key first.
        forget_vessel: bool,
    },
    /// 8DK v1 in clear: a bearer token in a token file.
    V1 {
        /// The token file, or the default in dk's home.
        token_file: Option<PathBuf>,
    },
}

/// Where and how a device connects.
#[derive(Debug, Clone)]
pub(crate) struct Connect<'a> {
    /// The vessel's device route.
    pub vessel: &'a str,
    /// Other addresses to try in turn.
    pub also_at: &'a [String],
    /// The channel and its credential file.
    pub channel: Channel,
    /// A PEM file of the roots to trust for `wss://`.
    pub tls_root: Option<&'a Path>,
}

/// Runs `client` (which serves until Ctrl-C or fails) on a runtime of one
/// thread: 0 when stopped by Ctrl-C, 1 when the client stopped with an
/// error (pairing refused, token refused, manifest changed, unpaired, bad
/// URL, key file trouble).
pub(crate) fn block_on(
    client: impl Future<Output = Result<(), dk_device::ClientError>>,
) -> ExitCode {
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
    match runtime.block_on(client) {
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
pub(crate) fn options(
    connect: &Connect<'_>,
    device: &Device,
    serve: ServeOptions,
) -> ClientOptions {
    let id = device.manifest().id();
    println!(
        "{} ({}) connecting to {} over {}",
        device.manifest().name(),
        id,
        printable(connect.vessel),
        match connect.channel {
            Channel::V1 { .. } => "v1 (NOT encrypted)",
            Channel::Dk2 { .. } => "dk/2 (encrypted)",
        }
    );
    let options = connect.also_at.iter().fold(
        ClientOptions::new(connect.vessel.to_owned()),
        |options, url| {
            println!("also at {}", printable(url));
            options.also_at(url.clone())
        },
    );
    let options = match &connect.channel {
        Channel::V1 { token_file } => {
            let token_file = token_file
                .clone()
                .unwrap_or_else(|| default_file(id, "token"));
            println!(
                "token file: {}",
                printable(&token_file.display().to_string())
            );
            options.v1().token_file(token_file)
        }
        Channel::Dk2 {
            key_file,
            forget_vessel,
        } => {
            let key_file = key_file.clone().unwrap_or_else(|| default_file(id, "key"));
            println!("key file: {}", printable(&key_file.display().to_string()));
            let options = options.key_file(key_file).on_vessel_pinned(|fingerprint| {
                println!("paired over dk/2; the vessel's key is pinned: {fingerprint}");
                println!("(compare it with the fingerprint `dk vessel` printed at start)");
            });
            if *forget_vessel {
                options.forget_vessel()
            } else {
                options
            }
        }
    };
    println!("Ctrl-C to stop");
    let serve = serve.on_notice(|notice| match notice {
        Notice::Invoked {
            capability, input, ..
        } => println!(
            "call: {} {}",
            printable(&capability),
            printable(&shown_input(&Value::Object(input).to_string()))
        ),
        Notice::Revoked {
            capability: Some(capability),
        } => println!("revoked: {}", printable(&capability)),
        Notice::Revoked { capability: None } => println!("the vessel ended the pairing"),
        _ => {}
    });
    let options = match connect.tls_root {
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
/// directory; dk-device's `Home::device_file`), the same from any directory. A file an older dk left in
/// `./.dk/` is not used silently: the error says what to do with it. Also
/// the default of every device `dk bridge mqtt` serves.
pub(crate) fn device_file(id: &str, ext: &str) -> Result<PathBuf, String> {
    let home = crate::home::Home::locate()
        .map_err(|e| format!("{e}; or name the {ext} file with --{ext}-file"))?;
    let path = home.device_file(id, ext);
    let old = PathBuf::from(".dk").join(format!("{id}.{ext}"));
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

/// What a stream does with a chunk when its queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhenFull {
    /// Drops it (counted), and makes the next on time: live audio is
    /// better late than piled up.
    Drop,
    /// Waits for room before making the next: a chunk that is costly to
    /// make (a screenshot) is not made while nobody takes them.
    Wait,
}

/// Makes a chunk every `period` (`make` may have none to give) and queues
/// it on `stream`, printing now and then how many went out and how many
/// were dropped (the queue was full: not connected, not admitted, or the
/// connection too slow). Never ends.
pub(crate) async fn stream<F>(
    name: &'static str,
    chunks: StreamSender,
    period: Duration,
    when_full: WhenFull,
    mut make: impl FnMut(u64) -> F,
) where
    F: Future<Output = Option<Vec<u8>>>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut report = tokio::time::Instant::now() + STREAM_REPORT_PERIOD;
    let mut index: u64 = 0;
    loop {
        tick.tick().await;
        let Some(chunk) = make(index).await else {
            continue;
        };
        let sent = match when_full {
            WhenFull::Drop => chunks.try_send(name, chunk),
            WhenFull::Wait => chunks.send(name, chunk).await,
        };
        if let Err(StreamSendError::Closed) = sent {
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

/// Longest input printed for a call, in characters: a call may carry
/// hundreds of kilobytes (a sound to play), which the terminal is spared.
const SHOWN_INPUT: usize = 300;

/// A call's input as printed: whole when short, else its start and its
/// length.
fn shown_input(input: &str) -> String {
    if input.chars().count() <= SHOWN_INPUT {
        return input.to_owned();
    }
    let start: String = input.chars().take(SHOWN_INPUT).collect();
    format!("{start}... ({} bytes in all)", input.len())
}

/// Runs the client until Ctrl-C, with `alongside` (which does not end on
/// its own) next to it.
pub(crate) async fn serve(
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
