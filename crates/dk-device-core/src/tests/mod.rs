//! The core against dk-channel's scripted vessel: the
//! handshake, the pairing with both sides' codes, a call, a reconnect by
//! key, an impostor, and the hostile turns the rules name; `hostile.rs`
//! has the rest of the hostile vessels.

extern crate std;

use alloc::boxed::Box;
use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use alloc::{format, vec};

use dk_channel::{RecordLimits, ScriptedVessel, StaticKey};
use dk_proto::{DeviceFrame, MAX_FRAME_BYTES, Manifest, validate_manifest};

use super::*;

const LAMP: &str = include_str!("../../../../fixtures/manifests/valid/desk-lamp.json");

fn lamp() -> Manifest {
    let value: serde_json::Value = serde_json::from_str(LAMP).unwrap();
    validate_manifest(&value).unwrap()
}

/// Random bytes from a counter: predictable, which is all a test needs.
fn counter() -> Box<dyn Entropy + Send> {
    let mut next = 1u8;
    Box::new(move |dest: &mut [u8]| {
        for byte in dest.iter_mut() {
            *byte = next;
            next = next.wrapping_add(7);
        }
        Ok(())
    })
}

fn device(credentials: Option<Credentials>) -> DeviceCore {
    device_with(Config::default(), credentials)
}

fn device_with(config: Config, credentials: Option<Credentials>) -> DeviceCore {
    DeviceCore::new(&lamp(), config, counter(), credentials, None).unwrap()
}

/// A vessel's side of one connection (dk-channel's scripted vessel), with
/// the nonce its pairing reveals.
struct Vessel {
    channel: ScriptedVessel,
    nv: [u8; 32],
}

impl Vessel {
    fn new(secret: u8) -> Vessel {
        let key = StaticKey::from_secret([secret; 32]).unwrap();
        let limits = RecordLimits {
            max_text: MAX_FRAME_BYTES,
            max_binary: MAX_FRAME_BYTES,
        };
        Vessel {
            channel: ScriptedVessel::new(&key, limits).unwrap(),
            nv: [9; 32],
        }
    }

    fn restart(&mut self) {
        self.channel.restart().unwrap();
    }

    fn key(&self) -> &StaticKey {
        self.channel.key()
    }

    fn hash(&self) -> [u8; 32] {
        self.channel.handshake_hash()
    }

    /// Answers message 1 with message 2.
    fn second(&mut self, first: &[u8]) -> Vec<u8> {
        self.channel.second(first).unwrap()
    }

    fn third(&mut self, third: &[u8]) {
        self.channel.third(third).unwrap();
    }

    fn seal(&mut self, frame: &str) -> Vec<Vec<u8>> {
        self.channel.seal(frame).unwrap()
    }

    fn open(&mut self, record: &[u8]) -> Option<String> {
        self.channel.open(record).unwrap()
    }
}

fn drain(core: &mut DeviceCore) -> Vec<Output> {
    core::iter::from_fn(|| core.poll()).collect()
}

fn sent(outputs: &[Output]) -> Vec<Message> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Send(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn binary(message: &Message) -> &[u8] {
    match message {
        Message::Binary(bytes) => bytes,
        other => panic!("not binary: {other:?}"),
    }
}

const NOW: Instant = Instant::from_millis(1_000);

/// Runs the handshake; the device's frames after it, opened.
fn shake(core: &mut DeviceCore, vessel: &mut Vessel) -> (Vec<Output>, Vec<String>) {
    core.connect(NOW);
    let out = drain(core);
    let first = sent(&out);
    assert_eq!(first.len(), 1, "{out:?}");
    let second = vessel.second(binary(&first[0]));
    core.receive(NOW, Received::Binary(&second));
    let out = drain(core);
    let messages = sent(&out);
    vessel.third(binary(&messages[0]));
    let frames = messages[1..]
        .iter()
        .filter_map(|m| vessel.open(binary(m)))
        .collect();
    (out, frames)
}

/// Feeds the device a frame through the channel; what it sent back, opened.
fn tell(core: &mut DeviceCore, vessel: &mut Vessel, frame: &str) -> (Vec<Output>, Vec<String>) {
    for record in vessel.seal(frame) {
        core.receive(NOW, Received::Binary(&record));
    }
    let out = drain(core);
    let frames = sent(&out)
        .iter()
        .filter_map(|m| match m {
            Message::Binary(bytes) => vessel.open(bytes),
            _ => None,
        })
        .collect();
    (out, frames)
}

/// The close the device sent in `out`, with its code and reason.
fn close_sent(out: &[Output]) -> Option<(u16, String)> {
    out.iter().find_map(|o| match o {
        Output::Send(Message::Close(Some(frame))) => Some((frame.code, frame.reason.clone())),
        _ => None,
    })
}

fn ended(out: &[Output]) -> Option<&End> {
    out.iter().find_map(|o| match o {
        Output::Ended(end) => Some(end),
        _ => None,
    })
}

fn stored(out: &[Output]) -> Vec<Credentials> {
    out.iter()
        .filter_map(|o| match o {
            Output::Store(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn invoke(call_id: &str, capability: &str) -> String {
    format!(
        r#"{{"type":"device:invoke","callId":"{call_id}","capability":"{capability}","input":{{"on":true}}}}"#
    )
}

/// The device's frames in `out`, opened by the vessel.
fn opened(vessel: &mut Vessel, out: &[Output]) -> Vec<String> {
    sent(out)
        .iter()
        .filter_map(|m| match m {
            Message::Binary(bytes) => vessel.open(bytes),
            _ => None,
        })
        .collect()
}

/// The one `device:result` among `frames`: its `ok` and its error.
#[track_caller]
fn result_of(frames: &[String], call_id: &str) -> (bool, Option<String>) {
    let results: Vec<serde_json::Value> = frames
        .iter()
        .map(|f| serde_json::from_str::<serde_json::Value>(f).unwrap())
        .filter(|f| f["type"] == "device:result" && f["callId"] == call_id)
        .collect();
    assert_eq!(results.len(), 1, "{frames:?}");
    let ok = results[0]["ok"].as_bool().unwrap();
    (ok, results[0]["error"].as_str().map(str::to_string))
}

fn runs(out: &[Output]) -> Vec<&str> {
    out.iter()
        .filter_map(|o| match o {
            Output::Invoke(call) => Some(call.call_id.as_str()),
            _ => None,
        })
        .collect()
}

/// Pairs a new device; the vessel and the credentials kept.
fn paired() -> (DeviceCore, Vessel, Credentials) {
    paired_with(Config::default())
}

/// Pairs a new device running as `config`.
fn paired_with(config: Config) -> (DeviceCore, Vessel, Credentials) {
    let mut core = device_with(config, None);
    let mut vessel = Vessel::new(42);
    let (out, frames) = shake(&mut core, &mut vessel);
    assert!(out.contains(&Output::Connected));
    assert!(frames[0].contains("device:hello"), "{frames:?}");
    let commitment = dk_channel::commitment(&vessel.nv, &vessel.hash());
    let commit = format!(
        r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
        dk_channel::to_hex32(&commitment)
    );
    let (_, frames) = tell(&mut core, &mut vessel, &commit);
    let nonce: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(nonce["type"], "device:pair-nonce");
    let nd = dk_channel::from_hex32(nonce["nonce"].as_str().unwrap()).unwrap();
    let reveal = format!(
        r#"{{"type":"device:pair-reveal","nonce":"{}"}}"#,
        dk_channel::to_hex32(&vessel.nv)
    );
    let (out, _) = tell(&mut core, &mut vessel, &reveal);
    let code = dk_channel::pairing_code(&vessel.hash(), &nd, &vessel.nv);
    assert!(out.contains(&Output::ShowCode(code)), "{out:?}");
    let (out, _) = tell(&mut core, &mut vessel, r#"{"type":"device:paired"}"#);
    let stored = out
        .iter()
        .find_map(|o| match o {
            Output::Store(c) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert!(stored.is_paired());
    assert_eq!(stored.pinned(), Some(&vessel.key().public()));
    assert_eq!(core.state(), State::Serving);
    (core, vessel, stored)
}

#[test]
fn a_device_pairs_shows_the_vessels_code_and_answers_a_call() {
    let (mut core, mut vessel, _) = paired();
    let (out, _) = tell(
        &mut core,
        &mut vessel,
        r#"{"type":"device:invoke","callId":"c1","capability":"set_light","input":{"on":true}}"#,
    );
    let Some(Output::Invoke(call)) = out.iter().find(|o| matches!(o, Output::Invoke(_))) else {
        panic!("no invoke: {out:?}");
    };
    assert_eq!(call.capability, "set_light");
    assert_eq!(call.input.to_map()["on"], true);
    assert_eq!(call.input.as_str(), r#"{"on":true}"#);
    assert!(core.answer("c1", Ok(r#"{"on":true}"#)));
    let frames: Vec<String> = drain(&mut core)
        .iter()
        .filter_map(|o| match o {
            Output::Send(Message::Binary(b)) => vessel.open(b),
            _ => None,
        })
        .collect();
    let result: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(result["type"], "device:result");
    assert_eq!(result["ok"], true);
    assert_eq!(result["result"]["on"], true);
    // Answered once.
    assert!(!core.answer("c1", Ok("1")));
    // A replayed id is refused, not run.
    let (out, frames) = tell(
        &mut core,
        &mut vessel,
        r#"{"type":"device:invoke","callId":"c1","capability":"set_light","input":{}}"#,
    );
    assert!(!out.iter().any(|o| matches!(o, Output::Invoke(_))));
    assert!(frames[0].contains("already received"), "{frames:?}");
}

#[test]
fn a_paired_device_reconnects_by_key_and_an_impostor_hears_nothing() {
    let (_, mut vessel, kept) = paired();
    let bytes = kept.to_bytes();
    let kept = Credentials::from_bytes(&bytes[..]).unwrap();
    let mut core = device(Some(kept.clone()));
    vessel.restart();
    let (_, frames) = shake(&mut core, &mut vessel);
    let auth: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(auth["type"], "device:auth");
    assert_eq!(auth["deviceId"], "desk-lamp");
    assert!(auth.get("token").is_none());
    assert_eq!(core.state(), State::Serving);

    let mut core = device(Some(kept));
    let mut impostor = Vessel::new(7);
    core.connect(NOW);
    let first = sent(&drain(&mut core));
    let second = impostor.second(binary(&first[0]));
    core.receive(NOW, Received::Binary(&second));
    let out = drain(&mut core);
    assert_eq!(sent(&out), vec![Message::Close(None)], "no message 3");
    assert!(matches!(
        out.last(),
        Some(Output::Ended(End::Stop(Stop::VesselKeyChanged { .. })))
    ));
}

#[test]
fn a_second_commitment_breaks_the_pairing_with_4001() {
    let mut core = device(None);
    let mut vessel = Vessel::new(42);
    shake(&mut core, &mut vessel);
    let commit = format!(
        r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
        "ab".repeat(32)
    );
    tell(&mut core, &mut vessel, &commit);
    let (out, _) = tell(&mut core, &mut vessel, &commit);
    let Some(Output::Send(Message::Close(Some(frame)))) = out.last() else {
        panic!("{out:?}");
    };
    assert_eq!(frame.code, 4001);
    assert_eq!(frame.reason, "pairing did not happen: a second commitment");
    core.receive(NOW, Received::Close(Some((4001, ""))));
    assert_eq!(
        drain(&mut core),
        vec![Output::Ended(End::Stop(Stop::PairingBroken(
            "a second commitment".to_string()
        )))]
    );
}

#[test]
fn a_record_that_does_not_open_closes_4012_and_a_forged_close_is_retried() {
    let (mut core, _vessel, _) = paired();
    core.receive(NOW, Received::Binary(&[1, 2, 3]));
    let out = drain(&mut core);
    assert!(matches!(
        out.as_slice(),
        [Output::Send(Message::Close(Some(CloseFrame {
            code: 4012,
            ..
        })))]
    ));
    core.handle_timeout(NOW.saturating_add(CLOSE_TIMEOUT));
    assert_eq!(
        drain(&mut core),
        vec![Output::Ended(End::Retry(Retry::Lost))]
    );

    let (mut core, _vessel, _) = paired();
    core.receive(NOW, Received::Close(Some((4002, "forged"))));
    let out = drain(&mut core);
    assert!(matches!(
        out.last(),
        Some(Output::Ended(End::Retry(Retry::Closed { code: 4002, .. })))
    ));
}

#[test]
fn an_announced_unpairing_stops_and_marks_the_key_unpaired() {
    let (mut core, mut vessel, _) = paired();
    tell(
        &mut core,
        &mut vessel,
        r#"{"type":"device:closing","code":4002,"reason":"auth failed"}"#,
    );
    core.receive(NOW, Received::Close(Some((4002, "auth failed"))));
    let out = drain(&mut core);
    let Some(Output::Store(stored)) = out.first() else {
        panic!("{out:?}");
    };
    assert!(!stored.is_paired());
    assert!(stored.pinned().is_some(), "the pin stays");
    assert_eq!(
        out.last(),
        Some(&Output::Ended(End::Stop(Stop::AuthFailed)))
    );
}

#[test]
fn the_handshake_times_out_and_text_breaks_it() {
    let mut core = device(None);
    core.connect(NOW);
    drain(&mut core);
    assert_eq!(
        core.poll_timeout(),
        Some(NOW.saturating_add(HANDSHAKE_TIMEOUT))
    );
    core.handle_timeout(NOW);
    assert!(drain(&mut core).is_empty());
    core.handle_timeout(NOW.saturating_add(HANDSHAKE_TIMEOUT));
    assert!(matches!(
        drain(&mut core).last(),
        Some(Output::Ended(End::Retry(Retry::Handshake(_))))
    ));
    core.connect(NOW);
    drain(&mut core);
    core.receive(NOW, Received::Text("hello"));
    assert!(matches!(
        drain(&mut core).last(),
        Some(Output::Ended(End::Retry(Retry::Handshake(_))))
    ));
}

#[test]
fn v1_pairs_with_the_vessels_code_and_keeps_the_token() {
    let config = Config {
        channel: Channel::V1,
        ..Config::default()
    };
    let mut core = DeviceCore::new(&lamp(), config, counter(), None, None).unwrap();
    core.connect(NOW);
    let out = drain(&mut core);
    let [Output::Connected, Output::Send(Message::Text(hello))] = out.as_slice() else {
        panic!("{out:?}");
    };
    assert!(DeviceFrame::parse(hello.as_bytes()).is_ok());
    core.receive(
        NOW,
        Received::Text(r#"{"type":"device:pairing","code":"012345"}"#),
    );
    assert_eq!(
        drain(&mut core),
        vec![Output::ShowCode("012345".to_string())]
    );
    core.receive(
        NOW,
        Received::Text(r#"{"type":"device:paired","deviceToken":"abc"}"#),
    );
    assert_eq!(
        drain(&mut core),
        vec![Output::StoreToken("abc".to_string())]
    );
    assert!(core.is_paired());
}

#[test]
fn stored_credentials_that_do_not_read_are_refused() {
    assert_eq!(
        Credentials::from_bytes(&[1; 3]),
        Err(CredentialsError::Length(3))
    );
    let (_, _, kept) = paired();
    let mut bytes = kept.to_bytes().to_vec();
    bytes[0] = 2;
    assert_eq!(
        Credentials::from_bytes(&bytes),
        Err(CredentialsError::Layout(2))
    );
    bytes[0] = 1;
    bytes[33] = 2;
    assert_eq!(
        Credentials::from_bytes(&bytes),
        Err(CredentialsError::Flags(2))
    );
}

mod hostile;
mod shutdown;

#[test]
fn a_kept_v1_token_the_vessel_could_not_take_asks_to_pair_instead() {
    let config = Config {
        channel: Channel::V1,
        ..Config::default()
    };
    let mut core = DeviceCore::new(&lamp(), config, counter(), None, Some(String::new())).unwrap();
    assert!(!core.is_paired());
    core.connect(NOW);
    let out = drain(&mut core);
    let [Output::Connected, Output::Send(Message::Text(hello))] = out.as_slice() else {
        panic!("{out:?}");
    };
    assert!(hello.contains("device:hello"), "{hello}");
}

#[test]
fn a_calls_input_stays_in_the_buffer_its_frame_came_in() {
    let (mut core, mut vessel, _) = paired();
    let note = "n".repeat(4096);
    let frame = format!(
        r#"{{"type":"device:invoke","callId":"c1","capability":"set_light","input":{{"on":true,"note":"{note}"}}}}"#
    );
    let (out, _) = tell(&mut core, &mut vessel, &frame);
    let Some(Output::Invoke(call)) = out.into_iter().find(|o| matches!(o, Output::Invoke(_)))
    else {
        panic!("no invoke");
    };
    let input = call.input.into_string();
    assert_eq!(input, format!(r#"{{"on":true,"note":"{note}"}}"#));
    // The frame's buffer, cut down: as large as the frame, not a copy of
    // the input (which would hold no more than the input).
    assert!(input.capacity() >= frame.len(), "{}", input.capacity());
}

#[test]
fn a_declared_bound_is_kept_from_the_handler_whatever_the_vessel_sent() {
    let thermostat = validate_manifest(&serde_json::json!({
        "dk": 1, "id": "thermostat", "name": "T", "kind": "thermostat", "version": "1",
        "capabilities": [
            {"name": "set_target", "kind": "actuator", "description": "Sets it",
             "params": {"celsius": {"type": "number", "required": true, "minimum": 10, "maximum": 30, "unit": "°C"}}},
            {"name": "read", "kind": "sensor", "description": "Reads"}
        ]
    }))
    .unwrap();
    let mut calls = Calls::new(&thermostat, 4, 16, [7; 16]);
    let invoke = |id: &str, input: &str| {
        format!(
            "{{\"type\":\"device:invoke\",\"callId\":\"{id}\",\"capability\":\"set_target\",\"input\":{input}}}"
        )
    };
    // Read once, as a driver reads it, and given to the calls' rules.
    let accept = |calls: &mut Calls, text: &str| {
        let read = dk_proto::VesselFrame::parse_keeping_input(
            text.as_bytes(),
            dk_proto::FrameLimits::default(),
            dk_proto::Channel::V1,
        );
        calls.accept(read.unwrap())
    };
    match accept(&mut calls, &invoke("c1", "{\"celsius\":35}")) {
        Accepted::Reply { frame, refusal } => {
            assert_eq!(
                refusal.to_string(),
                "input of \"set_target\" refused: \"celsius\" must be at most 30 °C"
            );
            assert!(frame.contains("\"ok\":false"), "{frame}");
        }
        other => panic!("ran: {other:?}"),
    }
    assert_eq!(calls.running(), 0);
    assert!(matches!(
        accept(&mut calls, &invoke("c2", "{\"celsius\":21.5}")),
        Accepted::Run(_)
    ));
    // The same manifest without the opt-in: the bound means nothing, as
    // on 8DK, and the device holds nothing more for it.
    let mut v1 = serde_json::to_value(&thermostat).unwrap();
    v1["capabilities"][0]["params"]["celsius"]["maximum"] = serde_json::json!(30);
    let mut calls = Calls::new(&validate_manifest(&v1).unwrap(), 4, 16, [7; 16]);
    assert!(matches!(
        accept(&mut calls, &invoke("c3", "{\"celsius\":35}")),
        Accepted::Run(_)
    ));
}
