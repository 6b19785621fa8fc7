//! `dk vessel` under a service manager, played by the test: it owns the
//! notify socket (a path, then an abstract one), starts the real process
//! with `NOTIFY_SOCKET` and the watchdog's variables, and reads what the
//! vessel tells it: `READY=1` only once its listeners answer, watchdog
//! pings at about half the period, `STOPPING=1` on SIGTERM.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::process::{Killed, PATIENCE, Scratch};

/// The next message on `socket`, if one comes within `wait`.
fn next_message(socket: &UnixDatagram, wait: Duration) -> Option<String> {
    socket.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0; 4096];
    match socket.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// `dk vessel` on `scratch` with `env` set, its output in the scratch.
fn start(scratch: &Scratch, env: &[(&str, &str)]) -> Killed {
    let mut command = scratch.dk(&["vessel", "--no-prompt"]);
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--mcp-listen", "127.0.0.1:0"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(scratch.root().join("vessel.out")).unwrap())
        .stderr(std::fs::File::create(scratch.root().join("vessel.err")).unwrap());
    Killed(command.spawn().unwrap())
}

/// Waits for `READY=1` and checks what it says and that, by then, the
/// device listener accepts and the admin listener answers `/readyz` 200.
fn ready(scratch: &Scratch, socket: &UnixDatagram, vessel: &Killed) {
    let message = next_message(socket, PATIENCE).unwrap_or_else(|| {
        let said = std::fs::read_to_string(scratch.root().join("vessel.err")).unwrap();
        panic!("no READY=1 from the vessel: {said}")
    });
    let text = std::fs::read_to_string(scratch.data_dir().join("vessel.json")).unwrap();
    let address: Value = serde_json::from_str(&text).unwrap();
    let addr = |key: &str| -> SocketAddr { address[key].as_str().unwrap().parse().unwrap() };
    let devices = addr("devices");
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(
        lines,
        [
            "READY=1",
            &format!("STATUS=ready: devices connect to ws://{devices}/device"),
            &format!("MAINPID={}", vessel.0.id()),
        ]
    );
    TcpStream::connect(devices).unwrap();
    let mut admin = TcpStream::connect(addr("admin")).unwrap();
    admin
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    admin.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// SIGTERM: `STOPPING=1` comes (after any last pings) and the vessel exits 0.
fn stops(socket: &UnixDatagram, mut vessel: Killed) {
    let pid = vessel.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Watchdog beats, then STOPPING=1.
    dk_testkit::eventually_blocking("STOPPING=1", || {
        let message = next_message(socket, PATIENCE).expect("no STOPPING=1");
        if message.starts_with("STOPPING=1\n") {
            return true;
        }
        assert_eq!(message, "WATCHDOG=1\n");
        false
    });
    let status = vessel.0.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn the_vessel_tells_a_service_manager_ready_alive_and_stopping() {
    let scratch = Scratch::new("notify");
    let path = scratch.root().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    // A watchdog of 400 ms: a ping every 200 ms or so.
    let vessel = start(
        &scratch,
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    ready(&scratch, &socket, &vessel);
    let window = Duration::from_secs(2);
    let started = Instant::now();
    let mut pings = 0;
    while let Some(left) = window.checked_sub(started.elapsed()) {
        match next_message(&socket, left) {
            Some(message) => {
                assert_eq!(message, "WATCHDOG=1\n");
                pings += 1;
            }
            None => break,
        }
    }
    // About ten; loosely, as the machine may be busy.
    assert!((3..=20).contains(&pings), "{pings} pings in {window:?}");
    stops(&socket, vessel);
}

#[test]
fn an_abstract_socket_and_a_watchdog_for_another_process() {
    use std::os::linux::net::SocketAddrExt;
    let scratch = Scratch::new("notify-abstract");
    let name = format!(
        "dk-it-notify-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&address).unwrap();
    // The watchdog watches another process: the vessel never pings.
    let vessel = start(
        &scratch,
        &[
            ("NOTIFY_SOCKET", &format!("@{name}")),
            ("WATCHDOG_USEC", "200000"),
            ("WATCHDOG_PID", "1"),
        ],
    );
    ready(&scratch, &socket, &vessel);
    assert_eq!(next_message(&socket, Duration::from_millis(600)), None);
    stops(&socket, vessel);
}

/// The unit file in `dist/systemd/`, with `ExecStart` naming this build's
/// `dk`, passes `systemd-analyze verify` without a word, keeps its
/// hardening, and `systemd-analyze security` rates its exposure at most
/// 2.0 of 10. Skipped, saying so, where `systemd-analyze` is missing.
#[test]
fn the_unit_file_verifies_and_stays_hardened() {
    let unit = std::fs::read_to_string(crate::fixtures().join("../dist/systemd/dk-vessel.service"))
        .unwrap();
    for directive in [
        "Type=notify",
        "ExecStart=/usr/local/bin/dk vessel --no-prompt",
        "WatchdogSec=30s",
        "Restart=on-failure",
        "RestartPreventExitStatus=75",
        "DynamicUser=yes",
        "StateDirectory=dk",
        "Environment=DK_HOME=/var/lib/dk",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "UMask=0077",
    ] {
        assert!(
            unit.lines().any(|line| line == directive),
            "the unit lost `{directive}`"
        );
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no systemd-analyze on this machine");
        return;
    }
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("dk-vessel.service");
    let built = unit.replace("/usr/local/bin/dk", env!("CARGO_BIN_EXE_dk"));
    std::fs::write(&file, built).unwrap();
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verified.stderr);
    assert!(verified.status.success() && said.is_empty(), "{said}");
    let rated = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        rated.status.success(),
        "{}",
        String::from_utf8_lossy(&rated.stdout)
    );
}
