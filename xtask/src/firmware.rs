//! `cargo xtask firmware`: builds dk-device-c as the static library
//! `libdk_device.a` with the `firmware` profile (opt-level z, panic=abort,
//! LTO, no std anywhere under it), then, when libwebsockets' development
//! files are installed, the C examples linked with it: the lamp of
//! `examples/c/lamp.c` (with a linker map, for the code size budget) and
//! the thermostat of `examples/c/thermostat.c`, each with the runner they
//! share, `examples/c/dk_lws.c`. Prints the paths of the library, the
//! header, the lamp, its map and the thermostat, one `name: path` a line.
//!
//! The build takes the cryptography's portable backends
//! ([`PORTABLE_BACKENDS`]): a microcontroller has no AVX2, SSE2 or SHA
//! extensions, and the x86_64 build measured for the firmware's code size
//! carries what a device would carry, not three backends chosen at run
//! time.
//!
//! An example is rebuilt only when the library, the header, the runner or
//! its own source is newer than it, so tests can run the task every time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use crate::run::{cargo, repo_root};
use crate::{TaskError, TaskResult};

/// The rustflags of the firmware build: X25519 on curve25519-dalek's
/// serial backend, ChaCha20, Poly1305 and SHA-256 on their portable code.
pub const PORTABLE_BACKENDS: &str = r#"build.rustflags=["--cfg","curve25519_dalek_backend=\"serial\"","--cfg","chacha20_backend=\"soft\"","--cfg","poly1305_backend=\"soft\"","--cfg","sha2_backend=\"soft\""]"#;

/// What the task built.
#[derive(Debug, Clone)]
pub struct Built {
    /// `libdk_device.a`.
    pub library: PathBuf,
    /// `dk_device.h`.
    pub header: PathBuf,
    /// The C lamp, when libwebsockets is installed.
    pub lamp: Option<PathBuf>,
    /// The lamp's linker map.
    pub map: Option<PathBuf>,
    /// The C thermostat, when libwebsockets is installed.
    pub thermostat: Option<PathBuf>,
}

/// `cargo xtask firmware`.
pub fn run() -> TaskResult {
    let built = build()?;
    println!("library: {}", built.library.display());
    println!("header: {}", built.header.display());
    match (&built.lamp, &built.map, &built.thermostat) {
        (Some(lamp), Some(map), Some(thermostat)) => {
            println!("lamp: {}", lamp.display());
            println!("map: {}", map.display());
            println!("thermostat: {}", thermostat.display());
        }
        _ => println!(
            "lamp, thermostat: not built (libwebsockets-dev is not installed: cargo xtask peers)"
        ),
    }
    Ok(())
}

/// The workspace's target directory.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Builds the library, and the C examples when libwebsockets is installed.
pub fn build() -> Result<Built, TaskError> {
    let root = repo_root();
    let mut command = cargo();
    command.args([
        "--config",
        PORTABLE_BACKENDS,
        "rustc",
        "--quiet",
        "-p",
        "dk-device-c",
        "--profile",
        "firmware",
        "--crate-type",
        "staticlib",
    ]);
    run_quietly("firmware: cargo rustc", &mut command)?;
    let target = target_dir();
    let out = target.join("firmware").join("c");
    std::fs::create_dir_all(&out)
        .map_err(|e| TaskError(format!("cannot create {}: {e}", out.display())))?;
    let built = target.join("firmware").join("libdk_device_c.a");
    let library = out.join("libdk_device.a");
    if modified(&library) < modified(&built) || !library.exists() {
        std::fs::copy(&built, &library).map_err(|e| {
            TaskError(format!(
                "cannot copy {} to {}: {e}",
                built.display(),
                library.display()
            ))
        })?;
    }
    let include = root.join("crates").join("dk-device-c").join("include");
    let header = include.join("dk_device.h");
    let lws = Command::new("pkg-config")
        .args(["--libs", "libwebsockets"])
        .output();
    let libs = match lws {
        Ok(found) if found.status.success() => String::from_utf8_lossy(&found.stdout).into_owned(),
        _ => {
            return Ok(Built {
                library,
                header,
                lamp: None,
                map: None,
                thermostat: None,
            });
        }
    };
    let examples = root.join("examples").join("c");
    let linked = Linked {
        library: &library,
        header: &header,
        include: &include,
        examples: &examples,
        libs: &libs,
    };
    let lamp = out.join("lamp");
    let map = out.join("lamp.map");
    linked.example("lamp", &lamp, Some(&map))?;
    let thermostat = out.join("thermostat");
    linked.example("thermostat", &thermostat, None)?;
    Ok(Built {
        library,
        header,
        lamp: Some(lamp),
        map: Some(map),
        thermostat: Some(thermostat),
    })
}

/// What every C example is built with.
struct Linked<'a> {
    library: &'a Path,
    header: &'a Path,
    include: &'a Path,
    /// `examples/c`, the examples' sources and the runner they share.
    examples: &'a Path,
    /// libwebsockets' linker flags.
    libs: &'a str,
}

impl Linked<'_> {
    /// Builds `examples/c/NAME.c` with the runner into `binary` (and its
    /// linker map into `map`), unless it is newer than all it is made of.
    fn example(&self, name: &str, binary: &Path, map: Option<&Path>) -> TaskResult {
        let source = self.examples.join(format!("{name}.c"));
        let runner = self.examples.join("dk_lws.c");
        let runner_header = self.examples.join("dk_lws.h");
        let newest_input = [self.library, self.header, &source, &runner, &runner_header]
            .iter()
            .map(|p| modified(p))
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH);
        if binary.exists() && modified(binary) >= newest_input {
            return Ok(());
        }
        let mut gcc = Command::new("gcc");
        gcc.args(["-std=gnu11", "-Os", "-Wall", "-Wextra", "-Werror", "-g"])
            .arg("-I")
            .arg(self.include)
            .arg(&source)
            .arg(&runner)
            .arg(self.library)
            .args(self.libs.split_whitespace());
        if let Some(map) = map {
            gcc.arg(format!("-Wl,-Map={}", map.display()));
        }
        gcc.arg("-Wl,--gc-sections").arg("-o").arg(binary);
        run_quietly(&format!("firmware: gcc {name}.c"), &mut gcc)
    }
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Runs `command`, its output shown only when it fails.
fn run_quietly(step: &str, command: &mut Command) -> TaskResult {
    let output = command
        .output()
        .map_err(|e| TaskError(format!("{step}: cannot start: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(TaskError(format!(
        "{step} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}
