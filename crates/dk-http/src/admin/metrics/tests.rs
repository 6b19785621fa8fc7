//! `/metrics` over real sockets: a vessel serving its device and admin
//! listeners, a lamp connected over a WebSocket answering its calls, and
//! counters that move with what happened (a call allowed, a call denied, a
//! rule's limit reached, a bad dk/2 handshake, a device connecting).

use std::net::SocketAddr;
use std::sync::Arc;

use dk_policy::PolicySet;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::Console;
use crate::admin::{AdminToken, serve_admin};
use crate::registry::{ConsentDecision, ConsentRequest};
use crate::server::serve_devices;
use crate::vessel::{Limits, Vessel};

/// One call a minute to the lamp's sensor; the second is refused.
const RULES: &str = "version: 1\npolicies:\n  - name: one-read\n    action: device_use\n    condition: \"capability equals read_light\"\n    decision: block\n    limit: 1 per 1m\n    message: one read a minute\n";

struct Running {
    vessel: Arc<Vessel>,
    admin: SocketAddr,
    devices: SocketAddr,
    token: AdminToken,
}

async fn start() -> Running {
    let policies = PolicySet::from_yaml_str(RULES).unwrap();
    let vessel = Vessel::new(policies, Limits::default());
    let devices = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let devices_addr = devices.local_addr().unwrap();
    tokio::spawn(serve_devices(
        devices,
        Arc::clone(&vessel),
        std::future::pending(),
    ));
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
    Running {
        vessel,
        admin: addr,
        devices: devices_addr,
        token,
    }
}

/// `method path` on the admin listener with `authorization` if given: the
/// status, the content type and the body.
async fn request(
    running: &Running,
    method: &str,
    path: &str,
    body: Option<&Value>,
    authorization: Option<&str>,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(running.admin).await.unwrap();
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let body = body.map_or(String::new(), Value::to_string);
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        running.admin,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

/// The exposition, read with the admin token.
async fn scrape(running: &Running) -> String {
    let bearer = format!("Bearer {}", running.token.expose());
    let (status, content_type, body) =
        request(running, "GET", "/metrics", None, Some(&bearer)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    body
}

/// The value of the sample `name` (with its labels as written) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[track_caller]
fn check(text: &str, name: &str, expected: f64) {
    assert_eq!(sample(text, name), Some(expected), "{name} in\n{text}");
}

/// A call through the admin API (the person's own).
async fn call(running: &Running, capability: &str, input: Value) -> Value {
    let bearer = format!("Bearer {}", running.token.expose());
    let tool = dk_proto::tool_name("desk-lamp", capability);
    let (status, _, body) = request(
        running,
        "POST",
        "/v1/tools/call",
        Some(&json!({"tool": tool, "input": input})),
        Some(&bearer),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The lamp paired (granted its sensor and `set_light`), connected over
/// v1, answering every call with `{"on": true}` until the test ends.
async fn connect_lamp(running: &Running) {
    let paired = running
        .vessel
        .registry()
        .pair(
            &dk_testkit::lamp(),
            |_| {},
            |_| async move {
                Ok::<_, std::convert::Infallible>(ConsentDecision::approve([
                    "read_light",
                    "set_light",
                ]))
            },
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap();
    let url = format!("ws://{}/device", running.devices);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let auth = json!({"type": "device:auth", "deviceId": "desk-lamp",
        "token": paired.token.expose(), "manifest": dk_testkit::lamp()});
    ws.send(Message::text(auth.to_string())).await.unwrap();
    tokio::spawn(async move {
        while let Some(Ok(message)) = ws.next().await {
            let Message::Text(text) = message else {
                continue;
            };
            let frame: Value = serde_json::from_str(&text).unwrap();
            if frame["type"] == "device:invoke" {
                let result = json!({"type": "device:result", "callId": frame["callId"],
                    "ok": true, "result": {"on": true}});
                ws.send(Message::text(result.to_string())).await.unwrap();
            }
        }
    });
    dk_testkit::eventually("the lamp connected", || {
        running.vessel.links().is_connected("desk-lamp")
    })
    .await;
}

#[tokio::test]
async fn metrics_want_the_admin_token_like_the_rest_of_the_api() {
    let running = start().await;
    for auth in [None, Some("Bearer 1234")] {
        let (status, _, body) = request(&running, "GET", "/metrics", None, auth).await;
        assert_eq!(status, 401, "{body}");
        assert!(!body.contains("dk_"), "{body}");
    }
    let text = scrape(&running).await;
    check(&text, "dk_devices_paired", 0.0);
    check(&text, "dk_devices_connected", 0.0);
    check(
        &text,
        "dk_calls_total{kind=\"sensor\",decision=\"allowed\"}",
        0.0,
    );
    assert!(text.contains("# TYPE dk_call_duration_seconds histogram"));
}

#[tokio::test]
async fn counters_move_with_what_the_vessel_does() {
    let running = start().await;
    connect_lamp(&running).await;
    let text = scrape(&running).await;
    check(&text, "dk_devices_paired", 1.0);
    check(&text, "dk_devices_connected", 1.0);
    check(
        &text,
        "dk_listener_connections_open{listener=\"device\"}",
        1.0,
    );
    check(
        &text,
        "dk_listener_connections_opened_total{listener=\"device\"}",
        1.0,
    );

    // Allowed (the sensor), then refused by its rule's limit.
    assert_eq!(call(&running, "read_light", json!({})).await["ok"], true);
    let refused = call(&running, "read_light", json!({})).await;
    assert!(
        refused["reason"].as_str().unwrap().starts_with("[policy] "),
        "{refused}"
    );
    // Denied: not granted.
    let denied = call(&running, "strobe", json!({})).await;
    assert!(
        denied["reason"]
            .as_str()
            .unwrap()
            .starts_with("[8dk-deny] "),
        "{denied}"
    );
    // An actuator, allowed.
    assert_eq!(
        call(&running, "set_light", json!({"on": true})).await["ok"],
        true
    );

    let text = scrape(&running).await;
    check(
        &text,
        "dk_calls_total{kind=\"sensor\",decision=\"allowed\"}",
        1.0,
    );
    check(
        &text,
        "dk_calls_total{kind=\"sensor\",decision=\"policy\"}",
        1.0,
    );
    check(
        &text,
        "dk_calls_total{kind=\"actuator\",decision=\"denied\"}",
        1.0,
    );
    check(
        &text,
        "dk_calls_total{kind=\"actuator\",decision=\"allowed\"}",
        1.0,
    );
    check(&text, "dk_rate_limited_calls_total{limit=\"rule\"}", 1.0);
    check(&text, "dk_rate_limited_calls_total{limit=\"agent\"}", 0.0);
    check(
        &text,
        "dk_call_duration_seconds_count{kind=\"sensor\"}",
        2.0,
    );
    check(
        &text,
        "dk_call_duration_seconds_count{kind=\"actuator\"}",
        2.0,
    );
    check(
        &text,
        "dk_call_duration_seconds_bucket{kind=\"actuator\",le=\"+Inf\"}",
        2.0,
    );

    // Changes whose entries the store writes with them: an agent added, a
    // grant and a revoke (the pairing made two already).
    running
        .vessel
        .add_agent(
            "main",
            crate::agents::AgentScope::AllDevices,
            crate::agents::AgentRole::User,
        )
        .unwrap();
    running
        .vessel
        .registry()
        .grant("desk-lamp", "strobe")
        .unwrap();
    running
        .vessel
        .registry()
        .revoke("desk-lamp", "strobe")
        .unwrap();

    // Every entry in the log is counted as committed, those written with
    // their change as well as the decisions; and the commits are timed.
    running.vessel.flush_audit().unwrap();
    let text = scrape(&running).await;
    let entries = running
        .vessel
        .registry()
        .store()
        .read_audit(0, 1000)
        .unwrap();
    let kinds = |kind: &str| entries.iter().filter(|e| e.kind == kind).count();
    assert_eq!(
        (
            kinds("paired"),
            kinds("granted"),
            kinds("revoked"),
            kinds("agent")
        ),
        (1, 1, 1, 1)
    );
    check(
        &text,
        "dk_audit_entries_committed_total",
        entries.len() as f64,
    );
    assert!(sample(&text, "dk_audit_commit_duration_seconds_count").unwrap() >= 1.0);
}

#[tokio::test]
async fn a_bad_dk2_handshake_is_counted_by_its_reason() {
    let running = start().await;
    let mut request = format!("ws://{}/device", running.devices)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "dk.2".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    // Message 1 is 32 bytes: five are not a handshake.
    ws.send(Message::binary(vec![1u8; 5])).await.unwrap();
    while let Some(Ok(message)) = ws.next().await {
        if let Message::Close(frame) = message {
            assert_eq!(frame.map(|f| u16::from(f.code)), Some(4012));
            break;
        }
    }
    let text = scrape(&running).await;
    check(
        &text,
        "dk_secure_handshake_failures_total{reason=\"bad_message\"}",
        1.0,
    );
    check(
        &text,
        "dk_secure_handshake_failures_total{reason=\"timeout\"}",
        0.0,
    );
    check(&text, "dk_secure_channel_failures_total", 1.0);
    check(&text, "dk_secure_handshakes_total", 0.0);
}

#[tokio::test]
async fn the_persons_answer_time_is_measured_from_the_prompt() {
    let running = start().await;
    let person = Arc::clone(running.vessel.person());
    let asking = tokio::spawn(async move {
        person
            .ask_consent(
                ConsentRequest {
                    device_id: "front-door".to_owned(),
                    name: "Front door".to_owned(),
                    kind: "lock".to_owned(),
                    code: "004217".to_owned(),
                    capabilities: Vec::new(),
                    events: Vec::new(),
                    replaces: None,
                    no_screen: false,
                    channel: dk_proto::Channel::V1,
                },
                std::time::Duration::from_secs(60),
            )
            .await
    });
    let id = dk_testkit::eventually_some("the prompt", || {
        running.vessel.person().pending().first().map(|p| p.id)
    })
    .await;
    let text = scrape(&running).await;
    check(&text, "dk_prompts_pending{prompt=\"pairing\"}", 1.0);
    check(&text, "dk_prompts_pending{prompt=\"approval\"}", 0.0);
    running
        .vessel
        .person()
        .answer_consent(id, ConsentDecision::refuse())
        .unwrap();
    asking.await.unwrap();
    let text = scrape(&running).await;
    check(&text, "dk_prompts_pending{prompt=\"pairing\"}", 0.0);
    check(
        &text,
        "dk_prompt_answer_duration_seconds_count{prompt=\"pairing\"}",
        1.0,
    );
}

#[tokio::test]
async fn the_metrics_listener_serves_metrics_alone_without_the_token() {
    let running = start().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(crate::serve_metrics(
        listener,
        Arc::clone(&running.vessel),
        crate::HttpLimits::default(),
        std::future::pending(),
    ));
    let open = Running {
        vessel: Arc::clone(&running.vessel),
        admin: addr,
        devices: running.devices,
        token: running.token.clone(),
    };
    let (status, content_type, text) = request(&open, "GET", "/metrics", None, None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    check(&text, "dk_devices_paired", 0.0);
    check(
        &text,
        "dk_listener_connections_opened_total{listener=\"metrics\"}",
        1.0,
    );
    // Nothing else is there, with the token or without it.
    let bearer = format!("Bearer {}", running.token.expose());
    for path in ["/v1/status", "/v1/pending", "/healthz", "/"] {
        for auth in [None, Some(bearer.as_str())] {
            assert_eq!(
                request(&open, "GET", path, None, auth).await.0,
                404,
                "{path}"
            );
        }
    }
}

#[tokio::test]
async fn a_fleet_members_state_is_scraped_without_naming_members() {
    let running = start().await;
    // Not a member: no fleet family at all.
    assert!(!scrape(&running).await.contains("dk_fleet_"));
    running.vessel.set_fleet_status(Arc::new(|| {
        let member = |name: &str, devices| dk_proto::admin::FleetMember {
            member: name.to_owned(),
            incarnation: "0".repeat(31) + "1",
            devices,
            heard_ago_ms: 5,
        };
        dk_proto::admin::FleetStatus {
            member: "m1".to_owned(),
            incarnation: "0".repeat(31) + "2",
            connected: true,
            devices: 4,
            members: vec![member("m2", 10), member("m3", 20)],
            departed: Vec::new(),
            dropped: dk_proto::admin::FleetDropped {
                forged: 1,
                replayed: 2,
                stale: 3,
                too_large: 4,
                other_version: 5,
            },
            max_message: 1024,
        }
    }));
    let text = scrape(&running).await;
    check(&text, "dk_fleet_connected", 1.0);
    check(&text, "dk_fleet_members", 2.0);
    check(&text, "dk_fleet_devices", 4.0);
    check(&text, "dk_fleet_devices_elsewhere", 30.0);
    for (reason, count) in [
        ("forged", 1.0),
        ("replayed", 2.0),
        ("stale", 3.0),
        ("too_large", 4.0),
        ("other_version", 5.0),
    ] {
        check(
            &text,
            &format!("dk_fleet_messages_dropped_total{{reason=\"{reason}\"}}"),
            count,
        );
    }
    // No member's name in a label: the set of series stays bounded.
    assert!(!text.contains("m2") && !text.contains("m3"), "{text}");
}
