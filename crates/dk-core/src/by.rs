//! Who made a change: the front end it came through (the terminal prompt,
//! the admin API, the console) and, for the console, which session. Audit
//! entries of changes the person makes (a pairing or an approval answered,
//! a grant or revocation, an unpairing, an agent added, re-scoped or
//! removed) name it as `"by"`: `{"frontEnd": "console", "session": "…"}`.
//! An entry without it was written before front ends were named, or by the
//! vessel's own code (a demo, a test).
//!
//! The types are the audit schema's (`dk_store::entry`), where every entry
//! that names someone has its `by` field.

pub use crate::store::entry::{By, FrontEnd};

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::By;
    use crate::store::entry::{Entry, Unpaired};

    fn entry(by: Option<By>) -> serde_json::Value {
        Entry::Unpaired(Unpaired {
            device_id: "lamp".to_owned(),
            channel: "v1".to_owned(),
            by,
        })
        .to_value()
    }

    #[test]
    fn by_reads_as_the_front_end_and_the_consoles_session() {
        assert_eq!(
            entry(Some(By::console("s-1"))),
            json!({"deviceId": "lamp", "channel": "v1",
                   "by": {"frontEnd": "console", "session": "s-1"}})
        );
        for (by, shown) in [
            (By::terminal(), json!({"frontEnd": "terminal"})),
            (By::admin_api(), json!({"frontEnd": "adminApi"})),
        ] {
            assert_eq!(serde_json::to_value(&by).unwrap(), shown);
            assert_eq!(serde_json::from_value::<By>(shown).unwrap(), by);
        }
        assert_eq!(entry(None), json!({"deviceId": "lamp", "channel": "v1"}));
    }
}
