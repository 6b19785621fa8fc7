//! Tests of the admin API's bodies: each reads and writes the JSON the
//! routes have always used, key for key and in order.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::*;

/// `json` reads as `value`, and `value` writes `json` back, byte for byte.
#[track_caller]
fn check<T>(json: &str, value: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let read: T = serde_json::from_str(json).unwrap();
    assert_eq!(&read, value, "{json}");
    assert_eq!(serde_json::to_string(value).unwrap(), json);
}

/// `json` is refused as a `T`.
#[track_caller]
fn refused<T: DeserializeOwned + std::fmt::Debug>(json: &str) {
    let read = serde_json::from_str::<T>(json);
    assert!(read.is_err(), "{json} read as {read:?}");
}

#[test]
fn requests_round_trip_and_refuse_unknown_fields() {
    check(r#"{"approved":false}"#, &ConsentAnswer::default());
    check(
        r#"{"approved":true,"grant":["set_light"],"confirmWithoutCode":true}"#,
        &ConsentAnswer {
            approved: true,
            grant: vec!["set_light".to_owned()],
            confirm_without_code: true,
            confirm_credential_change: false,
        },
    );
    check(
        r#"{"approved":true,"confirmCredentialChange":true}"#,
        &ConsentAnswer {
            approved: true,
            confirm_credential_change: true,
            ..ConsentAnswer::default()
        },
    );
    refused::<ConsentAnswer>(r#"{"approved":true,"grants":["set_light"]}"#);
    refused::<ConsentAnswer>(r#"{"grant":[]}"#);

    check(
        r#"{"approved":true}"#,
        &ApprovalAnswer {
            approved: true,
            remember: None,
        },
    );
    check(
        r#"{"approved":true,"remember":{"scope":"arguments","minutes":15}}"#,
        &ApprovalAnswer {
            approved: true,
            remember: Some(Remember {
                scope: Named::Known(AllowanceScope::Arguments),
                minutes: Some(15),
            }),
        },
    );
    check(
        r#"{"approved":true,"remember":{"scope":"capability"}}"#,
        &ApprovalAnswer {
            approved: true,
            remember: Some(Remember {
                scope: Named::Known(AllowanceScope::Capability),
                minutes: None,
            }),
        },
    );
    refused::<ApprovalAnswer>(r#"{"approved":true,"remember":{"scope":"capability","for":5}}"#);
    refused::<ApprovalAnswer>(r#"{"approved":true,"agentId":"helper"}"#);

    check(
        r#"{"name":"helper","scope":["*"],"role":"guest"}"#,
        &NewAgent {
            name: "helper".to_owned(),
            scope: vec!["*".to_owned()],
            role: Some(Named::Known(AgentRole::Guest)),
        },
    );
    let bare: NewAgent = serde_json::from_str(r#"{"name":"helper"}"#).unwrap();
    assert_eq!((bare.scope.len(), bare.role), (0, None));
    refused::<NewAgent>(r#"{"name":"helper","credential":"x"}"#);

    check(
        r#"{"scope":["desk-lamp:set_light"]}"#,
        &NewScope {
            scope: vec!["desk-lamp:set_light".to_owned()],
        },
    );
    refused::<NewScope>(r#"{}"#);
}

#[test]
fn a_request_names_values_by_their_wire_names_and_keeps_an_unknown_one() {
    // The short names the vessel has always taken for a scope.
    for (json, scope) in [
        (r#"{"scope":"args"}"#, AllowanceScope::Arguments),
        (r#"{"scope":"cap"}"#, AllowanceScope::Capability),
    ] {
        let read: Remember = serde_json::from_str(json).unwrap();
        assert_eq!(read.scope, Named::Known(scope), "{json}");
    }
    // An unknown name reads, and says why it names nothing.
    let read: Remember = serde_json::from_str(r#"{"scope":"all"}"#).unwrap();
    assert_eq!(read.scope, Named::Unknown("all".to_owned()));
    assert_eq!(
        read.scope.known().unwrap_err().to_string(),
        "`all` is not what an allowance covers: say `arguments` (`args`, these exact arguments) or `capability` (`cap`, any arguments)"
    );
    check(
        r#"{"name":"x","scope":[],"role":"root"}"#,
        &NewAgent {
            name: "x".to_owned(),
            scope: Vec::new(),
            role: Some(Named::Unknown("root".to_owned())),
        },
    );
    let role = Named::<AgentRole>::from_name("root".to_owned());
    assert_eq!(
        role.known().unwrap_err().to_string(),
        "role `root` must be `guest`, `user` or `admin`"
    );
    // A name is a string: anything else is a malformed body.
    refused::<Remember>(r#"{"scope":1}"#);
    refused::<NewAgent>(r#"{"name":"x","role":[]}"#);
    // Every value reads from, and writes, the name it has on the wire.
    for role in [AgentRole::Guest, AgentRole::User, AgentRole::Admin] {
        let json = format!("\"{}\"", role.as_str());
        assert_eq!(serde_json::to_string(&role).unwrap(), json);
        assert_eq!(serde_json::from_str::<AgentRole>(&json).unwrap(), role);
        assert_eq!(role.as_str().parse::<AgentRole>(), Ok(role));
    }
    for scope in [AllowanceScope::Arguments, AllowanceScope::Capability] {
        let json = format!("\"{}\"", scope.as_str());
        assert_eq!(serde_json::to_string(&scope).unwrap(), json);
        assert_eq!(
            serde_json::from_str::<AllowanceScope>(&json).unwrap(),
            scope
        );
    }
    for (change, json) in [
        (ChangeKind::Added, r#""added""#),
        (ChangeKind::Removed, r#""removed""#),
        (ChangeKind::Changed, r#""changed""#),
    ] {
        assert_eq!(serde_json::to_string(&change).unwrap(), json);
        assert_eq!(serde_json::from_str::<ChangeKind>(json).unwrap(), change);
    }
    // An answer names a value only: a name no value has is refused.
    refused::<Agent>(r#"{"name":"x","scope":[],"role":"root","addedAtMs":0}"#);
}

#[test]
fn answers_round_trip_in_the_routes_key_order() {
    check(
        concat!(
            r#"{"id":"desk-lamp","name":"Desk lamp","kind":"lamp","version":"0.1.0","digest":"ab12","#,
            r#""pairedAtMs":1700000000000,"connected":true,"channel":"dk/2","grants":["set_light"],"capabilities":"#,
            r#"[{"name":"set_light","kind":"actuator","description":"Set the lamp.","confirm":false}]}"#
        ),
        &Device {
            id: "desk-lamp".to_owned(),
            name: "Desk lamp".to_owned(),
            kind: "lamp".to_owned(),
            version: "0.1.0".to_owned(),
            digest: "ab12".to_owned(),
            paired_at_ms: 1_700_000_000_000,
            connected: true,
            held_by: None,
            channel: crate::Channel::Dk2,
            grants: vec!["set_light".to_owned()],
            capabilities: vec![DeviceCapability {
                name: "set_light".to_owned(),
                kind: crate::CapabilityKind::Actuator,
                description: "Set the lamp.".to_owned(),
                confirm: false,
                params: Vec::new(),
                title: None,
                claims: Vec::new(),
            }],
            events: Vec::new(),
        },
    );
    check(
        r#"{"name":"helper","scope":["*"],"role":"user","addedAtMs":5}"#,
        &Agent {
            name: "helper".to_owned(),
            scope: vec!["*".to_owned()],
            role: AgentRole::User,
            added_at_ms: 5,
        },
    );
    check(
        r#"{"name":"helper","credential":"dk_agent_x"}"#,
        &AddedAgent {
            name: "helper".to_owned(),
            credential: "dk_agent_x".to_owned(),
        },
    );
    let once = Allowance {
        id: 3,
        agent_id: "helper".to_owned(),
        tool: "device__desk_lamp__set_light".to_owned(),
        device_id: "desk-lamp".to_owned(),
        capability: "set_light".to_owned(),
        scope: AllowanceScope::Arguments,
        arguments_sha256: Some("99".to_owned()),
        arguments: Some(r#"{"on":true}"#.to_owned()),
        created_at_ms: 1,
        expires_at_ms: 2,
        uses: 0,
    };
    check(
        concat!(
            r#"{"id":3,"agentId":"helper","tool":"device__desk_lamp__set_light","deviceId":"desk-lamp","#,
            r#""capability":"set_light","scope":"arguments","argumentsSha256":"99","arguments":"{\"on\":true}","#,
            r#""createdAtMs":1,"expiresAtMs":2,"uses":0}"#
        ),
        &once,
    );
    let any = Allowance {
        scope: AllowanceScope::Capability,
        arguments_sha256: None,
        arguments: None,
        ..once
    };
    check(
        concat!(
            r#"{"id":3,"agentId":"helper","tool":"device__desk_lamp__set_light","deviceId":"desk-lamp","#,
            r#""capability":"set_light","scope":"capability","createdAtMs":1,"expiresAtMs":2,"uses":0}"#
        ),
        &any,
    );
    check(
        r#"{"error":"no agent `x`"}"#,
        &ErrorBody {
            error: "no agent `x`".to_owned(),
        },
    );
    // A newer vessel may say more: answers are read leniently.
    let more: AddedAgent =
        serde_json::from_str(r#"{"name":"a","credential":"c","since":1}"#).unwrap();
    assert_eq!(more.name, "a");
}

#[test]
fn the_status_round_trips_in_the_routes_key_order() {
    let counts = |open| ListenerCounts {
        open,
        peak: 4,
        refused_at_accept: 1,
        idle_closed: 2,
    };
    let listener =
        |open: u64| format!(r#"{{"open":{open},"peak":4,"refusedAtAccept":1,"idleClosed":2}}"#);
    let json = format!(
        r#"{{"paired":2,"connected":1,"connections":3,"pending":0,"listeners":{{"devices":{},"admin":{},"mcp":{},"adminSocket":{},"mcpSocket":{}}},"fingerprint":"ABCD-EFGH","secureHandshakes":5,"channelFailures":1,"plainV1Refused":2}}"#,
        listener(3),
        listener(0),
        listener(1),
        listener(1),
        listener(0)
    );
    check(
        &json,
        &Status {
            paired: 2,
            connected: 1,
            connections: 3,
            pending: 0,
            listeners: Listeners {
                devices: counts(3),
                admin: counts(0),
                mcp: counts(1),
                admin_socket: counts(1),
                mcp_socket: counts(0),
            },
            fingerprint: Some("ABCD-EFGH".to_owned()),
            secure_handshakes: 5,
            channel_failures: 1,
            plain_v1_refused: 2,
            fleet: None,
            microphones: Vec::new(),
        },
    );
}

#[test]
fn pending_prompts_round_trip_in_the_routes_key_order() {
    let consent = concat!(
        r#"{"id":7,"expiresAtMs":9,"kind":"consent","request":{"deviceId":"front-door","name":"Front door","#,
        r#""kind":"lock","code":"004217","capabilities":[{"name":"unlock","kind":"actuator","#,
        r#""description":"Unlock the door.","confirm":true}],"replaces":{"pairedAtMs":5,"grants":["unlock"],"#,
        r#""wasName":null,"wasKind":"latch","changes":[{"capability":"unlock","change":"changed","#,
        r#""differences":[{"what":"kind","was":"sensor","now":"actuator"},{"what":"confirm","was":false,"now":true},"#,
        r#"{"what":"params"},{"what":"description"}],"summary":"unlock: changed"},"#,
        r#"{"capability":"siren","change":"added","differences":[],"summary":"siren: added"}]},"#,
        r#""noScreen":false,"channel":"dk/2"}}"#
    );
    let pending: Pending = serde_json::from_str(consent).unwrap();
    let Prompt::Consent(request) = &pending.prompt else {
        panic!("{pending:?}")
    };
    let replaced = request.replaces.as_ref().unwrap();
    assert_eq!(replaced.was_kind.as_deref(), Some("latch"));
    assert_eq!(
        replaced.changes[0].differences[0],
        Difference::Kind {
            was: crate::CapabilityKind::Sensor,
            now: crate::CapabilityKind::Actuator
        }
    );
    assert!(!pending.can_remember);
    assert_eq!(serde_json::to_string(&pending).unwrap(), consent);

    let first = concat!(
        r#"{"id":8,"expiresAtMs":9,"kind":"consent","request":{"deviceId":"lamp","name":"Lamp","#,
        r#""kind":"lamp","code":"000001","capabilities":[],"replaces":null,"noScreen":true,"channel":"v1"}}"#
    );
    let pending: Pending = serde_json::from_str(first).unwrap();
    assert_eq!(serde_json::to_string(&pending).unwrap(), first);
    // An older vessel sends no channel: it spoke v1.
    let older = first.replace(r#","channel":"v1""#, "");
    let pending: Pending = serde_json::from_str(&older).unwrap();
    let Prompt::Consent(request) = &pending.prompt else {
        panic!("{pending:?}")
    };
    assert_eq!(request.channel, crate::Channel::V1);

    let approval = concat!(
        r#"{"id":9,"expiresAtMs":10,"kind":"approval","request":{"tool":"device__front_door__unlock","#,
        r#""deviceId":"front-door","capability":"unlock","input":{"b":1,"a":2},"reason":"asks every time","#,
        r#""agentId":"helper","sessionId":"s-1","channel":"dk/2"},"canRemember":true}"#
    );
    let pending: Pending = serde_json::from_str(approval).unwrap();
    let Prompt::Approval(request) = &pending.prompt else {
        panic!("{pending:?}")
    };
    assert_eq!(request.agent_id.as_deref(), Some("helper"));
    assert_eq!(request.channel, crate::Channel::Dk2);
    assert!(pending.can_remember);
    assert_eq!(serde_json::to_string(&pending).unwrap(), approval);

    let host = concat!(
        r#"{"id":9,"expiresAtMs":10,"kind":"approval","request":{"tool":"t","deviceId":"d","#,
        r#""capability":"c","input":{},"reason":"r","channel":"v1"}}"#
    );
    let pending: Pending = serde_json::from_str(host).unwrap();
    assert_eq!(serde_json::to_string(&pending).unwrap(), host);
    // An older vessel names no channel on an approval: it spoke v1.
    let older = host.replace(r#","channel":"v1""#, "");
    let pending: Pending = serde_json::from_str(&older).unwrap();
    let Prompt::Approval(request) = &pending.prompt else {
        panic!("{pending:?}")
    };
    assert_eq!(request.channel, crate::Channel::V1);
}

#[test]
fn a_capability_kind_is_sensor_or_actuator_and_nothing_else() {
    let capability = |kind: &str| {
        format!(r#"{{"name":"set_light","kind":"{kind}","description":"Set.","confirm":false}}"#)
    };
    for (text, kind) in [
        ("sensor", crate::CapabilityKind::Sensor),
        ("actuator", crate::CapabilityKind::Actuator),
    ] {
        let read: DeviceCapability = serde_json::from_str(&capability(text)).unwrap();
        assert_eq!(read.kind, kind);
        assert_eq!(serde_json::to_string(&read).unwrap(), capability(text));
    }
    for not in ["Sensor", "robot", ""] {
        refused::<DeviceCapability>(&capability(not));
    }
    refused::<Difference>(r#"{"what":"kind","was":"sensor","now":"lever"}"#);
}
