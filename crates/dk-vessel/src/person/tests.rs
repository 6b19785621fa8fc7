//! Tests of the person channel: answers, deadlines, withdrawn questions.

use std::sync::Arc;

use serde_json::{Map, json};

use super::*;
use crate::registry::ConsentCapability;

fn consent() -> ConsentRequest {
    ConsentRequest {
        device_id: "desk-lamp".into(),
        name: "Desk lamp".into(),
        kind: "lamp".into(),
        code: "004217".into(),
        capabilities: vec![ConsentCapability {
            name: "read_light".into(),
            kind: "sensor",
            description: "Read.".into(),
            confirm: false,
        }],
        replaces: None,
        no_screen: false,
    }
}

fn approval() -> ApprovalRequest {
    ApprovalRequest {
        tool: "device__desk_lamp__strobe".into(),
        device_id: "desk-lamp".into(),
        capability: "strobe".into(),
        input: Map::new(),
        reason: "\"strobe\" on Desk lamp asks every time".into(),
    }
}

async fn first_pending(channel: &PersonChannel) -> PendingPrompt {
    loop {
        if let Some(p) = channel.pending().into_iter().next() {
            return p;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn answers_reach_the_asker_and_leave_the_queue() {
    let channel = Arc::new(PersonChannel::default());
    let mut events = channel.subscribe();
    let asker = {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            channel
                .ask_consent(consent(), Duration::from_secs(60))
                .await
        })
    };
    let prompt = first_pending(&channel).await;
    let listed = serde_json::to_value(&prompt).unwrap();
    assert_eq!(listed["kind"], json!("consent"));
    assert_eq!(listed["request"]["code"], json!("004217"));
    assert_eq!(listed["request"]["deviceId"], json!("desk-lamp"));
    assert_eq!(
        channel.answer_approval(prompt.id, true).unwrap_err(),
        AnswerError::WrongKind(prompt.id, "an approval")
    );
    channel
        .answer_consent(prompt.id, ConsentDecision::approve(["read_light"]))
        .unwrap();
    assert_eq!(
        asker.await.unwrap(),
        ConsentDecision::approve(["read_light"])
    );
    assert!(channel.pending().is_empty());
    assert_eq!(
        channel
            .answer_consent(prompt.id, ConsentDecision::refuse())
            .unwrap_err(),
        AnswerError::NotFound(prompt.id)
    );
    assert!(matches!(
        events.recv().await.unwrap(),
        PersonEvent::Asked(_)
    ));
    assert_eq!(
        events.recv().await.unwrap(),
        PersonEvent::Closed { id: prompt.id }
    );
}

#[tokio::test(start_paused = true)]
async fn no_answer_is_a_no_and_leaves_the_queue() {
    let channel = PersonChannel::new(Duration::from_secs(5));
    assert!(!channel.approve(approval()).await.unwrap());
    assert!(channel.pending().is_empty());
    let decision = channel
        .ask_consent(consent(), Duration::from_secs(120))
        .await;
    assert!(!decision.approved);
    assert!(channel.pending().is_empty());
}

#[tokio::test]
async fn a_withdrawn_question_leaves_the_queue() {
    let channel = Arc::new(PersonChannel::default());
    let asker = {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            channel
                .ask_approval(approval(), Duration::from_secs(60))
                .await
        })
    };
    let prompt = first_pending(&channel).await;
    asker.abort();
    let _ = asker.await;
    assert!(channel.pending().is_empty());
    assert_eq!(
        channel.answer_approval(prompt.id, true).unwrap_err(),
        AnswerError::NotFound(prompt.id)
    );
}

#[tokio::test]
async fn approvals_through_the_approver_trait() {
    let channel = Arc::new(PersonChannel::default());
    for answer in [true, false] {
        let asker = {
            let channel = Arc::clone(&channel);
            tokio::spawn(async move { channel.approve(approval()).await })
        };
        let prompt = first_pending(&channel).await;
        assert_eq!(
            serde_json::to_value(&prompt).unwrap()["kind"],
            json!("approval")
        );
        channel.answer_approval(prompt.id, answer).unwrap();
        assert_eq!(asker.await.unwrap(), Ok(answer));
    }
}
