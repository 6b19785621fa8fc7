//! The `dk` command line: check manifests and rule files, explain a rule
//! decision, and show the tools an agent would see.
//!
//! Exit codes: 0 when the thing checked is good, 1 when it is not (or cannot
//! be read), 2 for a command line clap refuses.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc, with its background threads: memory a burst of connections
/// used goes back to the system within seconds once they close (the
/// system allocator kept it, tens of megabytes after a connection flood).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod admin_cmd;
mod agents_cmd;
mod audit_cmd;
mod backup_cmd;
mod bridge_cmd;
mod demo_cmd;
mod desktop_cmd;
mod device_run;
mod home;
mod input;
mod logging;
mod manifest_cmd;
mod mcp_cmd;
mod policy_cmd;
mod prompt;
mod simulate_cmd;
mod systemd;
mod tools_cmd;
mod vessel_cmd;
mod voice_cmd;

/// dk: a device kit for AI agents.
#[derive(Parser)]
#[command(
    name = "dk",
    version,
    about = "dk: a device kit for AI agents",
    long_about = None,
    after_help = "Files: dk keeps a vessel's data directory and admin token in its home, \
                  $DK_HOME, else $XDG_DATA_HOME/dk, else ~/.local/share/dk; \
                  `dk vessel` and the commands that talk to it find each other there \
                  from any directory."
)]
struct Cli {
    /// How log lines on standard error are written: `text`, or `json` (one
    /// object a line: timestamp, level, target, message and the event's
    /// fields). `DK_LOG` sets the level.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "DK_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with device manifests.
    #[command(subcommand)]
    Manifest(manifest_cmd::ManifestCommand),
    /// Work with device_use rule files.
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCommand),
    /// Print the tool definitions an agent would see for a manifest and a grant.
    Tools(tools_cmd::ToolsArgs),
    /// The whole story in one process, narrated: a vessel, the reference lamp
    /// over a real WebSocket, a demo approver standing in for the person.
    Demo,
    /// Devices run from here: simulated ones, this machine's desktop, and
    /// its microphone and speaker.
    #[command(subcommand)]
    Device(DeviceCommand),
    /// Bridges that bring devices speaking other protocols to a vessel.
    #[command(subcommand)]
    Bridge(bridge_cmd::BridgeCommand),
    /// The audit log of a vessel: tail it, verify its hash chain.
    #[command(subcommand)]
    Audit(audit_cmd::AuditCommand),
    /// Write a consistent copy of a vessel's database, running or not, and
    /// verify the copy's audit chain.
    Backup(backup_cmd::BackupArgs),
    /// Put a backup in place as a stopped vessel's database, once its audit
    /// chain verifies.
    Restore(backup_cmd::RestoreArgs),
    /// Run a vessel: devices connect to it, the person pairs and approves.
    Vessel(Box<vessel_cmd::VesselArgs>),
    /// Pending pairing requests of a running vessel: list, approve, refuse.
    Pairings {
        #[command(flatten)]
        target: admin_cmd::Target,
        #[command(subcommand)]
        command: Option<admin_cmd::PairingsCommand>,
    },
    /// Calls waiting for the person's yes: list, allow (once or remembered
    /// for a while), deny; and remembered allowances: list, revoke.
    Approvals {
        #[command(flatten)]
        target: admin_cmd::Target,
        #[command(subcommand)]
        command: Option<admin_cmd::ApprovalsCommand>,
    },
    /// Paired devices: list, grant, revoke, unpair.
    Devices {
        #[command(flatten)]
        target: admin_cmd::Target,
        #[command(subcommand)]
        command: Option<admin_cmd::DevicesCommand>,
    },
    /// A running vessel at a glance: devices, prompts waiting, connections,
    /// and the fingerprint of its dk/2 key (devices show it after pairing).
    Status {
        #[command(flatten)]
        target: admin_cmd::Target,
    },
    /// A fresh one-time login link to the person's console (the web pages
    /// on the admin listener): open it in a browser; it works once, for 15
    /// minutes.
    Console {
        #[command(flatten)]
        target: admin_cmd::Target,
    },
    /// Agents that may use the vessel's tools over MCP: add (prints the
    /// credential once), list, remove, scope.
    Agents {
        #[command(flatten)]
        target: admin_cmd::Target,
        #[command(subcommand)]
        command: Option<agents_cmd::AgentsCommand>,
    },
    /// Bridge an MCP client that launches a command (stdio) to a running
    /// vessel's MCP server (on its MCP socket, or `--vessel URL`), with an
    /// agent credential from `DK_AGENT_CREDENTIAL` or `--credential-file`.
    Mcp(mcp_cmd::McpArgs),
}

#[derive(Subcommand)]
enum DeviceCommand {
    /// Run the sample lamp, lock or thermostat against a vessel: it shows its
    /// pairing code, keeps its token, reconnects, and prints each call.
    Simulate(simulate_cmd::SimulateArgs),
    /// Run this machine's X11 desktop as a device (kind desktop-control):
    /// screenshots, zoom, the pointer and the keyboard, with windows and
    /// regions blacked out; `key` and `type` ask the person every time.
    Desktop(desktop_cmd::DesktopArgs),
    /// Run this machine's microphone and speaker as a device (kind voice),
    /// through PulseAudio: listen and listen_stream (asking the person
    /// every time, shown live while the microphone is open), say, play and
    /// stop.
    Voice(voice_cmd::VoiceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Manifest(command) => manifest_cmd::run(command),
        Command::Policy(command) => policy_cmd::run(command),
        Command::Tools(args) => tools_cmd::run(&args),
        Command::Demo => demo_cmd::run(),
        Command::Audit(command) => audit_cmd::run(command),
        Command::Backup(args) => backup_cmd::backup(&args),
        Command::Restore(args) => backup_cmd::restore(&args),
        Command::Bridge(command) => bridge_cmd::run(command),
        Command::Device(DeviceCommand::Simulate(args)) => simulate_cmd::run(&args),
        Command::Device(DeviceCommand::Desktop(args)) => desktop_cmd::run(&args),
        Command::Device(DeviceCommand::Voice(args)) => voice_cmd::run(&args),
        Command::Vessel(args) => vessel_cmd::run(&args),
        Command::Pairings { target, command } => admin_cmd::pairings(&target, command),
        Command::Approvals { target, command } => admin_cmd::approvals(&target, command),
        Command::Devices { target, command } => admin_cmd::devices(&target, command),
        Command::Status { target } => admin_cmd::status(&target),
        Command::Console { target } => admin_cmd::console(&target),
        Command::Agents { target, command } => agents_cmd::agents(&target, command),
        Command::Mcp(args) => mcp_cmd::run(&args),
    }
}
