//! A vessel's outputs (audit, events, the admin API, logs, stream
//! metadata) with secrets planted in a device token, an event and a log
//! line: none of them holds one.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use dk_policy::PolicySet;
use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use serde_json::{Value, json};

use crate::adapter::CallContext;
use crate::admin::{AdminToken, admin_router};
use crate::admin_client::AdminClient;
use crate::agents::{AGENT_CREDENTIAL_PREFIX, AgentRole, AgentScope};
use crate::connection::{WireMessage, serve_connection};
use crate::redact::redacting_log_writer;
use crate::registry::ConsentDecision;
use crate::vessel::{Limits, Vessel};

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

// --------------------------------------------------------- a whole vessel

fn lamp() -> Value {
    serde_json::from_str(include_str!(
        "../../../../fixtures/manifests/valid/desk-lamp.json"
    ))
    .unwrap()
}

/// The device's end of a connection served by the vessel.
struct Peer {
    to_vessel: UnboundedSender<WireMessage>,
    from_vessel: UnboundedReceiver<WireMessage>,
    _task: tokio::task::JoinHandle<crate::connection::ConnectionOutcome>,
}

impl Peer {
    fn connect(vessel: &Arc<Vessel>) -> Peer {
        let (to_vessel, incoming) = unbounded();
        let (outgoing, from_vessel) = unbounded();
        let permit = vessel.admit(None).unwrap();
        let vessel = Arc::clone(vessel);
        let task =
            tokio::spawn(
                async move { serve_connection(&vessel, permit, incoming, outgoing).await },
            );
        Peer {
            to_vessel,
            from_vessel,
            _task: task,
        }
    }

    fn send(&self, frame: Value) {
        self.to_vessel
            .unbounded_send(WireMessage::Text(frame.to_string()))
            .unwrap();
    }

    async fn frame(&mut self) -> Value {
        loop {
            match self.from_vessel.next().await.unwrap() {
                WireMessage::Text(text) => return serde_json::from_str(&text).unwrap(),
                WireMessage::Close(frame) => panic!("closed: {frame:?}"),
                _ => {}
            }
        }
    }
}

/// Pairs the lamp over a new connection; the peer and its token.
async fn paired_lamp(vessel: &Arc<Vessel>) -> (Peer, String) {
    let mut peer = Peer::connect(vessel);
    peer.send(json!({"type": "device:hello", "manifest": lamp()}));
    assert_eq!(peer.frame().await["type"], "device:pairing");
    let prompt = loop {
        if let Some(p) = vessel.person().pending().into_iter().next() {
            break p;
        }
        tokio::task::yield_now().await;
    };
    vessel
        .person()
        .answer_consent(prompt.id, ConsentDecision::approve(["set_light"]))
        .unwrap();
    let paired = peer.frame().await;
    assert_eq!(paired["type"], "device:paired");
    let token = paired["deviceToken"].as_str().unwrap().to_owned();
    while !vessel.links().is_connected("desk-lamp") {
        tokio::task::yield_now().await;
    }
    (peer, token)
}

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
    let (peer, device_token) = paired_lamp(&vessel).await;
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
    let logs = Shared::default();
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
