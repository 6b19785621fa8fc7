//! An `Xvfb` server for one test: Debian's virtual framebuffer, started
//! on a free display, stopped and cleaned up when dropped.

use std::io::{BufRead, BufReader};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::pixels::fail;
use crate::PATIENCE;

/// Where Debian's `xvfb` package puts the server.
const PROGRAM: &str = "/usr/bin/Xvfb";

/// The folder of the X servers' Unix sockets, the same on every system.
const SOCKETS: &str = "/tmp/.X11-unix";

/// Held while a display number changes hands in this process: a server
/// starting (its number picked by `-displayfd`, the lowest free one), and
/// a stopped one's number going from the server to its [`Hold`] and back.
/// Without it, a test's new server could take the number another test's
/// server was stopped and restarted on, in the moment it was free.
static NUMBERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`NUMBERS`], even from a test that panicked holding it.
fn numbers() -> std::sync::MutexGuard<'static, ()> {
    NUMBERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long a stopped server has to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running `Xvfb :N -screen 0 WxHx24 -nolisten tcp`, its display
/// number picked by the server itself (`-displayfd`) among the free ones.
///
/// Dropped, it is stopped (SIGTERM, then SIGKILL after a grace) and its
/// socket and lock file are removed if it left them. [`Xvfb::stop`] stops
/// it while keeping its display number from every other server until
/// [`Xvfb::restart`] starts it again on the same one: an X server that
/// goes away and comes back.
#[derive(Debug)]
pub struct Xvfb {
    child: Option<Child>,
    number: u32,
    width: u16,
    height: u16,
    /// While stopped: what keeps the display number.
    held: Option<Hold>,
}

impl Xvfb {
    /// Starts a server with one screen of `width` x `height` pixels at 24
    /// bits on a free display, and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When Debian's `xvfb` is not installed (the message says to run
    /// `cargo xtask peers`), or the server does not start in time.
    #[must_use]
    pub fn start(width: u16, height: u16) -> Xvfb {
        let (child, number) = {
            let _numbers = numbers();
            spawn(None, width, height)
        };
        Xvfb {
            child: Some(child),
            number,
            width,
            height,
            held: None,
        }
    }

    /// The display's name, such as `:3`, for `DISPLAY` or `--display`.
    #[must_use]
    pub fn display(&self) -> String {
        format!(":{}", self.number)
    }

    /// The display's number.
    #[must_use]
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The screen's width and height in pixels.
    #[must_use]
    pub fn size(&self) -> (u16, u16) {
        (self.width, self.height)
    }

    /// The server's process id, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server is running (neither stopped nor exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Stops the server as a crash would (SIGKILL: it cleans nothing up),
    /// removes what it left, and keeps its display number from other
    /// servers: a client connecting meanwhile is hung up on at once, as
    /// by a server that is not there.
    pub fn stop(&mut self) {
        let _numbers = numbers();
        if let Some(child) = self.child.take() {
            kill(child, self.number, Signal::Kill);
        }
        if self.held.is_none() {
            self.held = Some(Hold::take(self.number));
        }
    }

    /// Starts the server again on the same display, with the same screen,
    /// after [`Xvfb::stop`]; a running server is left as it is.
    ///
    /// # Panics
    ///
    /// When the server does not start in time.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            return;
        }
        let _numbers = numbers();
        drop(self.held.take());
        let (child, _) = spawn(Some(self.number), self.width, self.height);
        self.child = Some(child);
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill(child, self.number, Signal::Term);
        }
        drop(self.held.take());
    }
}

/// Starts `Xvfb` (on `number`, or on one it picks) and reads the display
/// number it writes once it accepts connections.
fn spawn(number: Option<u32>, width: u16, height: u16) -> (Child, u32) {
    if !Path::new(PROGRAM).is_file() {
        fail(&format!(
            "{PROGRAM} is missing: the desktop tests need Debian's xvfb; run cargo xtask peers"
        ));
    }
    let mut command = Command::new(PROGRAM);
    if let Some(number) = number {
        command.arg(format!(":{number}"));
    }
    command
        .args(["-displayfd", "1", "-screen", "0"])
        .arg(format!("{width}x{height}x24"))
        .args(["-nolisten", "tcp", "-noreset"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => fail(&format!(
            "cannot start {PROGRAM}: {e}; run cargo xtask peers"
        )),
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        fail("Xvfb's output was not piped");
    };
    let (sender, receiver) = std::sync::mpsc::channel();
    // The server writes its display number on standard output once it
    // accepts connections; its standard error is kept for a failure.
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(read.map(|_| line));
    });
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if text.len() < 4096 {
                text.push_str(&line);
                text.push('\n');
            }
        }
        text
    });
    let said = match receiver.recv_timeout(PATIENCE) {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => {
            let _ = child.kill();
            let _ = child.wait();
            fail(&format!("cannot read Xvfb's display number: {e}"))
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            fail(&format!("Xvfb did not start within {PATIENCE:?}"))
        }
    };
    let Ok(picked) = said.trim().parse::<u32>() else {
        let _ = child.kill();
        let _ = child.wait();
        let errors = errors.join().unwrap_or_default();
        fail(&format!(
            "Xvfb did not start (it said {said:?}): {}",
            errors.trim()
        ))
    };
    (child, picked)
}

/// How a server is stopped.
#[derive(Debug, Clone, Copy)]
enum Signal {
    /// Asked to stop: it removes its socket and lock itself.
    Term,
    /// Killed at once, as a crash.
    Kill,
}

/// Stops `child`, waits for it, and removes the socket and the lock file
/// of display `number` if it left them.
fn kill(mut child: Child, number: u32, signal: Signal) {
    let pid = child.id();
    match signal {
        Signal::Term => {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::TERM,
            );
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
        }
        Signal::Kill => {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
    // The lock file names the server's process: another server's is left.
    let lock = PathBuf::from(format!("/tmp/.X{number}-lock"));
    if std::fs::read_to_string(&lock).is_ok_and(|text| text.trim() == pid.to_string()) {
        let _ = std::fs::remove_file(&lock);
    }
    // A socket nobody answers on is the dead server's.
    let socket = Path::new(SOCKETS).join(format!("X{number}"));
    if socket.exists() && UnixStream::connect(&socket).is_err() {
        let _ = std::fs::remove_file(&socket);
    }
}

/// A display number kept from other servers while its own is down: the
/// abstract socket an X server on Linux listens on, held by a thread that
/// hangs up on every client at once.
#[derive(Debug)]
struct Hold {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Hold {
    /// Holds display `number`'s abstract socket, when it can (if another
    /// process has it, there is nothing to keep).
    fn take(number: u32) -> Hold {
        let stop = Arc::new(AtomicBool::new(false));
        let name = format!("{SOCKETS}/X{number}");
        let listener = SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|address| UnixListener::bind_addr(&address));
        let thread = listener.ok().and_then(|listener| {
            listener.set_nonblocking(true).ok()?;
            let stop = Arc::clone(&stop);
            Some(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        // Hung up on at once: no server is there.
                        Ok((stream, _)) => drop(stream),
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            }))
        });
        Hold { stop, thread }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
