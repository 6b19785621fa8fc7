//! `/healthz` and `/readyz` over real sockets, against a vessel serving its
//! device and admin listeners on an SQLite store whose faults the tests
//! switch on.

use std::net::SocketAddr;
use std::sync::Arc;

use dk_policy::PolicySet;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::Console;
use crate::admin::{AdminToken, serve_admin};
use crate::server::serve_devices;
use crate::store::testing::{FaultyStore, Writes};
use crate::store::{SqliteStore, Store};
use crate::vessel::{Limits, Vessel};

struct Running {
    vessel: Arc<Vessel>,
    store: Arc<FaultyStore>,
    admin: SocketAddr,
    token: AdminToken,
    stop_devices: Option<oneshot::Sender<()>>,
    devices: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

/// A vessel on an SQLite store, serving `/device` and the admin API on
/// loopback, once both listeners accept.
async fn start() -> Running {
    start_with(Limits::default()).await
}

/// [`start`] with `limits`.
async fn start_with(limits: Limits) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("data").join("dk.db")).unwrap();
    let store = Arc::new(FaultyStore::over(sqlite));
    let shared: Arc<dyn Store> = Arc::clone(&store) as Arc<dyn Store>;
    let vessel = Vessel::open(shared, PolicySet::empty(), limits).unwrap();
    let devices = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop_devices, stopped) = oneshot::channel::<()>();
    let devices = tokio::spawn(serve_devices(devices, Arc::clone(&vessel), async {
        let _ = stopped.await;
    }));
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = admin.local_addr().unwrap();
    let token = AdminToken::generate();
    tokio::spawn(serve_admin(
        admin,
        Arc::clone(&vessel),
        token.clone(),
        Console::new(),
        std::future::pending(),
    ));
    let running = Running {
        vessel,
        store,
        admin: addr,
        token,
        stop_devices: Some(stop_devices),
        devices,
        _dir: dir,
    };
    dk_testkit::eventually_async("the listeners serving", || async {
        (get(running.admin, "/readyz", None).await.0 == 200).then_some(())
    })
    .await;
    running
}

/// `GET path` on a fresh connection, with `Host` naming no listener of
/// the vessel's (as a load balancer's probe may) and `authorization` if
/// given: the status and the body as JSON. A health answer must not be
/// cached.
async fn get(addr: SocketAddr, path: &str, authorization: Option<&str>) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: lb.example\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    if !path.starts_with("/v1/") {
        assert!(
            head.to_ascii_lowercase()
                .contains("cache-control: no-store"),
            "{head}"
        );
    }
    (status, serde_json::from_str(body).unwrap())
}

#[tokio::test]
async fn a_healthy_vessel_is_alive_and_ready_to_anyone() {
    let running = start().await;
    let bearer = format!("Bearer {}", running.token.expose());
    for auth in [None, Some("Bearer 1234"), Some(bearer.as_str())] {
        assert_eq!(
            get(running.admin, "/healthz", auth).await,
            (200, json!({"status": "alive"}))
        );
        assert_eq!(
            get(running.admin, "/readyz", auth).await,
            (200, json!({"status": "ready"}))
        );
    }
    // HEAD answers too, with the status alone.
    let mut stream = TcpStream::connect(running.admin).await.unwrap();
    stream
        .write_all(b"HEAD /readyz HTTP/1.1\r\nHost: lb.example\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.ends_with("\r\n\r\n"), "{answer}");
    // The rest of the API still has its guard.
    assert_eq!(get(running.admin, "/v1/status", Some(&bearer)).await.0, 403);
}

#[tokio::test]
async fn a_store_that_refuses_writes_makes_the_vessel_not_ready_but_alive() {
    let running = start().await;
    let entries = running.store.load().unwrap().audit_entries;
    // The writer's probe fails: within the durability bound the store is
    // found not to take writes, as calls find it.
    running.store.fail(Writes::Pairings, true);
    let not_ready = json!({"status": "not ready", "failing": ["store"]});
    dk_testkit::eventually_async("the store found failing", || async {
        (get(running.admin, "/readyz", None).await.0 == 503).then_some(())
    })
    .await;
    // A call now is refused before any check, as the audit log cannot be
    // written: /readyz and the call path agree.
    let outcome = running
        .vessel
        .adapter()
        .execute(
            "device__desk_lamp__read_light",
            json!({}),
            crate::adapter::CallContext::default(),
        )
        .await;
    let crate::adapter::ToolOutcome::Refused { reason } = outcome else {
        panic!("called while the store takes no write");
    };
    assert_eq!(reason, dk_proto::Refusal::AuditFailing.to_string());
    for auth in [None, Some("Bearer 1234")] {
        assert_eq!(
            get(running.admin, "/readyz", auth).await,
            (503, not_ready.clone())
        );
        assert_eq!(
            get(running.admin, "/healthz", auth).await,
            (200, json!({"status": "alive"}))
        );
    }
    running.store.fail(Writes::Pairings, false);
    dk_testkit::eventually_async("the store taking writes again", || async {
        (get(running.admin, "/readyz", None).await == (200, json!({"status": "ready"})))
            .then_some(())
    })
    .await;
    // The probes wrote no audit entry: the log holds only the refused
    // call's decision more.
    running.vessel.flush_audit().unwrap();
    assert_eq!(running.store.load().unwrap().audit_entries, entries + 1);
}

#[tokio::test]
async fn an_audit_writer_that_cannot_commit_makes_the_vessel_not_ready() {
    let running = start().await;
    // Its commits fail as on a full disk: the writer's commit is retried
    // (`audit`), and the disk is full (`store`) until a write holds again.
    running.store.fail(Writes::Audit, true);
    running.vessel.audit("host-note", json!({"n": 1}));
    assert!(running.vessel.flush_audit().is_err());
    assert_eq!(
        get(running.admin, "/readyz", None).await,
        (
            503,
            json!({"status": "not ready", "failing": ["store", "audit"]})
        )
    );
    running.store.fail(Writes::Audit, false);
    running.vessel.flush_audit().unwrap();
    assert_eq!(get(running.admin, "/readyz", None).await.0, 200);
}

#[tokio::test]
async fn readyz_makes_no_store_write_and_never_waits_for_the_store() {
    // A bound of an hour: the writer probes the store at start, then not
    // again for a quarter of an hour.
    let running = start_with(Limits {
        durable_within: std::time::Duration::from_secs(3600),
        ..Limits::default()
    })
    .await;
    let probes = running.store.probes();
    for _ in 0..50 {
        assert_eq!(get(running.admin, "/readyz", None).await.0, 200);
    }
    assert_eq!(running.store.probes(), probes, "a probe made per request");
    // A store that hangs: probes, many at once, are answered from what the
    // writer found (within the bound), and none waits for the store.
    let frozen = running.store.freeze();
    let answers = futures::future::join_all((0..20).map(|_| get(running.admin, "/readyz", None)));
    for (status, _) in answers.await {
        assert_eq!(status, 200);
    }
    assert_eq!(running.store.probes(), probes);
    drop(frozen);
}

#[tokio::test]
async fn a_closed_device_listener_makes_the_vessel_not_ready() {
    let logs = dk_testkit::LogBuffer::default();
    let sink = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .finish(),
    );
    let mut running = start().await;
    if let Some(stop) = running.stop_devices.take() {
        stop.send(()).unwrap();
    }
    (&mut running.devices).await.unwrap().unwrap();
    assert_eq!(
        get(running.admin, "/readyz", None).await,
        (
            503,
            json!({"status": "not ready", "failing": ["listeners"]})
        )
    );
    assert_eq!(get(running.admin, "/healthz", None).await.0, 200);
    // Logged with the checks' names as a plain value, not Rust's debug form.
    let text = logs.text();
    let line = text
        .lines()
        .rev()
        .find(|line| line.contains("not ready"))
        .unwrap_or_else(|| panic!("nothing logged: {text}"));
    assert!(line.contains("failing=listeners"), "{line}");
}
