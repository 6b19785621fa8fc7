//! Tests of frame parsing and serialising, on the fixtures and on random frames.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::json;

use super::raw::{FrameSeed, RawFrame, read_plain, string_stop};
use super::*;

fn fixtures(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/frames")
        .join(dir);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
}

#[test]
fn good_frames_parse_and_round_trip() {
    let paths = fixtures("good");
    assert!(paths.len() >= 10);
    for path in paths {
        let bytes = std::fs::read(&path).unwrap();
        let frame =
            DeviceFrame::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let text = frame.to_json();
        let again = DeviceFrame::parse(text.as_bytes()).unwrap();
        assert_eq!(again.to_json(), text, "{}", path.display());
    }
}

#[test]
fn bad_frames_are_refused_with_their_reason() {
    let paths = fixtures("bad");
    assert!(paths.len() >= 20);
    for path in paths {
        let bytes = std::fs::read(&path).unwrap();
        let err = DeviceFrame::parse(&bytes).map(|f| f.to_json()).unwrap_err();
        match std::fs::read_to_string(path.with_extension("error")) {
            Ok(expected) => assert_eq!(err.to_string(), expected.trim_end(), "{}", path.display()),
            Err(_) => assert!(
                matches!(err, FrameError::NotJson(_)),
                "{}: {err}",
                path.display()
            ),
        }
    }
}

#[test]
fn fields_are_read_as_8dk_reads_them() {
    let text =
        r#"{"type":"device:result","callId":"c\u00e9","ok":false,"error":{"x":1},"result":null}"#;
    let DeviceFrame::Result {
        call_id,
        ok,
        result,
        error,
    } = DeviceFrame::parse(text.as_bytes()).unwrap()
    else {
        panic!("not a result")
    };
    assert_eq!((call_id.as_ref(), ok), ("cé", false));
    assert_eq!(result.unwrap().get(), "null");
    assert!(error.is_none(), "a non-string error is dropped");

    let text = r#"{"type":"device:event","type":"device:result","callId":"c1","ok":true}"#;
    assert_eq!(
        DeviceFrame::parse(text.as_bytes()).unwrap().type_name(),
        "device:result"
    );

    let text = r#"{"type":"device:hello","manifest":[]}"#;
    assert_eq!(
        DeviceFrame::parse(text.as_bytes()).unwrap().type_name(),
        "device:hello"
    );
}

#[test]
fn size_is_checked_before_anything_else() {
    let mut big = br#"{"type":"device:result","callId":"c","ok":true,"result":""#.to_vec();
    big.resize(MAX_FRAME_BYTES + 1, b'a');
    assert_eq!(
        DeviceFrame::parse(&big).map(|f| f.to_json()).unwrap_err(),
        FrameError::TooLarge {
            len: MAX_FRAME_BYTES + 1,
            max: MAX_FRAME_BYTES
        }
    );
    // Exactly at the limit is parsed.
    let mut at = br#"{"type":"device:result","callId":"c","ok":true,"result":""#.to_vec();
    at.resize(MAX_FRAME_BYTES - 2, b'a');
    at.extend_from_slice(br#""}"#);
    assert!(DeviceFrame::parse(&at).is_ok());
    let small = FrameLimits {
        max_bytes: 10,
        max_depth: 2,
    };
    assert!(matches!(
        DeviceFrame::parse_with(b"{\"a\":[[1]]}", small),
        Err(FrameError::TooLarge { .. })
    ));
    let shallow = FrameLimits {
        max_bytes: 100,
        max_depth: 2,
    };
    assert_eq!(
        DeviceFrame::parse_with(br#"{"a":[[1]]}"#, shallow)
            .map(|f| f.to_json())
            .unwrap_err(),
        FrameError::TooDeep { max: 2 }
    );
}

#[test]
fn brackets_are_counted_across_long_frames() {
    // Many brackets, side by side and in strings, over several hundred
    // bytes: the count that spares the exact pass must not miss any.
    for levels in [MAX_FRAME_DEPTH, MAX_FRAME_DEPTH + 1] {
        for padding in [0, 200, 254, 255, 256, 1000] {
            let nested = format!(
                r#"{{"type":"device:result","callId":"c","ok":true,"pad":"{}","result":{}{}}}"#,
                "{[".repeat(padding),
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            );
            assert_eq!(
                nests_deeper_than(nested.as_bytes(), MAX_FRAME_DEPTH),
                levels > MAX_FRAME_DEPTH,
                "{levels} levels after {padding} brackets in a string"
            );
            let side_by_side = format!(
                "[{}]",
                "[],".repeat(padding) + &"[".repeat(levels - 1) + &"]".repeat(levels - 1)
            );
            assert_eq!(
                nests_deeper_than(side_by_side.as_bytes(), MAX_FRAME_DEPTH),
                levels > MAX_FRAME_DEPTH,
                "{levels} levels after {padding} empty arrays"
            );
        }
    }
}

#[test]
fn a_depth_limit_past_the_parser_acts_as_the_parser() {
    let deep = format!(
        r#"{{"type":"device:result","callId":"c","ok":true,"result":{}{}}}"#,
        "[".repeat(150),
        "]".repeat(150)
    );
    let loose = FrameLimits {
        max_bytes: MAX_FRAME_BYTES,
        max_depth: 1000,
    };
    assert_eq!(
        DeviceFrame::parse_with(deep.as_bytes(), loose)
            .map(|f| f.to_json())
            .unwrap_err(),
        FrameError::TooDeep { max: 127 }
    );
    // Deep nesting in a field the parser walks itself is refused too.
    let walked = format!(
        r#"{{"type":"device:result","callId":{}1{},"ok":true}}"#,
        "[".repeat(150),
        "]".repeat(150)
    );
    assert!(matches!(
        DeviceFrame::parse_with(walked.as_bytes(), loose),
        Err(FrameError::TooDeep { .. })
    ));
}

#[test]
fn vessel_frames_serialise_as_v1_and_parse_back() {
    let input = json!({"on": true, "brightness": 40});
    let frames = [
        (VesselFrame::Pairing { code: "004217".into() }, r#"{"type":"device:pairing","code":"004217"}"#.to_owned()),
        (
            VesselFrame::Paired { device_token: "ab".repeat(32).into() },
            format!(r#"{{"type":"device:paired","deviceToken":"{}"}}"#, "ab".repeat(32)),
        ),
        (
            VesselFrame::Invoke {
                call_id: "c1".into(),
                capability: "set_light".into(),
                input: std::borrow::Cow::Owned(input.as_object().unwrap().clone()),
            },
            r#"{"type":"device:invoke","callId":"c1","capability":"set_light","input":{"on":true,"brightness":40}}"#.to_owned(),
        ),
        (VesselFrame::Revoked { capability: Some("strobe".into()) }, r#"{"type":"device:revoked","capability":"strobe"}"#.to_owned()),
        (VesselFrame::Revoked { capability: None }, r#"{"type":"device:revoked"}"#.to_owned()),
    ];
    for (frame, text) in frames {
        assert_eq!(frame.to_json(), text);
        assert_eq!(VesselFrame::parse(text.as_bytes()).unwrap(), frame);
    }
    for bad in [
        r#"{"type":"device:result","callId":"c","ok":true}"#,
        r#"{"type":"device:invoke","callId":"c","capability":"x","input":[]}"#,
        r#"{"type":"device:invoke","callId":"c","capability":"x"}"#,
        r#"{"type":"device:invoke","callId":"","capability":"x","input":{}}"#,
        r#"{"type":"device:pairing"}"#,
        r#"{"type":"device:revoked","capability":42}"#,
        r#"{"type":"device:revoked","capability":""}"#,
    ] {
        assert!(VesselFrame::parse(bad.as_bytes()).is_err(), "{bad}");
    }
}

fn arb_raw() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        ".{0,20}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        (".{0,8}", any::<bool>())
            .prop_map(|(k, b)| json!({ k: [b, null, {"n": 1.5}] }).to_string()),
    ]
}

fn arb_frame() -> impl Strategy<Value = String> {
    let s = ".{1,24}";
    prop_oneof![
        arb_raw()
            .prop_filter("object", |r| r.starts_with('{'))
            .prop_map(|m| format!(r#"{{"type":"device:hello","manifest":{m}}}"#)),
        (s, s, prop::option::of(arb_raw())).prop_map(|(d, t, m)| {
            let mut v = json!({"type":"device:auth","deviceId":d,"token":t});
            if let Some(m) = m {
                v["manifest"] = serde_json::from_str(&m).unwrap();
            }
            v.to_string()
        }),
        (
            s,
            any::<bool>(),
            prop::option::of(arb_raw()),
            prop::option::of(".{0,20}")
        )
            .prop_map(|(c, ok, r, e)| {
                let mut v = json!({"type":"device:result","callId":c,"ok":ok});
                if let Some(r) = r {
                    v["result"] = serde_json::from_str(&r).unwrap();
                }
                if let Some(e) = e {
                    v["error"] = json!(e);
                }
                v.to_string()
            }),
        (s, prop::option::of(arb_raw())).prop_map(|(c, d)| {
            let mut v = json!({"type":"device:event","capability":c});
            if let Some(d) = d {
                v["data"] = serde_json::from_str(&d).unwrap();
            }
            v.to_string()
        }),
    ]
}

/// Vessel frames, invokes among them with inputs of every kind (objects,
/// and values that are not one), and bytes near them.
fn arb_vessel_frame() -> impl Strategy<Value = String> {
    let s = ".{0,12}";
    prop_oneof![
        (s, s, arb_raw(), ".{0,3}").prop_map(|(c, cap, input, space)| {
            format!(
                r#"{{"type":"device:invoke","callId":{},"capability":{},"input":{space}{input}}}"#,
                json!(c),
                json!(cap)
            )
        }),
        (s, s).prop_map(
            |(c, cap)| json!({"type":"device:invoke","callId":c,"capability":cap}).to_string()
        ),
        s.prop_map(|e| json!({"type":"device:error","error":e}).to_string()),
        prop::option::of(s).prop_map(|c| match c {
            Some(c) => json!({"type":"device:revoked","capability":c}).to_string(),
            None => json!({"type":"device:revoked"}).to_string(),
        }),
        (any::<u16>(), s).prop_map(|(code, reason)| {
            json!({"type":"device:closing","code":code,"reason":reason}).to_string()
        }),
        Just(r#"{"type":"device:paired"}"#.to_owned()),
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

proptest! {
    #[test]
    fn a_frame_read_keeping_its_input_is_the_frame_parse_on_reads(text in arb_vessel_frame()) {
        for channel in [Channel::V1, Channel::Dk2] {
            let limits = FrameLimits::default();
            let parsed = VesselFrame::parse_on(text.as_bytes(), limits, channel);
            let kept = VesselFrame::parse_keeping_input(text.as_bytes(), limits, channel);
            match (parsed, kept) {
                (Ok(frame), Ok(VesselRead::Frame(kept))) => prop_assert_eq!(frame, kept),
                (
                    Ok(VesselFrame::Invoke { call_id, capability, input }),
                    Ok(VesselRead::Invoke(kept)),
                ) => {
                    prop_assert_eq!(call_id, kept.call_id);
                    prop_assert_eq!(capability, kept.capability);
                    // The text kept is the input's, as it stands in the frame.
                    prop_assert!(text.contains(kept.input.get()));
                    let read: Map<String, Value> = serde_json::from_str(kept.input.get()).unwrap();
                    prop_assert_eq!(input.into_owned(), read);
                }
                (Err(parsed), Err(kept)) => prop_assert_eq!(parsed, kept),
                (parsed, kept) => prop_assert!(false, "{:?} but {:?}", parsed, kept.map(|_| ())),
            }
        }
    }

    #[test]
    fn frames_round_trip_through_json(text in arb_frame()) {
        let frame = DeviceFrame::parse(text.as_bytes()).unwrap();
        // The parsed frame writes back the same JSON it was read from.
        prop_assert_eq!(frame.to_json(), text.clone());
        let owned = frame.into_owned();
        prop_assert_eq!(owned.to_json(), text);
    }

    #[test]
    fn parsing_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = DeviceFrame::parse(&bytes);
        let _ = VesselFrame::parse(&bytes);
    }

    #[test]
    fn parsing_near_frames_never_panics(text in arb_frame(), cut in 0usize..200, junk in ".{0,4}") {
        let mut text = text;
        let at = (0..=cut.min(text.len())).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        text.insert_str(at, &junk);
        let _ = DeviceFrame::parse(text.as_bytes());
        let _ = VesselFrame::parse(text.as_bytes());
    }
}

#[test]
fn v1_knows_none_of_the_dk2_frames() {
    for text in [
        r#"{"type":"device:pair-nonce","nonce":"a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0"}"#,
        r#"{"type":"device:pair-commit","commitment":"a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0"}"#,
        r#"{"type":"device:closing","code":4002,"reason":"authentication failed"}"#,
    ] {
        assert!(
            matches!(
                DeviceFrame::parse(text.as_bytes()),
                Err(FrameError::UnknownType(_))
            ),
            "{text}"
        );
        assert!(
            matches!(
                VesselFrame::parse(text.as_bytes()),
                Err(FrameError::UnknownType(_))
            ),
            "{text}"
        );
    }
    // A v1 auth still needs its token.
    let auth = br#"{"type":"device:auth","deviceId":"lamp","manifest":{}}"#;
    assert!(matches!(
        DeviceFrame::parse(auth),
        Err(FrameError::MissingField { field: "token", .. })
    ));
}

#[test]
fn dk2_auth_needs_a_manifest_and_ignores_a_token() {
    let limits = FrameLimits::default();
    let frame = DeviceFrame::parse_on(
        br#"{"type":"device:auth","deviceId":"lamp","token":"t0k3n","manifest":{"id":"lamp"}}"#,
        limits,
        Channel::Dk2,
    )
    .unwrap();
    assert_eq!(
        frame.to_json(),
        r#"{"type":"device:auth","deviceId":"lamp","manifest":{"id":"lamp"}}"#
    );
    assert!(matches!(
        DeviceFrame::parse_on(
            br#"{"type":"device:auth","deviceId":"lamp","token":"t"}"#,
            limits,
            Channel::Dk2
        ),
        Err(FrameError::MissingField {
            field: "manifest",
            ..
        })
    ));
}

#[test]
fn dk2_pairing_frames_carry_exactly_64_lower_case_hex_digits() {
    let limits = FrameLimits::default();
    let good = "c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0";
    let reveal = format!(r#"{{"type":"device:pair-reveal","nonce":"{good}"}}"#);
    let frame = VesselFrame::parse_on(reveal.as_bytes(), limits, Channel::Dk2).unwrap();
    assert_eq!(frame.to_json(), reveal);
    let bad = [
        good.to_uppercase(),
        good[..63].to_owned(),
        format!("{good}0"),
        format!("{}g", &good[..63]),
        String::new(),
    ];
    for nonce in &bad {
        let text = format!(r#"{{"type":"device:pair-nonce","nonce":"{nonce}"}}"#);
        assert!(
            matches!(
                DeviceFrame::parse_on(text.as_bytes(), limits, Channel::Dk2),
                Err(FrameError::WrongType { field: "nonce", .. })
            ),
            "{nonce}"
        );
        let text = format!(r#"{{"type":"device:pair-commit","commitment":"{nonce}"}}"#);
        assert!(
            VesselFrame::parse_on(text.as_bytes(), limits, Channel::Dk2).is_err(),
            "{nonce}"
        );
    }
    let number = br#"{"type":"device:pair-nonce","nonce":12}"#;
    assert!(DeviceFrame::parse_on(number, limits, Channel::Dk2).is_err());
    // The device sends the nonce; the vessel never does.
    let nonce = format!(r#"{{"type":"device:pair-nonce","nonce":"{good}"}}"#);
    assert!(matches!(
        VesselFrame::parse_on(nonce.as_bytes(), limits, Channel::Dk2),
        Err(FrameError::WrongSide(_))
    ));
}

#[test]
fn dk2_has_no_pairing_code_frame_and_a_paired_without_token() {
    let limits = FrameLimits::default();
    assert!(matches!(
        VesselFrame::parse_on(
            br#"{"type":"device:pairing","code":"123456"}"#,
            limits,
            Channel::Dk2
        ),
        Err(FrameError::UnknownType(_))
    ));
    let paired = VesselFrame::parse_on(br#"{"type":"device:paired"}"#, limits, Channel::Dk2);
    assert_eq!(paired, Ok(VesselFrame::KeyPaired));
    assert_eq!(
        VesselFrame::KeyPaired.to_json(),
        r#"{"type":"device:paired"}"#
    );
}

#[test]
fn dk2_closing_carries_a_close_code_and_its_reason() {
    let limits = FrameLimits::default();
    let frame = VesselFrame::Closing {
        code: 4002,
        reason: "authentication failed".into(),
    };
    let text = frame.to_json();
    assert_eq!(
        text,
        r#"{"type":"device:closing","code":4002,"reason":"authentication failed"}"#
    );
    assert_eq!(
        VesselFrame::parse_on(text.as_bytes(), limits, Channel::Dk2),
        Ok(frame)
    );
    for bad in [
        r#"{"type":"device:closing","code":"4002"}"#,
        r#"{"type":"device:closing","code":70000}"#,
        r#"{"type":"device:closing","code":-1}"#,
        r#"{"type":"device:closing","code":4002.5}"#,
        r#"{"type":"device:closing","code":4002,"reason":7}"#,
    ] {
        assert!(
            VesselFrame::parse_on(bad.as_bytes(), limits, Channel::Dk2).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn error_frames_are_read_by_a_device_on_either_channel() {
    let limits = FrameLimits::default();
    let frame = VesselFrame::Error {
        error: "frames are JSON text".into(),
    };
    let text = frame.to_json();
    assert_eq!(
        text,
        r#"{"type":"device:error","error":"frames are JSON text"}"#
    );
    for channel in [Channel::V1, Channel::Dk2] {
        assert_eq!(
            VesselFrame::parse_on(text.as_bytes(), limits, channel),
            Ok(frame.clone())
        );
        assert_eq!(
            VesselFrame::parse_on(br#"{"type":"device:error"}"#, limits, channel),
            Ok(VesselFrame::Error { error: "".into() })
        );
        assert!(matches!(
            VesselFrame::parse_on(br#"{"type":"device:error","error":7}"#, limits, channel),
            Err(FrameError::WrongType { field: "error", .. })
        ));
        // A vessel reads a device:error sent to it as 8DK's does: an unknown type.
        assert_eq!(
            DeviceFrame::parse_on(text.as_bytes(), limits, channel).map(|f| f.to_json()),
            Err(FrameError::UnknownType("device:error".to_owned()))
        );
    }
}

#[test]
fn pairing_types_are_told_whether_or_not_the_frame_parses() {
    for (text, kind) in [
        (
            r#"{"type":"device:pair-commit","commitment":"12"}"#,
            Some("device:pair-commit"),
        ),
        (
            r#"{"type":"device:pair-reveal"}"#,
            Some("device:pair-reveal"),
        ),
        (
            r#"{"type":"device:pair-nonce","nonce":"x"}"#,
            Some("device:pair-nonce"),
        ),
        (
            r#"{"type":"device:pairing","code":"123456"}"#,
            Some("device:pairing"),
        ),
        (
            r#"{"type":"device:pair\u002dcommit"}"#,
            Some("device:pair-commit"),
        ),
        (r#"{"type":"device:paired"}"#, None),
        (r#"{"type":"device:invoke","note":"device:pairing"}"#, None),
        (r#"{"type":7}"#, None),
        ("device:pairing", None),
    ] {
        assert_eq!(VesselFrame::pairing_type(text), kind, "{text}");
    }
}

#[test]
fn channel_names_read_back() {
    for channel in [Channel::V1, Channel::Dk2] {
        assert_eq!(Channel::from_name(channel.as_str()), Some(channel));
        let json = serde_json::to_string(&channel).unwrap();
        assert_eq!(serde_json::from_str::<Channel>(&json).unwrap(), channel);
    }
    assert_eq!(serde_json::to_string(&Channel::Dk2).unwrap(), r#""dk/2""#);
    assert!(serde_json::from_str::<Channel>(r#""dk/3""#).is_err());
}

/// The fields `frame` holds, as text, to compare two readings.
fn fields(frame: &RawFrame<'_>) -> String {
    format!(
        "{:?}",
        (
            (&frame.kind, frame.manifest, &frame.device_id, &frame.token),
            (&frame.call_id, &frame.ok, frame.result, &frame.error),
            (
                &frame.capability,
                frame.data,
                &frame.code,
                &frame.device_token
            ),
            (frame.input, &frame.commitment, &frame.nonce, &frame.reason),
        )
    )
}

/// What the full parser makes of `text`: its fields, or that it refused it.
fn read_in_full(text: &str) -> Option<String> {
    let mut frame = RawFrame::default();
    let mut parser = serde_json::Deserializer::from_str(text);
    de::DeserializeSeed::deserialize(FrameSeed(&mut frame), &mut parser)
        .and_then(|()| parser.end())
        .ok()
        .map(|()| fields(&frame))
}

/// Checks that the plain reading of `text`, when it reads it, finds what
/// the full parser finds.
#[track_caller]
fn check_plain(text: &str) -> bool {
    let mut frame = RawFrame::default();
    if read_plain(text, &mut frame).is_none() {
        return false;
    }
    assert_eq!(Some(fields(&frame)), read_in_full(text), "{text}");
    true
}

#[test]
fn the_plain_reading_takes_what_devices_send() {
    for text in [
        r#"{"type":"device:result","callId":"5b0c7c2e-4f1d-4a63-9d55-8f0d2e1e9c11","ok":true,"result":{"on":true,"brightness":40,"colour":"warm white","note":"set by the agent at the person's request, 21:04"}}"#,
        r#"{"type":"device:result","callId":"c","ok":false,"error":"bulb gone"}"#,
        r#" { "type" : "device:event" , "capability" : "motion" , "data" : [1, 2.5e3, null] } "#,
        r#"{"type":"device:hello","manifest":{"id":"lamp","capabilities":[]},"extra":{"a":[{}]}}"#,
        r#"{"type":"device:auth","deviceId":"lamp","token":"t","type":"device:result"}"#,
        "{}",
    ] {
        assert!(check_plain(text), "{text}");
    }
    // What it leaves to the full parser: escapes, numbers and null where a
    // scalar goes, white space JSON does not have, syntax errors.
    for text in [
        r#"{"type":"device:\u0072esult","callId":"c","ok":true}"#,
        r#"{"ty\npe":"device:result"}"#,
        r#"{"type":"device:result","callId":"c","ok":1}"#,
        r#"{"type":null}"#,
        "\u{a0}{}",
        r#"{"type":"device:result",}"#,
        r#"{"type":"device:result"} x"#,
        r#"{"type":"device:result","result":01}"#,
        r#"{"type":"device:result","result":tru}"#,
        r#"{"ok":truex}"#,
        "{\"type\":\"a\tb\"}",
        r#"{"type":"device:result""#,
        "",
        "[]",
    ] {
        assert!(!check_plain(text), "{text}");
    }
}

/// Pieces of frames, plain and not, to put together.
fn arb_piece() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "\"type\"",
        "\"callId\"",
        "\"ok\"",
        "\"result\"",
        "\"error\"",
        "\"manifest\"",
        "\"deviceId\"",
        "\"token\"",
        "\"data\"",
        "\"code\"",
        "\"nonce\"",
        "\"input\"",
        "\"other\"",
        "\"\"",
        "\"ty\\u0070e\"",
        "\"résumé\"",
        "\"a\\\"b\"",
        "type",
    ]);
    let value = prop::sample::select(vec![
        "\"device:result\"",
        "\"device:event\"",
        "\"\"",
        "\"x\\ny\"",
        "\"é\"",
        "\"\\ud800\"",
        "true",
        "false",
        "null",
        "0",
        "-1.5e3",
        "1e999",
        "01",
        "18446744073709551616",
        "{}",
        "[]",
        "{\"a\":[1,{\"b\":null}]}",
        "[1,2",
        "{\"a\" 1}",
        "tru",
        "truex",
        "\"unterminated",
    ]);
    let space = prop::sample::select(vec!["", "", "", "", " ", "\n\t", "\r", "\u{a0}"]);
    let separator = prop::sample::select(vec![",", ",", ",", ",", ",", ",", ":", "", ",,"]);
    (key, space.clone(), value, space, separator)
        .prop_map(|(k, s1, v, s2, sep)| format!("{s1}{k}{s2}:{s1}{v}{s2}{sep}"))
}

proptest! {
    #[test]
    fn the_plain_reading_finds_what_the_parser_finds(
        pieces in prop::collection::vec(arb_piece(), 0..5),
        tail in prop::sample::select(vec!["}", "}", "}", " } ", "", "}}", "} x", ",}"]),
        head in prop::sample::select(vec!["{", "{", "{", " {", "[", "{{"]),
    ) {
        let mut text = String::from(head);
        for piece in &pieces {
            text.push_str(piece);
        }
        // Most frames end without a separator before the brace.
        if text.ends_with(',') && pieces.len() % 3 != 0 {
            text.pop();
        }
        text.push_str(tail);
        check_plain(&text);
    }

    #[test]
    fn the_plain_reading_finds_what_the_parser_finds_in_frames(text in arb_frame()) {
        check_plain(&text);
    }
}

#[test]
fn a_string_stops_where_the_first_stop_byte_is() {
    // Every stop byte at every place of strings up to three words long,
    // after plain bytes of every kind (a multi-byte character, DEL, space).
    for len in 0..24 {
        for stop in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
            for filler in ["a", "é", "\u{7f}", " ", "\u{10348}"] {
                let plain: String = filler.repeat(len);
                let mut bytes = plain.into_bytes();
                let at = bytes.len();
                bytes.push(stop);
                bytes.extend_from_slice(b"\"\\x");
                assert_eq!(string_stop(&bytes), Some(at), "{bytes:?}");
            }
        }
        assert_eq!(string_stop("a".repeat(len).as_bytes()), None);
    }
}
