//! A `nats-server` of a test's own (Debian's): its config in a temporary
//! directory, a loopback port it picks itself (and keeps when started
//! again), stopped (and the directory removed)
//! when dropped. Without the server a test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set (`cargo xtask peers` installs it).

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The value of `result`, or the test fails saying `what` went wrong.
#[expect(
    clippy::panic,
    reason = "test support: a failure here fails the test that asked"
)]
fn or_fail<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Where Debian's package puts the server (its newer packages in
/// `/usr/bin`, older ones in `/usr/sbin`).
const NATS_SERVERS: [&str; 2] = ["/usr/bin/nats-server", "/usr/sbin/nats-server"];

/// The server's path, or `None` (said on stderr) when it is missing and
/// not required.
pub fn nats_or_skip(test: &str) -> Option<PathBuf> {
    let found = NATS_SERVERS.iter().map(Path::new).find(|p| p.is_file());
    crate::peer_or_skip(test, "nats-server", found.map(Path::to_owned))
}

/// A running `nats-server` and the directory holding its config and the
/// fleet's files.
pub struct Nats {
    binary: PathBuf,
    /// The server's directory: its config, and files a test keeps there.
    pub dir: tempfile::TempDir,
    /// Its loopback port.
    pub port: u16,
    child: Option<Child>,
}

impl Nats {
    /// A server with `extra` added to its config (authorization, TLS).
    ///
    /// # Panics
    ///
    /// When the server does not start.
    pub fn start(binary: PathBuf, extra: &str) -> Nats {
        Nats::start_with(binary, |_| extra.to_owned())
    }

    /// A server with what `extra` writes in its directory (certificates)
    /// and returns added to its config.
    ///
    /// # Panics
    ///
    /// When the server does not start.
    pub fn start_with(binary: PathBuf, extra: impl FnOnce(&Path) -> String) -> Nats {
        let dir = or_fail(tempfile::tempdir(), "the server's directory");
        let extra = extra(dir.path());
        // The server picks its port (`-1`) and says which in its ports
        // file; it is started again on that one.
        let config = |port: &str| format!("listen: 127.0.0.1:{port}\nmax_payload: 1MB\n{extra}\n");
        let config_file = dir.path().join("nats.conf");
        or_fail(fs::write(&config_file, config("-1")), "the server's config");
        let mut nats = Nats {
            binary,
            dir,
            port: 0,
            child: None,
        };
        let child = nats.spawn(true);
        let ports_file = nats
            .dir
            .path()
            .join(format!("nats-server_{}.ports", child.id()));
        nats.child = Some(child);
        let ports = crate::eventually_blocking_some("nats-server's ports file", || {
            fs::read_to_string(&ports_file)
                .ok()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        });
        let url = ports
            .get("nats")
            .and_then(|urls| urls.get(0))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let port = url.rsplit(':').next().and_then(|p| p.parse().ok());
        nats.port = or_fail(
            port.ok_or(url.to_owned()),
            "the port in nats-server's ports file",
        );
        or_fail(
            fs::write(&config_file, config(&nats.port.to_string())),
            "the server's config",
        );
        nats.wait_listening();
        nats
    }

    /// Runs the server on its config, with a ports file when `ports_file`.
    fn spawn(&self, ports_file: bool) -> Child {
        let mut command = Command::new(&self.binary);
        command.arg("-c").arg(self.dir.path().join("nats.conf"));
        if ports_file {
            command.arg("--ports_file_dir").arg(self.dir.path());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        or_fail(child, "nats-server")
    }

    /// Waits until the server takes connections.
    fn wait_listening(&self) {
        crate::eventually_blocking("nats-server listening", || {
            TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        });
    }

    /// The plain server's address.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port, and waits for it.
    ///
    /// # Panics
    ///
    /// When the server does not start.
    pub fn resume(&mut self) {
        self.child = Some(self.spawn(false));
        self.wait_listening();
    }

    /// Kills the server.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Writes a private file (0600) in the server's directory.
    ///
    /// # Panics
    ///
    /// When the file cannot be written.
    pub fn private_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let mut file = or_fail(fs::File::create(&path), "a private file");
        or_fail(file.write_all(text.as_bytes()), "a private file");
        or_fail(
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)),
            "a private file",
        );
        path
    }

    /// The fleet key file every member of a test shares.
    ///
    /// # Panics
    ///
    /// When the file cannot be written.
    pub fn key_file(&self) -> PathBuf {
        let path = self.dir.path().join("fleet.key");
        if !path.exists() {
            self.private_file("fleet.key", &format!("{}\n", "4b".repeat(32)));
        }
        path
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}
