//! Tests of the agent directory: credentials, scopes, roles, storage shape.

use std::sync::Mutex;

use serde_json::json;

use super::*;

#[track_caller]
fn scope(items: &[&str]) -> AgentScope {
    AgentScope::from_items(items.iter().copied()).unwrap()
}

#[test]
fn credentials_are_shown_once_and_kept_as_hashes() {
    let directory = AgentDirectory::new();
    let (id, credential) = directory
        .add("claude", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    assert_eq!(id, "claude");
    let text = credential.expose();
    assert!(text.starts_with("dka_"));
    assert_eq!(text.len(), 4 + 64);
    assert_eq!(format!("{credential:?}"), "AgentCredential(..)");
    assert_eq!(directory.authenticate(text).unwrap().id, "claude");
    assert_eq!(directory.authenticate("dka_00"), None);
    assert_eq!(directory.authenticate(""), None);
    let stored = directory.stored();
    let json = serde_json::to_string(&stored).unwrap();
    assert!(!json.contains(text), "{json}");
    assert!(
        json.contains(&dk_files::hex::encode(&sha256(text))),
        "{json}"
    );
    let again = AgentDirectory::from_stored(stored).unwrap();
    assert_eq!(again.authenticate(text).unwrap().id, "claude");
}

#[test]
fn two_agents_get_different_credentials() {
    let directory = AgentDirectory::new();
    let (_, a) = directory
        .add("a", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let (_, b) = directory
        .add("b", AgentScope::AllDevices, AgentRole::Guest)
        .unwrap();
    assert_ne!(a, b);
    assert_eq!(directory.authenticate(b.expose()).unwrap().id, "b");
    assert_eq!(
        directory
            .add("a", AgentScope::AllDevices, AgentRole::User)
            .unwrap_err(),
        AgentError::Exists("a".into())
    );
}

#[test]
fn names_follow_the_rule() {
    let directory = AgentDirectory::new();
    for bad in [
        "",
        "__shadow__",
        "Claude",
        "-a",
        "a-",
        "a--b",
        "a b",
        &"a".repeat(33),
    ] {
        assert_eq!(
            directory
                .add(bad, AgentScope::AllDevices, AgentRole::User)
                .unwrap_err(),
            AgentError::BadName(bad.to_owned()),
            "{bad}"
        );
    }
    for good in ["a", "main-2", &"a".repeat(32)] {
        directory
            .add(good, AgentScope::AllDevices, AgentRole::User)
            .unwrap();
    }
}

#[test]
fn scopes_and_roles() {
    let all = scope(&["*"]);
    assert!(all.covers("desk-lamp", "strobe"));
    let narrow = scope(&["desk-lamp:read_light", "hall-lamp", "desk-lamp:set_light"]);
    assert!(narrow.covers("desk-lamp", "read_light"));
    assert!(narrow.covers("desk-lamp", "set_light"));
    assert!(!narrow.covers("desk-lamp", "strobe"));
    assert!(narrow.covers("hall-lamp", "anything"));
    assert!(!narrow.covers("door", "open"));
    assert_eq!(scope(&["lamp:a", "lamp"]), scope(&["lamp"]));
    assert_eq!(scope(&["lamp", "lamp:a"]), scope(&["lamp"]));
    for bad in ["", ":a", "lamp:"] {
        assert_eq!(
            AgentScope::from_items([bad]),
            Err(ScopeError::Malformed(bad.to_owned()))
        );
    }
    let guest = Agent {
        id: "g".into(),
        scope: AgentScope::AllDevices,
        role: AgentRole::Guest,
        added_at_ms: 0,
    };
    assert!(guest.may_use("desk-lamp", "read_light", true));
    assert!(!guest.may_use("desk-lamp", "set_light", false));
    let user = Agent {
        role: AgentRole::User,
        scope: narrow,
        ..guest
    };
    assert!(user.may_use("desk-lamp", "set_light", false));
    assert!(!user.may_use("desk-lamp", "strobe", false));
    for role in [AgentRole::Guest, AgentRole::User, AgentRole::Admin] {
        assert_eq!(AgentRole::parse(role.as_str()), Some(role));
    }
}

#[test]
fn the_stored_shape_is_plain_json() {
    let directory = AgentDirectory::new();
    directory
        .add(
            "lamp-only",
            scope(&["desk-lamp:read_light"]),
            AgentRole::Guest,
        )
        .unwrap();
    let mut stored = serde_json::to_value(directory.stored()).unwrap();
    stored[0]["addedAtMs"] = 0.into();
    stored[0]["credentialSha256"] = "h".into();
    assert_eq!(
        stored,
        json!([{"id": "lamp-only", "scope": {"kind": "devices", "devices": {"desk-lamp": {"kind": "only", "names": ["read_light"]}}},
                "role": "guest", "addedAtMs": 0, "credentialSha256": "h"}])
    );
    let mut bad = directory.stored().remove(0);
    bad.credential_sha256 = "zz".into();
    assert_eq!(
        AgentDirectory::from_stored([bad]).unwrap_err(),
        AgentError::BadHash("lamp-only".into())
    );
}

#[test]
fn changes_are_broadcast_and_audited_without_credentials() {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let directory = AgentDirectory::new().with_audit(Arc::new(move |kind: &str, entry: Value| {
        sink.lock()
            .unwrap()
            .push(json!({"kind": kind, "entry": entry}));
    }));
    let mut events = directory.subscribe();
    let (_, credential) = directory
        .add("main", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    directory.set_scope("main", scope(&["desk-lamp"])).unwrap();
    assert_eq!(directory.get("main").unwrap().scope, scope(&["desk-lamp"]));
    directory.remove("main").unwrap();
    assert_eq!(directory.authenticate(credential.expose()), None);
    assert_eq!(
        directory.remove("main"),
        Err(AgentError::NotFound("main".into()))
    );
    assert_eq!(
        directory.set_scope("main", AgentScope::AllDevices),
        Err(AgentError::NotFound("main".into()))
    );
    let id = || "main".to_owned();
    assert_eq!(events.try_recv().unwrap(), AgentEvent::Added { id: id() });
    assert_eq!(
        events.try_recv().unwrap(),
        AgentEvent::ScopeChanged { id: id() }
    );
    assert_eq!(events.try_recv().unwrap(), AgentEvent::Removed { id: id() });
    let seen = seen.lock().unwrap();
    let changes: Vec<&str> = seen
        .iter()
        .map(|e| e["entry"]["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["added", "scope", "removed"]);
    assert!(seen.iter().all(|e| e["kind"] == "agent"));
    let text = serde_json::to_string(&*seen).unwrap();
    assert!(!text.contains(credential.expose()));
}

#[test]
fn a_directory_reloads_what_another_sharing_its_store_changed() {
    let store: Arc<dyn Store> = Arc::new(crate::store::MemoryStore::new());
    let here = AgentDirectory::new().with_store(Arc::clone(&store));
    let there = AgentDirectory::new().with_store(Arc::clone(&store));
    let told = Arc::new(Mutex::new(0));
    for directory in [&here, &there] {
        let told = Arc::clone(&told);
        directory.on_change(Arc::new(move || *told.lock().unwrap() += 1));
    }
    let mut events = there.subscribe();
    let (_, credential) = here
        .add("helper", scope(&["desk-lamp"]), AgentRole::User)
        .unwrap();
    there.reload(store.load_agents().unwrap()).unwrap();
    assert_eq!(
        there.authenticate(credential.expose()).unwrap().id,
        "helper"
    );
    here.set_scope("helper", AgentScope::AllDevices).unwrap();
    there.reload(store.load_agents().unwrap()).unwrap();
    assert_eq!(there.get("helper").unwrap().scope, AgentScope::AllDevices);
    here.remove("helper").unwrap();
    there.reload(store.load_agents().unwrap()).unwrap();
    assert_eq!(there.authenticate(credential.expose()), None);
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    let id = || "helper".to_owned();
    assert_eq!(
        seen,
        vec![
            AgentEvent::Added { id: id() },
            AgentEvent::ScopeChanged { id: id() },
            AgentEvent::Removed { id: id() },
        ]
    );
    // Only the three changes made through a directory are told.
    assert_eq!(*told.lock().unwrap(), 3);
}
