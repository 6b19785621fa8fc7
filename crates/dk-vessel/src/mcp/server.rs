//! The rmcp server handler: one per MCP session (legacy `initialize`
//! clients) or per request (clients of the `server/discover` lifecycle).
//! It lists the agent's tools, runs calls through the adapter with the
//! person as approver, and tells the client when its tool list changes.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use axum::http::request::Parts;
use dk_proto::parse_tool_name;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
    ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;

use super::guard::Authenticated;
use crate::adapter::{CallContext, DecisionRecord, ToolDefinition, ToolOutcome};
use crate::agents::{Agent, AgentDirectory, AgentEvent, AgentId};
use crate::vessel::Vessel;

/// The header that carries the MCP session id on every request after
/// `initialize`.
const SESSION_HEADER: &str = "mcp-session-id";

/// The sentence that ends the description of a capability that asks the
/// person on every call.
pub(crate) const CONFIRM_SENTENCE: &str =
    "The person is asked to approve every call of this tool, and may say no.";

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

/// The MCP form of a tool definition, with annotations from the approved
/// manifest.
pub(crate) fn mcp_tool(definition: ToolDefinition) -> Tool {
    let schema: JsonObject = match definition.parameters {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let description = if definition.confirm {
        format!("{} {CONFIRM_SENTENCE}", definition.description)
    } else {
        definition.description
    };
    let annotations = if definition.read_only {
        ToolAnnotations::new().read_only(true).destructive(false)
    } else {
        ToolAnnotations::new().read_only(false)
    };
    Tool::new(definition.name, description, Arc::new(schema)).with_annotations(annotations)
}

/// The reason given for a tool outside the agent's scope or role.
pub(crate) fn out_of_scope_reason(tool: &str, agent: &AgentId) -> String {
    format!("[8dk-deny] \"{tool}\" is not in the scope of agent \"{agent}\"")
}

/// The handler for one session (or one stateless request).
pub(crate) struct DeviceTools {
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    /// The agent that opened the session; later requests must be its own.
    owner: OnceLock<AgentId>,
    /// Made at `initialize`, started at `notifications/initialized`.
    pending_watch: Mutex<Option<ListWatch>>,
    /// The session's list-changed task; aborted when the session ends and
    /// this handler is dropped.
    tasks: Mutex<JoinSet<()>>,
}

impl DeviceTools {
    pub(crate) fn new(vessel: Arc<Vessel>, agents: Arc<AgentDirectory>) -> DeviceTools {
        DeviceTools {
            vessel,
            agents,
            owner: OnceLock::new(),
            pending_watch: Mutex::new(None),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// The authenticated agent of this request, which must own the session.
    fn agent(&self, parts: Option<&Parts>) -> Result<Agent, ErrorData> {
        let Some(Authenticated(agent)) = parts.and_then(|p| p.extensions.get::<Authenticated>())
        else {
            return Err(ErrorData::invalid_request(
                "a valid agent credential is required",
                None,
            ));
        };
        match self.owner.get() {
            Some(owner) if owner != &agent.id => Err(ErrorData::invalid_request(
                "this MCP session belongs to another agent",
                None,
            )),
            _ => Ok(agent.clone()),
        }
    }
}

fn parts(extensions: &rmcp::model::Extensions) -> Option<&Parts> {
    extensions.get::<Parts>()
}

fn session_id(parts: Option<&Parts>) -> Option<String> {
    parts
        .and_then(|p| p.headers.get(SESSION_HEADER))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The result of a call as MCP carries it: a refusal is a tool error whose
/// text is the reason; a device result is structured content (an object;
/// anything else is wrapped as `{"result": ...}`) and the same JSON as text.
pub(crate) fn call_result(outcome: ToolOutcome) -> CallToolResult {
    match outcome {
        ToolOutcome::Refused { reason } => CallToolResult::error(vec![ContentBlock::text(reason)]),
        ToolOutcome::Ok { result } => {
            let value = result
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
                .unwrap_or(Value::Null);
            let object = match value {
                Value::Object(_) => value,
                other => json!({ "result": other }),
            };
            CallToolResult::structured(object)
        }
    }
}

impl DeviceTools {
    /// Refuses a call outside the agent's scope or role, before policy, and
    /// records the decision. `None` when the call may go on to the adapter
    /// (which refuses names that do not resolve, after this check, so an
    /// agent cannot learn what lies outside its scope).
    fn refuse_out_of_scope(
        &self,
        tool: &str,
        agent: &Agent,
        session: Option<&str>,
    ) -> Option<CallToolResult> {
        let parsed = parse_tool_name(tool)?;
        let (device_id, capability) = (parsed.device_id.as_str(), parsed.capability);
        let read_only = self
            .vessel
            .registry()
            .get_with_grant(device_id, capability)
            .and_then(|(device, _)| {
                device
                    .manifest()
                    .capability(capability)
                    .map(|c| c.kind() == dk_proto::CapabilityKind::Sensor)
            })
            // Unknown capabilities are refused by the adapter; a guest may
            // reach that refusal only inside its scope.
            .unwrap_or(true);
        if agent.may_use(device_id, capability, read_only) {
            return None;
        }
        let reason = out_of_scope_reason(tool, &agent.id);
        let record = DecisionRecord {
            tool,
            device_id: Some(device_id),
            capability: Some(capability),
            allowed: false,
            reason: &reason,
            agent_id: Some(&agent.id),
            session_id: session,
            rule: None,
            input: None,
        };
        // The input is not kept: it never came near a device, and only the
        // adapter's path knows every secret to take out of it.
        if let Ok(entry) = serde_json::to_value(&record) {
            self.vessel.audit("decision", entry);
        }
        Some(CallToolResult::error(vec![ContentBlock::text(reason)]))
    }
}

impl ServerHandler for DeviceTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("dk-vessel", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Tools are the capabilities of devices the person paired and allowed. \
             Some calls wait for the person's yes; a refusal says why.",
        )
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let agent = self.agent(parts(&context.extensions))?;
        let _ = self.owner.set(agent.id.clone());
        *self
            .pending_watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(ListWatch::new(
            Arc::clone(&self.vessel),
            Arc::clone(&self.agents),
            agent.id,
        ));
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let watch = self
            .pending_watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(watch) = watch {
            let peer = context.peer.clone();
            self.tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .spawn(async move {
                    watch
                        .run(|| {
                            let peer = peer.clone();
                            async move { peer.notify_tool_list_changed().await.is_ok() }
                        })
                        .await;
                });
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let agent = self.agent(parts(&context.extensions))?;
        let tools = visible_tools(&self.vessel, &agent)
            .into_iter()
            .map(mcp_tool)
            .collect();
        // The list is the agent's own and changes with grants: not to be
        // shared, not to be kept.
        Ok(ListToolsResult::with_all_items(tools)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = parts(&context.extensions);
        let agent = self.agent(parts)?;
        let session = session_id(parts);
        let input = Value::Object(request.arguments.unwrap_or_default());
        if let Some(refusal) = self.refuse_out_of_scope(&request.name, &agent, session.as_deref()) {
            return Ok(refusal.into());
        }
        let ctx = CallContext {
            agent_id: Some(&agent.id),
            session_id: session.as_deref(),
            // Always the person, never the calling client: no sampling or
            // elicitation can answer for them.
            approver: Some(self.vessel.person().as_ref()),
            timeout: None,
        };
        let outcome = self
            .vessel
            .adapter()
            .execute(&request.name, input, ctx)
            .await;
        Ok(call_result(outcome).into())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let agent = self.agent(parts(&context.request_context().extensions))?;
        let watch = ListWatch::new(Arc::clone(&self.vessel), Arc::clone(&self.agents), agent.id);
        let sink = context.sink().clone();
        tokio::select! {
            () = context.cancelled() => {}
            () = watch.run(|| {
                let sink = sink.clone();
                async move { sink.notify_tool_list_changed().await.is_ok() }
            }) => {}
        }
        Ok(())
    }
}

/// Watches what changes an agent's tool list: registry events (pair,
/// unpair, grant, revoke) and agent changes. After each, the agent's list
/// is computed again and the client is told only when it differs.
pub(crate) struct ListWatch {
    vessel: Arc<Vessel>,
    agents: Arc<AgentDirectory>,
    agent: AgentId,
    registry_events: tokio::sync::broadcast::Receiver<crate::registry::RegistryEvent>,
    agent_events: tokio::sync::broadcast::Receiver<AgentEvent>,
    last: Vec<ToolDefinition>,
}

impl ListWatch {
    /// Subscribes now, so nothing after this point is missed.
    pub(crate) fn new(
        vessel: Arc<Vessel>,
        agents: Arc<AgentDirectory>,
        agent: AgentId,
    ) -> ListWatch {
        let registry_events = vessel.registry().subscribe();
        let agent_events = agents.subscribe();
        let last = agents
            .get(&agent)
            .map(|a| visible_tools(&vessel, &a))
            .unwrap_or_default();
        ListWatch {
            vessel,
            agents,
            agent,
            registry_events,
            agent_events,
            last,
        }
    }

    /// Runs until the agent is removed, an event source closes, or `notify`
    /// says the client is gone.
    pub(crate) async fn run<F, Fut>(mut self, notify: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        while self.next_change().await {
            if !notify().await {
                return;
            }
        }
    }

    /// Waits for events until the agent's list differs from the last one
    /// (true), or the watch is over (false).
    pub(crate) async fn next_change(&mut self) -> bool {
        loop {
            let open = tokio::select! {
                event = self.registry_events.recv() => !matches!(event, Err(RecvError::Closed)),
                event = self.agent_events.recv() => match event {
                    Ok(AgentEvent::Removed { id }) if id == self.agent => false,
                    Err(RecvError::Closed) => false,
                    _ => true,
                },
            };
            if !open {
                return false;
            }
            let Some(agent) = self.agents.get(&self.agent) else {
                return false;
            };
            let now = visible_tools(&self.vessel, &agent);
            if now != self.last {
                self.last = now;
                return true;
            }
        }
    }

    /// The list as last seen.
    #[cfg(test)]
    pub(crate) fn last(&self) -> &[ToolDefinition] {
        &self.last
    }
}
