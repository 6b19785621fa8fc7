//! What the console's pages share: the frame's facts, which page is shown,
//! the events and the added agent they show, and how they write times.

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

/// `value` cut to its first `most` characters, `…` marking a cut.
pub(super) fn cut(value: &str, most: usize) -> String {
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

/// Now, in milliseconds since the Unix epoch.
pub(super) fn now_ms() -> u64 {
    crate::store::epoch_ms(std::time::SystemTime::now())
}
