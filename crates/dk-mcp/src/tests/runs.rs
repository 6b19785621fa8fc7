//! Rate limits and run budgets over real sockets, with rmcp's client as the
//! agent: a steady agent calls for hours in one session without a refusal,
//! a runaway loop is refused once its burst is spent (and audited), a run
//! named in `_meta` is refused past its budget while calls outside it go
//! on, and a malformed run key is refused and recorded. The vessel's clock
//! is a hand clock: no test waits in real time.

use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{MetaObject, RequestMetaObject};

use super::*;
use crate::adapter::RunClock;

const READ: &str = "device__desk_lamp__read_light";

/// The lamp on a vessel with the default limits, its clock in the test's
/// hand (starting at 1,000,000 ms), one agent `main`.
async fn vessel_on_a_hand_clock() -> (Arc<Vessel>, Arc<AgentDirectory>, String, Arc<AtomicU64>) {
    let vessel = vessel_with_lamp(&["read_light", "set_light"]).await;
    let now = Arc::new(AtomicU64::new(1_000_000));
    let read = Arc::clone(&now);
    let clock: RunClock = Arc::new(move || read.load(Ordering::SeqCst));
    vessel.adapter().set_run_clock(clock);
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    (vessel, agents, credential, now)
}

fn advance(now: &AtomicU64, ms: u64) {
    now.fetch_add(ms, Ordering::SeqCst);
}

/// A call of `tool` whose `_meta` is `meta`.
async fn call_with_meta(
    client: &rmcp::Peer<RoleClient>,
    tool: &str,
    meta: Value,
) -> CallToolResult {
    let Value::Object(meta) = meta else {
        panic!("meta must be an object");
    };
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(Map::new());
    let mut merged = params.meta.take().unwrap_or_default();
    merged.0.0.extend(meta);
    params.meta = Some(RequestMetaObject(MetaObject(merged.0.0)));
    client.call_tool(params).await.unwrap()
}

fn refused_with(result: &CallToolResult) -> Option<String> {
    (result.is_error == Some(true)).then(|| text(result))
}

#[tokio::test]
async fn a_steady_agent_calls_for_hours_in_one_session_without_a_refusal() {
    let (vessel, agents, credential, now) = vessel_on_a_hand_clock().await;
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    // A thermostat-like read every 30 s for two and a half hours, then
    // every second for five minutes: 600 calls in one MCP session, far past
    // the 32 of a run budget, none refused.
    let mut refusals = Vec::new();
    for i in 0..600 {
        advance(&now, if i < 300 { 30_000 } else { 1_000 });
        let result = call(&client, READ, json!({})).await;
        refusals.extend(refused_with(&result));
    }
    assert_eq!(refusals, Vec::<String>::new());
    let decisions = audited_decisions(&vessel);
    assert_eq!(decisions.len(), 600);
    assert!(decisions.iter().all(|d| d["allowed"] == true));
    // Nothing is left behind for it: no run, no bucket that is not full
    // but the one it is using now.
    assert_eq!(vessel.adapter().tracked_runs(), 0);
    assert!(vessel.adapter().tracked_rate_buckets() <= 2);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_runaway_loop_is_refused_within_its_burst_and_every_refusal_is_audited() {
    let (vessel, agents, credential, now) = vessel_on_a_hand_clock().await;
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    // As fast as it can: the clock does not move.
    let mut allowed = 0;
    let mut first_refusal = None;
    for i in 0..50 {
        let result = call(&client, READ, json!({})).await;
        match refused_with(&result) {
            None => allowed += 1,
            Some(reason) => {
                first_refusal.get_or_insert((i, reason));
            }
        }
    }
    let refusal = "[8dk-deny] rate limit: this agent's calls to device \"desk-lamp\" are limited to 120 a minute, in bursts of 20; calls to it are allowed again in 500 ms";
    assert_eq!(allowed, 20);
    assert_eq!(first_refusal, Some((20, refusal.to_owned())));
    let decisions = audited_decisions(&vessel);
    assert_eq!(decisions.len(), 50);
    let refused: Vec<&Value> = decisions.iter().filter(|d| d["allowed"] == false).collect();
    assert_eq!(refused.len(), 30);
    for d in refused {
        assert_eq!(d["reason"], refusal);
        assert_eq!(d["agentId"], "main");
        assert!(d["sessionId"].is_string(), "{d}");
    }
    // Half a second later, one call more; the loop is held to the rate.
    advance(&now, 500);
    assert_eq!(refused_with(&call(&client, READ, json!({})).await), None);
    assert!(refused_with(&call(&client, READ, json!({})).await).is_some());
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_run_named_in_meta_is_refused_past_its_budget_while_calls_outside_it_go_on() {
    let (vessel, agents, credential, now) = vessel_on_a_hand_clock().await;
    let (_, other) = agents
        .add("other", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let task = json!({"dk/run": "task-1", "dk/runLimits": {"maxToolCalls": 3}});
    let spent =
        "[8dk-deny] run limit maxToolCalls of 3 exceeded: the budget of run \"task-1\" is spent";
    for _ in 0..3 {
        advance(&now, 1_000);
        let result = call_with_meta(&client, READ, task.clone()).await;
        assert_eq!(refused_with(&result), None);
    }
    advance(&now, 1_000);
    let result = call_with_meta(&client, READ, task.clone()).await;
    assert_eq!(refused_with(&result).as_deref(), Some(spent));
    // Outside the run, and in another run, calls go on.
    for meta in [json!({}), json!({"dk/run": "task-2"})] {
        advance(&now, 1_000);
        let result = call_with_meta(&client, READ, meta).await;
        assert_eq!(refused_with(&result), None);
    }
    // The run stays spent: named again without limits, or from a client
    // served without a session, it is the same run of the same agent.
    advance(&now, 1_000);
    let result = call_with_meta(&client, READ, json!({"dk/run": "task-1"})).await;
    assert_eq!(refused_with(&result).as_deref(), Some(spent));
    let stateless = connect_discover(&server.url, &credential).await;
    let result = call_with_meta(&stateless, READ, json!({"dk/run": "task-1"})).await;
    assert_eq!(refused_with(&result).as_deref(), Some(spent));
    // Another agent's run of the same name is its own.
    let (other_client, _) = connect(&server.url, other.expose()).await;
    let result = call_with_meta(&other_client, READ, json!({"dk/run": "task-1"})).await;
    assert_eq!(refused_with(&result), None);
    let refusals: Vec<Value> = audited_decisions(&vessel)
        .into_iter()
        .filter(|d| d["allowed"] == false)
        .collect();
    assert_eq!(refusals.len(), 3);
    assert!(
        refusals
            .iter()
            .all(|d| d["reason"] == spent && d["agentId"] == "main")
    );
    for client in [client, stateless, other_client] {
        client.cancel().await.unwrap();
    }
    server.stop().await;
}

#[tokio::test]
async fn a_malformed_run_in_meta_is_refused_and_recorded() {
    let (vessel, agents, credential, _) = vessel_on_a_hand_clock().await;
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let bad_id = "[8dk-deny] _meta \"dk/run\" must be a run id: 1 to 128 letters, digits, '.', '_', ':' or '-'";
    let cases = [
        (json!({"dk/run": ""}), bad_id.to_owned()),
        (json!({"dk/run": "a b"}), bad_id.to_owned()),
        (json!({"dk/run": "r".repeat(129)}), bad_id.to_owned()),
        (json!({"dk/run": 7}), bad_id.to_owned()),
        (
            json!({"dk/runLimits": {"maxToolCalls": 3}}),
            "[8dk-deny] _meta \"dk/runLimits\" is given without \"dk/run\"".to_owned(),
        ),
        (
            json!({"dk/run": "r", "dk/runLimits": {"maxTurns": 3}}),
            "[8dk-deny] _meta \"dk/runLimits\": the vessel does not enforce maxTurns; only maxToolCalls and maxWallTimeMs".to_owned(),
        ),
        (
            json!({"dk/run": "r", "dk/runLimits": {"maxToolCalls": 0}}),
            "[8dk-deny] _meta \"dk/runLimits\": maxToolCalls must be a positive safe integer at most 256".to_owned(),
        ),
        (
            json!({"dk/run": "r", "dk/runLimits": {"maxToolCall": 3}}),
            "[8dk-deny] _meta \"dk/runLimits\": unknown run limit `maxToolCall`".to_owned(),
        ),
        (
            json!({"dk/run": "r", "dk/runLimits": 3}),
            "[8dk-deny] _meta \"dk/runLimits\": runLimits must be an object".to_owned(),
        ),
    ];
    for (meta, expected) in &cases {
        let result = call_with_meta(&client, READ, meta.clone()).await;
        assert_eq!(refused_with(&result).as_ref(), Some(expected), "{meta}");
    }
    let decisions = audited_decisions(&vessel);
    assert_eq!(decisions.len(), cases.len());
    for (d, (_, expected)) in decisions.iter().zip(&cases) {
        assert_eq!(d["allowed"], false);
        assert_eq!(&d["reason"], expected.as_str());
        assert_eq!(d["agentId"], "main");
    }
    // Nothing was charged: no run, no bucket.
    assert_eq!(vessel.adapter().tracked_runs(), 0);
    assert_eq!(vessel.adapter().tracked_rate_buckets(), 0);
    client.cancel().await.unwrap();
    server.stop().await;
}
