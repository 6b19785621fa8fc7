//! A call that opens a voice device's microphone (a sensor of a device of
//! kind `voice` that asks every time): its approval names the agent and
//! for how long, and a yes to it is remembered, or a remembered one used,
//! only while an `allow` rule names the call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_policy::PolicySet;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use crate::adapter::{CallContext, DeviceToolAdapter, ToolOutcome};
use crate::allowances::{AllowanceMinutes, AllowanceScope, Remember};
use crate::link::{DeviceLink, InvokeResult, Links};
use crate::person::{AnswerError, ApprovalAnswer, PendingPrompt, PersonChannel, Prompt};
use crate::registry::{ConsentDecision, DeviceRegistry};
use dk_proto::admin::MicrophoneRequest;

const LISTEN: &str = "device__kitchen__listen";
const LEVEL: &str = "device__kitchen__level";

/// An allow rule naming the helper's `listen`: the person's explicit word.
const ALLOW_LISTEN: &str = "version: 1\npolicies:\n  - name: helper-may-listen\n    action: device_use\n    condition: \"agentId equals helper and capability equals listen\"\n    decision: allow\n    message: the helper listens in the kitchen\n";

/// Every sensor asks: `level` (a sensor that does not ask every time) is
/// asked through this rule.
const ASK_LEVEL: &str = "version: 1\npolicies:\n  - name: ask-level\n    action: device_use\n    condition: \"capability equals level\"\n    decision: require_approval\n    message: the level needs a yes\n";

fn voice() -> Value {
    json!({
        "id": "kitchen", "name": "Kitchen", "kind": "voice", "version": "1",
        "capabilities": [
            {"name": "listen", "kind": "sensor", "confirm": true,
             "description": "Record from the microphone.",
             "params": {"max_seconds": {"type": "number", "required": true, "description": "longest"}}},
            {"name": "level", "kind": "sensor", "description": "The speaker's volume."},
        ],
    })
}

/// Counts the calls that reach the device.
#[derive(Default)]
struct Counter(Mutex<usize>);

impl DeviceLink for Counter {
    fn invoke<'a>(
        &'a self,
        _capability: &'a str,
        _input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        *self.0.lock().unwrap() += 1;
        async { Ok(None) }.boxed()
    }
}

struct Setup {
    adapter: DeviceToolAdapter,
    person: PersonChannel,
    link: Arc<Counter>,
}

async fn setup(rules: &str) -> Setup {
    let registry = Arc::new(DeviceRegistry::new());
    registry
        .pair(
            &voice(),
            |_| {},
            |_| async { Ok::<_, ()>(ConsentDecision::approve(["listen", "level"])) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    let links = Arc::new(Links::new());
    let link = Arc::new(Counter::default());
    links.connect("kitchen", Arc::clone(&link) as Arc<dyn DeviceLink>);
    let adapter = DeviceToolAdapter::new(registry, links)
        .with_policies(Arc::new(PolicySet::from_yaml_str(rules).unwrap()));
    Setup {
        adapter,
        person: PersonChannel::new(Duration::from_secs(600)),
        link,
    }
}

impl Setup {
    fn ctx(&self) -> CallContext<'_> {
        CallContext {
            agent_id: Some("helper"),
            approver: Some(&self.person),
            ..CallContext::default()
        }
    }

    /// Calls `tool` and waits for its prompt; answers it with each of
    /// `answers` in turn (all but the last refused), and returns the
    /// prompt, the refusals and the call's outcome.
    async fn asked(
        &self,
        tool: &str,
        input: Value,
        answers: &[ApprovalAnswer],
    ) -> (PendingPrompt, Vec<AnswerError>, ToolOutcome) {
        let call = self.adapter.execute(tool, input, self.ctx());
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
        let mut refused = Vec::new();
        for answer in answers {
            if let Err(e) = self.person.answer_approval_with(prompt.id, *answer) {
                refused.push(e);
            }
        }
        (prompt, refused, call.await)
    }

    /// A call that must not wait for the person: its outcome, or `None`
    /// when it waits.
    fn unasked(&self, tool: &str, input: Value) -> Option<ToolOutcome> {
        self.adapter.execute(tool, input, self.ctx()).now_or_never()
    }
}

fn remember() -> ApprovalAnswer {
    ApprovalAnswer::Remember(Remember {
        scope: AllowanceScope::Capability,
        minutes: AllowanceMinutes::new(15).unwrap(),
    })
}

fn microphone(prompt: &PendingPrompt) -> Option<MicrophoneRequest> {
    match &prompt.prompt {
        Prompt::Approval(request) => request.microphone,
        Prompt::Consent(_) => None,
    }
}

fn agent(prompt: &PendingPrompt) -> Option<String> {
    match &prompt.prompt {
        Prompt::Approval(request) => request.agent_id.clone(),
        Prompt::Consent(_) => None,
    }
}

#[tokio::test]
async fn a_yes_to_listen_is_not_remembered_without_an_allow_rule() {
    let s = setup("version: 1\npolicies: []\n").await;
    let (prompt, refused, outcome) = s
        .asked(
            LISTEN,
            json!({"max_seconds": 12}),
            &[remember(), ApprovalAnswer::Once],
        )
        .await;
    // The person is told who listens and for how long.
    assert_eq!(agent(&prompt).as_deref(), Some("helper"));
    assert_eq!(
        microphone(&prompt),
        Some(MicrophoneRequest {
            max_seconds: Some(12)
        })
    );
    assert_eq!(
        microphone(&prompt).map(|m| m.words()).as_deref(),
        Some("for at most 12 s")
    );
    assert!(!prompt.can_remember);
    assert_eq!(refused, [AnswerError::NotRememberable(prompt.id)]);
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(s.adapter.registry().allowances().list().is_empty());
    // Asked again next time.
    assert!(
        s.unasked(LISTEN, json!({"max_seconds": 12})).is_none(),
        "the microphone opened without the person"
    );
    assert_eq!(*s.link.0.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_allow_rule_lets_a_yes_to_listen_be_remembered_while_it_stands() {
    let s = setup(ALLOW_LISTEN).await;
    let (prompt, refused, outcome) = s
        .asked(LISTEN, json!({"max_seconds": 3.5}), &[remember()])
        .await;
    assert!(prompt.can_remember);
    assert!(refused.is_empty(), "{refused:?}");
    assert!(outcome.is_ok(), "{outcome:?}");
    // Rounded up: the person is never told less than the call may take.
    assert_eq!(microphone(&prompt).and_then(|m| m.max_seconds), Some(4));
    assert_eq!(s.adapter.registry().allowances().list().len(), 1);
    let again = s.unasked(LISTEN, json!({"max_seconds": 20}));
    assert!(
        again.is_some_and(|o| o.is_ok()),
        "not answered by the allowance"
    );
    // The rule goes: the allowance no longer answers for the person.
    s.adapter
        .set_policies(Arc::new(PolicySet::from_yaml_str(ASK_LEVEL).unwrap()));
    assert!(
        s.unasked(LISTEN, json!({"max_seconds": 20})).is_none(),
        "a remembered yes opened the microphone without an allow rule"
    );
    assert_eq!(*s.link.0.lock().unwrap(), 2);
}

#[tokio::test]
async fn a_sensor_that_does_not_ask_every_time_is_not_a_microphone() {
    let s = setup(ASK_LEVEL).await;
    let (prompt, refused, outcome) = s.asked(LEVEL, json!({}), &[remember()]).await;
    assert_eq!(microphone(&prompt), None);
    assert!(prompt.can_remember);
    assert!(refused.is_empty(), "{refused:?}");
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(s.unasked(LEVEL, json!({})).is_some_and(|o| o.is_ok()));
}
