//! The rmcp server handler: one per MCP session (legacy `initialize`
//! clients) or per request (clients of the `server/discover` lifecycle).
//! It lists the agent's tools and event resources, runs calls through the
//! adapter with the person as approver, pages oversized results through
//! `read_more`, and tells the client when its lists change or a resource it
//! follows is updated.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use axum::http::request::Parts;
use dk_policy::{RunLimit, RunLimitsLayer};
use dk_proto::{MAX_RUN_ID, RUN_LIMITS_META_KEY, RUN_META_KEY, Refusal, parse_tool_name};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ResourceContents, ServerCapabilities, ServerConfig, SubscribeRequestParams,
    SubscriptionFilter, Tool, ToolAnnotations, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use tokio::task::JoinSet;

use super::audio::split_audio;
use super::events::{EventLog, device_of_uri, resource, visible_devices};
use super::guard::{Authenticated, IssuedSession};
use super::image::split_image;
use super::options::McpOptions;
use super::read_more::{Owner, READ_MORE_TOOL, ResultPages, read_more_tool};
use super::session::Hangup;
use super::tools::visible_tools;
use super::watch::{Followed, MAX_SUBSCRIPTIONS, Notifier, SessionWatch};
use crate::adapter::{CallContext, ENFORCED_RUN_LIMITS, RunRef, ToolDefinition, ToolOutcome};
use crate::agents::{Agent, AgentDirectory, AgentId};
use crate::vessel::Vessel;

/// The sentence that ends the description of a capability that asks the
/// person on every call.
pub(crate) const CONFIRM_SENTENCE: &str =
    "The person is asked to approve every call of this tool, and may say no.";

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

/// The refusal of a tool outside the agent's scope or role.
pub(crate) fn out_of_scope(tool: &str, agent: &AgentId) -> Refusal {
    Refusal::OutOfScope {
        tool: tool.to_owned(),
        agent: agent.to_string(),
    }
}

/// Whether `id` is a run id: 1 to 128 letters, digits, `.`, `_`, `:`, `-`.
fn valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RUN_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The run a `tools/call` names in its `_meta`: its id and run-level layer,
/// `None` when it names none, or the reason the call is refused.
fn run_of_meta(meta: &JsonObject) -> Result<Option<(String, RunLimitsLayer)>, Refusal> {
    let limits = meta.get(RUN_LIMITS_META_KEY).filter(|v| !v.is_null());
    let id = match meta.get(RUN_META_KEY).filter(|v| !v.is_null()) {
        None if limits.is_some() => return Err(Refusal::RunLimitsWithoutRun),
        None => return Ok(None),
        Some(Value::String(id)) if valid_run_id(id) => id.clone(),
        Some(_) => return Err(Refusal::BadRunId),
    };
    let Some(limits) = limits else {
        return Ok(Some((id, RunLimitsLayer::new())));
    };
    if let Some(limit) = limits
        .as_object()
        .into_iter()
        .flat_map(|table| table.keys())
        .filter_map(|name| RunLimit::from_name(name))
        .find(|limit| !ENFORCED_RUN_LIMITS.contains(limit))
    {
        return Err(Refusal::RunLimitNotEnforced {
            limit: limit.name(),
        });
    }
    let layer = RunLimitsLayer::from_json(limits)
        .map_err(|e| Refusal::BadRunLimits { why: e.to_string() })?;
    Ok(Some((id, layer)))
}

/// What every handler of one MCP server shares.
pub(crate) struct Shared {
    pub(crate) vessel: Arc<Vessel>,
    pub(crate) agents: Arc<AgentDirectory>,
    pub(crate) options: McpOptions,
    /// Oversized results, by `read_more` handle.
    pub(crate) pages: ResultPages,
    /// Recent device events, per device.
    pub(crate) events: Arc<EventLog>,
}

/// The handler for one session (or one stateless request).
pub(crate) struct DeviceTools {
    shared: Arc<Shared>,
    vessel: Arc<Vessel>,
    /// The agent that opened the session; later requests must be its own.
    owner: OnceLock<AgentId>,
    /// The session's id, once a request of the session carried it: its
    /// `read_more` handles are dropped with it. Never set on the handler of
    /// a request served without a session.
    session: OnceLock<String>,
    /// Made at `initialize`, started at `notifications/initialized`.
    pending_watch: Mutex<Option<SessionWatch>>,
    /// The devices whose event resources the session follows.
    followed: Followed,
    /// The session's watch task; aborted when the session ends and this
    /// handler is dropped.
    tasks: Mutex<JoinSet<()>>,
}

impl Drop for DeviceTools {
    fn drop(&mut self) {
        if let (Some(session), Some(agent)) = (self.session.get(), self.owner.get()) {
            self.shared.pages.forget_session(session, agent);
        }
    }
}

impl DeviceTools {
    pub(crate) fn new(shared: Arc<Shared>) -> DeviceTools {
        DeviceTools {
            vessel: Arc::clone(&shared.vessel),
            shared,
            owner: OnceLock::new(),
            session: OnceLock::new(),
            pending_watch: Mutex::new(None),
            followed: Followed::default(),
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

/// The request's session: one the server issued to the request's agent, as
/// the guard found it; never the `Mcp-Session-Id` header as sent, which a
/// request served without a session could make up to write a session of
/// its choosing in the audit log.
fn session_id(parts: Option<&Parts>) -> Option<String> {
    parts
        .and_then(|p| p.extensions.get::<IssuedSession>())
        .map(|IssuedSession(id)| id.clone())
}

/// The result of a call as MCP carries it: a refusal is a tool error whose
/// text is the reason; a device result is structured content (an object;
/// anything else is wrapped as `{"result": ...}`) and the same JSON as text,
/// or, when that JSON is longer than the threshold, its first chunk and a
/// `read_more` handle (see [`ResultPages`]). A result carrying an image (see
/// [`split_image`]) comes as that image's content first, then the rest as
/// above, with the image's data replaced by its length; so does each sound
/// of a result carrying dk-proto's audio content (see [`split_audio`]), as
/// MCP audio content.
pub(crate) fn call_result(
    outcome: ToolOutcome,
    pages: &ResultPages,
    owner: Owner,
    agent: &AgentId,
) -> CallToolResult {
    match outcome {
        ToolOutcome::Refused { reason } => CallToolResult::error(vec![ContentBlock::text(reason)]),
        ToolOutcome::Ok { result } => {
            let value = result
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
                .unwrap_or(Value::Null);
            let mut object = match value {
                Value::Object(object) => object,
                other => Map::from_iter([("result".to_owned(), other)]),
            };
            let sounds = split_audio(&mut object);
            let mut answer = match split_image(object) {
                Ok(image) => {
                    let mut answer = pages.result_for(Value::Object(image.described), owner, agent);
                    if answer.is_error != Some(true) {
                        answer
                            .content
                            .insert(0, ContentBlock::image(image.data, image.mime_type));
                    }
                    answer
                }
                Err(object) => pages.result_for(Value::Object(object), owner, agent),
            };
            if answer.is_error != Some(true) {
                for (at, sound) in sounds.into_iter().enumerate() {
                    answer
                        .content
                        .insert(at, ContentBlock::audio(sound.data, sound.mime_type));
                }
            }
            answer
        }
    }
}

/// Resolves when the client has given the request up: it cancelled it, or
/// its session or its exchange without one ended (rmcp cancels the
/// context's token), or, in a session, the connection its answer would go
/// out on closed (the session's [`Hangup`]).
async fn given_up(context: &RequestContext<RoleServer>) {
    match context.extensions.get::<Hangup>() {
        Some(hangup) => tokio::select! {
            () = context.ct.cancelled() => {}
            () = hangup.heard() => {}
        },
        None => context.ct.cancelled().await,
    }
}

/// The answer to a call its client gave up, which no one reads: a tool
/// error, since an error answer would be logged as a failure of the server.
fn abandoned() -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(
        "the call was abandoned by its client",
    )])
}

/// Who owns what this request makes: its session, or, without one, its agent.
fn owner_of(session: Option<&str>) -> Owner {
    match session {
        Some(id) => Owner::Session(id.to_owned()),
        None => Owner::Agent,
    }
}

/// The one answer for a resource that does not exist or that the agent
/// does not see, so it learns nothing of what lies outside its scope.
fn no_such_resource(uri: &str) -> ErrorData {
    let shown: String = uri.chars().take(200).collect();
    ErrorData::resource_not_found(format!("no resource `{shown}`"), None)
}

impl DeviceTools {
    /// Refuses a call outside the agent's scope or role, before policy, and
    /// records the decision. `None` when the call may go on to the adapter
    /// (which refuses names that do not resolve, after this check, so an
    /// agent cannot learn what lies outside its scope).
    async fn refuse_out_of_scope(
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
        let ctx = CallContext {
            agent_id: Some(&agent.id),
            session_id: session,
            ..CallContext::default()
        };
        let refusal = out_of_scope(tool, &agent.id);
        self.vessel
            .adapter()
            .report_refusal(tool, &refusal, &ctx)
            .await;
        Some(CallToolResult::error(vec![ContentBlock::text(
            refusal.to_string(),
        )]))
    }
}

impl DeviceTools {
    /// The agent of this request, which must be able to see `uri`; the
    /// device it names.
    fn visible_resource(&self, uri: &str, agent: &Agent) -> Result<String, ErrorData> {
        let device = device_of_uri(uri).ok_or_else(|| no_such_resource(uri))?;
        if visible_devices(&self.vessel, agent).contains(device) {
            Ok(device.to_owned())
        } else {
            Err(no_such_resource(uri))
        }
    }

    fn watch(&self, agent: &AgentId, followed: Followed) -> Option<SessionWatch> {
        SessionWatch::new(
            Arc::clone(&self.vessel),
            Arc::clone(&self.shared.agents),
            &self.shared.events,
            agent,
            followed,
        )
    }
}

impl ServerHandler for DeviceTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_resources_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("dk-vessel", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Tools are the capabilities of devices the person paired and allowed. \
             Some calls wait for the person's yes; a refusal says why. A result too \
             large to return at once comes in chunks: call read_more for the rest. \
             Each device's recent events are a resource you can read and subscribe to.",
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
            .unwrap_or_else(PoisonError::into_inner) =
            self.watch(&agent.id, Arc::clone(&self.followed));
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
            let notifier = Notifier::Session(context.peer.clone());
            let interval = self.shared.options.event_update_interval;
            self.tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .spawn(watch.run(notifier, interval));
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let agent = self.agent(parts(&context.extensions))?;
        let mut tools: Vec<Tool> = visible_tools(&self.vessel, &agent)
            .into_iter()
            .map(mcp_tool)
            .collect();
        tools.push(read_more_tool());
        tools.sort_by(|a, b| a.name.cmp(&b.name));
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
        // Only a session's own handler (made by `initialize`, which set the
        // owner) goes with the session; a request served without a session
        // may still name one of its agent's sessions.
        if let (Some(id), Some(_)) = (&session, self.owner.get()) {
            let _ = self.session.set(id.clone());
        }
        let owner = owner_of(session.as_deref());
        if request.name == READ_MORE_TOOL {
            let arguments = request.arguments.unwrap_or_default();
            return Ok(self
                .shared
                .pages
                .read_more(&arguments, &owner, &agent.id)
                .into());
        }
        let input = Value::Object(request.arguments.unwrap_or_default());
        if let Some(refusal) = self
            .refuse_out_of_scope(&request.name, &agent, session.as_deref())
            .await
        {
            return Ok(refusal.into());
        }
        // The run the call names, if any: in the request's `_meta` as rmcp
        // hands it over (moved to the context), or still in the params.
        let meta = request
            .meta
            .as_ref()
            .filter(|meta| {
                meta.contains_key(RUN_META_KEY) || meta.contains_key(RUN_LIMITS_META_KEY)
            })
            .unwrap_or(&context.meta);
        let run = match run_of_meta(meta) {
            Ok(run) => run,
            Err(refusal) => {
                let ctx = CallContext {
                    agent_id: Some(&agent.id),
                    session_id: session.as_deref(),
                    ..CallContext::default()
                };
                self.vessel
                    .adapter()
                    .report_refusal(&request.name, &refusal, &ctx)
                    .await;
                let reason = refusal.to_string();
                return Ok(CallToolResult::error(vec![ContentBlock::text(reason)]).into());
            }
        };
        let ctx = CallContext {
            agent_id: Some(&agent.id),
            session_id: session.as_deref(),
            // Always the person, never the calling client: no sampling or
            // elicitation can answer for them.
            approver: Some(self.vessel.person().as_ref()),
            timeout: None,
            // Read again after the person's yes: an agent removed or
            // re-scoped meanwhile does not get the call made.
            agent_gate: Some(self.shared.agents.as_ref()),
            by_person: false,
            run: run
                .as_ref()
                .map(|(id, limits)| RunRef::new(id).with_limits(*limits)),
        };
        // A call its client gives up is dropped there and then: the adapter
        // records it as abandoned and the person's prompt is withdrawn, so
        // no later yes runs it.
        let call = self.vessel.adapter().execute(&request.name, input, ctx);
        let outcome = tokio::select! {
            biased;
            outcome = call => outcome,
            () = given_up(&context) => return Ok(abandoned().into()),
        };
        Ok(call_result(outcome, &self.shared.pages, owner, &agent.id).into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let agent = self.agent(parts(&context.extensions))?;
        let per_device = self.shared.options.events_per_device;
        let resources = visible_devices(&self.vessel, &agent)
            .iter()
            .map(|device| resource(&self.vessel, device, per_device))
            .collect();
        Ok(ListResourcesResult::with_all_items(resources)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let agent = self.agent(parts(&context.extensions))?;
        let device = self.visible_resource(&request.uri, &agent)?;
        let contents = self.shared.events.contents(&self.vessel, &agent, &device);
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(contents.to_string(), request.uri)
                .with_mime_type("application/json"),
        ])
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private)
        .into())
    }

    // Legacy-only in rmcp: `initialize` clients subscribe this way;
    // discover-lifecycle clients name URIs in `subscriptions/listen`.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let agent = self.agent(parts(&context.extensions))?;
        let device = self.visible_resource(&request.uri, &agent)?;
        let mut followed = self.followed.lock().unwrap_or_else(PoisonError::into_inner);
        if followed.len() >= MAX_SUBSCRIPTIONS && !followed.contains(&device) {
            return Err(ErrorData::invalid_request(
                format!("a session follows at most {MAX_SUBSCRIPTIONS} resources"),
                None,
            ));
        }
        followed.insert(device);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.agent(parts(&context.extensions))?;
        if let Some(device) = device_of_uri(&request.uri) {
            self.followed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(device);
        }
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        accepted.resources_list_changed = requested.resources_list_changed;
        // Any well-formed event URI: whether the agent sees the device is
        // checked at every event, so accepting one tells nothing.
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|uri| device_of_uri(uri).is_some())
                .take(MAX_SUBSCRIPTIONS)
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let agent = self.agent(parts(&context.request_context().extensions))?;
        let followed: BTreeSet<String> = context
            .accepted()
            .resource_subscriptions
            .iter()
            .flatten()
            .filter_map(|uri| device_of_uri(uri).map(str::to_owned))
            .collect();
        let Some(watch) = self.watch(&agent.id, Arc::new(Mutex::new(followed))) else {
            return Ok(());
        };
        let notifier = Notifier::Listen(context.sink().clone());
        let interval = self.shared.options.event_update_interval;
        tokio::select! {
            // The client hung up, which is how a listen normally ends. rmcp
            // still sends the final answer into the closed stream and logs
            // that at ERROR; `dk`'s logger leaves those events out.
            () = context.cancelled() => {}
            () = watch.run(notifier, interval) => {}
        }
        Ok(())
    }
}
