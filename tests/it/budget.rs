//! Run budgets end to end: a vessel on loopback charges each agent session's
//! device calls, refuses the call past the limit before the device sees it,
//! and the refusal is in the audit log with its reason, agent and session.

use dk_policy::{RunLimit, RunLimitsLayer};
use dk_vessel::{AgentRunLimits, Limits, VesselConfig};
use serde_json::{Value, json};

use crate::net::{DeviceRun, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_its_budget_is_refused_and_audited() {
    let limits = Limits {
        run_limits: Some(AgentRunLimits {
            agent_level: RunLimitsLayer::new().with(RunLimit::MaxToolCalls, 2),
            ..AgentRunLimits::default()
        }),
        ..Limits::default()
    };
    let running = start(limits).await;
    let lamp = dk_device::samples::Lamp::new();
    let options = dk_device::ClientOptions::new(running.device_url.clone());
    let device = DeviceRun::spawn(lamp.device(), options);
    running.approve_next(&["set_light"]).await;
    running.wait_connected("desk-lamp").await;

    let call = |session: &'static str| {
        let admin = running.admin.clone();
        async move {
            admin
                .post(
                    "/v1/tools/call",
                    &json!({"tool": "device__desk_lamp__set_light", "input": {"on": true},
                            "agentId": "main", "sessionId": session, "timeoutMs": 60_000}),
                )
                .await
                .unwrap()
                .body
        }
    };
    let spent =
        "[8dk-deny] run limit maxToolCalls of 2 exceeded: this session's run budget is spent";
    assert_eq!(call("s1").await["ok"], true);
    assert_eq!(call("s1").await["ok"], true);
    assert_eq!(call("s1").await, json!({"ok": false, "reason": spent}));
    assert_eq!(
        call("s2").await["ok"],
        true,
        "another session has its own budget"
    );
    assert_eq!(
        lamp.calls().len(),
        3,
        "the refused call never reached the lamp"
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
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["reason"], spent);
    assert_eq!(refused[0]["agentId"], "main");
    assert_eq!(refused[0]["sessionId"], "s1");
    device.stop().await.unwrap();
    running.stop().await;
}

#[tokio::test]
async fn a_configuration_with_a_limit_the_vessel_does_not_enforce_is_refused() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("vessel.toml");
    std::fs::write(&path, "[runLimits]\nmaxToolCalls = 32\nmaxTurns = 16\n").unwrap();
    assert_eq!(
        VesselConfig::load(&path).unwrap_err().to_string(),
        "`runLimits.maxTurns` is not enforced by the vessel: the host that runs the model \
         counts turns, provider calls and tokens, so set it there; here only `maxToolCalls` \
         and `maxWallTimeMs` are allowed"
    );
}
