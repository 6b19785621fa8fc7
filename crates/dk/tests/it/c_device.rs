//! What the tests of the C examples share (`c_lamp`, `c_thermostat`): the
//! examples built once by `cargo xtask firmware`, a running example with
//! its output read line by line, its stats file, valgrind's command line,
//! and the skips said out loud when libwebsockets or valgrind is missing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use crate::process::{Killed, PATIENCE};

/// How long an example under valgrind may take for one step.
const SLOW_PATIENCE: Duration = Duration::from_secs(60);

/// Valgrind as the tests run an example under it: any memory error or
/// leak is exit 99.
pub(crate) const VALGRIND: &[&str] = &[
    "valgrind",
    "--quiet",
    "--vgdb=no",
    "--error-exitcode=99",
    "--leak-check=full",
    "--errors-for-leak-kinds=definite,indirect",
];

/// What `cargo xtask firmware` printed, run once per run of the tests.
fn firmware() -> &'static str {
    static BUILT: OnceLock<String> = OnceLock::new();
    BUILT.get_or_init(dk_testkit::firmware_build)
}

/// The path of the C example `name` (`lamp`, `thermostat`), built once per
/// run of the tests; `Err` with what the task said when it built none.
pub(crate) fn built(name: &str) -> Result<PathBuf, String> {
    let said = firmware();
    said.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
        .map(PathBuf::from)
        .filter(|path| path.is_file())
        .ok_or_else(|| said.to_owned())
}

/// A running C example: its standard output's lines as they come, its
/// standard error in a file.
pub(crate) struct CDevice {
    name: &'static str,
    child: Killed,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
    patience: Duration,
}

impl CDevice {
    /// Runs the example `name` through `runner` (nothing, or valgrind)
    /// against `url`, its credentials in `credentials`, its stats to
    /// `stats`, its standard error to `stderr`, with `extra` arguments.
    pub(crate) fn start(
        name: &'static str,
        runner: &[&str],
        url: &str,
        credentials: &Path,
        stats: &Path,
        stderr: PathBuf,
        extra: &[&str],
    ) -> CDevice {
        let binary = built(name).unwrap();
        let mut command = match runner.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        let mut child = command
            .arg(url)
            .arg(credentials)
            .arg("--stats")
            .arg(stats)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let (sender, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        CDevice {
            name,
            child: Killed(child),
            lines,
            stderr,
            patience: if runner.is_empty() {
                PATIENCE
            } else {
                SLOW_PATIENCE
            },
        }
    }

    /// The next line on its standard output.
    pub(crate) fn next_line(&self) -> String {
        self.lines.recv_timeout(self.patience).unwrap_or_else(|_| {
            panic!(
                "no line from the {} in time; it said: {}",
                self.name,
                self.complained()
            )
        })
    }

    /// Reads its output until a line starting with `prefix`; the rest.
    pub(crate) fn wait_for(&self, prefix: &str) -> String {
        loop {
            let line = self.next_line();
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }

    /// What it wrote on standard error so far.
    pub(crate) fn complained(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for it to exit on its own: its exit code.
    pub(crate) fn exit_code(mut self) -> (Option<i32>, String) {
        let mut status = None;
        let what = format!("the {} exiting", self.name);
        dk_testkit::eventually_blocking_within(&what, self.patience, || {
            status = self.child.0.try_wait().unwrap();
            status.is_some()
        });
        (status.unwrap().code(), self.complained())
    }

    /// SIGTERM, then its exit code.
    pub(crate) fn terminate(self) -> (Option<i32>, String) {
        let pid = self.child.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        self.exit_code()
    }

    /// What it printed on standard output since the last read.
    pub(crate) fn printed(&self) -> Vec<String> {
        std::iter::from_fn(|| self.lines.try_recv().ok()).collect()
    }
}

/// An example's stats file, as name → number.
pub(crate) fn stats(path: &Path) -> std::collections::BTreeMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Whether the C examples can be built here; the skip is said out loud.
pub(crate) fn libwebsockets_or_skip(test: &str) -> bool {
    let found = Command::new("pkg-config")
        .args(["--exists", "libwebsockets"])
        .status()
        .is_ok_and(|s| s.success());
    dk_testkit::peer_or_skip(test, "libwebsockets-dev", found.then_some(())).is_some()
}

/// Whether valgrind is installed; the skip is said out loud.
pub(crate) fn valgrind_or_skip(test: &str) -> bool {
    let valgrind = Path::new("/usr/bin/valgrind").is_file();
    dk_testkit::peer_or_skip(test, "valgrind", valgrind.then_some(())).is_some()
}
