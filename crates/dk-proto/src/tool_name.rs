//! Tool names: `device__<device id with - as _>__<capability>`.

use alloc::string::String;

/// Every device tool name starts with this.
pub const TOOL_PREFIX: &str = "device__";

/// The tool name an agent sees for `capability` on `device_id`: every `-` in
/// the id becomes `_`, so `desk-lamp` + `set_light` gives
/// `device__desk_lamp__set_light`. Unambiguous for valid ids and capability
/// names: ids have no `_`, capability names no `__`.
pub fn tool_name(device_id: &str, capability: &str) -> String {
    let mut name =
        String::with_capacity(TOOL_PREFIX.len() + device_id.len() + 2 + capability.len());
    name.push_str(TOOL_PREFIX);
    name.extend(device_id.chars().map(|c| if c == '-' { '_' } else { c }));
    name.push_str("__");
    name.push_str(capability);
    name
}

/// A tool name taken apart. The device id has its `-` restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolName<'a> {
    /// The device id, with every `_` of the name's id part read back as `-`.
    pub device_id: String,
    /// Everything after the separator, as given.
    pub capability: &'a str,
}

/// Takes a tool name apart as 8DK does: it must start with `device__`; the
/// rest splits at its first `__`; a split at the very start or the very end is
/// not a device tool. Returns `None` for a name that is not a device tool.
/// The parts are not checked against the id and name rules: the registry
/// lookup that follows refuses what does not exist.
pub fn parse_tool_name(tool: &str) -> Option<ToolName<'_>> {
    let rest = tool.strip_prefix(TOOL_PREFIX)?;
    // The first `__`, found bytewise (cheaper than a substring searcher for
    // a two-byte needle); `_` is ASCII, so the index is a char boundary.
    let sep = rest.as_bytes().windows(2).position(|w| w == b"__")?;
    if sep == 0 || sep + 2 == rest.len() {
        return None;
    }
    let (id, capability) = (rest.get(..sep)?, rest.get(sep + 2..)?);
    Some(ToolName {
        device_id: id.replace('_', "-"),
        capability,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[track_caller]
    fn check(tool: &str, expected: Option<(&str, &str)>) {
        let parsed = parse_tool_name(tool);
        let got = parsed
            .as_ref()
            .map(|t| (t.device_id.as_str(), t.capability));
        assert_eq!(got, expected, "{tool}");
    }

    #[test]
    fn parsing() {
        check(
            "device__desk_lamp__set_light",
            Some(("desk-lamp", "set_light")),
        );
        check("device__lamp__read", Some(("lamp", "read")));
        check("device__a___b", Some(("a", "_b")));
        check("device____x", None);
        check("device__lamp__", None);
        check("device__lamp", None);
        check("device_lamp__x", None);
        check("Device__lamp__x", None);
        check("", None);
        check("device__", None);
        check("device__x1__y__z", Some(("x1", "y__z")));
        check("device__é__ü", Some(("é", "ü")));
    }

    #[test]
    fn making() {
        assert_eq!(
            tool_name("desk-lamp", "set_light"),
            "device__desk_lamp__set_light"
        );
        assert_eq!(tool_name("a-b-c", "x"), "device__a_b_c__x");
    }

    proptest! {
        #[test]
        fn round_trip(id in "[a-z0-9]{1,6}(-[a-z0-9]{1,6}){0,3}", cap in "[a-z][a-z0-9]{0,5}(_[a-z0-9]{1,5}){0,3}") {
            let name = tool_name(&id, &cap);
            let parsed = parse_tool_name(&name).expect("a made name parses");
            prop_assert_eq!(parsed.device_id, id);
            prop_assert_eq!(parsed.capability, cap.as_str());
        }

        #[test]
        fn parsing_never_panics(tool in ".*") {
            let _ = parse_tool_name(&tool);
        }
    }
}
