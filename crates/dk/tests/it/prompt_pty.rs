//! The terminal prompt of a real `dk vessel` whose standard input is a
//! pseudo-terminal, typed into as a person would: an answer goes to the
//! request it names, never to the one that happens to be first when the
//! line is read; hostile manifest text is shown escaped and on one line, as
//! an 80-column terminal lays the output out.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::process::{
    PATIENCE, Running, Scratch, consent_id, devices, eventually, hello, lamp_manifest,
};

/// A pseudo-terminal: the person's end (`master`) and the path of the
/// program's end.
struct Pty {
    master: std::fs::File,
    program_end: std::fs::File,
}

fn pty() -> Pty {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let program_end = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().unwrap())
        .unwrap();
    Pty {
        master: std::fs::File::from(master),
        program_end,
    }
}

/// `dk vessel` with the pty as its standard input; its standard output
/// comes back line by line.
fn start(scratch: &Scratch, pty: &Pty) -> (Running, mpsc::Receiver<String>) {
    let data_dir = scratch.data_dir();
    let child = scratch
        .dk(&[
            "vessel",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::from(pty.program_end.try_clone().unwrap()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = Running {
        child: Some(child),
        devices: "127.0.0.1:1".parse().unwrap(),
        admin: "127.0.0.1:1".parse().unwrap(),
        mcp: None,
        stdout: scratch.root().join("unused.out"),
    };
    let stdout = running.child.as_mut().unwrap().stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(data_dir.join("vessel.json"))
            && let Ok(address) = serde_json::from_str::<Value>(&text)
        {
            running.devices = address["devices"].as_str().unwrap().parse().unwrap();
            running.admin = address["admin"].as_str().unwrap().parse().unwrap();
            return (running, lines);
        }
        assert!(Instant::now() < deadline, "dk vessel did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the vessel's output until a line containing `text`; returns what
/// was read.
fn until(lines: &mpsc::Receiver<String>, text: &str) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(text);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => panic!(
                "no line with {text:?}; the vessel printed:\n{}",
                seen.join("\n")
            ),
        }
    }
}

fn type_line(pty: &mut Pty, line: &str) {
    pty.master
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
    pty.master.flush().unwrap();
}

#[test]
fn a_typed_answer_goes_to_the_request_it_names() {
    let scratch = Scratch::new("prompt-pty");
    let mut pty = pty();
    let (vessel, lines) = start(&scratch, &pty);
    until(&lines, "asked here");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = vessel.admin(&scratch);
        // A asks first and is on screen; B waits behind it.
        let a_socket = hello(&vessel.url(), &lamp_manifest("lamp-a"))
            .await
            .unwrap();
        let a = eventually("A's request", || consent_id(&admin, "lamp-a")).await;
        until(&lines, &format!("== #{a} A device asks to pair =="));
        let _b_socket = hello(&vessel.url(), &lamp_manifest("lamp-b"))
            .await
            .unwrap();
        let b = eventually("B's request", || consent_id(&admin, "lamp-b")).await;
        // A leaves; B comes on screen just as the person types `all` for A.
        drop(a_socket);
        until(&lines, &format!("== #{b} A device asks to pair =="));
        type_line(&mut pty, &format!("{a} all"));
        until(&lines, &format!("#{a} is not waiting for an answer"));
        // An answer without a number is refused too.
        type_line(&mut pty, "all");
        until(&lines, "start the answer with the request's number");
        assert_eq!(consent_id(&admin, "lamp-b").await, Some(b));
        assert!(
            devices(&admin).await.is_empty(),
            "B was paired by an answer meant for A"
        );
        // Naming B pairs B, with exactly what was granted.
        type_line(&mut pty, &format!("{b} 1"));
        until(&lines, "paired, granted: read_light");
        let paired = eventually("B paired", || async {
            let list = devices(&admin).await;
            (!list.is_empty()).then_some(list)
        })
        .await;
        assert_eq!(paired.len(), 1);
        assert_eq!(paired[0]["id"], json!("lamp-b"));
        assert_eq!(paired[0]["grants"], json!(["read_light"]));
    });
    vessel.interrupt();
}

/// Columns of the terminal the output is laid out on.
const COLUMNS: usize = 80;

/// The rows a `COLUMNS`-wide terminal shows for `lines`: each line cut into
/// rows where it wraps (every character here is one column wide: anything
/// wider is shown escaped).
fn rows(lines: &[String]) -> Vec<String> {
    let mut rows = Vec::new();
    for line in lines {
        let chars: Vec<char> = line.chars().collect();
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

#[test]
fn the_prompt_shows_hostile_text_escaped_and_on_one_line() {
    let scratch = Scratch::new("prompt-text");
    let mut pty = pty();
    let (vessel, lines) = start(&scratch, &pty);
    until(&lines, "asked here");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // A braille blank in a manifest never reaches the person.
        let braille = manifest("braille-lamp", "Desk\u{2800}lamp", "Read the lamp.");
        let refused = hello(&vessel.url(), &braille).await.map(|_| ()).unwrap_err();
        assert!(
            refused.contains("invalid manifest: manifest name contains control, escape, invisible or bidirectional characters"),
            "{refused}"
        );
        // Padding that an 80-column terminal would wrap into a capability
        // line of its own, and white space that prints blank, are shown
        // visibly on the device's own line.
        let padded = format!(
            "Read the lamp.{}[2] unlock_front_door (actuator): Unlock the front door.",
            " ".repeat(41)
        );
        let spaced = manifest("spaced-lamp", "Desk\u{3000}\u{2003}lamp", &padded);
        let _device = hello(&vessel.url(), &spaced).await.unwrap();
        let shown = until(&lines, "Does the device show");
        let screen = shown.join("\n");
        assert!(
            shown.iter().any(|line| line
                == "    [1] read_light (sensor): Read the lamp. [2] unlock_front_door (actuator): Unlock the front door."),
            "{screen}"
        );
        let rows = rows(&shown);
        assert!(
            !rows.iter().any(|row| row.trim_start().starts_with("[2]")),
            "a row looks like a capability the device does not have:\n{screen}"
        );
        assert!(
            rows.iter().any(|row| row
                .starts_with("  device   Desk\\u{3000}\\u{2003}lamp (spaced-lamp), kind lamp")),
            "{screen}"
        );
        for hidden in ['\u{2800}', '\u{3000}', '\u{2003}'] {
            assert!(!screen.contains(hidden), "{hidden:?} printed raw:\n{screen}");
        }
        assert!(!screen.contains("braille-lamp"), "{screen}");
        let admin = vessel.admin(&scratch);
        let id = eventually("the request", || consent_id(&admin, "spaced-lamp")).await;
        type_line(&mut pty, &format!("{id} no"));
        until(&lines, "pairing refused");
    });
    vessel.interrupt();
}
