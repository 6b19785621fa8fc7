//! Tests of device events as MCP resources: listed and read only within the
//! agent's scope, subscriptions told of new events over real sockets (the
//! session stream and `subscriptions/listen`), rings bounded in count and
//! bytes, updates coalesced.

#![expect(
    deprecated,
    reason = "initialize clients subscribe with resources/subscribe"
)]

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use rmcp::model::{
    ReadResourceRequestParams, ResourceContents, ResourceUpdatedNotificationParam,
    ServerNotification, SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::McpOptions;
use super::events::{EventLog, events_uri};
use super::tests::{
    PATIENCE, agents_with, connect_discover, serve_with, transport_config, vessel_with_lamp,
};
use super::watch::{Followed, Notifier, SessionWatch};
use crate::agents::{AgentDirectory, AgentRole, AgentScope};
use crate::link::DeviceEvent;
use crate::registry::ConsentDecision;
use crate::vessel::Vessel;

const LAMP_EVENTS: &str = "dk://devices/desk-lamp/events";
const THERMOSTAT_EVENTS: &str = "dk://devices/hall-thermostat/events";

fn event(capability: &str, data: Value) -> DeviceEvent {
    DeviceEvent {
        device_id: "desk-lamp".to_owned(),
        capability: capability.to_owned(),
        data: Some(RawValue::from_string(data.to_string()).unwrap()),
    }
}

async fn pair_thermostat(vessel: &Vessel) {
    let manifest: Value = serde_json::from_str(include_str!(
        "../../../fixtures/manifests/valid/hall-thermostat.json"
    ))
    .unwrap();
    vessel
        .registry()
        .pair(
            &manifest,
            |_| {},
            |_| async { Ok::<_, ()>(ConsentDecision::approve(["read_temperature"])) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
}

/// Every notification a client hears, as its method (and URI).
#[derive(Clone)]
struct Heard(mpsc::UnboundedSender<String>);

impl ClientHandler for Heard {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(format!("resources/updated {}", params.uri));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send("resources/list_changed".to_owned());
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send("tools/list_changed".to_owned());
    }
}

type Client = RunningService<RoleClient, Heard>;

async fn connect(url: &str, credential: &str) -> (Client, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let transport =
        StreamableHttpClientTransport::from_config(transport_config(url, Some(credential)));
    (Heard(tx).serve(transport).await.unwrap(), rx)
}

async fn heard(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .unwrap()
        .unwrap()
}

async fn uris(client: &rmcp::Peer<RoleClient>) -> Vec<String> {
    client
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri)
        .collect()
}

async fn try_read(client: &rmcp::Peer<RoleClient>, uri: &str) -> Result<Value, ServiceError> {
    let result = client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await?;
    let [
        ResourceContents::TextResourceContents {
            text, mime_type, ..
        },
    ] = result.contents.as_slice()
    else {
        panic!("one text content expected: {result:?}");
    };
    assert_eq!(mime_type.as_deref(), Some("application/json"));
    Ok(serde_json::from_str(text).unwrap())
}

async fn read(client: &rmcp::Peer<RoleClient>, uri: &str) -> Value {
    try_read(client, uri).await.unwrap()
}

fn refusal(error: ServiceError) -> String {
    match error {
        ServiceError::McpError(e) => e.message.into_owned(),
        other => panic!("a protocol error expected, got {other:?}"),
    }
}

fn datas(contents: &Value) -> Vec<Value> {
    contents["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"].clone())
        .collect()
}

#[tokio::test]
async fn event_resources_are_listed_and_read_only_within_the_scope() {
    let vessel = vessel_with_lamp(&["read_light", "set_light"]).await;
    pair_thermostat(&vessel).await;
    let agents = Arc::new(AgentDirectory::new());
    let (_, lamp_only) = agents
        .add(
            "lamp-only",
            AgentScope::from_items(["desk-lamp"]).unwrap(),
            AgentRole::User,
        )
        .unwrap();
    let (_, narrow) = agents
        .add(
            "narrow",
            AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
            AgentRole::User,
        )
        .unwrap();
    let (_, everything) = agents
        .add("everything", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let server = serve_with(&vessel, &agents, McpOptions::default()).await;

    let (client, _) = connect(&server.url, lamp_only.expose()).await;
    let listed = client.list_all_resources().await.unwrap();
    assert_eq!(listed.len(), 1);
    let lamp = serde_json::to_value(&listed[0]).unwrap();
    assert_eq!(lamp["uri"], LAMP_EVENTS);
    assert_eq!(lamp["name"], "desk-lamp events");
    assert_eq!(lamp["title"], "Desk lamp events");
    assert_eq!(lamp["mimeType"], "application/json");
    assert!(
        lamp["description"]
            .as_str()
            .unwrap()
            .starts_with("[DEVICE Desk lamp (lamp)]")
    );
    assert_eq!(
        read(&client, LAMP_EVENTS).await,
        json!({"deviceId": "desk-lamp", "events": []})
    );
    // Outside the scope is the same as nowhere: one answer for both.
    assert_eq!(
        refusal(try_read(&client, THERMOSTAT_EVENTS).await.unwrap_err()),
        format!("no resource `{THERMOSTAT_EVENTS}`")
    );
    for nowhere in [
        "dk://devices/no-such/events",
        "dk://devices//events",
        "file:///etc/passwd",
    ] {
        assert_eq!(
            refusal(try_read(&client, nowhere).await.unwrap_err()),
            format!("no resource `{nowhere}`")
        );
    }
    let refused = client
        .subscribe(SubscribeRequestParams::new(THERMOSTAT_EVENTS))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(refused),
        format!("no resource `{THERMOSTAT_EVENTS}`")
    );

    let (all, _) = connect(&server.url, everything.expose()).await;
    assert_eq!(uris(&all).await, [LAMP_EVENTS, THERMOSTAT_EVENTS]);

    // Events of capabilities outside a narrow scope are not shown to it.
    let (narrow_client, mut narrow_heard) = connect(&server.url, narrow.expose()).await;
    assert_eq!(uris(&narrow_client).await, [LAMP_EVENTS]);
    narrow_client
        .subscribe(SubscribeRequestParams::new(LAMP_EVENTS))
        .await
        .unwrap();
    vessel.publish_event(event("set_light", json!({"on": true})));
    vessel.publish_event(event("read_light", json!({"on": true, "brightness": 7})));
    assert_eq!(
        heard(&mut narrow_heard).await,
        format!("resources/updated {LAMP_EVENTS}")
    );
    let contents = read(&narrow_client, LAMP_EVENTS).await;
    assert_eq!(datas(&contents), [json!({"on": true, "brightness": 7})]);
    assert_eq!(contents["events"][0]["capability"], "read_light");
    // The wider agent sees both.
    assert_eq!(
        datas(&read(&all, LAMP_EVENTS).await),
        [json!({"on": true}), json!({"on": true, "brightness": 7})]
    );

    for c in [client, all, narrow_client] {
        c.cancel().await.unwrap();
    }
    server.stop().await;
}

/// The `seq` of each event in a resource, once its newest is the last one
/// published in the test (its data `{"n": 2}`).
async fn final_seqs(client: &rmcp::Peer<RoleClient>, uri: &str) -> Vec<u64> {
    dk_testkit::eventually_async("the last event in the resource", || async {
        let contents = read(client, uri).await;
        let events = contents["events"].as_array().unwrap();
        (events.last().map(|e| &e["data"]) == Some(&json!({"n": 2})))
            .then(|| events.iter().map(|e| e["seq"].as_u64().unwrap()).collect())
    })
    .await
}

#[tokio::test]
async fn sequence_numbers_count_only_the_events_the_agent_sees() {
    let vessel = vessel_with_lamp(&["read_light", "set_light"]).await;
    pair_thermostat(&vessel).await;
    let agents = Arc::new(AgentDirectory::new());
    let (_, narrow) = agents
        .add(
            "narrow",
            AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
            AgentRole::User,
        )
        .unwrap();
    let (_, everything) = agents
        .add("everything", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let server = serve_with(&vessel, &agents, McpOptions::default()).await;
    // Another server whose rings keep only the last four events.
    let small = McpOptions {
        events_per_device: 4,
        ..McpOptions::default()
    };
    let small_server = serve_with(&vessel, &agents, small).await;
    let thermostat = |n: u64| DeviceEvent {
        device_id: "hall-thermostat".to_owned(),
        capability: "read_temperature".to_owned(),
        data: Some(RawValue::from_string(json!({ "n": n }).to_string()).unwrap()),
    };
    // Connected first, so both servers' event feeds are running.
    let (narrow_client, _) = connect(&server.url, narrow.expose()).await;
    let (all, _) = connect(&server.url, everything.expose()).await;
    let (narrow_small, _) = connect(&small_server.url, narrow.expose()).await;
    let (all_small, _) = connect(&small_server.url, everything.expose()).await;
    // Interleaved: the lamp's sensor, the thermostat, the lamp's actuator.
    for n in 0..3 {
        vessel.publish_event(event("read_light", json!({ "n": n })));
        vessel.publish_event(thermostat(n));
        vessel.publish_event(event("set_light", json!({ "n": n })));
    }
    // No gap tells the narrow agent of the thermostat's events or of the
    // lamp's actuator; the wider agent counts what it sees.
    assert_eq!(final_seqs(&narrow_client, LAMP_EVENTS).await, [1, 2, 3]);
    assert_eq!(final_seqs(&all, LAMP_EVENTS).await, [1, 2, 3, 4, 5, 6]);
    assert_eq!(final_seqs(&all, THERMOSTAT_EVENTS).await, [1, 2, 3]);
    // Events that left the ring still count: a gap means only that.
    assert_eq!(final_seqs(&narrow_small, LAMP_EVENTS).await, [2, 3]);
    assert_eq!(final_seqs(&all_small, LAMP_EVENTS).await, [3, 4, 5, 6]);
    for c in [narrow_client, all, narrow_small, all_small] {
        c.cancel().await.unwrap();
    }
    small_server.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_subscriber_is_told_of_new_events_and_of_list_changes() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve_with(&vessel, &agents, McpOptions::default()).await;
    let (client, mut heard_rx) = connect(&server.url, &credential).await;
    let info = serde_json::to_value(&client.peer_info().unwrap().capabilities).unwrap();
    assert_eq!(
        info["resources"],
        json!({"subscribe": true, "listChanged": true})
    );
    client
        .subscribe(SubscribeRequestParams::new(LAMP_EVENTS))
        .await
        .unwrap();

    vessel.publish_event(event("read_light", json!({"on": false})));
    assert_eq!(
        heard(&mut heard_rx).await,
        format!("resources/updated {LAMP_EVENTS}")
    );
    let contents = read(&client, LAMP_EVENTS).await;
    let first = &contents["events"][0];
    assert_eq!(first["capability"], "read_light");
    assert_eq!(first["data"], json!({"on": false}));
    assert!(first["seq"].as_u64().unwrap() >= 1);
    assert!(first["receivedAtMs"].as_u64().unwrap() > 0);

    // Revoking the only capability the agent sees takes the lamp off its
    // lists; granting one brings it back.
    vessel.registry().revoke("desk-lamp", "read_light").unwrap();
    assert_eq!(heard(&mut heard_rx).await, "tools/list_changed");
    assert_eq!(heard(&mut heard_rx).await, "resources/list_changed");
    assert!(uris(&client).await.is_empty());
    assert!(try_read(&client, LAMP_EVENTS).await.is_err());
    vessel.registry().grant("desk-lamp", "set_light").unwrap();
    assert_eq!(heard(&mut heard_rx).await, "tools/list_changed");
    assert_eq!(heard(&mut heard_rx).await, "resources/list_changed");
    assert_eq!(uris(&client).await, [LAMP_EVENTS]);
    // What it sees again is only what it may see: the read_light event is
    // not among the set_light ones.
    assert_eq!(
        datas(&read(&client, LAMP_EVENTS).await),
        Vec::<Value>::new()
    );
    vessel.publish_event(event("set_light", json!({"on": true})));
    assert_eq!(
        heard(&mut heard_rx).await,
        format!("resources/updated {LAMP_EVENTS}")
    );
    assert_eq!(
        datas(&read(&client, LAMP_EVENTS).await),
        [json!({"on": true})]
    );

    // A scope change is a list change too.
    agents
        .set_scope("main", AgentScope::from_items(["hall-thermostat"]).unwrap())
        .unwrap();
    assert_eq!(heard(&mut heard_rx).await, "tools/list_changed");
    assert_eq!(heard(&mut heard_rx).await, "resources/list_changed");
    assert!(uris(&client).await.is_empty());

    client
        .unsubscribe(UnsubscribeRequestParams::new(LAMP_EVENTS))
        .await
        .unwrap();
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_discover_client_hears_of_events_on_subscriptions_listen() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    pair_thermostat(&vessel).await;
    let (agents, credential) = agents_with(
        "main",
        AgentScope::from_items(["desk-lamp"]).unwrap(),
        AgentRole::User,
    );
    let server = serve_with(&vessel, &agents, McpOptions::default()).await;
    let client = connect_discover(&server.url, &credential).await;
    assert_eq!(uris(&client).await, [LAMP_EVENTS]);
    let mut subscription = client
        .listen(
            SubscriptionFilter::builder()
                .resources_list_changed()
                .resource_subscriptions([LAMP_EVENTS, "not a uri"])
                .build(),
        )
        .await
        .unwrap();
    let accepted = subscription.acknowledged();
    assert_eq!(
        accepted.resource_subscriptions,
        Some(vec![LAMP_EVENTS.to_owned()])
    );
    assert_eq!(accepted.resources_list_changed, Some(true));

    // An event of a device outside the scope is not told; the lamp's is.
    vessel.publish_event(DeviceEvent {
        device_id: "hall-thermostat".to_owned(),
        capability: "read_temperature".to_owned(),
        data: None,
    });
    vessel.publish_event(event("read_light", json!({"on": true})));
    let notification = tokio::time::timeout(PATIENCE, subscription.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let ServerNotification::ResourceUpdatedNotification(update) = notification else {
        panic!("an update expected: {notification:?}");
    };
    assert_eq!(update.params.uri, LAMP_EVENTS);
    assert_eq!(
        datas(&read(&client, LAMP_EVENTS).await),
        [json!({"on": true})]
    );

    vessel.registry().unpair("desk-lamp").unwrap();
    let notification = tokio::time::timeout(PATIENCE, subscription.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            notification,
            ServerNotification::ResourceListChangedNotification(_)
        ),
        "{notification:?}"
    );
    assert!(uris(&client).await.is_empty());
    subscription.cancel().await.unwrap();
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn reading_is_bounded_to_the_last_events() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve_with(&vessel, &agents, McpOptions::default()).await;
    let (client, mut heard_rx) = connect(&server.url, &credential).await;
    client
        .subscribe(SubscribeRequestParams::new(LAMP_EVENTS))
        .await
        .unwrap();
    for n in 0..200 {
        vessel.publish_event(event("read_light", json!({ "n": n })));
    }
    // Updates are coalesced: read after each until the last event is in.
    let contents = loop {
        assert_eq!(
            heard(&mut heard_rx).await,
            format!("resources/updated {LAMP_EVENTS}")
        );
        let contents = read(&client, LAMP_EVENTS).await;
        if contents["events"]
            .as_array()
            .unwrap()
            .last()
            .map(|e| &e["data"])
            == Some(&json!({"n": 199}))
        {
            break contents;
        }
    };
    let expected: Vec<Value> = (136..200).map(|n| json!({ "n": n })).collect();
    assert_eq!(datas(&contents), expected);
    let seqs: Vec<u64> = contents["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_ring_keeps_its_byte_bound_and_leaves_out_data_too_large() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, _) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let agent = agents.get("main").unwrap();
    let log = EventLog::new(&McpOptions {
        event_bytes_per_device: 200,
        ..McpOptions::default()
    });
    for n in 0..20 {
        log.record(event(
            "read_light",
            json!({ "n": n, "pad": "x".repeat(30) }),
        ));
        let (count, bytes) = log.held("desk-lamp");
        assert!(bytes <= 200, "{count} events, {bytes} bytes");
    }
    let contents = log.contents(&vessel, &agent, "desk-lamp");
    let kept = datas(&contents);
    assert!(!kept.is_empty() && kept.len() < 20);
    assert_eq!(kept.last().unwrap()["n"], 19);

    log.record(event("read_light", json!({ "big": "y".repeat(500) })));
    let contents = log.contents(&vessel, &agent, "desk-lamp");
    let last = contents["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["data"], Value::Null);
    assert_eq!(
        last["omittedBytes"],
        json!({ "big": "y".repeat(500) }).to_string().len()
    );
    assert!(log.held("desk-lamp").1 <= 200);

    // Unpairing forgets the device's events.
    log.forget("desk-lamp");
    assert_eq!(log.held("desk-lamp"), (0, 0));
}

#[tokio::test]
async fn a_watch_tells_only_followed_visible_devices() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, _) = agents_with(
        "main",
        AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
        AgentRole::User,
    );
    let log = EventLog::new(&McpOptions::default());
    let followed = Followed::default();
    let mut watch = SessionWatch::new(
        Arc::clone(&vessel),
        Arc::clone(&agents),
        &log,
        &"main".into(),
        Arc::clone(&followed),
    )
    .unwrap();
    // Not followed: nothing.
    log.record(event("read_light", json!(1)));
    assert!(watch.next_changes().now_or_never().is_none());
    followed.lock().unwrap().insert("desk-lamp".to_owned());
    // Followed but outside the scope (set_light): nothing.
    log.record(event("set_light", json!(2)));
    assert!(watch.next_changes().now_or_never().is_none());
    // Followed and seen.
    log.record(event("read_light", json!(3)));
    let changes = watch.next_changes().now_or_never().unwrap().unwrap();
    assert_eq!(
        changes.updated.into_iter().collect::<Vec<_>>(),
        ["desk-lamp"]
    );
    assert!(!changes.tools && !changes.resources);
    // Unfollowed again: nothing.
    followed.lock().unwrap().clear();
    log.record(event("read_light", json!(4)));
    assert!(watch.next_changes().now_or_never().is_none());
}

#[tokio::test(start_paused = true)]
async fn updates_of_a_flooding_device_are_coalesced() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, _) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let log = EventLog::new(&McpOptions::default());
    let followed = Followed::default();
    followed.lock().unwrap().insert("desk-lamp".to_owned());
    let watch = SessionWatch::new(
        Arc::clone(&vessel),
        Arc::clone(&agents),
        &log,
        &"main".into(),
        followed,
    )
    .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let hour = Duration::from_secs(3600);
    let task = tokio::spawn(watch.run(Notifier::Test(tx), hour));
    let update = format!("resources/updated {}", events_uri("desk-lamp"));

    // The first event is told at once.
    log.record(event("read_light", json!(0)));
    assert_eq!(rx.recv().await.unwrap(), update);
    // Fifty more within the interval are one update at its end; a
    // thousand (past the watch's buffer) are one more.
    for n in 1..=50 {
        log.record(event("read_light", json!(n)));
    }
    assert_eq!(rx.recv().await.unwrap(), update);
    for n in 0..1000 {
        log.record(event("read_light", json!(n)));
    }
    assert_eq!(rx.recv().await.unwrap(), update);
    // The clock is paused: sleeping lets every task run until idle.
    tokio::time::sleep(hour * 3).await;
    assert!(rx.try_recv().is_err());
    task.abort();
}
