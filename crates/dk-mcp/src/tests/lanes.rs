//! Every agent stays in its lane, over real sockets: sessions capped per
//! agent (its own oldest go first, another agent always gets in), a session
//! used only by its owner whatever the method, a session id taken only from
//! the server's own lookup, approvals waiting capped per agent.

use std::net::SocketAddr;

use super::*;

const READ: &str = "device__desk_lamp__read_light";
const STROBE: &str = "device__desk_lamp__strobe";
const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
const LEGACY: &str = "2025-06-18";

/// One agent's way in over raw HTTP.
struct Raw {
    local: SocketAddr,
    host: String,
    bearer: String,
}

impl Raw {
    fn new(server: &Server, credential: &str) -> Raw {
        Raw {
            local: server.local,
            host: server.local.to_string(),
            bearer: format!("Bearer {credential}"),
        }
    }

    /// A request in the session `session` (if any), with `extra` headers.
    async fn send(
        &self,
        method: &str,
        session: Option<&str>,
        extra: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let mut headers = vec![
            ("Host", self.host.as_str()),
            ("Authorization", self.bearer.as_str()),
        ];
        if let Some(session) = session {
            headers.push(("Mcp-Session-Id", session));
        }
        headers.extend_from_slice(extra);
        raw_request(self.local, method, &headers, body).await
    }

    /// Opens a session with the `initialize` handshake; its id.
    async fn open(&self) -> String {
        let (status, answer) = self.send("POST", None, &[], INITIALIZE).await;
        assert_eq!(status, 200, "{answer}");
        session_of(&answer)
    }

    /// The status of `tools/list` in `session`.
    async fn list(&self, session: &str) -> u16 {
        let (status, answer) = self
            .send(
                "POST",
                Some(session),
                &[("MCP-Protocol-Version", LEGACY)],
                LIST,
            )
            .await;
        if status == 200 {
            assert!(answer.contains("device__desk_lamp__read_light"), "{answer}");
        }
        status
    }

    /// A 2026-07-28 call of `tool`, served without a session, naming
    /// `session` in its header (if any) and `run` in its `_meta` (if any).
    async fn stateless_call(
        &self,
        tool: &str,
        session: Option<&str>,
        run: Option<&str>,
    ) -> (u16, String) {
        let mut body = json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": tool, "arguments": {}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}
        });
        if let Some(run) = run {
            body["params"]["_meta"]["dk/run"] = json!(run);
            body["params"]["_meta"]["dk/runLimits"] = json!({"maxToolCalls": 1});
        }
        self.send(
            "POST",
            session,
            &[
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", tool),
            ],
            &body.to_string(),
        )
        .await
    }
}

/// The `Mcp-Session-Id` of an answer.
fn session_of(answer: &str) -> String {
    answer
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session id in {answer}"))
}

/// A fresh session id the server never issued, shaped like one it would.
fn made_up_session_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Three agents on one lamp, every capability granted.
async fn three_agents() -> (Arc<Vessel>, Arc<AgentDirectory>, [String; 3]) {
    let vessel = vessel_with_lamp(&["read_light", "set_light", "strobe"]).await;
    let agents = Arc::new(AgentDirectory::new());
    let credentials = ["a", "b", "c"].map(|name| {
        agents
            .add(name, AgentScope::AllDevices, AgentRole::User)
            .unwrap()
            .1
            .expose()
            .to_owned()
    });
    (vessel, agents, credentials)
}

#[tokio::test]
async fn an_agent_at_its_session_cap_loses_its_own_oldest_and_others_always_get_in() {
    let (vessel, agents, [a, b, c]) = three_agents().await;
    let options = McpOptions {
        sessions_per_agent: 3,
        max_sessions: 4,
        ..McpOptions::default()
    };
    let server = serve_with(&vessel, &agents, options).await;
    let raw_a = Raw::new(&server, &a);

    // A opens five: its two oldest are gone, its three newest answer.
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(raw_a.open().await);
    }
    let mut statuses = Vec::new();
    for session in &sessions {
        statuses.push(raw_a.list(session).await);
    }
    assert_eq!(statuses, [404, 404, 200, 200, 200]);

    // B connects and calls, with rmcp's client.
    let (client_b, _) = connect(&server.url, &b).await;
    assert_eq!(call(&client_b, READ, json!({})).await.is_error, Some(false));
    // All four places are taken (A three, B one); C still gets in, at the
    // expense of the agent holding the most, A, its longest unused first.
    let (client_c, _) = connect(&server.url, &c).await;
    assert_eq!(call(&client_c, READ, json!({})).await.is_error, Some(false));
    let mut statuses = Vec::new();
    for session in &sessions[2..] {
        statuses.push(raw_a.list(session).await);
    }
    assert_eq!(statuses, [404, 200, 200]);

    // A, at its cap, opening many more pushes out only its own.
    for _ in 0..8 {
        sessions.push(raw_a.open().await);
    }
    for client in [&client_b, &client_c] {
        assert_eq!(call(client, READ, json!({})).await.is_error, Some(false));
    }
    let newest = sessions.last().unwrap();
    assert_eq!(raw_a.list(newest).await, 200);
    assert_eq!(raw_a.list(&sessions[4]).await, 404);
    client_b.cancel().await.unwrap();
    client_c.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn another_agent_with_a_session_id_gets_404_on_every_method() {
    let (vessel, agents, [a, b, _]) = three_agents().await;
    let server = serve(&vessel, &agents).await;
    let (client_a, mut changes_a) = connect(&server.url, &a).await;
    assert_eq!(call(&client_a, READ, json!({})).await.is_error, Some(false));
    let session = vessel.recent_decisions()[0]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let raw_b = Raw::new(&server, &b);
    let version = [("MCP-Protocol-Version", LEGACY)];
    let call_body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": READ, "arguments": {}}})
    .to_string();
    let notification = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    for (method, body) in [
        ("POST", LIST),
        ("POST", call_body.as_str()),
        ("POST", notification),
        // Would hear A's notifications.
        ("GET", ""),
        // Would end A's session.
        ("DELETE", ""),
    ] {
        let (status, answer) = raw_b.send(method, Some(&session), &version, body).await;
        assert_eq!(status, 404, "{method} {body}: {answer}");
        assert!(answer.contains("no such MCP session"), "{answer}");
        assert!(!answer.contains("device__"), "{answer}");
        assert!(!answer.contains("jsonrpc"), "{answer}");
    }
    // B's call was never made; A's session is alive and A still hears its
    // notifications.
    assert_eq!(vessel.recent_decisions().len(), 1);
    assert_eq!(call(&client_a, READ, json!({})).await.is_error, Some(false));
    assert_eq!(vessel.recent_decisions()[1]["sessionId"], session.as_str());
    vessel.registry().revoke("desk-lamp", "strobe").unwrap();
    tokio::time::timeout(PATIENCE, changes_a.recv())
        .await
        .unwrap()
        .unwrap();
    // A made-up id is unknown to everyone, the owner's own works.
    let raw_a = Raw::new(&server, &a);
    assert_eq!(raw_a.list(&made_up_session_id()).await, 404);
    assert_eq!(raw_a.list(&session).await, 200);
    client_a.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_made_up_session_id_neither_escapes_a_limit_nor_reaches_the_audit_log() {
    let (vessel, agents, [a, b, _]) = three_agents().await;
    // Time stands still: only the limits decide.
    vessel.adapter().set_run_clock(Arc::new(|| 1_000_000));
    let server = serve(&vessel, &agents).await;
    let raw_a = Raw::new(&server, &a);
    // 40 calls of the 2026-07-28 lifecycle, each naming a fresh made-up
    // session: the rate is the agent's, whatever the session, so 20 go
    // through (the burst of one device) and 20 are refused.
    let mut allowed = 0;
    let mut refused = Vec::new();
    for _ in 0..40 {
        let (status, answer) = raw_a
            .stateless_call(READ, Some(&made_up_session_id()), None)
            .await;
        assert_eq!(status, 200, "{answer}");
        if answer.contains(r#""isError":false"#) {
            allowed += 1;
        } else {
            refused.push(answer);
        }
    }
    assert_eq!(allowed, 20);
    assert_eq!(refused.len(), 20);
    for answer in &refused {
        assert!(answer.contains("[8dk-deny] rate limit: "), "{answer}");
    }
    // A run is the agent's, whatever the session: the same run named with
    // a fresh made-up session on each call is spent after its budget.
    let (_, answer) = Raw::new(&server, &b)
        .stateless_call(READ, Some(&made_up_session_id()), Some("r"))
        .await;
    assert!(answer.contains(r#""isError":false"#), "{answer}");
    let (_, answer) = Raw::new(&server, &b)
        .stateless_call(READ, Some(&made_up_session_id()), Some("r"))
        .await;
    assert!(
        answer.contains(r#"the budget of run \"r\" is spent"#),
        "{answer}"
    );
    let decisions = audited_decisions(&vessel);
    assert_eq!(decisions.len(), 42);
    for d in &decisions {
        assert_eq!(d["sessionId"], Value::Null, "{d}");
    }

    // A session the server issued to the agent is its session; another
    // agent's is refused before anything else.
    let raw_c = Raw::new(&server, &b);
    let issued = raw_c.open().await;
    let (_, answer) = raw_c.stateless_call(READ, Some(&issued), None).await;
    assert!(answer.contains(r#""isError":false"#), "{answer}");
    let last = audited_decisions(&vessel).pop().unwrap();
    assert_eq!(last["sessionId"], issued.as_str());
    let (status, answer) = raw_a.stateless_call(READ, Some(&issued), None).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(audited_decisions(&vessel).len(), 43);
    server.stop().await;
}

#[tokio::test]
async fn one_agent_cannot_keep_more_than_its_cap_of_approvals_waiting() {
    let (vessel, agents, [a, b, _]) = three_agents().await;
    let server = serve(&vessel, &agents).await;
    let (client_a, _) = connect(&server.url, &a).await;
    let mut waiting = tokio::task::JoinSet::new();
    for _ in 0..crate::person::APPROVALS_PER_AGENT {
        let peer = client_a.peer().clone();
        waiting.spawn(async move { call(&peer, STROBE, json!({})).await });
    }
    let pending = |count: usize| {
        let vessel = Arc::clone(&vessel);
        async move {
            dk_testkit::eventually(&format!("{count} prompts"), || {
                vessel.person().pending().len() == count
            })
            .await;
        }
    };
    pending(crate::person::APPROVALS_PER_AGENT).await;
    // One more: refused at once with why, recorded like any refusal.
    let refused = call(&client_a, STROBE, json!({})).await;
    assert_eq!(refused.is_error, Some(true));
    let reason = format!(
        "[policy] the person was not asked (agent \"a\" already has {} approvals waiting for the person): \"strobe\" on Desk lamp asks every time",
        crate::person::APPROVALS_PER_AGENT
    );
    assert_eq!(text(&refused), reason);
    let last = audited_decisions(&vessel).pop().unwrap();
    assert_eq!(last["reason"], reason.as_str());
    assert_eq!(last["agentId"], "a");
    assert_eq!(last["allowed"], false);
    // Another agent is still asked, and the person sees who asks.
    let (client_b, _) = connect(&server.url, &b).await;
    let asked_b = tokio::spawn({
        let peer = client_b.peer().clone();
        async move { call(&peer, STROBE, json!({})).await }
    });
    pending(crate::person::APPROVALS_PER_AGENT + 1).await;
    let prompts = vessel.person().pending();
    let of_b = prompts
        .iter()
        .find(|p| serde_json::to_value(p).unwrap()["request"]["agentId"] == "b")
        .unwrap();
    vessel.person().answer_approval(of_b.id, true).unwrap();
    assert_eq!(asked_b.await.unwrap().is_error, Some(false));
    for prompt in vessel.person().pending() {
        vessel.person().answer_approval(prompt.id, false).unwrap();
    }
    while let Some(answer) = waiting.join_next().await {
        assert!(text(&answer.unwrap()).starts_with("[policy] the person said no"));
    }
    client_a.cancel().await.unwrap();
    client_b.cancel().await.unwrap();
    server.stop().await;
}

/// The next approval put to the person.
async fn next_approval(events: &mut tokio::sync::broadcast::Receiver<PersonEvent>) -> u64 {
    loop {
        if let PersonEvent::Asked(prompt) = events.recv().await.unwrap()
            && matches!(prompt.prompt, Prompt::Approval(_))
        {
            return prompt.id;
        }
    }
}

#[tokio::test]
async fn an_agent_removed_or_rescoped_while_the_person_decides_is_checked_again() {
    let vessel = vessel_with_lamp(&["read_light", "strobe"]).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let mut events = vessel.person().subscribe();
    let strobe = |client: &Client| {
        let peer = client.peer().clone();
        tokio::spawn(async move { call(&peer, STROBE, json!({})).await })
    };
    let gone = "[8dk-deny] agent \"main\" was removed or may no longer call \"device__desk_lamp__strobe\": the call was not made";

    // Re-scoped to the lamp's sensor while its strobe waits; the person
    // then says yes: the call is not made.
    let waiting = strobe(&client);
    let id = next_approval(&mut events).await;
    let narrow = AgentScope::from_items(["desk-lamp:read_light"]).unwrap();
    agents.set_scope("main", narrow).unwrap();
    vessel.person().answer_approval(id, true).unwrap();
    let refused = waiting.await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(text(&refused), gone);

    // Removed while its call waits, then the person says yes: not made.
    agents.set_scope("main", AgentScope::AllDevices).unwrap();
    let waiting = strobe(&client);
    let id = next_approval(&mut events).await;
    agents.remove("main").unwrap();
    vessel.person().answer_approval(id, true).unwrap();
    let refused = waiting.await.unwrap();
    assert_eq!(text(&refused), gone);
    let last = vessel.recent_decisions().pop().unwrap();
    assert_eq!(
        (last["allowed"].clone(), last["reason"].clone()),
        (json!(false), json!(gone))
    );
    server.stop().await;
}

#[tokio::test]
async fn removing_or_rescoping_an_agent_withdraws_its_waiting_prompts() {
    let vessel = vessel_with_lamp(&["read_light", "strobe"]).await;
    let (_, credential) = vessel
        .add_agent("main", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let (_, other) = vessel
        .add_agent("other", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let agents = Arc::clone(vessel.agents());
    let server = serve(&vessel, &agents).await;
    let (main, _) = connect(&server.url, credential.expose()).await;
    let (bystander, _) = connect(&server.url, other.expose()).await;
    let mut events = vessel.person().subscribe();
    let strobe = |client: &Client| {
        let peer = client.peer().clone();
        tokio::spawn(async move { call(&peer, STROBE, json!({})).await })
    };
    let gone = "[8dk-deny] agent \"main\" was removed or may no longer call \"device__desk_lamp__strobe\": the call was not made";

    let theirs = strobe(&bystander);
    next_approval(&mut events).await;
    // Re-scoped away from the strobe: its prompt leaves the person's list
    // at once, the other agent's stays.
    let waiting = strobe(&main);
    next_approval(&mut events).await;
    assert_eq!(vessel.person().pending().len(), 2);
    vessel
        .set_agent_scope(
            "main",
            AgentScope::from_items(["desk-lamp:read_light"]).unwrap(),
        )
        .unwrap();
    assert_eq!(text(&waiting.await.unwrap()), gone);
    assert_eq!(vessel.person().pending().len(), 1);
    // Removed: the same.
    vessel
        .set_agent_scope("main", AgentScope::AllDevices)
        .unwrap();
    let waiting = strobe(&main);
    next_approval(&mut events).await;
    vessel.remove_agent("main").unwrap();
    assert_eq!(text(&waiting.await.unwrap()), gone);
    let left = vessel.person().pending();
    assert_eq!(left.len(), 1);
    let Prompt::Approval(request) = &left[0].prompt else {
        panic!("expected the other agent's approval");
    };
    assert_eq!(request.agent_id.as_deref(), Some("other"));
    vessel.person().answer_approval(left[0].id, true).unwrap();
    assert_eq!(theirs.await.unwrap().is_error, Some(false));
    server.stop().await;
}
