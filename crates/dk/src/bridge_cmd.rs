//! `dk bridge mqtt`: runs the MQTT bridge (dk-bridge-mqtt) against a
//! broker and a vessel, printing each bridged device's pairing code for the
//! person to compare with the vessel's prompt. `dk bridge mcp`: runs an MCP
//! server (the command after `--`) as one device (dk-bridge-mcp), printing
//! what it carries, what it leaves out and why, and its pairing code.
//!
//! The broker's user and password come from `DK_MQTT_USERNAME` and
//! `DK_MQTT_PASSWORD`, or from `--credentials-file` (a private file of two
//! lines: user, then password), never from the command line, where other
//! users of the machine could read them. Over `mqtt://` they go only to a
//! broker on loopback, unless `--allow-clear-credentials` says the person
//! knows they cross the network in clear.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};
use dk_bridge_mqtt::{BridgeConfig, BrokerState, Credentials, run_bridge};

use crate::input::printable;

/// `dk bridge`.
#[derive(Subcommand)]
pub enum BridgeCommand {
    /// Bridge MQTT devices (Zigbee2MQTT, Tasmota, Home Assistant discovery)
    /// to a vessel: each mapped device pairs, is granted and is audited
    /// like any other.
    Mqtt(MqttArgs),
    /// Bridge an MCP server (the command after `--`) to a vessel as one
    /// device: each of its tools a capability the person grants, every
    /// tool that changes anything asking the person on each call.
    Mcp(McpArgs),
}

/// Arguments of `dk bridge mcp`.
#[derive(Args)]
pub struct McpArgs {
    /// The device's id: lower case words joined by `-`, at most 24
    /// characters.
    #[arg(long)]
    pub id: String,
    /// The device's name for people. [default: the server's own name and
    /// version]
    #[arg(long)]
    pub name: Option<String>,
    /// The vessel's device route.
    #[arg(long, value_name = "URL", default_value = "ws://127.0.0.1:7777/device")]
    pub vessel: String,
    /// The device's key file. [default: devices/ID.key in dk's home, ID the device id]
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// An environment variable the server is given, with its value here;
    /// repeat for more. The server gets PATH and these, nothing else.
    #[arg(long = "env", value_name = "NAME")]
    pub env: Vec<String>,
    /// How long a call may wait for the server, in milliseconds.
    #[arg(long, default_value_t = 120_000)]
    pub call_timeout_ms: u64,
    /// The server's command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Arguments of `dk bridge mqtt`.
#[derive(Args)]
pub struct MqttArgs {
    /// Only propose a mapping from Home Assistant discovery.
    #[command(subcommand)]
    pub action: Option<MqttAction>,
    /// The broker: `mqtt://host[:port]` (no user or password here).
    #[arg(
        long,
        value_name = "URL",
        global = true,
        default_value = "mqtt://127.0.0.1:1883"
    )]
    pub broker: String,
    /// The mapping of MQTT devices to dk devices (TOML, docs/BRIDGE-MQTT.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The vessel's device route.
    #[arg(long, value_name = "URL", default_value = "ws://127.0.0.1:7777/device")]
    pub vessel: String,
    /// A file holding the broker's user and password, one per line (mode
    /// 0600). [default: DK_MQTT_USERNAME and DK_MQTT_PASSWORD, if set]
    #[arg(long, value_name = "FILE", global = true)]
    pub credentials_file: Option<PathBuf>,
    /// Send the broker's user and password over mqtt:// to a broker off
    /// loopback, where anyone on the network between reads them in clear.
    /// Without it they go only over mqtts:// or to a broker on this
    /// machine.
    #[arg(long, global = true)]
    pub allow_clear_credentials: bool,
}

/// What `dk bridge mqtt` does instead of bridging.
#[derive(Subcommand)]
pub enum MqttAction {
    /// Read Home Assistant discovery configs (`homeassistant/.../config`)
    /// and print a proposed mapping to review and keep; nothing is bridged.
    Discover {
        /// How long to listen for retained configs, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        wait_ms: u64,
    },
}

/// Runs `dk bridge ...`.
pub fn run(command: BridgeCommand) -> ExitCode {
    match command {
        BridgeCommand::Mqtt(args) => match mqtt(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {}", printable(&e));
                ExitCode::FAILURE
            }
        },
        BridgeCommand::Mcp(args) => match mcp(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {}", printable(&e));
                ExitCode::FAILURE
            }
        },
    }
}

/// The server's environment: PATH, and each variable named, with its
/// value here.
fn server_env(names: &[String]) -> Result<Vec<(OsString, OsString)>, String> {
    let mut env = Vec::new();
    for name in std::iter::once("PATH").chain(names.iter().map(String::as_str)) {
        if env.iter().any(|(n, _): &(OsString, OsString)| n == name) {
            continue;
        }
        match std::env::var_os(name) {
            Some(value) => env.push((OsString::from(name), value)),
            None if name == "PATH" => {}
            None => return Err(format!("--env {name}: it is not set here")),
        }
    }
    Ok(env)
}

fn mcp(args: McpArgs) -> Result<(), String> {
    let mut parts = args.command.into_iter();
    let program = parts.next().ok_or("name the server's command after `--`")?;
    let command = dk_bridge_mcp::ServerCommand {
        program,
        args: parts.collect(),
        env: server_env(&args.env)?,
        dir: None,
    };
    let key_file = match args.key_file {
        Some(path) => path,
        None => crate::device_run::device_file(&args.id, "key")?,
    };
    let shown = command.shown();
    println!("dk bridge mcp");
    println!("  server               {}", printable(&shown));
    println!("  vessel               {}", printable(&args.vessel));
    println!(
        "  key file             {}",
        printable(&key_file.display().to_string())
    );
    let id = args.id.clone();
    let on_code: dk_bridge_mcp::CodeHook = Arc::new(move |code: &str| {
        println!("[{id}] pairing code {code}: pair only if the vessel shows the same");
    });
    let id = args.id.clone();
    let on_manifest: dk_bridge_mcp::ManifestHook = Arc::new(move |built| {
        for line in dk_bridge_mcp::describe(built) {
            println!("[{id}] {}", printable(&line));
        }
    });
    let options = dk_bridge_mcp::BridgeOptions {
        identity: dk_bridge_mcp::Identity {
            id: args.id,
            command: shown,
            name: args.name,
        },
        command,
        vessel: args.vessel,
        key_file,
        call_timeout: std::time::Duration::from_millis(args.call_timeout_ms),
        on_code,
        on_manifest,
    };
    runtime()?.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        dk_bridge_mcp::run_bridge(options, stop)
            .await
            .map_err(|e| e.to_string())
    })
}

/// The broker's credentials: from the file, else the environment.
fn credentials(file: Option<&Path>) -> Result<Option<(String, String)>, String> {
    if let Some(path) = file {
        let text = dk_files::private::read_private_file(path)
            .map_err(|e| format!("the credentials file is refused: {e}"))?;
        let text =
            String::from_utf8(text).map_err(|_| format!("`{}` is not text", path.display()))?;
        let mut lines = text.lines();
        return match (lines.next(), lines.next()) {
            (Some(user), Some(password)) if !user.is_empty() => {
                Ok(Some((user.to_owned(), password.to_owned())))
            }
            _ => Err(format!(
                "`{}` must hold the user on its first line and the password on its second",
                path.display()
            )),
        };
    }
    match (
        std::env::var("DK_MQTT_USERNAME"),
        std::env::var("DK_MQTT_PASSWORD"),
    ) {
        (Ok(user), Ok(password)) => Ok(Some((user, password))),
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => {
            Err("set both DK_MQTT_USERNAME and DK_MQTT_PASSWORD, or neither".to_owned())
        }
        _ => Ok(None),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn mqtt(args: &MqttArgs) -> Result<(), String> {
    let credentials = credentials(args.credentials_file.as_deref())?.map(|(user, password)| {
        let credentials = Credentials::new(user, password);
        if args.allow_clear_credentials {
            credentials.allow_clear_off_loopback()
        } else {
            credentials
        }
    });
    if let Some(MqttAction::Discover { wait_ms }) = &args.action {
        let wait = std::time::Duration::from_millis(*wait_ms);
        let found = runtime()?
            .block_on(dk_bridge_mqtt::discover::discover(
                &args.broker,
                credentials,
                wait,
            ))
            .map_err(|e| e.to_string())?;
        print!("{}", dk_bridge_mqtt::discover::to_toml(&found));
        for skipped in &found.skipped {
            eprintln!(
                "skipped `{}`: {}",
                printable(&skipped.topic),
                printable(&skipped.reason)
            );
        }
        if found.unlisted > 0 {
            eprintln!("skipped {} more configs", found.unlisted);
        }
        eprintln!(
            "{} devices proposed, {} configs skipped; nothing is bridged until you keep a mapping and run `dk bridge mqtt --config FILE`",
            found.devices.len(),
            found.skipped_count()
        );
        return Ok(());
    }
    let Some(path) = &args.config else {
        return Err(
            "name the mapping with --config FILE (`dk bridge mqtt discover` proposes one)"
                .to_owned(),
        );
    };
    let mut config = BridgeConfig::load(path).map_err(|e| {
        format!(
            "the bridge configuration `{}` is refused: {e}",
            path.display()
        )
    })?;
    keys_in_home(&mut config)?;
    println!("dk bridge mqtt");
    println!("  broker               {}", args.broker);
    println!("  vessel               {}", args.vessel);
    for device in &config.device {
        println!(
            "  device               {} ({}), state on `{}`",
            device.id,
            printable(&device.name),
            printable(&device.state_topic)
        );
    }
    if config.device.is_empty() {
        println!("  no device is mapped: nothing is bridged");
    }
    let runtime = runtime()?;
    let state = Arc::new(BrokerState::default());
    let on_code: dk_bridge_mqtt::CodeHook = Arc::new(|id: &str, code: &str| {
        println!("[{id}] pairing code {code}: pair only if the vessel shows the same");
    });
    runtime.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        run_bridge(
            config,
            args.broker.clone(),
            credentials,
            args.vessel.clone(),
            on_code,
            state,
            stop,
        )
        .await
        .map_err(|e| e.to_string())
    })
}

/// Gives every device without a `keyFile` its key file in dk's home
/// (`devices/<id>.key`, as the simulators keep theirs), never one in the
/// directory the bridge happens to run from; two devices never share one.
fn keys_in_home(config: &mut BridgeConfig) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for device in &mut config.device {
        if device.key_file.is_none() {
            let path = crate::device_run::device_file(&device.id, "key")
                .map_err(|e| format!("device `{}`: {e}", device.id))?;
            device.key_file = Some(path);
        }
        if !seen.insert(device.key_file()) {
            return Err(format!(
                "device `{}`: its key file is another device's",
                device.id
            ));
        }
    }
    Ok(())
}
