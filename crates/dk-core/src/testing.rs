//! Test support that needs a vessel: the device's end of a connection the
//! vessel serves ([`Peer`]), and pairing a device over it
//! ([`Peer::pair`]). Compiled for dk-core's own tests, and behind the
//! `testing` feature for other crates' dev-dependencies (the layering test
//! keeps that feature out of every crate's normal dependencies). Manifests
//! come from the caller (dk-testkit's `lamp()`), so nothing here is a
//! second copy of a fixture.
//!
//! A step that goes wrong fails the test that called it, by a panic with a
//! message.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::missing_panics_doc,
    reason = "test support: a step that goes wrong fails the calling test"
)]

use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::connection::{ConnectionOutcome, WireMessage, serve_connection};
use crate::registry::ConsentDecision;
use crate::vessel::Vessel;

/// The device's end of a connection served by a vessel, over channels:
/// what the device sends goes to the vessel's connection task, what the
/// vessel sends comes back. Dropping the peer closes both channels, which
/// ends the task as a device hanging up would.
#[derive(Debug)]
pub struct Peer {
    to_vessel: UnboundedSender<WireMessage>,
    from_vessel: UnboundedReceiver<WireMessage>,
    _task: JoinHandle<ConnectionOutcome>,
}

impl Peer {
    /// A new connection to `vessel`, admitted and served.
    pub fn connect(vessel: &Arc<Vessel>) -> Peer {
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

    /// Sends a frame to the vessel as JSON text.
    pub fn send(&self, frame: Value) {
        self.to_vessel
            .unbounded_send(WireMessage::Text(frame.to_string()))
            .unwrap();
    }

    /// The next text frame from the vessel, other messages skipped; fails
    /// when the vessel closes the connection.
    pub async fn frame(&mut self) -> Value {
        loop {
            match self.from_vessel.next().await.unwrap() {
                WireMessage::Text(text) => return serde_json::from_str(&text).unwrap(),
                WireMessage::Close(frame) => panic!("closed: {frame:?}"),
                _ => {}
            }
        }
    }

    /// Pairs `manifest` over a new connection, the person granting `grant`
    /// at the first prompt, and waits until the device is connected; the
    /// peer and its device token.
    pub async fn pair(vessel: &Arc<Vessel>, manifest: Value, grant: &[&str]) -> (Peer, String) {
        let device_id = manifest["id"].as_str().unwrap().to_owned();
        let mut peer = Peer::connect(vessel);
        peer.send(json!({"type": "device:hello", "manifest": manifest}));
        assert_eq!(peer.frame().await["type"], "device:pairing");
        let prompt = loop {
            if let Some(p) = vessel.person().pending().into_iter().next() {
                break p;
            }
            tokio::task::yield_now().await;
        };
        vessel
            .person()
            .answer_consent(prompt.id, ConsentDecision::approve(grant.iter().copied()))
            .unwrap();
        let paired = peer.frame().await;
        assert_eq!(paired["type"], "device:paired");
        let token = paired["deviceToken"].as_str().unwrap().to_owned();
        while !vessel.links().is_connected(&device_id) {
            tokio::task::yield_now().await;
        }
        (peer, token)
    }
}

/// Rule files and readings the rule-reloading tests share (dk-core's
/// reload, dk-vessel's watch).
pub mod rules {
    use dk_policy::{Decision, DeviceUseContext};
    use sha2::{Digest, Sha256};

    use crate::vessel::Vessel;

    /// One rule that asks before any actuator.
    pub const ASK: &str = "version: 1\npolicies:\n  - name: ask\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: require_approval\n    message: ask first\n";
    /// One rule that blocks any actuator.
    pub const BLOCK: &str = "version: 1\npolicies:\n  - name: block\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: block\n    message: no\n";
    /// A file the loader refuses (a misspelt field in its condition).
    pub const BROKEN: &str = "version: 1\npolicies:\n  - name: block\n    action: device_use\n    condition: \"capabilityKnd equals actuator\"\n    decision: block\n    message: no\n";

    /// What the vessel's rules decide for an actuator: `allow`, `ask` or
    /// `block`.
    pub fn decision_kind(vessel: &Vessel) -> &'static str {
        let policies = vessel.adapter().policies();
        let ctx = DeviceUseContext {
            agent_id: None,
            session_id: None,
            device_id: "lamp",
            capability: "set",
            capability_kind: "actuator",
        };
        match policies.evaluate_device_use(&ctx) {
            Decision::Allow { .. } => "allow",
            Decision::RequireApproval { .. } => "ask",
            Decision::Block { .. } => "block",
        }
    }

    /// The SHA-256 of `text`, in lower-case hex.
    pub fn sha256(text: &str) -> String {
        dk_files::hex::encode(&Sha256::digest(text.as_bytes()))
    }
}
