//! Who made a change: the front end it came through (the terminal prompt,
//! the admin API, the console) and, for the console, which session. Audit
//! entries of changes the person makes (a pairing or an approval answered,
//! a grant or revocation, an unpairing, an agent added, re-scoped or
//! removed) name it as `"by"`: `{"frontEnd": "console", "session": "…"}`.
//! An entry without it was written before front ends were named, or by the
//! vessel's own code (a demo, a test).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The front end a change came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FrontEnd {
    /// The terminal prompt of `dk vessel`.
    Terminal,
    /// The admin API (`dk` commands, other tools), by its bearer token.
    AdminApi,
    /// The person's console in a browser.
    Console,
}

/// Who made a change, as its audit entry's `by` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct By {
    /// The front end.
    pub front_end: FrontEnd,
    /// The console's session: an id of its own, made when the session
    /// opened, never the cookie nor anything the cookie can be found from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl By {
    /// The terminal prompt.
    pub fn terminal() -> By {
        By {
            front_end: FrontEnd::Terminal,
            session: None,
        }
    }

    /// The admin API.
    pub fn admin_api() -> By {
        By {
            front_end: FrontEnd::AdminApi,
            session: None,
        }
    }

    /// The console session `session` (its id, not its cookie).
    pub fn console(session: impl Into<String>) -> By {
        By {
            front_end: FrontEnd::Console,
            session: Some(session.into()),
        }
    }
}

/// Adds `"by"` to an audit entry (an object) when `by` names someone: the
/// one place every kind of entry gets it.
pub(crate) fn mark(entry: &mut Value, by: Option<&By>) {
    if let (Some(by), Value::Object(map)) = (by, entry)
        && let Ok(value) = serde_json::to_value(by)
    {
        map.insert("by".to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{By, mark};

    #[test]
    fn by_reads_as_the_front_end_and_the_consoles_session() {
        let mut entry = json!({"deviceId": "lamp"});
        mark(&mut entry, Some(&By::console("s-1")));
        assert_eq!(
            entry,
            json!({"deviceId": "lamp", "by": {"frontEnd": "console", "session": "s-1"}})
        );
        for (by, shown) in [
            (By::terminal(), json!({"frontEnd": "terminal"})),
            (By::admin_api(), json!({"frontEnd": "adminApi"})),
        ] {
            assert_eq!(serde_json::to_value(&by).unwrap(), shown);
            assert_eq!(serde_json::from_value::<By>(shown).unwrap(), by);
        }
        let mut unnamed = json!({"deviceId": "lamp"});
        mark(&mut unnamed, None);
        assert_eq!(unnamed, json!({"deviceId": "lamp"}));
    }
}
