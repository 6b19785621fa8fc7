//! What the benches of the `dk` command share (`mod common;` in each): a
//! child process killed with the bench, the filter and runtime of `main`,
//! and the median.

#![allow(
    dead_code,
    reason = "every bench compiles this module as its own and uses only part of it"
)]

use std::future::Future;
use std::process::Child;
use std::time::Duration;

/// Any error a bench step gives.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A child process, killed and waited for when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `bench` on a two-thread runtime unless the command line names
/// benches and none of them starts with `prefix` (`cargo xtask bench
/// desktop` runs only the desktop's).
pub fn main<F>(prefix: &str, bench: impl FnOnce() -> F) -> Result<(), BoxError>
where
    F: Future<Output = Result<(), BoxError>>,
{
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty() && !filter.iter().any(|f| f.starts_with(prefix)) {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(bench())
}

/// The median of `samples` (zero for none).
pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}
