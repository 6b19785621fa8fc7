//! Tests of the MCP server over real sockets on loopback, with rmcp's own
//! client as the independent client: authentication, the tool list, calls,
//! approvals through the person channel, list-changed notifications.

use std::sync::Arc;
use std::time::Duration;

use dk_policy::PolicySet;
use futures::FutureExt;
use futures::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProtocolVersion, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::events::EventLog;
use super::tools::{MAX_TOOL_NAME, valid_tool_name};
use super::watch::{Followed, SessionWatch};
use std::net::SocketAddr;

use super::*;
use crate::agents::{AgentRole, AgentScope};
use crate::link::{DeviceLink, InvokeResult};
use crate::person::{PersonEvent, Prompt};
use crate::registry::ConsentDecision;
use crate::vessel::Limits;

pub(super) use dk_testkit::{PATIENCE, lamp};

/// The lamp's device side: answers `set_light` with what it was told and
/// `read_light` with a fixed state.
struct Lamp;

impl DeviceLink for Lamp {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        let result = match capability {
            "set_light" => {
                json!({"on": input.get("on"), "brightness": input.get("brightness").cloned().unwrap_or(json!(100))})
            }
            "strobe" => json!("strobed"),
            _ => json!({"on": true, "brightness": 40}),
        };
        async move { Ok(Some(RawValue::from_string(result.to_string()).unwrap())) }.boxed()
    }
}

pub(super) async fn vessel_with_lamp(grants: &[&str]) -> Arc<Vessel> {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let decision = ConsentDecision::approve(grants.iter().copied());
    vessel
        .registry()
        .pair(
            &lamp(),
            |_| {},
            |_| async move { Ok::<_, ()>(decision) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    vessel.links().connect("desk-lamp", Arc::new(Lamp));
    vessel
}

/// A vessel's MCP listener on 127.0.0.1:0.
pub(super) struct Server {
    pub(super) url: String,
    pub(super) local: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

pub(super) async fn serve(vessel: &Arc<Vessel>, agents: &Arc<AgentDirectory>) -> Server {
    serve_with(vessel, agents, McpOptions::default()).await
}

pub(super) async fn serve_with(
    vessel: &Arc<Vessel>,
    agents: &Arc<AgentDirectory>,
    options: McpOptions,
) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_mcp_with(
        listener,
        Arc::clone(vessel),
        Arc::clone(agents),
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    Server {
        url: format!("http://{local}/mcp"),
        local,
        stop: Some(stop),
        task,
    }
}

impl Server {
    pub(super) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// Counts `notifications/tools/list_changed`.
#[derive(Clone)]
pub(super) struct Listener(pub(super) mpsc::UnboundedSender<()>);

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(());
    }
}

pub(super) type Client = RunningService<RoleClient, Listener>;

pub(super) fn transport_config(
    url: &str,
    credential: Option<&str>,
) -> StreamableHttpClientTransportConfig {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(credential) = credential {
        config = config.auth_header(credential.to_owned());
    }
    config
}

/// A client of the `initialize` handshake, or why it could not connect.
async fn try_connect(
    url: &str,
    credential: Option<&str>,
    handler: Listener,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let transport = StreamableHttpClientTransport::from_config(transport_config(url, credential));
    handler.serve(transport).await
}

pub(super) async fn connect(url: &str, credential: &str) -> (Client, mpsc::UnboundedReceiver<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let client = try_connect(url, Some(credential), Listener(tx))
        .await
        .unwrap();
    (client, rx)
}

/// A client of the 2026-07-28 `server/discover` lifecycle (no session).
pub(super) async fn connect_discover(url: &str, credential: &str) -> Client {
    let (tx, _rx) = mpsc::unbounded_channel();
    Listener(tx)
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(transport_config(url, Some(credential))),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap()
}

/// The device tools a client is offered (every agent is also offered
/// `read_more`, checked apart).
async fn tool_names(client: &Client) -> Vec<String> {
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    assert_eq!(names.last().map(String::as_str), Some("read_more"));
    names.into_iter().filter(|n| n != "read_more").collect()
}

pub(super) async fn call(
    client: &rmcp::Peer<RoleClient>,
    tool: &str,
    input: Value,
) -> CallToolResult {
    let Value::Object(arguments) = input else {
        panic!("input must be an object");
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
        .unwrap()
}

pub(super) fn text(result: &CallToolResult) -> String {
    let value = serde_json::to_value(result).unwrap();
    value["content"][0]["text"].as_str().unwrap().to_owned()
}

async fn notified(rx: &mut mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .unwrap()
        .unwrap();
}

pub(super) fn agents_with(
    name: &str,
    scope: AgentScope,
    role: AgentRole,
) -> (Arc<AgentDirectory>, String) {
    let agents = Arc::new(AgentDirectory::new());
    let (_, credential) = agents.add(name, scope, role).unwrap();
    (agents, credential.expose().to_owned())
}

fn by_name<'a>(tools: &'a [Tool], name: &str) -> &'a Tool {
    tools.iter().find(|t| t.name == name).unwrap()
}

/// Decision entries of the audit log, as JSON.
pub(super) fn audited_decisions(vessel: &Vessel) -> Vec<Value> {
    vessel.flush_audit().unwrap();
    vessel
        .registry()
        .store()
        .read_audit(0, 10_000)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "decision")
        .map(|e| e.entry)
        .collect()
}

#[tokio::test]
async fn an_agent_lists_its_granted_tools_sorted_with_annotations() {
    let vessel = vessel_with_lamp(&["set_light", "read_light", "strobe"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "dk-vessel");
    assert_eq!(
        info.capabilities.tools.as_ref().unwrap().list_changed,
        Some(true)
    );
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "device__desk_lamp__read_light",
            "device__desk_lamp__set_light",
            "device__desk_lamp__strobe",
            "read_more"
        ]
    );
    let read_more = serde_json::to_value(by_name(&tools, "read_more")).unwrap();
    assert_eq!(
        read_more["annotations"],
        json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false})
    );
    assert_eq!(read_more["inputSchema"]["required"], json!(["handle"]));
    let read = serde_json::to_value(by_name(&tools, "device__desk_lamp__read_light")).unwrap();
    assert_eq!(
        read["annotations"],
        json!({"readOnlyHint": true, "destructiveHint": false})
    );
    let set = serde_json::to_value(by_name(&tools, "device__desk_lamp__set_light")).unwrap();
    assert_eq!(set["annotations"], json!({"readOnlyHint": false}));
    assert_eq!(
        set["inputSchema"],
        json!({"type": "object", "properties": {
            "on": {"type": "boolean", "description": "true for on"},
            "brightness": {"type": "number", "description": "0-100"}},
          "required": ["on"], "additionalProperties": false})
    );
    assert_eq!(
        set["description"],
        "[DEVICE Desk lamp (lamp) actuator] Turn the lamp on or off and set its brightness."
    );
    let strobe = by_name(&tools, "device__desk_lamp__strobe");
    assert!(
        strobe
            .description
            .as_deref()
            .unwrap()
            .ends_with(server::CONFIRM_SENTENCE)
    );
    // The same list on another connection with the same credential.
    let (again, _) = connect(&server.url, &credential).await;
    assert_eq!(again.list_all_tools().await.unwrap(), tools);
    client.cancel().await.unwrap();
    again.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn calls_return_structured_results_and_refusals_with_their_reasons() {
    let vessel = vessel_with_lamp(&["set_light", "read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;

    let result = call(
        &client,
        "device__desk_lamp__set_light",
        json!({"on": true, "brightness": 30}),
    )
    .await;
    assert_eq!(result.is_error, Some(false));
    assert_eq!(
        result.structured_content,
        Some(json!({"on": true, "brightness": 30}))
    );
    assert_eq!(
        serde_json::from_str::<Value>(&text(&result)).unwrap(),
        json!({"on": true, "brightness": 30})
    );

    // Not granted: the adapter's own reason, as a tool error.
    let refused = call(&client, "device__desk_lamp__strobe", json!({})).await;
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(
        text(&refused),
        "[8dk-deny] capability \"strobe\" on \"desk-lamp\" is not granted"
    );
    assert_eq!(refused.structured_content, None);

    // Bad input.
    let refused = call(
        &client,
        "device__desk_lamp__set_light",
        json!({"on": "yes"}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).starts_with("[8dk-deny]"),
        "{}",
        text(&refused)
    );

    // Every decision carries the agent and the MCP session.
    let decisions = vessel.recent_decisions();
    assert_eq!(decisions.len(), 3);
    let session = decisions[0]["sessionId"].as_str().unwrap().to_owned();
    assert!(!session.is_empty());
    for d in &decisions {
        assert_eq!(d["agentId"], "main");
        assert_eq!(d["sessionId"], session.as_str());
    }
    assert_eq!(decisions[0]["allowed"], true);
    assert_eq!(decisions[1]["allowed"], false);

    // Another connection is another session.
    let (other, _) = connect(&server.url, &credential).await;
    call(&other, "device__desk_lamp__read_light", json!({})).await;
    let last = vessel.recent_decisions().pop().unwrap();
    assert_eq!(last["agentId"], "main");
    assert_ne!(last["sessionId"], session.as_str());
    assert!(last["sessionId"].is_string());

    client.cancel().await.unwrap();
    other.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_non_object_result_is_wrapped() {
    let vessel = vessel_with_lamp(&["strobe"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let mut events = vessel.person().subscribe();
    let person = Arc::clone(&vessel);
    let answer = tokio::spawn(async move {
        loop {
            if let Ok(PersonEvent::Asked(prompt)) = events.recv().await {
                let Prompt::Approval(request) = &prompt.prompt else {
                    continue;
                };
                assert_eq!(request.tool, "device__desk_lamp__strobe");
                person.person().answer_approval(prompt.id, true).unwrap();
                return;
            }
        }
    });
    let result = call(&client, "device__desk_lamp__strobe", json!({})).await;
    answer.await.unwrap();
    assert_eq!(
        result.structured_content,
        Some(json!({"result": "strobed"}))
    );
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn approvals_go_to_the_person_not_the_agent() {
    let vessel = vessel_with_lamp(&["strobe"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let mut events = vessel.person().subscribe();

    // The person says no.
    let pending = tokio::spawn({
        let client_call = client.peer().clone();
        async move {
            client_call
                .call_tool(CallToolRequestParams::new("device__desk_lamp__strobe"))
                .await
                .unwrap()
        }
    });
    let asked = loop {
        if let PersonEvent::Asked(prompt) = events.recv().await.unwrap() {
            break prompt;
        }
    };
    let Prompt::Approval(request) = &asked.prompt else {
        panic!("expected an approval, got {asked:?}");
    };
    assert_eq!(request.device_id, "desk-lamp");
    vessel.person().answer_approval(asked.id, false).unwrap();
    let refused = pending.await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(
        text(&refused),
        "[policy] the person said no: \"strobe\" on Desk lamp asks every time"
    );
    // The record says the person refused it.
    let last = vessel.recent_decisions().pop().unwrap();
    assert_eq!(last["person"], "refused");

    // The person says yes.
    let pending = tokio::spawn({
        let client_call = client.peer().clone();
        async move {
            client_call
                .call_tool(CallToolRequestParams::new("device__desk_lamp__strobe"))
                .await
                .unwrap()
        }
    });
    let asked = loop {
        if let PersonEvent::Asked(prompt) = events.recv().await.unwrap() {
            break prompt;
        }
    };
    vessel.person().answer_approval(asked.id, true).unwrap();
    let allowed = pending.await.unwrap();
    assert_eq!(allowed.is_error, Some(false));
    let last = vessel.recent_decisions().pop().unwrap();
    assert_eq!(last["allowed"], true);
    assert_eq!(last["agentId"], "main");
    // ... that the person approved it (a call nobody was asked about says
    // nothing of the person).
    assert_eq!(last["person"], "approved");
    assert_eq!(last["reason"], "allowed");
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn connected_clients_are_told_when_their_list_changes() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, mut changes) = connect(&server.url, &credential).await;
    assert_eq!(tool_names(&client).await, ["device__desk_lamp__read_light"]);

    vessel.registry().grant("desk-lamp", "set_light").unwrap();
    notified(&mut changes).await;
    assert_eq!(
        tool_names(&client).await,
        [
            "device__desk_lamp__read_light",
            "device__desk_lamp__set_light"
        ]
    );

    vessel.registry().revoke("desk-lamp", "read_light").unwrap();
    notified(&mut changes).await;
    assert_eq!(tool_names(&client).await, ["device__desk_lamp__set_light"]);

    agents
        .set_scope(
            "main",
            AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
        )
        .unwrap();
    notified(&mut changes).await;
    assert!(tool_names(&client).await.is_empty());

    agents.set_scope("main", AgentScope::AllDevices).unwrap();
    notified(&mut changes).await;
    assert_eq!(tool_names(&client).await, ["device__desk_lamp__set_light"]);

    vessel.registry().unpair("desk-lamp").unwrap();
    notified(&mut changes).await;
    assert!(tool_names(&client).await.is_empty());

    vessel
        .registry()
        .pair(
            &lamp(),
            |_| {},
            |_| async { Ok::<_, ()>(ConsentDecision::approve(["strobe"])) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    notified(&mut changes).await;
    assert_eq!(tool_names(&client).await, ["device__desk_lamp__strobe"]);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_watch_reports_only_changes_the_agent_can_see() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let agents = Arc::new(AgentDirectory::new());
    agents
        .add(
            "narrow",
            AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
            AgentRole::User,
        )
        .unwrap();
    let events = EventLog::new(&McpOptions::default());
    let mut watch = SessionWatch::new(
        Arc::clone(&vessel),
        Arc::clone(&agents),
        &events,
        &"narrow".into(),
        Followed::default(),
    )
    .unwrap();
    assert_eq!(watch.tools().len(), 1);
    // Outside the scope: no change.
    vessel.registry().grant("desk-lamp", "set_light").unwrap();
    vessel.registry().grant("desk-lamp", "strobe").unwrap();
    // Another agent: no change.
    agents
        .add("other", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    agents.remove("other").unwrap();
    // In the scope now: a change.
    agents
        .set_scope(
            "narrow",
            AgentScope::from_items(["desk-lamp:read_light", "desk-lamp:strobe"]).unwrap(),
        )
        .unwrap();
    let changes = watch.next_changes().await.unwrap();
    assert!(changes.tools);
    assert!(!changes.resources);
    let names: Vec<&str> = watch.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["device__desk_lamp__read_light", "device__desk_lamp__strobe"]
    );
    // Every event was read; nothing else is waiting.
    assert!(watch.next_changes().now_or_never().is_none());
    // Removing the agent ends the watch.
    agents.remove("narrow").unwrap();
    assert_eq!(watch.next_changes().await, None);
}

#[tokio::test]
async fn a_narrow_scope_sees_and_calls_only_its_capabilities() {
    let vessel = vessel_with_lamp(&["set_light", "read_light", "strobe"]).await;
    let (agents, credential) = agents_with(
        "narrow",
        AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
        AgentRole::User,
    );
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    assert_eq!(tool_names(&client).await, ["device__desk_lamp__read_light"]);
    let ok = call(&client, "device__desk_lamp__read_light", json!({})).await;
    assert_eq!(ok.is_error, Some(false));
    let refused = call(&client, "device__desk_lamp__set_light", json!({"on": true})).await;
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(
        text(&refused),
        "[8dk-deny] \"device__desk_lamp__set_light\" is not in the scope of agent \"narrow\""
    );
    // Outside the scope, an unknown device is refused the same way: the
    // agent learns nothing of what lies outside.
    let refused = call(&client, "device__hall_lamp__set_light", json!({})).await;
    assert_eq!(
        text(&refused),
        "[8dk-deny] \"device__hall_lamp__set_light\" is not in the scope of agent \"narrow\""
    );
    // The scope check comes before policy and the device: one decision
    // each, in the audit log, with agent and session.
    let decisions = audited_decisions(&vessel);
    let refusals: Vec<&Value> = decisions
        .iter()
        .filter(|d| {
            d["reason"]
                .as_str()
                .unwrap()
                .contains("is not in the scope")
        })
        .collect();
    assert_eq!(refusals.len(), 2);
    for d in refusals {
        assert_eq!(d["agentId"], "narrow");
        assert_eq!(d["allowed"], false);
        assert!(d["sessionId"].as_str().is_some_and(|s| !s.is_empty()));
    }
    assert_eq!(decisions.len(), 3);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_guest_sees_and_calls_sensors_only() {
    let vessel = vessel_with_lamp(&["set_light", "read_light", "strobe"]).await;
    let (agents, credential) = agents_with("visitor", AgentScope::AllDevices, AgentRole::Guest);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    assert_eq!(tool_names(&client).await, ["device__desk_lamp__read_light"]);
    let refused = call(&client, "device__desk_lamp__set_light", json!({"on": true})).await;
    assert_eq!(
        text(&refused),
        "[8dk-deny] \"device__desk_lamp__set_light\" is not in the scope of agent \"visitor\""
    );
    let ok = call(&client, "device__desk_lamp__read_light", json!({})).await;
    assert_eq!(
        ok.structured_content,
        Some(json!({"on": true, "brightness": 40}))
    );
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn no_credential_or_a_wrong_one_gets_nothing() {
    let vessel = vessel_with_lamp(&["set_light", "read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    assert!(
        try_connect(&server.url, None, Listener(tx.clone()))
            .await
            .is_err()
    );
    let wrong = format!("dka_{}", "0".repeat(64));
    assert!(
        try_connect(&server.url, Some(&wrong), Listener(tx.clone()))
            .await
            .is_err()
    );
    // A removed agent's credential stops working.
    agents.remove("main").unwrap();
    assert!(
        try_connect(&server.url, Some(&credential), Listener(tx))
            .await
            .is_err()
    );
    assert!(vessel.recent_decisions().is_empty());
    server.stop().await;
}

/// Sends one raw HTTP/1.1 `POST` and returns the status and the answer.
async fn raw(local: SocketAddr, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    raw_request(local, "POST", headers, body).await
}

/// Sends one raw HTTP/1.1 request and returns the status and the answer
/// (its head and what of its body came before the first JSON-RPC message,
/// or two seconds, or the end).
pub(super) async fn raw_request(
    local: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(local).await.unwrap();
    let mut request = format!(
        "{method} /mcp HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    // An SSE answer stays open: read what arrives until the first event.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    response.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&response).contains("\"jsonrpc\"") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

pub(super) const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

#[tokio::test]
async fn host_origin_and_credential_are_checked_before_mcp() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let host = server.local.to_string();
    let bearer = format!("Bearer {credential}");
    let (status, body) = raw(server.local, &[("Host", &host)], INITIALIZE).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("WWW-Authenticate") || body.contains("www-authenticate"));
    let (status, _) = raw(
        server.local,
        &[("Host", "evil.example:80"), ("Authorization", &bearer)],
        INITIALIZE,
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = raw(
        server.local,
        &[
            ("Host", &host),
            ("Origin", "http://evil.example"),
            ("Authorization", &bearer),
        ],
        INITIALIZE,
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = raw(
        server.local,
        &[("Host", &host), ("Authorization", &bearer)],
        INITIALIZE,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn clients_of_the_discover_lifecycle_are_served_without_a_session() {
    let vessel = vessel_with_lamp(&["read_light", "set_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let client = connect_discover(&server.url, &credential).await;
    assert_eq!(
        tool_names(&client).await,
        [
            "device__desk_lamp__read_light",
            "device__desk_lamp__set_light"
        ]
    );
    let result = call(
        &client,
        "device__desk_lamp__set_light",
        json!({"on": false}),
    )
    .await;
    assert_eq!(result.is_error, Some(false));
    let last = vessel.recent_decisions().pop().unwrap();
    assert_eq!(last["agentId"], "main");
    assert_eq!(last["sessionId"], Value::Null);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn ending_a_session_is_answered_no_content() {
    let vessel = vessel_with_lamp(&["set_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let bearer = format!("Bearer {credential}");
    let host = server.local.to_string();
    let auth = [("Host", host.as_str()), ("Authorization", bearer.as_str())];
    let (status, text) = raw(server.local, &auth, INITIALIZE).await;
    assert_eq!(status, 200, "{text}");
    let session = text
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        })
        .unwrap();
    let mut stream = tokio::net::TcpStream::connect(server.local).await.unwrap();
    let request = format!(
        "DELETE /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: {bearer}\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn a_call_without_a_session_is_answered_with_plain_json() {
    let vessel = vessel_with_lamp(&["set_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let bearer = format!("Bearer {credential}");
    let host = server.local.to_string();
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"device__desk_lamp__set_light","arguments":{"on":true},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"0"}}}}"#;
    let (status, text) = raw(
        server.local,
        &[
            ("Host", host.as_str()),
            ("Authorization", bearer.as_str()),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "device__desk_lamp__set_light"),
        ],
        body,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json"), "{text}");
    assert!(!lower.contains("text/event-stream"), "{text}");
    assert!(
        text.contains(r#""id":7"#) && text.contains(r#""isError":false"#),
        "{text}"
    );
    server.stop().await;
}

/// Waits until `agents` has `count` subscribers.
async fn subscribers(agents: &AgentDirectory, count: usize) {
    dk_testkit::eventually(&format!("{count} subscribers"), || {
        agents.subscribers() == count
    })
    .await;
}

#[tokio::test]
async fn a_session_s_watch_ends_with_the_session() {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (first, _) = connect(&server.url, &credential).await;
    let (second, _) = connect(&server.url, &credential).await;
    subscribers(&agents, 2).await;
    first.cancel().await.unwrap();
    subscribers(&agents, 1).await;
    // Stopping the server ends the sessions still open.
    server.stop().await;
    subscribers(&agents, 0).await;
    drop(second);
}

#[test]
fn the_longest_tool_names_are_valid_for_mcp_and_openai() {
    use dk_proto::limits;
    let id = "a".repeat(limits::ID);
    let capability = "b".repeat(limits::CAPABILITY_NAME);
    let name = dk_proto::tool_name(&id, &capability);
    assert_eq!(name.len(), MAX_TOOL_NAME);
    assert!(valid_tool_name(&name));
    assert!(valid_tool_name("device__desk_lamp__set_light"));
    assert!(!valid_tool_name(&format!("{name}c")));
    assert!(!valid_tool_name(""));
    assert!(!valid_tool_name("device__desk.lamp__x"));
}

mod abandoned;
mod images;
mod lanes;
mod runs;
