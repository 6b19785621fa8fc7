//! Reloading the rule file, at the edge: dk-core's `reload` (re-exported
//! here) applies a rule file and records it, and opens no file; this module
//! reads it from disk ([`load_rule_file`], [`from_disk`]), watches it for
//! changes (its modification time and length, polled) and for requests, and
//! hands each reload to [`Vessel::reload_rules_from`].

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use dk_core::reload::*;

use crate::Vessel;

/// The rule file reader of a vessel that reads its rules from disk
/// ([`dk_policy::read_rule_file`]: at most its size limit, UTF-8).
pub fn from_disk() -> RuleReader {
    Arc::new(dk_policy::read_rule_file)
}

/// Reads the rule file at `path` from disk and parses it; the vessel
/// reads it from disk again on each reload. Any error refuses the whole
/// file, with every error reported.
pub fn load_rule_file(path: &Path) -> Result<RuleFile, dk_policy::PolicyFileError> {
    RuleFile::read(path, from_disk())
}

/// A rule file's identity for change detection: modification time and
/// length. Take it before loading the file, and pass it to
/// [`watch_policy_file`], so a change between the load and the watch's start
/// is not missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp(Option<(SystemTime, u64)>);

impl FileStamp {
    /// The stamp of `path` now.
    pub fn of(path: &Path) -> FileStamp {
        FileStamp(stamp(path))
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Watches `path` every `every` and whenever `asked` yields, reloading the
/// rules ([`Vessel::reload_rules_from`], recorded in the audit log); calls
/// `report` with each outcome. `loaded` is the file's stamp when the rules
/// in force were loaded. Ends when `stop` resolves.
pub async fn watch_policy_file<A, R>(
    vessel: Arc<Vessel>,
    path: PathBuf,
    loaded: FileStamp,
    every: Duration,
    mut asked: A,
    mut report: R,
    stop: impl Future<Output = ()>,
) where
    A: futures::Stream<Item = ()> + Unpin,
    R: FnMut(&Reloaded),
{
    use futures::StreamExt;

    let mut last = loaded.0;
    let mut asking = true;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        let cause = tokio::select! {
            () = &mut stop => return,
            _ = tick.tick() => {
                let now = stamp(&path);
                if now == last {
                    continue;
                }
                last = now;
                ReloadCause::FileChanged
            }
            request = asked.next(), if asking => {
                if request.is_none() {
                    // Nobody can ask any more: keep watching the file alone.
                    asking = false;
                    continue;
                }
                last = stamp(&path);
                ReloadCause::Asked
            }
        };
        report(&vessel.reload_rules_from(&path, from_disk(), cause));
    }
}

#[cfg(test)]
mod tests;
