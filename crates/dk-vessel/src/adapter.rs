//! The tool adapter: every granted capability of a paired device becomes a
//! tool, and every call passes the same ordered checks before the device
//! sees it.
//!
//! 1. the name resolves to a paired device and one of its capabilities
//! 2. the person granted it (no rule lifts this)
//! 3. `device_use` rules (shadow agents are always refused)
//! 4. the input matches the capability's params
//!
//!    then the calling agent's rate ([`AgentRateLimits`]) and the run the
//!    call names ([`AgentRunLimits`]) are charged: a call over either is
//!    refused before the person is asked
//! 5. the person says yes, when a rule or the capability asks for it
//! 6. after that wait, still the same pairing and still granted
//! 7. connected, and answering within the timeout
//!
//! Each call produces exactly one [`DecisionRecord`], allowed or not. The
//! reason texts are 8DK v1's, so hosts written against 8DK keep working.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use dk_policy::{Decision, DeviceUseContext, InputError, PolicySet, RunLimits, RunLimitsLayer};
use dk_proto::{check_input, parse_tool_name, tool_name};
use futures::future::BoxFuture;
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::link::Links;
use crate::registry::DeviceRegistry;

mod budget;
mod rate;

pub(crate) use budget::ENFORCED_RUN_LIMITS;
use budget::Meter;
pub use budget::{
    AgentRunLimits, DEFAULT_MAX_TRACKED_RUNS, DEFAULT_RUN_IDLE_EXPIRY, RunClock, RunRef,
};
pub use rate::{
    AgentRateLimits, DEFAULT_AGENT_RATE, DEFAULT_DEVICE_RATE, DEFAULT_MAX_TRACKED_BUCKETS,
    RateLimit,
};

/// How long a call waits for the device by default (10 s).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A tool definition in the OpenAI function shape that 8DK emits.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// `device__<id>__<capability>`.
    pub name: String,
    /// `[DEVICE <name> (<kind>) <capability kind>] <description>`.
    pub description: String,
    /// JSON Schema of the input: an object of the declared params.
    pub parameters: Value,
    /// The device the tool calls.
    pub device_id: String,
    /// The capability it calls.
    pub capability: String,
    /// Whether the capability only reads (a sensor).
    pub read_only: bool,
    /// Whether the person is asked on every call.
    pub confirm: bool,
}

impl Serialize for ToolDefinition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &json!({"name": self.name, "description": self.description, "parameters": self.parameters}),
        )?;
        map.end()
    }
}

/// The outcome of a call, as 8DK returns it: `{ok:true, result}` or `{ok:false, reason}`.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    /// The device answered.
    Ok {
        /// Its result, when it sent one.
        result: Option<Box<RawValue>>,
    },
    /// The call was refused, or the device failed.
    Refused {
        /// Why, in 8DK's words.
        reason: String,
    },
}

impl ToolOutcome {
    /// Whether the device answered with success.
    pub fn is_ok(&self) -> bool {
        matches!(self, ToolOutcome::Ok { .. })
    }

    /// The refusal reason, if refused.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ToolOutcome::Ok { .. } => None,
            ToolOutcome::Refused { reason } => Some(reason),
        }
    }

    /// The result as a JSON value (`None` when refused or absent).
    pub fn result_value(&self) -> Option<Value> {
        match self {
            ToolOutcome::Ok { result: Some(raw) } => serde_json::from_str(raw.get()).ok(),
            _ => None,
        }
    }
}

impl Serialize for ToolOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        match self {
            ToolOutcome::Ok { result } => {
                map.serialize_entry("ok", &true)?;
                if let Some(result) = result {
                    map.serialize_entry("result", result)?;
                }
            }
            ToolOutcome::Refused { reason } => {
                map.serialize_entry("ok", &false)?;
                map.serialize_entry("reason", reason)?;
            }
        }
        map.end()
    }
}

/// One call's decision, for the audit log. `rule` names the `device_use`
/// rule that blocked the call or asked the person, when one did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord<'a> {
    /// The tool name as the agent gave it.
    pub tool: &'a str,
    /// The device id, when the name parsed.
    pub device_id: Option<&'a str>,
    /// The capability, when the name parsed.
    pub capability: Option<&'a str>,
    /// Whether the call reached the device.
    pub allowed: bool,
    /// `allowed`, or why not (the same text the agent sees).
    pub reason: &'a str,
    /// The calling agent.
    pub agent_id: Option<&'a str>,
    /// The calling session.
    pub session_id: Option<&'a str>,
    /// The rule that decided, if any.
    pub rule: Option<&'a str>,
    /// The call's input as the agent gave it (for the audit log, which
    /// redacts and cuts it; not part of 8DK's record).
    #[serde(skip)]
    pub input: Option<&'a Value>,
}

/// What the person is shown when a call needs a yes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The tool called.
    pub tool: String,
    /// The device.
    pub device_id: String,
    /// The capability.
    pub capability: String,
    /// Exactly the input that will be sent, already validated.
    pub input: Map<String, Value>,
    /// Why the person is asked.
    pub reason: String,
    /// The calling agent, when the call names one: the person sees who
    /// asks, and the person channel bounds what one agent keeps waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// Asks the person. An error counts as a no, and says why the person was
/// not asked (it is the refusal's reason).
pub trait Approver: Send + Sync {
    /// Returns `Ok(true)` for a yes.
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, String>>;
}

/// An [`Approver`] from a closure returning a future.
pub struct ApproverFn<F>(pub F);

impl<F, Fut> Approver for ApproverFn<F>
where
    F: Fn(ApprovalRequest) -> Fut + Send + Sync,
    Fut: Future<Output = Result<bool, String>> + Send + 'static,
{
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin((self.0)(request))
    }
}

/// Who is calling, and how: the context of one call.
#[derive(Clone, Copy, Default)]
pub struct CallContext<'a> {
    /// The calling agent (`__shadow__` marks a shadow candidate).
    pub agent_id: Option<&'a str>,
    /// The calling session.
    pub session_id: Option<&'a str>,
    /// Who to ask when the person must say yes; none means no.
    pub approver: Option<&'a dyn Approver>,
    /// How long to wait for the device; the adapter's call timeout
    /// ([`DEFAULT_CALL_TIMEOUT`] unless set) when unset.
    pub timeout: Option<Duration>,
    /// The run the call belongs to, charged to that run's budget; none
    /// charges no run (only the agent's rate).
    pub run: Option<RunRef<'a>>,
}

impl fmt::Debug for CallContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallContext")
            .field("agent_id", &self.agent_id)
            .field("session_id", &self.session_id)
            .field("approver", &self.approver.is_some())
            .field("timeout", &self.timeout)
            .field("run", &self.run)
            .finish()
    }
}

/// Receives one [`DecisionRecord`] per call.
pub type DecisionHook = Arc<dyn Fn(&DecisionRecord<'_>) + Send + Sync>;

/// Turns granted capabilities into tools and runs calls through the checks.
pub struct DeviceToolAdapter {
    registry: Arc<DeviceRegistry>,
    links: Arc<Links>,
    policies: RwLock<Arc<PolicySet>>,
    on_decision: Option<DecisionHook>,
    meter: Meter,
    call_timeout: Duration,
}

impl fmt::Debug for DeviceToolAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceToolAdapter")
            .field("registry", &self.registry)
            .field("links", &self.links)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

impl DeviceToolAdapter {
    /// An adapter over `registry` and `links` with no rules.
    pub fn new(registry: Arc<DeviceRegistry>, links: Arc<Links>) -> DeviceToolAdapter {
        DeviceToolAdapter {
            registry,
            links,
            policies: RwLock::new(Arc::new(PolicySet::empty())),
            on_decision: None,
            meter: Meter::new(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// Waits `timeout` for a device's answer when a call's context sets no
    /// timeout of its own (default [`DEFAULT_CALL_TIMEOUT`]).
    pub fn with_call_timeout(mut self, timeout: Duration) -> DeviceToolAdapter {
        self.call_timeout = timeout;
        self
    }

    /// Charges the device calls of explicit runs to their run budgets, as
    /// `limits` says (without this, no run is charged).
    pub fn with_run_limits(mut self, limits: AgentRunLimits) -> DeviceToolAdapter {
        self.meter.set_run_limits(limits);
        self
    }

    /// Charges every agent's device calls to its rate limits, as `limits`
    /// says (without this, no rate is charged).
    pub fn with_rate_limits(mut self, limits: AgentRateLimits) -> DeviceToolAdapter {
        self.meter.set_rate_limits(limits);
        self
    }

    /// Reads the time of rate limits and run budgets from `clock`
    /// (milliseconds from any fixed start) rather than the monotonic clock.
    pub fn with_run_clock(self, clock: RunClock) -> DeviceToolAdapter {
        self.set_run_clock(clock);
        self
    }

    /// Reads the time of rate limits and run budgets from `clock` from now
    /// on, for an adapter already in use (a vessel's).
    pub fn set_run_clock(&self, clock: RunClock) {
        self.meter.set_clock(clock);
    }

    /// The run limits in force, if runs are charged.
    pub fn run_limits(&self) -> Option<&AgentRunLimits> {
        self.meter.run_limits()
    }

    /// The rate limits in force, if agents' rates are charged.
    pub fn rate_limits(&self) -> Option<&AgentRateLimits> {
        self.meter.rate_limits()
    }

    /// Starts (or restarts, with a fresh count) `agent_id`'s run `run_id`,
    /// its budget the agent-level one narrowed by `run_level` (a run-level
    /// layer only narrows: asking for more than the agent has gets the
    /// agent's value). Calls naming the run ([`CallContext::run`]) are
    /// charged to it; a run a call names without this starts at that call.
    /// Returns the budget, or `None` when runs are not charged.
    pub fn start_run(
        &self,
        agent_id: Option<&str>,
        run_id: &str,
        run_level: &RunLimitsLayer,
    ) -> Result<Option<RunLimits>, InputError> {
        self.meter.start_run(agent_id, run_id, run_level)
    }

    /// Runs whose budgets are tracked now (bounded by
    /// [`AgentRunLimits::max_tracked_runs`]).
    pub fn tracked_runs(&self) -> usize {
        self.meter.tracked_runs()
    }

    /// Rate-limit buckets tracked now: only those not full (bounded by
    /// [`AgentRateLimits::max_tracked`]).
    pub fn tracked_rate_buckets(&self) -> usize {
        self.meter.tracked_rate_buckets()
    }

    /// Uses `policies` for check 3.
    pub fn with_policies(self, policies: Arc<PolicySet>) -> DeviceToolAdapter {
        self.set_policies(policies);
        self
    }

    /// Sends every decision to `hook`.
    pub fn with_decision_hook(mut self, hook: DecisionHook) -> DeviceToolAdapter {
        self.on_decision = Some(hook);
        self
    }

    /// Replaces the rules; calls already past check 3 keep their decision.
    pub fn set_policies(&self, policies: Arc<PolicySet>) {
        *self
            .policies
            .write()
            .unwrap_or_else(PoisonError::into_inner) = policies;
    }

    /// The rules in force.
    pub fn policies(&self) -> Arc<PolicySet> {
        Arc::clone(&self.policies.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<DeviceRegistry> {
        &self.registry
    }

    /// The connected devices.
    pub fn links(&self) -> &Arc<Links> {
        &self.links
    }

    /// Tool definitions for the agent: the granted capabilities of paired
    /// devices, nothing else, sorted by tool name.
    pub fn tool_definitions(&self) -> Vec<ToolDefinition> {
        let mut tools = Vec::new();
        for snapshot in self.registry.list() {
            let manifest = snapshot.device.manifest();
            for cap in manifest.capabilities() {
                if !snapshot.grants.iter().any(|g| g == cap.name()) {
                    continue;
                }
                let mut properties = Map::new();
                let mut required = Vec::new();
                for param in cap.params() {
                    let mut schema = Map::new();
                    schema.insert("type".into(), Value::from(param.ty().as_str()));
                    if let Some(description) = param.description() {
                        schema.insert("description".into(), Value::from(description));
                    }
                    properties.insert(param.name().to_owned(), Value::Object(schema));
                    if param.required() {
                        required.push(Value::from(param.name()));
                    }
                }
                tools.push(ToolDefinition {
                    name: tool_name(manifest.id(), cap.name()),
                    description: format!(
                        "[DEVICE {} ({}) {}] {}",
                        manifest.name(),
                        manifest.kind(),
                        cap.kind(),
                        cap.description()
                    ),
                    parameters: json!({
                        "type": "object",
                        "properties": properties,
                        "required": required,
                        "additionalProperties": false,
                    }),
                    device_id: manifest.id().to_owned(),
                    capability: cap.name().to_owned(),
                    read_only: cap.kind() == dk_proto::CapabilityKind::Sensor,
                    confirm: cap.confirm(),
                });
            }
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// Runs one call through the checks, in order, and reports one decision.
    /// The input is taken by value: nothing the caller does afterwards can
    /// change what is checked, shown to the person, or sent.
    pub async fn execute(&self, tool: &str, input: Value, ctx: CallContext<'_>) -> ToolOutcome {
        let parsed = parse_tool_name(tool);
        let (device_id, capability) = match &parsed {
            Some(p) => (Some(p.device_id.as_str()), Some(p.capability)),
            None => (None, None),
        };
        let mut rule = None;
        let outcome = self
            .run_checks(tool, device_id.zip(capability), &input, &ctx, &mut rule)
            .await;
        if let Some(hook) = &self.on_decision {
            hook(&DecisionRecord {
                tool,
                device_id,
                capability,
                allowed: !matches!(outcome, Checked::Refused(_)),
                reason: match &outcome {
                    Checked::Answered(_) => "allowed",
                    Checked::Refused(reason) | Checked::DeviceFailed(reason) => reason,
                },
                agent_id: ctx.agent_id,
                session_id: ctx.session_id,
                rule: rule.as_deref(),
                input: Some(&input),
            });
        }
        match outcome {
            Checked::Answered(result) => ToolOutcome::Ok { result },
            Checked::Refused(reason) | Checked::DeviceFailed(reason) => {
                ToolOutcome::Refused { reason }
            }
        }
    }

    /// Reports a call its caller refused before the seven checks, for a rule
    /// of its own (an MCP agent's scope): one decision record through the
    /// same hook as every other call, without the input (it never came near
    /// a device).
    pub fn report_refusal(&self, tool: &str, reason: &str, ctx: &CallContext<'_>) {
        if let Some(hook) = &self.on_decision {
            let parsed = parse_tool_name(tool);
            hook(&DecisionRecord {
                tool,
                device_id: parsed.as_ref().map(|p| p.device_id.as_str()),
                capability: parsed.as_ref().map(|p| p.capability),
                allowed: false,
                reason,
                agent_id: ctx.agent_id,
                session_id: ctx.session_id,
                rule: None,
                input: None,
            });
        }
    }

    /// Checks 1 to 7. `rule` is set to the name of the rule that blocked the
    /// call or asked the person.
    async fn run_checks(
        &self,
        tool: &str,
        parsed: Option<(&str, &str)>,
        input: &Value,
        ctx: &CallContext<'_>,
        rule: &mut Option<String>,
    ) -> Checked {
        // 1. A real device and capability.
        let Some((device_id, capability)) = parsed else {
            return Checked::Refused(format!("[8dk-deny] \"{tool}\" is not a device tool"));
        };
        let Some((device, granted)) = self.registry.get_with_grant(device_id, capability) else {
            return Checked::Refused(format!("[8dk-deny] device \"{device_id}\" is not paired"));
        };
        let Some(cap) = device.manifest().capability(capability) else {
            return Checked::Refused(format!(
                "[8dk-deny] device \"{device_id}\" has no capability \"{capability}\""
            ));
        };
        // 2. Granted by the person.
        if !granted {
            return Checked::Refused(format!(
                "[8dk-deny] capability \"{capability}\" on \"{device_id}\" is not granted"
            ));
        }
        // 3. Rules.
        let policies = self.policies();
        let decision = policies.evaluate_device_use(&DeviceUseContext {
            agent_id: ctx.agent_id,
            session_id: ctx.session_id,
            device_id,
            capability,
            capability_kind: cap.kind().as_str(),
        });
        let ask_reason: Option<Cow<'_, str>> = match decision {
            Decision::Block { rule: by, reason } => {
                *rule = by.map(str::to_owned);
                return Checked::Refused(format!("[policy] {reason}"));
            }
            Decision::RequireApproval { rule: by, reason } => {
                *rule = Some(by.to_owned());
                Some(Cow::Borrowed(reason))
            }
            Decision::Allow { .. } if cap.confirm() => Some(Cow::Owned(format!(
                "\"{capability}\" on {} asks every time",
                device.manifest().name()
            ))),
            Decision::Allow { .. } => None,
        };
        // 4. Well-formed input.
        if let Err(e) = check_input(cap, input) {
            return Checked::Refused(format!("[8dk-deny] {e}"));
        }
        let Value::Object(input) = input else {
            return Checked::Refused("[8dk-deny] input must be an object".to_owned());
        };
        // The agent's rate and the call's run: charged here, after the
        // checks that need nobody (a call refused by them costs nothing) and
        // before the person is asked (nobody is asked about a call over
        // either).
        if let Err(refusal) = self.meter.charge(ctx.agent_id, device_id, ctx.run) {
            return Checked::Refused(refusal.to_string());
        }
        // 5. The person's yes.
        let waited = ask_reason.is_some();
        if let Some(reason) = ask_reason {
            let Some(approver) = ctx.approver else {
                return Checked::Refused(format!("[policy] {reason} (no approver wired)"));
            };
            let request = ApprovalRequest {
                tool: tool.to_owned(),
                device_id: device_id.to_owned(),
                capability: capability.to_owned(),
                input: input.clone(),
                reason: reason.clone().into_owned(),
                agent_id: ctx.agent_id.map(str::to_owned),
            };
            match approver.approve(request).await {
                Ok(true) => {}
                Ok(false) => {
                    return Checked::Refused(format!("[policy] the person said no: {reason}"));
                }
                Err(why) => {
                    return Checked::Refused(format!(
                        "[policy] the person was not asked ({why}): {reason}"
                    ));
                }
            }
        }
        // 6. Still the same pairing, still granted. Without a wait there is
        // nothing to re-read: the reads of checks 1 and 2 are this call's.
        let now = if waited {
            self.registry.get_with_grant(device_id, capability)
        } else {
            Some((Arc::clone(&device), true))
        };
        match now {
            Some((now, granted)) if now.generation() == device.generation() => {
                if !granted {
                    return Checked::Refused(format!(
                        "[8dk-deny] capability \"{capability}\" on \"{device_id}\" was revoked before the call"
                    ));
                }
            }
            _ => {
                return Checked::Refused(format!(
                    "[8dk-deny] device \"{device_id}\" was unpaired or paired again before the call"
                ));
            }
        }
        // 7. Connected and answering.
        let Some(link) = self.links.get(device_id) else {
            return Checked::Refused(format!(
                "[8dk-deny] device \"{device_id}\" is not connected"
            ));
        };
        let timeout = ctx.timeout.unwrap_or(self.call_timeout);
        match link.invoke(capability, input, timeout).await {
            Ok(result) => Checked::Answered(result),
            Err(error) => Checked::DeviceFailed(format!("device error: {error}")),
        }
    }
}

/// How the checks ended.
enum Checked {
    /// Every check passed and the device answered.
    Answered(Option<Box<RawValue>>),
    /// A check refused the call.
    Refused(String),
    /// Every check passed but the device failed (recorded as allowed).
    DeviceFailed(String),
}

#[cfg(test)]
mod tests;
