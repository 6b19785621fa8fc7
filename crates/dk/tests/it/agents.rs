//! `dk agents` against a real `dk vessel`: an agent added with
//! `dk agents add --json` is still there, and its credential still opens
//! `/mcp`, after the vessel is killed and started again; `dk agents list`
//! never shows a credential, and none is written in the data directory.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Output;

use serde_json::Value;

use crate::process::{PATIENCE, Running, Scratch};

/// Starts `dk vessel` with an MCP listener on a free port; returns it and
/// the MCP address from its `vessel.json`.
pub(crate) fn start(scratch: &Scratch) -> (Running, String) {
    start_with(scratch, &[])
}

/// [`start`] with more arguments for `dk vessel`.
pub(crate) fn start_with(scratch: &Scratch, extra: &[&str]) -> (Running, String) {
    let args = [&["--mcp-listen", "127.0.0.1:0"][..], extra].concat();
    let running = Running::start_with(scratch, &args);
    let mcp = running.mcp.clone().unwrap();
    (running, mcp)
}

fn agents(scratch: &Scratch, args: &[&str]) -> Output {
    let mut all = vec!["agents"];
    all.extend_from_slice(args);
    let out = scratch.run(&all);
    assert!(
        out.status.success(),
        "dk agents {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The status of an MCP `initialize` POST to `addr` with `credential`.
fn mcp_status(addr: &str, credential: &str) -> u16 {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"it","version":"1"}}}"#;
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {credential}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn an_agent_added_with_dk_agents_survives_a_restart() {
    let scratch = Scratch::new("agents");
    let (vessel, mcp) = start(&scratch);
    let added = agents(
        &scratch,
        &[
            "add",
            "main",
            "--scope",
            "desk-lamp",
            "--role",
            "guest",
            "--json",
        ],
    );
    let added: Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(added["name"], "main");
    let credential = added["credential"].as_str().unwrap().to_owned();
    assert!(credential.starts_with("dka_"), "{credential}");
    assert_eq!(mcp_status(&mcp, &credential), 200);
    assert_eq!(mcp_status(&mcp, "dka_wrong"), 401);

    // Killed, not stopped: the agent was committed before it was shown.
    drop(vessel);
    let (_vessel, mcp) = start(&scratch);
    let listed = agents(&scratch, &["list", "--json"]);
    let text = String::from_utf8_lossy(&listed.stdout).into_owned();
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list[0]["name"], "main");
    assert_eq!(list[0]["role"], "guest");
    assert_eq!(list[0]["scope"], serde_json::json!(["desk-lamp"]));
    assert!(!text.contains(&credential), "{text}");
    assert!(!text.contains("credential"), "{text}");
    let plain = agents(&scratch, &["list"]);
    assert!(!String::from_utf8_lossy(&plain.stdout).contains(&credential));
    assert_eq!(mcp_status(&mcp, &credential), 200);

    // No file of the data directory holds the credential.
    for entry in std::fs::read_dir(scratch.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            // The admin and MCP sockets.
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let hex = credential.trim_start_matches("dka_").as_bytes();
        assert!(
            !bytes.windows(hex.len()).any(|w| w == hex),
            "{} holds the credential",
            path.display()
        );
    }

    // Removed: the credential stops working.
    agents(&scratch, &["remove", "main"]);
    assert_eq!(mcp_status(&mcp, &credential), 401);
}
