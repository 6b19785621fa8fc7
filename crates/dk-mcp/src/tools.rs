//! The tools an agent sees over MCP: granted capabilities of paired
//! devices within its scope and role, under names MCP clients accept. The
//! handler lists them, the event log and the watches compare them.

use crate::adapter::ToolDefinition;
use crate::agents::Agent;
use crate::vessel::Vessel;

/// Longest tool name both MCP clients and OpenAI function calling take.
pub(crate) const MAX_TOOL_NAME: usize = 64;

/// Whether `name` matches `^[a-zA-Z0-9_-]{1,64}$`, the pattern MCP clients
/// and OpenAI function calling accept.
pub(crate) fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The tools `agent` sees: granted capabilities of paired devices within
/// its scope and role, sorted by name. A name the pattern refuses (it
/// cannot happen with valid manifests: ids of at most 24 and capability
/// names of at most 30 characters give at most 64) is left out.
pub(crate) fn visible_tools(vessel: &Vessel, agent: &Agent) -> Vec<ToolDefinition> {
    vessel
        .adapter()
        .tool_definitions()
        .into_iter()
        .filter(|t| agent.may_use(&t.device_id, &t.capability, t.read_only))
        .filter(|t| {
            let valid = valid_tool_name(&t.name);
            if !valid {
                tracing::warn!(tool = %t.name, "tool name not valid for MCP; left out");
            }
            valid
        })
        .collect()
}
