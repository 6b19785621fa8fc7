//! Tests of the admin API over a real loopback socket: the guard (token,
//! Host, Origin) and every route.

use std::net::SocketAddr;

use dk_policy::PolicySet;
use dk_testkit::lamp;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::*;
use crate::admin_client::AdminClient;
use crate::bodies::pending_body;
use crate::person::{PendingPrompt, Prompt};
use crate::registry::DEFAULT_CONSENT_TIMEOUT;
use crate::registry::{CapabilityChange, ChangeKind, ConsentRequest, Difference};
use crate::vessel::Limits;

struct Running {
    vessel: Arc<Vessel>,
    client: AdminClient,
    addr: SocketAddr,
    _server: JoinHandle<()>,
}

async fn start() -> Running {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let token = AdminToken::generate();
    let router = admin_router(
        Arc::clone(&vessel),
        token.clone(),
        crate::Console::new(),
        addr,
    );
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    Running {
        vessel,
        client: AdminClient::new(addr, token),
        addr,
        _server: server,
    }
}

#[tokio::test]
async fn the_guard_wants_the_token_a_local_host_and_no_foreign_origin() {
    let running = start().await;
    let c = &running.client;
    assert_eq!(c.get("/v1/status").await.unwrap().status, 200);
    let port = running.addr.port();
    type Case<'a> = (Vec<(&'a str, String)>, u16, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            vec![("authorization", String::new())],
            401,
            "a valid admin token is required",
        ),
        (
            vec![("authorization", "Bearer 1234".into())],
            401,
            "a valid admin token is required",
        ),
        (
            vec![("authorization", "Basic dGVzdDp0ZXN0".into())],
            401,
            "a valid admin token is required",
        ),
        (
            vec![("host", format!("evil.example:{port}"))],
            403,
            "the Host header must name this loopback listener",
        ),
        (
            vec![("host", "127.0.0.1:1".into())],
            403,
            "the Host header must name this loopback listener",
        ),
        (
            vec![("origin", "https://evil.example".into())],
            403,
            "requests from other origins are refused",
        ),
        (
            vec![("origin", "null".into())],
            403,
            "requests from other origins are refused",
        ),
    ];
    for (headers, status, error) in cases {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let answer = c
            .send(
                "POST",
                "/v1/pending/1/consent",
                Some(&json!({"approved": true})),
                &headers,
            )
            .await
            .unwrap();
        assert_eq!(
            (answer.status, answer.body["error"].as_str()),
            (status, Some(error)),
            "{headers:?}"
        );
    }
    // The listener's own origin and `localhost` are fine.
    let own = format!("http://localhost:{port}");
    let host = format!("localhost:{port}");
    let answer = c
        .send(
            "GET",
            "/v1/status",
            None,
            &[("origin", &own), ("host", &host)],
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
}

#[tokio::test]
async fn consent_devices_grants_tools_and_calls_through_the_api() {
    let running = start().await;
    let (vessel, c) = (&running.vessel, &running.client);

    // A pairing waits for the person; the API lists it and answers it.
    let pairing = {
        let vessel = Arc::clone(vessel);
        tokio::spawn(async move {
            let person = Arc::clone(vessel.person());
            vessel
                .registry()
                .pair(
                    &lamp(),
                    |_| {},
                    |request| async move {
                        Ok::<_, ()>(person.ask_consent(request, DEFAULT_CONSENT_TIMEOUT).await)
                    },
                    DEFAULT_CONSENT_TIMEOUT,
                )
                .await
        })
    };
    let prompt = first_prompt(c).await;
    assert_eq!(prompt["kind"], json!("consent"));
    assert_eq!(prompt["request"]["deviceId"], json!("desk-lamp"));
    let id = prompt["id"].as_u64().unwrap();
    let bad = c
        .post(
            &format!("/v1/pending/{id}/approval"),
            &json!({"approved": true}),
        )
        .await
        .unwrap();
    assert_eq!(bad.status, 404);
    let bad_body = c
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": "yes"}),
        )
        .await
        .unwrap();
    assert_eq!(bad_body.status, 422);
    let answered = c
        .post(
            &format!("/v1/pending/{id}/consent"),
            &json!({"approved": true, "grant": ["read_light"]}),
        )
        .await
        .unwrap();
    assert_eq!(answered.status, 204);
    pairing.await.unwrap().unwrap();

    let devices = c.get("/v1/devices").await.unwrap().body;
    assert_eq!(devices[0]["id"], json!("desk-lamp"));
    assert_eq!(devices[0]["grants"], json!(["read_light"]));
    assert_eq!(devices[0]["connected"], json!(false));
    assert_eq!(devices[0]["capabilities"][2]["confirm"], json!(true));

    assert_eq!(
        c.put("/v1/devices/desk-lamp/grants/strobe")
            .await
            .unwrap()
            .status,
        204
    );
    let unknown = c.put("/v1/devices/desk-lamp/grants/fly").await.unwrap();
    assert_eq!(
        (unknown.status, unknown.body["error"].as_str()),
        (400, Some("device \"desk-lamp\" has no capability \"fly\""))
    );
    assert_eq!(
        c.put("/v1/devices/nope/grants/fly").await.unwrap().status,
        404
    );
    let tools = c.get("/v1/tools").await.unwrap().body;
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["device__desk_lamp__read_light", "device__desk_lamp__strobe"]
    );
    assert_eq!(
        c.delete("/v1/devices/desk-lamp/grants/strobe")
            .await
            .unwrap()
            .status,
        204
    );

    // A call through the API is the person's own: it may not name an
    // agent or a session (that would put it under an agent's name without
    // the agent's scope) ...
    for named in [json!({"agentId": "main"}), json!({"sessionId": "s"})] {
        let mut body = json!({"tool": "device__desk_lamp__read_light", "input": {}});
        body.as_object_mut()
            .unwrap()
            .extend(named.as_object().unwrap().clone());
        let refused = c.post("/v1/tools/call", &body).await.unwrap();
        assert_eq!(refused.status, 400, "{named}");
        assert!(
            refused.body["error"]
                .as_str()
                .unwrap()
                .starts_with("a call through the admin API is the person's own"),
            "{refused:?}"
        );
    }
    assert!(vessel.recent_decisions().is_empty());
    // ... and is recorded as the person's: the device is not connected, and
    // the decision is kept.
    let outcome = c
        .post(
            "/v1/tools/call",
            &json!({"tool": "device__desk_lamp__read_light", "input": {}}),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome.body,
        json!({"ok": false, "reason": "[8dk-deny] device \"desk-lamp\" is not connected"})
    );
    let decisions = c.get("/v1/decisions").await.unwrap().body;
    assert_eq!(decisions[0]["agentId"], json!(null));
    assert_eq!(decisions[0]["caller"], json!("person"));

    assert_eq!(c.delete("/v1/devices/desk-lamp").await.unwrap().status, 204);
    assert_eq!(c.get("/v1/devices").await.unwrap().body, json!([]));
    assert!(!vessel.registry().is_paired("desk-lamp"));
}

#[tokio::test]
async fn approvals_are_answered_through_the_api() {
    let running = start().await;
    let (vessel, c) = (&running.vessel, &running.client);
    let call = {
        let client = c.clone();
        tokio::spawn(async move {
            client
                .post(
                    "/v1/tools/call",
                    &json!({"tool": "device__desk_lamp__strobe", "input": {}}),
                )
                .await
        })
    };
    // Before pairing the call is refused; once the lamp is paired with
    // strobe granted, the same call asks the person.
    let first = call.await.unwrap().unwrap();
    assert_eq!(
        first.body["reason"],
        json!("[8dk-deny] device \"desk-lamp\" is not paired")
    );
    vessel
        .registry()
        .pair(
            &lamp(),
            |_| {},
            |_| async { Ok::<_, ()>(ConsentDecision::approve(["strobe"])) },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await
        .unwrap();
    let call = {
        let client = c.clone();
        tokio::spawn(async move {
            client
                .post(
                    "/v1/tools/call",
                    &json!({"tool": "device__desk_lamp__strobe", "input": {}}),
                )
                .await
        })
    };
    let prompt = first_prompt(c).await;
    assert_eq!(prompt["kind"], json!("approval"));
    assert_eq!(
        prompt["request"]["reason"],
        json!("\"strobe\" on Desk lamp asks every time")
    );
    let id = prompt["id"].as_u64().unwrap();
    assert_eq!(
        c.post(
            &format!("/v1/pending/{id}/approval"),
            &json!({"approved": false})
        )
        .await
        .unwrap()
        .status,
        204
    );
    let refused = call.await.unwrap().unwrap();
    assert_eq!(
        refused.body["reason"],
        json!("[policy] the person said no: \"strobe\" on Desk lamp asks every time")
    );
}

#[test]
fn tokens_are_made_and_kept_privately() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("keys").join("admin-token");
    let made = AdminToken::load_or_create(&path).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(AdminToken::load_or_create(&path).unwrap(), made);
    assert_eq!(AdminToken::read_from(&path).unwrap(), made);
    assert!(!format!("{made:?}").contains(made.expose()));
    // Nothing but the token is left beside it.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["admin-token"]);
    crate::unix::write_private_file(&path, b"not a token").unwrap();
    assert_eq!(
        AdminToken::load_or_create(&path).unwrap_err().to_string(),
        format!("`{}` does not hold an admin token", path.display())
    );
    assert!(AdminToken::parse(&"A".repeat(64)).is_none());
}

/// What is planted at the token's path before it is read.
enum Planted {
    Mode(u32),
    Directory,
    LinkToAGoodToken,
    DanglingLink,
}

#[track_caller]
fn check_refused(planted: Planted, expected: &str) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("admin-token");
    let good = dir.path().join("elsewhere");
    AdminToken::generate().write_to(&good).unwrap();
    match planted {
        Planted::Mode(mode) => {
            AdminToken::generate().write_to(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Planted::Directory => std::fs::create_dir(&path).unwrap(),
        Planted::LinkToAGoodToken => std::os::unix::fs::symlink(&good, &path).unwrap(),
        Planted::DanglingLink => {
            std::os::unix::fs::symlink(dir.path().join("nothing"), &path).unwrap()
        }
    }
    let expected = expected.replace("PATH", &path.display().to_string());
    let read = AdminToken::read_from(&path).unwrap_err();
    assert_eq!(read.to_string(), expected);
    // Refused, not replaced: the vessel never writes through it either.
    let loaded = AdminToken::load_or_create(&path).unwrap_err();
    assert_eq!(loaded.to_string(), expected);
    assert!(!dir.path().join("nothing").exists());
}

#[test]
fn a_token_file_that_is_not_a_private_regular_file_of_ours_is_refused() {
    let link = "`PATH` is a symbolic link, which dk does not follow for its private files";
    check_refused(
        Planted::Mode(0o644),
        "`PATH` has mode 0644, not 0600: other users may read it",
    );
    check_refused(
        Planted::Mode(0o640),
        "`PATH` has mode 0640, not 0600: other users may read it",
    );
    check_refused(
        Planted::Mode(0o400),
        "`PATH` has mode 0400, not 0600: other users may read it",
    );
    check_refused(
        Planted::Directory,
        "`PATH` is a directory, not a regular file",
    );
    check_refused(Planted::LinkToAGoodToken, link);
    check_refused(Planted::DanglingLink, link);
}

#[test]
fn writing_never_follows_a_planted_link() {
    let dir = tempfile::TempDir::new().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "unchanged").unwrap();
    // At a temporary name: creating it fails, the victim is untouched.
    let temporary = dir.path().join("admin-token.tmp");
    std::os::unix::fs::symlink(&victim, &temporary).unwrap();
    let refused = dk_files::private::create_new_private(&temporary).unwrap_err();
    assert!(
        matches!(&refused, crate::unix::PrivateFileError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::AlreadyExists),
        "{refused:?}"
    );
    // At the token's path: the link is replaced by the file, not followed.
    let path = dir.path().join("admin-token");
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    let token = AdminToken::generate();
    token.write_to(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "unchanged");
    assert!(
        !std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(AdminToken::read_from(&path).unwrap(), token);
}

#[tokio::test]
async fn the_admin_api_answers_on_its_unix_socket_with_host_localhost() {
    let dir = tempfile::TempDir::new().unwrap();
    let socket = dir.path().join("admin.sock");
    let listener = crate::unix::bind_private_socket(&socket).await.unwrap();
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let token = AdminToken::generate();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_admin_unix(
        listener,
        Arc::clone(&vessel),
        token.clone(),
        crate::Console::new(),
        async move {
            let _ = stopped.await;
        },
    ));
    let c = AdminClient::over_socket(&socket, token);
    assert_eq!(c.get("/v1/status").await.unwrap().status, 200);
    let cases: [(&str, &str, u16); 5] = [
        ("host", "127.0.0.1:7778", 403),
        ("host", "evil.example", 403),
        ("origin", "http://evil.example", 403),
        ("origin", "http://localhost", 403),
        ("authorization", "Bearer nope", 401),
    ];
    for (name, value, status) in cases {
        let answer = c
            .send("GET", "/v1/status", None, &[(name, value)])
            .await
            .unwrap();
        assert_eq!(answer.status, status, "{name}: {value}");
    }
    // A second vessel on the same socket is refused; the first still answers.
    let again = crate::unix::bind_private_socket(&socket).await.unwrap_err();
    assert_eq!(
        again.to_string(),
        format!("a vessel already runs in `{}`", dir.path().display())
    );
    assert_eq!(c.get("/v1/status").await.unwrap().status, 200);
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    // The socket file stays (the vessel removes it) but nothing answers:
    // the client says nothing is there, and a new vessel may take it.
    let gone = c.get("/v1/status").await.unwrap_err();
    assert!(
        matches!(&gone, crate::AdminClientError::Socket(e) if e.is_absent()),
        "{gone:?}"
    );
    drop(crate::unix::bind_private_socket(&socket).await.unwrap());
}

#[tokio::test]
async fn the_client_refuses_what_is_not_a_socket_of_ours() {
    let dir = tempfile::TempDir::new().unwrap();
    let token = AdminToken::generate();
    let missing = dir.path().join("admin.sock");
    let refused = AdminClient::over_socket(&missing, token.clone())
        .get("/v1/status")
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, crate::AdminClientError::Socket(e) if e.is_absent()),
        "{refused:?}"
    );
    let file = dir.path().join("file.sock");
    std::fs::write(&file, "").unwrap();
    let refused = AdminClient::over_socket(&file, token)
        .get("/v1/status")
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        format!(
            "cannot reach the vessel: `{}` is a regular file, not a socket",
            file.display()
        )
    );
}

#[test]
fn agents_are_committed_to_the_store_and_come_back_on_reopen() {
    use crate::agents::{AgentRole, AgentScope};
    use crate::store::{MemoryStore, Store};
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let vessel = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    let (id, credential) = vessel
        .add_agent(
            "main",
            AgentScope::from_items(["lamp"]).unwrap(),
            AgentRole::User,
        )
        .unwrap();
    vessel
        .add_agent("other", AgentScope::AllDevices, AgentRole::Guest)
        .unwrap();
    vessel
        .set_agent_scope("main", AgentScope::from_items(["lamp:on"]).unwrap())
        .unwrap();
    vessel.remove_agent("other").unwrap();
    // Committed before acknowledged: the store has it now, flush or not.
    let stored = store.load_agents().unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].id, id);
    assert_eq!(
        stored[0].scope,
        serde_json::to_value(AgentScope::from_items(["lamp:on"]).unwrap()).unwrap()
    );
    let audit = store.read_audit(0, 100).unwrap();
    let kinds: Vec<&str> = audit.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["agent", "agent", "agent", "agent"]);
    for entry in &audit {
        assert!(!entry.entry.to_string().contains(credential.expose()));
    }
    drop(vessel);
    let again = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    assert_eq!(again.agents().list().len(), 1);
    assert_eq!(
        again
            .agents()
            .authenticate(credential.expose())
            .map(|a| a.id),
        Some("main".to_owned())
    );
    assert_eq!(
        again.remove_agent("other"),
        Err(crate::agents::AgentError::NotFound("other".into()))
    );
}

#[tokio::test]
async fn agents_are_added_listed_rescoped_and_removed_through_the_api() {
    let running = start().await;
    let c = &running.client;
    assert_eq!(c.get("/v1/agents").await.unwrap().body, json!([]));
    let added = c
        .post(
            "/v1/agents",
            &json!({"name": "main", "scope": ["desk-lamp:set_power", "fan"], "role": "guest"}),
        )
        .await
        .unwrap();
    assert_eq!(added.status, 201, "{:?}", added.body);
    assert_eq!(added.body["name"], "main");
    let credential = added.body["credential"].as_str().unwrap().to_owned();
    assert!(credential.starts_with("dka_"), "{credential}");
    assert_eq!(
        running
            .vessel
            .agents()
            .authenticate(&credential)
            .map(|a| a.id),
        Some("main".to_owned())
    );
    // The list never shows a credential.
    let list = c.get("/v1/agents").await.unwrap();
    assert_eq!(list.status, 200);
    assert_eq!(list.body[0]["name"], "main");
    assert_eq!(list.body[0]["role"], "guest");
    assert_eq!(list.body[0]["scope"], json!(["desk-lamp:set_power", "fan"]));
    assert!(list.body[0]["addedAtMs"].as_u64().is_some());
    assert!(!list.body.to_string().contains(&credential));
    assert!(!list.body.to_string().contains("credential"));
    // Refusals.
    let cases = [
        (
            json!({"name": "main", "scope": ["*"]}),
            409,
            "exists already",
        ),
        (json!({"name": "Bad_Name"}), 400, "must be 1 to 32"),
        (
            json!({"name": "x", "scope": [":y"]}),
            400,
            "must be `DEVICE`",
        ),
        (json!({"name": "x", "role": "root"}), 400, "role `root`"),
    ];
    for (body, status, error) in cases {
        let answer = c.post("/v1/agents", &body).await.unwrap();
        assert_eq!(answer.status, status, "{body}");
        assert!(
            answer.body["error"].as_str().unwrap().contains(error),
            "{:?}",
            answer.body
        );
    }
    // Scope.
    let scoped = c
        .send(
            "PUT",
            "/v1/agents/main/scope",
            Some(&json!({"scope": ["*"]})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(scoped.status, 204);
    let list = c.get("/v1/agents").await.unwrap();
    assert_eq!(list.body[0]["scope"], json!(["*"]));
    let missing = c
        .send(
            "PUT",
            "/v1/agents/nobody/scope",
            Some(&json!({"scope": []})),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    // Remove.
    assert_eq!(c.delete("/v1/agents/main").await.unwrap().status, 204);
    assert_eq!(c.delete("/v1/agents/main").await.unwrap().status, 404);
    assert!(running.vessel.agents().authenticate(&credential).is_none());
    assert_eq!(c.get("/v1/agents").await.unwrap().body, json!([]));
}

#[tokio::test]
async fn agent_credentials_stay_out_of_the_audit_log_after_a_restart() {
    use crate::agents::{AgentRole, AgentScope};
    use crate::store::{MemoryStore, Store};
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let first = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    let (_, credential) = first
        .add_agent("main", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let credential = credential.expose().to_owned();
    drop(first);
    // A new vessel knows the credential only by its hash.
    let vessel = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    let input = json!({"note": format!("my key is {credential}"), credential.clone(): 1});
    let outcome = vessel
        .adapter()
        .execute(
            "device__desk_lamp__set_light",
            input,
            CallContext::default(),
        )
        .await;
    assert!(!outcome.is_ok());
    vessel.flush_audit().unwrap();
    let entries = store.read_audit(0, 100).unwrap();
    let text =
        serde_json::to_string(&entries.iter().map(|e| &e.entry).collect::<Vec<_>>()).unwrap();
    assert!(entries.iter().any(|e| e.kind == "decision"), "{text}");
    let hex = credential.trim_start_matches("dka_");
    assert!(!text.contains(hex), "{text}");
    assert!(text.contains("dka_[REDACTED]"), "{text}");
}

#[tokio::test]
async fn an_agent_change_the_store_refuses_does_not_happen() {
    let faulty = crate::store::testing::FaultyStore::default();
    faulty.fail(crate::store::testing::Writes::Agents, true);
    let store: Arc<dyn crate::store::Store> = Arc::new(faulty);
    let vessel = Vessel::open(store, PolicySet::empty(), Limits::default()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let token = AdminToken::generate();
    let router = admin_router(
        Arc::clone(&vessel),
        token.clone(),
        crate::Console::new(),
        addr,
    );
    let _server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    let c = AdminClient::new(addr, token);
    let answer = c
        .post("/v1/agents", &json!({"name": "main", "scope": ["*"]}))
        .await
        .unwrap();
    assert_eq!(answer.status, 500);
    assert!(answer.body["error"].as_str().unwrap().contains("disk full"));
    assert!(answer.body.get("credential").is_none());
    assert!(vessel.agents().list().is_empty());
    assert_eq!(c.get("/v1/agents").await.unwrap().body, json!([]));
}

/// A lamp link that answers every call at once.
struct Answers;

impl crate::link::DeviceLink for Answers {
    fn invoke<'a>(
        &'a self,
        _capability: &'a str,
        _input: &'a serde_json::Map<String, Value>,
        _timeout: Duration,
    ) -> futures::future::BoxFuture<'a, crate::link::InvokeResult> {
        Box::pin(async { Ok(None) })
    }
}

/// `agent`'s call of the strobe, as MCP would make it, in a task of its own.
fn strobe_by(vessel: &Arc<Vessel>, agent: &'static str) -> JoinHandle<crate::adapter::ToolOutcome> {
    let vessel = Arc::clone(vessel);
    tokio::spawn(async move {
        let person = Arc::clone(vessel.person());
        let ctx = CallContext {
            agent_id: Some(agent),
            approver: Some(person.as_ref()),
            ..CallContext::default()
        };
        vessel
            .adapter()
            .execute("device__desk_lamp__strobe", json!({}), ctx)
            .await
    })
}

/// The first open prompt, once there is one.
async fn first_prompt(c: &AdminClient) -> Value {
    dk_testkit::eventually_async("an open prompt", || async {
        let pending = c.get("/v1/pending").await.unwrap().body;
        pending.as_array().and_then(|a| a.first()).cloned()
    })
    .await
}

#[tokio::test]
async fn remembered_allowances_are_made_listed_used_and_revoked_through_the_api() {
    use crate::store::{SqliteStore, Store};
    let dir = tempfile::TempDir::new().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("vessel.db")).unwrap());
    let vessel = Vessel::open(Arc::clone(&store), PolicySet::empty(), Limits::default()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let token = AdminToken::generate();
    let router = admin_router(
        Arc::clone(&vessel),
        token.clone(),
        crate::Console::new(),
        addr,
    );
    let _server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let c = AdminClient::new(addr, token);
    vessel
        .registry()
        .pair(
            &lamp(),
            |_| {},
            |_| async { Ok::<_, ()>(ConsentDecision::approve(["strobe"])) },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await
        .unwrap();
    vessel.links().connect("desk-lamp", Arc::new(Answers));

    let call = strobe_by(&vessel, "helper");
    let prompt = first_prompt(&c).await;
    assert_eq!(prompt["canRemember"], json!(true));
    let id = prompt["id"].as_u64().unwrap();
    let answer = format!("/v1/pending/{id}/approval");
    // Answers that say nothing clear are refused; the call still waits.
    for (body, status, error) in [
        (
            json!({"approved": true, "remember": {"scope": "all"}}),
            400,
            "`all` is not what an allowance covers: say `arguments` (`args`, these exact arguments) or `capability` (`cap`, any arguments)",
        ),
        (
            json!({"approved": true, "remember": {"scope": "capability", "minutes": 0}}),
            400,
            "an allowance lasts 1 to 1440 minutes, not 0",
        ),
        (
            json!({"approved": true, "remember": {"scope": "capability", "minutes": 1441}}),
            400,
            "an allowance lasts 1 to 1440 minutes, not 1441",
        ),
        (
            json!({"approved": false, "remember": {"scope": "capability"}}),
            400,
            "a refusal is not remembered: `remember` goes with `\"approved\": true`",
        ),
    ] {
        let refused = c.post(&answer, &body).await.unwrap();
        assert_eq!(
            (refused.status, refused.body["error"].as_str()),
            (status, Some(error)),
            "{body}"
        );
    }
    assert_eq!(
        c.get("/v1/pending")
            .await
            .unwrap()
            .body
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // A yes remembered for 30 minutes: the allowance is the answer.
    let made = c
        .post(
            &answer,
            &json!({"approved": true, "remember": {"scope": "capability", "minutes": 30}}),
        )
        .await
        .unwrap();
    assert_eq!(made.status, 201, "{}", made.body);
    let allowance = made.body;
    assert_eq!(allowance["agentId"], json!("helper"));
    assert_eq!(allowance["tool"], json!("device__desk_lamp__strobe"));
    assert_eq!(allowance["scope"], json!("capability"));
    assert_eq!(allowance["uses"], json!(0));
    assert_eq!(
        allowance["expiresAtMs"].as_u64().unwrap() - allowance["createdAtMs"].as_u64().unwrap(),
        30 * 60_000
    );
    assert!(call.await.unwrap().is_ok());
    let allowance_id = allowance["id"].as_u64().unwrap();
    assert_eq!(
        c.get("/v1/approvals/remembered").await.unwrap().body,
        json!([allowance])
    );
    // The next call of the helper is not asked, and says why.
    assert!(strobe_by(&vessel, "helper").await.unwrap().is_ok());
    let listed = c.get("/v1/approvals/remembered").await.unwrap().body;
    assert_eq!(listed[0]["uses"], json!(1));
    let one = c
        .get(&format!("/v1/approvals/remembered/{allowance_id}"))
        .await
        .unwrap();
    assert_eq!(one.body["uses"], json!(1));
    let decisions = c.get("/v1/decisions").await.unwrap().body;
    let last = decisions.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["person"], json!("remembered"));
    assert_eq!(last["allowance"], json!({"id": allowance_id}));
    assert_eq!(last["agentId"], json!("helper"));
    // Revoked by the person: gone, and the helper is asked again.
    let path = format!("/v1/approvals/remembered/{allowance_id}");
    assert_eq!(c.delete(&path).await.unwrap().status, 204);
    let again = c.delete(&path).await.unwrap();
    assert_eq!(
        (again.status, again.body["error"].as_str()),
        (
            404,
            Some(format!("no remembered allowance {allowance_id}").as_str())
        )
    );
    assert_eq!(c.get(&path).await.unwrap().status, 404);
    assert_eq!(
        c.get("/v1/approvals/remembered").await.unwrap().body,
        json!([])
    );
    let call = strobe_by(&vessel, "helper");
    let prompt = first_prompt(&c).await;
    let id = prompt["id"].as_u64().unwrap();
    assert_eq!(
        c.post(
            &format!("/v1/pending/{id}/approval"),
            &json!({"approved": false})
        )
        .await
        .unwrap()
        .status,
        204
    );
    assert!(!call.await.unwrap().is_ok());

    // The person's own call names no agent: once or no, never remembered.
    let own = {
        let client = c.clone();
        tokio::spawn(async move {
            client
                .post(
                    "/v1/tools/call",
                    &json!({"tool": "device__desk_lamp__strobe", "input": {}}),
                )
                .await
        })
    };
    let prompt = first_prompt(&c).await;
    assert_eq!(prompt.get("canRemember"), None);
    let id = prompt["id"].as_u64().unwrap();
    let answer = format!("/v1/pending/{id}/approval");
    let refused = c
        .post(
            &answer,
            &json!({"approved": true, "remember": {"scope": "arguments"}}),
        )
        .await
        .unwrap();
    assert_eq!(
        (refused.status, refused.body["error"].as_str()),
        (
            409,
            Some(
                format!(
                    "call {id} cannot be remembered (it names no agent): allow it once or refuse it"
                )
                .as_str()
            )
        )
    );
    assert_eq!(
        c.post(&answer, &json!({"approved": true}))
            .await
            .unwrap()
            .status,
        204
    );
    assert_eq!(own.await.unwrap().unwrap().body["ok"], json!(true));

    // Made, used and revoked are in the audit log, and the log verifies.
    vessel.flush_audit().unwrap();
    let audit = store.read_audit(0, 1000).unwrap();
    let of = |kind: &str| {
        audit
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.entry.clone())
            .collect::<Vec<_>>()
    };
    let created = of("allowance-created");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0]["id"], json!(allowance_id));
    assert_eq!(created[0]["minutes"], json!(30));
    let revoked = of("allowance-revoked");
    assert_eq!(revoked.len(), 1);
    assert_eq!(revoked[0]["why"], json!("revoked by the person"));
    assert_eq!(revoked[0]["uses"], json!(1));
    let decisions = of("decision");
    assert!(decisions.iter().any(|d| d["allowance"]
        == json!({"id": allowance_id, "created": true})
        && d["person"] == json!("approved")));
    assert!(decisions.iter().any(
        |d| d["allowance"] == json!({"id": allowance_id}) && d["person"] == json!("remembered")
    ));
    let report = store.verify_audit().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[tokio::test]
async fn a_revoke_an_unpair_or_removing_the_agent_ends_its_allowances() {
    use crate::agents::{AgentRole, AgentScope};
    for (method, path, why) in [
        (
            "DELETE",
            "/v1/devices/desk-lamp/grants/strobe",
            "the capability was revoked",
        ),
        ("DELETE", "/v1/devices/desk-lamp", "the device was unpaired"),
        ("DELETE", "/v1/agents/helper", "the agent was removed"),
        (
            "PUT",
            "/v1/agents/helper/scope",
            "the agent's scope no longer covers the tool",
        ),
    ] {
        let running = start().await;
        let (vessel, c) = (&running.vessel, &running.client);
        vessel
            .add_agent("helper", AgentScope::AllDevices, AgentRole::User)
            .unwrap();
        vessel
            .registry()
            .pair(
                &lamp(),
                |_| {},
                |_| async { Ok::<_, ()>(ConsentDecision::approve(["strobe", "read_light"])) },
                DEFAULT_CONSENT_TIMEOUT,
            )
            .await
            .unwrap();
        vessel.links().connect("desk-lamp", Arc::new(Answers));
        let call = strobe_by(vessel, "helper");
        let id = first_prompt(c).await["id"].as_u64().unwrap();
        let made = c
            .post(
                &format!("/v1/pending/{id}/approval"),
                &json!({"approved": true, "remember": {"scope": "cap"}}),
            )
            .await
            .unwrap();
        assert_eq!(made.status, 201, "{path}: {}", made.body);
        assert!(call.await.unwrap().is_ok());
        let body = (method == "PUT").then(|| json!({"scope": ["desk-lamp:read_light"]}));
        let answer = c.send(method, path, body.as_ref(), &[]).await.unwrap();
        assert_eq!(answer.status, 204, "{path}: {}", answer.body);
        assert_eq!(
            c.get("/v1/approvals/remembered").await.unwrap().body,
            json!([]),
            "{path}"
        );
        vessel.flush_audit().unwrap();
        let audit = vessel.registry().store().read_audit(0, 1000).unwrap();
        let revoked: Vec<&Value> = audit
            .iter()
            .filter(|e| e.kind == "allowance-revoked")
            .map(|e| &e.entry)
            .collect();
        assert_eq!(revoked.len(), 1, "{path}");
        assert_eq!(revoked[0]["why"], json!(why), "{path}");
    }
}

/// The admin API's pending list says exactly what the person channel's
/// prompts do, key for key and in order.
#[test]
fn pending_bodies_are_the_prompts_json() {
    use crate::registry::{ConsentCapability, Replaced};
    let change = |capability: &str, change, differences, summary: &str| CapabilityChange {
        capability: capability.to_owned(),
        change,
        differences,
        summary: summary.to_owned(),
    };
    let consent = ConsentRequest {
        device_id: "front-door".to_owned(),
        name: "Front door".to_owned(),
        kind: "lock".to_owned(),
        code: "004217".to_owned(),
        capabilities: vec![ConsentCapability {
            name: "unlock".to_owned(),
            kind: dk_proto::CapabilityKind::Actuator,
            description: "Unlock the door.".to_owned(),
            confirm: true,
            params: Vec::new(),
            title: None,
            claims: Vec::new(),
        }],
        events: Vec::new(),
        replaces: Some(Box::new(Replaced {
            paired_at_ms: 5,
            grants: vec!["unlock".to_owned()],
            was_name: None,
            was_kind: Some("latch".to_owned()),
            credential: None,
            changes: vec![
                change(
                    "unlock",
                    ChangeKind::Changed,
                    vec![
                        Difference::Kind {
                            was: dk_proto::CapabilityKind::Sensor,
                            now: dk_proto::CapabilityKind::Actuator,
                        },
                        Difference::Confirm {
                            was: false,
                            now: true,
                        },
                        Difference::Params,
                        Difference::Description,
                    ],
                    "unlock: changed",
                ),
                change("siren", ChangeKind::Added, Vec::new(), "siren: added"),
                change("bell", ChangeKind::Removed, Vec::new(), "bell: removed"),
            ],
        })),
        no_screen: false,
        channel: dk_proto::Channel::Dk2,
    };
    let first = ConsentRequest {
        events: Vec::new(),
        replaces: None,
        no_screen: true,
        channel: dk_proto::Channel::V1,
        ..consent.clone()
    };
    let approval = crate::adapter::ApprovalRequest {
        tool: "device__front_door__unlock".to_owned(),
        device_id: "front-door".to_owned(),
        capability: "unlock".to_owned(),
        input: json!({"b": 1, "a": 2}).as_object().unwrap().clone(),
        reason: "asks every time".to_owned(),
        agent_id: Some("helper".to_owned()),
        session_id: None,
        channel: dk_proto::Channel::V1,
        microphone: None,
    };
    let prompts = [
        (Prompt::Consent(consent), false),
        (Prompt::Consent(first), false),
        (Prompt::Approval(approval.clone()), true),
        (
            Prompt::Approval(crate::adapter::ApprovalRequest {
                agent_id: None,
                ..approval
            }),
            false,
        ),
    ];
    for (id, (prompt, can_remember)) in (1..).zip(prompts) {
        let pending = PendingPrompt {
            id,
            expires_at_ms: 9,
            prompt,
            can_remember,
            mirrored: false,
        };
        let before = serde_json::to_string(&pending).unwrap();
        let body = serde_json::to_string(&pending_body(pending)).unwrap();
        assert_eq!(body, before);
    }
}
