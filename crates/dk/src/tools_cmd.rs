//! `dk tools`: the tool definitions an agent would see for a manifest once
//! the person grants the named capabilities.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use dk_core::adapter::DeviceToolAdapter;
use dk_core::link::Links;
use dk_core::registry::{ConsentDecision, DEFAULT_CONSENT_TIMEOUT, DeviceRegistry};
use serde_json::Value;

use crate::input::{printable, read_text};

/// Arguments of `dk tools`.
#[derive(Args)]
pub struct ToolsArgs {
    /// The device manifest.
    #[arg(long)]
    manifest: PathBuf,
    /// Capabilities to grant, comma separated (none when absent).
    #[arg(long, value_delimiter = ',')]
    grant: Vec<String>,
}

/// Pairs the manifest in a throwaway registry with the given grant and
/// prints the tool definitions as a JSON array.
pub fn run(args: &ToolsArgs) -> ExitCode {
    match definitions(args) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            ExitCode::FAILURE
        }
    }
}

fn definitions(args: &ToolsArgs) -> Result<String, String> {
    let text = read_text(&args.manifest)?;
    let manifest: Value =
        serde_json::from_str(&text).map_err(|e| format!("manifest is not valid JSON: {e}"))?;
    let grant: Vec<String> = args
        .grant
        .iter()
        .map(|g| g.trim().to_owned())
        .filter(|g| !g.is_empty())
        .collect();
    let registry = Arc::new(DeviceRegistry::new());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime
        .block_on(registry.pair(
            &manifest,
            |_| {},
            |_| async move { Ok::<_, ()>(ConsentDecision::approve(grant)) },
            DEFAULT_CONSENT_TIMEOUT,
        ))
        .map_err(|e| e.to_string())?;
    let adapter = DeviceToolAdapter::new(registry, Arc::new(Links::new()));
    serde_json::to_string_pretty(&adapter.tool_definitions()).map_err(|e| e.to_string())
}
