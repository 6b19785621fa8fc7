//! `dk manifest check`: validate a manifest with 8DK v1's rules and print its digest.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;

use crate::input::{print_json, printable, read_text};

/// Manifest commands.
#[derive(Subcommand)]
pub enum ManifestCommand {
    /// Check a manifest file (or `-` for standard input); exit 0 when valid.
    Check {
        /// Print `{"valid":..,"digest"|"error":..}` instead of text.
        #[arg(long)]
        json: bool,
        /// The manifest, or `-` for standard input.
        file: PathBuf,
    },
}

/// Runs a manifest command.
pub fn run(command: ManifestCommand) -> ExitCode {
    let ManifestCommand::Check { json, file } = command;
    let result = read_text(&file)
        .and_then(|text| dk_proto::validate_manifest_json(&text).map_err(|e| e.to_string()));
    match (result, json) {
        (Ok(manifest), true) => {
            print_json(&json!({"valid": true, "digest": manifest.digest()}));
            ExitCode::SUCCESS
        }
        (Ok(manifest), false) => {
            println!(
                "valid: {} ({} capabilities)",
                manifest.id(),
                manifest.capabilities().len()
            );
            println!("digest: {}", manifest.digest());
            ExitCode::SUCCESS
        }
        (Err(error), true) => {
            print_json(&json!({"valid": false, "error": error}));
            ExitCode::FAILURE
        }
        (Err(error), false) => {
            println!("invalid: {}", printable(&error));
            ExitCode::FAILURE
        }
    }
}
