//! A real X server for the tests: Debian's `Xvfb` on a free display number
//! (it picks one itself and says which through `-displayfd`), stopped and
//! its socket and lock removed when the guard is dropped.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use x11rb::rust_connection::RustConnection;

/// How long Xvfb may take to start.
const START: Duration = Duration::from_secs(20);

/// A running Xvfb.
pub struct Xvfb {
    child: Option<Child>,
    number: u32,
    size: (u32, u32),
}

/// True when the X11 tests are to be skipped (`DK_SKIP_X11=1`).
pub fn skipped() -> bool {
    std::env::var("DK_SKIP_X11").is_ok_and(|v| v == "1")
}

fn binary() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("Xvfb"))
            .find(|p| p.is_file())
    });
    match found {
        Some(path) => path,
        None => panic!(
            "no Xvfb binary on PATH: the desktop tests need Debian's `xvfb`; run `cargo xtask peers` to install what the tests need (or set DK_SKIP_X11=1 to skip them)"
        ),
    }
}

impl Xvfb {
    /// Starts Xvfb with one screen of `width` x `height` x 24 on a free
    /// display and waits until it takes connections.
    pub fn start(width: u32, height: u32) -> Xvfb {
        let mut child = Command::new(binary())
            .args(["-displayfd", "1", "-screen", "0"])
            .arg(format!("{width}x{height}x24"))
            .args(["-nolisten", "tcp", "-noreset"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Xvfb: {e}"));
        let mut out = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut text = String::new();
        let mut byte = [0u8; 1];
        while !text.ends_with('\n') {
            match out.read(&mut byte) {
                Ok(1) => text.push(char::from(byte[0])),
                _ => panic!("Xvfb exited without naming its display (read {text:?})"),
            }
        }
        let number: u32 = text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("Xvfb named display {text:?}"));
        let xvfb = Xvfb {
            child: Some(child),
            number,
            size: (width, height),
        };
        xvfb.wait_ready();
        xvfb
    }

    /// `:N`.
    pub fn display(&self) -> String {
        format!(":{}", self.number)
    }

    /// A new connection to it.
    pub fn connect(&self) -> RustConnection {
        RustConnection::connect(Some(&self.display()))
            .map(|(c, _)| c)
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.display()))
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + START;
        while RustConnection::connect(Some(&self.display())).is_err() {
            assert!(
                Instant::now() < deadline,
                "Xvfb {} does not take connections",
                self.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (as a crash would) and removes what it left.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(format!("/tmp/.X11-unix/X{}", self.number));
        let _ = std::fs::remove_file(format!("/tmp/.X{}-lock", self.number));
    }

    /// Starts the server again on the same display.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(binary())
            .arg(self.display())
            .args(["-screen", "0"])
            .arg(format!("{}x{}x24", self.size.0, self.size.1))
            .args(["-nolisten", "tcp", "-noreset"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Xvfb again: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        self.kill();
    }
}
