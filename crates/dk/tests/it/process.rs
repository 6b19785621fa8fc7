//! Helpers for tests that stop and start `dk vessel` on one home: a scratch
//! directory (dk's home, device token files), a running vessel killed on
//! drop, pairing through raw WebSocket hellos, and `dk audit` runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use dk_http::{AdminClient, AdminToken};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// How long any one wait may take before the test fails.
pub use dk_testkit::PATIENCE;

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A scratch directory, removed on drop: dk's home `home/` (the vessel's
/// data directory `home/vessel/`, its admin token `home/admin-token`), and
/// device token files.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix(&format!("dk-it-{name}-"))
                .tempdir()
                .unwrap(),
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `DK_HOME` for every `dk` this test runs.
    pub fn home(&self) -> PathBuf {
        self.root().join("home")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.home().join("vessel")
    }

    pub fn admin_token_file(&self) -> PathBuf {
        self.home().join("admin-token")
    }

    pub fn device_token_file(&self, device: &str) -> PathBuf {
        self.root().join("tokens").join(format!("{device}.token"))
    }

    pub fn admin_token(&self) -> AdminToken {
        AdminToken::read_from(&self.admin_token_file()).unwrap()
    }

    /// `dk ARGS` with this scratch's `DK_HOME`, run from the scratch
    /// directory (not the home).
    pub fn dk(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dk"));
        command
            .args(args)
            .env("DK_HOME", self.home())
            .current_dir(self.root());
        command
    }

    /// `dk ARGS`, run to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.dk(args).output().unwrap()
    }
}

/// A `dk vessel` process on a scratch home, killed (SIGKILL) on drop.
pub struct Running {
    pub child: Option<Child>,
    pub devices: SocketAddr,
    pub admin: SocketAddr,
    /// Its MCP address, when it listens for MCP on loopback.
    pub mcp: Option<String>,
    /// The file its standard output goes to; its standard error goes to
    /// the same path with the extension `err`.
    pub stdout: PathBuf,
}

impl Running {
    /// Starts `dk vessel` on `scratch`'s home and waits for its new address
    /// file (a stale one, left by a killed vessel, is removed first).
    pub fn start(scratch: &Scratch) -> Running {
        Running::start_with(scratch, &[])
    }

    /// [`Running::start`] with more arguments.
    pub fn start_with(scratch: &Scratch, extra: &[&str]) -> Running {
        Running::start_env(scratch, extra, &[])
    }

    /// [`Running::start_with`] with variables set in its environment.
    pub fn start_env(scratch: &Scratch, extra: &[&str], env: &[(&str, &str)]) -> Running {
        let data_dir = scratch.data_dir();
        let _ = std::fs::remove_file(data_dir.join("vessel.json"));
        let stdout = scratch.root().join(format!(
            "vessel-{}.out",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut child = scratch
            .dk(&["vessel", "--no-prompt"])
            .args(if extra.contains(&"--listen") {
                &[][..]
            } else {
                &["--listen", "127.0.0.1:0"][..]
            })
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(stdout.with_extension("err")).unwrap())
            .spawn()
            .unwrap();
        let address = dk_testkit::eventually_blocking_some("dk vessel starting", || {
            if let Ok(text) = std::fs::read_to_string(data_dir.join("vessel.json"))
                && let Ok(address) = serde_json::from_str::<Value>(&text)
            {
                return Some(address);
            }
            if let Some(status) = child.try_wait().unwrap() {
                let said = std::fs::read_to_string(stdout.with_extension("err")).unwrap();
                panic!("dk vessel exited at start: {status}: {said}");
            }
            None
        });
        let addr = |key: &str| address[key].as_str().unwrap().parse().unwrap();
        Running {
            devices: addr("devices"),
            admin: addr("admin"),
            mcp: address["mcp"].as_str().map(str::to_owned),
            child: Some(child),
            stdout,
        }
    }

    /// What it printed at start, once that holds `last`.
    pub fn said(&self, last: &str) -> String {
        dk_testkit::eventually_blocking_some(&format!("dk vessel saying {last:?}"), || {
            let text = std::fs::read_to_string(&self.stdout).unwrap();
            text.contains(last).then_some(text)
        })
    }

    /// What it wrote on standard error so far.
    pub fn complained(&self) -> String {
        std::fs::read_to_string(self.stdout.with_extension("err")).unwrap()
    }

    pub fn url(&self) -> String {
        format!("ws://{}/device", self.devices)
    }

    /// A client of the admin API on the vessel's admin socket.
    pub fn admin(&self, scratch: &Scratch) -> AdminClient {
        AdminClient::over_socket(scratch.data_dir().join("admin.sock"), scratch.admin_token())
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGINT, as Ctrl-C: the vessel closes connections, flushes its audit
    /// log and exits 0.
    pub fn interrupt(self) {
        self.stop_with("-INT");
    }

    /// SIGTERM, as a service manager stops it: the same clean stop.
    pub fn terminate(self) {
        self.stop_with("-TERM");
    }

    fn stop_with(self, signal: &str) {
        let status = self.signal(signal);
        assert!(status.success(), "dk vessel stopped with {status}");
    }

    /// Sends `signal` (`-ABRT`, `-KILL`, `-TERM`...) and waits for the
    /// vessel to end: how it ended.
    pub fn signal(mut self, signal: &str) -> std::process::ExitStatus {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
        // Past PATIENCE the wait fails, and `Running`'s drop kills the
        // process, so none is left behind.
        let child = self.child.as_mut().unwrap();
        let status =
            dk_testkit::eventually_blocking_some(&format!("dk vessel to stop on {signal}"), || {
                child.try_wait().unwrap()
            });
        self.child = None;
        status
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The standard output of `out`, which must have exited 0 (else its
/// standard error is shown).
#[track_caller]
pub fn succeeded(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Polls `check` until it gives a value, failing after [`PATIENCE`].
pub use dk_testkit::eventually_async as eventually;

/// `GET /v1/devices`.
pub async fn devices(admin: &AdminClient) -> Vec<Value> {
    let answer = admin.get("/v1/devices").await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body.as_array().cloned().unwrap()
}

/// The pending consent request of `device`, if any: its id.
pub async fn consent_id(admin: &AdminClient, device: &str) -> Option<u64> {
    let pending = admin.get("/v1/pending").await.ok()?;
    consent_in(&pending.body, device)
}

/// The id of `device`'s consent request in a `/v1/pending` list.
pub fn consent_in(pending: &Value, device: &str) -> Option<u64> {
    pending.as_array()?.iter().find_map(|prompt| {
        (prompt["kind"] == "consent" && prompt["request"]["deviceId"] == device)
            .then(|| prompt["id"].as_u64())
            .flatten()
    })
}

/// Waits for `device`'s pairing request and grants `grant` through the
/// admin API.
pub async fn approve_when_asked(admin: &AdminClient, device: &str, grant: &[&str]) {
    let id = eventually(&format!("{device}'s pairing request"), || {
        consent_id(admin, device)
    })
    .await;
    approve_consent(admin, id, grant).await;
}

/// Approves the pairing request `id`, granting `grant`, through the admin
/// API.
pub async fn approve_consent(admin: &AdminClient, id: u64, grant: &[&str]) {
    let answer = admin
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": grant}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204, "{answer:?}");
}

/// Waits until the vessel behind `admin` lists `device` connected.
pub async fn wait_connected(admin: &AdminClient, device: &str) {
    eventually(&format!("{device} connected"), || async {
        devices(admin)
            .await
            .iter()
            .any(|d| d["id"] == device && d["connected"] == true)
            .then_some(())
    })
    .await;
}

/// A lamp-like manifest with its own id.
pub fn lamp_manifest(id: &str) -> Value {
    json!({
        "id": id,
        "name": format!("Lamp {id}"),
        "kind": "lamp",
        "version": "0.1.0",
        "capabilities": [
            {"name": "read_light", "kind": "sensor", "description": "Read the lamp."},
            {"name": "set_light", "kind": "actuator", "description": "Set the lamp.",
             "params": {"on": {"type": "boolean", "required": true}}},
            {"name": "strobe", "kind": "actuator", "description": "Flash the lamp."},
        ],
    })
}

/// Connects a raw WebSocket and sends `device:hello` with `manifest`; waits
/// for `device:pairing`.
pub async fn hello(url: &str, manifest: &Value) -> Result<Socket, String> {
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|e| e.to_string())?;
    let frame = json!({"type": "device:hello", "manifest": manifest});
    socket
        .send(Message::text(frame.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    read_until(&mut socket, "device:pairing").await?;
    Ok(socket)
}

/// Reads frames until one of type `kind`, which it returns.
pub async fn read_until(socket: &mut Socket, kind: &str) -> Result<Value, String> {
    let wait = async {
        while let Some(message) = socket.next().await {
            match message.map_err(|e| e.to_string())? {
                Message::Text(text) => {
                    let frame: Value =
                        serde_json::from_str(text.as_str()).map_err(|e| e.to_string())?;
                    if frame["type"] == kind {
                        return Ok(frame);
                    }
                }
                Message::Close(close) => return Err(format!("closed before `{kind}`: {close:?}")),
                _ => {}
            }
        }
        Err(format!("the connection ended before `{kind}`"))
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .map_err(|_| format!("no `{kind}` within {PATIENCE:?}"))?
}

/// `dk audit ARGS --data-dir DIR`, with `DK_HOME` beside `DIR`, where
/// nothing else is read.
pub fn audit(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dk"))
        .arg("audit")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("DK_HOME", data_dir.with_extension("home"))
        .output()
        .unwrap()
}

/// The entries `dk audit tail --json` prints, as JSON.
pub fn audit_entries(data_dir: &Path, last: u64) -> Vec<Value> {
    let out = audit(data_dir, &["tail", "--json", "-n", &last.to_string()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A child process killed on drop, so a failing test leaves none behind.
pub(crate) struct Killed(pub(crate) std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
