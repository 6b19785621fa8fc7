//! The terminal prompt of a real `dk vessel` whose standard input is a
//! pseudo-terminal, typed into as a person would: an answer goes to the
//! request it names, never to the one that happens to be first when the
//! line is read.

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
