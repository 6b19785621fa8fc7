//! `fleet/calls`: throughput with the audit on disk. Two servers run side by
//! side, each a process of its own (this bench run again with
//! `DK_FLEET_ROLE`), under the same generator, this process:
//!
//! - `echo`: a bare WebSocket echo server (tokio-tungstenite); the generator
//!   holds 1,000 connections and sends 200-byte messages, `IN_FLIGHT` at a
//!   time, each answered by its echo;
//! - `vessel`: a vessel (`VesselServer`, SQLite store on disk, 1,000 rules
//!   none of which names a fleet lamp) whose own agent, in its process as a
//!   vessel author's program hosts one, calls `set_light` on 1,000 dk/2
//!   lamps in turn, `IN_FLIGHT` at a time; the lamps are dk-device clients
//!   in the generator.
//!
//! The load goes to one server at a time, in `ROUNDS` rounds of a block for
//! each, so that both see the machine as it is at that moment. The CPU time
//! of the loaded server over its block is read from `/proc/<pid>/stat`
//! (user plus system, all threads: its rusage) and divided by the block's
//! messages or calls; the vessel's block ends once its audit writer has
//! committed the block's decisions, so their cost is the block's. The
//! medians over the rounds are reported, and the median of each round's
//! ratio. The vessel finally counts the `decision` entries its blocks
//! added: every call must have one.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dk_core::adapter::CallContext;
use dk_http::HttpLimits;
use dk_policy::PolicySet;
use dk_vessel::{Limits, McpListen, VesselServer};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;

use super::common::BoxError;
use super::fleet::{Fleet, Home};

/// Lamps, and echo connections.
const DEVICES: usize = 1_000;
/// Rules the vessel's calls pass.
const RULES: usize = 1_000;
/// Calls (and echoed messages) in flight at once.
const IN_FLIGHT: usize = 64;
/// Calls, and messages, per run.
const CALLS: usize = 200_000;
/// Blocks of each server, in turn.
const ROUNDS: usize = 5;
/// The ratio the vessel's CPU per call may reach against the echo's per
/// message, and the CPU per call.
const RATIO_BUDGET: f64 = 2.0;
const CPU_BUDGET_US: f64 = 10.0;
/// The message the generator echoes: the size of a `set_light` result.
const MESSAGE: &str = r#"{"type":"device:result","callId":"5b0c7c2e-4f1d-4a63-9d55-8f0d2e1e9c11","ok":true,"result":{"on":true,"brightness":40,"colour":"warm white","note":"set by the agent at the person's request, 21:04"}}"#;

/// The role this process plays when the bench started it as a server.
pub fn child_role() -> Option<String> {
    std::env::var("DK_FLEET_ROLE").ok()
}

/// Runs this process as the server `role` names.
pub fn run_child(role: &str) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match role {
        "echo" => runtime.block_on(echo_server()),
        "vessel" => runtime.block_on(vessel_server()),
        other => Err(format!("unknown DK_FLEET_ROLE `{other}`").into()),
    }
}

/// Both servers under the same load in turn, and their comparison.
pub async fn throughput() -> Result<(), BoxError> {
    let home = Home::seed(DEVICES)?;
    let mut echo = EchoSide::start().await?;
    let mut vessel = VesselSide::start(&home).await?;
    let block = CALLS / ROUNDS;
    let (mut echoes, mut calls, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let echoed = echo.block(block).await?;
        let called = vessel.block(block).await?;
        ratios.push(called.cpu_per_item() / echoed.cpu_per_item());
        echoes.push(echoed);
        calls.push(called);
    }
    echo.stop();
    let (count, audited) = vessel.finish().await?;
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let per_message = median(echoes.iter().map(Block::cpu_per_item).collect());
    let per_call = median(calls.iter().map(Block::cpu_per_item).collect());
    let ratio = median(ratios.clone());
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "\nfleet/calls: {CALLS} calls over {DEVICES} dk/2 lamps, {IN_FLIGHT} in flight, past {RULES} rules, audited in SQLite; beside a bare WebSocket echo of {CALLS} messages over {DEVICES} connections; {ROUNDS} rounds of {block} each in turn, medians"
    );
    println!(
        "{:<28}cpu {per_message:>6.2} µs per message   {:.0} messages/s",
        "fleet/calls_echo",
        median(echoes.iter().map(Block::rate).collect())
    );
    println!(
        "{:<28}cpu {per_call:>6.2} µs per call      {:.0} calls/s   {ratio:.2}x the echo (rounds {}; budgets {CPU_BUDGET_US:.0} µs: {}, {RATIO_BUDGET:.0}x: {})",
        "fleet/calls_vessel",
        median(calls.iter().map(Block::rate).collect()),
        shown.join(", "),
        verdict(per_call <= CPU_BUDGET_US),
        verdict(ratio <= RATIO_BUDGET)
    );
    println!(
        "{:<28}{} decisions missing from the audit log of {count} calls once flushed",
        "fleet/calls_audit",
        count.saturating_sub(audited),
    );
    if audited < count {
        return Err("decisions are missing from the audit log".into());
    }
    Ok(())
}

fn verdict(within: bool) -> &'static str {
    if within { "within" } else { "OVER" }
}

/// What one block of load cost its server.
struct Block {
    count: usize,
    cpu: Duration,
    wall: Duration,
}

impl Block {
    fn cpu_per_item(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.count.max(1) as f64
    }

    fn rate(&self) -> f64 {
        self.count as f64 / self.wall.as_secs_f64()
    }
}

/// A server process started from this bench, killed when dropped.
struct Server {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Server {
    fn spawn(role: &str, envs: &[(&str, &Path)]) -> Result<Server, BoxError> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .env("DK_FLEET_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(Server {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// The server's next line on its stdout (blocking: the generator waits
    /// for nothing else meanwhile).
    fn line(&mut self) -> Result<String, BoxError> {
        Ok(self.lines.next().ok_or("the server ended early")??)
    }

    fn say(&mut self, line: &str) -> Result<(), BoxError> {
        writeln!(self.stdin, "{line}")?;
        Ok(self.stdin.flush()?)
    }

    /// User plus system CPU time of the server, all its threads.
    fn cpu(&self) -> Result<Duration, BoxError> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // The fields after the command name, which is in parentheses.
        let rest = stat.rsplit_once(')').ok_or("bad /proc stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line (11 and 12 here),
        // in USER_HZ, which Linux fixes at 100 for /proc.
        let ticks: u64 = fields.get(11).ok_or("no utime")?.parse::<u64>()?
            + fields.get(12).ok_or("no stime")?.parse::<u64>()?;
        Ok(Duration::from_millis(ticks * 10))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The generator's side of the echo: the server and its connections.
struct EchoSide {
    server: Server,
    /// The connections, `IN_FLIGHT` groups of them, one sender each.
    owned: Vec<Vec<Socket>>,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl EchoSide {
    async fn start() -> Result<EchoSide, BoxError> {
        let mut server = Server::spawn("echo", &[])?;
        let address: SocketAddr = tokio::task::block_in_place(|| server.line())?.parse()?;
        let url = format!("ws://{address}/");
        // Each sender owns every IN_FLIGHT-th connection and sends on them
        // in turn, one message at a time.
        let mut owned: Vec<Vec<Socket>> = (0..IN_FLIGHT).map(|_| Vec::new()).collect();
        for i in 0..DEVICES {
            let (socket, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
            if let Some(slot) = owned.get_mut(i % IN_FLIGHT) {
                slot.push(socket);
            }
        }
        Ok(EchoSide { server, owned })
    }

    /// `count` messages echoed, `IN_FLIGHT` at a time.
    async fn block(&mut self, count: usize) -> Result<Block, BoxError> {
        let before = self.server.cpu()?;
        let started = Instant::now();
        let mut senders = JoinSet::new();
        for mut mine in std::mem::take(&mut self.owned) {
            senders.spawn(async move {
                for k in 0..count / IN_FLIGHT {
                    let index = k % mine.len().max(1);
                    let Some(socket) = mine.get_mut(index) else {
                        return Err::<_, BoxError>("no connection".into());
                    };
                    socket.send(Message::text(MESSAGE)).await?;
                    match socket.next().await {
                        Some(Ok(Message::Text(_))) => {}
                        other => return Err(format!("no echo: {other:?}").into()),
                    }
                }
                Ok(mine)
            });
        }
        while let Some(sent) = senders.join_next().await {
            self.owned.push(sent??);
        }
        let wall = started.elapsed();
        let cpu = self.server.cpu()?.saturating_sub(before);
        Ok(Block {
            count: count / IN_FLIGHT * IN_FLIGHT,
            cpu,
            wall,
        })
    }

    fn stop(self) {
        // Dropping the server kills it; the connections just close.
        drop(self.owned);
        drop(self.server);
    }
}

/// A bare WebSocket echo server: prints its address, then echoes every
/// message on every connection.
async fn echo_server() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            while let Some(Ok(message)) = socket.next().await {
                if (message.is_text() || message.is_binary()) && socket.send(message).await.is_err()
                {
                    return;
                }
            }
        });
    }
}

/// The generator's side of the vessel: the vessel and its lamps.
struct VesselSide {
    server: Server,
    lamps: Fleet,
}

impl VesselSide {
    /// Starts the vessel and connects every lamp to it.
    async fn start(home: &Home) -> Result<VesselSide, BoxError> {
        let rules = home.data_dir().with_file_name("rules.yaml");
        std::fs::write(&rules, rules_text(RULES))?;
        let data_dir = home.data_dir();
        let key_file = data_dir.with_file_name("vessel.key");
        let token_file = data_dir.with_file_name("admin-token");
        let mut server = Server::spawn(
            "vessel",
            &[
                ("DK_FLEET_DATA", &data_dir),
                ("DK_FLEET_RULES", &rules),
                ("DK_FLEET_KEY", &key_file),
                ("DK_FLEET_TOKEN", &token_file),
            ],
        )?;
        let port: u16 = tokio::task::block_in_place(|| server.line())?.parse()?;
        let lamps = Fleet::start(home, port)?;
        // The vessel says when it counts every lamp connected.
        let ready = tokio::task::block_in_place(|| server.line())?;
        if ready != "connected" {
            return Err(format!("the vessel said `{ready}`").into());
        }
        Ok(VesselSide { server, lamps })
    }

    /// `count` calls by the vessel's agent, and their decisions committed.
    async fn block(&mut self, count: usize) -> Result<Block, BoxError> {
        let before = self.server.cpu()?;
        self.server.say(&format!("go {count}"))?;
        let done = tokio::task::block_in_place(|| self.server.line())?;
        let cpu = self.server.cpu()?.saturating_sub(before);
        // "done CALLS WALL_NS"
        let mut words = done.split_whitespace().skip(1);
        let made: usize = words.next().ok_or("no count")?.parse()?;
        let wall = Duration::from_nanos(words.next().ok_or("no time")?.parse()?);
        Ok(Block {
            count: made,
            cpu,
            wall,
        })
    }

    /// Ends the run: the calls made and the decisions the log gained.
    async fn finish(mut self) -> Result<(usize, usize), BoxError> {
        self.server.say("end")?;
        let line = tokio::task::block_in_place(|| self.server.line())?;
        // "audited CALLS DECISIONS"
        let mut words = line
            .strip_prefix("audited ")
            .ok_or_else(|| format!("the vessel said `{line}`"))?
            .split_whitespace();
        let count: usize = words.next().ok_or("no count")?.parse()?;
        let audited: usize = words.next().ok_or("no decisions")?.parse()?;
        self.lamps.stop().await?;
        Ok((count, audited))
    }
}

/// `calls` calls by the vessel's agent, `IN_FLIGHT` at a time, each to the
/// next lamp in turn from the `made`-th on.
async fn call_block(
    vessel: &Arc<dk_vessel::Vessel>,
    tools: &Arc<Vec<String>>,
    calls: usize,
    made: usize,
) -> Result<usize, BoxError> {
    let mut callers = JoinSet::new();
    for w in 0..IN_FLIGHT {
        let vessel = Arc::clone(vessel);
        let tools = Arc::clone(tools);
        callers.spawn(async move {
            let mut mine = 0usize;
            for k in 0..calls / IN_FLIGHT {
                let tool = tools
                    .get((made + k * IN_FLIGHT + w) % DEVICES)
                    .ok_or("no tool")?;
                let outcome = vessel
                    .adapter()
                    .execute(
                        tool,
                        json!({"on": true, "brightness": 40}),
                        CallContext::default(),
                    )
                    .await;
                if !outcome.is_ok() {
                    return Err::<usize, BoxError>(
                        format!("a call failed: {:?}", outcome.reason()).into(),
                    );
                }
                mine += 1;
            }
            Ok(mine)
        });
    }
    let mut count = 0;
    while let Some(mine) = callers.join_next().await {
        count += mine??;
    }
    Ok(count)
}

/// `count` rules, block, require_approval and allow in turn, none naming a
/// fleet lamp: every call is checked against all of them.
fn rules_text(count: usize) -> String {
    let mut text = String::from("version: 1\npolicies:\n");
    let decisions = ["block", "require_approval", "allow"];
    for i in 0..count {
        let decision = decisions.get(i % 3).copied().unwrap_or("block");
        text.push_str(&format!(
            "  - name: rule-{i}\n    action: device_use\n    condition: \"deviceId equals other-{i} and capabilityKind equals actuator\"\n    decision: {decision}\n    message: rule {i}\n"
        ));
    }
    text
}

fn env_path(key: &str) -> Result<PathBuf, BoxError> {
    std::env::var_os(key)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{key} is not set").into())
}

/// The vessel: its own agent calls the lamps once they are all connected
/// and it is told to go.
async fn vessel_server() -> Result<(), BoxError> {
    let data_dir = env_path("DK_FLEET_DATA")?;
    let policies =
        PolicySet::from_yaml_str(&std::fs::read_to_string(env_path("DK_FLEET_RULES")?)?)?;
    let limits = Limits {
        max_connections: 40_000,
        max_connections_per_address: 40_000,
        max_frames_per_second: 1_000_000,
        // The host's own agent, at the full speed of the run.
        rate_limits: None,
        run_limits: None,
        ..Limits::default()
    };
    let running = VesselServer::new(&data_dir)
        .listen(SocketAddr::from(([127, 0, 0, 1], 0)))
        .admin_listen(None)
        .mcp_listen(McpListen::Off)
        .unix_sockets(false)
        .address_file(false)
        .admin_token_file(env_path("DK_FLEET_TOKEN")?)
        .vessel_key_file(env_path("DK_FLEET_KEY")?)
        .policies(policies)
        .limits(limits)
        .http_limits(HttpLimits::default())
        .start()
        .await?;
    println!("{}", running.device_addr().port());
    std::io::stdout().flush()?;
    let vessel = Arc::clone(running.vessel());
    let deadline = Instant::now() + super::fleet::PATIENCE;
    let connected = |vessel: &dk_vessel::Vessel| {
        vessel
            .registry()
            .list()
            .iter()
            .filter(|d| vessel.links().is_connected(d.device.manifest().id()))
            .count()
    };
    while connected(&vessel) < DEVICES {
        if Instant::now() > deadline {
            return Err("the lamps did not all connect".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("connected");
    std::io::stdout().flush()?;
    vessel.flush_audit()?;
    let head = vessel.registry().store().audit_head()?.seq;
    let tools: Arc<Vec<String>> = Arc::new(
        (0..DEVICES)
            .map(|i| format!("device__{}__set_light", super::fleet::device_id(i)))
            .collect(),
    );
    // Blocks of calls as the generator asks ("go N"), until "end".
    let mut count = 0;
    loop {
        let mut line = String::new();
        tokio::task::block_in_place(|| std::io::stdin().read_line(&mut line))?;
        let Some(calls) = line.trim().strip_prefix("go ") else {
            break;
        };
        let calls: usize = calls.parse()?;
        let started = Instant::now();
        let made = call_block(&vessel, &tools, calls, count).await?;
        // The block's decisions committed are part of its cost.
        vessel.flush_audit()?;
        let wall = started.elapsed();
        count += made;
        println!("done {made} {}", wall.as_nanos());
        std::io::stdout().flush()?;
    }

    vessel.flush_audit()?;
    let store = vessel.registry().store();
    let mut audited = 0;
    let mut after = head;
    loop {
        let page = store.read_audit(after, 10_000)?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        audited += page.iter().filter(|e| e.kind == "decision").count();
    }
    println!("audited {count} {audited}");
    std::io::stdout().flush()?;
    running.stop().await?;
    Ok(())
}
