//! Running commands: announce them, pass their output through, and turn a
//! failure into a one-line message.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{TaskError, TaskResult};

/// The repository root: the parent of the `xtask` package directory.
pub fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// A `cargo` command: the cargo that runs this task when known, else `cargo`
/// from `PATH`. The working directory is the repository root.
pub fn cargo() -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(program);
    command.current_dir(repo_root());
    command
}

/// How a command looks on a terminal, for announcing it and for errors.
pub fn describe(command: &Command) -> String {
    let mut text = String::new();
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            text.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    let program = Path::new(command.get_program());
    let name = program.file_name().unwrap_or(program.as_os_str());
    text.push_str(&name.to_string_lossy());
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Prints a step heading.
pub fn announce(step: &str, command: &Command) {
    println!("\n==> {step}: {}", describe(command));
    let _ = std::io::stdout().flush();
}

/// Runs a command with its output going straight to the terminal.
pub fn status(step: &str, command: &mut Command) -> TaskResult {
    announce(step, command);
    let status = command.status().map_err(|error| {
        TaskError(format!(
            "{step}: cannot start `{}`: {error}",
            describe(command)
        ))
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(TaskError(format!(
            "{step} failed ({status}): `{}`",
            describe(command)
        )))
    }
}

/// Which of a command's streams [`tee`] reads line by line.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Runs a command, passing one stream through to the terminal line by line and
/// handing each line to `on_line`. The other stream goes straight through.
/// Returns whether the command succeeded.
pub fn tee(
    step: &str,
    command: &mut Command,
    stream: Stream,
    mut on_line: impl FnMut(&str),
) -> Result<bool, TaskError> {
    announce(step, command);
    match stream {
        Stream::Stdout => command.stdout(Stdio::piped()),
        Stream::Stderr => command.stderr(Stdio::piped()),
    };
    let mut child = command.spawn().map_err(|error| {
        TaskError(format!(
            "{step}: cannot start `{}`: {error}",
            describe(command)
        ))
    })?;
    let reader: Option<Box<dyn std::io::Read>> = match stream {
        Stream::Stdout => child
            .stdout
            .take()
            .map(|out| Box::new(out) as Box<dyn std::io::Read>),
        Stream::Stderr => child
            .stderr
            .take()
            .map(|err| Box::new(err) as Box<dyn std::io::Read>),
    };
    if let Some(reader) = reader {
        for line in BufReader::new(reader).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            match stream {
                Stream::Stdout => println!("{line}"),
                Stream::Stderr => eprintln!("{line}"),
            }
            on_line(line);
        }
    }
    let status = child.wait().map_err(|error| {
        TaskError(format!(
            "{step}: waiting for `{}`: {error}",
            describe(command)
        ))
    })?;
    Ok(status.success())
}
