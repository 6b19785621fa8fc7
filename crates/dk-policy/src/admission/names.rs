//! The words the admission contract is written in: the streaming device
//! classes, the limits of a run budget, and the integers a JSON number holds
//! exactly. Every other part of the contract uses these and they use none.

use std::fmt;

/// A streaming device class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceClass {
    /// `voice`: a voice satellite streaming audio.
    Voice,
    /// `desktop-control`: a bridge streaming screenshots and driving a computer.
    DesktopControl,
}

impl DeviceClass {
    /// Both classes.
    pub const ALL: [DeviceClass; 2] = [DeviceClass::Voice, DeviceClass::DesktopControl];

    /// `voice` or `desktop-control`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Voice => "voice",
            DeviceClass::DesktopControl => "desktop-control",
        }
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One limit of a run budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunLimit {
    /// `maxTurns`: model turns (default 16, hard cap 64).
    MaxTurns,
    /// `maxProviderAttempts`: provider calls, retries included (24 / 256).
    MaxProviderAttempts,
    /// `maxToolRounds`: rounds of tool calls (8 / 64).
    MaxToolRounds,
    /// `maxToolCalls`: tool calls, device calls included (32 / 256).
    MaxToolCalls,
    /// `maxWallTimeMs`: wall time of the run in milliseconds (120,000 / 1,800,000).
    MaxWallTimeMs,
    /// `maxRequestBytes`: bytes of one provider request (8 MiB / 64 MiB).
    MaxRequestBytes,
    /// `maxResponseBytes`: bytes of one provider response frame (8 MiB / 64 MiB).
    MaxResponseBytes,
    /// `maxInputTokens`: input tokens over the run (40,000 / 1,000,000).
    MaxInputTokens,
    /// `maxOutputTokens`: output tokens over the run (10,000 / 250,000).
    MaxOutputTokens,
    /// `maxTotalTokens`: input plus output tokens over the run (50,000 / 1,000,000).
    MaxTotalTokens,
}

const MIB: u64 = 1024 * 1024;

impl RunLimit {
    /// Every limit, in Prism's order.
    pub const ALL: [RunLimit; 10] = [
        RunLimit::MaxTurns,
        RunLimit::MaxProviderAttempts,
        RunLimit::MaxToolRounds,
        RunLimit::MaxToolCalls,
        RunLimit::MaxWallTimeMs,
        RunLimit::MaxRequestBytes,
        RunLimit::MaxResponseBytes,
        RunLimit::MaxInputTokens,
        RunLimit::MaxOutputTokens,
        RunLimit::MaxTotalTokens,
    ];

    /// The name in configurations and messages, e.g. `maxToolCalls`.
    pub const fn name(self) -> &'static str {
        match self {
            RunLimit::MaxTurns => "maxTurns",
            RunLimit::MaxProviderAttempts => "maxProviderAttempts",
            RunLimit::MaxToolRounds => "maxToolRounds",
            RunLimit::MaxToolCalls => "maxToolCalls",
            RunLimit::MaxWallTimeMs => "maxWallTimeMs",
            RunLimit::MaxRequestBytes => "maxRequestBytes",
            RunLimit::MaxResponseBytes => "maxResponseBytes",
            RunLimit::MaxInputTokens => "maxInputTokens",
            RunLimit::MaxOutputTokens => "maxOutputTokens",
            RunLimit::MaxTotalTokens => "maxTotalTokens",
        }
    }

    /// The limit a run gets when no layer sets it.
    pub const fn default_value(self) -> u64 {
        match self {
            RunLimit::MaxTurns => 16,
            RunLimit::MaxProviderAttempts => 24,
            RunLimit::MaxToolRounds => 8,
            RunLimit::MaxToolCalls => 32,
            RunLimit::MaxWallTimeMs => 120_000,
            RunLimit::MaxRequestBytes | RunLimit::MaxResponseBytes => 8 * MIB,
            RunLimit::MaxInputTokens => 40_000,
            RunLimit::MaxOutputTokens => 10_000,
            RunLimit::MaxTotalTokens => 50_000,
        }
    }

    /// The largest value any layer may set.
    pub const fn hard_cap(self) -> u64 {
        match self {
            RunLimit::MaxTurns | RunLimit::MaxToolRounds => 64,
            RunLimit::MaxProviderAttempts | RunLimit::MaxToolCalls => 256,
            RunLimit::MaxWallTimeMs => 1_800_000,
            RunLimit::MaxRequestBytes | RunLimit::MaxResponseBytes => 64 * MIB,
            RunLimit::MaxInputTokens | RunLimit::MaxTotalTokens => 1_000_000,
            RunLimit::MaxOutputTokens => 250_000,
        }
    }

    /// The limit of that name, if there is one.
    pub fn from_name(name: &str) -> Option<RunLimit> {
        RunLimit::ALL.into_iter().find(|limit| limit.name() == name)
    }

    /// Whether the limit bounds each frame on its own (the byte limits) rather
    /// than the run's running total.
    pub const fn is_per_frame(self) -> bool {
        matches!(self, RunLimit::MaxRequestBytes | RunLimit::MaxResponseBytes)
    }
}

impl fmt::Display for RunLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The largest integer a JSON number (an IEEE double) holds exactly: 2^53 - 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// `value` as an integer when it is a "non-negative safe integer" in Prism's
/// sense: finite, no fraction, `0..=2^53-1` (`-0.0` is 0).
pub(super) fn safe_integer(value: f64) -> Option<u64> {
    if value.is_finite() && value.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER as f64).contains(&value)
    {
        // In range and integral, so the conversion is exact.
        Some(value as u64)
    } else {
        None
    }
}
