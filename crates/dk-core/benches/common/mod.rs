//! Set-up and arithmetic shared by the benches of dk-core and dk-vessel,
//! each of which includes this module (`mod common;`, or with `#[path]`
//! from dk-vessel).

#![allow(
    dead_code,
    reason = "every bench compiles this module as its own and uses only part of it"
)]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dk_core::{
    Limits,
    link::{DeviceLink, InvokeResult, Links},
    registry::{ConsentDecision, DeviceRegistry, Paired},
};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::runtime::Runtime;
use tokio::sync::watch;

pub type BoxError = Box<dyn Error + Send + Sync>;

/// The reference desk lamp's manifest.
pub use dk_testkit::LAMP_JSON as LAMP;

/// Whether `cargo bench` was given a filter (it passes `--bench`, and a
/// filter when given one) that none of `names` contains.
pub fn filtered_out(names: &[&str]) -> bool {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    filter.is_some_and(|filter| !names.iter().any(|name| name.contains(filter.as_str())))
}

/// A multi-threaded runtime with IO and time, of `workers` threads or
/// tokio's default.
pub fn multi_thread(workers: Option<usize>) -> std::io::Result<Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder.enable_all().build()
}

/// Resolves once `true` is sent on the channel (or its sender is gone).
pub async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The default limits with the frame rate raised: a device answering or
/// streaming thousands of frames a second would otherwise be closed.
pub fn unthrottled() -> Limits {
    Limits {
        max_frames_per_second: 1_000_000,
        ..Limits::default()
    }
}

/// The default limits without rate limits or run limits: thousands of
/// calls a second from one agent are far past any rate, so none is charged.
pub fn unbudgeted() -> Limits {
    Limits {
        rate_limits: None,
        run_limits: None,
        ..Limits::default()
    }
}

/// Answers every call at once with a ready-made result.
pub struct InstantLink(pub Box<RawValue>);

impl DeviceLink for InstantLink {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        _: &'a Map<String, Value>,
        _: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        let result = self.0.clone();
        async move { Ok(Some(result)) }.boxed()
    }
}

/// Connects `desk-lamp` over an [`InstantLink`] answering
/// `{"on":true,"brightness":40}`.
pub fn connect_instant_lamp(links: &Links) -> Result<(), serde_json::Error> {
    let result = RawValue::from_string(r#"{"on":true,"brightness":40}"#.to_owned())?;
    links.connect("desk-lamp", Arc::new(InstantLink(result)));
    Ok(())
}

/// Pairs `manifest` with `grants` approved at once.
pub async fn pair(
    registry: &DeviceRegistry,
    manifest: &Value,
    grants: Vec<String>,
) -> Result<Paired, dk_core::registry::PairError> {
    registry
        .pair(
            manifest,
            |_| {},
            move |_| async move { Ok::<_, ()>(ConsentDecision::approve(grants)) },
            Duration::from_secs(1),
        )
        .await
}

/// The desk lamp paired with `set_light` granted (on a current-thread
/// runtime of its own) and connected over an [`InstantLink`].
pub fn pair_instant_lamp(registry: &DeviceRegistry, links: &Links) -> Result<Paired, BoxError> {
    let manifest: Value = serde_json::from_str(LAMP)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let paired = runtime.block_on(pair(registry, &manifest, vec!["set_light".to_owned()]))?;
    connect_instant_lamp(links)?;
    Ok(paired)
}

/// The sample at quantile `q` (0 to 1, the nearest rank), sorting them.
pub fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len().saturating_sub(1)) as f64 * q).round() as usize;
    samples.get(i).copied().unwrap_or_default()
}

/// The upper median, sorting the samples.
pub fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

pub fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Builds `dk` in release mode (a no-op when it is current) and returns its
/// path, next to the calling bench's own directory in the target directory.
pub fn build_dk() -> Result<PathBuf, BoxError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "-p", "dk"])
        .current_dir(&root)
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        return Err(format!("`cargo build --release -p dk` failed ({status})").into());
    }
    // The bench is target/release/deps/<bench>-<hash>.
    let exe = std::env::current_exe()?;
    let release = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("cannot find the target directory")?;
    let dk = release.join("dk");
    if dk.is_file() {
        Ok(dk)
    } else {
        Err(format!("`{}` was not built", dk.display()).into())
    }
}
