//! What putting an MCP server behind dk costs (`cargo xtask bench gate`, or
//! `cargo bench -p dk --bench gate`): the same rmcp client calls a tool of
//! the official everything server directly over stdio, and through dk (the
//! agent over MCP HTTP to a real `dk vessel`, dk/2 to `dk bridge mcp`,
//! stdio to the server):
//!
//! - `gate/echo_direct` and `gate/echo_through_dk`: `echo`, median of
//!   1,000 calls each, and what dk adds (the budget: 1 ms).
//! - `gate/500k_direct` and `gate/500k_through_dk`: the official
//!   filesystem server's `read_text_file` of a 500 KiB file, median of 100
//!   calls each, and their ratio (budget: 2x). The vessel returns results
//!   of up to 2 MiB whole (`--mcp-read-more-threshold`), so the agent gets
//!   the whole file in one answer both ways.
//!
//! The servers are the ones `cargo xtask peers` installs under the target
//! directory; without them the bench says so and measures nothing. Times
//! are reported, never asserted on.

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BoxError, Killed, median};

use dk_http::{AdminClient, AdminToken};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

/// Calls of `echo` measured each way.
const ECHO_RUNS: usize = 1_000;
/// Reads of the 500 KiB file measured each way.
const BIG_RUNS: usize = 100;
/// Calls made first each way, unmeasured.
const WARM_UP: usize = 20;
/// The file read: 500 KiB of text.
const BIG_BYTES: usize = 500 * 1024;
const PATIENCE: Duration = Duration::from_secs(60);
/// The budgets.
const ECHO_BUDGET: Duration = Duration::from_millis(1);
const BIG_RATIO_BUDGET: f64 = 2.0;

/// No rate limit on the agent, whose calls follow each other as fast as
/// they end.
const CONFIG: &str = "[rateLimits]\ncallsPerMinute = 0\nperDeviceCallsPerMinute = 0\n";

fn main() -> Result<(), BoxError> {
    // `cargo xtask bench` without a filter runs it only when named.
    if std::env::var_os("DK_GATE_SKIP").is_some() {
        return Ok(());
    }
    common::main("gate", run)
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() && Path::new(&dir).is_absolute() => PathBuf::from(dir),
        Some(dir) if !dir.is_empty() => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// `node` and the entry point of the npm server `package`, when installed.
fn npm_server(package: &str) -> Option<Vec<OsString>> {
    let entry = target_dir()
        .join("mcp-peers/node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .into_iter()
        .find(|p| Path::new(p).is_file())?;
    entry
        .is_file()
        .then(|| vec![OsString::from(node), entry.into_os_string()])
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn call(
    client: &rmcp::Peer<RoleClient>,
    tool: &str,
    input: &Value,
) -> Result<Value, BoxError> {
    let Value::Object(arguments) = input.clone() else {
        return Err("input must be an object".into());
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await?;
    let answer = serde_json::to_value(result)?;
    if answer.get("isError") == Some(&json!(true)) {
        return Err(format!("{tool} failed: {answer}").into());
    }
    Ok(answer)
}

/// The median of `runs` calls of `tool` with `input`, after the warm-up;
/// each answer must hold at least `least` bytes of JSON.
async fn measure(
    client: &rmcp::Peer<RoleClient>,
    tool: &str,
    input: &Value,
    runs: usize,
    least: usize,
) -> Result<Duration, BoxError> {
    let mut samples = Vec::with_capacity(runs);
    for i in 0..WARM_UP + runs {
        let start = Instant::now();
        let answer = call(client, tool, input).await?;
        let took = start.elapsed();
        if i == 0 && answer.to_string().len() < least {
            return Err(format!(
                "{tool} answered {} bytes, fewer than {least}",
                answer.to_string().len()
            )
            .into());
        }
        if i >= WARM_UP {
            samples.push(took);
        }
    }
    Ok(median(samples))
}

/// An rmcp client over a child's stdio: the server started directly.
async fn direct(
    server: &[OsString],
) -> Result<
    (
        rmcp::service::RunningService<RoleClient, ()>,
        tokio::process::Child,
    ),
    BoxError,
> {
    let (program, args) = server.split_first().ok_or("no command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let (stdin, stdout) = (
        child.stdin.take().ok_or("stdin")?,
        child.stdout.take().ok_or("stdout")?,
    );
    let client = ().serve((stdout, stdin)).await?;
    Ok((client, child))
}

async fn run() -> Result<(), BoxError> {
    let (Some(mut everything), Some(mut files)) = (
        npm_server("server-everything"),
        npm_server("server-filesystem"),
    ) else {
        println!(
            "gate/                        skipped: the MCP servers are not installed (cargo xtask peers)"
        );
        return Ok(());
    };
    everything.push("stdio".into());
    let home = tempfile::Builder::new()
        .prefix("dk-bench-gate-")
        .tempdir()?;
    let share = home.path().join("share");
    std::fs::create_dir(&share)?;
    let share = share.canonicalize()?;
    let big = share.join("big.txt");
    let line = "dk gate bench: a line of a file of five hundred kibibytes of plain text.\n";
    std::fs::write(
        &big,
        line.repeat(BIG_BYTES / line.len() + 1)
            .get(..BIG_BYTES)
            .unwrap_or_default(),
    )?;
    files.push(share.clone().into_os_string());
    let echo_input = json!({"message": "hello"});
    let big_input = json!({"path": big.to_str().ok_or("path")?});

    // Directly.
    let (client, _child) = direct(&everything).await?;
    let echo_direct = measure(client.peer(), "echo", &echo_input, ECHO_RUNS, 10).await?;
    drop(client);
    let (client, _child) = direct(&files).await?;
    let big_direct = measure(
        client.peer(),
        "read_text_file",
        &big_input,
        BIG_RUNS,
        BIG_BYTES,
    )
    .await?;
    drop(client);

    // Through dk.
    let dk = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dk"));
        command
            .args(args)
            .env("DK_HOME", home.path())
            .current_dir(home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    };
    let config = home.path().join("vessel.toml");
    std::fs::write(&config, CONFIG)?;
    let _vessel = Killed(
        dk(&["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
            .arg("--config")
            .arg(&config)
            .args([
                "--admin-listen",
                "127.0.0.1:0",
                "--mcp-listen",
                "127.0.0.1:0",
            ])
            .args(["--mcp-read-more-threshold", "2097152"])
            .spawn()?,
    );
    let data_dir = home.path().join("vessel");
    let address: Value = wait_for("the vessel's address", || async {
        let text = std::fs::read_to_string(data_dir.join("vessel.json")).ok()?;
        serde_json::from_str(&text).ok()
    })
    .await?;
    let field = |key: &str| {
        address
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("vessel.json has no {key}"))
    };
    let (devices, mcp) = (field("devices")?, field("mcp")?);
    let admin = AdminClient::over_socket(
        data_dir.join("admin.sock"),
        AdminToken::read_from(&home.path().join("admin-token"))?,
    );
    let vessel_url = format!("ws://{devices}/device");
    let mut bridges = Vec::new();
    for (id, server, grant) in [
        ("everything", &everything, "echo"),
        ("files", &files, "read_text_file"),
    ] {
        bridges.push(Killed(
            dk(&["bridge", "mcp", "--id", id, "--vessel", &vessel_url, "--"])
                .args(server)
                .spawn()?,
        ));
        let consent = wait_for(&format!("{id}'s pairing request"), || async {
            let pending = admin.get("/v1/pending").await.ok()?.body;
            pending.as_array()?.iter().find_map(|p| {
                (p.get("kind") == Some(&json!("consent"))
                    && p.pointer("/request/deviceId") == Some(&json!(id)))
                .then(|| p.get("id").and_then(Value::as_u64))
                .flatten()
            })
        })
        .await?;
        let answer = admin
            .post(
                &format!("/v1/pending/{consent}/consent"),
                &json!({"approved": true, "grant": [grant]}),
            )
            .await?;
        if answer.status != 204 {
            return Err(format!("the pairing was refused: {answer:?}").into());
        }
        wait_for(&format!("{id} connected"), || async {
            let list = admin.get("/v1/devices").await.ok()?.body;
            list.as_array()?
                .iter()
                .any(|d| {
                    d.get("id") == Some(&json!(id)) && d.get("connected") == Some(&json!(true))
                })
                .then_some(())
        })
        .await?;
    }
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "bench", "scope": ["everything", "files"], "role": "user"}),
        )
        .await?;
    let credential = added
        .body
        .get("credential")
        .and_then(Value::as_str)
        .ok_or("no credential")?
        .to_owned();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("http://{mcp}/mcp"))
            .auth_header(credential),
    );
    let agent = ().serve(transport).await?;
    let echo_dk = measure(
        agent.peer(),
        "device__everything__echo",
        &echo_input,
        ECHO_RUNS,
        10,
    )
    .await?;
    let big_dk = measure(
        agent.peer(),
        "device__files__read_text_file",
        &big_input,
        BIG_RUNS,
        BIG_BYTES,
    )
    .await?;

    let added_by_dk = echo_dk.saturating_sub(echo_direct);
    println!(
        "gate/echo_direct              median {:>12}   ({ECHO_RUNS} calls)",
        ms(echo_direct)
    );
    println!(
        "gate/echo_through_dk          median {:>12}   dk adds {}   budget {}: {}",
        ms(echo_dk),
        ms(added_by_dk),
        ms(ECHO_BUDGET),
        if added_by_dk <= ECHO_BUDGET {
            "within"
        } else {
            "OVER"
        }
    );
    let ratio = big_dk.as_secs_f64() / big_direct.as_secs_f64().max(1e-9);
    println!(
        "gate/500k_direct              median {:>12}   ({BIG_RUNS} reads)",
        ms(big_direct)
    );
    println!(
        "gate/500k_through_dk          median {:>12}   {ratio:.2}x direct   budget {BIG_RATIO_BUDGET}x: {}",
        ms(big_dk),
        if ratio <= BIG_RATIO_BUDGET {
            "within"
        } else {
            "OVER"
        }
    );
    drop(agent);
    drop(bridges);
    Ok(())
}
