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

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use dk_policy::{InputError, PolicySet, RunLimits, RunLimitsLayer};
use dk_proto::{DeviceFailure, Refusal, ToolDescription, parse_tool_name, tool_name};
use serde_json::Value;

use crate::link::Links;
use crate::metrics::{CallDecision, LimitReached, Metrics};
use crate::registry::DeviceRegistry;
use crate::store::AuditRoom;

mod approval;
mod budget;
mod checks;
mod counts;
mod pending;
mod rate;
mod record;
mod types;

pub use approval::{
    AgentGate, Answered, Approval, ApprovalError, ApprovalRequest, Approver, ApproverFn,
};
pub use budget::ENFORCED_RUN_LIMITS;
use budget::Meter;
pub use budget::{
    AgentRunLimits, DEFAULT_MAX_TRACKED_RUNS, DEFAULT_RUN_IDLE_EXPIRY, RunClock, RunRef,
};
use checks::{Checked, PersonSaid};
use counts::RuleCounts;
use pending::{PendingDecision, Placement, Progress};
pub use rate::{
    AgentRateLimits, DEFAULT_AGENT_RATE, DEFAULT_DEVICE_RATE, DEFAULT_MAX_TRACKED_BUCKETS,
    RateLimit,
};
pub use record::{AllowanceUse, DecisionRecord, ToolDefinition, ToolOutcome};
pub use types::{CallContext, DEFAULT_CALL_TIMEOUT, DecisionHook, DeviceToolAdapter};

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
}

#[cfg(test)]
mod tests;
