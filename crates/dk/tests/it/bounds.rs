//! A device that declares its bounds and its events (the dk manifest
//! extension), end to end: the hall thermostat of dk-device's samples on a
//! real `dk vessel`, paired through the admin API, called by an agent on
//! `dk mcp`. The person sees the range and the event when asked to pair; a
//! target out of range is refused before the person is asked and never
//! reaches the device; the declared event reaches the agent while the
//! thermostat's sensor is not granted.

use std::time::Duration;

use dk_device::samples::Thermostat;
use dk_device::{ClientOptions, ServeOptions, run_client};
use serde_json::{Value, json};

use crate::approvals::{Agent, approve_the_waiting_call};
use crate::process::{Scratch, approve_consent, devices, eventually};

const SET_TARGET: &str = "device__hall_thermostat__set_target";
const EVENTS: &str = "dk://devices/hall-thermostat/events";

/// The rule that asks the person before every thermostat action.
pub(crate) const ASK: &str = "version: 1
policies:
  - name: ask-before-thermostat-actions
    action: device_use
    condition: \"deviceId equals hall-thermostat and capabilityKind equals actuator\"
    decision: require_approval
    message: \"Thermostat actions need a yes\"
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_bounds_refuse_before_the_person_and_declared_events_reach_the_agent() {
    let scratch = Scratch::new("bounds");
    let rules = scratch.root().join("thermostat.yaml");
    std::fs::write(&rules, ASK).unwrap();
    let (vessel, _) = crate::agents::start_with(&scratch, &["--policies", rules.to_str().unwrap()]);
    let admin = vessel.admin(&scratch);

    let thermostat = Thermostat::declaring();
    let device = thermostat.device();
    let (events, receiver) = device.events(16);
    let options = ClientOptions::new(vessel.url())
        .key_file(scratch.root().join("hall-thermostat.key"))
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .serve(ServeOptions::new().events(receiver));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let thermostat = thermostat.clone();
        tokio::spawn(async move {
            let drift = thermostat.drift(&events, Duration::from_millis(50));
            let stopped = async move {
                let _ = stopped.await;
            };
            run_client(&device, options, async move {
                tokio::select! {
                    () = drift => std::future::pending().await,
                    () = stopped => {}
                }
            })
            .await
        })
    };

    // The person is shown the range, the modes and the event.
    let request = eventually("the thermostat's pairing request", || async {
        let pending = admin.get("/v1/pending").await.unwrap().body;
        pending
            .as_array()?
            .iter()
            .find(|p| p["kind"] == "consent")
            .cloned()
    })
    .await;
    let consent = &request["request"];
    let set = consent["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "set_target")
        .unwrap();
    assert_eq!(set["title"], "Target temperature", "{set}");
    assert_eq!(set["params"][0]["name"], "celsius", "{set}");
    assert_eq!(set["params"][0]["bounds"], "from 5 to 30 °C", "{set}");
    assert_eq!(
        set["params"][1]["bounds"], "one of \"heat\", \"cool\", \"auto\"",
        "{set}"
    );
    assert_eq!(
        consent["events"][0]["name"], "temperature_changed",
        "{consent}"
    );
    // The event is granted as a capability is; the sensor is not.
    let id = request["id"].as_u64().unwrap();
    approve_consent(&admin, id, &["set_target", "temperature_changed"]).await;
    eventually("the thermostat connected", || async {
        devices(&admin)
            .await
            .first()
            .is_some_and(|d| d["connected"] == true)
            .then_some(())
    })
    .await;
    let added = admin
        .post(
            "/v1/agents",
            &json!({"name": "helper", "scope": ["hall-thermostat"], "role": "user"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{added:?}");
    let mut agent = Agent::start(&scratch, added.body["credential"].as_str().unwrap());

    // The model reads the bounds in the tool's schema.
    agent.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let tools = agent.answer(2);
    let tool = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == SET_TARGET)
        .unwrap_or_else(|| panic!("no {SET_TARGET}: {tools}"));
    let celsius = &tool["inputSchema"]["properties"]["celsius"];
    assert_eq!(
        (celsius["minimum"].clone(), celsius["maximum"].clone()),
        (json!(5), json!(30))
    );
    assert_eq!(
        tool["inputSchema"]["properties"]["mode"]["enum"],
        json!(["heat", "cool", "auto"])
    );

    // 35 °C: refused at the input check, naming the bound, before the
    // person is asked; the thermostat never hears of it.
    agent.call(3, SET_TARGET, json!({"celsius": 35}));
    let refused = agent.answer(3);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let text = refused["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("\"celsius\" must be at most 30 °C"), "{text}");
    let pending = admin.get("/v1/pending").await.unwrap().body;
    assert_eq!(pending, json!([]), "the person was asked");
    agent.call(4, SET_TARGET, json!({"celsius": 22, "mode": "fan"}));
    let refused = agent.answer(4);
    let text = refused["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("\"mode\" must be one of"), "{text}");
    assert!(
        !thermostat
            .calls()
            .iter()
            .any(|(capability, _)| capability == "set_target"),
        "{:?}",
        thermostat.calls()
    );

    // 22 °C: within bounds, so the person is asked, and a yes reaches it.
    agent.call(5, SET_TARGET, json!({"celsius": 22, "mode": "heat"}));
    approve_the_waiting_call(&admin).await;
    let done = agent.answer(5);
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(thermostat.state().target, 22.0);

    // The declared event reaches the agent, whose scope holds no granted
    // sensor of the thermostat: its resource is listed with the event
    // declared, and its readings arrive as `temperature_changed`.
    agent.send(&json!({"jsonrpc": "2.0", "id": 6, "method": "resources/list"}));
    let listed = agent.answer(6);
    let resource = listed["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["uri"] == EVENTS)
        .unwrap_or_else(|| panic!("no {EVENTS}: {listed}"))
        .clone();
    assert!(
        resource["description"]
            .as_str()
            .unwrap()
            .contains("temperature_changed: The hall's temperature moved toward the target."),
        "{resource}"
    );
    let agent = std::sync::Mutex::new(agent);
    let next = std::sync::atomic::AtomicU64::new(7);
    let read = eventually("the declared event", || async {
        let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut agent = agent.lock().unwrap();
        agent.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "resources/read",
            "params": {"uri": EVENTS}}),
        );
        let read = agent.answer(id);
        let text = read["result"]["contents"][0]["text"].as_str().unwrap_or("");
        text.contains("temperature_changed").then_some(read)
    })
    .await;
    let text = read["result"]["contents"][0]["text"].as_str().unwrap();
    let events: Value = serde_json::from_str(text).unwrap();
    assert!(events.to_string().contains("\"target\":22"), "{events}");

    let _ = stop.send(());
    running.await.unwrap().unwrap();
}
