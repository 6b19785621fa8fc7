//! Run budgets of agent sessions: every device call an agent session makes
//! charges that session's run budget (dk-policy's [`RunLimits`], counted by a
//! [`RunTracker`]) before the device is reached.
//!
//! A budget is kept per (agent, session); a call without a session is
//! charged to its agent; a call without an agent (the in-process API) is not
//! charged unless the host asks ([`AgentRunLimits::charge_calls_without_agent`]).
//! Memory is bounded: a run idle for [`AgentRunLimits::idle_expiry`] is
//! forgotten, and past [`AgentRunLimits::max_tracked_runs`] the least
//! recently used runs are dropped first.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dk_policy::{
    InputError, RunLimit, RunLimitBreach, RunLimits, RunLimitsLayer, RunTracker, narrow,
};

/// How many runs are tracked at once by default (10,000).
pub const DEFAULT_MAX_TRACKED_RUNS: usize = 10_000;

/// How long a run may stay without a call before it is forgotten, by default
/// (60 seconds). A run is thus a burst of calls: an agent that keeps calling
/// stays in its run (and, once over budget, stays refused), while one that
/// pauses for a minute, as a conversation with a person does, starts afresh.
/// An MCP session lives for hours; a run of Prism's size (32 calls, 120 s)
/// fits a burst, not a session.
pub const DEFAULT_RUN_IDLE_EXPIRY: Duration = Duration::from_secs(60);

/// The limits the vessel itself charges on every device call; the others
/// (turns, provider calls, bytes, tokens) are counted by the host that runs
/// the model.
pub(crate) const ENFORCED_RUN_LIMITS: [RunLimit; 2] =
    [RunLimit::MaxToolCalls, RunLimit::MaxWallTimeMs];

/// How the vessel budgets the device calls of agent sessions: the run limits
/// of `/work/shared/spec/admission.md` (Prism's), charged before the device is
/// reached.
///
/// The budget of a run is the agent-level layer ([`AgentRunLimits::per_agent`]
/// for that agent, else [`AgentRunLimits::agent_level`]) over Prism's defaults,
/// narrowed by a run-level layer when the host gives one
/// ([`DeviceToolAdapter::start_run`](crate::DeviceToolAdapter::start_run)). Each
/// device call charges one `maxToolCalls` and checks `maxWallTimeMs` (counted
/// from the run's first charged call); going past a limit refuses the call,
/// and every later call of that run, until the run is forgotten.
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
    /// Whether calls that name no agent (the in-process Rust API, an admin
    /// call without `agentId`) are charged too, by session. Default: `false`.
    pub charge_calls_without_agent: bool,
    /// Runs tracked at once; past this the least recently used are
    /// forgotten (their next call starts a new run). Default:
    /// [`DEFAULT_MAX_TRACKED_RUNS`].
    pub max_tracked_runs: usize,
    /// A run with no call for this long is forgotten; its session's next call
    /// starts a new run. A run refused for its budget stays refused while
    /// calls keep coming. Default: [`DEFAULT_RUN_IDLE_EXPIRY`].
    pub idle_expiry: Duration,
}

impl Default for AgentRunLimits {
    fn default() -> Self {
        AgentRunLimits {
            agent_level: RunLimitsLayer::new(),
            per_agent: BTreeMap::new(),
            charge_calls_without_agent: false,
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

/// The clock run budgets read: milliseconds from any fixed start. The default
/// is monotonic time since the adapter was made; tests inject their own.
pub type RunClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Why a call was refused for its run budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BudgetRefusal {
    /// A limit went past (the run's first breach).
    Breach(RunLimitBreach),
    /// The configured layers are out of range.
    Misconfigured(InputError),
}

impl fmt::Display for BudgetRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetRefusal::Breach(breach) => {
                write!(f, "[8dk-deny] {breach}: this session's run budget is spent")
            }
            BudgetRefusal::Misconfigured(error) => {
                write!(f, "[8dk-deny] the run budget is misconfigured: {error}")
            }
        }
    }
}

/// Whose run: (agent, session).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RunKey {
    agent: Option<Box<str>>,
    session: Option<Box<str>>,
}

struct Run {
    tracker: RunTracker,
    last_used_ms: u64,
}

struct Runs {
    map: HashMap<RunKey, Run>,
    next_sweep_ms: u64,
}

/// The run budgets of the sessions calling through one adapter.
pub(crate) struct RunBudgets {
    config: AgentRunLimits,
    clock: RunClock,
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

/// Monotonic milliseconds since the call that made the clock.
fn monotonic_clock() -> RunClock {
    let start = Instant::now();
    Arc::new(move || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX))
}

impl RunBudgets {
    pub(crate) fn new(config: AgentRunLimits) -> RunBudgets {
        RunBudgets {
            config,
            clock: monotonic_clock(),
            runs: Mutex::new(Runs {
                map: HashMap::new(),
                next_sweep_ms: 0,
            }),
        }
    }

    pub(crate) fn set_clock(&mut self, clock: RunClock) {
        self.clock = clock;
    }

    pub(crate) fn config(&self) -> &AgentRunLimits {
        &self.config
    }

    /// Runs tracked now.
    pub(crate) fn tracked(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key(&self, agent_id: Option<&str>, session_id: Option<&str>) -> Option<RunKey> {
        if agent_id.is_none() && !self.config.charge_calls_without_agent {
            return None;
        }
        Some(RunKey {
            agent: agent_id.map(Box::from),
            session: session_id.map(Box::from),
        })
    }

    /// Starts (or restarts) the run of `agent_id`'s `session_id` with the
    /// agent-level budget narrowed by `run_level`; returns the budget.
    pub(crate) fn start_run(
        &self,
        agent_id: Option<&str>,
        session_id: Option<&str>,
        run_level: &RunLimitsLayer,
    ) -> Result<RunLimits, InputError> {
        let limits = narrow(Some(self.config.layer_of(agent_id)), Some(run_level))?;
        let key = RunKey {
            agent: agent_id.map(Box::from),
            session: session_id.map(Box::from),
        };
        let now = (self.clock)();
        let mut runs = self.lock();
        runs.map.remove(&key);
        self.make_room(&mut runs, now);
        runs.map.insert(
            key,
            Run {
                tracker: RunTracker::new(limits, now),
                last_used_ms: now,
            },
        );
        Ok(limits)
    }

    /// Charges one tool call to the caller's run (checking its wall time
    /// first). `Ok` when the call may go on, or when it is not charged at
    /// all (no agent, and the host did not ask).
    pub(crate) fn charge_tool_call(
        &self,
        agent_id: Option<&str>,
        session_id: Option<&str>,
    ) -> Result<(), BudgetRefusal> {
        let Some(key) = self.key(agent_id, session_id) else {
            return Ok(());
        };
        let now = (self.clock)();
        let mut runs = self.lock();
        if now >= runs.next_sweep_ms {
            self.forget_idle(&mut runs, now);
        }
        if !runs.map.contains_key(&key) {
            let limits = narrow(Some(self.config.layer_of(agent_id)), None)
                .map_err(BudgetRefusal::Misconfigured)?;
            self.make_room(&mut runs, now);
            runs.map.insert(
                key.clone(),
                Run {
                    tracker: RunTracker::new(limits, now),
                    last_used_ms: now,
                },
            );
        }
        let Some(run) = runs.map.get_mut(&key) else {
            return Ok(());
        };
        run.last_used_ms = now;
        run.tracker
            .check_wall_time(now)
            .and_then(|()| run.tracker.charge_tool_call())
            .map_err(BudgetRefusal::Breach)
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
