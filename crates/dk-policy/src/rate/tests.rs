//! RateLimit reading and printing, and the bounded RateLog: windows, per-pair caps, a full log.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

#[test]
fn limits_read_and_print() {
    let cases = [
        ("3 per 1h", 3, 3_600, "3 per 1h"),
        ("10 per 30m", 10, 1_800, "10 per 30m"),
        ("  100   PER 1d ", 100, 86_400, "100 per 1d"),
        ("1 per 1s", 1, 1, "1 per 1s"),
        ("5 per 90m", 5, 5_400, "5 per 90m"),
        ("5 per 120m", 5, 7_200, "5 per 2h"),
        ("10000 per 7d", 10_000, 604_800, "10000 per 7d"),
        ("2 per 3600s", 2, 3_600, "2 per 1h"),
    ];
    for (text, calls, seconds, printed) in cases {
        let limit = RateLimit::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(limit.calls(), calls, "{text}");
        assert_eq!(limit.window(), Duration::from_secs(seconds), "{text}");
        assert_eq!(limit.to_string(), printed, "{text}");
        assert_eq!(RateLimit::parse(printed), Ok(limit), "{printed}");
    }
}

#[test]
fn bad_limits_say_how_to_write_them() {
    let cases = [
        ("", "write `limit: N per <window>`"),
        ("3/h", "write `limit: N per <window>`"),
        ("3 per", "write `limit: N per <window>`"),
        ("3 each 1h", "write `limit: N per <window>`"),
        ("3 per 1 h", "write `limit: N per <window>`"),
        ("0 per 1h", "from 1 to 10000"),
        ("-1 per 1h", "from 1 to 10000"),
        ("10001 per 1h", "from 1 to 10000"),
        ("three per 1h", "from 1 to 10000"),
        ("3 per 1", "must be a whole number of s, m, h or d"),
        ("3 per 1w", "must be a whole number of s, m, h or d"),
        ("3 per 1H", "must be a whole number of s, m, h or d"),
        ("3 per h", "must be a whole number of s, m, h or d"),
        ("3 per 0s", "must be a whole number of s, m, h or d"),
        ("3 per 8d", "must be a whole number of s, m, h or d"),
        ("3 per +1h", "must be a whole number of s, m, h or d"),
        (
            "3 per 99999999999999999999d",
            "must be a whole number of s, m, h or d",
        ),
        ("3 per 1.5h", "must be a whole number of s, m, h or d"),
    ];
    for (text, expected) in cases {
        match RateLimit::parse(text) {
            Ok(limit) => panic!("{text:?} read as {limit}"),
            Err(error) => {
                let message = error.to_string();
                assert!(message.contains(expected), "{text:?}: {message}");
            }
        }
    }
}

#[test]
fn counts_fall_out_of_the_window() {
    let limit = RateLimit::parse("3 per 1h").unwrap();
    let mut log = RateLog::default();
    for t in [0, 10, 20] {
        log.record("door", "main", limit, at(t)).unwrap();
    }
    let window = limit.window();
    assert_eq!(log.counted("door", "main", window, at(20)), 3);
    assert_eq!(log.counted("door", "main", window, at(3_599)), 3);
    // The first call leaves the window exactly one hour after it was made.
    assert_eq!(log.counted("door", "main", window, at(3_600)), 2);
    assert_eq!(log.counted("door", "main", window, at(3_620)), 0);
    // Other agents and rules count apart.
    assert_eq!(log.counted("door", "guest", window, at(20)), 0);
    assert_eq!(log.counted("lamp", "main", window, at(20)), 0);
    // A call recorded after `at` (the clock went back) still counts.
    assert_eq!(log.counted("door", "main", window, at(5)), 3);
}

#[test]
fn a_pair_keeps_only_as_many_calls_as_its_limit() {
    let limit = RateLimit::parse("2 per 1d").unwrap();
    let mut log = RateLog::default();
    for t in 0..50 {
        log.record("door", "main", limit, at(t)).unwrap();
    }
    assert_eq!(log.counted("door", "main", limit.window(), at(60)), 2);
    assert_eq!(log.len(), 1);
    assert!(log.forget_one("door", "main", at(49)));
    assert!(!log.forget_one("door", "main", at(49)));
    assert!(!log.forget_one("door", "guest", at(48)));
    assert_eq!(log.counted("door", "main", limit.window(), at(60)), 1);
    assert!(log.forget_one("door", "main", at(48)));
    assert!(log.is_empty());
    log.record("door", "main", limit, at(50)).unwrap();
    log.forget_rule("door");
    assert!(log.is_empty());
    assert_eq!(log.counted("door", "main", limit.window(), at(60)), 0);
}

#[test]
fn a_full_log_forgets_expired_pairs_and_refuses_live_ones() {
    let limit = RateLimit::parse("1 per 1m").unwrap();
    let mut log = RateLog::new(2);
    log.record("door", "a", limit, at(0)).unwrap();
    log.record("door", "b", limit, at(30)).unwrap();
    // Both live: a third pair is refused, a known pair is still recorded.
    assert_eq!(log.record("door", "c", limit, at(40)), Err(RateLogFull(2)));
    log.record("door", "a", limit, at(45)).unwrap();
    // At 100 s, b's call (30 s) has left its minute; a's (45 s) has not.
    log.record("door", "c", limit, at(100)).unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log.counted("door", "c", limit.window(), at(100)), 1);
    assert_eq!(log.counted("door", "a", limit.window(), at(100)), 1);
    assert_eq!(log.counted("door", "b", limit.window(), at(100)), 0);
}

#[test]
fn nothing_counted_reads_zero() {
    assert_eq!(
        NoCounts.counted("door", "main", Duration::from_secs(60), at(0)),
        0
    );
    assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(5)), 0);
}

#[test]
fn the_next_call_is_allowed_when_the_oldest_counted_one_leaves_its_window() {
    let limit = RateLimit::parse("2 per 1h").unwrap();
    let mut log = RateLog::default();
    assert_eq!(log.next_allowed("r", "a", limit, at(0)), None);
    log.record("r", "a", limit, at(0)).unwrap();
    assert_eq!(log.next_allowed("r", "a", limit, at(10)), None);
    log.record("r", "a", limit, at(600)).unwrap();
    // Reached: the call at 0 leaves at 3600.
    let cases = [
        (1_140, Some(2_460)),
        (3_599, Some(1)),
        (3_600, None),
        (3_700, None),
    ];
    for (now, wait) in cases {
        assert_eq!(
            log.next_allowed("r", "a", limit, at(now)),
            wait.map(Duration::from_secs),
            "{now}"
        );
    }
    assert_eq!(log.next_allowed("r", "other", limit, at(1_140)), None);
    // A limit lowered since (a reload): the newest call that must leave.
    let one = RateLimit::parse("1 per 1h").unwrap();
    assert_eq!(
        log.next_allowed("r", "a", one, at(1_140)),
        Some(Duration::from_secs(3_060))
    );
}
