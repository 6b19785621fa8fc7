//! What the sample device examples share: their command line, printing the
//! pairing code and each call, and running until Ctrl-C.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use dk_device::{ClientOptions, Device, Notice, ServeOptions, run_client};
use serde_json::Value;

/// The command line: `<vessel URL> [--key-file PATH]`.
pub struct Args {
    /// The vessel's device route, e.g. `ws://127.0.0.1:7777/device`.
    pub url: String,
    /// Where to keep the device's dk/2 key and the vessel key it pins.
    pub key_file: Option<PathBuf>,
}

/// Reads the command line, or explains it.
pub fn args(example: &str) -> Result<Args, String> {
    let usage = format!(
        "usage: cargo run -p dk-device --example {example} -- <ws://host:port/device> [--key-file PATH]"
    );
    let mut url = None;
    let mut key_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--key-file" => match args.next() {
                Some(path) => key_file = Some(PathBuf::from(path)),
                None => return Err(usage),
            },
            "-h" | "--help" => return Err(usage),
            _ if url.is_none() && !arg.starts_with('-') => url = Some(arg),
            _ => return Err(usage),
        }
    }
    let url = url.ok_or(usage)?;
    Ok(Args { url, key_file })
}

/// Client options printing the pairing code, each call and revocation.
pub fn client_options(args: &Args, serve: ServeOptions) -> ClientOptions {
    let serve = serve.on_notice(|notice| match notice {
        Notice::Invoked {
            capability, input, ..
        } => println!(
            "call: {capability} {}",
            printable(&Value::Object(input).to_string())
        ),
        Notice::Revoked {
            capability: Some(capability),
        } => println!("revoked: {}", printable(&capability)),
        Notice::Revoked { capability: None } => println!("the pairing was ended"),
        _ => {}
    });
    let options = ClientOptions::new(args.url.clone())
        .on_code(|code| {
            println!();
            println!("    Pairing code: {code} — check it matches the vessel's prompt");
            println!();
        })
        .serve(serve);
    match &args.key_file {
        Some(path) => options.key_file(path),
        None => options,
    }
}

/// Runs `device` until Ctrl-C, with `alongside` (which should not end on
/// its own) running next to it.
pub fn run(
    device: &Device,
    options: ClientOptions,
    alongside: impl Future<Output = ()>,
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
    println!(
        "{} connecting to {} (Ctrl-C to stop)",
        device.manifest().name(),
        options.url()
    );
    let result = runtime.block_on(async {
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
    });
    match result {
        Ok(()) => {
            println!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `text` with control, escape, invisible and bidirectional characters
/// escaped, so printing it cannot drive the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if dk_proto::is_unsafe_char(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
