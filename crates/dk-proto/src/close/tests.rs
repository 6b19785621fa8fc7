//! Tests of the close codes: numbers, reasons, retry decisions, and reasons
//! cut to fit a close frame.

use super::*;

#[track_caller]
fn check_code(code: CloseCode, number: u16, reason: Option<&str>, retry: bool) {
    assert_eq!(code.code(), number, "{code:?}");
    assert_eq!(CloseCode::from_code(number), Some(code));
    assert_eq!(code.reason(), reason, "{code:?}");
    assert_eq!(code.retry(), retry, "{code:?}");
    assert_eq!(code.to_string(), number.to_string());
}

#[test]
fn every_close_code_has_its_number_reason_and_retry() {
    use CloseCode::*;
    let shutting = Some("vessel shutting down");
    check_code(Normal, 1000, None, true);
    check_code(GoingAway, 1001, shutting, true);
    check_code(NoStatus, 1005, None, true);
    check_code(TooLarge, 1009, None, true);
    let first = Some("send device:hello or device:auth first");
    check_code(HandshakeTimeout, 4000, first, true);
    check_code(PairingRefused, 4001, None, false);
    check_code(AuthFailed, 4002, Some("authentication failed"), false);
    let changed = Some("manifest changed since pairing: pair again");
    check_code(ManifestChanged, 4003, changed, false);
    let expected = Some("expected device:hello or device:auth");
    check_code(BadHandshake, 4004, expected, true);
    check_code(Malformed, 4005, Some("too many malformed frames"), true);
    check_code(Rate, 4006, None, true);
    check_code(Unpaired, 4007, Some("unpaired by the person"), false);
    check_code(Replaced, 4008, Some("replaced by a newer connection"), true);
    check_code(Dead, 4009, Some("no answer to pings"), true);
    check_code(PairingLimit, 4010, None, true);
    check_code(AdmissionRefused, 4011, None, false);
    check_code(SecureChannel, 4012, Some("secure channel failed"), true);
    assert_eq!(CloseCode::ALL.len(), 17);
    for number in [0, 999, 1002, 1006, 3999, 4013, u16::MAX] {
        assert_eq!(CloseCode::from_code(number), None, "{number}");
    }
}

#[test]
fn admission_codes_read_back_and_only_the_session_cap_retries() {
    let names = [
        "ERR_PRISM_DEVICE_DISABLED",
        "ERR_PRISM_DEVICE_APPROVAL",
        "ERR_PRISM_DEVICE_SESSIONS",
        "ERR_PRISM_DEVICE_CHUNK",
        "ERR_PRISM_DEVICE_RUN_LIMITS",
        "ERR_PRISM_DEVICE_INPUT",
    ];
    for (code, name) in AdmissionCode::ALL.into_iter().zip(names) {
        assert_eq!(code.as_str(), name);
        assert_eq!(code.to_string(), name);
        assert_eq!(name.parse::<AdmissionCode>(), Ok(code));
        assert_eq!(code.retry(), code == AdmissionCode::Sessions, "{code}");
    }
    for text in [
        "",
        "ERR_PRISM_DEVICE",
        "err_prism_device_sessions",
        " ERR_PRISM_DEVICE_CHUNK",
    ] {
        let error = text.parse::<AdmissionCode>().unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("unknown admission code `{text}`")
        );
    }
}

/// What a device decides about a close it received.
#[track_caller]
fn check_retry(code: u16, reason: &str, admission: Option<AdmissionCode>, retry: bool) {
    let frame = CloseFrame {
        code,
        reason: reason.to_owned(),
    };
    assert_eq!(frame.admission_code(), admission, "{frame}");
    assert_eq!(frame.retry(), retry, "{frame}");
}

#[test]
fn a_device_retries_as_the_close_says() {
    let sessions = Some(AdmissionCode::Sessions);
    let capped = "ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1";
    check_retry(4011, capped, sessions, true);
    // Cut to fit: the code at the start survives.
    check_retry(4011, "ERR_PRISM_DEVICE_SESSIONS: …", sessions, true);
    let disabled = "ERR_PRISM_DEVICE_DISABLED: voice devices are disabled";
    check_retry(4011, disabled, Some(AdmissionCode::Disabled), false);
    let approval = "ERR_PRISM_DEVICE_APPROVAL: voice device side effect requires approval";
    check_retry(4011, approval, Some(AdmissionCode::Approval), false);
    // A 4011 whose reason names no code is not retried.
    check_retry(4011, "", None, false);
    check_retry(4011, "ERR_PRISM_DEVICE_SESSIONS", None, false);
    check_retry(4011, "sessions: ERR_PRISM_DEVICE_SESSIONS", None, false);
    // The code means something only with 4011.
    check_retry(4001, capped, None, false);
    check_retry(4008, capped, None, true);
    check_retry(4002, "authentication failed", None, false);
    check_retry(
        4003,
        "manifest changed since pairing: pair again",
        None,
        false,
    );
    check_retry(4007, "unpaired by the person", None, false);
    check_retry(4009, "no answer to pings", None, true);
    check_retry(1001, "vessel shutting down", None, true);
    check_retry(1005, "", None, true);
    // A code that is not ours: tried again.
    check_retry(4999, "", None, true);
    check_retry(1011, "internal error", None, true);
}

#[test]
fn frames_are_made_with_their_code_and_reason() {
    let made = [
        (
            CloseFrame::canonical(CloseCode::Dead),
            4009,
            "no answer to pings",
        ),
        (CloseFrame::canonical(CloseCode::Normal), 1000, ""),
        (
            CloseFrame::new(CloseCode::Replaced, "paired again"),
            4008,
            "paired again",
        ),
        (
            CloseFrame::admission_refused(
                AdmissionCode::Sessions,
                "concurrent voice sessions capped at 1",
            ),
            4011,
            "ERR_PRISM_DEVICE_SESSIONS: concurrent voice sessions capped at 1",
        ),
    ];
    for (frame, code, reason) in made {
        assert_eq!(frame.code, code);
        assert_eq!(frame.reason, reason);
        assert_eq!(frame.to_string(), format!("{code} {reason}"));
    }
    let long = CloseFrame::admission_refused(AdmissionCode::Input, &"x".repeat(400));
    assert_eq!(long.reason.len(), MAX_CLOSE_REASON_BYTES);
    assert_eq!(long.admission_code(), Some(AdmissionCode::Input));
}

#[test]
fn pairing_limits_close_4010_with_their_reason() {
    let limits = [
        (
            PairingLimit::AlreadyWaiting,
            "a pairing request for this device is already waiting for the person",
        ),
        (
            PairingLimit::TooManyForDevice,
            "too many pairing requests for this device are waiting for the person",
        ),
        (
            PairingLimit::TooMany,
            "too many pairing requests are waiting for the person",
        ),
        (
            PairingLimit::TooManyFromAddress,
            "too many pairing requests from this address are waiting for the person",
        ),
        (
            PairingLimit::TooManyAttempts,
            "too many pairing attempts from this address: wait a minute",
        ),
    ];
    for (limit, reason) in limits {
        let frame = CloseFrame::from(limit);
        assert_eq!((frame.code, frame.reason.as_str()), (4010, reason));
        assert!(frame.retry(), "{frame}");
    }
}

/// What [`fit_close_reason`] must give: `reason` when it fits, else its
/// longest prefix that fits with the cut mark after it.
#[track_caller]
fn check_fit(reason: &str) {
    let fitted = fit_close_reason(reason.to_owned());
    assert!(fitted.len() <= MAX_CLOSE_REASON_BYTES, "{fitted:?}");
    if reason.len() <= MAX_CLOSE_REASON_BYTES {
        assert_eq!(fitted, reason);
        return;
    }
    let kept = fitted.strip_suffix(CUT_MARK).unwrap();
    assert!(reason.starts_with(kept), "{fitted:?} cuts {reason:?}");
    let next = reason[kept.len()..].chars().next().unwrap();
    assert!(
        kept.len() + next.len_utf8() + CUT_MARK.len_utf8() > MAX_CLOSE_REASON_BYTES,
        "{fitted:?} is not the longest prefix of {reason:?}"
    );
}

#[test]
fn close_reasons_are_cut_at_a_character_boundary_to_fit() {
    let a = |n: usize| "a".repeat(n);
    assert_eq!(fit_close_reason(a(123)), a(123));
    assert_eq!(fit_close_reason(a(124)), format!("{}…", a(120)));
    assert_eq!(
        fit_close_reason(format!("{}é", a(121))),
        format!("{}é", a(121))
    );
    assert_eq!(
        fit_close_reason(format!("{}é{}", a(119), a(9))),
        format!("{}…", a(119))
    );
    assert_eq!(
        fit_close_reason(format!("{}é{}", a(118), a(9))),
        format!("{}é…", a(118))
    );
    // Characters of 1 to 4 bytes, starting at every offset, so the limit
    // falls on every byte of a character.
    for c in ['a', 'é', '\u{202E}', '\u{E0041}'] {
        for lead in 0..4 {
            for count in 0..130 {
                check_fit(&format!("{}{}", a(lead), c.to_string().repeat(count)));
            }
        }
    }
}

proptest::proptest! {
    #[test]
    fn any_reason_fits_a_close_frame(reason in "\\PC{0,140}|.{0,200}") {
        check_fit(&reason);
    }
}
