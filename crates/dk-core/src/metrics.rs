//! What the vessel counts for its operator: plain atomics, bumped where the
//! thing happens (a call's decision, a prompt's answer, an audit commit, a
//! dk/2 handshake that failed), read by whoever exposes them (dk-http's
//! `/metrics`). No lock, no allocation and no label built from a device,
//! tool or agent on the way: every label is one of the bounded enums below.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dk_proto::{CapabilityKind, Refusal};

/// The upper bounds of the latency histograms' buckets, in microseconds
/// (500 us to 2 min); a last bucket takes everything above.
const LATENCY_BOUNDS_US: [u64; 16] = [
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    120_000_000,
];

/// The upper bounds of the prompt answer histogram's buckets, in
/// microseconds (1 s to 10 min): a person answers in seconds, not
/// milliseconds.
const ANSWER_BOUNDS_US: [u64; 10] = [
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    20_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
    600_000_000,
];

/// A histogram of durations over fixed buckets: one atomic add per bucket
/// hit, one for the sum.
#[derive(Debug)]
pub struct Histogram {
    bounds_us: &'static [u64],
    /// One count per bound, then the count above the last one.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Each bucket's upper bound in seconds (the last one infinite) and how
    /// many durations fell in it (not cumulative).
    pub buckets: Vec<(f64, u64)>,
    /// How many durations were observed (the buckets' total).
    pub count: u64,
    /// Their sum in seconds.
    pub sum_seconds: f64,
}

impl Histogram {
    fn over(bounds_us: &'static [u64]) -> Histogram {
        Histogram {
            bounds_us,
            counts: (0..=bounds_us.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn latency() -> Histogram {
        Histogram::over(&LATENCY_BOUNDS_US)
    }

    /// Counts one duration.
    pub fn observe(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = self
            .bounds_us
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(self.bounds_us.len());
        if let Some(count) = self.counts.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The buckets, count and sum now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let bounds = self
            .bounds_us
            .iter()
            .map(|&us| us as f64 / 1e6)
            .chain(std::iter::once(f64::INFINITY));
        let buckets: Vec<(f64, u64)> = bounds
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            count: buckets.iter().map(|(_, n)| n).sum(),
            buckets,
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// Declares a bounded label: its values, their names and their order.
macro_rules! label {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every value, in the order they are exposed.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            fn index(self) -> usize {
                self as usize
            }
        }
    };
}

label! {
    /// The kind of capability a call named (label `kind`).
    CallKind {
        /// A sensor: reads the world.
        Sensor => "sensor",
        /// An actuator: changes the world.
        Actuator => "actuator",
        /// The call named no declared capability of a paired device, or was
        /// abandoned or refused before its device was read.
        Unknown => "unknown",
    }
}

label! {
    /// How a call was decided (label `decision`), in the audit log's terms.
    CallDecision {
        /// Every check passed and the device answered (`allowed`).
        Allowed => "allowed",
        /// Refused by one of the vessel's own checks (`[8dk-deny] ...`).
        Denied => "denied",
        /// Refused by a rule or the person (`[policy] ...`).
        Policy => "policy",
        /// Every check passed but the device failed or did not answer
        /// (`device error: ...`, recorded as allowed).
        DeviceError => "device_error",
        /// The caller gave up on the call before it was decided.
        Abandoned => "abandoned",
    }
}

impl CallDecision {
    /// The decision a refusal makes.
    pub fn of(refusal: &Refusal) -> CallDecision {
        if refusal.by_policy() {
            CallDecision::Policy
        } else {
            CallDecision::Denied
        }
    }
}

label! {
    /// Which limit refused a call (label `limit`).
    LimitReached {
        /// The calling agent's rate over all devices.
        Agent => "agent",
        /// The calling agent's rate for one device.
        Device => "device",
        /// A rule's `limit`.
        Rule => "rule",
        /// A run's budget.
        RunBudget => "run_budget",
    }
}

impl LimitReached {
    /// The limit `refusal` says was reached, if it is one.
    pub fn of(refusal: &Refusal) -> Option<LimitReached> {
        match refusal {
            Refusal::AgentRate { .. } => Some(LimitReached::Agent),
            Refusal::DeviceRate { .. } => Some(LimitReached::Device),
            Refusal::RuleLimited { .. } => Some(LimitReached::Rule),
            Refusal::RunBudgetSpent { .. } => Some(LimitReached::RunBudget),
            _ => None,
        }
    }
}

label! {
    /// Why a dk/2 handshake did not finish (label `reason`).
    HandshakeFailure {
        /// It did not finish within the handshake deadline.
        Timeout => "timeout",
        /// The device closed or left before it finished.
        Closed => "closed",
        /// A handshake message did not hold (its length, its key, its
        /// decryption).
        BadMessage => "bad_message",
        /// A text message came where a handshake message belongs.
        NotBinary => "not_binary",
        /// The vessel has no static key (its system gave no randomness).
        NoKey => "no_key",
    }
}

label! {
    /// What the person was asked (label `prompt`).
    PromptKind {
        /// A device asks to pair.
        Pairing => "pairing",
        /// A call needs a yes.
        Approval => "approval",
    }
}

/// A count per value of a label.
#[derive(Debug)]
struct PerLabel(Box<[AtomicU64]>);

impl PerLabel {
    fn new(values: usize) -> PerLabel {
        PerLabel((0..values).map(|_| AtomicU64::new(0)).collect())
    }

    fn add(&self, index: usize) {
        if let Some(count) = self.0.get(index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get(&self, index: usize) -> u64 {
        self.0.get(index).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// The vessel's counters and histograms (the gauges are read from its state
/// when asked: see [`Vessel`](crate::Vessel)).
#[derive(Debug)]
pub struct Metrics {
    /// Calls by kind, then decision.
    calls: PerLabel,
    /// Call durations by kind.
    call_seconds: Box<[Histogram]>,
    rate_limited: PerLabel,
    handshake_failures: PerLabel,
    /// Time from asking the person to their answer, by prompt kind.
    answer_seconds: Box<[Histogram]>,
    audit_commit_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            calls: PerLabel::new(CallKind::ALL.len() * CallDecision::ALL.len()),
            call_seconds: CallKind::ALL.iter().map(|_| Histogram::latency()).collect(),
            rate_limited: PerLabel::new(LimitReached::ALL.len()),
            handshake_failures: PerLabel::new(HandshakeFailure::ALL.len()),
            answer_seconds: PromptKind::ALL
                .iter()
                .map(|_| Histogram::over(&ANSWER_BOUNDS_US))
                .collect(),
            audit_commit_seconds: Histogram::latency(),
        }
    }
}

fn call_index(kind: CallKind, decision: CallDecision) -> usize {
    kind.index() * CallDecision::ALL.len() + decision.index()
}

impl Metrics {
    /// Counts one decided call, which took `took` from its start to its
    /// decision.
    pub fn call_decided(&self, kind: CallKind, decision: CallDecision, took: Duration) {
        self.calls.add(call_index(kind, decision));
        if let Some(histogram) = self.call_seconds.get(kind.index()) {
            histogram.observe(took);
        }
    }

    /// Counts a call refused for reaching `limit`.
    pub fn rate_limited(&self, limit: LimitReached) {
        self.rate_limited.add(limit.index());
    }

    /// Counts a dk/2 handshake that did not finish.
    pub fn handshake_failed(&self, why: HandshakeFailure) {
        self.handshake_failures.add(why.index());
    }

    /// Counts the person's answer to a prompt asked `took` ago.
    pub fn person_answered(&self, prompt: PromptKind, took: Duration) {
        if let Some(histogram) = self.answer_seconds.get(prompt.index()) {
            histogram.observe(took);
        }
    }

    /// Counts one audit commit that took `took`.
    pub fn audit_committed(&self, took: Duration) {
        self.audit_commit_seconds.observe(took);
    }

    /// Calls of `kind` decided as `decision` so far.
    pub fn calls(&self, kind: CallKind, decision: CallDecision) -> u64 {
        self.calls.get(call_index(kind, decision))
    }

    /// The durations of calls of `kind`.
    pub fn call_seconds(&self, kind: CallKind) -> Option<HistogramSnapshot> {
        self.call_seconds.get(kind.index()).map(Histogram::snapshot)
    }

    /// Calls refused for reaching `limit` so far.
    pub fn rate_limited_calls(&self, limit: LimitReached) -> u64 {
        self.rate_limited.get(limit.index())
    }

    /// dk/2 handshakes that failed for `why` so far.
    pub fn handshake_failures(&self, why: HandshakeFailure) -> u64 {
        self.handshake_failures.get(why.index())
    }

    /// The times the person took to answer prompts of `prompt`.
    pub fn answer_seconds(&self, prompt: PromptKind) -> Option<HistogramSnapshot> {
        self.answer_seconds
            .get(prompt.index())
            .map(Histogram::snapshot)
    }

    /// The times audit commits took.
    pub fn audit_commit_seconds(&self) -> HistogramSnapshot {
        self.audit_commit_seconds.snapshot()
    }
}

impl From<CapabilityKind> for CallKind {
    fn from(kind: CapabilityKind) -> CallKind {
        match kind {
            CapabilityKind::Sensor => CallKind::Sensor,
            CapabilityKind::Actuator => CallKind::Actuator,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_lands_in_the_first_bucket_that_holds_it_and_in_the_sum() {
        let histogram = Histogram::latency();
        histogram.observe(Duration::from_micros(500));
        histogram.observe(Duration::from_micros(501));
        histogram.observe(Duration::from_secs(600));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 3);
        assert_eq!(snapshot.buckets[0], (0.0005, 1));
        assert_eq!(snapshot.buckets[1], (0.001, 1));
        assert_eq!(snapshot.buckets.last(), Some(&(f64::INFINITY, 1)));
        assert!((snapshot.sum_seconds - 600.001001).abs() < 1e-9);
    }

    #[test]
    fn every_call_count_has_a_place_of_its_own() {
        let metrics = Metrics::default();
        for (n, kind) in CallKind::ALL.iter().enumerate() {
            for (m, decision) in CallDecision::ALL.iter().enumerate() {
                for _ in 0..(n * 10 + m) {
                    metrics.call_decided(*kind, *decision, Duration::ZERO);
                }
            }
        }
        for (n, kind) in CallKind::ALL.iter().enumerate() {
            for (m, decision) in CallDecision::ALL.iter().enumerate() {
                assert_eq!(metrics.calls(*kind, *decision), (n * 10 + m) as u64);
            }
        }
    }
}
