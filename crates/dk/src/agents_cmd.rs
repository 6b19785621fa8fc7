//! `dk agents`: add, list, remove and re-scope the agents of a running
//! vessel, over its admin API. A new agent's credential is printed once.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{Value, json};

use crate::admin_cmd::{Target, at, ok, segment, text, with_client};

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

fn items(scope: &Value) -> String {
    let items: Vec<String> = scope.as_array().into_iter().flatten().map(text).collect();
    if items.is_empty() {
        "nothing".to_owned()
    } else {
        items.join(", ")
    }
}

/// Runs `dk agents`.
pub fn agents(target: &Target, command: Option<AgentsCommand>) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        let e = |e: dk_vessel::http::AdminClientError| e.to_string();
        match command.unwrap_or(AgentsCommand::List) {
            AgentsCommand::List => {
                let list = ok(c.get("/v1/agents").await.map_err(e)?)?;
                if json {
                    println!("{list}");
                    return Ok(());
                }
                let agents = list.as_array().cloned().unwrap_or_default();
                if agents.is_empty() {
                    println!("no agents");
                }
                for a in &agents {
                    println!(
                        "{} ({}); scope: {}",
                        text(at(a, "name")),
                        text(at(a, "role")),
                        items(at(a, "scope"))
                    );
                }
            }
            AgentsCommand::Add { name, scope, role } => {
                let added = ok(c
                    .post(
                        "/v1/agents",
                        &json!({"name": name, "scope": scope, "role": role}),
                    )
                    .await
                    .map_err(e)?)?;
                if json {
                    println!(
                        "{}",
                        json!({"name": at(&added, "name"), "credential": at(&added, "credential")})
                    );
                    return Ok(());
                }
                let credential = text(at(&added, "credential"));
                println!("added agent {}", text(at(&added, "name")));
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
                ok(c.send(
                    "PUT",
                    &format!("/v1/agents/{}/scope", segment(&name)),
                    Some(&json!({"scope": scope})),
                    &[],
                )
                .await
                .map_err(e)?)?;
                println!("agent {name} now sees: {}", items(&json!(scope)));
            }
        }
        Ok(())
    })
}
