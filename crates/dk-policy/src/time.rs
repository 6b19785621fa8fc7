//! Time conditions: `time in HH:MM..HH:MM` windows, weekday names, and the zone a call's instant is read in.
//!
//! Evaluation never reads a clock: the instant is the caller's
//! ([`crate::Call::at`]). It is turned into a local time of day and weekday
//! in the rule file's `timezone:` (an IANA name), else in the vessel's local
//! zone, through jiff and its time-zone database (the system's
//! `/usr/share/zoneinfo` when there is one, else the copy bundled into the
//! binary). Wall-clock windows follow the zone's daylight-saving changes:
//! an hour skipped in spring is in no window, an hour repeated in autumn is
//! in a window both times.

use std::fmt;
use std::time::SystemTime;

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Minutes in a day: a window's end may be `24:00`.
const DAY_MINUTES: u16 = 24 * 60;

/// The weekday names a `weekday` clause compares with, Monday first.
pub const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// The full English names, Monday first: refused in favour of the short ones.
const FULL_WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// `time in HH:MM..HH:MM`: half-open, from `start` (included) to `end`
/// (excluded), in minutes after midnight; wraps midnight when `end < start`;
/// empty when they are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimeWindow {
    pub(crate) start: u16,
    pub(crate) end: u16,
}

impl TimeWindow {
    /// Reads `HH:MM..HH:MM` (spaces around `..` allowed). `start` is
    /// `00:00` to `23:59`, `end` up to `24:00`.
    pub(crate) fn parse(text: &str) -> Result<TimeWindow, String> {
        let example =
            "write `time in HH:MM..HH:MM` with 24-hour times, as in `time in 23:00..06:00`";
        let Some((start, end)) = text.split_once("..") else {
            return Err(format!("`time in {text}` is not a time window: {example}"));
        };
        let start_text = start.trim();
        let end_text = end.trim();
        let start = clock(start_text)
            .filter(|m| *m < DAY_MINUTES)
            .ok_or_else(|| {
                format!("`{start_text}` is not a time from 00:00 to 23:59: {example}")
            })?;
        let end = clock(end_text)
            .ok_or_else(|| format!("`{end_text}` is not a time from 00:00 to 24:00: {example}"))?;
        Ok(TimeWindow { start, end })
    }

    /// Whether the window holds no instant (`start == end`).
    pub(crate) fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// Whether `second` (seconds after local midnight) is in the window.
    pub(crate) fn contains(self, second: u32) -> bool {
        let start = u32::from(self.start) * 60;
        let end = u32::from(self.end) * 60;
        if start <= end {
            start <= second && second < end
        } else {
            second >= start || second < end
        }
    }
}

impl fmt::Display for TimeWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02}:{:02}..{:02}:{:02}",
            self.start / 60,
            self.start % 60,
            self.end / 60,
            self.end % 60
        )
    }
}

/// `HH:MM` (two digits each, `MM` below 60, `HH` at most 24 and `24:00`
/// only) as minutes after midnight.
fn clock(text: &str) -> Option<u16> {
    let (hours, minutes) = text.split_once(':')?;
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hours) || !two_digits(minutes) {
        return None;
    }
    let hours: u16 = hours.parse().ok()?;
    let minutes: u16 = minutes.parse().ok()?;
    let total = hours * 60 + minutes;
    (minutes < 60 && total <= DAY_MINUTES).then_some(total)
}

/// Why a `weekday` value can never match, with how to write it; `None`
/// when it is one of [`WEEKDAYS`] (compared lower-cased).
pub(crate) fn weekday_problem(lowered: &str) -> Option<String> {
    if WEEKDAYS.contains(&lowered) {
        return None;
    }
    let short = FULL_WEEKDAYS
        .iter()
        .zip(WEEKDAYS)
        .find(|(full, _)| **full == lowered)
        .map(|(_, short)| short);
    Some(match short {
        Some(short) => format!("weekdays are written with three letters: write `{short}`"),
        None => format!(
            "`{lowered}` is not a weekday, so this clause never matches: write one of {}",
            WEEKDAYS.join(", ")
        ),
    })
}

/// A call's instant in the zone the rules read it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalTime {
    /// Seconds after local midnight.
    pub(crate) second: u32,
    /// Index in [`WEEKDAYS`].
    pub(crate) weekday: usize,
}

impl LocalTime {
    /// The instant `at` in `zone`; `None` for an instant jiff cannot
    /// represent (before year -9999 or after 9999).
    pub(crate) fn of(at: SystemTime, zone: &TimeZone) -> Option<LocalTime> {
        let timestamp = Timestamp::try_from(at).ok()?;
        let civil = zone.to_datetime(timestamp);
        let second = u32::try_from(
            i32::from(civil.hour()) * 3600
                + i32::from(civil.minute()) * 60
                + i32::from(civil.second()),
        )
        .ok()?;
        let weekday = usize::try_from(civil.weekday().to_monday_zero_offset()).ok()?;
        Some(LocalTime { second, weekday })
    }

    /// `mon` ... `sun`.
    pub(crate) fn weekday_name(self) -> &'static str {
        WEEKDAYS.get(self.weekday).copied().unwrap_or("")
    }
}

/// The zone time conditions are read in.
#[derive(Clone, Debug)]
pub(crate) struct Zone {
    pub(crate) zone: TimeZone,
    /// The IANA name, when known.
    pub(crate) name: Option<String>,
}

impl Zone {
    /// The zone named `name` (IANA, as `Europe/Berlin`), or why not.
    pub(crate) fn named(name: &str) -> Result<Zone, ZoneError> {
        match jiff::tz::db().get(name) {
            Ok(zone) => Ok(Zone {
                zone,
                name: Some(name.to_owned()),
            }),
            Err(_) => Err(ZoneError::Unknown(name.to_owned())),
        }
    }

    /// The system's zone (`TZ`, else `/etc/localtime`); UTC when it cannot
    /// be read.
    pub(crate) fn system() -> Zone {
        let zone = TimeZone::try_system().unwrap_or(TimeZone::UTC);
        let name = zone.iana_name().map(str::to_owned);
        Zone { zone, name }
    }
}

/// Reads `text` as an instant: RFC 3339 with an offset or `Z`
/// (`2026-12-01T23:30:00+01:00`), or a local date and time without one
/// (`2026-12-01T23:30`, `2026-12-01T23:30:00`), read in `zone`. A local
/// time a DST change skips reads as the time after the gap; one it repeats
/// reads as its first occurrence.
pub(crate) fn parse_instant(text: &str, zone: &TimeZone) -> Result<SystemTime, InstantError> {
    let out_of_range = |why: &dyn fmt::Display| InstantError::OutOfRange {
        text: text.to_owned(),
        why: why.to_string(),
    };
    let instant = match text.parse::<Timestamp>() {
        Ok(timestamp) => timestamp,
        Err(_) => {
            let civil: jiff::civil::DateTime = text
                .parse()
                .map_err(|_| InstantError::NotADateTime(text.to_owned()))?;
            zone.to_ambiguous_timestamp(civil)
                .compatible()
                .map_err(|e| out_of_range(&e))?
        }
    };
    let since = instant.duration_since(Timestamp::UNIX_EPOCH);
    let magnitude = std::time::Duration::try_from(since.abs()).map_err(|e| out_of_range(&e))?;
    let epoch = SystemTime::UNIX_EPOCH;
    let at = if since.is_negative() {
        epoch.checked_sub(magnitude)
    } else {
        epoch.checked_add(magnitude)
    };
    at.ok_or_else(|| InstantError::TooFar(text.to_owned()))
}

/// Why a text is not an instant. `Display` says how to write one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InstantError {
    /// Neither RFC 3339 nor a local date and time; the text as given.
    #[error(
        "`{}` is not a date and time: write `2026-12-01T23:30:00` (in the rules' zone) or `2026-12-01T23:30:00Z` (with an offset)",
        .0.escape_debug()
    )]
    NotADateTime(String),
    /// A date and time the zone or the clock cannot place.
    #[error("`{}`: {why}", text.escape_debug())]
    OutOfRange {
        /// The text as given.
        text: String,
        /// Why it cannot be placed.
        why: String,
    },
    /// An instant the system clock cannot hold; the text as given.
    #[error("`{}` is too far from 1970", .0.escape_debug())]
    TooFar(String),
}

/// A time zone name that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    /// No zone of that IANA name in the time-zone database.
    #[error("unknown time zone `{0}` (write an IANA name such as `Europe/Berlin` or `UTC`)")]
    Unknown(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_window(text: &str, expected: Result<(&str, bool), &str>) {
        match (TimeWindow::parse(text), expected) {
            (Ok(window), Ok((printed, empty))) => {
                assert_eq!(window.to_string(), printed, "{text}");
                assert_eq!(window.is_empty(), empty, "{text}");
            }
            (Err(message), Err(expected)) => assert_eq!(message, expected, "{text}"),
            (got, expected) => panic!("{text}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn windows_parse_and_print() {
        let example =
            "write `time in HH:MM..HH:MM` with 24-hour times, as in `time in 23:00..06:00`";
        check_window("23:00..06:00", Ok(("23:00..06:00", false)));
        check_window("00:00 .. 24:00", Ok(("00:00..24:00", false)));
        check_window("09:30..09:30", Ok(("09:30..09:30", true)));
        check_window(
            "9:00..17:00",
            Err(&format!(
                "`9:00` is not a time from 00:00 to 23:59: {example}"
            )),
        );
        check_window(
            "24:00..06:00",
            Err(&format!(
                "`24:00` is not a time from 00:00 to 23:59: {example}"
            )),
        );
        check_window(
            "22:00..24:01",
            Err(&format!(
                "`24:01` is not a time from 00:00 to 24:00: {example}"
            )),
        );
        check_window(
            "22:00..23:60",
            Err(&format!(
                "`23:60` is not a time from 00:00 to 24:00: {example}"
            )),
        );
        check_window(
            "22:00-23:00",
            Err(&format!(
                "`time in 22:00-23:00` is not a time window: {example}"
            )),
        );
    }

    #[test]
    fn windows_are_half_open_and_wrap() {
        let at = |h: u32, m: u32, s: u32| h * 3600 + m * 60 + s;
        let night = TimeWindow::parse("23:00..06:00").unwrap();
        let cases = [
            (at(22, 59, 59), false),
            (at(23, 0, 0), true),
            (at(0, 0, 0), true),
            (at(5, 59, 59), true),
            (at(6, 0, 0), false),
            (at(12, 0, 0), false),
        ];
        for (second, inside) in cases {
            assert_eq!(night.contains(second), inside, "{second}");
        }
        let day = TimeWindow::parse("09:00..17:00").unwrap();
        assert!(!day.contains(at(8, 59, 59)));
        assert!(day.contains(at(9, 0, 0)));
        assert!(!day.contains(at(17, 0, 0)));
        let all = TimeWindow::parse("00:00..24:00").unwrap();
        assert!(all.contains(0) && all.contains(at(23, 59, 59)));
        let empty = TimeWindow::parse("10:00..10:00").unwrap();
        assert!(!empty.contains(at(10, 0, 0)) && !empty.contains(0));
    }

    #[test]
    fn weekday_names() {
        assert_eq!(weekday_problem("sat"), None);
        assert_eq!(
            weekday_problem("saturday").as_deref(),
            Some("weekdays are written with three letters: write `sat`")
        );
        assert_eq!(
            weekday_problem("sa").as_deref(),
            Some(
                "`sa` is not a weekday, so this clause never matches: write one of mon, tue, wed, thu, fri, sat, sun"
            )
        );
    }

    #[test]
    fn unknown_zones_are_errors() {
        assert_eq!(
            Zone::named("Mars/Olympus").unwrap_err().to_string(),
            "unknown time zone `Mars/Olympus` (write an IANA name such as `Europe/Berlin` or `UTC`)"
        );
        assert!(Zone::named("Europe/Berlin").is_ok());
    }

    #[test]
    fn instants_read_with_an_offset_or_in_the_zone() {
        let berlin = Zone::named("Europe/Berlin").unwrap().zone;
        let utc = |text: &str| {
            let at: Timestamp = text.parse().unwrap();
            let seconds = at.as_second();
            let magnitude = std::time::Duration::from_secs(seconds.unsigned_abs());
            if seconds < 0 {
                SystemTime::UNIX_EPOCH - magnitude
            } else {
                SystemTime::UNIX_EPOCH + magnitude
            }
        };
        let cases = [
            // Winter: UTC+1.
            ("2026-12-01T23:30:00", "2026-12-01T22:30:00Z"),
            ("2026-12-01T23:30", "2026-12-01T22:30:00Z"),
            ("2026-12-01T23:30:00Z", "2026-12-01T23:30:00Z"),
            ("2026-12-01T23:30:00-05:00", "2026-12-02T04:30:00Z"),
            // Summer: UTC+2.
            ("2026-07-01T12:00:00", "2026-07-01T10:00:00Z"),
            // 02:30 never happens on 2026-03-29 (02:00 -> 03:00): the time
            // after the gap, 03:30 CEST.
            ("2026-03-29T02:30:00", "2026-03-29T01:30:00Z"),
            // 02:30 happens twice on 2026-10-25: the first, in CEST.
            ("2026-10-25T02:30:00", "2026-10-25T00:30:00Z"),
            ("1969-12-31T23:00:00Z", "1969-12-31T23:00:00Z"),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_instant(text, &berlin), Ok(utc(expected)), "{text}");
        }
        for bad in [
            "tonight",
            "2026-13-01T00:00",
            "23:30",
            "2026-12-01 23:30:00 CET",
            "",
        ] {
            let error = parse_instant(bad, &berlin).unwrap_err().to_string();
            assert!(
                error.contains("is not a date and time: write `2026-12-01T23:30:00`"),
                "{bad}: {error}"
            );
        }
    }
}
