//! `dk vessel`'s `/metrics` scraped by Debian's Prometheus, as an operator
//! would: a scrape job with the admin token as its bearer credentials file,
//! another on `--metrics-listen` without it, both targets up, and what
//! Prometheus' query API answers matching what the vessel did; `promtool
//! check metrics` finds nothing to say about the exposition's names.
//!
//! Without Prometheus the test says so and passes, unless
//! `DK_REQUIRE_PEERS` is set (`cargo xtask ci` sets it, after `cargo xtask
//! peers` installed it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::process::{Killed, PATIENCE, Running, Scratch, approve_when_asked, hello};

/// Where Debian's package puts the server and its tool.
const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

/// How many refused calls the test makes.
const CALLS: u64 = 3;

/// Whether Prometheus is here; a missing one fails the test when peers are
/// required.
fn prometheus_or_skip(test: &str) -> bool {
    let found = (Path::new(PROMETHEUS).is_file() && Path::new(PROMTOOL).is_file()).then_some(());
    dk_testkit::peer_or_skip(test, "prometheus", found).is_some()
}

/// A Prometheus scraping `/metrics` every second: job `dk` on `target`
/// with the token in `token_file`, job `dk_open` on `open` without it; its
/// configuration and data under `dir`, killed on drop; and the address of
/// its HTTP API.
fn prometheus(
    dir: &Path,
    (target, token_file): (SocketAddr, &Path),
    open: SocketAddr,
) -> (Killed, SocketAddr) {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: dk\n    metrics_path: /metrics\n\
             \x20   authorization:\n      type: Bearer\n      credentials_file: {}\n\
             \x20   static_configs:\n      - targets: ['{target}']\n\
             \x20 - job_name: dk_open\n    static_configs:\n      - targets: ['{open}']\n",
            token_file.display()
        ),
    )
    .unwrap();
    let api = SocketAddr::from(([127, 0, 0, 1], dk_testkit::free_port()));
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={api}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.err")).unwrap())
        .spawn()
        .unwrap();
    (Killed(child), api)
}

/// `GET path` on `addr` over HTTP/1.0 (no chunks), with a bearer token if
/// given: the status and the body.
pub(crate) fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The value Prometheus' query API gives for `query`, once it has one.
fn query(api: SocketAddr, query: &str) -> Option<String> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = get(api, &format!("/api/v1/query?query={encoded}"), None)?;
    if status != 200 {
        return None;
    }
    let answer: Value = serde_json::from_str(&body).ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()
        .map(str::to_owned)
}

/// Polls Prometheus until `query` gives `expected`; what it had and what
/// it said on stderr are printed if it never does.
#[track_caller]
fn wait_for(api: SocketAddr, what: &str, expected: &str, dir: &Path) {
    let mut last = None;
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dk_testkit::eventually_blocking(&format!("{what} = {expected} in Prometheus"), || {
            last = query(api, what);
            last.as_deref() == Some(expected)
        });
    }));
    if let Err(failed) = found {
        let said = std::fs::read_to_string(dir.join("prometheus.err")).unwrap_or_default();
        eprintln!("{what}: Prometheus has {last:?}, not {expected}\n{said}");
        std::panic::resume_unwind(failed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_vessel_with_the_admin_token() {
    if !prometheus_or_skip("prometheus_scrapes_the_vessel_with_the_admin_token") {
        return;
    }
    let scratch = Scratch::new("prometheus");
    let vessel = Running::start_with(&scratch, &["--metrics-listen", "127.0.0.1:0"]);
    let open: SocketAddr = vessel
        .said("/metrics (no token")
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("metrics on")?
                .trim()
                .strip_prefix("http://")
        })
        .and_then(|l| l.split('/').next()?.parse().ok())
        .unwrap();
    let admin = vessel.admin(&scratch);
    // A device paired, and calls the vessel refuses: tools of no device.
    let manifest = crate::process::lamp_manifest("lamp-1");
    let url = vessel.url();
    let pairing = tokio::spawn(async move { hello(&url, &manifest).await });
    approve_when_asked(&admin, "lamp-1", &["read_light"]).await;
    let _device = pairing.await.unwrap().unwrap();
    for _ in 0..CALLS {
        let answer = admin
            .post(
                "/v1/tools/call",
                &json!({"tool": "device__nobody__read", "input": {}}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body["ok"], false, "{answer:?}");
    }

    let dir = scratch.root().join("prometheus");
    std::fs::create_dir(&dir).unwrap();
    let token_file = scratch.admin_token_file();
    let (_prometheus, api) = prometheus(&dir, (vessel.admin, &token_file), open);
    wait_for(api, "up{job=\"dk\"}", "1", &dir);
    wait_for(api, "up{job=\"dk_open\"}", "1", &dir);
    wait_for(
        api,
        "dk_calls_total{job=\"dk_open\",kind=\"unknown\",decision=\"denied\"}",
        &CALLS.to_string(),
        &dir,
    );
    wait_for(
        api,
        "dk_calls_total{job=\"dk\",kind=\"unknown\",decision=\"denied\"}",
        &CALLS.to_string(),
        &dir,
    );
    wait_for(api, "dk_devices_paired", "1", &dir);
    wait_for(
        api,
        "dk_calls_total{kind=\"sensor\",decision=\"allowed\"}",
        "0",
        &dir,
    );

    // Without the token the vessel answers no scraper.
    let (status, _) = get(vessel.admin, "/metrics", None).unwrap();
    assert_eq!(status, 401);
    // The metrics listener answers nothing but /metrics.
    let token = scratch.admin_token();
    let (status, _) = get(open, "/v1/status", Some(token.expose())).unwrap();
    assert_eq!(status, 404);
    // The exposition follows Prometheus' naming conventions.
    let (status, text) = get(vessel.admin, "/metrics", Some(token.expose())).unwrap();
    assert_eq!(status, 200, "{text}");
    let mut promtool = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}
