//! Calls their client gives up while the person is asked, over real sockets:
//! cancelled in a session by rmcp's client (`notifications/cancelled`), and
//! a request without a session whose connection closes. Each time the
//! prompt is withdrawn, a later yes finds nothing, the lamp is never
//! called, and the decision says the call was abandoned.

use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::model::{ClientRequest, Request};
use rmcp::service::PeerRequestOptions;
use tokio::sync::broadcast;

use super::*;
use crate::person::AnswerError;

const STROBE: &str = "device__desk_lamp__strobe";

const ABANDONED: &str = "abandoned by the caller before the device was reached";

/// A lamp that counts the calls reaching it.
struct CountingLamp(Arc<AtomicUsize>);

impl DeviceLink for CountingLamp {
    fn invoke<'a>(
        &'a self,
        _capability: &'a str,
        _input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        self.0.fetch_add(1, Ordering::SeqCst);
        async {
            Ok(Some(
                RawValue::from_string("\"strobed\"".to_owned()).unwrap(),
            ))
        }
        .boxed()
    }
}

/// The next approval the person is asked.
async fn asked(events: &mut broadcast::Receiver<PersonEvent>) -> u64 {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let PersonEvent::Asked(prompt) = events.recv().await.unwrap()
                && matches!(prompt.prompt, Prompt::Approval(_))
            {
                return prompt.id;
            }
        }
    })
    .await
    .unwrap()
}

/// Waits for prompt `id` to leave the queue.
async fn closed(events: &mut broadcast::Receiver<PersonEvent>, id: u64) {
    tokio::time::timeout(PATIENCE, async {
        while events.recv().await.unwrap() != (PersonEvent::Closed { id }) {}
    })
    .await
    .unwrap();
}

/// After prompt `id` was withdrawn: a yes finds nothing, the lamp was not
/// called, and the `nth` abandoned decision is recorded.
fn check_withdrawn(vessel: &Vessel, id: u64, reached: &AtomicUsize, nth: usize) {
    assert!(matches!(
        vessel.person().answer_approval(id, true),
        Err(AnswerError::NotFound(_))
    ));
    assert_eq!(reached.load(Ordering::SeqCst), 0);
    let abandoned = audited_decisions(vessel)
        .into_iter()
        .filter(|d| d["tool"] == STROBE && d["reason"] == ABANDONED)
        .count();
    assert_eq!(abandoned, nth);
}

#[tokio::test]
async fn a_call_its_client_gives_up_while_the_person_is_asked_never_runs() {
    let vessel = vessel_with_lamp(&["strobe"]).await;
    let reached = Arc::new(AtomicUsize::new(0));
    vessel
        .links()
        .connect("desk-lamp", Arc::new(CountingLamp(Arc::clone(&reached))));
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let mut events = vessel.person().subscribe();

    // In a session: the client cancels, and keeps its session.
    let (client, _) = connect(&server.url, &credential).await;
    let call = ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new(STROBE)));
    let handle = client
        .peer()
        .send_cancellable_request(call, PeerRequestOptions::no_options())
        .await
        .unwrap();
    let id = asked(&mut events).await;
    handle
        .cancel(Some("the agent changed its mind".to_owned()))
        .await
        .unwrap();
    closed(&mut events, id).await;
    check_withdrawn(&vessel, id, &reached, 1);
    // The session goes on.
    let result = call_tool_quickly(&client).await;
    assert_eq!(result.is_error, Some(true), "{result:?}");
    client.cancel().await.unwrap();

    // Without a session: the client's connection closes.
    let bearer = format!("Bearer {credential}");
    let host = server.local.to_string();
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{STROBE}","arguments":{{}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"raw","version":"0"}}}}}}}}"#
    );
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: {bearer}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {STROBE}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(server.local).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let id = asked(&mut events).await;
    drop(stream);
    closed(&mut events, id).await;
    check_withdrawn(&vessel, id, &reached, 2);
    server.stop().await;
}

/// A call the person is not asked about, refused at once (the lamp's other
/// capabilities are not granted): the session still serves calls.
async fn call_tool_quickly(client: &Client) -> CallToolResult {
    call(client.peer(), "device__desk_lamp__read_light", json!({})).await
}
