//! The service manager's notify protocol (systemd's `sd_notify`), spoken by
//! `dk vessel` when it runs as a `Type=notify` service: `READY=1` once the
//! store is open and the listeners serve, `WATCHDOG=1` at half the
//! watchdog's period while the vessel passes its readiness checks, and
//! `STOPPING=1` when it begins to stop.
//!
//! The manager names its socket in `NOTIFY_SOCKET`: a path, or an abstract
//! socket when it starts with `@`. Each message is one datagram of
//! `KEY=VALUE` lines. Without `NOTIFY_SOCKET` nothing is sent and nothing
//! changes. The vessel starts no process of its own, so the variables are
//! left in the environment rather than removed (removing them is not safe
//! while other threads may read the environment).
//!
//! A message that cannot be sent is logged and the vessel goes on: the
//! manager decides what a missing `READY=1` or ping means.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Where and how to tell the service manager about the vessel.
#[derive(Debug)]
pub struct Notifier {
    socket: SocketAddr,
    /// Half the watchdog's period, when the manager watches this process.
    ping_every: Option<Duration>,
}

/// Why `NOTIFY_SOCKET` cannot be used: an abstract name or a path the
/// platform refuses (too long, a NUL byte).
#[derive(Debug)]
pub struct NotifyError {
    /// The variable's value, as text.
    shown: String,
    /// What the platform said.
    error: std::io::Error,
}

impl std::fmt::Display for NotifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NOTIFY_SOCKET `{}` is not a socket address: {}",
            self.shown, self.error
        )
    }
}

impl Notifier {
    /// The notifier the environment describes: `None` when `NOTIFY_SOCKET`
    /// is unset or empty.
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        Notifier::from_vars(
            std::env::var_os("NOTIFY_SOCKET").as_deref(),
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )
    }

    /// The notifier these variables describe, for the process `pid`. The
    /// watchdog is kept only when `WATCHDOG_USEC` is a positive number and
    /// `WATCHDOG_PID` is unset or `pid` (else it watches another process).
    fn from_vars(
        socket: Option<&OsStr>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        pid: u32,
    ) -> Result<Option<Notifier>, NotifyError> {
        let Some(socket) = socket.filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let bytes = socket.as_bytes();
        let address = match bytes.strip_prefix(b"@") {
            Some(name) => abstract_address(name),
            None => SocketAddr::from_pathname(socket),
        };
        let socket = address.map_err(|error| NotifyError {
            shown: socket.to_string_lossy().into_owned(),
            error,
        })?;
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>() == Ok(pid));
        let ping_every = watchdog_usec
            .and_then(|usec| usec.trim().parse::<u64>().ok())
            .filter(|usec| *usec > 0 && ours)
            .map(|usec| Duration::from_micros(usec / 2));
        Ok(Some(Notifier { socket, ping_every }))
    }

    /// How often to ping the watchdog (half its period), if it watches us.
    pub fn ping_every(&self) -> Option<Duration> {
        self.ping_every
    }

    /// `READY=1`, with `status` and our pid as the main one.
    pub fn ready(&self, status: &str) {
        self.send(&format!(
            "READY=1\nSTATUS={}\nMAINPID={}\n",
            one_line(status),
            std::process::id()
        ));
    }

    /// `WATCHDOG=1`: the vessel is alive and passes its checks.
    pub fn ping(&self) {
        self.send("WATCHDOG=1\n");
    }

    /// `STATUS=...` alone: what `systemctl status` shows.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}\n", one_line(status)));
    }

    /// `STOPPING=1`: the vessel has begun to stop.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping\n");
    }

    /// Sends `message` as one datagram; a failure is logged, never fatal.
    fn send(&self, message: &str) {
        let sent = UnixDatagram::unbound()
            .and_then(|socket| socket.send_to_addr(message.as_bytes(), &self.socket));
        if let Err(error) = sent {
            tracing::warn!(%error, "cannot notify the service manager");
        }
    }
}

/// The abstract socket address `name` (Linux only).
#[cfg(target_os = "linux")]
fn abstract_address(name: &[u8]) -> std::io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

/// Abstract socket addresses exist only on Linux.
#[cfg(not(target_os = "linux"))]
fn abstract_address(_: &[u8]) -> std::io::Result<SocketAddr> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract sockets exist only on Linux",
    ))
}

/// `text` on one line, so it cannot add a variable to a message.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(
        socket: Option<&str>,
        usec: Option<&str>,
        pid: Option<&str>,
        expected: Option<Option<Duration>>,
    ) {
        let notifier = Notifier::from_vars(socket.map(OsStr::new), usec, pid, 42).unwrap();
        assert_eq!(notifier.map(|n| n.ping_every), expected);
    }

    #[test]
    fn the_environment_says_where_and_whether_to_ping() {
        let half = Some(Some(Duration::from_secs(15)));
        check(None, Some("30000000"), None, None);
        check(Some(""), Some("30000000"), None, None);
        check(Some("/run/notify"), None, None, Some(None));
        check(Some("/run/notify"), Some("30000000"), None, half);
        check(Some("@notify"), Some("30000000"), Some("42"), half);
        check(
            Some("/run/notify"),
            Some("30000000"),
            Some("41"),
            Some(None),
        );
        check(Some("/run/notify"), Some("0"), None, Some(None));
        check(Some("/run/notify"), Some("soon"), None, Some(None));
        let long = format!("/{}", "x".repeat(200));
        assert!(Notifier::from_vars(Some(OsStr::new(&long)), None, None, 42).is_err());
    }

    #[test]
    fn messages_reach_a_path_and_an_abstract_socket() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("notify");
        let name = format!("@dk-systemd-test-{}", std::process::id());
        let receivers = [
            (UnixDatagram::bind(&path).unwrap(), path.to_str().unwrap()),
            (
                UnixDatagram::bind_addr(&abstract_address(&name.as_bytes()[1..]).unwrap()).unwrap(),
                name.as_str(),
            ),
        ];
        for (receiver, socket) in &receivers {
            let notifier = Notifier::from_vars(Some(OsStr::new(socket)), None, None, 1)
                .unwrap()
                .unwrap();
            notifier.ready("serving\nWATCHDOG=1");
            notifier.stopping();
            let mut buf = [0; 256];
            let n = receiver.recv(&mut buf).unwrap();
            let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert_eq!(
                ready,
                format!(
                    "READY=1\nSTATUS=serving WATCHDOG=1\nMAINPID={}\n",
                    std::process::id()
                )
            );
            let n = receiver.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"STOPPING=1\nSTATUS=stopping\n");
        }
    }
}
