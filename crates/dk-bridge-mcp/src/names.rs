//! MCP tool names as dk capability names: lower snake case, at most 30
//! characters, never `__`. A tool whose name already is one keeps it; any
//! other becomes its lower snake form (cut to 23 characters) followed by
//! `_` and six hex digits of the SHA-256 of the tool's name. The mapping
//! depends on the tool's name alone, so it is stable whatever else the
//! server lists, and two tools whose names fold to the same snake form
//! (`get-env`, `getEnv`) still get capabilities of their own. A name that
//! would still collide (another tool's own name, or [`RESERVED`]) is
//! found by [`assign`], and the later tool is left out.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The capability the bridge itself answers (what the server is, what was
/// left out): no tool may take its name.
pub const RESERVED: &str = "server_info";

/// Longest capability name.
const MAX: usize = dk_proto::limits::CAPABILITY_NAME;

/// Characters of the snake form kept before the hash suffix.
const STEM: usize = MAX - 7;

/// The capability name of the tool named `tool`.
pub fn capability_name(tool: &str) -> String {
    if is_snake(tool) && tool.len() <= MAX && tool != RESERVED {
        return tool.to_owned();
    }
    let mut stem = snake(tool);
    stem.truncate(STEM);
    while stem.ends_with('_') {
        stem.pop();
    }
    if stem.is_empty() {
        stem.push_str("tool");
    }
    let digest = Sha256::digest(tool.as_bytes());
    let suffix = dk_files::hex::encode(digest.get(..3).unwrap_or_default());
    format!("{stem}_{suffix}")
}

/// Capability names for `tools` (in the order given): the name of each,
/// or, for a tool whose name another took first, the tool whose name it
/// is.
pub fn assign<'t>(tools: &[&'t str]) -> Vec<Result<String, &'t str>> {
    let mut taken: BTreeMap<String, &'t str> = BTreeMap::new();
    tools
        .iter()
        .map(|tool| {
            let name = capability_name(tool);
            match taken.get(&name) {
                Some(first) => Err(*first),
                None => {
                    taken.insert(name.clone(), tool);
                    Ok(name)
                }
            }
        })
        .collect()
}

/// `^[a-z][a-z0-9]*(_[a-z0-9]+)*$`.
fn is_snake(s: &str) -> bool {
    s.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
        && s.split('_').all(|word| {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// The lower snake form of `name`: a capital after a small letter or a
/// digit starts a word, anything but ASCII letters and digits separates
/// words, and a leading digit gets `t_` before it.
fn snake(name: &str) -> String {
    let mut out = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            if previous_lower {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            previous_lower = false;
        } else if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
            previous_lower = true;
        } else {
            if !out.ends_with('_') {
                out.push('_');
            }
            previous_lower = false;
        }
    }
    let trimmed = out.trim_matches('_');
    let mut snake = String::with_capacity(trimmed.len() + 2);
    let mut last = '_';
    for c in trimmed.chars() {
        if !(c == '_' && last == '_') {
            snake.push(c);
        }
        last = c;
    }
    if snake.starts_with(|c: char| c.is_ascii_digit()) {
        snake.insert_str(0, "t_");
    }
    snake
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        is_snake(name) && name.len() <= MAX
    }

    #[test]
    fn snake_names_stay_and_others_get_a_stable_suffix() {
        assert_eq!(capability_name("read_file"), "read_file");
        assert_eq!(capability_name("echo"), "echo");
        let env = capability_name("get-env");
        assert!(env.starts_with("get_env_") && env.len() == 14, "{env}");
        assert_eq!(env, capability_name("get-env"));
        let camel = capability_name("getEnv");
        assert!(camel.starts_with("get_env_"), "{camel}");
        assert_ne!(env, camel);
        assert_ne!(capability_name(RESERVED), RESERVED);
        for odd in [
            "",
            "___",
            "9lives",
            "Ünïcødé",
            "a__b",
            "trigger-long-running-operation-with-a-very-long-name",
            "HTTPServer",
            "x\u{202e}y",
        ] {
            let name = capability_name(odd);
            assert!(valid(&name), "{odd:?} -> {name:?}");
        }
        assert!(capability_name("9lives").starts_with("t_9lives_"));
    }

    #[test]
    fn a_name_taken_first_leaves_the_later_tool_out() {
        let suffixed = capability_name("get-env");
        let tools = ["get-env", suffixed.as_str(), "echo"];
        let assigned = assign(&tools);
        assert_eq!(assigned[0], Ok(suffixed.clone()));
        assert_eq!(assigned[1], Err("get-env"));
        assert_eq!(assigned[2], Ok("echo".to_owned()));
    }
}
