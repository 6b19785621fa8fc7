//! `dk approvals` against a real `dk vessel`, a simulated lamp and an agent
//! calling over `dk mcp`: a call allowed with `--remember` is answered
//! again without asking, `dk approvals remembered` lists and revokes it,
//! and the audit log records all of it and still verifies.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;

use dk_http::AdminClient;
use serde_json::{Value, json};

use crate::process::{
    PATIENCE, Running, Scratch, audit, audit_entries, devices, eventually, succeeded,
};

/// An agent on `dk mcp` over the vessel's MCP socket; killed on drop.
pub(crate) struct Agent {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// `dk mcp` for the vessel in `scratch`'s home with `credential`,
    /// initialized.
    pub(crate) fn start(scratch: &Scratch, credential: &str) -> Agent {
        let mut child = scratch
            .dk(&["mcp"])
            .env("DK_AGENT_CREDENTIAL", credential)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut agent = Agent {
            child,
            stdin,
            lines,
        };
        agent.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "it", "version": "1"}}}));
        agent.answer(1);
        agent.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        agent
    }

    pub(crate) fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a `tools/call` of `tool` as request `id`; does not wait.
    pub(crate) fn call(&mut self, id: u64, tool: &str, arguments: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}));
    }

    /// The answer to request `id`.
    pub(crate) fn answer(&self, id: u64) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(PATIENCE)
                .expect("no answer from dk mcp in time");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
        }
    }
}

/// A running vessel with the simulated lamp (strobe and set_light granted)
/// and an agent `helper` that may use it; the lamp's process is killed on
/// drop.
pub(crate) struct Lamp(Child);

impl Lamp {
    /// `dk device simulate lamp` against the vessel at `url`, moving on to
    /// the vessels at `also_at` when its connection drops, its key in
    /// `key_file`.
    pub(crate) fn simulate(url: &str, also_at: &[String], key_file: &std::path::Path) -> Lamp {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dk"));
        command.args(["device", "simulate", "lamp", "--vessel", url]);
        for other in also_at {
            command.args(["--also-at", other]);
        }
        Lamp(
            command
                .arg("--key-file")
                .arg(key_file)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Lamp {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the simulated lamp, pairs it with `set_light` and `strobe`
/// granted, and adds the agent `helper`; returns the lamp and the agent's
/// credential.
pub(crate) async fn lamp_and_helper(
    scratch: &Scratch,
    vessel: &Running,
    admin: &AdminClient,
) -> (Lamp, String) {
    let lamp = Lamp::simulate(&vessel.url(), &[], &scratch.root().join("desk-lamp.key"));
    crate::process::approve_when_asked(admin, "desk-lamp", &["set_light", "strobe"]).await;
    eventually("the lamp connected", || async {
        devices(admin)
            .await
            .first()
            .is_some_and(|d| d["connected"] == true)
            .then_some(())
    })
    .await;
    (lamp, add_helper(admin).await)
}

/// Adds the agent `helper`, the lamp in its scope, through `admin`; its
/// credential.
pub(crate) async fn add_helper(admin: &AdminClient) -> String {
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "helper", "scope": ["desk-lamp"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    added.body["credential"].as_str().unwrap().to_owned()
}

/// The id of the approval waiting now, once there is one.
pub(crate) async fn approval_id(admin: &AdminClient) -> u64 {
    eventually("an approval", || async {
        let pending = admin.get("/v1/pending").await.unwrap().body;
        pending
            .as_array()?
            .iter()
            .find(|p| p["kind"] == "approval")
            .and_then(|p| p["id"].as_u64())
    })
    .await
}

/// Says yes to the approval waiting now, once there is one, and checks
/// that the vessel took it (204).
pub(crate) async fn approve_the_waiting_call(admin: &AdminClient) {
    let asked = approval_id(admin).await;
    let said = admin
        .post(
            &format!("/v1/pending/{asked}/approval"),
            &json!({"approved": true}),
        )
        .await
        .unwrap();
    assert_eq!(said.status, 204, "{said:?}");
}

fn approvals(scratch: &Scratch, args: &[&str]) -> std::process::Output {
    let mut all = vec!["approvals"];
    all.extend_from_slice(args);
    scratch.run(&all)
}

/// The rule file that asks the person before every lamp action.
pub(crate) fn lamp_rules() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/policies/good/lamp-approval.yaml")
        .to_str()
        .unwrap()
        .to_owned()
}

const SET_LIGHT: &str = "device__desk_lamp__set_light";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dk_approvals_remembers_lists_and_revokes_an_allowance() {
    let scratch = Scratch::new("approvals-remembered");
    let (vessel, _) = crate::agents::start_with(&scratch, &["--policies", &lamp_rules()]);
    let admin = vessel.admin(&scratch);
    let (_lamp, credential) = lamp_and_helper(&scratch, &vessel, &admin).await;
    let mut agent = Agent::start(&scratch, &credential);

    let on = json!({"on": true, "brightness": 40});
    agent.call(2, SET_LIGHT, on.clone());
    let id = approval_id(&admin).await.to_string();
    let listed = succeeded(&approvals(&scratch, &[]));
    assert!(
        listed.contains(&format!(
            "may be remembered: dk approvals allow {id} --remember args|cap [--minutes N]"
        )),
        "{listed}"
    );
    let pending: Value =
        serde_json::from_str(&succeeded(&approvals(&scratch, &["--json"]))).unwrap();
    assert_eq!(pending[0]["canRemember"], json!(true));
    // `--minutes` alone says nothing to remember: clap refuses it.
    assert_eq!(
        approvals(&scratch, &["allow", &id, "--minutes", "5"])
            .status
            .code(),
        Some(2)
    );
    let bad = approvals(
        &scratch,
        &["allow", &id, "--remember", "args", "--minutes", "0"],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("an allowance lasts 1 to 1440 minutes, not 0"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let allowed = succeeded(&approvals(
        &scratch,
        &["allow", &id, "--remember", "args", "--minutes", "30"],
    ));
    assert!(
        allowed.starts_with(&format!(
            "call {id} allowed, and remembered as allowance 1: agent helper may call {SET_LIGHT} with exactly {{\"brightness\":40,\"on\":true}} until in "
        )),
        "{allowed}"
    );
    assert_ne!(agent.answer(2)["result"]["isError"], true);

    // The same call again is not put to the person; other arguments are.
    agent.call(3, SET_LIGHT, json!({"brightness": 40, "on": true}));
    assert_ne!(agent.answer(3)["result"]["isError"], true);
    let table = succeeded(&approvals(&scratch, &["remembered"]));
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("ID    AGENT"), "{table}");
    assert!(
        rows[1].starts_with(&format!("1     helper               {SET_LIGHT}"))
            && rows[1].ends_with(" 1"),
        "{table}"
    );
    assert_eq!(
        rows[2], r#"      exactly {"brightness":40,"on":true}"#,
        "{table}"
    );
    let list: Value =
        serde_json::from_str(&succeeded(&approvals(&scratch, &["remembered", "--json"]))).unwrap();
    assert_eq!(list[0]["uses"], json!(1));
    assert_eq!(list[0]["scope"], json!("arguments"));

    // Revoked: gone, and the helper is asked again.
    assert_eq!(
        succeeded(&approvals(&scratch, &["remembered", "revoke", "1"])),
        "allowance 1 revoked: its agent is asked again\n"
    );
    let again = approvals(&scratch, &["remembered", "revoke", "1"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("no remembered allowance 1"));
    assert_eq!(
        succeeded(&approvals(&scratch, &["remembered"])),
        "no remembered allowances\n"
    );
    agent.call(4, SET_LIGHT, on);
    let id = approval_id(&admin).await.to_string();
    assert_eq!(
        succeeded(&approvals(&scratch, &["deny", &id])),
        format!("call {id} refused\n")
    );
    assert_eq!(agent.answer(4)["result"]["isError"], true);
    drop(agent);

    vessel.interrupt();
    let data_dir = scratch.data_dir();
    let verify = audit(&data_dir, &["verify"]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let entries = audit_entries(&data_dir, 200);
    let kinds: Vec<&str> = entries.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"allowance-created"), "{kinds:?}");
    assert!(kinds.contains(&"allowance-revoked"), "{kinds:?}");
    let remembered = entries
        .iter()
        .filter(|e| e["kind"] == "decision" && e["entry"]["person"] == "remembered")
        .count();
    assert_eq!(remembered, 1, "{entries:?}");
    // Every answer given through `dk approvals` names the admin API.
    let answered: Vec<&Value> = entries
        .iter()
        .filter(|e| e["kind"] == "decision")
        .filter(|e| e["entry"]["person"] == "approved" || e["entry"]["person"] == "refused")
        .collect();
    assert!(!answered.is_empty(), "{entries:?}");
    for entry in answered {
        assert_eq!(
            entry["entry"]["by"],
            json!({"frontEnd": "adminApi"}),
            "{entry}"
        );
    }
}
