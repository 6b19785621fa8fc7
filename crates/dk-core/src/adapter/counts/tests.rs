//! Rules with a `limit` in the adapter: counted per agent, given back when a
//! call is not made, and kept across a restart in a real SQLite store.

use std::sync::Arc;
use std::time::Duration;

use dk_policy::PolicySet;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use crate::adapter::{ApprovalError, ApproverFn, CallContext, DeviceToolAdapter, ToolOutcome};
use crate::link::{DeviceLink, InvokeResult, Links};
use crate::registry::{ConsentDecision, DeviceRegistry};
use crate::store::{SqliteStore, Store};

const RULES: &str = "version: 1
policies:
  - name: two-an-hour
    action: device_use
    condition: deviceId equals desk-lamp and capability equals set_light
    decision: block
    message: the lamp has been switched enough
    limit: 2 per 1h
";

struct Lamp;

impl DeviceLink for Lamp {
    fn invoke<'a>(
        &'a self,
        _capability: &'a str,
        _input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        async { Ok(None) }.boxed()
    }
}

/// A vessel's adapter over the store at `path`, with the lamp paired (the
/// first time) and connected.
async fn adapter(store: Arc<dyn Store>, pair: bool) -> DeviceToolAdapter {
    let registry = Arc::new(DeviceRegistry::open(store).unwrap());
    if pair {
        let manifest = dk_testkit::lamp();
        let decision = ConsentDecision::approve(["set_light", "read_light"]);
        registry
            .pair(
                &manifest,
                |_| {},
                |_| async move { Ok::<_, ()>(decision) },
                Duration::from_secs(1),
            )
            .await
            .unwrap();
    }
    let links = Arc::new(Links::new());
    links.connect("desk-lamp", Arc::new(Lamp) as Arc<dyn DeviceLink>);
    DeviceToolAdapter::new(registry, links)
        .with_policies(Arc::new(PolicySet::from_yaml_str(RULES).unwrap()))
}

async fn switch(adapter: &DeviceToolAdapter, agent: &str, ctx: CallContext<'_>) -> ToolOutcome {
    let ctx = CallContext {
        agent_id: Some(agent),
        ..ctx
    };
    adapter
        .execute("device__desk_lamp__set_light", json!({"on": true}), ctx)
        .await
}

const BLOCKED: &str = "[policy] [two-an-hour] the lamp has been switched enough";

/// The limit's refusal: the rule's reason, then when the next call is
/// allowed, as the rate limiter says it (within the hour's window, rounded
/// up to the minute).
#[track_caller]
fn blocked(reason: Option<&str>) {
    let reason = reason.unwrap_or_default();
    let wait = reason
        .strip_prefix(BLOCKED)
        .and_then(|tail| tail.strip_prefix("; calls are allowed again in "));
    let minutes = match wait {
        Some("1 h") => Some(60),
        other => other
            .and_then(|tail| tail.strip_suffix(" min"))
            .and_then(|n| n.parse::<u32>().ok()),
    };
    assert!(minutes.is_some_and(|n| (1..=60).contains(&n)), "{reason:?}");
}

#[tokio::test]
async fn a_limit_counts_made_calls_per_agent_and_survives_a_restart() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("dk.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let first = adapter(Arc::clone(&store), true).await;

    // A call that is not made (a malformed input, the person's no) does not count.
    let bad = first
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": "yes"}),
            CallContext {
                agent_id: Some("main"),
                ..CallContext::default()
            },
        )
        .await;
    assert!(!bad.is_ok(), "{bad:?}");
    let no = ApproverFn(|_| async { Ok(false) });
    let asked = first
        .execute(
            "device__desk_lamp__strobe",
            json!({}),
            CallContext {
                agent_id: Some("main"),
                approver: Some(&no),
                ..CallContext::default()
            },
        )
        .await;
    assert!(!asked.is_ok());

    for _ in 0..2 {
        let outcome = switch(&first, "main", CallContext::default()).await;
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    blocked(
        switch(&first, "main", CallContext::default())
            .await
            .reason(),
    );
    // Another agent has its own count; reading the lamp is another capability.
    assert!(
        switch(&first, "guest", CallContext::default())
            .await
            .is_ok()
    );
    let read = first
        .execute(
            "device__desk_lamp__read_light",
            json!({}),
            CallContext {
                agent_id: Some("main"),
                ..CallContext::default()
            },
        )
        .await;
    assert!(read.is_ok(), "{read:?}");
    drop(first);
    drop(store);

    // A new vessel over the same file: the counts are still there.
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let hits = store.load_rate_hits(0).unwrap();
    assert_eq!(
        hits.iter()
            .map(|h| (h.rule.as_str(), h.agent.as_str(), h.calls, h.window_ms))
            .collect::<Vec<_>>(),
        [
            ("two-an-hour", "main", 2, 3_600_000),
            ("two-an-hour", "main", 2, 3_600_000),
            ("two-an-hour", "guest", 2, 3_600_000)
        ]
    );
    let second = adapter(store, false).await;
    blocked(
        switch(&second, "main", CallContext::default())
            .await
            .reason(),
    );
    assert!(
        switch(&second, "guest", CallContext::default())
            .await
            .is_ok()
    );
    blocked(
        switch(&second, "guest", CallContext::default())
            .await
            .reason(),
    );
}

const ASKING: &str = "version: 1
policies:
  - name: two-an-hour
    action: device_use
    condition: deviceId equals desk-lamp and capability equals set_light
    decision: block
    message: the lamp has been switched enough
    limit: 2 per 1h
  - name: ask
    action: device_use
    condition: capability equals set_light
    decision: require_approval
    message: ask
";

#[tokio::test]
async fn calls_waiting_for_the_person_hold_their_count() {
    use futures::StreamExt;
    let dir = tempfile::TempDir::new().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("dk.db")).unwrap());
    let adapter = adapter(store, true).await;
    adapter.set_policies(Arc::new(PolicySet::from_yaml_str(ASKING).unwrap()));

    // Four calls at once; the person answers once told to.
    let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let answer = Arc::new(tokio::sync::Semaphore::new(0));
    let release = Arc::clone(&answer);
    let person = ApproverFn(move |_| {
        let asked_tx = asked_tx.clone();
        let answer = Arc::clone(&answer);
        async move {
            let _ = asked_tx.send(());
            let permit = answer
                .acquire()
                .await
                .map_err(|e| ApprovalError::Unreachable(e.to_string()))?;
            permit.forget();
            Ok(true)
        }
    });
    let ctx = CallContext {
        approver: Some(&person),
        ..CallContext::default()
    };
    let mut calls: futures::stream::FuturesUnordered<_> =
        (0..4).map(|_| switch(&adapter, "main", ctx)).collect();
    // Two are counted and asked; while they wait, the other two find the
    // limit reached.
    let (mut finished, mut waiting) = (Vec::new(), 0);
    while finished.len() < 2 || waiting < 2 {
        tokio::select! {
            Some(outcome) = calls.next() => finished.push(outcome),
            Some(()) = asked.recv() => waiting += 1,
        }
    }
    assert_eq!(waiting, 2);
    for outcome in &finished {
        blocked(outcome.reason());
    }
    release.add_permits(2);
    let answered: Vec<ToolOutcome> = calls.collect().await;
    assert_eq!(answered.len(), 2);
    assert!(answered.iter().all(ToolOutcome::is_ok), "{answered:?}");
    blocked(switch(&adapter, "main", ctx).await.reason());
}

#[tokio::test]
async fn a_call_the_person_refuses_gives_its_count_back() {
    let dir = tempfile::TempDir::new().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("dk.db")).unwrap());
    let adapter = adapter(Arc::clone(&store), true).await;
    adapter.set_policies(Arc::new(PolicySet::from_yaml_str(ASKING).unwrap()));
    let no = ApproverFn(|_| async { Ok(false) });
    let refuse = CallContext {
        approver: Some(&no),
        ..CallContext::default()
    };
    for _ in 0..5 {
        assert_eq!(
            switch(&adapter, "main", refuse).await.reason(),
            Some("[policy] the person said no: [ask] ask")
        );
    }
    assert!(store.load_rate_hits(0).unwrap().is_empty());
    let yes = ApproverFn(|_| async { Ok(true) });
    let allow = CallContext {
        approver: Some(&yes),
        ..CallContext::default()
    };
    assert!(switch(&adapter, "main", allow).await.is_ok());
    assert_eq!(store.load_rate_hits(0).unwrap().len(), 1);
}
