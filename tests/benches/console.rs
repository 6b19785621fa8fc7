//! The person's console, measured from outside:
//!
//! - `console/page/console/...`: each page served over loopback, under the
//!   console's secret path (shown without it) (the request, the
//!   store's read, the server-side rendering) by a vessel with 1,000
//!   paired devices, 100,000 audit entries and 16 prompts waiting, in a
//!   SQLite store; median and p90 of 51 requests after a warm-up.
//! - `console/prompt_to_dom`: a new approval, from the moment the vessel
//!   is asked to the moment an open console in headless Chromium has its
//!   card in the DOM (a MutationObserver stamps it with the page's clock,
//!   the same wall clock the vessel reads); median of 30.
//!
//! Run with `cargo xtask bench console` (or `cargo bench -p dk-tests
//! --bench console`); needs Debian's chromium and chromium-driver
//! (`cargo xtask peers`). Times are reported, never asserted on.

#[path = "../it/browser.rs"]
#[allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "the browser tests' own helper: the bench uses part of it, and a failure there ends the run"
)]
mod browser;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dk_core::adapter::{ApprovalRequest, Approver};
use dk_http::{AdminToken, Console, serve_admin};
use dk_policy::PolicySet;
use dk_store::{AuditEvent, SqliteStore, Store, StoredPairing};
use dk_vessel::{Limits, Vessel};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DEVICES: usize = 1_000;
const AUDIT_ENTRIES: usize = 100_000;
const WAITING: usize = 16;
const SAMPLES: usize = 51;
const PROMPTS: usize = 30;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty()
        && !filter
            .iter()
            .any(|f| "console/".contains(f.as_str()) || f.starts_with("console"))
    {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run())
}

fn lamp(n: usize) -> Result<serde_json::Value, BoxError> {
    let mut manifest = dk_testkit::lamp();
    let fields = manifest.as_object_mut().ok_or("the lamp is an object")?;
    fields.insert("id".to_owned(), json!(format!("lamp-{n:04}")));
    fields.insert("name".to_owned(), json!(format!("Lamp {n}")));
    Ok(manifest)
}

/// A store holding the devices and the log.
fn fill(store: &SqliteStore) -> Result<(), BoxError> {
    for n in 0..DEVICES {
        let manifest = dk_proto::validate_manifest(&lamp(n)?)?;
        let id = manifest.id().to_owned();
        let pairing = StoredPairing {
            device_id: id.clone(),
            manifest_json: manifest.to_json(),
            digest: manifest.digest(),
            token_hash: [n as u8; 32],
            device_key: None,
            grants: vec!["read_light".to_owned()],
            generation: n as u64 + 1,
            paired_at_ms: 1_800_000_000_000,
        };
        let audit = AuditEvent {
            at_ms: 1_800_000_000_000,
            kind: "paired".to_owned(),
            entry: json!({"deviceId": id, "grants": ["read_light"]}),
        };
        store.put_pairing(&pairing, &audit)?;
    }
    let mut batch = Vec::with_capacity(1000);
    for n in DEVICES..AUDIT_ENTRIES {
        batch.push(AuditEvent {
            at_ms: 1_800_000_000_000 + n as u64,
            kind: "decision".to_owned(),
            entry: json!({
                "tool": "device__lamp__read_light",
                "deviceId": format!("lamp-{:04}", n % DEVICES),
                "agentId": format!("agent-{}", n % 7),
                "allowed": n % 10 != 0,
                "reason": if n % 10 != 0 { "allowed" } else { "[policy] refused by rule" },
            }),
        });
        if batch.len() == 1000 {
            store.append_audit(&batch)?;
            batch.clear();
        }
    }
    store.append_audit(&batch)?;
    Ok(())
}

async fn get(addr: SocketAddr, path: &str, cookie: &str) -> Result<(u16, usize), BoxError> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncookie: {cookie}\r\nconnection: close\r\n\r\n",
        addr.port()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let status = std::str::from_utf8(answer.get(9..12).ok_or("a short answer")?)?.parse()?;
    Ok((status, answer.len()))
}

fn median_p90(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |share: usize| {
        samples
            .get(samples.len() * share / 10)
            .copied()
            .unwrap_or_default()
    };
    (at(5), at(9))
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn run() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(&dir.path().join("vessel.db"))?;
    let filling = Instant::now();
    fill(&store)?;
    eprintln!(
        "console: {DEVICES} devices and {AUDIT_ENTRIES} audit entries stored in {:.1} s",
        filling.elapsed().as_secs_f64()
    );
    let vessel = Vessel::open(Arc::new(store), PolicySet::empty(), Limits::default())?;
    eprintln!("console: {} devices paired", vessel.registry().list().len());
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let console = Console::new();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_admin(
        listener,
        Arc::clone(&vessel),
        AdminToken::generate(),
        Arc::clone(&console),
        async move {
            let _ = stopped.await;
        },
    ));
    for n in 0..WAITING {
        let person = Arc::clone(vessel.person());
        tokio::spawn(async move {
            let _ = person.approve(approval(n, "waiting")).await;
        });
    }
    while vessel.person().pending().len() < WAITING {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Sign in as a browser would.
    let link = console.login_link().ok_or("no link")?;
    let path = &link[link.find("/console/").ok_or("link")?..];
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!(
                "GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\nconnection: close\r\n\r\n",
                addr.port()
            )
            .as_bytes(),
        )
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let cookie = answer
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .ok_or("no cookie")?
        .to_owned();

    let prefix = &path[..path.find("/login").ok_or("link")?];
    let pages = [
        "/",
        "/devices",
        "/devices/lamp-0500",
        "/agents",
        "/status",
        "/audit",
        "/audit?before=50000",
        "/audit?device=lamp-0500",
        "/audit?agent=agent-3&decision=refused",
    ];
    for page in pages {
        let url = &format!("{prefix}{page}");
        for _ in 0..5 {
            get(addr, url, &cookie).await?;
        }
        let mut samples = Vec::with_capacity(SAMPLES);
        let mut bytes = 0;
        for _ in 0..SAMPLES {
            let started = Instant::now();
            let (status, size) = get(addr, url, &cookie).await?;
            samples.push(started.elapsed());
            if status != 200 {
                return Err(format!("{page}: status {status}").into());
            }
            bytes = size;
        }
        let (median, p90) = median_p90(samples);
        println!(
            "console/page/console{page:<40} median {:>9}   p90 {:>9}   {} KiB",
            ms(median),
            ms(p90),
            bytes / 1024
        );
    }

    // A prompt, from the vessel to an open console's DOM.
    let browser = browser::Browser::start(1280, 900).await;
    browser
        .client
        .goto(&console.login_link().ok_or("link")?)
        .await?;
    browser.wait_text("h1", "Waiting for you").await;
    for prompt in vessel.person().pending() {
        let _ = vessel.person().answer_approval(prompt.id, false);
    }
    browser.wait_gone(".prompt").await;
    browser
        .run(
            "window.seen = {}; new MutationObserver(function (changes) { \
               const at = performance.timeOrigin + performance.now(); \
               for (const change of changes) for (const node of change.addedNodes) \
                 if (node.id && node.id.startsWith('prompt-')) window.seen[node.id] = at; \
             }).observe(document.getElementById('prompts'), {childList: true}); return 1;",
        )
        .await;
    let mut samples = Vec::with_capacity(PROMPTS);
    for n in 0..PROMPTS {
        let person = Arc::clone(vessel.person());
        let asked = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64() * 1000.0;
        tokio::spawn(async move {
            let _ = person.approve(approval(n, "timed")).await;
        });
        let id = loop {
            if let Some(p) = vessel.person().pending().first() {
                break p.id;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let key = format!("prompt-{id}");
        let shown = loop {
            let seen = browser.run("return window.seen;").await;
            if let Some(at) = seen.get(&key).and_then(serde_json::Value::as_f64) {
                break at;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        samples.push(Duration::from_secs_f64(((shown - asked) / 1000.0).max(0.0)));
        let _ = vessel.person().answer_approval(id, false);
        browser.wait_gone(".prompt").await;
    }
    let (median, p90) = median_p90(samples);
    println!(
        "console/prompt_to_dom                                          median {:>9}   p90 {:>9}",
        ms(median),
        ms(p90)
    );
    browser.quit().await;
    let _ = stop.send(());
    let _ = server.await;
    Ok(())
}

fn approval(n: usize, why: &str) -> ApprovalRequest {
    ApprovalRequest {
        tool: "device__lamp_0001__strobe".to_owned(),
        device_id: "lamp-0001".to_owned(),
        capability: "strobe".to_owned(),
        input: json!({"n": n}).as_object().cloned().unwrap_or_default(),
        reason: format!("{why}: asks every time"),
        agent_id: Some(format!("agent-{}", n % 7)),
        session_id: None,
        channel: dk_proto::Channel::Dk2,
        microphone: None,
    }
}
