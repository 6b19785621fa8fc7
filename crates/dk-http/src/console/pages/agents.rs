//! The agents page: each agent, adding one (its credential shown once)
//! and removing one.

use std::fmt::Write as _;

use dk_proto::admin as api;
use maud::PreEscaped;

use super::frame::{csrf_field, layout};
use super::{Added, Frame, utc};
use crate::console::html::{attr, own, segment, text};

/// The agents page: each agent with its scope and role, forms to change
/// the scope or remove it, a form to add one; after adding, the new
/// credential, shown this once, with the MCP configuration to paste.
pub(crate) fn agents(frame: &Frame, agents: &[api::Agent], added: Option<&Added>) -> String {
    let base = &frame.base;
    let mut main = String::from("<h1>Agents</h1>");
    if let Some(added) = added {
        let config = serde_json::json!({
            "mcpServers": {"dk": {
                "type": "http",
                "url": added.mcp_url,
                "headers": {"Authorization": format!("Bearer {}", added.credential)},
            }}
        });
        let config = serde_json::to_string_pretty(&config).unwrap_or_default();
        let _ = write!(
            main,
            "<section class=\"added\" aria-labelledby=\"added-title\"><h2 id=\"added-title\">{name} was added</h2>\
             <p>Its credential is shown this once: copy it now.</p>\
             <p><code id=\"credential\">{credential}</code> \
             <button type=\"button\" data-copy=\"credential\">Copy credential</button></p>\
             <p>An MCP client's configuration:</p><pre id=\"mcp-config\">{config}</pre>\
             <button type=\"button\" data-copy=\"mcp-config\">Copy configuration</button></section>",
            name = text(&added.name),
            credential = text(&added.credential),
            config = own(&config),
        );
    }
    if agents.is_empty() {
        main.push_str("<p>No agent may call tools yet.</p>");
    } else {
        main.push_str("<ul class=\"agents\">");
        for agent in agents {
            let scope = agent.scope.join(", ");
            let _ = write!(
                main,
                "<li><h2>{name}</h2><p>Role {role}, added {added}. Scope: {scope_text}</p>\
                 <form method=\"post\" action=\"{base}/agents/{href}/scope\">{csrf}\
                 <label for=\"scope-{id}\">Scope (devices, or device:capability, comma separated)</label>\
                 <input type=\"text\" name=\"scope\" id=\"scope-{id}\" value=\"{scope}\">\
                 <button type=\"submit\">Change scope</button></form>\
                 <form method=\"post\" action=\"{base}/agents/{href}/remove\" data-confirm=\"Remove agent {confirm}?\">{csrf}\
                 <button type=\"submit\" class=\"no\">Remove {name}</button></form></li>",
                name = text(&agent.name),
                role = text(agent.role.as_str()),
                added = utc(agent.added_at_ms),
                scope_text = if scope.is_empty() {
                    "nothing".to_owned()
                } else {
                    text(&scope)
                },
                href = segment(&agent.name),
                id = attr(&agent.name),
                scope = attr(&scope),
                confirm = attr(&agent.name),
                csrf = csrf_field(&frame.csrf).into_string(),
            );
        }
        main.push_str("</ul>");
    }
    let _ = write!(
        main,
        "<h2>Add an agent</h2><form method=\"post\" action=\"{base}/agents\" class=\"add\">{csrf}\
         <label for=\"new-name\">Name</label><input type=\"text\" name=\"name\" id=\"new-name\" required>\
         <label for=\"new-scope\">Scope (devices, or device:capability, comma separated)</label>\
         <input type=\"text\" name=\"scope\" id=\"new-scope\">\
         <label for=\"new-role\">Role</label><select name=\"role\" id=\"new-role\">\
         <option value=\"user\">user: sensors and actuators in scope</option>\
         <option value=\"guest\">guest: sensors only</option>\
         <option value=\"admin\">admin</option></select>\
         <button type=\"submit\">Add agent</button></form>",
        csrf = csrf_field(&frame.csrf).into_string()
    );
    layout(frame, "Agents", PreEscaped(main))
}
