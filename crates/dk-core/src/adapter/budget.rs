//! What a device call is charged to before the device is reached: the
//! calling agent's rate ([`AgentRateLimits`], in `rate.rs`) and, when the
//! call names a run, that run's budget (dk-policy's [`RunLimits`], counted by
//! a [`RunTracker`]).
//!
//! Runs are explicit: an embedding host starts one
//! ([`DeviceToolAdapter::start_run`](crate::adapter::DeviceToolAdapter::start_run))
//! or names it in a call's [`RunRef`]; an MCP client names it in the `_meta`
//! of `tools/call`. A budget is kept per (agent, run id); a call that names
//! no run is charged to no run, only to its agent's rate. Memory is bounded:
//! a run idle for [`AgentRunLimits::idle_expiry`] is forgotten, and past
//! [`AgentRunLimits::max_tracked_runs`] the least recently used runs are
//! dropped first.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use dk_policy::{
    InputError, RunLimit, RunLimitBreach, RunLimits, RunLimitsLayer, RunTracker, narrow,
};
use dk_proto::Refusal;

use super::rate::{AgentRateLimits, RateLimiter, RateRefusal};

/// How many runs are tracked at once by default (10,000).
pub const DEFAULT_MAX_TRACKED_RUNS: usize = 10_000;

/// How long a run may stay without a call before it is forgotten, by default:
/// 30 minutes, the hard cap of `maxWallTimeMs`. A run idle that long is past
/// any wall time it could have, so forgetting it never cuts a live run
/// short; a call naming it afterwards starts it afresh.
pub const DEFAULT_RUN_IDLE_EXPIRY: Duration = Duration::from_millis(1_800_000);

/// The limits the vessel itself charges on every device call of a run; the
/// others (turns, provider calls, bytes, tokens) are counted by the host
/// that runs the model.
pub const ENFORCED_RUN_LIMITS: [RunLimit; 2] = [RunLimit::MaxToolCalls, RunLimit::MaxWallTimeMs];

/// How the vessel budgets explicit runs: the run limits of
/// `/work/shared/spec/admission.md` (Prism's), charged before the device is
/// reached.
///
/// The budget of a run is the agent-level layer ([`AgentRunLimits::per_agent`]
/// for that agent, else [`AgentRunLimits::agent_level`]) over Prism's defaults,
/// narrowed by the run-level layer of the run's start
/// ([`DeviceToolAdapter::start_run`](crate::adapter::DeviceToolAdapter::start_run)) and
/// of each call naming it ([`RunRef::limits`]). Each device call of the run
/// charges one `maxToolCalls` and checks `maxWallTimeMs` (counted from the
/// run's start); going past a limit refuses the call, and every later call
/// of that run, until the run is forgotten.
///
/// Every field is plain data, meant to be filled from a configuration file;
/// [`AgentRunLimits::default`] gives the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRunLimits {
    /// The agent-level layer every agent's runs start from: a limit it sets
    /// replaces Prism's default (it must be an integer in `1..=` the hard
    /// cap), one it leaves unset keeps the default (`maxToolCalls` 32,
    /// `maxWallTimeMs` 120,000). Default: empty (Prism's defaults).
    pub agent_level: RunLimitsLayer,
    /// Agent-level layers of particular agents, by agent id, used in place of
    /// [`AgentRunLimits::agent_level`] for that agent. Default: none.
    pub per_agent: BTreeMap<String, RunLimitsLayer>,
    /// Runs tracked at once; past this the least recently used are
    /// forgotten (a call naming one again starts it afresh). Default:
    /// [`DEFAULT_MAX_TRACKED_RUNS`].
    pub max_tracked_runs: usize,
    /// A run with no call for this long is forgotten; a call naming it
    /// afterwards starts it afresh. A run refused for its budget stays
    /// refused until then. Default: [`DEFAULT_RUN_IDLE_EXPIRY`].
    pub idle_expiry: Duration,
}

impl Default for AgentRunLimits {
    fn default() -> Self {
        AgentRunLimits {
            agent_level: RunLimitsLayer::new(),
            per_agent: BTreeMap::new(),
            max_tracked_runs: DEFAULT_MAX_TRACKED_RUNS,
            idle_expiry: DEFAULT_RUN_IDLE_EXPIRY,
        }
    }
}

impl AgentRunLimits {
    /// Checks every layer (each value an integer in `1..=` its hard cap), so
    /// a configuration can be refused when it is read rather than call by
    /// call. A vessel given a bad layer refuses the calls that would use it.
    pub fn check(&self) -> Result<(), InputError> {
        narrow(Some(&self.agent_level), None)?;
        for layer in self.per_agent.values() {
            narrow(Some(layer), None)?;
        }
        Ok(())
    }

    /// The agent-level layer of `agent_id`.
    fn layer_of(&self, agent_id: Option<&str>) -> &RunLimitsLayer {
        agent_id
            .and_then(|agent| self.per_agent.get(agent))
            .unwrap_or(&self.agent_level)
    }
}

/// The run a call belongs to: its id, chosen by the caller (an embedding
/// host, or an MCP client through `_meta`), and a run-level layer that can
/// only narrow the run's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRef<'a> {
    /// The run's id; with the calling agent it names the budget.
    pub id: &'a str,
    /// Narrows the run's budget from this call on (a value above the run's
    /// changes nothing). Empty by default.
    pub limits: RunLimitsLayer,
}

impl<'a> RunRef<'a> {
    /// The run `id`, with no run-level layer.
    pub fn new(id: &'a str) -> RunRef<'a> {
        RunRef {
            id,
            limits: RunLimitsLayer::new(),
        }
    }

    /// The same run with `limits` as its run-level layer.
    #[must_use]
    pub fn with_limits(self, limits: RunLimitsLayer) -> RunRef<'a> {
        RunRef { limits, ..self }
    }
}

/// The clock rate limits and run budgets read: milliseconds from any fixed
/// start. The default is monotonic time since the adapter was made; tests
/// inject their own.
pub type RunClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Why a call was refused for its run budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BudgetRefusal {
    /// A limit went past (the run's first breach).
    Breach {
        /// The breach.
        breach: RunLimitBreach,
        /// The run's id.
        run: String,
    },
    /// The configured layers are out of range.
    Misconfigured(InputError),
}

impl From<BudgetRefusal> for Refusal {
    fn from(refusal: BudgetRefusal) -> Refusal {
        match refusal {
            BudgetRefusal::Breach { breach, run } => Refusal::RunBudgetSpent {
                limit: breach.limit.name(),
                maximum: breach.maximum,
                run,
            },
            BudgetRefusal::Misconfigured(error) => Refusal::RunBudgetMisconfigured {
                why: error.to_string(),
            },
        }
    }
}

/// Whose run: (agent, run id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RunKey {
    agent: Option<Box<str>>,
    run: Box<str>,
}

struct Run {
    tracker: RunTracker,
    started_ms: u64,
    last_used_ms: u64,
}

impl Run {
    fn new(limits: RunLimits, now: u64) -> Run {
        Run {
            tracker: RunTracker::new(limits, now),
            started_ms: now,
            last_used_ms: now,
        }
    }

    /// Narrows the run's budget to `limits` where they are smaller, keeping
    /// what it has counted; a spent run stays spent as it is.
    fn narrow_to(&mut self, limits: &RunLimits) {
        if self.tracker.breach().is_some() {
            return;
        }
        let narrowed = self.tracker.limits().narrowed_by(limits);
        if narrowed == *self.tracker.limits() {
            return;
        }
        let calls = self.tracker.count(RunLimit::MaxToolCalls);
        let mut tracker = RunTracker::new(narrowed, self.started_ms);
        // Calls already made past the narrower limit spend the run now; the
        // tracker keeps that breach and this call is refused with it.
        let _ = tracker.charge(RunLimit::MaxToolCalls, calls);
        self.tracker = tracker;
    }
}

struct Runs {
    map: HashMap<RunKey, Run>,
    next_sweep_ms: u64,
}

/// The run budgets of the runs calling through one adapter.
pub(crate) struct RunBudgets {
    config: AgentRunLimits,
    runs: Mutex<Runs>,
}

impl fmt::Debug for RunBudgets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunBudgets")
            .field("config", &self.config)
            .field("tracked", &self.tracked())
            .finish_non_exhaustive()
    }
}

impl RunBudgets {
    pub(crate) fn new(config: AgentRunLimits) -> RunBudgets {
        RunBudgets {
            config,
            runs: Mutex::new(Runs {
                map: HashMap::new(),
                next_sweep_ms: 0,
            }),
        }
    }

    pub(crate) fn config(&self) -> &AgentRunLimits {
        &self.config
    }

    /// Runs tracked now.
    pub(crate) fn tracked(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts (or restarts) `agent_id`'s run `run_id` at `now` with the
    /// agent-level budget narrowed by `run_level`; returns the budget.
    pub(crate) fn start_run(
        &self,
        agent_id: Option<&str>,
        run_id: &str,
        run_level: &RunLimitsLayer,
        now: u64,
    ) -> Result<RunLimits, InputError> {
        let limits = narrow(Some(self.config.layer_of(agent_id)), Some(run_level))?;
        let key = RunKey {
            agent: agent_id.map(Box::from),
            run: Box::from(run_id),
        };
        let mut runs = self.lock();
        runs.map.remove(&key);
        self.make_room(&mut runs, now);
        runs.map.insert(key, Run::new(limits, now));
        Ok(limits)
    }

    /// Charges one tool call to the run the call names (checking its wall
    /// time first), starting the run if it is not tracked. `Ok` when the
    /// call may go on; a call that names no run is not charged.
    pub(crate) fn charge_tool_call(
        &self,
        agent_id: Option<&str>,
        run: Option<RunRef<'_>>,
        now: u64,
    ) -> Result<(), BudgetRefusal> {
        let Some(run) = run else {
            return Ok(());
        };
        let limits = narrow(Some(self.config.layer_of(agent_id)), Some(&run.limits))
            .map_err(BudgetRefusal::Misconfigured)?;
        let key = RunKey {
            agent: agent_id.map(Box::from),
            run: Box::from(run.id),
        };
        let mut runs = self.lock();
        if now >= runs.next_sweep_ms {
            self.forget_idle(&mut runs, now);
        }
        if !runs.map.contains_key(&key) {
            self.make_room(&mut runs, now);
            runs.map.insert(key.clone(), Run::new(limits, now));
        }
        let Some(tracked) = runs.map.get_mut(&key) else {
            return Ok(());
        };
        tracked.narrow_to(&limits);
        tracked.last_used_ms = now;
        tracked
            .tracker
            .check_wall_time(now)
            .and_then(|()| tracked.tracker.charge_tool_call())
            .map_err(|breach| BudgetRefusal::Breach {
                breach,
                run: run.id.to_owned(),
            })
    }

    /// Forgets runs idle for the expiry; sweeps again a quarter expiry later.
    fn forget_idle(&self, runs: &mut Runs, now: u64) {
        let expiry = u64::try_from(self.config.idle_expiry.as_millis()).unwrap_or(u64::MAX);
        runs.map
            .retain(|_, run| now.saturating_sub(run.last_used_ms) < expiry);
        runs.next_sweep_ms = now.saturating_add((expiry / 4).max(1));
    }

    /// Makes room for one more run: idle runs go first, then the least
    /// recently used eighth (at least one), so the cost of choosing is spread
    /// over many new runs.
    fn make_room(&self, runs: &mut Runs, now: u64) {
        let max = self.config.max_tracked_runs.max(1);
        if runs.map.len() < max {
            return;
        }
        self.forget_idle(runs, now);
        if runs.map.len() < max {
            return;
        }
        let mut last_used: Vec<u64> = runs.map.values().map(|run| run.last_used_ms).collect();
        let drop_count = (max / 8).max(1).min(last_used.len());
        let Some(nth) = drop_count.checked_sub(1) else {
            return;
        };
        let (_, cutoff, _) = last_used.select_nth_unstable(nth);
        let cutoff = *cutoff;
        runs.map.retain(|_, run| run.last_used_ms > cutoff);
    }
}

/// Why a call was refused by the meter: its agent's rate, or its run's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MeterRefusal {
    /// The agent's rate limit.
    Rate(RateRefusal),
    /// The run's budget.
    Budget(BudgetRefusal),
}

impl From<MeterRefusal> for Refusal {
    fn from(refusal: MeterRefusal) -> Refusal {
        match refusal {
            MeterRefusal::Rate(refusal) => refusal.into(),
            MeterRefusal::Budget(refusal) => refusal.into(),
        }
    }
}

/// Everything a device call is charged to between checks 4 and 5, on one
/// clock: the agent's rate, then the run's budget. A call refused for its
/// rate is not charged to its run.
pub(crate) struct Meter {
    rates: Option<RateLimiter>,
    budgets: Option<RunBudgets>,
    clock: RwLock<RunClock>,
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("rates", &self.rates)
            .field("budgets", &self.budgets)
            .finish_non_exhaustive()
    }
}

/// Monotonic milliseconds since the call that made the clock.
fn monotonic_clock() -> RunClock {
    let start = Instant::now();
    Arc::new(move || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX))
}

impl Meter {
    /// A meter that charges nothing, on the monotonic clock.
    pub(crate) fn new() -> Meter {
        Meter {
            rates: None,
            budgets: None,
            clock: RwLock::new(monotonic_clock()),
        }
    }

    pub(crate) fn set_run_limits(&mut self, limits: AgentRunLimits) {
        self.budgets = Some(RunBudgets::new(limits));
    }

    pub(crate) fn set_rate_limits(&mut self, limits: AgentRateLimits) {
        self.rates = Some(RateLimiter::new(limits));
    }

    pub(crate) fn set_clock(&self, clock: RunClock) {
        *self.clock.write().unwrap_or_else(PoisonError::into_inner) = clock;
    }

    fn now(&self) -> u64 {
        let clock = Arc::clone(&self.clock.read().unwrap_or_else(PoisonError::into_inner));
        clock()
    }

    pub(crate) fn run_limits(&self) -> Option<&AgentRunLimits> {
        self.budgets.as_ref().map(RunBudgets::config)
    }

    pub(crate) fn rate_limits(&self) -> Option<&AgentRateLimits> {
        self.rates.as_ref().map(RateLimiter::config)
    }

    pub(crate) fn tracked_runs(&self) -> usize {
        self.budgets.as_ref().map_or(0, RunBudgets::tracked)
    }

    pub(crate) fn tracked_rate_buckets(&self) -> usize {
        self.rates.as_ref().map_or(0, RateLimiter::tracked)
    }

    /// Starts (or restarts) a run; `None` when runs are not budgeted.
    pub(crate) fn start_run(
        &self,
        agent_id: Option<&str>,
        run_id: &str,
        run_level: &RunLimitsLayer,
    ) -> Result<Option<RunLimits>, InputError> {
        match &self.budgets {
            None => Ok(None),
            Some(budgets) => budgets
                .start_run(agent_id, run_id, run_level, self.now())
                .map(Some),
        }
    }

    /// Charges one call of `agent_id` to `device_id`: the agent's rate (a
    /// call without an agent has none), then the run it names, if any.
    pub(crate) fn charge(
        &self,
        agent_id: Option<&str>,
        device_id: &str,
        run: Option<RunRef<'_>>,
        rates_here: bool,
    ) -> Result<(), MeterRefusal> {
        let charges_rate = rates_here && agent_id.is_some() && self.rates.is_some();
        let charges_run = run.is_some() && self.budgets.is_some();
        if !charges_rate && !charges_run {
            return Ok(());
        }
        let now = self.now();
        if let (true, Some(rates), Some(agent)) = (rates_here, &self.rates, agent_id) {
            rates
                .charge(agent, device_id, now)
                .map_err(MeterRefusal::Rate)?;
        }
        if let Some(budgets) = &self.budgets {
            budgets
                .charge_tool_call(agent_id, run, now)
                .map_err(MeterRefusal::Budget)?;
        }
        Ok(())
    }
}
