//! `cargo xtask browser`: makes sure the console's browser tests have their
//! browser, Debian's `chromium` and `chromium-driver`, installing them
//! with apt when they are missing (as root, or through `sudo -n`). `cargo
//! xtask ci` runs it before the tests. Browsers downloaded by other
//! installers are not used: on a closed network they cannot be fetched.

use std::path::Path;
use std::process::Command;

use crate::run::status;
use crate::{TaskError, TaskResult};

/// Debian's packages holding the browser and its WebDriver.
const PACKAGES: [&str; 2] = ["chromium", "chromium-driver"];

/// Where the packages put the two programs.
const PROGRAMS: [&str; 2] = ["/usr/bin/chromium", "/usr/bin/chromedriver"];

/// Installs the browser when it is missing.
pub fn ensure() -> TaskResult {
    if PROGRAMS.iter().all(|p| Path::new(p).is_file()) {
        println!("==> browser: chromium and chromedriver are installed");
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
    status("browser: apt-get update", &mut apt(&["update", "-q"]))?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(PACKAGES);
    status(
        "browser: apt-get install chromium chromium-driver",
        &mut install,
    )?;
    if let Some(missing) = PROGRAMS.iter().find(|p| !Path::new(p).is_file()) {
        return Err(TaskError(format!(
            "`{missing}` is still missing after installing {}",
            PACKAGES.join(" ")
        )));
    }
    Ok(())
}
