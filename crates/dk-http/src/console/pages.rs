//! The console's pages, rendered on the server from the admin API's own
//! bodies (`dk_proto::admin`), one module for each part of the console;
//! here what they share. Every text that came from a device, an agent or
//! the log goes through `html::text` or `html::attr`; nothing else is
//! written unescaped but the pages' own markup.

mod agents;
mod audit;
mod devices;
mod frame;
mod prompts;
mod status;

pub(crate) use agents::agents;
pub(crate) use audit::{AuditFilter, Verified, audit};
pub(crate) use devices::{device, devices};
pub(crate) use frame::{landing_page, message_page, microphones_live, signed_out_page};
pub(crate) use prompts::{prompt_card, prompts, summary};
pub(crate) use status::status;

use dk_proto::admin as api;

use crate::link::DeviceEvent;

/// Which page is shown, for the navigation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Page {
    Prompts,
    Devices,
    Agents,
    Audit,
    Status,
}

/// What every page's frame shows.
pub(crate) struct Frame {
    /// `/console/<secret>`: every page's links start with it.
    pub(crate) base: String,
    pub(crate) current: Page,
    pub(crate) pending: usize,
    pub(crate) csrf: String,
    /// The session's id, as the audit log names it (not its cookie).
    pub(crate) session: String,
    /// The microphones open now, for the banner every page shows.
    pub(crate) microphones: Vec<api::LiveMicrophone>,
}

/// A device event kept for the device's page.
#[derive(Debug, Clone)]
pub(crate) struct RecentEvent {
    pub(crate) device_id: String,
    pub(crate) capability: String,
    pub(crate) at_ms: u64,
    pub(crate) data: String,
}

/// Longest event data kept for a device's page, in characters.
const EVENT_TEXT: usize = 300;

impl RecentEvent {
    pub(crate) fn of(event: &DeviceEvent) -> RecentEvent {
        let data = event.data.as_deref().map_or("", |d| d.get());
        RecentEvent {
            device_id: event.device_id.clone(),
            capability: event.capability.clone(),
            at_ms: crate::store::epoch_ms(std::time::SystemTime::now()),
            data: cut(data, EVENT_TEXT),
        }
    }
}

/// An agent just added: its credential, shown this once.
pub(crate) struct Added {
    pub(crate) name: String,
    pub(crate) credential: String,
    pub(crate) mcp_url: String,
}

fn cut(value: &str, most: usize) -> String {
    match value.char_indices().nth(most) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rest = secs % 86_400;
    // Days to a civil date (proleptic Gregorian), after H. Hinnant.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn now_ms() -> u64 {
    crate::store::epoch_ms(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::audit::decided_by;
    use super::utc;
    use crate::store::AuditEntry;

    #[track_caller]
    fn check(kind: &str, entry: Value, expected: &str) {
        let entry = AuditEntry {
            seq: 1,
            at_ms: 0,
            kind: kind.to_owned(),
            entry,
            prev_hash: String::new(),
            hash: String::new(),
        };
        assert_eq!(decided_by(&entry), expected);
    }

    #[test]
    fn an_audit_row_says_who_decided() {
        let console = json!({"frontEnd": "console", "session": "ab12"});
        check(
            "decision",
            json!({"allowed": true, "rule": "night <b>"}),
            "rule <code>night &lt;b&gt;</code>",
        );
        check(
            "decision",
            json!({"allowed": true, "rule": null}),
            "the grants",
        );
        check("decision", json!({"allowed": false}), "the checks");
        check(
            "decision",
            json!({"allowed": true, "person": "approved", "by": console}),
            "the person, in the console",
        );
        check(
            "decision",
            json!({"allowed": false, "person": "refused", "by": {"frontEnd": "terminal"}}),
            "the person, on the terminal",
        );
        check(
            "decision",
            json!({"allowed": false, "person": "refused"}),
            "the person",
        );
        check(
            "decision",
            json!({"allowed": true, "person": "remembered", "allowance": {"id": 4}}),
            "a remembered yes (allowance 4)",
        );
        check(
            "decision",
            json!({"allowed": true, "caller": "person"}),
            "the person's own call",
        );
        check(
            "granted",
            json!({"by": {"frontEnd": "adminApi"}}),
            "the person, through the admin API",
        );
        check("granted", json!({}), "");
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_796_185_507_000), "2026-12-02 04:25:07");
    }
}
