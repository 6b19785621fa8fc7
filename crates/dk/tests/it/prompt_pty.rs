//! The terminal prompt of a real `dk vessel` whose standard input is a
//! pseudo-terminal, typed into as a person would: an answer goes to the
//! request it names, never to the one that happens to be first when the
//! line is read; hostile manifest text is shown escaped and on one line, as
//! an 80-column terminal lays the output out.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::process::{
    PATIENCE, Running, Scratch, audit_entries, consent_id, devices, eventually, hello,
    lamp_manifest,
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

/// `dk vessel` with the pty as its standard input, once it says the
/// terminal is where it asks; its standard output comes back line by line.
fn start(scratch: &Scratch, pty: &Pty) -> (Running, mpsc::Receiver<String>) {
    start_with(scratch, pty, &[])
}

/// [`start`] with more arguments for `dk vessel`.
fn start_with(scratch: &Scratch, pty: &Pty, extra: &[&str]) -> (Running, mpsc::Receiver<String>) {
    let data_dir = scratch.data_dir();
    // MCP on a port of its own unless the test names one: tests run at
    // once, and the default port is one for all of them.
    let mcp: &[&str] = if extra.contains(&"--mcp-listen") {
        &[]
    } else {
        &["--mcp-listen", "127.0.0.1:0"]
    };
    let args = [
        &[
            "vessel",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ][..],
        mcp,
        extra,
    ]
    .concat();
    let child = scratch
        .dk(&args)
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
    let address = dk_testkit::eventually_blocking_some("dk vessel starting", || {
        let text = std::fs::read_to_string(data_dir.join("vessel.json")).ok()?;
        serde_json::from_str::<Value>(&text).ok()
    });
    running.devices = address["devices"].as_str().unwrap().parse().unwrap();
    running.admin = address["admin"].as_str().unwrap().parse().unwrap();
    until(&lines, "asked here");
    (running, lines)
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
fn after_the_terminal_ends_its_input_the_vessel_still_stops_on_ctrl_c() {
    let scratch = Scratch::new("prompt-eof");
    let mut pty = pty();
    let (vessel, lines) = start(&scratch, &pty);
    // Ctrl-D at the start of a line: the terminal's end of input.
    pty.master.write_all(&[0x04]).unwrap();
    pty.master.flush().unwrap();
    until(
        &lines,
        "standard input closed: answer with `dk pairings` and `dk approvals`",
    );
    // SIGINT still stops it, promptly and cleanly.
    vessel.interrupt();
}

#[test]
fn a_typed_answer_goes_to_the_request_it_names() {
    let scratch = Scratch::new("prompt-pty");
    let mut pty = pty();
    let (vessel, lines) = start(&scratch, &pty);
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

const SET_LIGHT: &str = "device__desk_lamp__set_light";

#[test]
fn an_approval_is_answered_once_for_exact_arguments_for_the_capability_or_no() {
    use crate::approvals::{Agent, approval_id, lamp_and_helper, lamp_rules};
    let scratch = Scratch::new("prompt-remember");
    let mut pty = pty();
    let rules = lamp_rules();
    let (vessel, lines) = start_with(
        &scratch,
        &pty,
        &["--policies", &rules, "--mcp-listen", "127.0.0.1:0"],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = vessel.admin(&scratch);
        let (_lamp, credential) = lamp_and_helper(&scratch, &vessel, &admin).await;
        let mut agent = Agent::start(&scratch, &credential);

        agent.call(2, SET_LIGHT, json!({"on": true}));
        let id = approval_id(&admin).await;
        until(
            &lines,
            &format!("`{id} args 15`    allow agent helper this tool with exactly these arguments for 15 minutes"),
        );
        until(
            &lines,
            &format!("`{id} cap 15`     allow agent helper any call of set_light on desk-lamp for 15 minutes"),
        );
        // Anything but the four answers is refused, and the call still waits.
        for (typed, said) in [
            ("maybe", "`maybe` is not an answer: say `y` (once), `args MINUTES` (these exact arguments), `cap MINUTES` (the whole capability) or `n`"),
            ("cap 0", "an allowance lasts 1 to 1440 minutes, not 0"),
            ("cap 1441", "an allowance lasts 1 to 1440 minutes, not 1441"),
            ("args soon", "`soon` is not a number of minutes"),
            ("args 5 more", "`args 5 more` is not an answer: say `args MINUTES`, e.g. `args 15`"),
            ("y please", "`y please` is not an answer"),
        ] {
            type_line(&mut pty, &format!("{id} {typed}"));
            until(&lines, said);
        }
        assert_eq!(approval_id(&admin).await, id);
        type_line(&mut pty, &format!("{id} args 30"));
        until(
            &lines,
            &format!("allowed, and remembered as allowance 1 for 30 minutes: agent helper, {SET_LIGHT} with exactly these arguments"),
        );
        assert_ne!(agent.answer(2)["result"]["isError"], true);
        // The same arguments again: nobody is asked.
        agent.call(3, SET_LIGHT, json!({"on": true}));
        assert_ne!(agent.answer(3)["result"]["isError"], true);

        // Other arguments are asked; the whole capability is remembered.
        agent.call(4, SET_LIGHT, json!({"on": false}));
        let id = approval_id(&admin).await;
        until(&lines, &format!("== #{id} A call needs your yes =="));
        type_line(&mut pty, &format!("{id} cap 15"));
        until(
            &lines,
            "allowed, and remembered as allowance 2 for 15 minutes: agent helper, any call of set_light on desk-lamp",
        );
        assert_ne!(agent.answer(4)["result"]["isError"], true);
        agent.call(5, SET_LIGHT, json!({"on": true, "brightness": 7}));
        assert_ne!(agent.answer(5)["result"]["isError"], true);

        // Another capability is asked: once, then no.
        for (n, typed, said, refused) in [(6, "y", "allowed once", false), (7, "n", "refused", true)] {
            agent.call(n, "device__desk_lamp__strobe", json!({}));
            let id = approval_id(&admin).await;
            until(&lines, &format!("== #{id} A call needs your yes =="));
            type_line(&mut pty, &format!("{id} {typed}"));
            until(&lines, said);
            assert_eq!(agent.answer(n)["result"]["isError"] == true, refused, "{typed}");
        }

        // The person's own call names no agent: once or no, never remembered.
        let own = {
            let admin = admin.clone();
            tokio::spawn(async move {
                admin
                    .post(
                        "/v1/tools/call",
                        &json!({"tool": "device__desk_lamp__strobe", "input": {}}),
                    )
                    .await
            })
        };
        let id = approval_id(&admin).await;
        until(
            &lines,
            &format!("Allow this call? Answer `{id} y` to allow it once, `{id} n` to refuse (a call of no agent cannot be remembered)"),
        );
        type_line(&mut pty, &format!("{id} cap 5"));
        until(
            &lines,
            &format!("call {id} cannot be remembered (it names no agent): allow it once or refuse it"),
        );
        type_line(&mut pty, &format!("{id} y"));
        until(&lines, "allowed once");
        assert_eq!(own.await.unwrap().unwrap().body["ok"], json!(true));
        assert_eq!(
            admin.get("/v1/approvals/remembered").await.unwrap().body.as_array().unwrap().len(),
            2
        );
    });
    vessel.interrupt();
    // The log says who answered: the pairing and the agent came through
    // the admin API, every answer typed here names the terminal, and a
    // remembered allowance answering for the person names nobody.
    let entries = audit_entries(&scratch.data_dir(), 200);
    let by = |kind: &str| -> Vec<Value> {
        entries
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| e["entry"]["by"].clone())
            .collect()
    };
    assert_eq!(by("paired"), [json!({"frontEnd": "adminApi"})]);
    assert_eq!(by("agent"), [json!({"frontEnd": "adminApi"})]);
    let answered: Vec<(Value, Value)> = entries
        .iter()
        .filter(|e| e["kind"] == "decision" && e["entry"]["person"].is_string())
        .map(|e| (e["entry"]["person"].clone(), e["entry"]["by"].clone()))
        .collect();
    let terminal = json!({"frontEnd": "terminal"});
    let (yes, no, remembered) = (json!("approved"), json!("refused"), json!("remembered"));
    assert_eq!(
        answered,
        [
            (yes.clone(), terminal.clone()),
            (remembered.clone(), Value::Null),
            (yes.clone(), terminal.clone()),
            (remembered, Value::Null),
            (yes.clone(), terminal.clone()),
            (no, terminal.clone()),
            (yes, terminal),
        ],
        "{entries:?}"
    );
}

#[test]
fn the_terminal_says_a_microphone_is_live_and_stop_ends_it() {
    use futures::SinkExt as _;
    use tokio_tungstenite::tungstenite::Message;
    let scratch = Scratch::new("prompt-microphone");
    let mut pty = pty();
    let config = scratch.root().join("vessel.toml");
    std::fs::write(
        &config,
        "[streaming.voice]\nenabled = true\nrequireApproval = false\nsandbox = \"s\"\n",
    )
    .unwrap();
    let (vessel, lines) = start_with(&scratch, &pty, &["--config", config.to_str().unwrap()]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = vessel.admin(&scratch);
        let voice = json!({
            "id": "kitchen", "name": "Kitchen", "kind": "voice", "version": "1",
            "capabilities": [
                {"name": "listen", "kind": "sensor", "confirm": true, "description": "Record."},
                {"name": "stop", "kind": "actuator", "description": "Stop."},
            ],
        });
        let mut socket = hello(&vessel.url(), &voice).await.unwrap();
        let id = eventually("the pairing request", || consent_id(&admin, "kitchen")).await;
        until(&lines, &format!("== #{id} A device asks to pair =="));
        type_line(&mut pty, &format!("{id} all"));
        crate::process::read_until(&mut socket, "device:paired")
            .await
            .unwrap();
        let send = async |socket: &mut crate::process::Socket, frame: Value| {
            socket
                .send(Message::text(frame.to_string()))
                .await
                .unwrap();
        };
        // The device says its microphone is open: the terminal says so,
        // and so does `dk status`.
        send(
            &mut socket,
            json!({"type": "device:event", "capability": "listen",
                   "data": {"microphone": "live", "max_seconds": 9}}),
        )
        .await;
        until(
            &lines,
            "● MICROPHONE LIVE on kitchen (listen, at most 9 s): type `stop` to stop it",
        );
        let status = crate::process::succeeded(&scratch.run(&["status"]));
        assert!(
            status.contains(
                "microphone LIVE      kitchen (listen, at most 9 s): dk devices stop kitchen ends it"
            ),
            "{status}"
        );
        // `stop` typed is the person's stop: the device's `stop`, at once.
        type_line(&mut pty, "stop");
        let invoke = crate::process::read_until(&mut socket, "device:invoke")
            .await
            .unwrap();
        assert_eq!(invoke["capability"], json!("stop"), "{invoke}");
        send(
            &mut socket,
            json!({"type": "device:result", "callId": invoke["callId"], "ok": true,
                   "result": {"microphone": true, "speaker": false}}),
        )
        .await;
        until(&lines, "stopped kitchen");
        send(
            &mut socket,
            json!({"type": "device:event", "capability": "listen",
                   "data": {"microphone": "off", "ended": "stopped", "duration_ms": 400}}),
        )
        .await;
        until(&lines, "○ microphone off on kitchen");
        let status = crate::process::succeeded(&scratch.run(&["status"]));
        assert!(status.contains("microphones          none live"), "{status}");
        type_line(&mut pty, "stop");
        until(&lines, "no microphone is live");
    });
    vessel.interrupt();
}
