//! `cargo xtask fuzz [SECONDS]`: seeds each fuzz target's corpus from
//! `fixtures/` and runs it for a few seconds with cargo-fuzz on nightly.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run::{Stream, describe, repo_root, tee};
use crate::{TaskError, TaskResult};

/// Seconds each target runs when none are given.
const DEFAULT_SECONDS: u64 = 10;

/// Where a target's seeds come from.
#[derive(Debug, Clone, Copy)]
enum Seeds {
    /// Every file under a `fixtures/` folder whose name ends with the extension.
    Files(&'static str, &'static str),
    /// One seed per case line of the tables under `fixtures/conditions`: the
    /// text before the first tab, skipping `#` comments.
    ConditionLines,
}

/// The seeds of a target, by its name in `fuzz/Cargo.toml`.
fn seeds_of(target: &str) -> Option<Seeds> {
    match target {
        "frame" => Some(Seeds::Files("frames", ".json")),
        "manifest" | "input" => Some(Seeds::Files("manifests", ".json")),
        "policy_file" => Some(Seeds::Files("policies", ".yaml")),
        "condition" => Some(Seeds::ConditionLines),
        "admission" => Some(Seeds::Files("admission", ".json")),
        // Scripts that pair over dk/2 and v1, call, stream and close.
        "device_core" => Some(Seeds::Files("device-core", ".bin")),
        _ => None,
    }
}

/// The outcome of fuzzing one target.
#[derive(Debug)]
struct Outcome {
    /// The target's name.
    target: String,
    /// How many seeds its corpus was given.
    seeds: usize,
    /// libFuzzer's closing line, such as `Done 123456 runs in 21 second(s)`.
    done: Option<String>,
    /// Whether the run ended without a crash.
    passed: bool,
}

/// Fuzzes every target, then fails if any of them crashed.
pub fn run(args: &[String]) -> TaskResult {
    let seconds = match args {
        [] => DEFAULT_SECONDS,
        [seconds] => seconds
            .parse::<u64>()
            .map_err(|_| TaskError(format!("SECONDS must be a whole number, got `{seconds}`")))?,
        [_, extra, ..] => return Err(TaskError(format!("unexpected argument `{extra}`"))),
    };
    check_cargo_fuzz()?;

    let root = repo_root();
    let fuzz_dir = root.join("fuzz");
    let targets = targets(&fuzz_dir.join("Cargo.toml"))?;
    let mut outcomes = Vec::new();
    for target in &targets {
        let corpus = fuzz_dir.join("corpus").join(target);
        let seeds = seed_corpus(&root.join("fixtures"), target, &corpus)?;
        println!("\nfuzz {target}: {seeds} seeds in `{}`", corpus.display());
        let mut done = None;
        let mut command = nightly_cargo();
        command
            .current_dir(&fuzz_dir)
            .args(["fuzz", "run", target])
            .arg(&corpus)
            .args(["--".to_owned(), format!("-max_total_time={seconds}")]);
        let passed = tee(
            &format!("fuzz {target}"),
            &mut command,
            Stream::Stderr,
            |line| {
                if line.starts_with("Done ") && line.contains(" runs in ") {
                    done = Some(line.to_owned());
                }
            },
        )?;
        outcomes.push(Outcome {
            target: target.clone(),
            seeds,
            done,
            passed,
        });
    }

    println!("\n==> fuzz summary ({seconds} s each)");
    for outcome in &outcomes {
        let result = if outcome.passed {
            "ok"
        } else {
            "CRASH (see fuzz/artifacts)"
        };
        let done = outcome.done.as_deref().unwrap_or("no run count");
        println!(
            "{:<12} {:>4} seeds  {done}  {result}",
            outcome.target, outcome.seeds
        );
    }
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| o.target.as_str())
        .collect();
    if crashed.is_empty() {
        Ok(())
    } else {
        Err(TaskError(format!(
            "fuzz targets failed: {}",
            crashed.join(", ")
        )))
    }
}

/// `cargo +nightly`, without the variables that name the cargo or toolchain
/// running this task, so that cargo-fuzz builds with nightly throughout.
fn nightly_cargo() -> Command {
    let mut command = Command::new("cargo");
    command
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .arg("+nightly");
    command
}

/// Fails with install instructions unless `cargo +nightly fuzz` works.
fn check_cargo_fuzz() -> TaskResult {
    let mut command = nightly_cargo();
    command.args(["fuzz", "--version"]);
    let works = command
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    if works {
        Ok(())
    } else {
        Err(TaskError(format!(
            "`{}` does not work; fuzzing needs a nightly toolchain and cargo-fuzz:\n  \
             rustup toolchain install nightly\n  cargo install cargo-fuzz",
            describe(&command)
        )))
    }
}

/// The `[[bin]]` names in the fuzz crate's manifest.
fn targets(manifest: &Path) -> Result<Vec<String>, TaskError> {
    let text = read(manifest)?;
    let mut section = "";
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[[bin]]"
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "name"
        {
            names.push(value.trim().trim_matches('"').to_owned());
        }
    }
    if names.is_empty() {
        return Err(TaskError(format!(
            "no [[bin]] targets in `{}`",
            manifest.display()
        )));
    }
    Ok(names)
}

/// Copies a target's seeds into its corpus folder; returns how many there are.
fn seed_corpus(fixtures: &Path, target: &str, corpus: &Path) -> Result<usize, TaskError> {
    std::fs::create_dir_all(corpus)
        .map_err(|error| TaskError(format!("cannot create `{}`: {error}", corpus.display())))?;
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    match seeds_of(target) {
        None => println!("fuzz {target}: no seeds known for this target; starting empty"),
        Some(Seeds::Files(folder, extension)) => {
            let base = fixtures.join(folder);
            for file in files_under(&base)? {
                if file.to_string_lossy().ends_with(extension) {
                    let bytes = std::fs::read(&file).map_err(|error| {
                        TaskError(format!("cannot read `{}`: {error}", file.display()))
                    })?;
                    seeds.push((seed_name(&base, &file), bytes));
                }
            }
        }
        Some(Seeds::ConditionLines) => {
            let base = fixtures.join("conditions");
            for file in files_under(&base)? {
                let text = read(&file)?;
                let name = seed_name(&base, &file);
                for (number, line) in text.lines().enumerate() {
                    if line.starts_with('#') {
                        continue;
                    }
                    let condition = line.split('\t').next().unwrap_or(line);
                    seeds.push((
                        format!("{name}-{}", number + 1),
                        condition.as_bytes().to_vec(),
                    ));
                }
            }
        }
    }
    for (name, bytes) in &seeds {
        let path = corpus.join(name);
        std::fs::write(&path, bytes)
            .map_err(|error| TaskError(format!("cannot write `{}`: {error}", path.display())))?;
    }
    Ok(seeds.len())
}

/// A seed's file name: its path under the fixtures folder with `/` as `_`.
fn seed_name(base: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(base).unwrap_or(file);
    format!(
        "seed-{}",
        relative.to_string_lossy().replace(['/', '\\'], "_")
    )
}

/// Every file under a folder, recursively, in a stable order. A missing folder has none.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>, TaskError> {
    let mut files = Vec::new();
    if !dir.is_dir() {
        return Ok(files);
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|error| TaskError(format!("cannot list `{}`: {error}", dir.display())))?;
    for entry in entries {
        let path = entry
            .map_err(|error| TaskError(format!("cannot list `{}`: {error}", dir.display())))?
            .path();
        if path.is_dir() {
            files.extend(files_under(&path)?);
        } else {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads a text file.
fn read(path: &Path) -> Result<String, TaskError> {
    std::fs::read_to_string(path)
        .map_err(|error| TaskError(format!("cannot read `{}`: {error}", path.display())))
}
