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
//! Each call produces exactly one [`DecisionRecord`], allowed or not, even
//! when its caller abandons it half-way (its future dropped). The reason
//! texts are 8DK v1's, so hosts written against 8DK keep working.
//!
//! With the vessel's audit writer behind the hook, a call first takes a
//! place in the writer's queue: no check runs, and no device is reached,
//! until its record is sure of room in the audit log. Calls faster than the
//! log's disk wait there (asynchronously) rather than outrun it. And a call
//! reaches a device only while the store takes the log's writes within the
//! writer's bound ([`AuditRoom::durability`]): checked before the checks
//! and again just before the device, after any wait for the person; a
//! store that took no write within the bound refuses the call, one that is
//! behind makes it wait.
//!
//! The store is asked nothing on the call path but what a call needs of it
//! (the counts of rules with a `limit`, an agent's rate kept by a fleet),
//! and that through [`Store::claim_rate_hit_async`] and
//! [`Store::take_from_buckets_async`], awaited without holding the thread
//! for at most the writer's bound: a slow store slows only the calls that
//! need it, and those at most that long.
//!
//! [`Store::claim_rate_hit_async`]: crate::store::Store::claim_rate_hit_async
//! [`Store::take_from_buckets_async`]: crate::store::Store::take_from_buckets_async

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use dk_policy::{
    Call, Decision, DeviceUseContext, InputError, PolicySet, RunLimits, RunLimitsLayer,
};
use dk_proto::{
    AskReason, Capability, CapabilityKind, Channel, DeviceFailure, InvokeError, Refusal,
    ToolDescription, check_input, parse_tool_name, tool_name,
};
use futures::future::BoxFuture;
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::allowances::{Allowance, AllowanceOffer, OfferedCall};
use crate::by::By;
use crate::link::Links;
use crate::metrics::{CallDecision, CallKind, LimitReached, Metrics};
use crate::registry::{DeviceRegistry, PairedDevice};
use crate::store::{AuditPlace, AuditRoom, DEFAULT_DURABLE_WITHIN, Durability};

mod budget;
mod counts;
mod rate;

pub use budget::ENFORCED_RUN_LIMITS;
use budget::Meter;
pub use budget::{
    AgentRunLimits, DEFAULT_MAX_TRACKED_RUNS, DEFAULT_RUN_IDLE_EXPIRY, RunClock, RunRef,
};
use counts::RuleCounts;
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
            &Function {
                name: &self.name,
                description: &self.description,
                parameters: &self.parameters,
            },
        )?;
        map.end()
    }
}

/// The `function` of a tool definition: `{name, description, parameters}`.
#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
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
    /// The person's answer when the call asked for one: `Some(true)` for a
    /// yes, `Some(false)` for a no (or no answer in time); `None` when
    /// nobody was asked. For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub person_answer: Option<bool>,
    /// The call is the person's own (the admin API's), not an agent's.
    #[serde(skip)]
    pub by_person: bool,
    /// The remembered allowance the person's answer made, or that answered
    /// for the person. For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub allowance: Option<AllowanceUse>,
    /// The channel of the paired device the call named, when it named one
    /// (read at check 1). For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub channel: Option<Channel>,
    /// The front end the person answered through, when they were asked and
    /// it says. For the audit log; not part of 8DK's record.
    #[serde(skip)]
    pub answered_by: Option<&'a By>,
}

/// How a call met a remembered allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllowanceUse {
    /// The person's answer to this call made allowance `0`.
    Created(u64),
    /// Allowance `0` answered for the person: nobody was asked.
    Used(u64),
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
    /// The calling agent's session, when the call names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The channel the device is paired and connected on: the person sees
    /// whether what they allow travels encrypted.
    pub channel: Channel,
    /// Set when the call opens a voice device's microphone: for how long
    /// at most, so the person is told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub microphone: Option<dk_proto::admin::MicrophoneRequest>,
}

/// Which agents exist and what they may call, read again after the person
/// was asked (check 6): an agent removed, or re-scoped away from the tool,
/// while its call waited does not get the call made.
pub trait AgentGate: Send + Sync {
    /// `None` when `agent_id` is not one of the gate's agents (a host's own
    /// agent id); else whether it may call `capability` of `device_id`,
    /// given whether that capability only reads.
    fn may_call(
        &self,
        agent_id: &str,
        device_id: &str,
        capability: &str,
        read_only: bool,
    ) -> Option<bool>;
}

/// The person's answer to a call, when a yes may be remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// No (or no answer in time).
    Refused,
    /// Yes, for this call only.
    Once,
    /// Yes, and remembered as this allowance.
    Remembered(Allowance),
}

/// The person's answer to a call, and the front end that gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The answer.
    pub approval: Approval,
    /// Who answered, when the approver knows (the person channel does).
    pub by: Option<By>,
}

/// Why the person was not asked. `Display` is the why of the refusal's
/// reason (`[policy] the person was not asked (<why>): ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// The calling agent already has this many approvals waiting for the
    /// person (the person channel's cap).
    #[error("agent \"{agent}\" already has {limit} approvals waiting for the person")]
    TooManyWaiting {
        /// The agent.
        agent: String,
        /// Its cap.
        limit: usize,
    },
    /// An approver of the host's own could not reach the person; its words,
    /// one line.
    #[error("{0}")]
    Unreachable(String),
}

/// Asks the person. An error counts as a no, and says why the person was
/// not asked (it is the refusal's reason).
pub trait Approver: Send + Sync {
    /// Returns `Ok(true)` for a yes.
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, ApprovalError>>;

    /// Asks as [`Approver::approve`] does, letting the person remember a
    /// yes as `offer` allows (none: the call cannot be remembered). An
    /// approver that never offers (the default) answers once or no.
    fn approve_remembering(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
    ) -> BoxFuture<'_, Result<Approval, ApprovalError>> {
        drop(offer);
        let asking = self.approve(request);
        Box::pin(async move {
            asking.await.map(|yes| {
                if yes {
                    Approval::Once
                } else {
                    Approval::Refused
                }
            })
        })
    }

    /// Asks as [`Approver::approve_remembering`] does, and says who
    /// answered. An approver that cannot tell (the default) names nobody.
    fn approve_answered(
        &self,
        request: ApprovalRequest,
        offer: Option<AllowanceOffer>,
    ) -> BoxFuture<'_, Result<Answered, ApprovalError>> {
        let asking = self.approve_remembering(request, offer);
        Box::pin(async move { asking.await.map(|approval| Answered { approval, by: None }) })
    }
}

/// An [`Approver`] from a closure returning a future.
pub struct ApproverFn<F>(pub F);

impl<F, Fut> Approver for ApproverFn<F>
where
    F: Fn(ApprovalRequest) -> Fut + Send + Sync,
    Fut: Future<Output = Result<bool, ApprovalError>> + Send + 'static,
{
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'_, Result<bool, ApprovalError>> {
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
    /// The call is the person's own (the admin API's tool call), recorded
    /// as theirs; it names no agent.
    pub by_person: bool,
    /// The agents the caller is one of, read again after a wait for the
    /// person (check 6): an agent removed, or re-scoped away from the tool,
    /// meanwhile does not get its call made. Set by front ends whose callers
    /// are agents (MCP).
    pub agent_gate: Option<&'a dyn AgentGate>,
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
            .field("by_person", &self.by_person)
            .field("agent_gate", &self.agent_gate.is_some())
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
    /// The audit queue the hook records into, when it has places to take.
    room: Option<AuditRoom>,
    meter: Meter,
    /// The counts of rules with a `limit`.
    counts: RuleCounts,
    call_timeout: Duration,
    /// What every decision counts into.
    metrics: Arc<Metrics>,
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
        let counts = RuleCounts::load(registry.store().as_ref());
        DeviceToolAdapter {
            counts,
            registry,
            links,
            policies: RwLock::new(Arc::new(PolicySet::empty())),
            on_decision: None,
            room: None,
            meter: Meter::new(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// Counts every decision into `metrics` (by default, counters of its
    /// own).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> DeviceToolAdapter {
        self.metrics = metrics;
        self
    }

    /// What every decision counts into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
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

    /// Makes every call take a place in `room` before its checks, spent on
    /// its decision record: the decision hook must record each decision into
    /// the writer `room` belongs to, in the place taken for it. A call
    /// reaches a device only while `room` is accepting.
    pub(crate) fn with_decision_room(mut self, room: AuditRoom) -> DeviceToolAdapter {
        self.room = Some(room);
        self
    }

    /// Whether a call may reach a device now: the audit writer's store
    /// takes its writes within its bound (always, without a writer). While
    /// the store takes writes but is behind (calls came faster than its
    /// disk), the call waits for it to catch up, without holding the
    /// thread, looking again at each commit and at least every eighth of
    /// the bound; false once the store took no write within the bound.
    async fn durable(&self) -> bool {
        let Some(room) = &self.room else {
            return true;
        };
        loop {
            let committed = room.committed();
            tokio::pin!(committed);
            committed.as_mut().enable();
            match room.durability() {
                Durability::Within => return true,
                Durability::Lost => return false,
                Durability::Behind => {
                    let _ = counts::within(room.durable_within() / 8, committed).await;
                }
            }
        }
    }

    /// How long a call waits for the store on its way to a device: the
    /// audit writer's bound.
    fn store_patience(&self) -> Duration {
        self.room
            .as_ref()
            .map_or(DEFAULT_DURABLE_WITHIN, AuditRoom::durable_within)
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
                tools.push(ToolDefinition {
                    name: tool_name(manifest.id(), cap.name()),
                    description: ToolDescription {
                        device_name: manifest.name(),
                        device_kind: manifest.kind(),
                        capability_kind: cap.kind().as_str(),
                        description: cap.description(),
                    }
                    .to_string(),
                    parameters: cap.input_schema(),
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
    ///
    /// A call first takes its place in the audit queue, when the hook records
    /// into one, waiting while it is full. A call abandoned after that (its
    /// future dropped while the person is asked or the device answers) is
    /// still recorded, as abandoned before or after the device was sent the
    /// call; one abandoned while it waits for its place has done nothing and
    /// leaves no record.
    pub async fn execute(&self, tool: &str, input: Value, ctx: CallContext<'_>) -> ToolOutcome {
        let started = Instant::now();
        let parsed = parse_tool_name(tool);
        let (device_id, capability) = match &parsed {
            Some(p) => (Some(p.device_id.as_str()), Some(p.capability)),
            None => (None, None),
        };
        // Bytes (a sound to play) are recorded as their length and hash.
        let summarized = device_id
            .zip(capability)
            .and_then(|(device, capability)| self.bytes_summarized(device, capability, &input));
        let mut decision = PendingDecision {
            adapter: self,
            tool,
            device_id,
            capability,
            agent_id: ctx.agent_id,
            session_id: ctx.session_id,
            input: Some(summarized.as_ref().unwrap_or(&input)),
            refusal: None,
            place: Placement::Waiting,
            progress: Progress::default(),
            person_answer: None,
            by_person: ctx.by_person,
            allowance: None,
            answered_by: None,
            started,
        };
        if !decision.take_place().await {
            let reason = Refusal::AuditStopped.to_string();
            decision.report(false, &reason, None, CallDecision::Denied);
            return ToolOutcome::Refused { reason };
        }
        if !self.durable().await {
            // Its record is queued and committed once the store takes
            // writes again; the call itself is not made.
            let reason = Refusal::AuditFailing.to_string();
            decision.report(false, &reason, None, CallDecision::Denied);
            return ToolOutcome::Refused { reason };
        }
        let mut rule = None;
        let mut person = PersonSaid::default();
        let outcome = self
            .run_checks(
                tool,
                device_id.zip(capability),
                &input,
                &ctx,
                (&mut rule, &mut person),
                &decision.progress,
            )
            .await
            .unwrap_or_else(Checked::Refused);
        decision.person_answer = person.answer;
        decision.answered_by = person.by.take();
        decision.allowance = person.allowance;
        // A device's failure is recorded as allowed: every check passed.
        let (allowed, reason, decided) = match outcome {
            Checked::Answered(result) => {
                decision.report(true, "allowed", rule.as_deref(), CallDecision::Allowed);
                return ToolOutcome::Ok { result };
            }
            Checked::Refused(refusal) => {
                if let Some(limit) = LimitReached::of(&refusal) {
                    self.metrics.rate_limited(limit);
                }
                (false, refusal.to_string(), CallDecision::of(&refusal))
            }
            Checked::DeviceFailed(error) => (
                true,
                DeviceFailure(&error).to_string(),
                CallDecision::DeviceError,
            ),
        };
        decision.report(allowed, &reason, rule.as_deref(), decided);
        ToolOutcome::Refused { reason }
    }

    /// `input` with the value of each `base64` param of the capability (a
    /// sound to play) replaced by `{"bytes": N, "sha256": H}` (N the
    /// base64's decoded length, H the SHA-256 of its text), for the
    /// decision's record: bytes never reach the audit log. `None` when the
    /// capability has no such param in the input.
    fn bytes_summarized(&self, device_id: &str, capability: &str, input: &Value) -> Option<Value> {
        let device = self.registry.get(device_id)?;
        let declared = device.manifest().capability(capability)?;
        let Value::Object(map) = input else {
            return None;
        };
        let mut changed = map.clone();
        let mut any = false;
        for param in declared.params().iter().filter(|p| p.base64()) {
            if let Some(Value::String(text)) = changed.get(param.name()) {
                let padding = text.bytes().rev().take_while(|&b| b == b'=').count();
                let bytes = (text.len() / 4 * 3).saturating_sub(padding);
                let hash =
                    dk_files::hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()));
                changed.insert(
                    param.name().to_owned(),
                    serde_json::json!({"bytes": bytes, "sha256": hash}),
                );
                any = true;
            }
        }
        any.then_some(Value::Object(changed))
    }

    /// Reports a call its caller refused before the seven checks, for a rule
    /// of its own (an MCP agent's scope): one decision record through the
    /// same hook as every other call, in its own place in the audit queue,
    /// without the input (it never came near a device).
    pub async fn report_refusal(&self, tool: &str, refusal: &Refusal, ctx: &CallContext<'_>) {
        if self.on_decision.is_none() {
            return;
        }
        let reason = refusal.to_string();
        let reason = reason.as_str();
        let parsed = parse_tool_name(tool);
        let mut decision = PendingDecision {
            adapter: self,
            tool,
            device_id: parsed.as_ref().map(|p| p.device_id.as_str()),
            capability: parsed.as_ref().map(|p| p.capability),
            agent_id: ctx.agent_id,
            session_id: ctx.session_id,
            input: None,
            refusal: Some(reason),
            place: Placement::Waiting,
            progress: Progress::default(),
            person_answer: None,
            by_person: ctx.by_person,
            allowance: None,
            answered_by: None,
            started: Instant::now(),
        };
        decision.take_place().await;
        decision.report(false, reason, None, CallDecision::of(refusal));
    }

    /// The refusal of a call whose agent (one of `ctx`'s gate's, as
    /// `before` says) was removed, or may no longer call the tool, while the
    /// person was asked.
    fn agent_gone(
        &self,
        ctx: &CallContext<'_>,
        before: Option<bool>,
        tool: &str,
        device_id: &str,
        capability: &str,
        read_only: bool,
    ) -> Option<Refusal> {
        let (Some(gate), Some(agent)) = (ctx.agent_gate, ctx.agent_id) else {
            return None;
        };
        (before.is_some() && gate.may_call(agent, device_id, capability, read_only) != Some(true))
            .then(|| Refusal::AgentGone {
                agent: agent.to_owned(),
                tool: tool.to_owned(),
            })
    }

    /// Check 5: a live allowance for the call answers for the person;
    /// else the person is asked, and may remember a yes when the call
    /// names an agent that may still make it. A call that opens a voice
    /// device's microphone is asked saying for how long, and a yes to it
    /// is remembered, or a remembered one used, only while an `allow`
    /// rule names the call: the person's rules must say so explicitly.
    async fn ask_person(
        &self,
        ctx: &CallContext<'_>,
        asking: Asking<'_>,
        said: &mut PersonSaid,
    ) -> Result<(), Refusal> {
        let Asking {
            tool,
            device_id,
            capability,
            device,
            read_only,
            input,
            reason,
            stamp,
            gate_before,
            allow_rule,
        } = asking;
        let allowances = self.registry.allowances();
        let microphone = crate::microphones::opens_microphone(device.manifest(), capability)
            .then(|| dk_proto::admin::MicrophoneRequest::of(input));
        let rememberable = microphone.is_none() || allow_rule;
        // The person's own calls are theirs; only an agent's are remembered.
        let agent = ctx.agent_id.filter(|_| !ctx.by_person && rememberable);
        if let Some(agent) = agent
            && let Some(id) = allowances.covering(agent, tool, device.generation(), input)
        {
            said.allowance = Some(AllowanceUse::Used(id));
            return Ok(());
        }
        let Some(approver) = ctx.approver else {
            return Err(Refusal::NoApprover {
                reason: reason.into_owned(),
            });
        };
        // Offered only while the agent may make the call and the pairing and
        // grant read before are still those in force.
        let agent_may = ctx.agent_gate.is_none() || gate_before == Some(true);
        let offer = agent
            .filter(|_| {
                agent_may
                    && self
                        .registry
                        .get_with_grant(device_id, capability)
                        .is_some_and(|(now, granted)| {
                            granted && now.generation() == device.generation()
                        })
            })
            .map(|agent_id| {
                allowances.offer(
                    stamp,
                    OfferedCall {
                        agent_id,
                        tool,
                        device_id,
                        capability,
                        generation: device.generation(),
                        read_only,
                        arguments: input,
                    },
                )
            });
        let request = ApprovalRequest {
            tool: tool.to_owned(),
            device_id: device_id.to_owned(),
            capability: capability.to_owned(),
            input: input.clone(),
            reason: reason.clone().into_owned(),
            agent_id: ctx.agent_id.map(str::to_owned),
            session_id: ctx.session_id.map(str::to_owned),
            channel: device.channel(),
            microphone,
        };
        let answered = approver.approve_answered(request, offer).await.map(|a| {
            said.by = a.by;
            a.approval
        });
        match answered {
            Ok(Approval::Once) => said.answer = Some(true),
            Ok(Approval::Remembered(allowance)) => {
                said.answer = Some(true);
                said.allowance = Some(AllowanceUse::Created(allowance.id));
            }
            Ok(Approval::Refused) => {
                said.answer = Some(false);
                // A prompt withdrawn because its agent was removed or
                // re-scoped reads as a no: say why.
                return Err(self
                    .agent_gone(ctx, gate_before, tool, device_id, capability, read_only)
                    .unwrap_or_else(|| Refusal::PersonSaidNo {
                        reason: reason.into_owned(),
                    }));
            }
            Err(why) => {
                return Err(Refusal::NotAsked {
                    why: why.to_string(),
                    reason: reason.into_owned(),
                });
            }
        }
        Ok(())
    }

    /// Checks 1 to 7, in ARCHITECTURE.md's order, each a function below.
    /// `rule` is set to the name of the rule that blocked the call or asked
    /// the person; `progress` is told what check 1 found and, just before
    /// the device is sent the call, that it is reached.
    async fn run_checks(
        &self,
        tool: &str,
        parsed: Option<(&str, &str)>,
        input: &Value,
        ctx: &CallContext<'_>,
        (rule, person): (&mut Option<String>, &mut PersonSaid),
        progress: &Progress,
    ) -> Result<Checked, Refusal> {
        // 1. A real device and capability.
        let (device_id, capability) = parsed.ok_or_else(|| Refusal::NotADeviceTool {
            tool: tool.to_owned(),
        })?;
        let (device, granted) = self.paired(device_id, capability)?;
        let _ = progress.channel.set(device.channel());
        let cap = declared(&device, device_id, capability)?;
        let _ = progress.kind.set(cap.kind());
        // 2. Granted by the person.
        check_granted(granted, device_id, capability)?;
        // 3. Rules.
        let Ruled {
            counted,
            ask,
            allow_rule,
        } = self.check_rules(ctx, (device_id, &device), cap, input, rule)?;
        // 4. Well-formed input; then the agent's rate and the call's run.
        let input = check_well_formed(cap, input)?;
        self.charge(ctx, device_id).await?;
        // 5. The person's yes, or an allowance the person gave for it.
        let target = Target {
            tool,
            device_id,
            capability,
            device: &device,
            read_only: cap.kind() == dk_proto::CapabilityKind::Sensor,
        };
        let asked = Asked {
            reason: ask,
            allow_rule,
        };
        let gate_before = self
            .ask_if_asked(ctx, &target, input, asked, person)
            .await?;
        // 6. Still the same pairing, still granted, the agent still there.
        if let Some(gate_before) = gate_before {
            self.check_unchanged(ctx, &target, gate_before)?;
        }
        // 7. Connected and answering.
        self.call_device(
            ctx,
            device_id,
            capability,
            input,
            counted,
            &progress.reached,
        )
        .await
    }

    /// Check 1: the device the tool names, paired, and whether the person
    /// granted the capability (read together, once).
    #[inline]
    fn paired(
        &self,
        device_id: &str,
        capability: &str,
    ) -> Result<(Arc<PairedDevice>, bool), Refusal> {
        self.registry
            .get_with_grant(device_id, capability)
            .ok_or_else(|| Refusal::NotPaired {
                device_id: device_id.to_owned(),
            })
    }

    /// Check 3: the rules. A block refuses the call (saying when a limited
    /// rule allows the next one); an ask, or a capability that asks every
    /// time, gives the reason the person will be asked. The calls counted
    /// by rules with a limit are given back unless kept at check 7.
    #[inline]
    fn check_rules(
        &self,
        ctx: &CallContext<'_>,
        (device_id, device): (&str, &PairedDevice),
        cap: &Capability,
        input: &Value,
        rule: &mut Option<String>,
    ) -> Result<Ruled<'_>, Refusal> {
        let policies = self.policies();
        let capability = cap.name();
        let call = Call {
            device: DeviceUseContext {
                agent_id: ctx.agent_id,
                session_id: ctx.session_id,
                device_id,
                capability,
                capability_kind: cap.kind().as_str(),
            },
            // Checked only by check 4: a param of the wrong type, or input
            // that is not an object, makes `input.` clauses false.
            input: input.as_object(),
            at: SystemTime::now(),
        };
        let (evaluation, counted) =
            self.counts
                .evaluate(&policies, &call)
                .map_err(|full| Refusal::Uncountable {
                    why: full.to_string(),
                })?;
        let allow_rule = matches!(evaluation.decision, Decision::Allow { rule: Some(_) });
        let ask = match evaluation.decision {
            Decision::Block { rule: by, reason } => {
                *rule = by.map(str::to_owned);
                // A rule with a limit says when its next call is allowed,
                // as the rate limiter's refusal does.
                let wait = by
                    .and_then(|name| policies.rules().iter().find(|r| r.name() == name))
                    .and_then(|limited| {
                        let agent = ctx.agent_id.unwrap_or("");
                        self.counts.next_allowed(limited, agent, call.at)
                    });
                let reason = reason.to_owned();
                return Err(match wait {
                    Some(wait) => Refusal::RuleLimited { reason, wait },
                    None => Refusal::Blocked { reason },
                });
            }
            Decision::RequireApproval { rule: by, reason } => {
                *rule = Some(by.to_owned());
                Some(reason.to_owned())
            }
            Decision::Allow { .. } if cap.confirm() => Some(
                AskReason::Confirm {
                    capability,
                    device_name: device.manifest().name(),
                }
                .to_string(),
            ),
            Decision::Allow { .. } => None,
        };
        Ok(Ruled {
            counted,
            ask,
            allow_rule,
        })
    }

    /// Between checks 4 and 5: the agent's rate and the call's run, charged
    /// after the checks that need nobody (a call refused by them costs
    /// nothing) and before the person is asked (nobody is asked about a
    /// call over either).
    #[inline]
    async fn charge(&self, ctx: &CallContext<'_>, device_id: &str) -> Result<(), Refusal> {
        let shared = self.registry.is_shared();
        if shared {
            self.charge_fleet_rate(ctx, device_id).await?;
        }
        self.meter
            .charge(ctx.agent_id, device_id, ctx.run, !shared)
            .map_err(Refusal::from)
    }

    /// The agent's rate, charged to buckets in a store shared by a fleet's
    /// vessels rather than in memory: an agent spreading its calls over
    /// several members has one rate. Their time is the wall clock, which
    /// the members share. A store that fails, or does not answer within
    /// [`DeviceToolAdapter::store_patience`], refuses the call.
    async fn charge_fleet_rate(
        &self,
        ctx: &CallContext<'_>,
        device_id: &str,
    ) -> Result<(), Refusal> {
        let (Some(limits), Some(agent)) = (self.meter.rate_limits(), ctx.agent_id) else {
            return Ok(());
        };
        let mut takes = Vec::with_capacity(2);
        let mut which = Vec::with_capacity(2);
        for (limit, device) in [(limits.overall, None), (limits.per_device, Some(device_id))] {
            let Some(limit) = limit else { continue };
            let key = match device {
                None => agent.to_owned(),
                Some(device) => format!("{agent}\n{device}"),
            };
            takes.push(crate::store::BucketTake {
                key,
                calls_per_minute: limit.calls_per_minute.get(),
                burst: limit.burst.get(),
            });
            which.push((limit, device));
        }
        let now = dk_store::epoch_ms(SystemTime::now());
        let within = self.store_patience();
        let taking = self.registry.store().take_from_buckets_async(&takes, now);
        let refused = counts::within(within, taking)
            .await
            .unwrap_or_else(|| Err(counts::unanswered(within)))
            .map_err(|error| Refusal::CountsNotKept {
                why: error.to_string(),
            })?;
        let Some((index, wait_ms)) = refused else {
            return Ok(());
        };
        let Some((limit, device)) = which.get(index) else {
            return Ok(());
        };
        let (calls_per_minute, burst) = (limit.calls_per_minute.get(), limit.burst.get());
        Err(match device {
            None => Refusal::AgentRate {
                calls_per_minute,
                burst,
                wait_ms,
            },
            Some(device) => Refusal::DeviceRate {
                device_id: (*device).to_owned(),
                calls_per_minute,
                burst,
                wait_ms,
            },
        })
    }

    /// Check 5, when a rule or the capability's `confirm` asks (`ask` is
    /// why): an allowance, or the person's yes. Returns `None` when nobody
    /// was asked, else the gate's word on the calling agent before the wait
    /// (read before it, so that its removal meanwhile is noticed at check 6).
    async fn ask_if_asked(
        &self,
        ctx: &CallContext<'_>,
        target: &Target<'_>,
        input: &Map<String, Value>,
        asked: Asked,
        person: &mut PersonSaid,
    ) -> Result<Option<Option<bool>>, Refusal> {
        let Some(reason) = asked.reason else {
            return Ok(None);
        };
        // Taken before the gate and the grant are read again: a change from
        // then on refuses to remember the person's answer.
        let stamp = self.registry.allowances().stamp();
        let gate_before = match (ctx.agent_gate, ctx.agent_id) {
            (Some(gate), Some(agent)) => {
                gate.may_call(agent, target.device_id, target.capability, target.read_only)
            }
            _ => None,
        };
        let asking = Asking {
            tool: target.tool,
            device_id: target.device_id,
            capability: target.capability,
            device: target.device,
            read_only: target.read_only,
            input,
            reason: Cow::Owned(reason),
            stamp,
            gate_before,
            allow_rule: asked.allow_rule,
        };
        self.ask_person(ctx, asking, person).await?;
        Ok(Some(gate_before))
    }

    /// Check 6, after the person was asked: still the same pairing, still
    /// granted, and the calling agent still exists and may still call it.
    /// Without a wait there is nothing to re-read: the reads of checks 1
    /// and 2 are the call's.
    #[inline]
    fn check_unchanged(
        &self,
        ctx: &CallContext<'_>,
        target: &Target<'_>,
        gate_before: Option<bool>,
    ) -> Result<(), Refusal> {
        let Target {
            tool,
            device_id,
            capability,
            device,
            read_only,
        } = *target;
        match self.registry.get_with_grant(device_id, capability) {
            Some((now, granted)) if now.generation() == device.generation() => {
                if !granted {
                    return Err(Refusal::RevokedMeanwhile {
                        device_id: device_id.to_owned(),
                        capability: capability.to_owned(),
                    });
                }
            }
            _ => {
                return Err(Refusal::PairingChanged {
                    device_id: device_id.to_owned(),
                });
            }
        }
        match self.agent_gone(ctx, gate_before, tool, device_id, capability, read_only) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// Check 7: the device is connected; the counts of the rules the call
    /// matched are kept (the call is made), then the device is called and
    /// its answer, or failure, is the outcome.
    async fn call_device(
        &self,
        ctx: &CallContext<'_>,
        device_id: &str,
        capability: &str,
        input: &Map<String, Value>,
        counted: counts::Counted<'_>,
        reached: &AtomicBool,
    ) -> Result<Checked, Refusal> {
        let link = self
            .links
            .reach(device_id)
            .ok_or_else(|| Refusal::NotConnected {
                device_id: device_id.to_owned(),
            })?;
        // A count is not taken for a call that will not be made.
        if !counted.is_empty() && !self.durable().await {
            return Err(Refusal::AuditFailing);
        }
        // The call is made: it counts against the limited rules it matched.
        counted
            .keep(self.registry.store().as_ref(), self.store_patience())
            .await
            .map_err(|not_kept| match not_kept {
                counts::NotKept::Store(error) => Refusal::CountsNotKept {
                    why: error.to_string(),
                },
                counts::NotKept::Reached(reason, wait) => Refusal::RuleLimited { reason, wait },
            })?;
        // After every wait (the person, the store), just before the device:
        // its record can still be made durable.
        if !self.durable().await {
            return Err(Refusal::AuditFailing);
        }
        let timeout = ctx.timeout.unwrap_or(self.call_timeout);
        reached.store(true, Ordering::Relaxed);
        Ok(match link.invoke(capability, input, timeout).await {
            Ok(result) => Checked::Answered(result),
            Err(error) => Checked::DeviceFailed(error),
        })
    }
}

/// Check 1: the capability the tool names, declared by the device.
#[inline]
fn declared<'d>(
    device: &'d PairedDevice,
    device_id: &str,
    capability: &str,
) -> Result<&'d Capability, Refusal> {
    device
        .manifest()
        .capability(capability)
        .ok_or_else(|| Refusal::NoCapability {
            device_id: device_id.to_owned(),
            capability: capability.to_owned(),
        })
}

/// Check 2: the person granted the capability (no rule lifts this).
#[inline]
fn check_granted(granted: bool, device_id: &str, capability: &str) -> Result<(), Refusal> {
    if granted {
        return Ok(());
    }
    Err(Refusal::NotGranted {
        device_id: device_id.to_owned(),
        capability: capability.to_owned(),
    })
}

/// Check 4: the input matches the capability's params (or its declared
/// input schema), and is an object.
#[inline]
fn check_well_formed<'v>(
    cap: &Capability,
    input: &'v Value,
) -> Result<&'v Map<String, Value>, Refusal> {
    check_input(cap, input)?;
    if let Some(schema) = cap.declared_input_schema() {
        crate::input_schema::check(schema, input)?;
    }
    match input {
        Value::Object(input) => Ok(input),
        _ => Err(Refusal::Input(dk_proto::InputError::NotAnObject)),
    }
}

/// What check 3 found: the calls counted by rules with a limit, the
/// reason a rule asks the person, if one does, and whether an `allow` rule
/// named the call.
struct Ruled<'c> {
    counted: counts::Counted<'c>,
    ask: Option<String>,
    allow_rule: bool,
}

/// Why check 5 asks the person, if it does, and whether an `allow` rule
/// named the call (the person's explicit word that a yes to open a
/// microphone may be remembered).
struct Asked {
    reason: Option<String>,
    allow_rule: bool,
}

/// The call's device and capability, as checks 5 and 6 see them.
#[derive(Clone, Copy)]
struct Target<'a> {
    tool: &'a str,
    device_id: &'a str,
    capability: &'a str,
    device: &'a PairedDevice,
    read_only: bool,
}

/// One call's decision until it is reported: it holds the call's place in
/// the audit queue, and reports the decision exactly once, when the call
/// ends or, once it has its place, when it is abandoned.
struct PendingDecision<'a> {
    adapter: &'a DeviceToolAdapter,
    tool: &'a str,
    device_id: Option<&'a str>,
    capability: Option<&'a str>,
    agent_id: Option<&'a str>,
    session_id: Option<&'a str>,
    input: Option<&'a Value>,
    /// The refusal a caller reports, also recorded if it is abandoned.
    refusal: Option<&'a str>,
    place: Placement<'a>,
    /// What the checks found, as far as they went.
    progress: Progress,
    /// The person's answer, when asked.
    person_answer: Option<bool>,
    /// The call is the person's own.
    by_person: bool,
    /// The allowance the person's answer made, or that answered.
    allowance: Option<AllowanceUse>,
    /// Who answered for the person, when they were asked.
    answered_by: Option<By>,
    /// When the call started.
    started: Instant,
}

/// How far a call's checks went, kept by its pending decision, so that a
/// call abandoned half-way (its future dropped) is counted and recorded
/// with what they found: the kind of the capability it named, not
/// `unknown`, and its device's channel.
#[derive(Debug, Default)]
struct Progress {
    /// The channel of the device the call named, once check 1 found it.
    channel: OnceLock<Channel>,
    /// The kind of capability the call named, once check 1 found it.
    kind: OnceLock<CapabilityKind>,
    /// Set just before the device is sent the call.
    reached: AtomicBool,
}

/// Where a pending decision stands with its place in the audit queue.
enum Placement<'a> {
    /// Not yet taken: nothing has happened, nothing is to be recorded.
    Waiting,
    /// Taken: spent on the record.
    Held(AuditPlace<'a>),
    /// None needed (no queue behind the hook, or the writer has stopped).
    Unplaced,
    /// The decision was reported.
    Reported,
}

impl PendingDecision<'_> {
    /// Takes the call's place in the audit queue, waiting for room; false
    /// when the audit writer has stopped.
    async fn take_place(&mut self) -> bool {
        let adapter = self.adapter;
        let room = match (&adapter.room, &adapter.on_decision) {
            (Some(room), Some(_)) => room,
            _ => {
                self.place = Placement::Unplaced;
                return true;
            }
        };
        match room.take().await {
            Ok(place) => {
                self.place = Placement::Held(place);
                true
            }
            Err(_) => {
                self.place = Placement::Unplaced;
                false
            }
        }
    }

    /// Counts the decision as `decided` and sends it to the hook, in the
    /// call's place; once.
    fn report(&mut self, allowed: bool, reason: &str, rule: Option<&str>, decided: CallDecision) {
        let place = std::mem::replace(&mut self.place, Placement::Reported);
        if !matches!(place, Placement::Reported) {
            let kind = self
                .progress
                .kind
                .get()
                .map_or(CallKind::Unknown, |kind| CallKind::from(*kind));
            self.adapter
                .metrics
                .call_decided(kind, decided, self.started.elapsed());
        }
        match place {
            Placement::Waiting | Placement::Reported => return,
            Placement::Held(place) => place.spend(),
            Placement::Unplaced => {}
        }
        if let Some(hook) = &self.adapter.on_decision {
            hook(&DecisionRecord {
                tool: self.tool,
                device_id: self.device_id,
                capability: self.capability,
                allowed,
                reason,
                agent_id: self.agent_id,
                session_id: self.session_id,
                rule,
                input: self.input,
                person_answer: self.person_answer,
                by_person: self.by_person,
                allowance: self.allowance,
                channel: self.progress.channel.get().copied(),
                answered_by: self.answered_by.as_ref(),
            });
        }
    }
}

impl Drop for PendingDecision<'_> {
    fn drop(&mut self) {
        let reached = self.progress.reached.load(Ordering::Relaxed);
        let reason = match self.refusal {
            Some(refusal) => refusal,
            None if reached => "abandoned by the caller while the device was called",
            None => "abandoned by the caller before the device was reached",
        };
        self.report(reached, reason, None, CallDecision::Abandoned);
    }
}

/// What the person said about a call (check 5), for the record.
#[derive(Debug, Default)]
struct PersonSaid {
    /// Their answer, when asked.
    answer: Option<bool>,
    /// The allowance made by their answer, or that answered for them.
    allowance: Option<AllowanceUse>,
    /// Who answered, when the approver says.
    by: Option<By>,
}

/// A call that needs the person's yes, as check 5 sees it.
struct Asking<'a> {
    tool: &'a str,
    device_id: &'a str,
    capability: &'a str,
    device: &'a PairedDevice,
    read_only: bool,
    input: &'a Map<String, Value>,
    reason: Cow<'a, str>,
    /// The allowances' count of changes before the gate was read.
    stamp: u64,
    /// The gate's word on the agent before the wait.
    gate_before: Option<bool>,
    /// Whether an `allow` rule named the call.
    allow_rule: bool,
}

/// How the checks ended.
enum Checked {
    /// Every check passed and the device answered.
    Answered(Option<Box<RawValue>>),
    /// A check refused the call.
    Refused(Refusal),
    /// Every check passed but the call failed: the device's error or the
    /// vessel's failure to reach it (recorded as allowed, reads
    /// `device error: ...`).
    DeviceFailed(InvokeError),
}

#[cfg(test)]
mod tests;
