//! The device's manifest, built from the server's tool list: one
//! capability per tool that can be carried, and `server_info`, which says
//! what the server is and which tools were left out and why.
//!
//! A tool is a sensor when the server claims `readOnlyHint` (and not
//! `destructiveHint` beside it), else an actuator that asks the person
//! every time (`confirm`). The manifest
//! opts in to dk's extension (`"dk": 1`) and pins, for each tool, its
//! name (`tool`), title, description, input schema, output schema and
//! annotations: its digest covers them all, so any change is a new
//! manifest the person must agree to. New lines and tabs in a description
//! are shown as spaces; a tool whose name, title or description holds any
//! other control, invisible or bidirectional character, whose description
//! is over 500 characters, whose schemas are over dk's limits or are not
//! JSON Schema a validator can compile, or that comes after the first 31,
//! is left out, with its reason.

use std::collections::BTreeMap;
use std::sync::Arc;

use dk_proto::limits;
use dk_proto::{CapabilityKind, Manifest, is_unsafe_char, utf16_len, validate_manifest};
use rmcp::model::{Implementation, Tool};
use serde_json::{Map, Value, json};

use crate::names::{RESERVED, assign};
use crate::schema;

/// The device kind of every bridged server.
pub const KIND: &str = "mcp-server";

/// A tool the device does not carry, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LeftOut {
    /// The tool's name, as the server gave it (escaped when it holds
    /// characters that could hide text).
    pub tool: String,
    /// Why, in a few words.
    pub why: String,
}

/// A tool the device carries.
#[derive(Clone)]
pub struct Carried {
    /// The tool's name on the server.
    pub tool: String,
    /// Its output schema, compiled, when it declares one.
    pub output: Option<Arc<jsonschema::Validator>>,
}

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Carried")
            .field("tool", &self.tool)
            .field("output", &self.output.is_some())
            .finish()
    }
}

/// What the server is, as the person is shown it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The device id.
    pub id: String,
    /// The command line (or URL) the bridge reaches the server by.
    pub command: String,
    /// A name the person gave, instead of the server's own.
    pub name: Option<String>,
}

/// The manifest built from a tool list, and what it carries.
#[derive(Debug, Clone)]
pub struct Built {
    /// The validated manifest.
    pub manifest: Manifest,
    /// The carried tools, by capability name.
    pub tools: BTreeMap<String, Carried>,
    /// The tools left out, in the server's name order.
    pub left_out: Vec<LeftOut>,
    /// The server's name and version, as it says.
    pub server: Option<(String, String)>,
}

/// Why no manifest could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the device's manifest is refused: {0}")]
pub struct BuildError(pub String);

/// Builds the manifest of `tools` for the server `identity` names, which
/// says it is `server`.
pub fn build(
    identity: &Identity,
    server: Option<&Implementation>,
    tools: &[Tool],
) -> Result<Built, BuildError> {
    let mut sorted: Vec<&Tool> = tools.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = sorted.iter().map(|t| t.name.as_ref()).collect();
    let assigned = assign(&names);
    let mut capabilities = Vec::new();
    let mut carried = BTreeMap::new();
    let mut left_out = Vec::new();
    let mut previous: Option<&str> = None;
    for (tool, name) in sorted.iter().zip(assigned) {
        let leave = |why: String| LeftOut {
            tool: shown(&tool.name),
            why,
        };
        if previous == Some(tool.name.as_ref()) {
            left_out.push(leave("listed twice".to_owned()));
            continue;
        }
        previous = Some(tool.name.as_ref());
        let name = match name {
            Ok(name) => name,
            Err(first) => {
                left_out.push(leave(format!(
                    "its name maps to the capability of `{}`",
                    shown(first)
                )));
                continue;
            }
        };
        if carried.len() >= limits::CAPABILITIES - 1 {
            left_out.push(leave(format!(
                "a device carries at most {} tools",
                limits::CAPABILITIES - 1
            )));
            continue;
        }
        match capability(&identity.id, tool, &name) {
            Ok((json, output)) => {
                capabilities.push(json);
                carried.insert(
                    name,
                    Carried {
                        tool: tool.name.to_string(),
                        output,
                    },
                );
            }
            Err(why) => left_out.push(leave(why)),
        }
    }
    let server = server.map(|s| (s.name.clone(), s.version.clone()));
    capabilities.push(json!({
        "name": RESERVED,
        "kind": CapabilityKind::Sensor.as_str(),
        "description": about(identity, server.as_ref(), &left_out),
        "title": "What this server is",
    }));
    let manifest = json!({
        "dk": 1,
        "id": identity.id,
        "name": device_name(identity, server.as_ref()),
        "kind": KIND,
        "version": server
            .as_ref()
            .map(|(_, v)| v.as_str())
            .filter(|v| plain(v) && !v.trim().is_empty() && utf16_len(v) <= limits::VERSION)
            .unwrap_or("unknown"),
        "capabilities": capabilities,
    });
    let manifest = validate_manifest(&manifest).map_err(|e| BuildError(e.to_string()))?;
    Ok(Built {
        manifest,
        tools: carried,
        left_out,
        server,
    })
}

/// The capability of `tool` named `name`, with its compiled output
/// schema; or why it cannot be carried.
fn capability(
    id: &str,
    tool: &Tool,
    name: &str,
) -> Result<(Value, Option<Arc<jsonschema::Validator>>), String> {
    if !plain(&tool.name) {
        return Err("its name holds control, invisible or bidirectional characters".to_owned());
    }
    if utf16_len(&tool.name) > limits::TOOL {
        return Err(format!("its name is over {} characters", limits::TOOL));
    }
    let description = match tool.description.as_deref().map(spaced) {
        Some(text) if !text.trim().is_empty() => text,
        _ => format!(
            "The MCP tool {} (the server describes it no further).",
            tool.name
        ),
    };
    if !plain(&description) {
        return Err(
            "its description holds control, invisible or bidirectional characters".to_owned(),
        );
    }
    let length = utf16_len(&description);
    if length > limits::CAPABILITY_DESCRIPTION {
        return Err(format!(
            "its description is {length} characters, over {}",
            limits::CAPABILITY_DESCRIPTION
        ));
    }
    let title = tool
        .title
        .clone()
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone()));
    if let Some(title) = &title
        && (!plain(title) || utf16_len(title) > limits::NAME)
    {
        return Err(format!(
            "its title is over {} characters or holds control, invisible or bidirectional characters",
            limits::NAME
        ));
    }
    // A claim the server contradicts itself (read-only and destructive)
    // is taken at its worse.
    let read_only = tool
        .annotations
        .as_ref()
        .is_some_and(|a| a.read_only_hint == Some(true) && a.destructive_hint != Some(true));
    let mut c = Map::new();
    c.insert("name".to_owned(), Value::from(name));
    c.insert(
        "kind".to_owned(),
        Value::from(
            if read_only {
                CapabilityKind::Sensor
            } else {
                CapabilityKind::Actuator
            }
            .as_str(),
        ),
    );
    c.insert("description".to_owned(), Value::from(description));
    if !read_only {
        c.insert("confirm".to_owned(), Value::Bool(true));
    }
    if let Some(title) = title {
        c.insert("title".to_owned(), Value::from(title));
    }
    if let Some(a) = &tool.annotations {
        let mut hints = Map::new();
        for (key, hint) in [
            ("readOnlyHint", a.read_only_hint),
            ("destructiveHint", a.destructive_hint),
            ("idempotentHint", a.idempotent_hint),
            ("openWorldHint", a.open_world_hint),
        ] {
            if let Some(hint) = hint {
                hints.insert(key.to_owned(), Value::Bool(hint));
            }
        }
        if !hints.is_empty() {
            c.insert("annotations".to_owned(), Value::Object(hints));
        }
    }
    let input = Value::Object(tool.input_schema.as_ref().clone());
    schema::compile(&input).map_err(|why| format!("its input schema {why}"))?;
    c.insert("inputSchema".to_owned(), input);
    let output = match &tool.output_schema {
        Some(schema) => {
            let schema = Value::Object(schema.as_ref().clone());
            let compiled =
                schema::compile(&schema).map_err(|why| format!("its output schema {why}"))?;
            c.insert("outputSchema".to_owned(), schema);
            Some(Arc::new(compiled))
        }
        None => None,
    };
    c.insert("tool".to_owned(), Value::from(tool.name.as_ref()));
    let capability = Value::Object(c);
    // The capability alone must make a manifest: its schemas within dk's
    // limits, every text plain.
    let alone = json!({
        "dk": 1, "id": id, "name": "check", "kind": KIND, "version": "0",
        "capabilities": [capability],
    });
    validate_manifest(&alone).map_err(|e| match e {
        dk_proto::ManifestError::BadExtension { field, why } => {
            let what = field.rsplit(' ').next().unwrap_or("manifest");
            format!("its {what} {why}")
        }
        other => other.to_string(),
    })?;
    Ok((capability, output))
}

/// The device's display name: the person's, else the server's own name
/// and version, else the id.
fn device_name(identity: &Identity, server: Option<&(String, String)>) -> String {
    let fits = |s: &str| plain(s) && !s.trim().is_empty() && utf16_len(s) <= limits::NAME;
    if let Some(name) = identity.name.as_deref().filter(|s| fits(s)) {
        return name.to_owned();
    }
    if let Some((name, version)) = server {
        let both = format!("{name} {version}");
        if fits(&both) {
            return both;
        }
        if fits(name) {
            return name.clone();
        }
    }
    identity.id.clone()
}

/// The description of `server_info`: the command, the server's own name
/// and version, and the tools left out with their reasons, as many as fit.
fn about(identity: &Identity, server: Option<&(String, String)>, left_out: &[LeftOut]) -> String {
    let max = limits::CAPABILITY_DESCRIPTION;
    let says = match server {
        Some((name, version)) => format!(", which says it is {} {}", shown(name), shown(version)),
        None => String::new(),
    };
    let mut command = shown(&identity.command);
    if utf16_len(&command) > 160 {
        command = command.chars().take(150).collect::<String>() + "...";
    }
    let mut text = format!("The MCP server `{command}`{says}, behind dk's bridge.");
    if utf16_len(&text) > 300 {
        text = "The MCP server behind dk's bridge (its command and name are too long to show here: call this capability).".to_owned();
    }
    if left_out.is_empty() {
        text.push_str(" Every tool it lists is carried.");
        return text;
    }
    text.push_str(" Left out:");
    for (i, out) in left_out.iter().enumerate() {
        let item = format!(" `{}` ({});", out.tool, out.why);
        let remaining = left_out.len() - i;
        let closing = format!(" and {remaining} more: call this capability to list them.");
        if utf16_len(&text) + utf16_len(&item) + utf16_len(&closing) > max {
            text.push_str(&closing);
            return text;
        }
        text.push_str(&item);
    }
    text
}

/// Whether `s` holds no character manifest text may not hold.
fn plain(s: &str) -> bool {
    !s.chars().any(is_unsafe_char)
}

/// `s` with new lines, carriage returns and tabs shown as spaces.
fn spaced(s: &str) -> String {
    s.chars()
        .map(|c| {
            if matches!(c, '\n' | '\r' | '\t') {
                ' '
            } else {
                c
            }
        })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// `s` as a name may be shown: characters that could hide or reorder
/// text written as escapes, a backtick as `'`, at most 64 characters.
pub(crate) fn shown(s: &str) -> String {
    shown_at_most(s, 64)
}

/// `s` as a message may be shown: [`shown`], at most 2,000 characters.
pub(crate) fn shown_long(s: &str) -> String {
    shown_at_most(s, 2000)
}

fn shown_at_most(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i >= max {
            out.push_str("...");
            break;
        }
        if is_unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else if c == '`' {
            out.push('\'');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests;
