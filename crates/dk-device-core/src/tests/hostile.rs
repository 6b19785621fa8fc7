//! Hostile vessels against the core, each answered as dk-device's tokio
//! client answers it (its hostile-vessel tests in `client/tests.rs` and
//! `tests/it/dk2_client.rs`): the same close code and reason, and the same
//! choice between connecting again and stopping.

use dk_channel::{LowOrderSlot, MAX_MESSAGE, MAX_PIECE, Responder};
use dk_proto::{CloseCode, VesselFrame};

use super::*;

/// The channel failed: the device closed 4012 "secure channel failed",
/// sending nothing after, and once the vessel's close comes it connects
/// again (as the client's `SessionEnd::Lost`).
#[track_caller]
fn check_channel_failed(core: &mut DeviceCore, out: &[Output]) {
    assert_eq!(
        close_sent(out),
        Some((4012, "secure channel failed".to_string())),
        "{out:?}"
    );
    assert!(
        matches!(out.last(), Some(Output::Send(Message::Close(_)))),
        "{out:?}"
    );
    assert_eq!(core.state(), State::Closing);
    core.receive(NOW, Received::Close(Some((4012, ""))));
    assert_eq!(
        drain(core),
        vec![Output::Ended(End::Retry(Retry::Lost))],
        "a channel failure is not a refusal"
    );
}

/// The pairing broke: the device closed 4001 with the client's reason,
/// and once the vessel's close comes it stops, its credentials untouched.
#[track_caller]
fn check_pairing_broken(core: &mut DeviceCore, out: &[Output], why: &str) {
    assert_eq!(
        close_sent(out),
        Some((4001, format!("pairing did not happen: {why}"))),
        "{out:?}"
    );
    assert!(stored(out).is_empty(), "{out:?}");
    core.receive(NOW, Received::Close(Some((4001, "whatever"))));
    let out = drain(core);
    assert_eq!(
        out,
        vec![Output::Ended(End::Stop(Stop::PairingBroken(
            why.to_string()
        )))]
    );
}

#[test]
fn a_vessel_that_stops_mid_handshake_times_out_and_is_tried_again() {
    let mut core = device(None);
    core.connect(NOW);
    drain(&mut core);
    let deadline = core.poll_timeout().unwrap();
    // Time going backwards, or not far enough, changes nothing.
    core.handle_timeout(Instant::from_millis(0));
    core.handle_timeout(Instant::from_millis(deadline.as_millis() - 1));
    assert!(drain(&mut core).is_empty());
    core.handle_timeout(Instant::from_millis(u64::MAX));
    let out = drain(&mut core);
    // As the client: a connection error naming the timeout, retried; the
    // socket is dropped, no close is sent.
    assert_eq!(
        out,
        vec![Output::Ended(End::Retry(Retry::Handshake(
            "no dk/2 handshake within 10 s".to_string()
        )))]
    );
    // The next connection goes through.
    let mut vessel = Vessel::new(42);
    let (out, frames) = shake(&mut core, &mut vessel);
    assert!(out.contains(&Output::Connected));
    assert!(frames[0].contains("device:hello"));
}

#[test]
fn message_2_twice_fails_the_channel() {
    let mut core = device(None);
    let mut vessel = Vessel::new(42);
    core.connect(NOW);
    let first = sent(&drain(&mut core));
    let second = vessel.second(binary(&first[0]));
    core.receive(NOW, Received::Binary(&second));
    let messages = sent(&drain(&mut core));
    vessel.third(binary(&messages[0]));
    core.receive(NOW, Received::Binary(&second));
    let out = drain(&mut core);
    check_channel_failed(&mut core, &out);
}

#[test]
fn a_vessel_presenting_a_low_order_key_is_closed_4012_before_the_device_says_anything() {
    for zero in [LowOrderSlot::Static, LowOrderSlot::Ephemeral] {
        let mut core = device(None);
        let key = StaticKey::from_secret([42; 32]).unwrap();
        let mut responder = Responder::presenting_low_order_for_tests(&key, zero).unwrap();
        core.connect(NOW);
        let first = sent(&drain(&mut core));
        responder.read_first(binary(&first[0])).unwrap();
        let second = responder.second_message().unwrap();
        core.receive(NOW, Received::Binary(&second));
        let out = drain(&mut core);
        // Nothing but the close: no message 3, no hello.
        let reason = CloseCode::SecureChannel.reason().unwrap().to_string();
        assert_eq!(
            sent(&out),
            vec![Message::Close(Some(CloseFrame { code: 4012, reason }))],
            "{zero}"
        );
        // Not a refusal from the vessel: tried again, saying why.
        let Some(End::Retry(Retry::Handshake(why))) = ended(&out) else {
            panic!("{zero}: {out:?}");
        };
        assert!(
            why.contains(&format!("{zero} key is a low-order point")),
            "{why}"
        );
    }
}

#[test]
fn records_out_of_order_or_replayed_fail_the_channel_and_the_device_comes_back() {
    // Out of order: the second frame's record before the first's.
    let (mut core, mut vessel, kept) = paired();
    let first = vessel.seal(&invoke("c1", "set_light"));
    let second = vessel.seal(&invoke("c2", "set_light"));
    core.receive(NOW, Received::Binary(&second[0]));
    let out = drain(&mut core);
    assert!(runs(&out).is_empty());
    check_channel_failed(&mut core, &out);
    drop(first);

    // Replayed: a record the device already opened.
    vessel.restart();
    let (_, frames) = shake(&mut core, &mut vessel);
    assert!(frames[0].contains("device:auth"), "back by key: {frames:?}");
    let records = vessel.seal(&invoke("c3", "set_light"));
    core.receive(NOW, Received::Binary(&records[0]));
    assert_eq!(runs(&drain(&mut core)), ["c3"]);
    core.receive(NOW, Received::Binary(&records[0]));
    let out = drain(&mut core);
    assert!(runs(&out).is_empty(), "never run twice");
    check_channel_failed(&mut core, &out);
    // Nothing about the pairing changed.
    assert_eq!(core.credentials(), Some(&kept));
}

#[test]
fn a_text_message_after_the_handshake_fails_the_channel() {
    // While pairing.
    let mut core = device(None);
    let mut vessel = Vessel::new(42);
    shake(&mut core, &mut vessel);
    core.receive(NOW, Received::Text(r#"{"type":"device:pair-commit"}"#));
    let out = drain(&mut core);
    check_channel_failed(&mut core, &out);
    // While serving.
    let (mut core, _vessel, _) = paired();
    core.receive(NOW, Received::Text(&invoke("c1", "set_light")));
    let out = drain(&mut core);
    assert!(runs(&out).is_empty());
    check_channel_failed(&mut core, &out);
}

#[test]
fn a_binary_message_over_a_noise_message_fails_the_channel() {
    let (mut core, _vessel, _) = paired();
    core.receive(NOW, Received::Binary(&vec![0x5a; MAX_MESSAGE + 1]));
    let out = drain(&mut core);
    check_channel_failed(&mut core, &out);
}

#[test]
fn a_frame_over_the_limit_fails_the_channel_at_the_piece_that_crosses_it() {
    // Within one record.
    let config = Config {
        max_frame_bytes: 4096,
        ..Config::default()
    };
    let (mut core, mut vessel, _) = paired_with(config);
    let big = format!("{}{}", invoke("c1", "set_light"), " ".repeat(4096));
    let records = vessel.seal(&big);
    assert_eq!(records.len(), 1);
    core.receive(NOW, Received::Binary(&records[0]));
    let out = drain(&mut core);
    check_channel_failed(&mut core, &out);

    // In pieces: refused at the second piece, before more than the limit is
    // held, whatever follows.
    let limit = MAX_PIECE + 1000;
    let config = Config {
        max_frame_bytes: limit,
        ..Config::default()
    };
    let (mut core, mut vessel, _) = paired_with(config.clone());
    let frame = invoke("c1", "set_light");
    let exact = format!("{frame}{}", " ".repeat(limit - frame.len()));
    let records = vessel.seal(&exact);
    assert_eq!(records.len(), 2);
    for record in &records {
        core.receive(NOW, Received::Binary(record));
    }
    assert_eq!(runs(&drain(&mut core)), ["c1"], "a frame at the limit runs");
    let over = format!("{frame}{}", " ".repeat(3 * MAX_PIECE));
    let records = vessel.seal(&over);
    assert_eq!(records.len(), 4);
    core.receive(NOW, Received::Binary(&records[0]));
    assert!(drain(&mut core).is_empty());
    core.receive(NOW, Received::Binary(&records[1]));
    let out = drain(&mut core);
    check_channel_failed(&mut core, &out);
    for record in &records[2..] {
        core.receive(NOW, Received::Binary(record));
    }
    assert!(drain(&mut core).is_empty(), "nothing after the end");
}

/// The vessel's commitment to its nonce in this connection.
fn commit(vessel: &Vessel) -> String {
    let commitment = dk_channel::commitment(&vessel.nv, &vessel.hash());
    format!(
        r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
        dk_channel::to_hex32(&commitment)
    )
}

fn reveal(nonce: &[u8; 32]) -> String {
    format!(
        r#"{{"type":"device:pair-reveal","nonce":"{}"}}"#,
        dk_channel::to_hex32(nonce)
    )
}

/// Frames sent in the pairing exchange, and the reason the device closes
/// 4001 with after them (the client's words, `connection.rs`'s
/// `pair_secure`).
#[track_caller]
fn check_pairing(frames: &[&dyn Fn(&Vessel) -> String], why: &str) {
    let mut core = device(None);
    let mut vessel = Vessel::new(42);
    shake(&mut core, &mut vessel);
    let mut out = Vec::new();
    for frame in frames {
        let frame = frame(&vessel);
        let (step, _) = tell(&mut core, &mut vessel, &frame);
        out.extend(step);
    }
    check_pairing_broken(&mut core, &out, why);
}

#[test]
fn a_pairing_exchange_out_of_order_or_wrong_closes_4001_with_the_clients_reasons() {
    let hex = |_: &Vessel| reveal(&[0xab; 32]);
    let real_commit = |v: &Vessel| commit(v);
    let real_reveal = |v: &Vessel| reveal(&v.nv);
    let paired = |_: &Vessel| r#"{"type":"device:paired"}"#.to_string();
    let bad_commit = |_: &Vessel| r#"{"type":"device:pair-commit","commitment":"XYZ"}"#.to_string();
    let v1_code = |_: &Vessel| r#"{"type":"device:pairing","code":"123456"}"#.to_string();
    let other_commit = |_: &Vessel| {
        format!(
            r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
            "ab".repeat(32)
        )
    };
    check_pairing(
        &[&bad_commit],
        "a malformed or unexpected device:pair-commit frame",
    );
    check_pairing(
        &[&v1_code],
        "a malformed or unexpected device:pairing frame",
    );
    check_pairing(&[&hex], "a reveal before the commitment");
    check_pairing(&[&real_commit, &other_commit], "a second commitment");
    check_pairing(
        &[&other_commit, &hex],
        "the vessel's reveal does not match its commitment (a relay may be in the middle)",
    );
    check_pairing(
        &[&real_commit, &hex],
        "the vessel's reveal does not match its commitment (a relay may be in the middle)",
    );
    check_pairing(&[&paired], "paired before the codes were computed");
    check_pairing(
        &[&real_commit, &paired],
        "paired before the codes were computed",
    );
    check_pairing(
        &[&real_commit, &real_reveal, &real_reveal],
        "a second reveal",
    );
}

#[test]
fn a_pairing_frame_after_pairing_closes_4001_and_the_pin_stays() {
    for frame in [
        format!(
            r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
            "ab".repeat(32)
        ),
        reveal(&[1; 32]),
        r#"{"type":"device:pair-commit","commitment":"XYZ"}"#.to_string(),
    ] {
        let (mut core, mut vessel, kept) = paired();
        let (out, _) = tell(&mut core, &mut vessel, &frame);
        let kind = VesselFrame::pairing_type(&frame).unwrap();
        check_pairing_broken(
            &mut core,
            &out,
            &format!("an unexpected {kind} frame after pairing"),
        );
        assert_eq!(core.credentials(), Some(&kept));
        assert!(kept.is_paired());
    }
    // `device:paired` again is set aside, as the client's serve loop does.
    let (mut core, mut vessel, _) = paired();
    let (out, _) = tell(&mut core, &mut vessel, r#"{"type":"device:paired"}"#);
    assert!(close_sent(&out).is_none(), "{out:?}");
    assert_eq!(core.state(), State::Serving);
}

#[test]
fn a_close_not_announced_inside_the_channel_is_tried_again_whatever_its_code() {
    for close in [
        Some((4001, "the person did not approve pairing")),
        Some((4002, "authentication failed")),
        Some((4003, "manifest changed since pairing: pair again")),
        Some((4007, "unpaired by the person")),
        Some((4011, "ERR_PRISM_DEVICE_DISABLED: no")),
        Some((1000, "")),
        None,
    ] {
        let (mut core, _vessel, kept) = paired();
        core.receive(NOW, Received::Close(close));
        let out = drain(&mut core);
        let (code, reason) = close.unwrap_or((1005, ""));
        assert_eq!(
            out,
            vec![
                Output::Notice(Notice::UnannouncedClose(code)),
                Output::Ended(End::Retry(Retry::Closed {
                    code,
                    reason: reason.to_string()
                }))
            ]
        );
        assert_eq!(core.credentials(), Some(&kept), "nothing forgotten");
        // While pairing too.
        let mut core = device(None);
        let mut vessel = Vessel::new(42);
        shake(&mut core, &mut vessel);
        core.receive(NOW, Received::Close(close));
        assert!(matches!(
            ended(&drain(&mut core)),
            Some(End::Retry(Retry::Closed { .. }))
        ));
    }
}

#[test]
fn an_announced_refusal_stops_and_forgets_what_the_rules_say() {
    let admission = "ERR_PRISM_DEVICE_DISABLED: voice device is disabled by default";
    let sessions = "ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1";
    // (code, reason, how it ends, whether the key is marked unpaired)
    let cases: [(u16, &str, End, bool); 7] = [
        (
            4001,
            "the person did not approve pairing",
            End::Stop(Stop::PairingRefused(
                "the person did not approve pairing".to_string(),
            )),
            false,
        ),
        (
            4002,
            "authentication failed",
            End::Stop(Stop::AuthFailed),
            true,
        ),
        (
            4003,
            "manifest changed since pairing: pair again",
            End::Stop(Stop::ManifestChanged),
            true,
        ),
        (
            4007,
            "unpaired by the person",
            End::Stop(Stop::Unpaired),
            true,
        ),
        (
            4011,
            admission,
            End::Stop(Stop::AdmissionRefused(admission.to_string())),
            false,
        ),
        (
            4011,
            sessions,
            End::Retry(Retry::Closed {
                code: 4011,
                reason: sessions.to_string(),
            }),
            false,
        ),
        (
            4008,
            "replaced by a newer connection",
            End::Retry(Retry::Closed {
                code: 4008,
                reason: "replaced by a newer connection".to_string(),
            }),
            false,
        ),
    ];
    for (code, reason, end, unpaired) in cases {
        let (mut core, mut vessel, kept) = paired();
        let closing = format!(r#"{{"type":"device:closing","code":{code},"reason":"{reason}"}}"#);
        tell(&mut core, &mut vessel, &closing);
        // The close's own words count for nothing: the announced ones do.
        core.receive(NOW, Received::Close(Some((1000, "forged"))));
        let out = drain(&mut core);
        assert_eq!(ended(&out), Some(&end), "{code}: {out:?}");
        let stored = stored(&out);
        if unpaired {
            assert_eq!(stored.len(), 1, "{code}");
            assert!(!stored[0].is_paired(), "{code}");
            assert_eq!(stored[0].pinned(), kept.pinned(), "{code}: the pin stays");
            assert!(!core.is_paired());
        } else {
            assert!(stored.is_empty(), "{code}: {out:?}");
            assert!(core.is_paired());
        }
    }
}

#[test]
fn a_flood_of_calls_beyond_the_limit_is_answered_busy() {
    let config = Config {
        max_in_flight: 2,
        ..Config::default()
    };
    let (mut core, mut vessel, _) = paired_with(config);
    let mut frames = Vec::new();
    let mut started = Vec::new();
    for id in ["c1", "c2", "c3", "c4"] {
        let (out, sent) = tell(&mut core, &mut vessel, &invoke(id, "set_light"));
        started.extend(runs(&out).into_iter().map(str::to_string));
        frames.extend(sent);
    }
    assert_eq!(started, ["c1", "c2"]);
    assert_eq!(core.running_calls(), 2);
    for id in ["c3", "c4"] {
        assert_eq!(
            result_of(&frames, id),
            (false, Some("device is busy: 2 calls in flight".to_string()))
        );
    }
    // A busy call was received: its id does not run later either.
    assert!(core.answer("c1", Ok("{}")));
    let answered = opened(&mut vessel, &drain(&mut core));
    assert_eq!(result_of(&answered, "c1"), (true, None));
    let (out, frames) = tell(&mut core, &mut vessel, &invoke("c3", "set_light"));
    assert!(runs(&out).is_empty());
    assert_eq!(
        result_of(&frames, "c3"),
        (
            false,
            Some("call \"c3\" was already received: not run again".to_string())
        )
    );
    let (out, _) = tell(&mut core, &mut vessel, &invoke("c5", "set_light"));
    assert_eq!(runs(&out), ["c5"]);
}

#[test]
fn a_replayed_call_id_never_runs_twice_even_across_a_reconnect() {
    let (mut core, mut vessel, _) = paired();
    let (out, _) = tell(&mut core, &mut vessel, &invoke("c1", "set_light"));
    assert_eq!(runs(&out), ["c1"]);
    // Again while it runs: set aside, unanswered, not run.
    let (out, frames) = tell(&mut core, &mut vessel, &invoke("c1", "set_light"));
    assert!(runs(&out).is_empty());
    assert!(frames.is_empty(), "{frames:?}");
    assert!(
        out.contains(&Output::Notice(Notice::SetAside(SetAside::DuplicateCall(
            "c1".to_string()
        ))))
    );
    // Connect again (by key): the running call was abandoned, its id kept.
    core.receive(NOW, Received::Lost);
    drain(&mut core);
    assert!(!core.answer("c1", Ok("{}")), "the vessel failed it already");
    vessel.restart();
    let (_, frames) = shake(&mut core, &mut vessel);
    assert!(frames[0].contains("device:auth"));
    let (out, frames) = tell(&mut core, &mut vessel, &invoke("c1", "read_light"));
    assert!(runs(&out).is_empty());
    assert_eq!(
        result_of(&frames, "c1"),
        (
            false,
            Some("call \"c1\" was already received: not run again".to_string())
        )
    );
}

#[test]
fn a_call_for_an_undeclared_capability_is_refused_in_8dks_words() {
    let (mut core, mut vessel, _) = paired();
    let (out, frames) = tell(&mut core, &mut vessel, &invoke("c1", "self_destruct"));
    assert!(runs(&out).is_empty());
    assert_eq!(
        result_of(&frames, "c1"),
        (
            false,
            Some("unknown capability \"self_destruct\"".to_string())
        )
    );
}

#[test]
fn huge_inputs_run_within_the_limit_and_huge_results_are_answered_with_why() {
    let (mut core, mut vessel, _) = paired();
    let note = "n".repeat(MAX_FRAME_BYTES - 200);
    let frame = format!(
        r#"{{"type":"device:invoke","callId":"c1","capability":"set_light","input":{{"on":true,"note":"{note}"}}}}"#
    );
    let (out, _) = tell(&mut core, &mut vessel, &frame);
    let Some(Output::Invoke(call)) = out.iter().find(|o| matches!(o, Output::Invoke(_))) else {
        panic!("{out:?}");
    };
    assert_eq!(
        call.input.to_map()["note"].as_str().map(str::len),
        Some(note.len())
    );
    // A result the vessel would refuse is answered with an error saying so.
    let huge = format!("\"{}\"", "r".repeat(MAX_FRAME_BYTES));
    assert!(core.answer("c1", Ok(&huge)));
    let frames = opened(&mut vessel, &drain(&mut core));
    let (ok, error) = result_of(&frames, "c1");
    assert!(!ok);
    assert!(
        error
            .unwrap()
            .starts_with("the result of \"set_light\" cannot be sent: "),
        "{frames:?}"
    );
    // Over the frame limit: the channel fails.
    let frame = format!("{frame}{}", " ".repeat(300));
    let (out, _) = tell(&mut core, &mut vessel, &frame);
    check_channel_failed(&mut core, &out);
}

#[test]
fn after_the_end_nothing_more_is_sent() {
    let (mut core, mut vessel, _) = paired();
    let (out, _) = tell(&mut core, &mut vessel, &invoke("c1", "set_light"));
    assert_eq!(runs(&out), ["c1"]);
    let records = vessel.seal(r#"{"type":"device:closing","code":4007,"reason":"unpaired"}"#);
    core.receive(NOW, Received::Binary(&records[0]));
    core.receive(NOW, Received::Close(Some((4007, "unpaired"))));
    assert_eq!(ended(&drain(&mut core)), Some(&End::Stop(Stop::Unpaired)));
    let later = vessel.seal(&invoke("c2", "set_light"));
    core.receive(NOW, Received::Binary(&later[0]));
    core.receive(NOW, Received::Text("{}"));
    core.receive(NOW, Received::Close(None));
    core.receive(NOW, Received::Lost);
    assert!(!core.answer("c1", Ok("{}")));
    assert_eq!(
        core.emit("read_light", "{}"),
        Err(EventRefusal::NotConnected)
    );
    let chunk = StreamChunk {
        stream: "read_light",
        seq: 1,
        payload: b"x",
    };
    assert_eq!(core.send_chunk(&chunk), Err(ChunkRefusal::NotConnected));
    core.shutdown(NOW, core::time::Duration::ZERO);
    core.handle_timeout(Instant::from_millis(u64::MAX));
    assert!(drain(&mut core).is_empty());
    assert_eq!(core.state(), State::Ended);
    assert_eq!(core.poll_timeout(), None);
}

fn v1() -> DeviceCore {
    let config = Config {
        channel: Channel::V1,
        ..Config::default()
    };
    DeviceCore::new(&lamp(), config, counter(), None, Some("abc".to_string())).unwrap()
}

#[test]
fn v1_closes_are_read_as_the_client_reads_them() {
    // A refusal's reason is made printable.
    let mut core = v1();
    core.connect(NOW);
    drain(&mut core);
    core.receive(
        NOW,
        Received::Close(Some((4001, "no\u{1b}[2J \u{202e}way"))),
    );
    assert_eq!(
        ended(&drain(&mut core)),
        Some(&End::Stop(Stop::PairingRefused(
            "no\\u{1b}[2J \\u{202e}way".to_string()
        )))
    );
    // A close without a code is 1005, tried again; so is a lost connection.
    core.connect(NOW);
    drain(&mut core);
    core.receive(NOW, Received::Close(None));
    assert_eq!(
        ended(&drain(&mut core)),
        Some(&End::Retry(Retry::Closed {
            code: 1005,
            reason: String::new()
        }))
    );
    core.connect(NOW);
    drain(&mut core);
    core.receive(NOW, Received::Lost);
    assert_eq!(ended(&drain(&mut core)), Some(&End::Retry(Retry::Lost)));
    // The session cap is tried again; another admission refusal stops.
    core.connect(NOW);
    drain(&mut core);
    let sessions = "ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1";
    core.receive(NOW, Received::Close(Some((4011, sessions))));
    assert_eq!(
        ended(&drain(&mut core)),
        Some(&End::Retry(Retry::Closed {
            code: 4011,
            reason: sessions.to_string()
        }))
    );
    // A refused token is forgotten.
    core.connect(NOW);
    drain(&mut core);
    core.receive(NOW, Received::Close(Some((4002, "authentication failed"))));
    assert_eq!(
        drain(&mut core),
        vec![
            Output::ForgetToken("abc".to_string()),
            Output::Ended(End::Stop(Stop::AuthFailed))
        ]
    );
    assert!(!core.is_paired());
}

#[test]
fn v1_a_token_that_cannot_be_kept_or_a_code_not_six_digits() {
    let config = Config {
        channel: Channel::V1,
        ..Config::default()
    };
    let mut core = DeviceCore::new(&lamp(), config, counter(), None, None).unwrap();
    core.connect(NOW);
    drain(&mut core);
    core.receive(
        NOW,
        Received::Text(r#"{"type":"device:pairing","code":"12345"}"#),
    );
    assert_eq!(
        drain(&mut core),
        vec![Output::Notice(Notice::InvalidCode("12345".to_string()))]
    );
    core.receive(
        NOW,
        Received::Text(r#"{"type":"device:paired","deviceToken":"a b"}"#),
    );
    let out = drain(&mut core);
    assert_eq!(
        close_sent(&out),
        Some((1011, "cannot keep the device token".to_string()))
    );
    core.handle_timeout(NOW.saturating_add(CLOSE_TIMEOUT));
    assert_eq!(ended(&drain(&mut core)), Some(&End::Stop(Stop::BadToken)));
}

#[test]
fn the_oldest_remembered_call_id_is_forgotten_first() {
    let config = Config {
        remember_calls: 3,
        ..Config::default()
    };
    let (mut core, mut vessel, _) = paired_with(config);
    for id in ["c1", "c2", "c3", "c4"] {
        let (out, _) = tell(&mut core, &mut vessel, &invoke(id, "set_light"));
        assert_eq!(runs(&out), [id]);
        assert!(core.answer(id, Ok("{}")));
        opened(&mut vessel, &drain(&mut core));
    }
    // c1 fell out of the three remembered: it runs; c3 and c4 do not.
    let (out, _) = tell(&mut core, &mut vessel, &invoke("c1", "set_light"));
    assert_eq!(runs(&out), ["c1"]);
    assert!(core.answer("c1", Ok("{}")));
    opened(&mut vessel, &drain(&mut core));
    for id in ["c3", "c4", "c1"] {
        let (out, frames) = tell(&mut core, &mut vessel, &invoke(id, "read_light"));
        assert!(runs(&out).is_empty(), "{id} ran again");
        assert_eq!(
            result_of(&frames, id),
            (
                false,
                Some(format!("call \"{id}\" was already received: not run again"))
            )
        );
    }
}
