//! Remembered allowances at check 5: the adapter with a real registry and
//! the person channel, a link that counts what reaches the device.

use std::sync::Mutex;
use std::time::Duration;

use dk_policy::PolicySet;
use dk_testkit::lamp;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use crate::adapter::{AllowanceUse, CallContext, DecisionRecord, DeviceToolAdapter, ToolOutcome};
use crate::allowances::{AllowanceMinutes, AllowanceScope, Remember};
use crate::link::{DeviceLink, InvokeResult, Links};
use crate::person::{AnswerError, ApprovalAnswer, PendingPrompt, PersonChannel, Prompt};
use crate::registry::{ConsentDecision, DeviceRegistry};
use std::sync::Arc;

/// Counts the calls that reach the device.
#[derive(Default)]
struct Counter(Mutex<Vec<Value>>);

impl DeviceLink for Counter {
    fn invoke<'a>(
        &'a self,
        _capability: &'a str,
        input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        self.0.lock().unwrap().push(Value::Object(input.clone()));
        async { Ok(None) }.boxed()
    }
}

/// What a decision said of the person.
#[derive(Debug, Clone, PartialEq)]
struct Said {
    allowed: bool,
    person: Option<bool>,
    allowance: Option<AllowanceUse>,
}

struct Setup {
    adapter: DeviceToolAdapter,
    person: PersonChannel,
    link: Arc<Counter>,
    said: Arc<Mutex<Vec<Said>>>,
}

const ASK_ACTUATORS: &str = "version: 1\npolicies:\n  - name: ask-actuators\n    action: device_use\n    condition: \"capabilityKind equals actuator\"\n    decision: require_approval\n    message: Lamp actions need a yes\n";

async fn pair_lamp(registry: &DeviceRegistry) {
    registry
        .pair(
            &lamp(),
            |_| {},
            |_| async { Ok::<_, ()>(ConsentDecision::approve(["set_light", "strobe"])) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
}

async fn setup() -> Setup {
    let registry = Arc::new(DeviceRegistry::new());
    pair_lamp(&registry).await;
    let links = Arc::new(Links::new());
    let link = Arc::new(Counter::default());
    links.connect("desk-lamp", Arc::clone(&link) as Arc<dyn DeviceLink>);
    let said = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&said);
    let adapter = DeviceToolAdapter::new(registry, links)
        .with_policies(Arc::new(PolicySet::from_yaml_str(ASK_ACTUATORS).unwrap()))
        .with_decision_hook(Arc::new(move |d: &DecisionRecord<'_>| {
            sink.lock().unwrap().push(Said {
                allowed: d.allowed,
                person: d.person_answer,
                allowance: d.allowance,
            });
        }));
    Setup {
        adapter,
        person: PersonChannel::new(Duration::from_secs(600)),
        link,
        said,
    }
}

const SET_LIGHT: &str = "device__desk_lamp__set_light";

impl Setup {
    fn ctx<'a>(&'a self, agent: Option<&'a str>) -> CallContext<'a> {
        CallContext {
            agent_id: agent,
            approver: Some(&self.person),
            ..CallContext::default()
        }
    }

    /// A call that must not wait for the person: its outcome.
    fn unasked(&self, agent: Option<&str>, tool: &str, input: Value) -> ToolOutcome {
        self.adapter
            .execute(tool, input, self.ctx(agent))
            .now_or_never()
            .expect("the call waited for the person")
    }

    /// A call that asks the person, answered with `answer`; its outcome and
    /// the prompt it showed.
    async fn asked(
        &self,
        agent: Option<&str>,
        input: Value,
        answer: ApprovalAnswer,
    ) -> (ToolOutcome, PendingPrompt) {
        let call = self.adapter.execute(SET_LIGHT, input, self.ctx(agent));
        tokio::pin!(call);
        let prompt = loop {
            tokio::select! {
                outcome = &mut call => panic!("answered without asking: {outcome:?}"),
                () = tokio::task::yield_now() => {}
            }
            if let Some(prompt) = self.person.pending().into_iter().next() {
                break prompt;
            }
        };
        self.person.answer_approval_with(prompt.id, answer).unwrap();
        (call.await, prompt)
    }

    fn last(&self) -> Said {
        self.said.lock().unwrap().last().cloned().unwrap()
    }
}

fn remember(scope: AllowanceScope) -> ApprovalAnswer {
    ApprovalAnswer::Remember(Remember {
        scope,
        minutes: AllowanceMinutes::new(15).unwrap(),
    })
}

#[tokio::test]
async fn exact_arguments_answer_only_the_same_call_of_the_same_agent() {
    let s = setup().await;
    let on = json!({"on": true, "brightness": 30});
    let (outcome, prompt) = s
        .asked(
            Some("helper"),
            on.clone(),
            remember(AllowanceScope::Arguments),
        )
        .await;
    assert!(outcome.is_ok());
    assert!(prompt.can_remember);
    let made = s.adapter.registry().allowances().list();
    assert_eq!(made.len(), 1);
    let id = made[0].id;
    assert_eq!(
        s.last(),
        Said {
            allowed: true,
            person: Some(true),
            allowance: Some(AllowanceUse::Created(id))
        }
    );
    // The same call again, keys in another order: nobody is asked.
    let again = json!({"brightness": 30, "on": true});
    assert!(s.unasked(Some("helper"), SET_LIGHT, again).is_ok());
    assert_eq!(
        s.last(),
        Said {
            allowed: true,
            person: None,
            allowance: Some(AllowanceUse::Used(id))
        }
    );
    assert_eq!(s.link.0.lock().unwrap().len(), 2);
    // Other arguments, or another agent: asked again.
    let (_, _) = s
        .asked(Some("helper"), json!({"on": false}), ApprovalAnswer::Refuse)
        .await;
    assert_eq!(s.last().person, Some(false));
    let (_, _) = s.asked(Some("other"), on, ApprovalAnswer::Once).await;
    assert_eq!(
        s.last(),
        Said {
            allowed: true,
            person: Some(true),
            allowance: None
        }
    );
    assert_eq!(s.adapter.registry().allowances().list()[0].uses, 1);
}

#[tokio::test]
async fn a_capability_answers_any_arguments_until_revoked() {
    let s = setup().await;
    s.asked(
        Some("helper"),
        json!({"on": true}),
        remember(AllowanceScope::Capability),
    )
    .await;
    for input in [json!({"on": false}), json!({"on": true, "brightness": 5})] {
        assert!(s.unasked(Some("helper"), SET_LIGHT, input).is_ok());
    }
    // Another capability of the same device is not covered.
    let strobe = s
        .adapter
        .execute(
            "device__desk_lamp__strobe",
            json!({}),
            s.ctx(Some("helper")),
        )
        .now_or_never();
    assert!(strobe.is_none(), "strobe was not asked about");
    // Revoked and granted again: the grant is new, the person is asked.
    let registry = s.adapter.registry();
    registry.revoke("desk-lamp", "set_light").unwrap();
    registry.grant("desk-lamp", "set_light").unwrap();
    assert!(registry.allowances().list().is_empty());
    let asked = s
        .adapter
        .execute(SET_LIGHT, json!({"on": true}), s.ctx(Some("helper")))
        .now_or_never();
    assert!(asked.is_none(), "answered by a revoked allowance");
}

#[tokio::test]
async fn a_new_pairing_drops_the_allowances_of_the_old_one() {
    let s = setup().await;
    s.asked(
        Some("helper"),
        json!({"on": true}),
        remember(AllowanceScope::Capability),
    )
    .await;
    pair_lamp(s.adapter.registry()).await;
    assert!(s.adapter.registry().allowances().list().is_empty());
    let asked = s
        .adapter
        .execute(SET_LIGHT, json!({"on": true}), s.ctx(Some("helper")))
        .now_or_never();
    assert!(asked.is_none(), "answered by the old pairing's allowance");
}

#[tokio::test]
async fn a_block_is_never_lifted_by_an_allowance() {
    let s = setup().await;
    s.asked(
        Some("helper"),
        json!({"on": true}),
        remember(AllowanceScope::Capability),
    )
    .await;
    let block = format!(
        "{ASK_ACTUATORS}  - name: no-helper\n    action: device_use\n    condition: \"agentId equals helper\"\n    decision: block\n    message: not the helper\n"
    );
    s.adapter
        .set_policies(Arc::new(PolicySet::from_yaml_str(&block).unwrap()));
    match s.unasked(Some("helper"), SET_LIGHT, json!({"on": true})) {
        ToolOutcome::Refused { reason } => assert!(reason.starts_with("[policy]"), "{reason}"),
        ToolOutcome::Ok { .. } => panic!("a block was lifted"),
    }
    assert_eq!(s.last().allowance, None);
    assert_eq!(s.adapter.registry().allowances().list()[0].uses, 0);
}

#[tokio::test]
async fn a_call_of_no_agent_is_allowed_once_or_refused() {
    let s = setup().await;
    let call = s
        .adapter
        .execute(SET_LIGHT, json!({"on": true}), s.ctx(None));
    tokio::pin!(call);
    let prompt = loop {
        tokio::select! {
            outcome = &mut call => panic!("answered without asking: {outcome:?}"),
            () = tokio::task::yield_now() => {}
        }
        if let Some(prompt) = s.person.pending().into_iter().next() {
            break prompt;
        }
    };
    assert!(!prompt.can_remember);
    assert!(matches!(prompt.prompt, Prompt::Approval(_)));
    for scope in [AllowanceScope::Arguments, AllowanceScope::Capability] {
        assert_eq!(
            s.person.answer_approval_with(prompt.id, remember(scope)),
            Err(AnswerError::NotRememberable(prompt.id))
        );
    }
    // Still open: answered once.
    s.person
        .answer_approval_with(prompt.id, ApprovalAnswer::Once)
        .unwrap();
    assert!(call.await.is_ok());
    assert!(s.adapter.registry().allowances().list().is_empty());
}

#[tokio::test]
async fn the_persons_own_calls_neither_make_nor_use_allowances() {
    let s = setup().await;
    s.asked(
        Some("helper"),
        json!({"on": true}),
        remember(AllowanceScope::Capability),
    )
    .await;
    let ctx = CallContext {
        agent_id: Some("helper"),
        by_person: true,
        ..s.ctx(None)
    };
    let asked = s
        .adapter
        .execute(SET_LIGHT, json!({"on": true}), ctx)
        .now_or_never();
    assert!(
        asked.is_none(),
        "the person's call used an agent's allowance"
    );
}
