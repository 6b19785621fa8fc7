//! `dk bridge mcp` as a person runs it, between a real `dk vessel` and
//! real MCP servers installed by `cargo xtask peers` (the official
//! filesystem and everything servers from npm), and a hostile server
//! written with the official Python SDK (`hostile_mcp_server.py`, run in
//! the virtualenv `cargo xtask python` keeps under `target/`). An agent on
//! rmcp's client calls through the vessel's MCP listener. Each test skips
//! when its peer is missing, unless `DK_REQUIRE_PEERS` is set.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use dk_http::AdminClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::process::{
    Killed, PATIENCE, Running, Scratch, audit_entries, devices, eventually, succeeded,
};

/// The target directory the peers are installed under.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../..")
                    .join(dir)
            }
        }
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// `node` and an npm MCP server's entry point, when installed.
fn npm_server(test: &str, package: &str) -> Option<Vec<OsString>> {
    let entry = target_dir()
        .join("mcp-peers/node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .into_iter()
        .find(|p| Path::new(p).is_file());
    let found = node
        .filter(|_| entry.is_file())
        .map(|node| vec![OsString::from(node), entry.into_os_string()]);
    dk_testkit::peer_or_skip(test, &format!("@modelcontextprotocol/{package}"), found)
}

/// The hostile server in the Python virtualenv, when it is there.
fn hostile_server(test: &str, control: &Path) -> Option<Vec<OsString>> {
    let python = target_dir().join("python-venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/hostile_mcp_server.py");
    let found = python.is_file().then(|| {
        vec![
            python.into_os_string(),
            script.into_os_string(),
            control.as_os_str().to_owned(),
        ]
    });
    dk_testkit::peer_or_skip(test, "the Python MCP SDK's virtualenv", found)
}

/// A `dk bridge mcp` process, killed on drop.
struct Bridge {
    _child: Killed,
    stdout: PathBuf,
}

impl Bridge {
    fn start(
        scratch: &Scratch,
        vessel: &Running,
        id: &str,
        extra: &[&str],
        server: &[OsString],
    ) -> Bridge {
        let stdout = scratch.root().join(format!("bridge-{id}.out"));
        let mut command = scratch.dk(&[
            "--log-format",
            "json",
            "bridge",
            "mcp",
            "--id",
            id,
            "--vessel",
            &vessel.url(),
        ]);
        command
            .args(extra)
            .arg("--")
            .args(server)
            .env("DK_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(stdout.with_extension("err")).unwrap());
        Bridge {
            _child: Killed(command.spawn().unwrap()),
            stdout,
        }
    }

    fn said(&self) -> String {
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let err = std::fs::read_to_string(self.stdout.with_extension("err")).unwrap_or_default();
        format!("{out}{err}")
    }

    /// The last pairing code it printed, once it printed one after
    /// `after` of them.
    async fn code(&self, after: usize) -> String {
        let mut code = None;
        dk_testkit::eventually_within("a pairing code", PATIENCE * 3, || {
            let codes: Vec<String> = self
                .said()
                .lines()
                .filter_map(|l| l.split("pairing code ").nth(1))
                .filter_map(|rest| rest.split(':').next())
                .map(str::to_owned)
                .collect();
            code = codes.get(after).and_then(|_| codes.last().cloned());
            code.is_some()
        })
        .await;
        code.unwrap()
    }
}

type Client = RunningService<RoleClient, ()>;

/// A vessel, a bridge paired with what `grant` says, and an agent.
struct Setup {
    client: Client,
    admin: AdminClient,
    bridge: Bridge,
    /// The pairing request the person answered.
    asked: Value,
    id: String,
    vessel: Running,
    /// Last: fields drop in order, so the vessel and the bridge are gone
    /// before their folder is removed, and write nothing into it after.
    scratch: Scratch,
}

impl Setup {
    /// Pairs the bridge, granting `grant` (every capability when `None`).
    async fn start(
        name: &str,
        id: &str,
        extra: &[&str],
        server: &[OsString],
        grant: Option<&[&str]>,
    ) -> Setup {
        let scratch = Scratch::new(name);
        let (vessel, mcp) = crate::agents::start_with(&scratch, &[]);
        let admin = vessel.admin(&scratch);
        let bridge = Bridge::start(&scratch, &vessel, id, extra, server);
        let code = bridge.code(0).await;
        let asked = consent(&admin, id).await;
        assert_eq!(
            asked["request"]["code"].as_str(),
            Some(code.as_str()),
            "{asked}"
        );
        let all: Vec<String> = asked["request"]["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        let grant: Vec<String> = match grant {
            Some(grant) => grant.iter().map(|s| (*s).to_owned()).collect(),
            None => all,
        };
        answer_consent(&admin, &asked, &grant).await;
        connected(&admin, id).await;
        let added = admin
            .post(
                "/v1/agents",
                &json!({"name": "agent", "scope": [id], "role": "user"}),
            )
            .await
            .unwrap();
        assert_eq!(added.status, 201, "{added:?}");
        let credential = added.body["credential"].as_str().unwrap().to_owned();
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("http://{mcp}/mcp"))
                .auth_header(credential),
        );
        let client = ().serve(transport).await.unwrap();
        Setup {
            client,
            admin,
            bridge,
            asked,
            id: id.to_owned(),
            scratch,
            vessel,
        }
    }

    fn tool(&self, capability: &str) -> String {
        format!("device__{}__{capability}", self.id.replace('-', "_"))
    }

    /// Calls `capability`; the answer as JSON, and fails if the person is
    /// asked.
    async fn call(&self, capability: &str, input: Value) -> Value {
        let peer = self.client.peer().clone();
        let tool = self.tool(capability);
        let mut call = tokio::spawn(async move { call(&peer, &tool, input).await });
        loop {
            tokio::select! {
                answer = &mut call => return answer.unwrap(),
                // Looks for a prompt every 50 ms while the call runs.
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            assert_eq!(
                approval(&self.admin).await,
                None,
                "the person was asked for {capability}"
            );
        }
    }

    /// Calls `capability`, waits for the person's prompt, checks it shows
    /// exactly `input`, and answers it with `yes`; the answer.
    async fn call_asking(&self, capability: &str, input: Value, yes: bool) -> Value {
        let peer = self.client.peer().clone();
        let tool = self.tool(capability);
        let sent = input.clone();
        let call = tokio::spawn(async move { call(&peer, &tool, sent).await });
        let prompt = eventually("the person's prompt", || async {
            approval(&self.admin).await
        })
        .await;
        assert_eq!(prompt["request"]["capability"], capability, "{prompt}");
        assert_eq!(prompt["request"]["input"], input, "{prompt}");
        let id = prompt["id"].as_u64().unwrap().to_string();
        succeeded(
            &self
                .scratch
                .run(&["approvals", if yes { "allow" } else { "deny" }, &id]),
        );
        tokio::time::timeout(PATIENCE * 3, call)
            .await
            .unwrap()
            .unwrap()
    }
}

/// The approval waiting now, if any.
async fn approval(admin: &AdminClient) -> Option<Value> {
    let pending = admin.get("/v1/pending").await.ok()?.body;
    pending
        .as_array()?
        .iter()
        .find(|p| p["kind"] == "approval")
        .cloned()
}

/// The consent request of `id`, once it is pending.
async fn consent(admin: &AdminClient, id: &str) -> Value {
    eventually(&format!("{id}'s pairing request"), || async {
        let pending = admin.get("/v1/pending").await.ok()?.body;
        pending
            .as_array()?
            .iter()
            .find(|p| p["kind"] == "consent" && p["request"]["deviceId"] == id)
            .cloned()
    })
    .await
}

async fn answer_consent(admin: &AdminClient, asked: &Value, grant: &[String]) {
    let answer = admin
        .post(
            &format!("/v1/pending/{}/consent", asked["id"]),
            &json!({"approved": true, "grant": grant}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 204, "{answer:?}");
}

async fn connected(admin: &AdminClient, id: &str) {
    eventually(&format!("{id} connected"), || async {
        devices(admin)
            .await
            .iter()
            .any(|d| d["id"] == id && d["connected"] == true)
            .then_some(())
    })
    .await;
}

async fn call(client: &rmcp::Peer<RoleClient>, tool: &str, input: Value) -> Value {
    let Value::Object(arguments) = input else {
        panic!("input must be an object: {input}");
    };
    match client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
    {
        Ok(result) => serde_json::to_value(result).unwrap(),
        Err(e) => json!({"isError": true, "content": [{"type": "text", "text": e.to_string()}]}),
    }
}

/// The text of an answer: a refusal's or error's text, or the text blocks
/// of the tool's own answer (the device result's `content`).
fn text(answer: &Value) -> String {
    let blocks = match answer["structuredContent"]["content"].as_array() {
        Some(_) => &answer["structuredContent"]["content"],
        None => &answer["content"],
    };
    blocks
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn is_error(answer: &Value) -> bool {
    answer["isError"] == true
}

/// The capability of the pairing request named `name`.
fn capability<'a>(asked: &'a Value, name: &str) -> &'a Value {
    asked["request"]["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no capability {name}: {asked}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_read_without_asking_and_written_only_as_the_person_saw() {
    let Some(server) = npm_server("files_are_read_without_asking", "server-filesystem") else {
        return;
    };
    let share = tempfile::TempDir::new().unwrap();
    let share_path = share.path().canonicalize().unwrap();
    let note = share_path.join("note.txt");
    std::fs::write(&note, "hello from the share").unwrap();
    let mut server = server;
    server.push(share_path.clone().into_os_string());
    let s = Setup::start("bridge-mcp-files", "files", &[], &server, None).await;

    // The person was shown a sensor that reads and an actuator that asks.
    assert_eq!(s.asked["request"]["kind"], "mcp-server");
    assert_eq!(capability(&s.asked, "read_text_file")["kind"], "sensor");
    assert_eq!(capability(&s.asked, "write_file")["confirm"], true);
    let about = capability(&s.asked, "server_info")["description"]
        .as_str()
        .unwrap();
    assert!(
        about.contains("which says it is secure-filesystem-server"),
        "{about}"
    );

    // A read: no prompt.
    let path = note.to_str().unwrap();
    let read = s.call("read_text_file", json!({"path": path})).await;
    assert!(!is_error(&read), "{read}");
    assert!(text(&read).contains("hello from the share"), "{read}");

    // Input the tool's schema refuses never reaches the person.
    let bad = s.call("write_file", json!({"path": path})).await;
    assert!(is_error(&bad), "{bad}");
    assert!(text(&bad).contains("inputSchema"), "{bad}");

    // A write: the person sees exactly the arguments; a no changes nothing.
    let input = json!({"path": path, "content": "written by the agent"});
    let refused = s.call_asking("write_file", input.clone(), false).await;
    assert!(is_error(&refused), "{refused}");
    assert!(text(&refused).contains("the person said no"), "{refused}");
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "hello from the share"
    );

    // A yes writes exactly what was shown.
    let written = s.call_asking("write_file", input, true).await;
    assert!(!is_error(&written), "{written}");
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "written by the agent"
    );
    drop(share);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_everything_servers_picture_reaches_the_agent_as_image_content() {
    let Some(mut server) = npm_server("the_everything_servers_picture", "server-everything") else {
        return;
    };
    server.push("stdio".into());
    let s = Setup::start("bridge-mcp-everything", "everything", &[], &server, None).await;
    let image = dk_bridge_mcp::capability_name("get-tiny-image");
    let answer = s.call(&image, json!({})).await;
    assert!(!is_error(&answer), "{answer}");
    assert_eq!(answer["content"][0]["type"], "image", "{answer}");
    assert_eq!(answer["content"][0]["mimeType"], "image/png", "{answer}");
    // The sum tool's input schema is checked by the vessel.
    let sum = dk_bridge_mcp::capability_name("get-sum");
    let refused = s.call(&sum, json!({"a": "one", "b": 2})).await;
    assert!(text(&refused).contains("inputSchema"), "{refused}");
    let added = s.call(&sum, json!({"a": 1, "b": 2})).await;
    assert!(text(&added).contains('3'), "{added}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rug_pull_is_blocked_until_the_person_agrees() {
    let control_dir = tempfile::TempDir::new().unwrap();
    let control = control_dir.path().join("control");
    std::fs::write(&control, "honest").unwrap();
    let Some(server) = hostile_server("a_rug_pull_is_blocked_until_the_person_agrees", &control)
    else {
        return;
    };
    std::fs::write(control_dir.path().join("note.txt"), "the note").unwrap();
    let s = Setup::start(
        "bridge-mcp-rug",
        "hostile",
        &[],
        &server,
        Some(&["read_note", "poke"]),
    )
    .await;

    // What could not be carried was left out, and the person was told why.
    let about = capability(&s.asked, "server_info")["description"]
        .as_str()
        .unwrap();
    assert!(
        about.contains(
            "`sneaky` (its description holds control, invisible or bidirectional characters)"
        ),
        "{about}"
    );
    assert!(
        about.contains("`bidi\\u{202e}elif` (its name holds"),
        "{about}"
    );
    // A tool claiming to be read-only and destructive asks every time.
    assert_eq!(capability(&s.asked, "liar")["confirm"], true);

    let read = s.call("read_note", json!({})).await;
    assert_eq!(text(&read), "the note", "{read}");

    // The server changes read_note's description and adds exec.
    std::fs::write(&control, "rug").unwrap();
    let poked = s.call("poke", json!({})).await;
    assert_eq!(text(&poked), "poked", "{poked}");
    let asked = consent(&s.admin, "hostile").await;
    let changes = asked["request"]["replaces"]["changes"].to_string();
    assert!(
        changes.contains("read_note") && changes.contains("description"),
        "{changes}"
    );
    assert!(
        changes.contains("exec") && changes.contains("added"),
        "{changes}"
    );

    // Until the person agrees, nothing of the device can be called, and no
    // agent sees the new description.
    let blocked = s.call("read_note", json!({})).await;
    assert!(is_error(&blocked), "{blocked}");
    let tools = s.client.list_all_tools().await.unwrap();
    assert!(
        tools
            .iter()
            .all(|t| !t.description.as_deref().unwrap_or("").contains("evil")),
        "{tools:?}"
    );

    // The person agrees to read_note only: it works again, exec is not granted.
    let kept = ["read_note".to_owned(), "poke".to_owned()];
    answer_consent(&s.admin, &asked, &kept).await;
    connected(&s.admin, "hostile").await;
    let again = s.call("read_note", json!({})).await;
    assert_eq!(text(&again), "the note", "{again}");
    let exec = s.call("exec", json!({"text": "rm -rf"})).await;
    assert!(is_error(&exec), "{exec}");
    assert_eq!(
        std::fs::read_to_string(control_dir.path().join("note.txt")).unwrap(),
        "the note"
    );

    // A change of an input schema alone, its description the same, is a
    // new manifest too: the person is asked again before anything runs.
    std::fs::write(&control, "schema").unwrap();
    let poked = s.call("poke", json!({})).await;
    assert_eq!(text(&poked), "poked", "{poked}");
    let asked = consent(&s.admin, "hostile").await;
    assert!(asked["request"]["replaces"].is_object(), "{asked}");
    let blocked = s.call("read_note", json!({})).await;
    assert!(is_error(&blocked), "{blocked}");
    answer_consent(&s.admin, &asked, &kept).await;
    connected(&s.admin, "hostile").await;
    let again = s.call("read_note", json!({})).await;
    assert_eq!(text(&again), "the note", "{again}");
    drop(control_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_servers_tricks_each_end_as_defined() {
    let control_dir = tempfile::TempDir::new().unwrap();
    let control = control_dir.path().join("control");
    std::fs::write(&control, "honest").unwrap();
    let Some(server) = hostile_server("a_hostile_servers_tricks_each_end_as_defined", &control)
    else {
        return;
    };
    let note = control_dir.path().join("note.txt");
    std::fs::write(&note, "the note").unwrap();
    let s = Setup::start(
        "bridge-mcp-hostile",
        "hostile",
        &["--call-timeout-ms", "5000"],
        &server,
        None,
    )
    .await;

    let big = s.call("big", json!({})).await;
    assert!(
        is_error(&big) && text(&big).contains("more than 2 MiB"),
        "{big}"
    );
    let deep = s.call("deep", json!({})).await;
    assert!(
        is_error(&deep) && text(&deep).contains("nested deeper"),
        "{deep}"
    );
    let flood = s.call("flood", json!({})).await;
    assert_eq!(text(&flood), "flooded", "{flood}");
    let sample = s.call("sample", json!({})).await;
    assert!(text(&sample).contains("sampling refused"), "{sample}");
    assert!(text(&sample).contains("elicitation refused"), "{sample}");
    let silent = s.call("silent", json!({})).await;
    assert!(
        is_error(&silent) && text(&silent).contains("did not answer within 5 s"),
        "{silent}"
    );
    // The liar asks the person; a no leaves the note.
    let lied = s.call_asking("liar", json!({}), false).await;
    assert!(is_error(&lied), "{lied}");
    assert!(note.is_file());
    // A crash mid-call fails that call; the server is started again.
    let crash = s.call("crash", json!({})).await;
    assert!(
        is_error(&crash) && text(&crash).contains("stopped during the call"),
        "{crash}"
    );
    eventually("the server started again", || async {
        (s.bridge
            .said()
            .matches("listed the MCP server's tools")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    let read = s.call("read_note", json!({})).await;
    assert_eq!(text(&read), "the note", "{read}");
    let info = s.call("server_info", json!({})).await;
    let health = &info["structuredContent"]["health"];
    assert_eq!(health["oversizedMessages"], 1, "{info}");
    assert_eq!(health["tooDeepMessages"], 1, "{info}");
    assert!(
        health["droppedNotifications"].as_u64().unwrap() > 0,
        "{info}"
    );
    assert_eq!(health["refusedRequests"], 2, "{info}");
    assert!(health["starts"].as_u64().unwrap() >= 2, "{info}");
    assert!(!s.bridge.said().contains("panicked"), "{}", s.bridge.said());

    // The audit log says what happened to each call.
    let Setup {
        client,
        vessel,
        scratch,
        bridge,
        ..
    } = s;
    drop(client);
    drop(bridge);
    vessel.interrupt();
    let entries = audit_entries(&scratch.data_dir(), 500);
    let decisions: Vec<String> = entries
        .iter()
        .filter(|e| e["kind"] == "decision")
        .map(Value::to_string)
        .collect();
    let decided = |capability: &str, said: &str| {
        decisions
            .iter()
            .any(|d| d.contains(&format!("\"{capability}\"")) && d.contains(said))
    };
    assert!(decided("big", "more than 2 MiB"), "{decisions:#?}");
    assert!(decided("deep", "nested deeper"), "{decisions:#?}");
    assert!(
        decided("crash", "stopped during the call"),
        "{decisions:#?}"
    );
    assert!(decided("liar", "refused"), "{decisions:#?}");
    drop(control_dir);
}

/// A program of the PyPI MCP servers' virtualenv, when installed.
fn pypi_server(test: &str, program: &str) -> Option<Vec<OsString>> {
    let path = target_dir().join("mcp-peers/python/bin").join(program);
    let found = path.is_file().then(|| vec![path.into_os_string()]);
    dk_testkit::peer_or_skip(test, program, found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_and_git_servers_answer_through_dk() {
    let test = "the_time_and_git_servers_answer_through_dk";
    let (Some(time), Some(mut git)) = (
        pypi_server(test, "mcp-server-time"),
        pypi_server(test, "mcp-server-git"),
    ) else {
        return;
    };
    let s = Setup::start("bridge-mcp-time", "clock", &[], &time, None).await;
    let now = s
        .call("get_current_time", json!({"timezone": "Europe/Paris"}))
        .await;
    assert!(!is_error(&now), "{now}");
    assert!(text(&now).contains("Europe/Paris"), "{now}");
    drop(s);

    // A repository of one commit, read with git_log.
    let repo = tempfile::TempDir::new().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(repo.path())
            .env("GIT_AUTHOR_NAME", "dk")
            .env("GIT_AUTHOR_EMAIL", "dk@example.invalid")
            .env("GIT_COMMITTER_NAME", "dk")
            .env("GIT_COMMITTER_EMAIL", "dk@example.invalid")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init", "-q"]);
    std::fs::write(repo.path().join("a.txt"), "a").unwrap();
    run(&["add", "a.txt"]);
    run(&["commit", "-q", "-m", "the first commit"]);
    git.extend(["--repository".into(), repo.path().as_os_str().to_owned()]);
    let s = Setup::start("bridge-mcp-git", "git", &[], &git, None).await;
    assert_eq!(capability(&s.asked, "git_log")["kind"], "sensor");
    assert_eq!(capability(&s.asked, "git_commit")["confirm"], true);
    let path = repo.path().to_str().unwrap();
    let log = s.call("git_log", json!({"repo_path": path})).await;
    assert!(text(&log).contains("the first commit"), "{log}");
    drop(s);
    drop(repo);
}
