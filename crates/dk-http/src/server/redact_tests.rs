//! A vessel's outputs (audit, events, the admin API, logs, stream
//! metadata) with secrets planted in a device token, an event and a log
//! line: none of them holds one.

use std::sync::Arc;

use dk_core::testing::Peer;
use dk_policy::PolicySet;
use dk_testkit::{LogBuffer, lamp};
use serde_json::json;

use crate::adapter::CallContext;
use crate::admin::{AdminToken, admin_router};
use crate::admin_client::AdminClient;
use crate::agents::{AGENT_CREDENTIAL_PREFIX, AgentRole, AgentScope};
use crate::redact::redacting_log_writer;
use crate::vessel::{Limits, Vessel};

#[tokio::test]
async fn planted_secrets_appear_in_no_output_of_the_vessel() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let admin_token = AdminToken::generate();
    vessel.add_secret(admin_token.expose());
    vessel.add_secret("host-s3cret");
    let (_, agent) = vessel
        .add_agent("main", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let agent = agent.expose().to_owned();
    let mut events = vessel.subscribe_events();
    let (peer, device_token) = Peer::pair(&vessel, lamp(), &["set_light"]).await;
    let planted = [
        device_token.as_str(),
        admin_token.expose(),
        agent.as_str(),
        "host-s3cret",
    ];
    let note = format!(
        "glued 00ff{device_token}beef, {} {agent} host-s3cret",
        admin_token.expose()
    );

    // An event carrying every secret, in a value and a key.
    peer.send(json!({"type": "device:event", "capability": "read_light",
        "data": {"note": note, device_token.clone(): [agent.clone()]}}));
    let event = events.recv().await.unwrap();
    let data = event.data.unwrap().get().to_owned();
    assert!(data.contains("[REDACTED]"), "{data}");

    // A call carrying them all in its tool name and input (refused, so it is
    // recorded with its reason).
    let tool = format!("device__{device_token}__x");
    let outcome = vessel
        .adapter()
        .execute(&tool, json!({"note": note}), CallContext::default())
        .await;
    assert!(!outcome.is_ok());
    let outcome = vessel
        .adapter()
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": true, "note": note}),
            CallContext::default(),
        )
        .await;
    assert!(!outcome.is_ok());
    vessel.audit("host", json!({"said": note}));
    vessel.flush_audit().unwrap();
    let audit = serde_json::to_string(
        &vessel
            .registry()
            .store()
            .read_audit(0, 100)
            .unwrap()
            .iter()
            .map(|e| &e.entry)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(audit.contains("[REDACTED]"), "{audit}");

    // The admin API's listing of decisions.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = admin_router(
        Arc::clone(&vessel),
        admin_token.clone(),
        crate::Console::new(),
        addr,
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let listed = AdminClient::new(addr, admin_token.clone())
        .get("/v1/decisions")
        .await
        .unwrap();
    assert_eq!(listed.status, 200);
    let listed = listed.body.to_string();
    assert!(listed.contains("[REDACTED]"), "{listed}");
    server.abort();

    // A log line, through a real formatter and the process-wide log writer.
    let logs = LogBuffer::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || redacting_log_writer(sink.clone()))
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tracing::warn!(note = %note, "a device said {}", device_token);
    });
    let logs = logs.text();
    assert!(logs.contains("a device said [REDACTED]"), "{logs}");

    // Stream metadata goes through the same redactor.
    let metadata = vessel.redact_telemetry(&json!({"stream": "mic", "label": note}));
    let metadata = metadata.to_string();

    for (output, text) in [
        ("event", &data),
        ("audit", &audit),
        ("admin API", &listed),
        ("log", &logs),
        ("stream metadata", &metadata),
    ] {
        for secret in planted {
            assert!(!text.contains(secret), "{output} holds a secret: {text}");
        }
        // Not even the hex part of the agent credential.
        assert!(
            !text.contains(agent.trim_start_matches(AGENT_CREDENTIAL_PREFIX)),
            "{output}: {text}"
        );
    }
}
