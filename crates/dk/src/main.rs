//! The `dk` command line: check manifests and rule files, explain a rule
//! decision, and show the tools an agent would see.
//!
//! Exit codes: 0 when the thing checked is good, 1 when it is not (or cannot
//! be read), 2 for a command line clap refuses.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod input;
mod manifest_cmd;
mod policy_cmd;
mod tools_cmd;

/// dk: a device kit for AI agents.
#[derive(Parser)]
#[command(name = "dk", version, about = "dk: a device kit for AI agents", long_about = None)]
struct Cli {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Manifest(command) => manifest_cmd::run(command),
        Command::Policy(command) => policy_cmd::run(command),
        Command::Tools(args) => tools_cmd::run(&args),
    }
}
