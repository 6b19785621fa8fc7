//! A PostgreSQL server for tests: Debian's `initdb` and `pg_ctl` (from
//! `/usr/lib/postgresql/<version>/bin`) on a temporary directory of its
//! own, listening on 127.0.0.1 at a free port and on a socket inside that
//! directory, with a fresh database for each test that asks
//! ([`PgServer::database`]).
//!
//! `initdb` refuses to run as root: when the tests run as root, the
//! server's programs run as the `postgres` system user Debian's package
//! made, and the directory is handed to it.
//!
//! A server a test starts ([`PgServer::start`]) is stopped
//! (`pg_ctl stop -m immediate`) and its directory removed when dropped. A
//! test binary's tests share one ([`PgServer::shared`]), which a watcher
//! process stops and removes once the binary has exited, however it
//! ended.

use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where Debian's packages put each major version's programs.
const VERSIONS: &str = "/usr/lib/postgresql";

/// The superuser every server is made with; it connects without a password.
pub const USER: &str = "dk";

/// Fails the test with `message`.
#[expect(
    clippy::panic,
    reason = "test support: a failure here fails the test that asked"
)]
fn fail(message: &str) -> ! {
    panic!("{message}")
}

/// The folder of the newest installed PostgreSQL's programs, when
/// `initdb`, `pg_ctl` and `createdb` are all there.
pub fn programs() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(VERSIONS)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            ["initdb", "pg_ctl", "createdb"]
                .iter()
                .all(|program| bin.join(program).is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// The programs, or `None` after printing that `test` is skipped; a test
/// fails instead when peers are required.
pub fn programs_or_skip(test: &str) -> Option<PathBuf> {
    crate::peer_or_skip(test, "postgresql", programs())
}

/// A running PostgreSQL of one test, or of one test binary's tests.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Whether the server's programs run as `postgres` (the tests run as
    /// root).
    as_postgres: bool,
    /// Numbers the databases handed out.
    databases: AtomicU32,
    /// Stops the server and removes the directory once this process is
    /// gone.
    watcher: Option<Child>,
}

impl PgServer {
    /// The server this test binary's tests share, started by the first
    /// that asks; `None` (and a line saying `test` is skipped) when
    /// PostgreSQL is not installed.
    ///
    /// # Panics
    ///
    /// When it is not installed and `DK_REQUIRE_PEERS` is set, or it does
    /// not start.
    pub fn shared(test: &str) -> Option<&'static PgServer> {
        static SHARED: OnceLock<PgServer> = OnceLock::new();
        let bin = programs_or_skip(test)?;
        Some(SHARED.get_or_init(|| PgServer::start_with(bin)))
    }

    /// A server of this test's own, stopped and removed when dropped;
    /// `None` (and a line saying `test` is skipped) when PostgreSQL is not
    /// installed.
    ///
    /// # Panics
    ///
    /// When it is not installed and `DK_REQUIRE_PEERS` is set, or it does
    /// not start.
    pub fn start(test: &str) -> Option<PgServer> {
        programs_or_skip(test).map(PgServer::start_with)
    }

    fn start_with(bin: PathBuf) -> PgServer {
        /// How many ports a start tries before it fails.
        const PORT_ATTEMPTS: usize = 5;
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dk-pg-{}-{}",
            std::process::id(),
            SERVERS.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(error) = std::fs::create_dir(&dir) {
            fail(&format!("cannot make `{}`: {error}", dir.display()));
        }
        let as_postgres = rustix::process::geteuid().is_root();
        let mut server = PgServer {
            bin,
            dir,
            port: crate::free_port(),
            as_postgres,
            databases: AtomicU32::new(0),
            watcher: None,
        };
        server.watcher = Some(server.watch());
        if as_postgres {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres:postgres"]).arg(&server.dir);
            run(&mut chown, "chown");
        }
        let mut initdb = server.program("initdb");
        initdb
            .arg("-D")
            .arg(server.data())
            .args(["-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8"])
            .arg("--no-locale");
        run(&mut initdb, "initdb");
        // The port was free when chosen; another process may have taken it
        // since: then the server starts again on another.
        for _ in 0..PORT_ATTEMPTS {
            match server.pg_ctl_start() {
                Ok(_) => return server,
                Err(_) if server.port_was_taken() => {
                    server.port = crate::free_port();
                }
                Err(output) => fail(&format!(
                    "pg_ctl start failed ({}): {}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                )),
            }
        }
        fail(&format!(
            "no free port for PostgreSQL in {PORT_ATTEMPTS} attempts"
        ))
    }

    /// Whether the last start failed because its port was taken, as the
    /// server's log says.
    fn port_was_taken(&self) -> bool {
        std::fs::read_to_string(self.dir.join("server.log"))
            .is_ok_and(|log| log.contains("Address already in use"))
    }

    /// `pg_ctl start`, waiting until the server takes connections; its
    /// output when it fails.
    fn pg_ctl_start(&self) -> Result<Output, Output> {
        let _ = std::fs::remove_file(self.dir.join("server.log"));
        let mut start = self.pg_ctl_start_command();
        match start.stdin(Stdio::null()).output() {
            Ok(output) if output.status.success() => Ok(output),
            Ok(output) => Err(output),
            Err(error) => fail(&format!("cannot run pg_ctl start: {error}")),
        }
    }

    /// `pg_ctl start`, waiting until the server takes connections.
    fn run_pg_ctl_start(&self) {
        run(&mut self.pg_ctl_start_command(), "pg_ctl start");
    }

    /// The command starting the server on its port.
    fn pg_ctl_start_command(&self) -> Command {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off \
             -c max_connections=400",
            self.port,
            self.dir.display()
        );
        let mut start = self.program("pg_ctl");
        start
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]);
        start
    }

    /// The cluster's data directory.
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A command running `name` from the server's programs, as `postgres`
    /// when the tests run as root.
    fn program(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    /// A shell process in a process group of its own that waits for this
    /// process to end, then stops the server and removes its directory.
    fn watch(&self) -> Child {
        let stop = self.stop_line();
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.1; done; {stop} >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = self.dir.display(),
        );
        match Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
        {
            Ok(child) => child,
            Err(error) => fail(&format!("cannot start the server's watcher: {error}")),
        }
    }

    /// The shell line that stops the server at once.
    fn stop_line(&self) -> String {
        let runas = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        format!(
            "{runas}'{}' stop -D '{}' -m immediate",
            self.bin.join("pg_ctl").display(),
            self.data().display()
        )
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a fresh, empty database and gives its URL.
    ///
    /// # Panics
    ///
    /// When `createdb` fails.
    pub fn database(&self) -> String {
        let name = format!("dk_{}", self.databases.fetch_add(1, Ordering::Relaxed));
        let mut create = Command::new(self.bin.join("createdb"));
        create
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .arg(&name);
        run(&mut create, "createdb");
        self.url(&name)
    }

    /// Stops the server at once (as a crash would), keeping its data for
    /// [`PgServer::restart`]. Not for the shared server.
    ///
    /// # Panics
    ///
    /// When `pg_ctl` fails.
    pub fn stop(&self) {
        let mut stop = self.program("pg_ctl");
        stop.arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"]);
        run(&mut stop, "pg_ctl stop");
    }

    /// Pauses the server, as a host frozen or a process stopped by a
    /// debugger would: SIGSTOP to the postmaster, then to every process it
    /// started (its backends, the connections already open). Nothing
    /// answers, nothing is refused: a client waits. Not for the shared
    /// server.
    ///
    /// # Panics
    ///
    /// When the postmaster cannot be found or signalled.
    pub fn pause(&self) {
        let postmaster = self.postmaster();
        signal("STOP", &[postmaster]);
        signal_any("STOP", &children_of(postmaster));
    }

    /// Resumes the server after [`PgServer::pause`].
    ///
    /// # Panics
    ///
    /// When the postmaster cannot be found or signalled.
    pub fn resume(&self) {
        let postmaster = self.postmaster();
        signal_any("CONT", &children_of(postmaster));
        signal("CONT", &[postmaster]);
    }

    /// The postmaster's process id, from the first line of
    /// `postmaster.pid` in the data directory.
    fn postmaster(&self) -> u32 {
        let file = self.data().join("postmaster.pid");
        match std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse().ok())
        {
            Some(pid) => pid,
            None => fail(&format!("no postmaster pid in `{}`", file.display())),
        }
    }

    /// Starts the server again after [`PgServer::stop`], on the same port.
    ///
    /// # Panics
    ///
    /// When it does not start.
    pub fn restart(&self) {
        self.run_pg_ctl_start();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let mut stop = self.program("pg_ctl");
        stop.arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Already stopped is fine: the directory goes either way.
        let _ = stop.status();
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::NotFound => {}
            Err(error) => eprintln!("cannot remove `{}`: {error}", self.dir.display()),
        }
        if let Some(mut watcher) = self.watcher.take() {
            let _ = watcher.kill();
            let _ = watcher.wait();
        }
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        fail("cannot read /proc");
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (name) state ppid ...`: the name may hold spaces, the
            // rest follows its last `)`.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Sends SIG`name` to `pids` with `kill`, failing the test when it fails.
fn signal(name: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let mut kill = Command::new("kill");
    kill.arg(format!("-{name}"));
    kill.args(pids.iter().map(u32::to_string));
    run(&mut kill, &format!("kill -{name}"));
}

/// Sends SIG`name` to those of `pids` still there (a backend may end
/// between being listed and being signalled).
fn signal_any(name: &str, pids: &[u32]) {
    for pid in pids {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `command`, failing the test with its output when it fails.
fn run(command: &mut Command, what: &str) -> Output {
    match command.stdin(Stdio::null()).output() {
        Ok(output) if output.status.success() => output,
        Ok(output) => fail(&format!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => fail(&format!("cannot run {what}: {error}")),
    }
}
