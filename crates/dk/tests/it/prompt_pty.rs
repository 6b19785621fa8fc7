//! The terminal prompt as a person sees it: `dk vessel` on a pseudo-terminal
//! (driven by Python's `pty` module, which the tree's crates lack), devices
//! with hostile manifest text, and the output read back the way an
//! 80-column terminal lays it out.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::process::{PATIENCE, hello};

/// Runs the command in `argv[1:]` on a new pseudo-terminal, copies what it
/// writes there to standard output and what arrives on standard input to
/// it; when standard input ends, kills the command and waits for it.
const PTY_DRIVER: &str = r#"
import os, pty, select, signal, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = sys.stdout.buffer
while True:
    ready, _, _ = select.select([fd, 0], [], [])
    if fd in ready:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            break
        out.write(data)
        out.flush()
    if 0 in ready:
        typed = os.read(0, 4096)
        if not typed:
            os.kill(pid, signal.SIGKILL)
            break
        os.write(fd, typed)
os.waitpid(pid, 0)
"#;

/// Columns of the terminal the output is laid out on.
const COLUMNS: usize = 80;

/// `dk vessel` with its prompt on a pseudo-terminal; on drop its input is
/// closed, which kills the vessel, and the driver is waited for.
struct PromptOnPty {
    driver: Child,
    input: Option<ChildStdin>,
    output: Arc<Mutex<Vec<u8>>>,
}

impl PromptOnPty {
    fn start(data_dir: &Path) -> PromptOnPty {
        let mut driver = Command::new("python3")
            .args(["-c", PTY_DRIVER, env!("CARGO_BIN_EXE_dk"), "vessel"])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--mcp-listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .arg("--admin-token-file")
            .arg(data_dir.with_extension("admin-token"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the pseudo-terminal");
        let input = driver.stdin.take();
        let mut stdout = driver.stdout.take().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut buffer = [0; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buffer) {
                sink.lock().unwrap().extend_from_slice(&buffer[..n]);
            }
        });
        PromptOnPty {
            driver,
            input,
            output,
        }
    }

    /// Everything the terminal showed so far.
    fn screen(&self) -> String {
        String::from_utf8(self.output.lock().unwrap().clone()).unwrap()
    }

    /// Waits until the terminal has shown `text`; returns all it showed.
    async fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {text:?}:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Types `line` at the prompt.
    fn type_line(&mut self, line: &str) {
        let input = self.input.as_mut().unwrap();
        input.write_all(format!("{line}\n").as_bytes()).unwrap();
        input.flush().unwrap();
    }
}

impl Drop for PromptOnPty {
    fn drop(&mut self) {
        drop(self.input.take());
        let _ = self.driver.wait();
    }
}

/// The rows an `COLUMNS`-wide terminal shows for `screen`: each line cut
/// into rows where it wraps (every character here is one column wide:
/// anything wider is shown escaped).
fn rows(screen: &str) -> Vec<String> {
    let mut rows = Vec::new();
    for line in screen.split('\n') {
        let chars: Vec<char> = line.trim_end_matches('\r').chars().collect();
        if chars.is_empty() {
            rows.push(String::new());
        }
        for row in chars.chunks(COLUMNS) {
            rows.push(row.iter().collect());
        }
    }
    rows
}

fn manifest(id: &str, name: &str, description: &str) -> Value {
    json!({
        "id": id,
        "name": name,
        "kind": "lamp",
        "version": "0.1.0",
        "capabilities": [
            {"name": "read_light", "kind": "sensor", "description": description},
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_shows_hostile_text_escaped_and_on_one_line() {
    let scratch = tempfile::TempDir::new().unwrap();
    let data_dir = scratch.path().join("data");
    let mut prompt = PromptOnPty::start(&data_dir);
    let deadline = Instant::now() + PATIENCE;
    let address: Value = loop {
        if let Ok(text) = std::fs::read_to_string(data_dir.join("vessel.json"))
            && let Ok(address) = serde_json::from_str(&text)
        {
            break address;
        }
        assert!(
            Instant::now() < deadline,
            "dk vessel did not start:\n{}",
            prompt.screen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let url = format!("ws://{}/device", address["devices"].as_str().unwrap());
    prompt
        .wait_for("pairing requests and approvals will be asked here")
        .await;

    // A braille blank in a manifest never reaches the person.
    let braille = manifest("braille-lamp", "Desk\u{2800}lamp", "Read the lamp.");
    let refused = hello(&url, &braille).await.map(|_| ()).unwrap_err();
    assert!(
        refused.contains("invalid manifest: manifest name contains control, escape, invisible or bidirectional characters"),
        "{refused}"
    );

    // Padding that an 80-column terminal would wrap into a capability line
    // of its own, and white space that prints blank, are shown visibly on
    // the device's own line.
    let padded = format!(
        "Read the lamp.{}[2] unlock_front_door (actuator): Unlock the front door.",
        " ".repeat(41)
    );
    let spaced = manifest("spaced-lamp", "Desk\u{3000}\u{2003}lamp", &padded);
    let _device = hello(&url, &spaced).await.unwrap();
    let screen = prompt.wait_for("Does the device show").await;
    assert!(
        screen.contains(
            "\n    [1] read_light (sensor): Read the lamp. [2] unlock_front_door (actuator): Unlock the front door.\r\n"
        ),
        "{screen}"
    );
    let rows = rows(&screen);
    assert!(
        !rows.iter().any(|row| row.trim_start().starts_with("[2]")),
        "a row looks like a capability the device does not have:\n{screen}"
    );
    assert!(
        rows.iter()
            .any(|row| row
                .starts_with("  device   Desk\\u{3000}\\u{2003}lamp (spaced-lamp), kind lamp")),
        "{screen}"
    );
    for hidden in ['\u{2800}', '\u{3000}', '\u{2003}'] {
        assert!(
            !screen.contains(hidden),
            "{hidden:?} printed raw:\n{screen}"
        );
    }
    assert!(!screen.contains("braille-lamp"), "{screen}");

    prompt.type_line("no");
    prompt.wait_for("pairing refused").await;
}
