//! Unit tests of remembered allowances: what they cover, when they end,
//! what revokes them, their bound, and their audit entries.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::*;

const MINUTE: u64 = 60_000;

/// Allowances on a clock the test sets (milliseconds since the epoch).
fn allowances() -> (Arc<Allowances>, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(1_000_000));
    let allowances = Arc::new(Allowances::new());
    let clock = Arc::clone(&now);
    allowances.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    (allowances, now)
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn call<'a>(agent: &'a str, arguments: &'a Map<String, Value>) -> OfferedCall<'a> {
    OfferedCall {
        agent_id: agent,
        tool: "device__front_door__unlock",
        device_id: "front-door",
        capability: "unlock",
        generation: 1,
        read_only: false,
        arguments,
    }
}

fn remember(scope: AllowanceScope, minutes: u64) -> Remember {
    Remember {
        scope,
        minutes: AllowanceMinutes::new(minutes).unwrap(),
    }
}

/// Makes an allowance for `agent`'s call with `arguments`.
fn make(
    allowances: &Arc<Allowances>,
    agent: &str,
    arguments: &Map<String, Value>,
    remember: Remember,
) -> Result<Allowance, AllowanceError> {
    let stamp = allowances.stamp();
    allowances
        .offer(stamp, call(agent, arguments))
        .accept(remember)
}

#[test]
fn minutes_are_bounded() {
    for (minutes, ok) in [
        (0, false),
        (1, true),
        (15, true),
        (1440, true),
        (1441, false),
        (u64::MAX, false),
    ] {
        assert_eq!(AllowanceMinutes::new(minutes).is_ok(), ok, "{minutes}");
    }
    assert_eq!(AllowanceMinutes::default().get(), 15);
    assert_eq!(
        AllowanceMinutes::new(0).unwrap_err().to_string(),
        "an allowance lasts 1 to 1440 minutes, not 0"
    );
}

#[test]
fn scopes_have_short_and_long_names() {
    for (text, scope) in [
        ("args", Some(AllowanceScope::Arguments)),
        ("arguments", Some(AllowanceScope::Arguments)),
        ("cap", Some(AllowanceScope::Capability)),
        ("capability", Some(AllowanceScope::Capability)),
        ("all", None),
        ("", None),
    ] {
        assert_eq!(AllowanceScope::parse(text).ok(), scope, "{text:?}");
    }
}

#[test]
fn the_arguments_hash_is_of_their_canonical_json() {
    let (digest, text) =
        arguments_digest(&args(json!({"b": 1, "a": {"d": [1.5, "x"], "c": null}})));
    assert_eq!(text, r#"{"a":{"c":null,"d":[1.5,"x"]},"b":1}"#);
    assert_eq!(
        digest,
        dk_files::hex::encode(&Sha256::digest(text.as_bytes()))
    );
}

#[track_caller]
fn check_cover(scope: AllowanceScope, asked: Value, cases: &[(&str, &str, u64, Value, bool)]) {
    let (allowances, _) = allowances();
    let made = make(&allowances, "helper", &args(asked), remember(scope, 15)).unwrap();
    for (agent, tool, generation, arguments, covered) in cases {
        let found = allowances.covering(agent, tool, *generation, &args(arguments.clone()));
        assert_eq!(
            found,
            covered.then_some(made.id),
            "{scope:?}: {agent} {tool} gen {generation} {arguments}"
        );
    }
}

#[test]
fn exact_arguments_cover_only_those_arguments() {
    let tool = "device__front_door__unlock";
    check_cover(
        AllowanceScope::Arguments,
        json!({"door": "front", "seconds": 5}),
        &[
            (
                "helper",
                tool,
                1,
                json!({"door": "front", "seconds": 5}),
                true,
            ),
            // Key order does not matter: the JSON is canonical.
            (
                "helper",
                tool,
                1,
                json!({"seconds": 5, "door": "front"}),
                true,
            ),
            (
                "helper",
                tool,
                1,
                json!({"door": "front", "seconds": 6}),
                false,
            ),
            // serde_json prints 5.0 as 5.0: not the same arguments.
            (
                "helper",
                tool,
                1,
                json!({"door": "front", "seconds": 5.0}),
                false,
            ),
            ("helper", tool, 1, json!({"door": "front"}), false),
            (
                "other",
                tool,
                1,
                json!({"door": "front", "seconds": 5}),
                false,
            ),
            (
                "helper",
                "device__front_door__lock",
                1,
                json!({"door": "front", "seconds": 5}),
                false,
            ),
            // Paired again: a new grant.
            (
                "helper",
                tool,
                2,
                json!({"door": "front", "seconds": 5}),
                false,
            ),
        ],
    );
}

#[test]
fn a_capability_covers_any_arguments_of_that_agent_and_tool() {
    let tool = "device__front_door__unlock";
    check_cover(
        AllowanceScope::Capability,
        json!({"seconds": 5}),
        &[
            ("helper", tool, 1, json!({"seconds": 5}), true),
            ("helper", tool, 1, json!({"seconds": 600}), true),
            ("helper", tool, 1, json!({}), true),
            ("other", tool, 1, json!({"seconds": 5}), false),
            (
                "helper",
                "device__front_door__lock",
                1,
                json!({"seconds": 5}),
                false,
            ),
            ("helper", tool, 2, json!({"seconds": 5}), false),
        ],
    );
}

#[test]
fn an_allowance_ends_when_its_minutes_are_up() {
    let (allowances, now) = allowances();
    let input = args(json!({}));
    let made = make(
        &allowances,
        "helper",
        &input,
        remember(AllowanceScope::Capability, 15),
    )
    .unwrap();
    assert_eq!(made.expires_at_ms, made.created_at_ms + 15 * MINUTE);
    let tool = "device__front_door__unlock";
    now.fetch_add(15 * MINUTE - 1, Ordering::SeqCst);
    assert_eq!(
        allowances.covering("helper", tool, 1, &input),
        Some(made.id)
    );
    assert_eq!(allowances.list().len(), 1);
    assert_eq!(allowances.list()[0].uses, 1);
    now.fetch_add(1, Ordering::SeqCst);
    assert_eq!(allowances.covering("helper", tool, 1, &input), None);
    assert!(allowances.list().is_empty());
    assert_eq!(allowances.get(made.id), None);
    assert_eq!(
        allowances.revoke(made.id),
        Err(AllowanceError::NotFound(made.id))
    );
}

#[test]
fn revocations_take_what_rests_on_the_change() {
    type Revoke = fn(&Allowances);
    let cases: [(&str, Revoke, [bool; 3]); 6] = [
        (
            "capability",
            |a| {
                a.drop_capability("front-door", "unlock");
            },
            [false, false, true],
        ),
        (
            "another capability",
            |a| {
                a.drop_capability("front-door", "lock");
            },
            [true, true, true],
        ),
        (
            "unpaired",
            |a| {
                a.drop_device("front-door", RevokeCause::Unpaired);
            },
            [false, false, true],
        ),
        (
            "agent removed",
            |a| {
                a.drop_agent("helper");
            },
            [false, true, false],
        ),
        (
            "agent re-scoped",
            |a| {
                a.drop_agent_outside("helper", |_, capability, _| capability != "unlock");
            },
            [false, true, true],
        ),
        (
            "still in scope",
            |a| {
                a.drop_agent_outside("helper", |_, _, _| true);
            },
            [true, true, true],
        ),
    ];
    for (what, revoke, left) in cases {
        let (allowances, _) = allowances();
        let input = args(json!({}));
        let by_helper = make(
            &allowances,
            "helper",
            &input,
            remember(AllowanceScope::Capability, 5),
        )
        .unwrap();
        let by_other = make(
            &allowances,
            "other",
            &input,
            remember(AllowanceScope::Capability, 5),
        )
        .unwrap();
        let stamp = allowances.stamp();
        let mut elsewhere = call("helper", &input);
        elsewhere.device_id = "garage";
        elsewhere.tool = "device__garage__open";
        elsewhere.capability = "open";
        let garage = allowances
            .offer(stamp, elsewhere)
            .accept(remember(AllowanceScope::Capability, 5))
            .unwrap();
        revoke(&allowances);
        let ids: Vec<u64> = allowances.list().iter().map(|a| a.id).collect();
        let expected: Vec<u64> = [by_helper.id, by_other.id, garage.id]
            .into_iter()
            .zip(left)
            .filter_map(|(id, kept)| kept.then_some(id))
            .collect();
        assert_eq!(ids, expected, "{what}");
    }
}

#[test]
fn an_answer_given_while_its_grant_or_agent_changed_is_not_remembered() {
    type Change = fn(&Allowances);
    let cases: [(&str, Change, bool); 6] = [
        ("nothing", |_| {}, true),
        (
            "its capability revoked",
            |a| {
                a.drop_capability("front-door", "unlock");
            },
            false,
        ),
        (
            "another device unpaired",
            |a| {
                a.drop_device("garage", RevokeCause::Unpaired);
            },
            true,
        ),
        (
            "its device paired again",
            |a| {
                a.drop_device("front-door", RevokeCause::PairedAgain);
            },
            false,
        ),
        (
            "its agent removed",
            |a| {
                a.drop_agent("helper");
            },
            false,
        ),
        (
            "another agent removed",
            |a| {
                a.drop_agent("other");
            },
            true,
        ),
    ];
    for (what, change, remembered) in cases {
        let (allowances, _) = allowances();
        let input = args(json!({"seconds": 5}));
        let stamp = allowances.stamp();
        let offer = allowances.offer(stamp, call("helper", &input));
        change(&allowances);
        let made = offer.accept(remember(AllowanceScope::Arguments, 5));
        assert_eq!(made.is_ok(), remembered, "{what}: {made:?}");
        if !remembered {
            assert_eq!(made, Err(AllowanceError::Changed), "{what}");
            assert!(allowances.list().is_empty(), "{what}");
        }
    }
}

#[test]
fn at_most_so_many_live_at_once() {
    let (allowances, now) = allowances();
    let input = args(json!({}));
    let first = make(
        &allowances,
        "a-0",
        &input,
        remember(AllowanceScope::Capability, 1),
    )
    .unwrap();
    for n in 1..MAX_ALLOWANCES {
        make(
            &allowances,
            &format!("a-{n}"),
            &input,
            remember(AllowanceScope::Capability, 60),
        )
        .unwrap();
    }
    let full = make(
        &allowances,
        "late",
        &input,
        remember(AllowanceScope::Capability, 5),
    );
    assert_eq!(full, Err(AllowanceError::Full(MAX_ALLOWANCES)));
    assert!(full.unwrap_err().to_string().contains("revoke one"));
    // One revoked by the person makes room.
    allowances.revoke(first.id).unwrap();
    let made = make(
        &allowances,
        "late",
        &input,
        remember(AllowanceScope::Capability, 5),
    )
    .unwrap();
    assert_eq!(made.id, u64::try_from(MAX_ALLOWANCES).unwrap() + 1);
    // So does one whose time is up.
    assert!(
        make(
            &allowances,
            "later",
            &input,
            remember(AllowanceScope::Capability, 5)
        )
        .is_err()
    );
    now.fetch_add(5 * MINUTE, Ordering::SeqCst);
    assert!(
        make(
            &allowances,
            "later",
            &input,
            remember(AllowanceScope::Capability, 5)
        )
        .is_ok()
    );
    assert_eq!(allowances.list().len(), MAX_ALLOWANCES);
}

#[test]
fn making_and_revoking_are_audited() {
    let (allowances, _) = allowances();
    let seen: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let log = Arc::clone(&seen);
    allowances.set_audit_hook(Arc::new(move |kind: &str, entry: Value| {
        log.lock().unwrap().push((kind.to_owned(), entry));
    }));
    let input = args(json!({"seconds": 5}));
    let stamp = allowances.stamp();
    let offer = allowances.offer(stamp, call("helper", &input));
    let made = offer
        .accept(remember(AllowanceScope::Arguments, 30))
        .unwrap();
    offer.announce(&made);
    allowances.revoke(made.id).unwrap();
    let seen = seen.lock().unwrap().clone();
    let (digest, _) = arguments_digest(&input);
    assert_eq!(
        seen,
        [
            (
                "allowance-created".to_owned(),
                json!({"id": made.id, "agentId": "helper", "tool": "device__front_door__unlock",
                       "deviceId": "front-door", "capability": "unlock", "scope": "arguments",
                       "minutes": 30, "expiresAtMs": made.expires_at_ms, "argumentsSha256": digest}),
            ),
            (
                "allowance-revoked".to_owned(),
                json!({"id": made.id, "agentId": "helper", "tool": "device__front_door__unlock",
                       "deviceId": "front-door", "capability": "unlock", "scope": "arguments",
                       "uses": 0, "why": "revoked by the person"}),
            ),
        ]
    );
}

#[test]
fn long_arguments_are_shown_cut_and_bound_whole() {
    let (allowances, _) = allowances();
    let input = args(json!({"text": "é".repeat(400)}));
    let made = make(
        &allowances,
        "helper",
        &input,
        remember(AllowanceScope::Arguments, 5),
    )
    .unwrap();
    let shown = made.arguments.unwrap();
    assert!(shown.len() < 600, "{}", shown.len());
    assert!(shown.ends_with("bytes more)"), "{shown}");
    assert_eq!(made.arguments_sha256, Some(arguments_digest(&input).0));
}

mod microphone;
mod through_adapter;

fn made_elsewhere(id: u64) -> Allowance {
    Allowance {
        id,
        agent_id: "helper".into(),
        tool: "device__desk_lamp__set_light".into(),
        device_id: "desk-lamp".into(),
        capability: "set_light".into(),
        scope: AllowanceScope::Capability,
        arguments_sha256: None,
        arguments: None,
        created_at_ms: 1,
        expires_at_ms: u64::MAX,
        uses: 0,
    }
}

#[test]
fn a_copy_of_another_members_allowance_covers_calls_and_ends_with_it() {
    let allowances = Allowances::new();
    let changes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&changes);
    allowances.share_with(Arc::new(move |change| seen.lock().unwrap().push(change)));
    let audited = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = Arc::clone(&audited);
    allowances.set_audit_hook(Arc::new(move |kind, _| {
        log.lock().unwrap().push(kind.to_owned())
    }));

    let copy = allowances.adopt("b", made_elsewhere(7), 3, false).unwrap();
    let other = allowances.adopt("c", made_elsewhere(7), 3, false).unwrap();
    let input = serde_json::Map::new();
    let covers = |generation| {
        allowances.covering("helper", "device__desk_lamp__set_light", generation, &input)
    };
    assert!(covers(3).is_some());
    assert_eq!(covers(4), None, "another pairing is not covered");
    // Ended where it was made: the copy of that member's goes, not the
    // other member's of the same id.
    allowances.forget("a", "b", 7);
    assert!(allowances.get(copy).is_none());
    assert!(allowances.get(other).is_some());
    // Revoked here, a copy is named by its origin, for that member to end.
    allowances.revoke(other).unwrap();
    assert_eq!(
        *changes.lock().unwrap(),
        vec![AllowanceChange::Revoked {
            origin: Some(("c".into(), 7)),
            id: other
        }]
    );
    // Nothing of a copy is recorded here.
    assert!(audited.lock().unwrap().is_empty());
}
