//! Tests of pairing, authentication, grants and re-pairing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_proto::validate_manifest;
use dk_testkit::lamp;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::reads::PAIRINGS_PER_THREAD;
use super::state::pairing_code;
use super::*;
use crate::store::entry as schema;
use crate::store::testing::{FaultyStore, Writes};
use crate::store::{AuditEvent, MemoryStore, Store, StoreError, StoredPairing};

async fn pair_with(
    registry: &DeviceRegistry,
    manifest: &Value,
    decision: ConsentDecision,
) -> Result<Paired, PairError> {
    registry
        .pair(
            manifest,
            |_| {},
            |_| async move { Ok::<_, ()>(decision) },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await
}

#[tokio::test]
async fn pairing_shows_the_code_first_then_asks_with_everything() {
    let registry = DeviceRegistry::new();
    let log = Mutex::new(Vec::<String>::new());
    let paired = registry
        .pair(
            &lamp(),
            |code| log.lock().unwrap().push(format!("show {code}")),
            |request| {
                log.lock().unwrap().push(format!("ask {}", request.code));
                let seen = request.clone();
                async move {
                    assert_eq!(seen.device_id, "desk-lamp");
                    assert_eq!(
                        (seen.name.as_str(), seen.kind.as_str()),
                        ("Desk lamp", "lamp")
                    );
                    assert!(seen.replaces.is_none());
                    assert!(!seen.no_screen);
                    let caps: Vec<_> = seen
                        .capabilities
                        .iter()
                        .map(|c| (c.name.as_str(), c.kind.as_str(), c.confirm))
                        .collect();
                    assert_eq!(
                        caps,
                        [
                            ("read_light", "sensor", false),
                            ("set_light", "actuator", false),
                            ("strobe", "actuator", true)
                        ]
                    );
                    assert_eq!(
                        seen.capabilities[0].description,
                        "Read whether the lamp is on and its brightness (0-100)."
                    );
                    Ok::<_, ()>(ConsentDecision::approve(["read_light"]))
                }
            },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await
        .unwrap();
    let log = log.into_inner().unwrap();
    assert_eq!(log.len(), 2);
    let code = log[0].strip_prefix("show ").unwrap();
    assert_eq!(code.len(), 6);
    assert!(code.bytes().all(|b| b.is_ascii_digit()));
    assert_eq!(log[1], format!("ask {code}"));
    assert_eq!(paired.device_id, "desk-lamp");
    let token = paired.token.expose();
    assert_eq!(token.len(), 64);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert!(registry.is_granted("desk-lamp", "read_light"));
    assert!(!registry.is_granted("desk-lamp", "set_light"));
    assert!(!format!("{:?}", paired.token).contains(token));
}

#[track_caller]
fn check_refusal(result: Result<Paired, PairError>, expected: &str) {
    assert_eq!(
        result.map(|p| p.device_id).unwrap_err().to_string(),
        expected
    );
}

#[tokio::test]
async fn refusals_store_nothing() {
    let registry = DeviceRegistry::new();
    check_refusal(
        pair_with(&registry, &lamp(), ConsentDecision::refuse()).await,
        "the person did not approve pairing",
    );
    check_refusal(
        pair_with(
            &registry,
            &lamp(),
            ConsentDecision::approve(["read_light", "fly", "dance"]),
        )
        .await,
        "grant names unknown capability: fly, dance",
    );
    let failing = registry
        .pair(
            &lamp(),
            |_| {},
            |_| async { Err::<ConsentDecision, _>("prompt crashed") },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await;
    check_refusal(failing, "the person did not approve pairing");
    assert!(!registry.is_paired("desk-lamp"));
    assert!(registry.list().is_empty());
}

#[tokio::test]
async fn an_invalid_manifest_never_reaches_the_person() {
    let registry = DeviceRegistry::new();
    let asked = Mutex::new(false);
    let result = registry
        .pair(
            &json!({"id": "Bad"}),
            |_| *asked.lock().unwrap() = true,
            |_| {
                *asked.lock().unwrap() = true;
                async { Ok::<_, ()>(ConsentDecision::approve(["x"])) }
            },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await;
    check_refusal(
        result,
        "invalid manifest: manifest id \"Bad\" must be lower case words joined by \"-\"",
    );
    assert!(!*asked.lock().unwrap());
}

#[tokio::test(start_paused = true)]
async fn no_answer_in_time_is_a_no() {
    let registry = DeviceRegistry::new();
    let result = registry
        .pair(
            &lamp(),
            |_| {},
            |_| std::future::pending::<Result<ConsentDecision, ()>>(),
            Duration::from_millis(120_000),
        )
        .await;
    check_refusal(result, "the person did not approve pairing");
    assert!(!registry.is_paired("desk-lamp"));
}

#[tokio::test]
async fn approved_with_no_grants_pairs_with_nothing_granted() {
    let registry = DeviceRegistry::new();
    pair_with(
        &registry,
        &lamp(),
        ConsentDecision::approve(Vec::<String>::new()),
    )
    .await
    .unwrap();
    assert!(registry.is_paired("desk-lamp"));
    assert!(registry.list()[0].grants.is_empty());
}

#[tokio::test]
async fn authentication() {
    let registry = DeviceRegistry::new();
    let paired = pair_with(&registry, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    let token = paired.token.expose().to_owned();
    assert_eq!(
        registry
            .authenticate("desk-lamp", &token, None)
            .unwrap()
            .device_id(),
        "desk-lamp"
    );
    assert_eq!(
        registry
            .authenticate("desk-lamp", &token, Some(&lamp()))
            .unwrap()
            .generation(),
        paired.generation
    );
    let mut extra = lamp();
    extra["vendor"] = json!("ignored");
    assert!(
        registry
            .authenticate("desk-lamp", &token, Some(&extra))
            .is_ok()
    );

    let mut changed = lamp();
    changed["capabilities"][0]["description"] = json!("Something else.");
    let cases: [(&str, &str, Option<&Value>, AuthError); 6] = [
        ("desk-lamp", "00", None, AuthError::WrongToken),
        ("desk-lamp", &token[..63], None, AuthError::WrongToken),
        ("desk-lamp", "", None, AuthError::WrongToken),
        ("other-lamp", &token, None, AuthError::NotPaired),
        (
            "desk-lamp",
            &token,
            Some(&changed),
            AuthError::ManifestChanged,
        ),
        (
            "desk-lamp",
            &token,
            Some(&Value::Null),
            AuthError::ManifestChanged,
        ),
    ];
    for (id, token, manifest, expected) in cases {
        assert_eq!(
            registry.authenticate(id, token, manifest).unwrap_err(),
            expected,
            "{id} {token}"
        );
    }
    let upper = token.to_uppercase();
    assert_eq!(
        registry
            .authenticate("desk-lamp", &upper, None)
            .unwrap_err(),
        AuthError::WrongToken
    );
}

#[tokio::test]
async fn grants_revokes_unpairing_and_pairing_again() {
    let registry = DeviceRegistry::new();
    let mut events = registry.subscribe();
    let first = pair_with(&registry, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    assert_eq!(
        registry.grant("desk-lamp", "fly").unwrap_err().to_string(),
        "device \"desk-lamp\" has no capability \"fly\""
    );
    assert_eq!(
        registry.grant("nope", "fly").unwrap_err().to_string(),
        "device \"nope\" is not paired"
    );
    registry.grant("desk-lamp", "set_light").unwrap();
    assert!(registry.is_granted("desk-lamp", "set_light"));
    registry.revoke("desk-lamp", "set_light").unwrap();
    registry.revoke("desk-lamp", "set_light").unwrap();
    registry.revoke("nope", "set_light").unwrap();
    assert!(!registry.is_granted("desk-lamp", "set_light"));

    // Pairing again replaces the token and the grants.
    let second = pair_with(&registry, &lamp(), ConsentDecision::approve(["strobe"]))
        .await
        .unwrap();
    assert!(second.generation > first.generation);
    assert_eq!(
        registry
            .authenticate("desk-lamp", first.token.expose(), None)
            .unwrap_err(),
        AuthError::WrongToken
    );
    assert!(
        registry
            .authenticate("desk-lamp", second.token.expose(), None)
            .is_ok()
    );
    assert!(!registry.is_granted("desk-lamp", "read_light"));
    assert!(registry.is_granted("desk-lamp", "strobe"));

    registry.unpair("desk-lamp").unwrap();
    assert_eq!(
        registry
            .authenticate("desk-lamp", second.token.expose(), None)
            .unwrap_err(),
        AuthError::NotPaired
    );
    registry.unpair("desk-lamp").unwrap();

    let id = || "desk-lamp".to_owned();
    assert_eq!(
        drain(&mut events),
        [
            RegistryEvent::Paired { device_id: id() },
            RegistryEvent::Granted {
                device_id: id(),
                capability: "set_light".into()
            },
            RegistryEvent::Revoked {
                device_id: id(),
                capability: "set_light".into()
            },
            RegistryEvent::Paired { device_id: id() },
            RegistryEvent::Unpaired { device_id: id() },
        ]
    );
}

#[tokio::test]
async fn a_second_pairing_says_it_replaces_the_first() {
    let registry = DeviceRegistry::new();
    pair_with(&registry, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    let replaced = shown(&registry, &lamp()).await.replaces.unwrap();
    assert_eq!(replaced.grants, ["read_light"]);
    assert!(replaced.paired_at_ms > 0);
    // A refused re-pairing leaves the first pairing as it was.
    assert!(registry.is_granted("desk-lamp", "read_light"));
}

#[test]
fn codes_are_six_digits_and_vary() {
    let codes: std::collections::HashSet<String> = (0..2000).map(|_| pairing_code()).collect();
    assert!(
        codes
            .iter()
            .all(|c| c.len() == 6 && c.bytes().all(|b| b.is_ascii_digit()))
    );
    // 2,000 draws from a million codes: a handful of repeats at most.
    assert!(codes.len() > 1990, "{}", codes.len());
    let tokens: std::collections::HashSet<String> =
        (0..100).map(|_| DeviceToken::generate().0).collect();
    assert_eq!(tokens.len(), 100);
}

#[tokio::test]
async fn a_device_without_a_screen_needs_a_deliberate_confirmation() {
    let registry = DeviceRegistry::new();
    let mut headless = lamp();
    headless["noScreen"] = json!(true);
    let seen = Mutex::new(None);
    let result = registry
        .pair(
            &headless,
            |_| {},
            |request| {
                *seen.lock().unwrap() = Some(request.no_screen);
                async { Ok::<_, ()>(ConsentDecision::approve(["read_light"])) }
            },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await;
    assert_eq!(*seen.lock().unwrap(), Some(true), "the prompt says so");
    check_refusal(
        result,
        "the person did not confirm pairing a device that cannot show a code",
    );
    assert!(!registry.is_paired("desk-lamp"));
    let confirmed = ConsentDecision::approve(["read_light"]).without_code_confirmed();
    pair_with(&registry, &headless, confirmed).await.unwrap();
    assert!(registry.is_granted("desk-lamp", "read_light"));
}

#[tokio::test]
async fn device_tokens_are_known_while_their_pairing_stands() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let registry = DeviceRegistry::open(Arc::clone(&store)).unwrap();
    let grant = || ConsentDecision::approve(["read_light"]);
    let first = pair_with(&registry, &lamp(), grant()).await.unwrap();
    let first = first.token.expose().to_owned();
    assert!(registry.is_device_token(&first));
    assert!(!registry.is_device_token(&"0".repeat(64)));
    // Pairing again replaces the token: the old one is no longer a token.
    let second = pair_with(&registry, &lamp(), grant()).await.unwrap();
    let second = second.token.expose().to_owned();
    assert!(!registry.is_device_token(&first));
    assert!(registry.is_device_token(&second));
    // Known after a restart, by its stored hash; gone once unpaired.
    let reopened = DeviceRegistry::open(store).unwrap();
    assert!(reopened.is_device_token(&second));
    reopened.unpair("desk-lamp").unwrap();
    assert!(!reopened.is_device_token(&second));
}

fn lock(unlock_asks: bool) -> Value {
    json!({
        "id": "front-door", "name": "Front door", "kind": "lock", "version": "1.0.0",
        "capabilities": [
            {"name": "read_lock", "kind": "sensor", "description": "Is it locked?"},
            {"name": "lock", "kind": "actuator", "description": "Lock it."},
            {"name": "unlock", "kind": "actuator", "description": "Unlock it.", "confirm": unlock_asks},
        ],
    })
}

/// What the person is shown when `manifest` asks to pair.
async fn shown(registry: &DeviceRegistry, manifest: &Value) -> ConsentRequest {
    let seen = Mutex::new(None);
    registry
        .pair(
            manifest,
            |_| {},
            |request| {
                *seen.lock().unwrap() = Some(request);
                async { Ok::<_, ()>(ConsentDecision::refuse()) }
            },
            DEFAULT_CONSENT_TIMEOUT,
        )
        .await
        .unwrap_err();
    seen.lock().unwrap().take().unwrap()
}

#[tokio::test]
async fn a_re_pairing_shows_what_changes_against_the_approved_manifest() {
    let registry = DeviceRegistry::new();
    pair_with(
        &registry,
        &lock(true),
        ConsentDecision::approve(["lock", "read_lock", "unlock"]),
    )
    .await
    .unwrap();
    // The same manifest: nothing changes.
    let same = shown(&registry, &lock(true)).await.replaces.unwrap();
    assert!(same.changes.is_empty());
    assert_eq!((same.was_name, same.was_kind), (None, None));
    // `unlock` no longer asks, `lock` takes a param, `read_lock` is gone,
    // a siren is new, and the name changed.
    let mut changed = lock(false);
    changed["name"] = json!("Front door (new)");
    changed["capabilities"][1]["params"] = json!({"force": {"type": "boolean"}});
    changed["capabilities"][0] =
        json!({"name": "siren", "kind": "actuator", "description": "Sound the siren."});
    let replaces = shown(&registry, &changed).await.replaces.unwrap();
    assert_eq!(replaces.grants, ["lock", "read_lock", "unlock"]);
    assert_eq!(replaces.was_name.as_deref(), Some("Front door"));
    let summaries: Vec<&str> = replaces
        .changes
        .iter()
        .map(|c| c.summary.as_str())
        .collect();
    assert_eq!(
        summaries,
        [
            "siren: added",
            "lock: its params changed",
            "unlock: NO LONGER asks every time",
            "read_lock: removed",
        ]
    );
    assert_eq!(
        serde_json::to_value(&replaces.changes[2]).unwrap(),
        json!({"capability": "unlock", "change": "changed",
               "differences": [{"what": "confirm", "was": true, "now": false}],
               "summary": "unlock: NO LONGER asks every time"})
    );
    // A capability that became an actuator says so.
    let mut kinds = lock(true);
    kinds["capabilities"][0]["kind"] = json!("actuator");
    let replaces = shown(&registry, &kinds).await.replaces.unwrap();
    assert_eq!(
        replaces.changes[0].summary,
        "read_lock: was sensor, now actuator"
    );
    // Refused re-pairings changed nothing.
    assert!(
        registry
            .get("front-door")
            .unwrap()
            .manifest
            .capability("unlock")
            .unwrap()
            .confirm()
    );
}

#[tokio::test]
async fn a_pairing_made_while_the_person_was_asked_is_never_replaced_unseen() {
    let registry = Arc::new(DeviceRegistry::new());
    let (answer, answered) = tokio::sync::oneshot::channel::<ConsentDecision>();
    let (asked_tx, asked) = tokio::sync::oneshot::channel::<()>();
    let waiting = {
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            registry
                .pair(
                    &lamp(),
                    |_| {},
                    |_| async move {
                        let _ = asked_tx.send(());
                        Ok::<_, ()>(answered.await.unwrap())
                    },
                    DEFAULT_CONSENT_TIMEOUT,
                )
                .await
        })
    };
    asked.await.unwrap();
    // Meanwhile another request for the same id is approved.
    let other = pair_with(&registry, &lamp(), ConsentDecision::approve(["strobe"]))
        .await
        .unwrap();
    // The person now says yes to the first: what it was shown to replace
    // (nothing) is not what is there, so nothing happens.
    answer
        .send(ConsentDecision::approve([
            "read_light",
            "set_light",
            "strobe",
        ]))
        .unwrap();
    assert!(matches!(
        waiting.await.unwrap(),
        Err(PairError::ChangedMeanwhile)
    ));
    let kept = registry.get("desk-lamp").unwrap();
    assert_eq!(kept.generation, other.generation);
    assert!(registry.is_granted("desk-lamp", "strobe"));
    assert!(!registry.is_granted("desk-lamp", "set_light"));
}

/// The store's error under `error`, and the system's error under that.
fn store_and_io<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> (&'a StoreError, &'a std::io::Error) {
    let store = error.source().and_then(|s| s.downcast_ref::<StoreError>());
    let store = store.unwrap_or_else(|| panic!("no store error under `{error}`"));
    let io = std::error::Error::source(store).and_then(|s| s.downcast_ref::<std::io::Error>());
    (
        store,
        io.unwrap_or_else(|| panic!("no I/O error under `{store}`")),
    )
}

#[tokio::test]
async fn a_change_the_store_refuses_keeps_the_store_error_as_its_source() {
    let store = Arc::new(FaultyStore::default());
    let registry = DeviceRegistry::open(Arc::clone(&store) as Arc<dyn Store>).unwrap();
    pair_with(&registry, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    store.fail(Writes::Pairings, true);

    let refused = registry.grant("desk-lamp", "set_light").unwrap_err();
    let (under, io) = store_and_io(&refused);
    assert_eq!(refused, GrantError::NotStored(under.clone()));
    assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
    assert_eq!(
        refused.to_string(),
        format!("the change could not be saved: the disk is full: {io}")
    );
    assert!(!registry.is_granted("desk-lamp", "set_light"));

    let refused = registry.unpair("desk-lamp").unwrap_err();
    assert!(matches!(refused, GrantError::NotStored(_)), "{refused}");
    store_and_io(&refused);

    let refused = pair_with(&registry, &lamp(), ConsentDecision::approve(["strobe"]))
        .await
        .unwrap_err();
    let (under, _) = store_and_io(&refused);
    assert_eq!(
        refused.to_string(),
        format!("the pairing could not be saved: {under}")
    );
}

/// A store holding `count` lamps paired (ids `lamp-0000`...), as a vessel
/// stores them; `damage` may change the stored row of lamp `i` first.
fn store_of_lamps(count: usize, damage: impl Fn(usize, &mut StoredPairing)) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for i in 0..count {
        let mut manifest = lamp();
        manifest["id"] = json!(format!("lamp-{i:04}"));
        manifest["name"] = json!(format!("Lamp {i}"));
        let manifest = validate_manifest(&manifest).unwrap();
        let mut pairing = StoredPairing {
            device_id: manifest.id().to_owned(),
            manifest_json: manifest.to_stored_json(),
            digest: manifest.digest(),
            token_hash: [7; 32],
            device_key: None,
            grants: vec!["read_light".to_owned()],
            generation: u64::try_from(i).unwrap() + 1,
            paired_at_ms: 1,
        };
        damage(i, &mut pairing);
        let entry = schema::Entry::Paired(schema::Paired {
            device_id: pairing.device_id.clone(),
            name: manifest.name().to_owned(),
            digest: pairing.digest.clone(),
            grants: pairing.grants.clone(),
            replaced: false,
            no_screen: false,
            channel: "v1".to_owned(),
            generation: pairing.generation,
            device_key: None,
            by: None,
        });
        store
            .put_pairing(&pairing, &AuditEvent::of(&entry, 1))
            .unwrap();
    }
    store
}

#[track_caller]
fn check_refused(store: Arc<dyn Store>, device_id: &str) {
    match DeviceRegistry::open(store) {
        Err(StoreError::Corrupt(why)) => assert!(
            why.contains(&format!("pairing `{device_id}`")),
            "refused for another reason: {why}"
        ),
        Err(other) => panic!("refused with {other}"),
        Ok(_) => panic!("opened on a damaged pairing of `{device_id}`"),
    }
}

#[test]
fn thousands_of_pairings_are_checked_at_open_and_one_tampered_manifest_refuses_them_all() {
    // Enough pairings that they are checked on several threads where the
    // machine has several cores; the damage is late in the store's order.
    const LAMPS: usize = 3 * PAIRINGS_PER_THREAD;
    let registry = DeviceRegistry::open(store_of_lamps(LAMPS, |_, _| {})).unwrap();
    assert_eq!(registry.count(), LAMPS);
    assert!(registry.is_granted("lamp-1234", "read_light"));
    assert_eq!(registry.get("lamp-1500").unwrap().generation, 1501);

    // The manifest's text changed, its digest not.
    let renamed = |i: usize, p: &mut StoredPairing| {
        if i == LAMPS - 2 {
            p.manifest_json = p.manifest_json.replace("\"Lamp ", "\"Lamb ");
        }
    };
    check_refused(store_of_lamps(LAMPS, renamed), "lamp-1534");
    // A capability added: still a valid manifest, but not the one approved.
    let widened = |i: usize, p: &mut StoredPairing| {
        if i == 1000 {
            p.manifest_json = p.manifest_json.replacen(
                "\"capabilities\":[",
                "\"capabilities\":[{\"name\":\"unlock\",\"kind\":\"actuator\",\"description\":\"Opens\"},",
                1,
            );
        }
    };
    check_refused(store_of_lamps(LAMPS, widened), "lamp-1000");
    // The digest changed, the text not.
    let redigested = |i: usize, p: &mut StoredPairing| {
        if i == 700 {
            p.digest = "0".repeat(64);
        }
    };
    check_refused(store_of_lamps(LAMPS, redigested), "lamp-0700");
    // A manifest stored under another device's id.
    let moved = |i: usize, p: &mut StoredPairing| {
        if i == 5 {
            p.manifest_json = p.manifest_json.replace("lamp-0005", "lamp-9999");
        }
    };
    check_refused(store_of_lamps(LAMPS, moved), "lamp-0005");
}

/// Two registries over one store, as two vessels of a fleet share one.
fn two_vessels() -> (DeviceRegistry, DeviceRegistry) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    (
        DeviceRegistry::open(Arc::clone(&store)).unwrap(),
        DeviceRegistry::open(store).unwrap(),
    )
}

fn drain(events: &mut broadcast::Receiver<RegistryEvent>) -> Vec<RegistryEvent> {
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    seen
}

#[tokio::test]
async fn a_registry_reads_again_what_another_sharing_its_store_changed() {
    let (here, there) = two_vessels();
    let told = Arc::new(Mutex::new(Vec::<String>::new()));
    for registry in [&here, &there] {
        let told = Arc::clone(&told);
        registry.on_change(Arc::new(move |id: &str| {
            told.lock().unwrap().push(id.to_owned());
        }));
    }
    let mut events = there.subscribe();
    pair_with(&here, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    assert!(!there.is_paired("desk-lamp"));
    there.refresh("desk-lamp").unwrap();
    assert!(there.is_granted("desk-lamp", "read_light"));
    assert_eq!(
        there.get("desk-lamp").unwrap().generation(),
        here.get("desk-lamp").unwrap().generation()
    );
    here.grant("desk-lamp", "set_light").unwrap();
    here.revoke("desk-lamp", "read_light").unwrap();
    there.refresh("desk-lamp").unwrap();
    assert!(there.is_granted("desk-lamp", "set_light"));
    assert!(!there.is_granted("desk-lamp", "read_light"));
    // Reading again without a change says nothing.
    there.refresh("desk-lamp").unwrap();
    here.unpair("desk-lamp").unwrap();
    there.refresh_all().unwrap();
    assert!(!there.is_paired("desk-lamp"));
    let id = || "desk-lamp".to_owned();
    assert_eq!(
        drain(&mut events),
        vec![
            RegistryEvent::Paired { device_id: id() },
            RegistryEvent::Granted {
                device_id: id(),
                capability: "set_light".into()
            },
            RegistryEvent::Revoked {
                device_id: id(),
                capability: "read_light".into()
            },
            RegistryEvent::Unpaired { device_id: id() },
        ]
    );
    // Only the changes made by a registry itself are told: four, all here.
    assert_eq!(told.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn a_registry_sharing_its_store_knows_a_device_paired_elsewhere_when_it_connects() {
    let (here, there) = two_vessels();
    let paired = pair_with(&here, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    let token = paired.token.expose().to_owned();
    // Not shared: memory alone answers.
    assert_eq!(
        there.authenticate("desk-lamp", &token, None).unwrap_err(),
        AuthError::NotPaired
    );
    there.recall("desk-lamp").await;
    assert_eq!(
        there.authenticate("desk-lamp", &token, None).unwrap_err(),
        AuthError::NotPaired
    );
    there.set_shared();
    there.recall("desk-lamp").await;
    there.authenticate("desk-lamp", &token, None).unwrap();
    assert!(there.is_granted("desk-lamp", "read_light"));
    // An unknown id is still refused, and a wrong token too.
    there.recall("nope").await;
    assert_eq!(
        there.authenticate("nope", &token, None).unwrap_err(),
        AuthError::NotPaired
    );
    assert_eq!(
        there.authenticate("desk-lamp", "wrong", None).unwrap_err(),
        AuthError::WrongToken
    );
}

#[tokio::test]
async fn a_damaged_pairing_read_again_changes_nothing() {
    let store = Arc::new(MemoryStore::new());
    let here = DeviceRegistry::open(Arc::clone(&store) as Arc<dyn Store>).unwrap();
    pair_with(&here, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    let there = DeviceRegistry::open(Arc::clone(&store) as Arc<dyn Store>).unwrap();
    let mut stored = store.load_pairing("desk-lamp").unwrap().unwrap();
    stored.digest = "0".repeat(64);
    store
        .put_pairing(
            &stored,
            &AuditEvent::of(
                &schema::Entry::Unpaired(schema::Unpaired {
                    device_id: "desk-lamp".into(),
                    channel: "v1".into(),
                    by: None,
                }),
                1,
            ),
        )
        .unwrap();
    let held = there.get("desk-lamp").unwrap().digest().to_owned();
    assert!(there.refresh("desk-lamp").is_err());
    assert_eq!(there.get("desk-lamp").unwrap().digest(), held);
}

/// Two registries sharing one store whose call path (its reads of one
/// pairing) a test holds at a gate, the second a fleet's member.
fn two_vessels_on_a_gated_store() -> (Arc<FaultyStore>, DeviceRegistry, Arc<DeviceRegistry>) {
    let store = Arc::new(FaultyStore::default());
    let here = DeviceRegistry::open(Arc::clone(&store) as Arc<dyn Store>).unwrap();
    let there = DeviceRegistry::open(Arc::clone(&store) as Arc<dyn Store>).unwrap();
    there.set_shared();
    (store, here, Arc::new(there))
}

#[tokio::test]
async fn a_read_again_holds_no_lock_while_the_store_answers_and_never_goes_over_a_newer_change() {
    let (store, here, there) = two_vessels_on_a_gated_store();
    pair_with(&here, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    there.refresh("desk-lamp").unwrap();
    assert!(there.is_granted("desk-lamp", "read_light"));
    let gate = store.hold_call_path();
    // A read again that the store answers slowly: what it reads (granted)
    // is older than the revoke made below while it waits.
    let reading = {
        let there = Arc::clone(&there);
        std::thread::spawn(move || there.refresh("desk-lamp"))
    };
    gate.entered.recv().unwrap();
    // The person revokes on the same member meanwhile: the change is made
    // without waiting for the read (no lock is held across it).
    let (revoked, revoked_rx) = std::sync::mpsc::channel();
    let revoking = {
        let there = Arc::clone(&there);
        std::thread::spawn(move || {
            let done = there.revoke("desk-lamp", "read_light");
            let _ = revoked.send(());
            done
        })
    };
    let waited = revoked_rx.recv_timeout(dk_testkit::PATIENCE);
    // Whatever happened, the read is let through now (and read again).
    drop(gate);
    assert!(waited.is_ok(), "the revoke waited for the read");
    revoking.join().unwrap().unwrap();
    reading.join().unwrap().unwrap();
    // The read took nothing older over the revoke.
    assert!(!there.is_granted("desk-lamp", "read_light"));
    assert!(there.is_paired("desk-lamp"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_device_unknown_here_is_recalled_without_holding_the_thread() {
    let (store, here, there) = two_vessels_on_a_gated_store();
    let paired = pair_with(&here, &lamp(), ConsentDecision::approve(["read_light"]))
        .await
        .unwrap();
    let gate = store.hold_call_path();
    // Should the read block the one thread, nothing else would run: the
    // gate then opens late.
    let open = gate.open.clone();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(dk_testkit::PATIENCE).is_err() {
            let _ = open.send(());
        }
    });
    let ran_meanwhile = std::sync::atomic::AtomicBool::new(false);
    let recalling = there.recall("desk-lamp");
    let meanwhile = async {
        gate.entered.recv().unwrap();
        // The thread is free while the store answers.
        ran_meanwhile.store(true, std::sync::atomic::Ordering::SeqCst);
        gate.open.send(()).unwrap();
    };
    tokio::join!(recalling, meanwhile);
    done.send(()).unwrap();
    watchdog.join().unwrap();
    assert!(ran_meanwhile.load(std::sync::atomic::Ordering::SeqCst));
    there
        .authenticate("desk-lamp", paired.token.expose(), None)
        .unwrap();
    assert!(there.is_granted("desk-lamp", "read_light"));
}

#[tokio::test]
async fn a_re_pairing_names_changed_schemas_claims_titles_bounds_and_events() {
    let tool = |description: &str, schema: Value, destructive: bool| {
        json!({"dk": 1, "id": "files", "name": "Files", "kind": "mcp", "version": "1",
            "capabilities": [
                {"name": "write_file", "kind": "actuator", "description": description,
                 "title": "Write a file", "tool": "write_file",
                 "annotations": {"destructiveHint": destructive}, "inputSchema": schema},
                {"name": "set_level", "kind": "actuator", "description": "Sets it.",
                 "params": {"level": {"type": "number", "maximum": 10}}}
            ],
            "events": [{"name": "changed", "description": "A file changed."}]})
    };
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let registry = DeviceRegistry::new();
    pair_with(
        &registry,
        &tool("Writes a file.", schema.clone(), false),
        ConsentDecision::approve(["write_file", "set_level", "changed"]),
    )
    .await
    .unwrap();
    let mut changed = tool(
        "Writes a file.",
        json!({"type": "object", "properties": {"path": {"type": "string"}, "mode": {"type": "string"}}}),
        true,
    );
    changed["capabilities"][0]["title"] = json!("Write any file");
    changed["capabilities"][1]["params"]["level"]["maximum"] = json!(100);
    changed["events"] = json!([{"name": "deleted", "description": "A file went."}]);
    let replaces = shown(&registry, &changed).await.replaces.unwrap();
    let summaries: Vec<&str> = replaces
        .changes
        .iter()
        .map(|c| c.summary.as_str())
        .collect();
    assert_eq!(
        summaries,
        [
            "write_file: its title changed, what the device claims of it changed, its input or output schema changed",
            "set_level: its params changed",
            "deleted: added",
            "changed: removed",
        ]
    );
}
