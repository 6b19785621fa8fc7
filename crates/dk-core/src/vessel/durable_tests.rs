//! Durability within a bound, and a store that is slow or hangs: a call
//! reaches a device only while the store takes the audit log's writes (a
//! store that hangs is noticed within the bound, and the check is made
//! again after the person's yes), and what a call asks of the store is
//! awaited without holding the thread, for at most the bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dk_policy::PolicySet;
use serde_json::{Value, json};

use crate::adapter::{ApprovalError, ApprovalRequest, ApproverFn, CallContext, ToolOutcome};
use crate::store::testing::FaultyStore;
use crate::store::{MemoryStore, Store, WriterOptions};

/// The bound the vessels here keep.
const BOUND: Duration = Duration::from_millis(200);

const AUDIT_FAILING: &str =
    "[8dk-deny] the audit log cannot be written now: no call is made until it can";

/// A lamp that answers every call at once and counts them.
#[derive(Default)]
struct Lamp {
    calls: AtomicUsize,
}

impl crate::link::DeviceLink for Lamp {
    fn invoke<'a>(
        &'a self,
        _: &'a str,
        _: &'a serde_json::Map<String, Value>,
        _: Duration,
    ) -> futures::future::BoxFuture<'a, crate::link::InvokeResult> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(None) })
    }
}

/// A vessel over `store` holding calls to [`BOUND`], with `rules`, and the
/// desk lamp paired with every capability granted, on `lamp`.
async fn vessel(store: Arc<dyn Store>, rules: &str, lamp: Arc<Lamp>) -> Arc<crate::Vessel> {
    let limits = crate::Limits {
        durable_within: BOUND,
        ..crate::Limits::default()
    };
    let policies = if rules.is_empty() {
        PolicySet::empty()
    } else {
        PolicySet::from_yaml_str(rules).unwrap()
    };
    let vessel =
        crate::Vessel::open_with_writer(store, policies, limits, WriterOptions::default()).unwrap();
    vessel
        .registry()
        .pair(
            &dk_testkit::lamp(),
            |_| {},
            |_| async {
                Ok::<_, ()>(crate::registry::ConsentDecision::approve([
                    "read_light",
                    "set_light",
                    "strobe",
                ]))
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    vessel.links().connect("desk-lamp", lamp);
    vessel
}

async fn set_light(vessel: &crate::Vessel) -> ToolOutcome {
    vessel
        .adapter()
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": true}),
            CallContext::default(),
        )
        .await
}

fn refusal(outcome: &ToolOutcome) -> Option<&str> {
    match outcome {
        ToolOutcome::Refused { reason } => Some(reason),
        ToolOutcome::Ok { .. } => None,
    }
}

#[tokio::test]
async fn a_store_that_hangs_refuses_calls_before_the_device_within_the_bound() {
    let store = Arc::new(FaultyStore::default());
    let lamp = Arc::new(Lamp::default());
    let vessel = vessel(Arc::clone(&store) as Arc<dyn Store>, "", Arc::clone(&lamp)).await;
    assert!(set_light(&vessel).await.is_ok());
    let frozen = store.freeze();
    let made = AtomicUsize::new(1);
    // Calls made once the store hangs are refused once the bound passed
    // (how soon after it is for a bench to measure, not a test).
    let refused = dk_testkit::eventually_async("a call refused while the store hangs", || async {
        made.fetch_add(1, Ordering::SeqCst);
        refusal(&set_light(&vessel).await).map(str::to_owned)
    })
    .await;
    let mut calls = made.load(Ordering::SeqCst);
    assert_eq!(refused, AUDIT_FAILING);
    let reached = lamp.calls.load(Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(refusal(&set_light(&vessel).await), Some(AUDIT_FAILING));
        calls += 1;
    }
    assert_eq!(lamp.calls.load(Ordering::SeqCst), reached);
    assert!(!vessel.store_takes_writes());
    drop(frozen);
    // Once it answers, calls reach the lamp again, and every call has its
    // decision in the log.
    let made = AtomicUsize::new(0);
    dk_testkit::eventually_async("a call reaching the lamp again", || async {
        made.fetch_add(1, Ordering::SeqCst);
        set_light(&vessel).await.is_ok().then_some(())
    })
    .await;
    calls += made.load(Ordering::SeqCst);
    vessel.flush_audit().unwrap();
    let decisions = store
        .read_audit(0, 10_000)
        .unwrap()
        .iter()
        .filter(|e| e.kind == "decision")
        .count();
    assert_eq!(decisions, calls);
}

#[tokio::test]
async fn a_yes_given_after_the_store_hung_does_not_reach_the_device() {
    let store = Arc::new(FaultyStore::default());
    let lamp = Arc::new(Lamp::default());
    let vessel = vessel(Arc::clone(&store) as Arc<dyn Store>, "", Arc::clone(&lamp)).await;
    // The person is asked (strobe asks every time) and answers yes once
    // the store has hung longer than the bound.
    let (asked, asked_rx) = tokio::sync::oneshot::channel::<()>();
    let (answer, answered) = tokio::sync::oneshot::channel::<()>();
    let asked = Mutex::new(Some(asked));
    let answered = Arc::new(tokio::sync::Mutex::new(Some(answered)));
    let approver = ApproverFn(move |_: ApprovalRequest| {
        if let Some(asked) = asked.lock().unwrap().take() {
            let _ = asked.send(());
        }
        let answered = Arc::clone(&answered);
        async move {
            if let Some(answered) = answered.lock().await.take() {
                let _ = answered.await;
            }
            Ok::<_, ApprovalError>(true)
        }
    });
    let ctx = CallContext {
        approver: Some(&approver),
        ..CallContext::default()
    };
    let call = vessel
        .adapter()
        .execute("device__desk_lamp__strobe", json!({}), ctx);
    let answering = async {
        asked_rx.await.unwrap();
        let frozen = store.freeze();
        dk_testkit::eventually("the store found hung", || !vessel.store_takes_writes()).await;
        answer.send(()).unwrap();
        frozen
    };
    let (outcome, frozen) = tokio::join!(call, answering);
    assert_eq!(refusal(&outcome), Some(AUDIT_FAILING));
    assert_eq!(lamp.calls.load(Ordering::SeqCst), 0);
    drop(frozen);
    vessel.flush_audit().unwrap();
    let entries = store.read_audit(0, 100).unwrap();
    let last = entries.iter().rev().find(|e| e.kind == "decision").unwrap();
    assert_eq!(last.entry["reason"], AUDIT_FAILING);
    assert_eq!(last.entry["person"], "approved");
}

const LIMITED: &str = "version: 1
policies:
  - name: a-hundred-an-hour
    action: device_use
    condition: deviceId equals desk-lamp and capability equals set_light
    decision: block
    message: the lamp has been switched enough
    limit: 100 per 1h
";

/// On one thread: a call under a rule with a `limit` whose store does not
/// answer is refused within the bound, and a call that needs nothing of the
/// store goes on meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn a_limit_the_store_does_not_count_in_time_refuses_only_its_call() {
    let store = Arc::new(FaultyStore::over(MemoryStore::new()));
    let lamp = Arc::new(Lamp::default());
    let vessel = vessel(
        Arc::clone(&store) as Arc<dyn Store>,
        LIMITED,
        Arc::clone(&lamp),
    )
    .await;
    let gate = store.hold_call_path();
    // Should the count block the thread, nothing else would run: the gate
    // then opens late, and the limited call goes through.
    let open = gate.open.clone();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let _ = finished.recv_timeout(dk_testkit::PATIENCE);
        let _ = open.send(());
    });
    let limited = set_light(&vessel);
    let other = async {
        gate.entered.recv().unwrap();
        // The count is being asked for: a read of the lamp needs nothing
        // of the store and is answered meanwhile.
        let read = vessel
            .adapter()
            .execute(
                "device__desk_lamp__read_light",
                json!({}),
                CallContext::default(),
            )
            .await;
        (read, Instant::now())
    };
    let (limited, (read, read_at)) = tokio::join!(limited, other);
    let refused_at = Instant::now();
    assert!(read.is_ok(), "{read:?}");
    let reason = refusal(&limited).unwrap_or("allowed");
    assert!(
        reason.starts_with("[8dk-deny] the counts of rules with a limit cannot be kept"),
        "{reason}"
    );
    assert!(reason.contains("did not answer within 200 ms"), "{reason}");
    assert!(read_at <= refused_at);
    // The lamp saw the read only.
    assert_eq!(lamp.calls.load(Ordering::SeqCst), 1);
    done.send(()).unwrap();
    watchdog.join().unwrap();
    drop(gate);
}
