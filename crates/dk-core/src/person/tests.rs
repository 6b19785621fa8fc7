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
            kind: dk_proto::CapabilityKind::Sensor,
            description: "Read.".into(),
            confirm: false,
            params: Vec::new(),
            title: None,
            claims: Vec::new(),
        }],
        events: Vec::new(),
        replaces: None,
        no_screen: false,
        channel: dk_proto::Channel::V1,
    }
}

fn approval() -> ApprovalRequest {
    ApprovalRequest {
        tool: "device__desk_lamp__strobe".into(),
        device_id: "desk-lamp".into(),
        capability: "strobe".into(),
        input: Map::new(),
        reason: "\"strobe\" on Desk lamp asks every time".into(),
        agent_id: None,
        session_id: None,
        channel: dk_proto::Channel::V1,
        microphone: None,
    }
}

fn approval_of(agent: &str) -> ApprovalRequest {
    ApprovalRequest {
        agent_id: Some(agent.to_owned()),
        session_id: None,
        ..approval()
    }
}

/// Waits until `count` prompts are open.
async fn until_pending(channel: &PersonChannel, count: usize) {
    while channel.pending().len() != count {
        tokio::task::yield_now().await;
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

#[tokio::test]
async fn one_agent_keeps_at_most_its_cap_of_approvals_waiting() {
    let channel = Arc::new(PersonChannel::default());
    let mut askers = tokio::task::JoinSet::new();
    let ask = |askers: &mut tokio::task::JoinSet<_>, request: ApprovalRequest| {
        let channel = Arc::clone(&channel);
        askers.spawn(async move { channel.approve(request).await });
    };
    for _ in 0..APPROVALS_PER_AGENT {
        ask(&mut askers, approval_of("flood"));
    }
    until_pending(&channel, APPROVALS_PER_AGENT).await;
    // One more of the same agent is refused at once, with why, and the
    // person is not asked.
    let refused = channel
        .approve(approval_of("flood"))
        .await
        .map_err(|e| e.to_string());
    assert_eq!(
        refused,
        Err(format!(
            "agent \"flood\" already has {APPROVALS_PER_AGENT} approvals waiting for the person"
        ))
    );
    assert_eq!(channel.pending().len(), APPROVALS_PER_AGENT);
    // Another agent, a call without an agent and a pairing are still asked.
    ask(&mut askers, approval_of("calm"));
    ask(&mut askers, approval());
    let consent = {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            channel
                .ask_consent(consent(), Duration::from_secs(60))
                .await
        })
    };
    until_pending(&channel, APPROVALS_PER_AGENT + 3).await;
    // Once one of its prompts is answered, the agent may ask again.
    let first = channel.pending().into_iter().next().unwrap();
    channel.answer_approval(first.id, false).unwrap();
    ask(&mut askers, approval_of("flood"));
    until_pending(&channel, APPROVALS_PER_AGENT + 3).await;
    let flood = channel
        .pending()
        .iter()
        .filter(
            |p| matches!(&p.prompt, Prompt::Approval(r) if r.agent_id.as_deref() == Some("flood")),
        )
        .count();
    assert_eq!(flood, APPROVALS_PER_AGENT);
    for prompt in channel.pending() {
        match prompt.prompt {
            Prompt::Approval(_) => channel.answer_approval(prompt.id, false).unwrap(),
            Prompt::Consent(_) => channel
                .answer_consent(prompt.id, ConsentDecision::refuse())
                .unwrap(),
        }
    }
    while let Some(answer) = askers.join_next().await {
        assert_eq!(answer.unwrap(), Ok(false));
    }
    assert!(!consent.await.unwrap().approved);
}

/// An offer to remember a yes to `agent`'s strobe call, from `allowances`.
fn offer_for(allowances: &Arc<crate::allowances::Allowances>, agent: &str) -> AllowanceOffer {
    let stamp = allowances.stamp();
    allowances.offer(
        stamp,
        crate::allowances::OfferedCall {
            agent_id: agent,
            tool: "device__desk_lamp__strobe",
            device_id: "desk-lamp",
            capability: "strobe",
            generation: 1,
            read_only: false,
            arguments: &Map::new(),
        },
    )
}

fn for_minutes(minutes: u64) -> ApprovalAnswer {
    ApprovalAnswer::Remember(Remember {
        scope: crate::allowances::AllowanceScope::Capability,
        minutes: crate::allowances::AllowanceMinutes::new(minutes).unwrap(),
    })
}

#[tokio::test]
async fn a_yes_is_remembered_only_when_the_asker_offers_it() {
    let channel = Arc::new(PersonChannel::default());
    let allowances = Arc::new(crate::allowances::Allowances::new());
    // Without an offer (a call of no agent): once or no.
    let plain = {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            channel
                .try_ask_remembering(approval(), None, Duration::from_secs(60))
                .await
        })
    };
    let prompt = first_pending(&channel).await;
    assert!(!prompt.can_remember);
    assert_eq!(
        serde_json::to_value(&prompt).unwrap().get("canRemember"),
        None
    );
    assert_eq!(
        channel.answer_approval_with(prompt.id, for_minutes(5)),
        Err(AnswerError::NotRememberable(prompt.id))
    );
    assert_eq!(channel.pending().len(), 1);
    assert_eq!(
        channel.answer_approval_with(prompt.id, ApprovalAnswer::Once),
        Ok(None)
    );
    assert_eq!(plain.await.unwrap().map(|a| a.approval), Ok(Approval::Once));
    // With one: the allowance is made before the asker hears the yes.
    let offered = {
        let channel = Arc::clone(&channel);
        let offer = offer_for(&allowances, "helper");
        tokio::spawn(async move {
            channel
                .try_ask_remembering(approval_of("helper"), Some(offer), Duration::from_secs(60))
                .await
        })
    };
    let prompt = first_pending(&channel).await;
    assert!(prompt.can_remember);
    assert_eq!(
        serde_json::to_value(&prompt).unwrap()["canRemember"],
        json!(true)
    );
    let made = channel
        .answer_approval_with(prompt.id, for_minutes(5))
        .unwrap()
        .unwrap();
    assert_eq!(allowances.list(), std::slice::from_ref(&made));
    assert_eq!(
        offered.await.unwrap().map(|a| a.approval),
        Ok(Approval::Remembered(made))
    );
    assert!(channel.pending().is_empty());
}

#[tokio::test]
async fn an_allowance_that_cannot_be_made_leaves_the_question_open() {
    let channel = Arc::new(PersonChannel::default());
    let allowances = Arc::new(crate::allowances::Allowances::new());
    let asker = {
        let channel = Arc::clone(&channel);
        let offer = offer_for(&allowances, "helper");
        tokio::spawn(async move {
            channel
                .try_ask_remembering(approval_of("helper"), Some(offer), Duration::from_secs(60))
                .await
        })
    };
    let prompt = first_pending(&channel).await;
    // The capability is revoked while the person reads the prompt.
    allowances.drop_capability("desk-lamp", "strobe");
    let refused = channel.answer_approval_with(prompt.id, for_minutes(5));
    assert_eq!(
        refused,
        Err(AnswerError::NotRemembered(
            prompt.id,
            crate::allowances::AllowanceError::Changed
        ))
    );
    assert!(refused.unwrap_err().to_string().ends_with(&format!(
        "call {} is still waiting for an answer",
        prompt.id
    )));
    assert!(allowances.list().is_empty());
    assert_eq!(channel.pending().len(), 1);
    channel
        .answer_approval_with(prompt.id, ApprovalAnswer::Refuse)
        .unwrap();
    assert_eq!(
        asker.await.unwrap().map(|a| a.approval),
        Ok(Approval::Refused)
    );
    // A consent is not an approval, remembered or not.
    let pairing = {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            channel
                .ask_consent(consent(), Duration::from_secs(60))
                .await
        })
    };
    let prompt = first_pending(&channel).await;
    assert_eq!(
        channel.answer_approval_with(prompt.id, for_minutes(5)),
        Err(AnswerError::WrongKind(prompt.id, "an approval"))
    );
    channel
        .answer_consent(prompt.id, ConsentDecision::refuse())
        .unwrap();
    assert!(!pairing.await.unwrap().approved);
}

/// A sink that keeps the answers a mirrored prompt was given, and answers
/// each with what `word` says the other vessel said.
fn kept_saying(
    word: impl Fn() -> Result<Option<Allowance>, NotTaken> + Send + Sync + 'static,
) -> (Arc<std::sync::Mutex<Vec<MirroredAnswer>>>, AnswerSink) {
    let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = Arc::clone(&answers);
    let word = Arc::new(word);
    let sink: AnswerSink = Arc::new(move |answer| {
        keep.lock().unwrap().push(answer);
        let said = word();
        Box::pin(async move { said })
    });
    (answers, sink)
}

/// A sink whose answers the other vessel takes.
fn kept() -> (Arc<std::sync::Mutex<Vec<MirroredAnswer>>>, AnswerSink) {
    kept_saying(|| Ok(None))
}

#[tokio::test]
async fn a_prompt_of_another_vessel_is_shown_and_its_answer_confirmed_there() {
    let channel = PersonChannel::new(Duration::from_secs(60));
    let mut events = channel.subscribe();
    let (consents, sink) = kept();
    let consent_id = channel.mirror(Prompt::Consent(consent()), 9, false, sink);
    let (approvals, sink) = kept();
    let approval_id = channel.mirror(Prompt::Approval(approval_of("helper")), 9, true, sink);
    let listed = channel.pending();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|p| p.mirrored));
    assert_eq!(channel.waiting(), (1, 1));
    assert!(matches!(events.try_recv(), Ok(PersonEvent::Asked(p)) if p.mirrored));

    // The wrong kind is refused and leaves it open.
    assert_eq!(
        channel
            .answer_approval_confirmed(consent_id, ApprovalAnswer::Once, None)
            .await,
        Err(AnswerError::WrongKind(consent_id, "an approval"))
    );
    // An answer that cannot be confirmed is refused for a mirror.
    assert_eq!(
        channel.answer_consent(consent_id, ConsentDecision::refuse()),
        Err(AnswerError::Mirrored(consent_id))
    );
    channel
        .answer_consent_confirmed(consent_id, ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    assert_eq!(
        *consents.lock().unwrap(),
        vec![MirroredAnswer::Consent(ConsentDecision::approve([
            "read_light"
        ]))]
    );
    // Still listed: it leaves when the other vessel closes it.
    assert_eq!(channel.pending().len(), 2);

    // A yes to remember goes there whole: that vessel makes the allowance.
    let remember = Remember {
        scope: crate::allowances::AllowanceScope::Arguments,
        minutes: crate::allowances::AllowanceMinutes::default(),
    };
    let made = channel
        .answer_approval_confirmed(
            approval_id,
            ApprovalAnswer::Remember(remember),
            Some(By::terminal()),
        )
        .await
        .unwrap();
    assert_eq!(made, None);
    assert_eq!(
        *approvals.lock().unwrap(),
        vec![MirroredAnswer::Approval {
            answer: ApprovalAnswer::Remember(remember),
            by: Some(By::terminal()),
        }]
    );
    channel.close_mirror(consent_id);
    channel.close_mirror(approval_id);
    assert!(channel.pending().is_empty());
}

#[tokio::test]
async fn an_answer_the_other_vessel_does_not_take_is_said_and_the_prompt_stays() {
    let channel = PersonChannel::new(Duration::from_secs(60));
    let (answers, sink) = kept_saying(|| Err(NotTaken::Unconfirmed));
    let id = channel.mirror(Prompt::Approval(approval_of("helper")), 9, false, sink);
    assert_eq!(
        channel
            .answer_approval_confirmed(id, ApprovalAnswer::Refuse, None)
            .await,
        Err(AnswerError::NotTaken(id, NotTaken::Unconfirmed))
    );
    // Still there, and may be answered again.
    assert_eq!(channel.pending().len(), 1);
    assert!(
        channel
            .answer_approval_confirmed(id, ApprovalAnswer::Refuse, None)
            .await
            .is_err()
    );
    assert_eq!(answers.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_mirrored_prompt_closes_when_its_vessel_says_and_is_never_withdrawn_here() {
    let channel = PersonChannel::new(Duration::from_secs(60));
    let (answers, sink) = kept();
    let id = channel.mirror(Prompt::Approval(approval_of("helper")), 9, false, sink);
    // Withdrawing this vessel's approvals leaves another vessel's alone.
    assert_eq!(channel.withdraw_approvals(|_| true), 0);
    assert_eq!(channel.pending().len(), 1);
    // Not rememberable where the other vessel said so.
    let remember = Remember {
        scope: crate::allowances::AllowanceScope::Capability,
        minutes: crate::allowances::AllowanceMinutes::default(),
    };
    assert_eq!(
        channel
            .answer_approval_confirmed(id, ApprovalAnswer::Remember(remember), None)
            .await,
        Err(AnswerError::NotRememberable(id))
    );
    let mut events = channel.subscribe();
    channel.close_mirror(id);
    assert!(matches!(events.try_recv(), Ok(PersonEvent::Closed { id: closed }) if closed == id));
    assert!(channel.pending().is_empty());
    assert_eq!(
        channel
            .answer_approval_confirmed(id, ApprovalAnswer::Once, None)
            .await,
        Err(AnswerError::NotFound(id))
    );
    assert!(answers.lock().unwrap().is_empty());
    // Closing a prompt raised here is not for a mirror's closer.
    let asking = channel.ask_consent(consent(), Duration::from_secs(60));
    tokio::pin!(asking);
    tokio::select! {
        _ = &mut asking => panic!("answered without an answer"),
        () = until_pending(&channel, 1) => {}
    }
    let own = channel.pending()[0].id;
    channel.close_mirror(own);
    assert_eq!(channel.pending().len(), 1);
}
