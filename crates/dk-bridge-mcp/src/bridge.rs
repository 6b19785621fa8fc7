//! The running bridge: the server kept running by [`Upstream`], and one dk
//! device made from its latest tool list, served to the vessel by
//! dk-device's client.
//!
//! Each listing is built into a manifest. While its digest is the one the
//! device runs with, nothing happens. When it differs (a tool added,
//! removed, or any pinned field changed: after
//! `notifications/tools/list_changed`, a restart of the server or of the
//! bridge), the device's connection is closed and opened again with the
//! new manifest. The vessel refuses a paired device whose manifest is not
//! the one the person approved (`manifest changed since pairing`), so the
//! bridge then asks to pair again with the same key: the person is shown
//! every capability added, removed or changed, and until they agree the
//! device is not connected, and none of its tools, changed or not, can be
//! called. A manifest the person already approved (the server changed
//! back) connects at once.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dk_device::{ClientError, ClientOptions, Device, HandlerError, run_client};
use serde_json::json;
use tokio::sync::watch;

use crate::manifest::{BuildError, Built, Identity, LeftOut, build};
use crate::names::RESERVED;
use crate::result::to_result;
use crate::server::{Listing, ServerCommand, Upstream};

/// Tells the person the device's pairing code.
pub type CodeHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Tells the person what a new manifest carries: the capabilities and the
/// tools left out with their reasons.
pub type ManifestHook = Arc<dyn Fn(&Built) + Send + Sync>;

/// How long a call may wait for the server by default.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// What the bridge runs.
#[derive(Clone)]
pub struct BridgeOptions {
    /// The device's id and what the person is shown of the server.
    pub identity: Identity,
    /// How to start the server.
    pub command: ServerCommand,
    /// The vessel's device route.
    pub vessel: String,
    /// The device's key file.
    pub key_file: PathBuf,
    /// How long a call may wait for the server.
    pub call_timeout: Duration,
    /// Shows the pairing code.
    pub on_code: CodeHook,
    /// Shows each new manifest.
    pub on_manifest: ManifestHook,
}

impl std::fmt::Debug for BridgeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeOptions")
            .field("identity", &self.identity)
            .field("command", &self.command)
            .field("vessel", &self.vessel)
            .field("key_file", &self.key_file)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// Why the bridge stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// The device client stopped for a reason the person must act on
    /// (pairing refused, unpaired, the vessel's key changed, ...).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The manifest could not be built.
    #[error(transparent)]
    Manifest(#[from] BuildError),
    /// The device could not be defined.
    #[error("the device could not be defined: {0}")]
    Device(String),
}

/// Runs the bridge until `stop` resolves (see the module).
pub async fn run_bridge(
    options: BridgeOptions,
    stop: impl Future<Output = ()>,
) -> Result<(), BridgeError> {
    let upstream = Upstream::start(options.command.clone());
    let mut listings = upstream.listings();
    tokio::pin!(stop);
    let mut pair_again = false;
    loop {
        let listing = tokio::select! {
            listing = first(&mut listings) => listing,
            () = &mut stop => return Ok(()),
        };
        let built = build(&options.identity, listing.server.as_ref(), &listing.tools)?;
        (options.on_manifest)(&built);
        let digest = built.manifest.digest();
        let device = define(&built, &upstream, options.call_timeout)?;
        let on_code = Arc::clone(&options.on_code);
        let mut client = ClientOptions::new(options.vessel.clone())
            .key_file(options.key_file.clone())
            .on_code(move |code| on_code(code));
        if std::mem::take(&mut pair_again) {
            client = client.pair_again();
        }
        let stopping = AtomicBool::new(false);
        let shutdown = async {
            tokio::select! {
                () = &mut stop => stopping.store(true, Ordering::Relaxed),
                () = changed(&mut listings, &options.identity, &digest) => {}
            }
        };
        match run_client(&device, client, shutdown).await {
            Ok(()) if stopping.load(Ordering::Relaxed) => return Ok(()),
            Ok(()) => {
                tracing::warn!(
                    "the MCP server's tools changed: the device connects again with its new manifest"
                );
            }
            Err(ClientError::ManifestChanged) => {
                tracing::warn!(
                    "the MCP server's tools differ from those the person agreed to: asking to pair again"
                );
                pair_again = true;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// The latest listing, once there is one.
async fn first(listings: &mut watch::Receiver<Option<Arc<Listing>>>) -> Arc<Listing> {
    loop {
        if let Some(listing) = listings.borrow_and_update().clone() {
            return listing;
        }
        if listings.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves once a listing builds to a manifest whose digest is not
/// `digest`.
async fn changed(
    listings: &mut watch::Receiver<Option<Arc<Listing>>>,
    identity: &Identity,
    digest: &str,
) {
    loop {
        if listings.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        let Some(listing) = listings.borrow_and_update().clone() else {
            continue;
        };
        match build(identity, listing.server.as_ref(), &listing.tools) {
            Ok(built) if built.manifest.digest() != digest => return,
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "the MCP server's new tool list is not carried"),
        }
    }
}

/// The device of `built`: each carried tool forwarded to the server,
/// `server_info` answered by the bridge.
fn define(built: &Built, upstream: &Upstream, timeout: Duration) -> Result<Device, BridgeError> {
    let mut builder = Device::define_validated(built.manifest.clone());
    for (name, carried) in &built.tools {
        let (upstream, carried) = (upstream.clone(), carried.clone());
        builder = builder.handler(name, move |input| {
            let (upstream, carried) = (upstream.clone(), carried.clone());
            async move {
                let answer = upstream.call(&carried.tool, input, timeout).await?;
                to_result(answer, carried.output.as_deref())
            }
        });
    }
    let about = json!({
        "command": upstream.command().shown(),
        "server": built.server.as_ref().map(|(name, version)| json!({"name": name, "version": version})),
        "tools": built.tools.iter().map(|(name, c)| json!({"capability": name, "tool": c.tool})).collect::<Vec<_>>(),
        "leftOut": built.left_out,
    });
    let health = upstream.clone();
    builder = builder.handler(RESERVED, move |_input| {
        let mut about = about.clone();
        let health = serde_json::to_value(health.health());
        async move {
            if let Some(about) = about.as_object_mut() {
                about.insert(
                    "health".to_owned(),
                    health.map_err(|e| HandlerError::new(e.to_string()))?,
                );
            }
            Ok(about)
        }
    });
    builder
        .build()
        .map_err(|e| BridgeError::Device(e.to_string()))
}

/// The lines that tell the person what a manifest carries and leaves out.
pub fn describe(built: &Built) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, carried) in &built.tools {
        let kind = built.manifest.capability(name).map_or("?", |c| {
            if c.confirm() {
                "asks every time"
            } else {
                c.kind().as_str()
            }
        });
        lines.push(format!("carried `{}` as {name} ({kind})", carried.tool));
    }
    for LeftOut { tool, why } in &built.left_out {
        lines.push(format!("left out `{tool}`: {why}"));
    }
    lines
}
