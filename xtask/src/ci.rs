//! `cargo xtask ci`: exactly what CI runs, in order, stopping at the first
//! failing step; the last step compares the public API with its snapshots. The Python client tests run after the Rust tests, in a
//! virtualenv the task makes itself (see `python.rs`), and are counted in
//! the closing `tests:` line. Both run with `TMPDIR` set to a fresh
//! directory that must be empty once they are done: a test that leaves a
//! file or a directory behind fails the run. A Rust test skipped for a
//! missing peer leaves a file in the folder named by `DK_SKIPPED_DIR`
//! (dk-testkit's `peer_or_skip`), and the closing line counts them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run::{Stream, cargo, describe, status, tee};
use crate::{TaskError, TaskResult};

/// Runs the CI steps: format check, clippy, dk-core's tokio features and
/// dk-channel's tests without ring (`features.rs`), with the real peers the
/// build and the tests need installed before them (`peers.rs`: a browser,
/// an MQTT broker, PulseAudio and espeak-ng), tests (with doc tests), the Python client
/// tests, docs, the public API snapshots (`api.rs`).
pub fn run() -> TaskResult {
    status("format", cargo().args(["fmt", "--all", "--", "--check"]))?;
    // First: the voice device links libpulse and libespeak-ng, which
    // clippy's build already needs.
    crate::peers::ensure()?;
    status(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    crate::features::check_core()?;
    crate::features::check_channel_without_ring()?;
    let temp = TestTemp::new("dk-ci")?;
    let skips = TestTemp::new("dk-ci-skipped")?;
    let totals = test(
        cargo()
            .args(["test", "--workspace", "--locked"])
            .env("TMPDIR", temp.path())
            // The peers are installed: a test that misses one fails.
            .env("DK_REQUIRE_PEERS", "1")
            .env(SKIPPED_DIR, skips.path()),
    )?;
    temp.check_empty("the Rust tests")?;
    let skipped = skipped_for_peers(skips.path())?;
    for skip in &skipped {
        println!("skipped for a missing peer: {skip}");
    }
    skips.remove()?;
    let python = crate::python::test(None, Some(temp.path()))?;
    temp.check_empty("the Python tests")?;
    temp.remove()?;
    status(
        "docs",
        cargo()
            .args(["doc", "--workspace", "--no-deps", "--locked"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    crate::api::check(false)?;
    println!("\n==> ci passed (rust: {totals}; python: {python})");
    // The plain closing line any reader of CI logs understands.
    println!(
        "tests: {} passed, {} failed, {} skipped; {}",
        totals.passed + python.passed,
        totals.failed + python.failed,
        totals.ignored + python.skipped,
        skipped_line(skipped.len())
    );
    Ok(())
}

/// The variable dk-testkit's `peer_or_skip` reads: the folder where each
/// skip for a missing peer leaves a file.
const SKIPPED_DIR: &str = "DK_SKIPPED_DIR";

/// What the skips left in `dir`, one line each (`test: peer`), sorted.
fn skipped_for_peers(dir: &Path) -> Result<Vec<String>, TaskError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| TaskError(format!("cannot read `{}`: {e}", dir.display())))?;
    let mut skips = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| TaskError(format!("cannot read `{}`: {e}", dir.display())))?
            .path();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| TaskError(format!("cannot read `{}`: {e}", path.display())))?;
        skips.push(text.trim().to_owned());
        std::fs::remove_file(&path)
            .map_err(|e| TaskError(format!("cannot remove `{}`: {e}", path.display())))?;
    }
    skips.sort();
    Ok(skips)
}

/// The closing line's count of skips for missing peers.
fn skipped_line(count: usize) -> String {
    match count {
        1 => "1 test skipped for a missing peer".to_owned(),
        n => format!("{n} tests skipped for missing peers"),
    }
}

/// The temporary directory the tests run with: made fresh, checked empty.
struct TestTemp(PathBuf);

impl TestTemp {
    /// A fresh, empty directory in the system's temporary directory, named
    /// `prefix` and this process (short, so Unix socket paths the tests
    /// make inside it stay within their limit).
    fn new(prefix: &str) -> Result<TestTemp, TaskError> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .map_err(|e| TaskError(format!("cannot clear `{}`: {e}", path.display())))?;
        }
        std::fs::create_dir_all(&path)
            .map_err(|e| TaskError(format!("cannot make `{}`: {e}", path.display())))?;
        Ok(TestTemp(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// Fails, naming what is there, when `who` left anything behind.
    fn check_empty(&self, who: &str) -> Result<(), TaskError> {
        let mut left: Vec<String> = std::fs::read_dir(&self.0)
            .map_err(|e| TaskError(format!("cannot read `{}`: {e}", self.0.display())))?
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        left.sort();
        Err(TaskError(format!(
            "{who} left {} entries in the temporary directory `{}`: {}",
            left.len(),
            self.0.display(),
            left.join(", ")
        )))
    }

    fn remove(self) -> Result<(), TaskError> {
        std::fs::remove_dir(&self.0)
            .map_err(|e| TaskError(format!("cannot remove `{}`: {e}", self.0.display())))
    }
}

/// A run that stops early (a failed step) still removes the directory when
/// it is empty; one that holds what a test left is kept, to be looked at.
impl Drop for TestTemp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs the tests, adding up the `test result:` lines cargo's test binaries print.
fn test(command: &mut Command) -> Result<TestTotals, TaskError> {
    let mut totals = TestTotals::default();
    let passed = tee("test", command, Stream::Stdout, |line| {
        totals.add_line(line)
    })?;
    println!("\n==> tests: {totals}");
    if passed {
        Ok(totals)
    } else {
        Err(TaskError(format!(
            "test failed: `{}` ({totals})",
            describe(command)
        )))
    }
}

/// The sums of the `test result:` lines of a test run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestTotals {
    /// How many test binaries (and doc-test runs) reported.
    pub suites: u64,
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests that were ignored.
    pub ignored: u64,
    /// Tests left out by a filter.
    pub filtered_out: u64,
}

impl TestTotals {
    /// Adds one line of test output when it is a `test result:` line, such as
    /// `test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s`.
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result:") else {
            return;
        };
        self.suites += 1;
        for part in rest.split(';') {
            let part = part.trim().replace("filtered out", "filtered_out");
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(count)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(count) = count.parse::<u64>() else {
                continue;
            };
            match label {
                "passed" => self.passed += count,
                "failed" => self.failed += count,
                "ignored" => self.ignored += count,
                "filtered_out" => self.filtered_out += count,
                _ => {}
            }
        }
    }
}

impl std::fmt::Display for TestTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed; {} failed; {} ignored; {} filtered out ({} suites)",
            self.passed, self.failed, self.ignored, self.filtered_out, self.suites
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{TestTemp, TestTotals, skipped_for_peers, skipped_line};

    #[track_caller]
    fn check(lines: &[&str], expected: [u64; 5]) {
        let mut totals = TestTotals::default();
        for line in lines {
            totals.add_line(line);
        }
        let got = [
            totals.suites,
            totals.passed,
            totals.failed,
            totals.ignored,
            totals.filtered_out,
        ];
        assert_eq!(got, expected, "{lines:?}");
    }

    #[test]
    fn skips_are_read_and_counted() {
        let dir = TestTemp::new("dk-ci-skips-test").unwrap();
        std::fs::write(dir.path().join("b.1.0"), "b::t: nats-server\n").unwrap();
        std::fs::write(dir.path().join("a.1.1"), "a::t: PostgreSQL\n").unwrap();
        assert_eq!(
            skipped_for_peers(dir.path()).unwrap(),
            ["a::t: PostgreSQL", "b::t: nats-server"]
        );
        dir.check_empty("reading the skips").unwrap();
        dir.remove().unwrap();
        assert_eq!(skipped_line(0), "0 tests skipped for missing peers");
        assert_eq!(skipped_line(1), "1 test skipped for a missing peer");
        assert_eq!(skipped_line(3), "3 tests skipped for missing peers");
    }

    #[test]
    fn test_result_lines() {
        check(&[], [0, 0, 0, 0, 0]);
        check(&["running 3 tests", "test a ... ok"], [0, 0, 0, 0, 0]);
        check(
            &[
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; finished in 0.01s",
            ],
            [1, 12, 0, 1, 2],
        );
        check(
            &[
                "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
                "test result: FAILED. 4 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.20s",
                "   Doc-tests dk_proto",
                "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            ],
            [3, 7, 2, 0, 0],
        );
    }
}
