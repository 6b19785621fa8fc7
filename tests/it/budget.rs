//! Rate limits and run budgets end to end: a vessel on loopback, configured
//! from a real `vessel.toml`, with a real lamp over WebSocket, charges each
//! agent's device calls to its rate and refuses the call past it before the
//! device sees it, says when calls are allowed again, and records the
//! refusal in the audit log; calls that name no run are charged to no run.

use dk_vessel::{CallContext, Limits, config};
use serde_json::{Value, json};

use crate::net::{DeviceRun, Running, start};

/// A vessel whose limits come from the configuration file `text`.
async fn start_configured(text: &str) -> Running {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("vessel.toml");
    std::fs::write(&path, text).unwrap();
    let config = config::load(&path).unwrap();
    let mut limits = Limits::default();
    config.apply_to(&mut limits);
    start(limits).await
}

/// `set_light` as `agent` in `session`, through the vessel's adapter (the
/// admin API's calls are the person's own and name no agent).
async fn set_light(running: &Running, agent: &str, session: &str) -> Value {
    let outcome = running
        .vessel
        .adapter()
        .execute(
            "device__desk_lamp__set_light",
            json!({"on": true}),
            CallContext {
                agent_id: Some(agent),
                session_id: Some(session),
                timeout: Some(std::time::Duration::from_secs(60)),
                ..CallContext::default()
            },
        )
        .await;
    json!(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_past_its_configured_rate_is_refused_and_audited() {
    // One call a minute to a device, in bursts of 3: the fourth call of a
    // quick loop is refused, whatever its session; no run budget is met, as
    // no call names a run.
    let running = start_configured(
        "[rateLimits]\nperDeviceCallsPerMinute = 1\nperDeviceBurst = 3\n\
         [runLimits]\nmaxToolCalls = 1\n",
    )
    .await;
    let lamp = dk_device::samples::Lamp::new();
    let options = dk_device::ClientOptions::new(running.device_url.clone());
    let device = DeviceRun::spawn(lamp.device(), options);
    running.approve_next(&["set_light"]).await;
    running.wait_connected("desk-lamp").await;

    for session in ["s1", "s1", "s2"] {
        assert_eq!(set_light(&running, "main", session).await["ok"], true);
    }
    let refusal = "[8dk-deny] rate limit: this agent's calls to device \"desk-lamp\" are limited to 1 a minute, in bursts of 3; calls to it are allowed again in ";
    for session in ["s1", "s3"] {
        let answer = set_light(&running, "main", session).await;
        assert_eq!(answer["ok"], false);
        let reason = answer["reason"].as_str().unwrap();
        let wait: u64 = reason
            .strip_prefix(refusal)
            .and_then(|rest| rest.strip_suffix(" ms"))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{reason}"));
        assert!((1..=60_000).contains(&wait), "{reason}");
    }
    // Another agent has a rate of its own.
    assert_eq!(set_light(&running, "other", "s1").await["ok"], true);
    assert_eq!(
        lamp.calls().len(),
        4,
        "the refused calls never reached the lamp"
    );

    running.vessel.flush_audit().unwrap();
    let entries = running
        .vessel
        .registry()
        .store()
        .read_audit(0, 100)
        .unwrap();
    let refused: Vec<&Value> = entries
        .iter()
        .filter(|e| e.kind == "decision" && e.entry["allowed"] == false)
        .map(|e| &e.entry)
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    for (entry, session) in refused.iter().zip(["s1", "s3"]) {
        assert!(
            entry["reason"].as_str().unwrap().starts_with(refusal),
            "{entry}"
        );
        assert_eq!(entry["agentId"], "main");
        assert_eq!(entry["sessionId"], session);
    }
    device.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test]
async fn a_configuration_with_a_limit_the_vessel_does_not_enforce_is_refused() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("vessel.toml");
    std::fs::write(&path, "[runLimits]\nmaxToolCalls = 32\nmaxTurns = 16\n").unwrap();
    assert_eq!(
        config::load(&path).unwrap_err().to_string(),
        "`runLimits.maxTurns` is not enforced by the vessel: the host that runs the model \
         counts turns, provider calls and tokens, so set it there; here only `maxToolCalls` \
         and `maxWallTimeMs` are allowed"
    );
}
