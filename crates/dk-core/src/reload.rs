//! Reloading the `device_use` rule file while the vessel runs: on a change
//! of the file, or when asked (SIGHUP in `dk vessel`). A new file that does
//! not load is refused whole; the rules in force stay, and the refusal is
//! reported loudly (and recorded in the audit log once the vessel has one).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dk_policy::{PolicyFileError, PolicySet};

use crate::vessel::Vessel;

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The new rules are in force.
    Applied {
        /// How many rules the new file holds.
        rules: usize,
    },
    /// The new file was refused; the previous rules stay in force.
    Refused {
        /// Every error in the new file, one per line.
        errors: String,
    },
}

impl Vessel {
    /// Loads `path` and, if it is good, puts its rules in force for the calls
    /// that reach check 3 from now on. A broken file changes nothing.
    pub(crate) fn reload_policies(&self, path: &Path) -> Reloaded {
        match PolicySet::load(path) {
            Ok(set) => {
                let rules = set.rules().len();
                self.adapter().set_policies(Arc::new(set));
                Reloaded::Applied { rules }
            }
            Err(e) => Reloaded::Refused {
                errors: refusal_text(&e),
            },
        }
    }
}

/// Every error of a refused file, one per line.
fn refusal_text(error: &PolicyFileError) -> String {
    error.to_string()
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
/// rules; calls `report` with each outcome. `loaded` is the file's stamp when
/// the rules in force were loaded. Ends when `stop` resolves.
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
        tokio::select! {
            () = &mut stop => return,
            _ = tick.tick() => {
                let now = stamp(&path);
                if now == last {
                    continue;
                }
                last = now;
            }
            request = asked.next(), if asking => {
                if request.is_none() {
                    // Nobody can ask any more: keep watching the file alone.
                    asking = false;
                    continue;
                }
                last = stamp(&path);
            }
        }
        report(&vessel.reload_policies(&path));
    }
}

#[cfg(test)]
mod tests;
