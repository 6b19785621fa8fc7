//! The Python tests: the official `mcp` package, pinned with hashes in
//! `tests/python/requirements.txt`, and maturin, pinned the same way in
//! `tests/python/build-requirements.txt`, in a virtualenv this task keeps
//! under the target directory, against the `dk` binary. The virtualenv is
//! made again whenever a requirements file changes (their SHA-256 is kept
//! beside it) or it is missing or broken.
//!
//! The Python device SDK's tests (`tests/python/test_device_sdk.py`) take
//! its wheel, built here with that maturin from `python/dk_device`, and
//! installed alone in a virtualenv made fresh for each run: the device
//! programs run there, the MCP client in the other.
//!
//! `cargo xtask python [-k FILTER]` runs them alone; `cargo xtask ci` runs
//! them after the Rust tests and counts them in its closing line.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run::{Stream, cargo, describe, repo_root, status, tee};
use crate::{TaskError, TaskResult};

/// The pinned requirements, relative to the repository root: the tests'
/// and what builds the SDK's wheel.
const REQUIREMENTS: [&str; 2] = [
    "tests/python/requirements.txt",
    "tests/python/build-requirements.txt",
];

/// The test programs, relative to the repository root: the MCP client's,
/// then the device SDK's (which is given the SDK's virtualenv).
const TESTS: &str = "tests/python/test_mcp_client.py";
const SDK_TESTS: &str = "tests/python/test_device_sdk.py";

/// The Python device SDK's crate, relative to the repository root.
const SDK: &str = "python/dk_device";

/// The virtualenv's folder in the target directory.
const VENV: &str = "python-venv";

/// Where the SDK's wheel is built, and the fresh virtualenv it is installed
/// in, in the target directory: for the tests, and in release for the bench.
const WHEELS: &str = "python-wheels";
const SDK_VENV: &str = "python-sdk-venv";
const WHEELS_RELEASE: &str = "python-wheels-release";
const SDK_VENV_RELEASE: &str = "python-sdk-venv-release";

/// The file in the virtualenv holding the SHA-256 of the requirements it
/// was made from.
const STAMP: &str = "dk-requirements.sha256";

/// The oldest Python the pinned `mcp` package supports.
const MIN_PYTHON: (u32, u32) = (3, 10);

/// What the Python tests reported.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PythonTotals {
    /// Cases that passed.
    pub passed: u64,
    /// Cases that failed.
    pub failed: u64,
    /// Cases skipped.
    pub skipped: u64,
}

impl PythonTotals {
    /// Reads the closing line, `python tests: 3 passed, 0 failed, 1 skipped`.
    pub fn parse(line: &str) -> Option<PythonTotals> {
        let rest = line.trim().strip_prefix("python tests:")?;
        let mut totals = PythonTotals::default();
        for part in rest.split(',') {
            let mut words = part.split_whitespace();
            let count = words.next()?.parse::<u64>().ok()?;
            match words.next()? {
                "passed" => totals.passed = count,
                "failed" => totals.failed = count,
                "skipped" => totals.skipped = count,
                _ => return None,
            }
        }
        Some(totals)
    }
}

impl std::fmt::Display for PythonTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed; {} failed; {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// `cargo xtask python [-k FILTER]`.
pub fn run(args: &[String]) -> TaskResult {
    let filter = match args {
        [] => None,
        [flag, filter] if flag == "-k" => Some(filter.as_str()),
        _ => {
            return Err(TaskError(
                "`python` takes only `-k FILTER` (cases whose name contains FILTER)".to_owned(),
            ));
        }
    };
    let totals = test(filter, None)?;
    println!("\n==> python tests passed ({totals})");
    Ok(())
}

/// Builds `dk`, makes sure the virtualenv is current, builds the SDK's wheel
/// into a fresh virtualenv, runs the Python tests (with `TMPDIR` set to
/// `temp` when given) and returns their counts; fails when a case failed
/// or a program reported none.
pub fn test(filter: Option<&str>, temp: Option<&Path>) -> Result<PythonTotals, TaskError> {
    status(
        "build dk for the python tests",
        cargo().args(["build", "--package", "dk", "--locked"]),
    )?;
    let python = virtualenv()?;
    let sdk_python = sdk_virtualenv(&python, Profile::Debug)?;
    let dk = target_dir().join("debug").join("dk");
    let mut totals = PythonTotals::default();
    for (program, extra) in [
        (TESTS, Vec::new()),
        (SDK_TESTS, vec!["--device-python".into(), sdk_python]),
    ] {
        let mut command = Command::new(&python);
        command
            .current_dir(repo_root())
            .arg(repo_root().join(program))
            .arg("--dk")
            .arg(&dk)
            .args(extra)
            .env("PYTHONUNBUFFERED", "1");
        if let Some(filter) = filter {
            command.args(["-k", filter]);
        }
        if let Some(temp) = temp {
            command.env("TMPDIR", temp);
        }
        let found = run_tests(&mut command)?;
        totals.passed += found.passed;
        totals.failed += found.failed;
        totals.skipped += found.skipped;
    }
    if totals.failed == 0 {
        Ok(totals)
    } else {
        Err(TaskError(format!("python tests failed ({totals})")))
    }
}

/// Runs one test program and returns its counts; fails when it printed no
/// `python tests:` line or failed.
fn run_tests(command: &mut Command) -> Result<PythonTotals, TaskError> {
    let mut totals = None;
    let passed = tee("python tests", command, Stream::Stdout, |line| {
        if let Some(found) = PythonTotals::parse(line) {
            totals = Some(found);
        }
    })?;
    let Some(totals) = totals else {
        return Err(TaskError(format!(
            "python tests printed no `python tests:` line: `{}`",
            describe(command)
        )));
    };
    if passed && totals.failed == 0 {
        Ok(totals)
    } else {
        Err(TaskError(format!(
            "python tests failed ({totals}): `{}`",
            describe(command)
        )))
    }
}

/// How the SDK's wheel is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Profile {
    /// Cargo's dev profile, sharing the tests' build: for the tests.
    Debug,
    /// Optimised, as `pip install` builds it: for the bench.
    Release,
}

/// Builds the SDK's wheel with the virtualenv's maturin (`python`), then
/// makes a virtualenv afresh and installs the wheel alone in it; returns
/// that virtualenv's interpreter.
pub(crate) fn sdk_virtualenv(python: &Path, profile: Profile) -> Result<PathBuf, TaskError> {
    let (wheels, venv) = match profile {
        Profile::Debug => (WHEELS, SDK_VENV),
        Profile::Release => (WHEELS_RELEASE, SDK_VENV_RELEASE),
    };
    let wheels = target_dir().join(wheels);
    remove(&wheels)?;
    let mut build = Command::new(python);
    build
        .current_dir(repo_root())
        .args(["-m", "maturin", "build", "--locked", "--manifest-path"])
        .arg(repo_root().join(SDK).join("Cargo.toml"))
        .arg("--interpreter")
        .arg(python)
        .arg("--out")
        .arg(&wheels);
    if profile == Profile::Release {
        build.arg("--release");
    }
    status("build the dk_device wheel", &mut build)?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| TaskError(format!("cannot read `{}`: {e}", wheels.display())))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| TaskError(format!("maturin left no wheel in `{}`", wheels.display())))?;
    let venv = target_dir().join(venv);
    remove(&venv)?;
    status(
        "python venv for the device SDK",
        Command::new(base_python()).args(["-m", "venv"]).arg(&venv),
    )?;
    let sdk_python = interpreter(&venv);
    status(
        "pip install the dk_device wheel",
        Command::new(&sdk_python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--no-index",
                "--no-deps",
            ])
            .arg(&wheel),
    )?;
    Ok(sdk_python)
}

/// Removes a folder of the target directory, if it is there.
fn remove(dir: &Path) -> TaskResult {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TaskError(format!("cannot remove `{}`: {e}", dir.display()))),
    }
}

/// A virtualenv's interpreter.
fn interpreter(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    }
}

/// The target directory: `CARGO_TARGET_DIR`, or `target` at the root.
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// The Python that makes the virtualenv: `DK_PYTHON`, else `python3`.
fn base_python() -> PathBuf {
    std::env::var_os("DK_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// The virtualenv's interpreter, made (again) first when the virtualenv is
/// missing, broken or made from other requirements.
pub(crate) fn virtualenv() -> Result<PathBuf, TaskError> {
    let base = base_python();
    check_version(&base)?;
    let requirements: Vec<PathBuf> = REQUIREMENTS.iter().map(|r| repo_root().join(r)).collect();
    let mut digests = Vec::new();
    for file in &requirements {
        digests.push(sha256(&base, file)?);
    }
    let wanted = digests.join(" ");
    let venv = target_dir().join(VENV);
    let python = interpreter(&venv);
    let stamp = venv.join(STAMP);
    let current = std::fs::read_to_string(&stamp).unwrap_or_default();
    if current.trim() == wanted && works(&python) {
        println!(
            "\n==> python virtualenv: `{}` is current (requirements {})",
            venv.display(),
            short(&wanted)
        );
        return Ok(python);
    }
    println!(
        "\n==> python virtualenv: making `{}` for requirements {}",
        venv.display(),
        short(&wanted)
    );
    remove(&venv)?;
    status(
        "python venv",
        Command::new(&base).args(["-m", "venv"]).arg(&venv),
    )?;
    for file in &requirements {
        status(
            "pip install",
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--require-hashes",
                    "--requirement",
                ])
                .arg(file),
        )?;
    }
    std::fs::write(&stamp, format!("{wanted}\n"))
        .map_err(|e| TaskError(format!("cannot write `{}`: {e}", stamp.display())))?;
    Ok(python)
}

/// Whether `python` runs and can import the client and maturin.
fn works(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import mcp, maturin"])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Fails unless `python` is at least [`MIN_PYTHON`].
fn check_version(python: &Path) -> TaskResult {
    let (major, minor) = MIN_PYTHON;
    let out = Command::new(python)
        .args([
            "-c",
            "import sys; print(sys.version_info[0], sys.version_info[1])",
        ])
        .output()
        .map_err(|e| {
            TaskError(format!(
                "the python tests need `{}` (Python {major}.{minor} or newer; set DK_PYTHON \
                 to use another): {e}",
                python.display()
            ))
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace().map(str::parse::<u32>);
    match (words.next(), words.next()) {
        (Some(Ok(have_major)), Some(Ok(have_minor)))
            if (have_major, have_minor) >= (major, minor) =>
        {
            Ok(())
        }
        _ => Err(TaskError(format!(
            "the python tests need Python {major}.{minor} or newer; `{}` is {}",
            python.display(),
            text.trim()
        ))),
    }
}

/// The SHA-256 of a file, in hex, computed by `python`'s hashlib (the task
/// uses only the standard library, and Python is needed here anyway).
fn sha256(python: &Path, file: &Path) -> Result<String, TaskError> {
    let out = Command::new(python)
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        ])
        .arg(file)
        .output()
        .map_err(|e| TaskError(format!("cannot run `{}`: {e}", python.display())))?;
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && digest.len() == 64 {
        Ok(digest)
    } else {
        Err(TaskError(format!(
            "cannot hash `{}`: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The first 12 characters of a digest, for messages.
fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

#[cfg(test)]
mod tests {
    use super::PythonTotals;

    #[track_caller]
    fn check(line: &str, expected: Option<[u64; 3]>) {
        let got = PythonTotals::parse(line).map(|t| [t.passed, t.failed, t.skipped]);
        assert_eq!(got, expected, "{line:?}");
    }

    #[test]
    fn closing_lines() {
        check(
            "python tests: 12 passed, 0 failed, 1 skipped",
            Some([12, 0, 1]),
        );
        check(
            "  python tests: 3 passed, 2 failed, 0 skipped\n",
            Some([3, 2, 0]),
        );
        check("python tests: 3 passed", Some([3, 0, 0]));
        check("tests: 3 passed, 0 failed, 0 skipped", None);
        check("python tests: many passed", None);
        check("PASS lists_tools", None);
    }
}
