//! An agent removed or re-scoped through the directory itself
//! (`vessel.agents()`) loses its waiting calls, as through the vessel's own
//! methods: there is one path for agent changes.

use std::time::Duration;

use dk_policy::PolicySet;
use serde_json::Map;

use crate::adapter::ApprovalRequest;
use crate::agents::{AgentRole, AgentScope};
use crate::vessel::{Limits, Vessel};

fn asking(agent: &str, device: &str, capability: &str) -> ApprovalRequest {
    ApprovalRequest {
        tool: format!("device__{}__{capability}", device.replace('-', "_")),
        device_id: device.to_owned(),
        capability: capability.to_owned(),
        input: Map::new(),
        reason: "asks every time".to_owned(),
        agent_id: Some(agent.to_owned()),
        session_id: None,
        channel: dk_proto::Channel::V1,
        microphone: None,
    }
}

#[tokio::test]
async fn changes_through_the_directory_withdraw_waiting_calls() {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let everything = AgentScope::from_items(["*"]).unwrap();
    for name in ["helper", "other"] {
        vessel
            .add_agent(name, everything.clone(), AgentRole::User)
            .unwrap();
    }
    let person = std::sync::Arc::clone(vessel.person());
    let ask = |request: ApprovalRequest| {
        let person = std::sync::Arc::clone(&person);
        tokio::spawn(async move { person.ask_approval(request, Duration::from_secs(600)).await })
    };
    let removed = ask(asking("helper", "front-door", "unlock"));
    let lamp = ask(asking("other", "desk-lamp", "set_light"));
    let door = ask(asking("other", "front-door", "unlock"));
    while vessel.person().pending().len() < 3 {
        tokio::task::yield_now().await;
    }

    // Removed through the directory: its call is a no at once.
    vessel.agents().remove("helper").unwrap();
    let waiting = |agent: &str| {
        vessel
            .person()
            .pending()
            .iter()
            .filter(|p| format!("{:?}", p.prompt).contains(&format!("agent_id: Some({agent:?})")))
            .count()
    };
    assert_eq!((waiting("helper"), waiting("other")), (0, 2));
    assert!(!removed.await.unwrap());
    // Re-scoped through the directory to the lamp: the door call goes, the
    // lamp call stays.
    vessel
        .agents()
        .set_scope("other", AgentScope::from_items(["desk-lamp"]).unwrap())
        .unwrap();
    let left = vessel.person().pending();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(format!("{left:?}").contains("desk-lamp"), "{left:?}");
    assert!(!door.await.unwrap());
    lamp.abort();
}
