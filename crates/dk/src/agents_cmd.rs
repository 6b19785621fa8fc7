//! `dk agents`: add, list, remove and re-scope the agents of a running
//! vessel, over its admin API. A new agent's credential is printed once.

use std::process::ExitCode;

use clap::Subcommand;
use dk_proto::admin as api;
use serde_json::json;

use crate::admin_cmd::{Target, joined, ok, ok_as, print_list, segment, with_client};
use crate::input::{print_json, printable};

/// `dk agents`.
#[derive(Subcommand)]
pub enum AgentsCommand {
    /// List agents with their scope and role (the default); never a
    /// credential.
    List,
    /// Add an agent and print its credential, once.
    Add {
        /// The agent's name: 1 to 32 lower-case letters, digits and single
        /// `-`.
        name: String,
        /// What it may see, comma separated: `*` for every device, `DEVICE`,
        /// or `DEVICE:CAPABILITY`. Without it the agent sees nothing.
        #[arg(long, value_delimiter = ',')]
        scope: Vec<String>,
        /// `guest` (sensors only), `user` or `admin`.
        #[arg(long, default_value = "user")]
        role: String,
    },
    /// Remove an agent: its credential stops working.
    Remove {
        /// The agent's name.
        name: String,
    },
    /// Replace an agent's scope.
    Scope {
        /// The agent's name.
        name: String,
        /// The new scope, comma separated (as for `add`).
        #[arg(long, value_delimiter = ',', required = true)]
        scope: Vec<String>,
    },
}

/// Runs `dk agents`.
pub fn agents(target: &Target, command: Option<AgentsCommand>) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        let e = |e: dk_http::AdminClientError| e.to_string();
        match command.unwrap_or(AgentsCommand::List) {
            AgentsCommand::List => {
                let list = ok(c.get("/v1/agents").await.map_err(e)?)?;
                print_list(json, &list, "no agents", None, |a: &api::Agent| {
                    println!(
                        "{} ({}); scope: {}",
                        printable(&a.name),
                        a.role.as_str(),
                        joined(&a.scope)
                    );
                })?;
            }
            AgentsCommand::Add { name, scope, role } => {
                let new = api::NewAgent {
                    name,
                    scope,
                    role: Some(api::Named::from_name(role)),
                };
                let added: api::AddedAgent = ok_as(c.post("/v1/agents", &new).await.map_err(e)?)?;
                if json {
                    print_json(&json!(added));
                    return Ok(());
                }
                let credential = printable(&added.credential);
                println!("added agent {}", printable(&added.name));
                println!("credential: {credential}");
                println!(
                    "This credential will not be shown again: put it in the agent's MCP client configuration now."
                );
            }
            AgentsCommand::Remove { name } => {
                ok(c.delete(&format!("/v1/agents/{}", segment(&name)))
                    .await
                    .map_err(e)?)?;
                println!("removed agent {name}; its credential no longer works");
            }
            AgentsCommand::Scope { name, scope } => {
                let path = format!("/v1/agents/{}/scope", segment(&name));
                let new = api::NewScope { scope };
                ok(c.put_body(&path, &new).await.map_err(e)?)?;
                println!("agent {name} now sees: {}", joined(&new.scope));
            }
        }
        Ok(())
    })
}
