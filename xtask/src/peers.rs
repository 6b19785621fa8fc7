//! `cargo xtask peers`: makes sure the tests have the real peers they
//! drive, from Debian's packages: `chromium` and `chromium-driver` (the
//! console's browser tests), `mosquitto` (the MQTT bridge's broker), and
//! `libwebsockets-dev`, `pkg-config` and `valgrind` (the C lamp on
//! `libdk_device.a`, run under valgrind by its test), `xvfb` (the X
//! server the desktop device's tests start for themselves), `tk` (the
//! `wish` program whose entry field they type into, as a program that
//! reads the keyboard mapping lazily) and
//! `prometheus` (the server and `promtool` that scrape and check a
//! vessel's `/metrics`), `postgresql` (the `initdb` and `pg_ctl` the
//! PostgreSQL store's tests start a server of their own with) and
//! `nats-server` (the fleet's message bus), and for the voice device
//! `libpulse-dev` and `libespeak-ng-dev` (the libraries it links),
//! `pulseaudio` and `pulseaudio-utils` (the sound server its tests start
//! for themselves, and `pactl`) and `espeak-ng` (its voices' data),
//! installing what is missing with apt (as root, or through `sudo -n`);
//! and the MCP servers the MCP bridge's tests put behind `dk bridge mcp`,
//! each at a fixed version under the target directory (`mcp-peers/`): the
//! official filesystem and everything servers from npm (with npm, beside
//! Debian's Node), `mcp-server-time` and `mcp-server-git` from PyPI in a
//! virtualenv of their own, and the Python tests' virtualenv, whose MCP SDK
//! runs the tests' hostile server.
//! `cargo xtask ci` runs it before the tests. Programs downloaded by other
//! installers are not used: on a closed network they cannot be fetched.

use std::path::Path;
use std::process::Command;

use crate::run::status;
use crate::{TaskError, TaskResult};

/// Debian's packages: the browser, its WebDriver, the MQTT broker, the C
/// lamp's WebSocket library, pkg-config, valgrind, the virtual X server,
/// Tk, Prometheus, PostgreSQL, NATS, PulseAudio and espeak-ng.
const PACKAGES: [&str; 16] = [
    "chromium",
    "chromium-driver",
    "mosquitto",
    "libwebsockets-dev",
    "pkg-config",
    "valgrind",
    "xvfb",
    "tk",
    "prometheus",
    "postgresql",
    "nats-server",
    "libpulse-dev",
    "libespeak-ng-dev",
    "pulseaudio",
    "pulseaudio-utils",
    "espeak-ng",
];

/// Where the packages put the programs the tests run.
const PROGRAMS: [&str; 16] = [
    "/usr/bin/chromium",
    "/usr/bin/chromedriver",
    "/usr/sbin/mosquitto",
    "/usr/include/libwebsockets.h",
    "/usr/bin/pkg-config",
    "/usr/bin/valgrind",
    "/usr/bin/Xvfb",
    "/usr/bin/wish",
    "/usr/bin/prometheus",
    "/usr/bin/promtool",
    "/usr/sbin/nats-server",
    "/usr/include/pulse/simple.h",
    "/usr/include/espeak-ng/speak_lib.h",
    "/usr/bin/pulseaudio",
    "/usr/bin/pactl",
    "/usr/bin/espeak-ng",
];

/// Where Debian puts each PostgreSQL major version's programs
/// (`<version>/bin`), and the ones the tests run from there.
const POSTGRESQL: &str = "/usr/lib/postgresql";
const POSTGRESQL_PROGRAMS: [&str; 3] = ["initdb", "pg_ctl", "createdb"];

/// Whether some PostgreSQL version's `initdb`, `pg_ctl` and `createdb` are
/// installed.
fn postgresql_installed() -> bool {
    let Ok(versions) = std::fs::read_dir(POSTGRESQL) else {
        return false;
    };
    versions.filter_map(Result::ok).any(|version| {
        let bin = version.path().join("bin");
        POSTGRESQL_PROGRAMS
            .iter()
            .all(|program| bin.join(program).is_file())
    })
}

/// The MCP servers from npm, each at its version.
const NPM_SERVERS: [(&str, &str); 2] = [
    ("@modelcontextprotocol/server-everything", "2026.8.31"),
    ("@modelcontextprotocol/server-filesystem", "2026.8.31"),
];

/// The MCP servers from PyPI, each at its version.
const PYPI_SERVERS: [(&str, &str); 2] = [
    ("mcp-server-time", "2026.10.19"),
    ("mcp-server-git", "2026.10.19"),
];

/// Where the MCP servers go, in the target directory.
const MCP_PEERS: &str = "mcp-peers";

/// Installs the peers that are missing.
pub fn ensure() -> TaskResult {
    debian_packages()?;
    mcp_servers()?;
    crate::python::virtualenv().map(|_| ())
}

/// The version of the npm package `name` installed under `dir`, if any.
fn npm_version(dir: &Path, name: &str) -> Option<String> {
    let manifest = dir.join("node_modules").join(name).join("package.json");
    let text = std::fs::read_to_string(manifest).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value.get("version")?.as_str().map(str::to_owned)
}

/// Installs the MCP servers that are missing or at another version.
fn mcp_servers() -> TaskResult {
    let dir = crate::python::target_dir().join(MCP_PEERS);
    std::fs::create_dir_all(&dir)
        .map_err(|e| TaskError(format!("cannot make `{}`: {e}", dir.display())))?;
    if NPM_SERVERS
        .iter()
        .all(|(name, version)| npm_version(&dir, name).as_deref() == Some(version))
    {
        println!("==> peers: the npm MCP servers are installed");
    } else {
        let mut npm = Command::new("npm");
        npm.args([
            "install",
            "--no-audit",
            "--no-fund",
            "--save-exact",
            "--prefix",
        ])
        .arg(&dir)
        .args(
            NPM_SERVERS
                .iter()
                .map(|(name, version)| format!("{name}@{version}")),
        );
        status("peers: npm install", &mut npm)?;
    }
    let venv = dir.join("python");
    let python = venv.join("bin").join("python");
    let installed = |name: &str, version: &str| {
        Command::new(&python)
            .args(["-m", "pip", "show", name])
            .output()
            .is_ok_and(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|line| line.trim() == format!("Version: {version}"))
            })
    };
    if PYPI_SERVERS
        .iter()
        .all(|(name, version)| installed(name, version))
    {
        println!("==> peers: the PyPI MCP servers are installed");
        return Ok(());
    }
    if !python.is_file() {
        status(
            "peers: python venv",
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        )?;
    }
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ])
    .args(
        PYPI_SERVERS
            .iter()
            .map(|(name, version)| format!("{name}=={version}")),
    );
    status("peers: pip install", &mut pip)
}

/// Installs the Debian packages that are missing.
fn debian_packages() -> TaskResult {
    if PROGRAMS.iter().all(|p| Path::new(p).is_file()) && postgresql_installed() {
        println!(
            "==> peers: chromium, chromedriver, mosquitto, libwebsockets, pkg-config, valgrind, Xvfb, wish, prometheus, postgresql, nats-server, libpulse, libespeak-ng, pulseaudio and espeak-ng are installed"
        );
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "apt-get"]);
            sudo
        };
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    status("peers: apt-get update", &mut apt(&["update", "-q"]))?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(PACKAGES);
    status("peers: apt-get install", &mut install)?;
    if let Some(missing) = PROGRAMS.iter().find(|p| !Path::new(p).is_file()) {
        return Err(TaskError(format!(
            "`{missing}` is still missing after installing {}",
            PACKAGES.join(" ")
        )));
    }
    if !postgresql_installed() {
        return Err(TaskError(format!(
            "PostgreSQL's {} are still missing under `{POSTGRESQL}` after installing {}",
            POSTGRESQL_PROGRAMS.join(", "),
            PACKAGES.join(" ")
        )));
    }
    Ok(())
}
