//! The agents page: each agent, adding one (its credential shown once)
//! and removing one.

use dk_proto::admin as api;
use maud::{PreEscaped, html};
use serde::Serialize;

use super::frame::{csrf_field, layout};
use super::shared::{Added, Frame, utc};
use crate::console::html::{Attr, Text, own, segment};

/// An MCP client's configuration naming this vessel's MCP server as `dk`
/// (the `mcpServers` file MCP clients read).
#[derive(Serialize)]
struct McpClientConfig<'a> {
    #[serde(rename = "mcpServers")]
    mcp_servers: McpServers<'a>,
}

/// The servers of [`McpClientConfig`]: this vessel's alone.
#[derive(Serialize)]
struct McpServers<'a> {
    dk: McpServer<'a>,
}

/// One MCP server: over streamable HTTP at `url`, with the agent's bearer.
#[derive(Serialize)]
struct McpServer<'a> {
    #[serde(rename = "type")]
    transport: &'static str,
    url: &'a str,
    headers: McpHeaders,
}

/// The headers an MCP client sends with each request.
#[derive(Serialize)]
struct McpHeaders {
    #[serde(rename = "Authorization")]
    authorization: String,
}

/// The agents page: each agent with its scope and role, forms to change
/// the scope or remove it, a form to add one; after adding, the new
/// credential, shown this once, with the MCP configuration to paste.
pub(crate) fn agents(frame: &Frame, agents: &[api::Agent], added: Option<&Added>) -> String {
    let base = &frame.base;
    let config = added.map(|added| {
        let config = McpClientConfig {
            mcp_servers: McpServers {
                dk: McpServer {
                    transport: "http",
                    url: &added.mcp_url,
                    headers: McpHeaders {
                        authorization: format!("Bearer {}", added.credential),
                    },
                },
            },
        };
        serde_json::to_string_pretty(&config).unwrap_or_default()
    });
    let main = html! {
        h1 { "Agents" }
        @if let (Some(added), Some(config)) = (added, &config) {
            section class="added" aria-labelledby="added-title" {
                h2 id="added-title" { (Text(&added.name)) " was added" }
                p { "Its credential is shown this once: copy it now." }
                p {
                    code id="credential" { (Text(&added.credential)) }
                    " "
                    button type="button" data-copy="credential" { "Copy credential" }
                }
                p { "An MCP client's configuration:" }
                // The console's own JSON, as it made it (so what is
                // copied is exactly that), markup escaped.
                pre id="mcp-config" { (PreEscaped(own(config))) }
                button type="button" data-copy="mcp-config" { "Copy configuration" }
            }
        }
        @if agents.is_empty() {
            p { "No agent may call tools yet." }
        } @else {
            ul class="agents" {
                @for agent in agents {
                    @let scope = agent.scope.join(", ");
                    @let href = segment(&agent.name);
                    li {
                        h2 { (Text(&agent.name)) }
                        p {
                            "Role " (Text(agent.role.as_str())) ", added " (utc(agent.added_at_ms))
                            ". Scope: "
                            @if scope.is_empty() { "nothing" } @else { (Text(&scope)) }
                        }
                        form method="post" action={ (base) "/agents/" (href) "/scope" } {
                            (csrf_field(&frame.csrf))
                            label for={ "scope-" (Attr(&agent.name)) } {
                                "Scope (devices, or device:capability, comma separated)"
                            }
                            input type="text" name="scope" id={ "scope-" (Attr(&agent.name)) } value=(Attr(&scope));
                            button type="submit" { "Change scope" }
                        }
                        form method="post" action={ (base) "/agents/" (href) "/remove" }
                            data-confirm={ "Remove agent " (Attr(&agent.name)) "?" } {
                            (csrf_field(&frame.csrf))
                            button type="submit" class="no" { "Remove " (Text(&agent.name)) }
                        }
                    }
                }
            }
        }
        h2 { "Add an agent" }
        form method="post" action={ (base) "/agents" } class="add" {
            (csrf_field(&frame.csrf))
            label for="new-name" { "Name" }
            input type="text" name="name" id="new-name" required;
            label for="new-scope" { "Scope (devices, or device:capability, comma separated)" }
            input type="text" name="scope" id="new-scope";
            label for="new-role" { "Role" }
            select name="role" id="new-role" {
                option value="user" { "user: sensors and actuators in scope" }
                option value="guest" { "guest: sensors only" }
                option value="admin" { "admin" }
            }
            button type="submit" { "Add agent" }
        }
    };
    layout(frame, "Agents", main)
}
