//! `dk mcp` between a client on its standard input and output and a real
//! `dk vessel` with a simulated lamp (`dk device simulate lamp`), reached on
//! the vessel's MCP socket: the `initialize` handshake, the tool list, a
//! call, the list-changed notification after a grant, a message written in
//! pieces while another request finishes, and the end of input; then the
//! bridge with no credential, a refused one, no vessel, and a server that
//! keeps the handshake's stream open.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::agents::start;
use crate::process::{Killed, PATIENCE, Scratch, devices, eventually};

/// A running `dk mcp`: its standard input, its output lines as they come,
/// and what it wrote on standard error once it ended.
pub(crate) struct Bridge {
    child: Killed,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    /// The home it runs with, when it has one of its own.
    _home: Option<Scratch>,
}

impl Bridge {
    /// `dk mcp --vessel URL`, with `credential` in `DK_AGENT_CREDENTIAL`
    /// (or none at all).
    fn start(url: &str, credential: Option<&str>) -> Bridge {
        let scratch = Scratch::new("mcp-bridge-http");
        let mut bridge = Bridge::spawn(scratch.dk(&["mcp", "--vessel", url]), credential);
        bridge._home = Some(scratch);
        bridge
    }

    /// `dk mcp` on the MCP socket of the vessel in `scratch`'s home.
    pub(crate) fn over_socket(scratch: &Scratch, credential: Option<&str>) -> Bridge {
        Bridge::spawn(scratch.dk(&["mcp"]), credential)
    }

    fn spawn(mut command: Command, credential: Option<&str>) -> Bridge {
        command
            .env_remove("DK_AGENT_CREDENTIAL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(credential) = credential {
            command.env("DK_AGENT_CREDENTIAL", credential);
        }
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take();
        let lines = Self::read_lines(child.stdout.take().unwrap());
        let stderr = Self::read_lines(child.stderr.take().unwrap());
        Bridge {
            child: Killed(child),
            stdin,
            lines,
            stderr,
            _home: None,
        }
    }

    fn read_lines(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        receiver
    }

    fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string());
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Writes `text` as it is, without a line end.
    fn write_raw(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// The next line of output, which must be JSON.
    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(PATIENCE)
            .expect("no line from dk mcp in time");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON on stdout: {line:?}: {e}"))
    }

    /// Reads output until the answer to `id`; returns it and what came
    /// before it.
    fn answer(&self, id: u64) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let message = self.next();
            if message["id"] == id && message.get("method").is_none() {
                return (message, before);
            }
            before.push(message);
        }
    }

    pub(crate) fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.answer(id).0
    }

    /// Closes standard input and waits for the exit code; returns it and
    /// the standard error text.
    pub(crate) fn finish(mut self) -> (Option<i32>, String) {
        drop(self.stdin.take());
        let status = dk_testkit::eventually_blocking_some("dk mcp exiting at end of input", || {
            self.child.0.try_wait().unwrap()
        });
        // The readers end when the streams close.
        let stderr: Vec<String> =
            std::iter::from_fn(|| self.stderr.recv_timeout(PATIENCE).ok()).collect();
        // Whatever is still on stdout must be JSON-RPC too.
        for line in std::iter::from_fn(|| self.lines.recv_timeout(PATIENCE).ok()) {
            let message: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(message["jsonrpc"], "2.0", "{line}");
        }
        (status.code(), stderr.join("\n"))
    }
}

pub(crate) fn initialize(bridge: &mut Bridge) -> Value {
    let answer = bridge.request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "it", "version": "1"}}),
    );
    bridge.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    answer
}

fn tool_names(answer: &Value) -> Vec<String> {
    answer["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {answer}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_client_lists_calls_and_hears_of_a_grant() {
    let scratch = Scratch::new("mcp-bridge");
    let (vessel, _) = start(&scratch);
    let admin = vessel.admin(&scratch);

    // The simulated lamp asks to pair; the person grants read_light only.
    let _lamp = Killed(
        Command::new(env!("CARGO_BIN_EXE_dk"))
            .args(["device", "simulate", "lamp", "--vessel", &vessel.url()])
            .arg("--key-file")
            .arg(scratch.root().join("desk-lamp.key"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    crate::process::approve_when_asked(&admin, "desk-lamp", &["read_light"]).await;
    eventually("the lamp connected", || async {
        devices(&admin)
            .await
            .first()
            .is_some_and(|d| d["connected"] == true)
            .then_some(())
    })
    .await;
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "bridge", "scope": ["desk-lamp"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    let credential = added.body["credential"].as_str().unwrap().to_owned();

    // Over the socket: the bridge is given no address at all.
    let mut bridge = Bridge::over_socket(&scratch, Some(&credential));
    let answer = initialize(&mut bridge);
    assert_eq!(
        answer["result"]["protocolVersion"], "2025-06-18",
        "{answer}"
    );
    assert!(
        answer["result"]["capabilities"]["tools"].is_object(),
        "{answer}"
    );

    // The granted capability, and the vessel's own read_more.
    let listed = bridge.request(2, "tools/list", json!({}));
    assert_eq!(
        tool_names(&listed),
        ["device__desk_lamp__read_light", "read_more"]
    );

    let called = bridge.request(
        3,
        "tools/call",
        json!({"name": "device__desk_lamp__read_light", "arguments": {}}),
    );
    assert_ne!(called["result"]["isError"], true, "{called}");
    assert!(
        called["result"]["structuredContent"].is_object(),
        "{called}"
    );
    let refused = bridge.request(
        4,
        "tools/call",
        json!({"name": "device__desk_lamp__set_light", "arguments": {"on": true}}),
    );
    assert_eq!(refused["result"]["isError"], true, "{refused}");

    // A grant reaches the client on the session's stream.
    let granted = admin
        .put("/v1/devices/desk-lamp/grants/set_light")
        .await
        .unwrap();
    assert_eq!(granted.status, 204, "{granted:?}");
    let notice = bridge.next();
    assert_eq!(
        notice["method"], "notifications/tools/list_changed",
        "{notice}"
    );
    let listed = bridge.request(5, "tools/list", json!({}));
    assert_eq!(
        tool_names(&listed),
        [
            "device__desk_lamp__read_light",
            "device__desk_lamp__set_light",
            "read_more"
        ]
    );
    let called = bridge.request(
        6,
        "tools/call",
        json!({"name": "device__desk_lamp__set_light", "arguments": {"on": true, "brightness": 40}}),
    );
    assert_ne!(called["result"]["isError"], true, "{called}");

    // A message written in two pieces, with a request finishing between
    // them, arrives whole: the bridge turning to the finished request
    // drops nothing it had read.
    bridge.send(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "device__desk_lamp__read_light", "arguments": {}}}));
    let halves =
        json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {}}).to_string();
    let (first, second) = halves.split_at(halves.len() / 2);
    bridge.write_raw(first);
    assert_ne!(bridge.answer(7).0["result"]["isError"], true);
    // Holds the second half back a while, so the bridge has the first
    // half on its own while the call before it is answered.
    std::thread::sleep(Duration::from_millis(200));
    bridge.write_raw(&format!("{second}\n"));
    assert_eq!(tool_names(&bridge.answer(8).0).len(), 3);

    let (code, stderr) = bridge.finish();
    assert_eq!(code, Some(0), "{stderr}");
    drop(vessel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_good_credential_or_a_vessel_the_bridge_says_so() {
    // No credential at all: a clear line, nothing on stdout, exit 1.
    let bridge = Bridge::start("http://127.0.0.1:9/mcp", None);
    let (code, stderr) = bridge.finish();
    assert_eq!(code, Some(1));
    assert!(stderr.contains("DK_AGENT_CREDENTIAL"), "{stderr}");

    // A credential on the command line is not accepted at all.
    let out = Scratch::new("mcp-bridge-argument")
        .dk(&["mcp", "--credential", "dka_x"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    // A refused credential: the request gets an error answer naming 401.
    let scratch = Scratch::new("mcp-bridge-refused");
    let (vessel, mcp) = start(&scratch);
    let mut bridge = Bridge::start(&format!("http://{mcp}/mcp"), Some("dka_wrong"));
    let answer = initialize(&mut bridge);
    assert_eq!(answer["error"]["code"], -32000, "{answer}");
    assert_eq!(answer["error"]["data"]["httpStatus"], 401, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("refused the agent credential"),
        "{answer}"
    );
    let listed = bridge.request(2, "tools/list", json!({}));
    assert!(listed["error"].is_object(), "{listed}");
    let (code, stderr) = bridge.finish();
    assert_eq!(code, Some(0));
    assert!(stderr.contains("refused the agent credential"), "{stderr}");
    drop(vessel);

    // No vessel: the address was just freed, so nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let mut bridge = Bridge::start(&format!("http://{addr}/mcp"), Some("dka_any"));
    let answer = initialize(&mut bridge);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot reach the vessel"),
        "{answer}"
    );
    bridge.send_line("{");
    let answer = bridge.next();
    assert_eq!(
        (&answer["id"], &answer["error"]["code"]),
        (&Value::Null, &json!(-32700)),
        "{answer}"
    );
    bridge.send(&json!("not a request"));
    let answer = bridge.next();
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    let (code, stderr) = bridge.finish();
    assert_eq!(code, Some(0));
    assert!(stderr.contains("cannot reach the vessel"), "{stderr}");

    // No vessel in the home: the socket is not there.
    let scratch = Scratch::new("mcp-bridge-nobody");
    let mut bridge = Bridge::over_socket(&scratch, Some("dka_any"));
    let answer = initialize(&mut bridge);
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot reach the vessel") && message.contains("no vessel runs in"),
        "{answer}"
    );
    assert_eq!(answer["error"]["data"]["reachable"], false, "{answer}");
    let (code, _) = bridge.finish();
    assert_eq!(code, Some(0));
}

/// A server that answers `initialize` on an event stream it then keeps
/// open (as a slow or broken server might), any other POST with a plain
/// JSON-RPC answer, and a GET with 405. It stops, closing what it kept
/// open, when the returned guard is dropped.
fn server_keeping_the_handshake_stream_open() -> StopsOnDrop {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        for stream in listener.incoming() {
            if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            let Ok(mut stream) = stream else { break };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                request.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&request).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            let _ = stream.read_exact(&mut body);
            let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let answer = if head.starts_with("get ") {
                "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n".to_owned()
            } else if message["method"] == "initialize" {
                let result = json!({"jsonrpc": "2.0", "id": message["id"], "result": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "serverInfo": {"name": "slow", "version": "1"}}});
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nmcp-session-id: s1\r\n\r\ndata: {result}\n\n"
                )
            } else if message.get("id").is_none() {
                "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_owned()
            } else {
                let result =
                    json!({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": []}})
                        .to_string();
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{result}",
                    result.len()
                )
            };
            let _ = stream.write_all(answer.as_bytes());
            // The handshake's stream stays open; the others end here.
            if message["method"] == "initialize" {
                kept.push(stream);
            }
        }
    });
    StopsOnDrop { address, stop }
}

/// A local server thread, told to stop (and woken by a connection) on drop.
struct StopsOnDrop {
    address: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for StopsOnDrop {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(self.address);
    }
}

#[test]
fn a_handshake_stream_left_open_holds_nothing_up() {
    let server = server_keeping_the_handshake_stream_open();
    let mut bridge = Bridge::start(&format!("http://{}/mcp", server.address), Some("dka_any"));
    let answer = initialize(&mut bridge);
    assert_eq!(answer["result"]["serverInfo"]["name"], "slow", "{answer}");
    // The next request is sent at once, and the handshake gets no second,
    // contradicting answer.
    bridge.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let (listed, before) = bridge.answer(2);
    assert_eq!(listed["result"]["tools"], json!([]), "{listed}");
    assert!(before.is_empty(), "{before:?}");
    drop(bridge);
    drop(server);
}
