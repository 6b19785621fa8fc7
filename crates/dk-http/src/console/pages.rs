//! The console's pages, rendered on the server from the admin API's own
//! bodies (`dk_proto::admin`), one module for each part of the console and
//! one for what they share. Every text that came from a device, an agent
//! or the log goes in through `html::Text` or `html::Attr`; the templates
//! escape whatever else is put in them.

mod agents;
mod audit;
mod devices;
mod frame;
mod prompts;
mod shared;
mod status;

pub(crate) use agents::agents;
pub(crate) use audit::{AuditFilter, Verified, audit};
pub(crate) use devices::{device, devices};
pub(crate) use frame::{landing_page, message_page, microphones_live, signed_out_page};
pub(crate) use prompts::{prompt_card, prompts, summary};
pub(crate) use shared::{Added, Frame, Page, RecentEvent};
pub(crate) use status::status;

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::audit::decided_by;
    use super::shared::utc;
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
