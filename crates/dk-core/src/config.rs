//! The vessel's configuration file (TOML, `dk vessel --config FILE`): which
//! streaming device kinds the vessel admits and their caps, the rate limits
//! every agent's device calls are charged to (`[rateLimits]`), the budget of
//! explicit runs (`[runLimits]`), and the limits of its listeners and
//! connections (`[limits]`). Every key is documented in `docs/CONFIG.md`.
//!
//! The file is read fail-closed: a syntax error, an unknown key, a wrong type
//! or a value out of range refuses the whole file, with the key that is wrong.
//! Each streaming kind is resolved with dk-policy's admission contract
//! ([`dk_policy::resolve`]), so a file that loads holds only valid policies. A
//! kind the file does not configure is not admitted (deny by default).

use std::num::NonZeroU32;
use std::time::Duration;

use dk_policy::{
    DeviceClass, RawDevicePolicy, ResolveOptions, ResolvedPolicy, RunLimit, RunLimits,
    RunLimitsLayer, resolve,
};

use crate::adapter::{DEFAULT_AGENT_RATE, DEFAULT_DEVICE_RATE, ENFORCED_RUN_LIMITS, RateLimit};
use crate::limits::Limits;

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than the reader takes.
    #[error("`{path}` is larger than {limit} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// The largest file read, in bytes.
        limit: u64,
    },
    /// Not TOML.
    #[error("not valid TOML: {0}")]
    Syntax(String),
    /// A key no configuration has.
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    /// A key whose value has the wrong shape (e.g. `streaming` not a table).
    #[error("`{key}` must be {expected}")]
    Shape {
        /// The key, dotted.
        key: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A value of the wrong type or outside its range, or a section that
    /// is not a table: `problem` says what it must be and, for a value,
    /// what it is (`` `limits.callTimeoutMs` must be a whole number of
    /// milliseconds from 100 to 3600000, not 0 ``).
    #[error("`{key}` {problem}")]
    Invalid {
        /// The key, dotted (`limits.callTimeoutMs`).
        key: String,
        /// What it must be, and what it is.
        problem: String,
    },
    /// `[runLimits]` is refused by the run-limit rules.
    #[error("`runLimits`: {0}")]
    RunLimits(#[source] dk_policy::InputError),
    /// `[runLimits]` sets a limit the vessel does not enforce (model turns,
    /// provider calls, bytes, tokens: the host that runs the model counts
    /// those).
    #[error(
        "`runLimits.{limit}` is not enforced by the vessel: the host that runs the model counts \
         turns, provider calls and tokens, so set it there; here only `maxToolCalls` and \
         `maxWallTimeMs` are allowed",
        limit = limit.name()
    )]
    NotEnforced {
        /// The limit.
        limit: RunLimit,
    },
    /// A `[rateLimits]` burst given for a rate the file turns off.
    #[error("`rateLimits.{burst}` is set but `rateLimits.{rate}` is 0, which turns that limit off")]
    BurstWithoutRate {
        /// The burst key.
        burst: &'static str,
        /// The rate key set to 0.
        rate: &'static str,
    },
    /// A streaming kind's policy is refused by the admission contract.
    #[error("`streaming.{kind}`: {error} ({code})", code = error.code())]
    Policy {
        /// The kind, as written.
        kind: String,
        /// The contract's refusal.
        error: dk_policy::AdmissionError,
    },
}

/// Which streaming kinds a vessel admits, each with its resolved policy.
/// The default admits none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamingConfig {
    voice: Option<ResolvedPolicy>,
    desktop_control: Option<ResolvedPolicy>,
}

impl StreamingConfig {
    /// A configuration that admits no streaming kind.
    pub fn deny_all() -> StreamingConfig {
        StreamingConfig::default()
    }

    /// Sets the policy of one kind (its kind is the policy's).
    #[must_use]
    pub(crate) fn with_policy(mut self, policy: ResolvedPolicy) -> StreamingConfig {
        match policy.kind() {
            DeviceClass::Voice => self.voice = Some(policy),
            DeviceClass::DesktopControl => self.desktop_control = Some(policy),
        }
        self
    }

    /// The configured policy of `kind`, if the file has one.
    pub fn configured(&self, kind: DeviceClass) -> Option<&ResolvedPolicy> {
        match kind {
            DeviceClass::Voice => self.voice.as_ref(),
            DeviceClass::DesktopControl => self.desktop_control.as_ref(),
        }
    }

    /// The largest chunk cap of any enabled kind; `None` when no kind is
    /// enabled (then no binary message is ever accepted).
    pub(crate) fn largest_chunk_cap(&self) -> Option<u64> {
        [self.voice.as_ref(), self.desktop_control.as_ref()]
            .into_iter()
            .flatten()
            .filter(|p| p.enabled())
            .map(ResolvedPolicy::max_chunk_bytes)
            .max()
    }

    /// The run limits of `kind`'s policy, if it sets them.
    pub fn run_limits(&self, kind: DeviceClass) -> Option<&RunLimits> {
        self.configured(kind).and_then(ResolvedPolicy::run_limits)
    }
}

/// A vessel's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VesselConfig {
    /// `[streaming.<kind>]`: the streaming kinds admitted.
    pub streaming: StreamingConfig,
    /// `[runLimits]`: the agent-level budget of every explicit run (see
    /// [`VesselConfig::apply_to`]); only `maxToolCalls` and `maxWallTimeMs`.
    /// Absent, the vessel's defaults stand.
    pub run_limits: Option<RunLimitsLayer>,
    /// `[rateLimits]`: the rate limits of every agent's device calls (see
    /// [`VesselConfig::apply_to`]); absent, the vessel's defaults stand.
    pub rate_limits: Option<RateLimitSettings>,
    /// `[limits]`: the limits the file sets, each checked against its range;
    /// a limit it does not set keeps its default.
    pub limits: LimitSettings,
}

/// The `[limits]` a configuration file sets; `None` keeps the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitSettings {
    /// `maxFrameBytes`: [`Limits::max_frame_bytes`].
    pub max_frame_bytes: Option<usize>,
    /// `handshakeTimeoutMs`: [`Limits::handshake_timeout`].
    pub handshake_timeout: Option<Duration>,
    /// `maxPendingCalls`: [`Limits::max_pending_calls`].
    pub max_pending_calls: Option<usize>,
    /// `maxConnections`: [`Limits::max_connections`].
    pub max_connections: Option<usize>,
    /// `maxConnectionsPerAddress`: [`Limits::max_connections_per_address`].
    pub max_connections_per_address: Option<usize>,
    /// `maxUnauthenticatedPerAddress`:
    /// [`Limits::max_unauthenticated_per_address`].
    pub max_unauthenticated_per_address: Option<usize>,
    /// `adminConnections`: the admin API listener's cap in total (dk-http's
    /// `HttpLimits::admin_connections`; not in [`Limits`]).
    pub admin_connections: Option<usize>,
    /// `adminConnectionsPerAddress`: the admin API listener's cap per
    /// address (dk-http's `HttpLimits::admin_connections`).
    pub admin_connections_per_address: Option<usize>,
    /// `mcpConnections`: the MCP listener's cap in total (dk-mcp's
    /// `McpOptions::listener`).
    pub mcp_connections: Option<usize>,
    /// `mcpConnectionsPerAddress`: the MCP listener's cap per address
    /// (dk-mcp's `McpOptions::listener`).
    pub mcp_connections_per_address: Option<usize>,
    /// `headerReadTimeoutMs`: every listener's header-read deadline
    /// (dk-http's `HttpLimits::header_read_timeout`, dk-mcp's
    /// `McpOptions::listener`).
    pub header_read_timeout: Option<Duration>,
    /// `idleTimeoutMs`: every listener's idle timeout (dk-http's
    /// `HttpLimits::idle_timeout`, dk-mcp's `McpOptions::listener`).
    pub idle_timeout: Option<Duration>,
    /// `maxFramesPerSecond`: [`Limits::max_frames_per_second`].
    pub max_frames_per_second: Option<u32>,
    /// `maxMalformedFrames`: [`Limits::max_malformed_frames`].
    pub max_malformed_frames: Option<u32>,
    /// `pingIntervalMs`: [`Limits::ping_interval`].
    pub ping_interval: Option<Duration>,
    /// `consentTimeoutMs`: [`Limits::consent_timeout`].
    pub consent_timeout: Option<Duration>,
    /// `approvalTimeoutMs`: [`Limits::approval_timeout`].
    pub approval_timeout: Option<Duration>,
    /// `callTimeoutMs`: [`Limits::call_timeout`].
    pub call_timeout: Option<Duration>,
    /// `durableWithinMs`: [`Limits::durable_within`].
    pub durable_within: Option<Duration>,
    /// `deviceOrigins`: the `Origin` values the `/device` route allows
    /// (dk-http's `HttpLimits::device_origins`).
    pub device_origins: Option<Vec<String>>,
}

/// The `[rateLimits]` a configuration file sets; `None` keeps the default.
/// A rate of 0 turns that limit off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimitSettings {
    /// `callsPerMinute`: the rate of
    /// [`AgentRateLimits::overall`](crate::adapter::AgentRateLimits::overall) (0: no
    /// limit).
    pub calls_per_minute: Option<u32>,
    /// `burst`: the burst of
    /// [`AgentRateLimits::overall`](crate::adapter::AgentRateLimits::overall).
    pub burst: Option<u32>,
    /// `perDeviceCallsPerMinute`: the rate of
    /// [`AgentRateLimits::per_device`](crate::adapter::AgentRateLimits::per_device)
    /// (0: no limit).
    pub per_device_calls_per_minute: Option<u32>,
    /// `perDeviceBurst`: the burst of
    /// [`AgentRateLimits::per_device`](crate::adapter::AgentRateLimits::per_device).
    pub per_device_burst: Option<u32>,
}
/// The largest `callsPerMinute` and `perDeviceCallsPerMinute` (1,000 a second).
const MAX_CALLS_PER_MINUTE: u64 = 60_000;

/// The largest `burst` and `perDeviceBurst`.
const MAX_BURST: u64 = 10_000;

/// The largest number of `deviceOrigins`.
const MAX_DEVICE_ORIGINS: usize = 64;

/// The file as serde reads it: each key is spelt once, as a field (camelCase),
/// with the type that checks its value. `streaming` and `runLimits` are
/// handed on whole to dk-policy's admission contract, which has its own
/// reader and messages.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    limits: Option<LimitsSection>,
    rate_limits: Option<RateLimitsSection>,
    run_limits: Option<toml::Value>,
    streaming: Option<toml::Value>,
}

/// `[limits]`. The order of the fields is the order the unknown-key message
/// lists them in. The ranges: at least a second for `headerReadTimeoutMs`
/// (hyper needs time to read any request); `idleTimeoutMs` above the 15 s
/// keep-alive of MCP's event streams, so a quiet stream an agent listens on
/// is never taken for an idle connection.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a table"
)]
struct LimitsSection {
    max_frame_bytes: Option<Count<1024, { 16 * 1024 * 1024 }>>,
    handshake_timeout_ms: Option<Millis<1000, 300_000>>,
    max_pending_calls: Option<Count<1, 4096>>,
    max_connections: Option<Count<1, 1_000_000>>,
    max_connections_per_address: Option<Count<1, 1_000_000>>,
    max_unauthenticated_per_address: Option<Count<1, 65_536>>,
    admin_connections: Option<Count<1, 65_536>>,
    admin_connections_per_address: Option<Count<1, 65_536>>,
    mcp_connections: Option<Count<1, 65_536>>,
    mcp_connections_per_address: Option<Count<1, 65_536>>,
    header_read_timeout_ms: Option<Millis<1000, 300_000>>,
    idle_timeout_ms: Option<Millis<20_000, 86_400_000>>,
    max_frames_per_second: Option<Count<1, 1_000_000>>,
    max_malformed_frames: Option<Count<0, 1000>>,
    ping_interval_ms: Option<Millis<1000, 600_000>>,
    consent_timeout_ms: Option<Millis<5_000, 86_400_000>>,
    approval_timeout_ms: Option<Millis<5_000, 86_400_000>>,
    call_timeout_ms: Option<Millis<100, 3_600_000>>,
    durable_within_ms: Option<Millis<100, 60_000>>,
    device_origins: Option<Origins>,
}

/// `[rateLimits]`, in the order the unknown-key message lists the keys.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a table"
)]
struct RateLimitsSection {
    calls_per_minute: Option<Rate>,
    burst: Option<Count<1, MAX_BURST>>,
    per_device_calls_per_minute: Option<Rate>,
    per_device_burst: Option<Count<1, MAX_BURST>>,
}

/// What a value must be, for the message that refuses it: the words after
/// "must be" and the value as written.
fn must_be<E: serde::de::Error>(expected: &str, value: &str) -> E {
    E::custom(format_args!("must be {expected}, not {value}"))
}

/// An integer in `MIN..=MAX` (a count, a rate or a burst). A minimum of 0
/// reads as "no limit" for the rates that take it.
#[derive(Debug, Clone, Copy)]
struct Count<const MIN: u64, const MAX: u64>(u64);

impl<const MIN: u64, const MAX: u64> Count<MIN, MAX> {
    /// What the value must be, in words.
    fn range() -> String {
        format!("an integer from {MIN} to {MAX}")
    }

    /// The value, as the type a setting holds (every range fits in a u32).
    fn get<T: TryFrom<u64> + Default>(self) -> T {
        T::try_from(self.0).unwrap_or_default()
    }
}

impl<'de, const MIN: u64, const MAX: u64> serde::Deserialize<'de> for Count<MIN, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(deserializer)?;
        let range = Self::range();
        in_range(&value, MIN, MAX)
            .filter(|n| u32::try_from(*n).is_ok())
            .map(Count)
            .ok_or_else(|| must_be(&range, &shown(&value)))
    }
}

/// The integer `value` holds when it is in `min..=max`.
fn in_range(value: &toml::Value, min: u64, max: u64) -> Option<u64> {
    let toml::Value::Integer(n) = value else {
        return None;
    };
    u64::try_from(*n).ok().filter(|n| (min..=max).contains(n))
}

/// A rate of calls a minute, from 0 (no limit) to [`MAX_CALLS_PER_MINUTE`].
#[derive(Debug, Clone, Copy)]
struct Rate(u32);

impl<'de> serde::Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(deserializer)?;
        in_range(&value, 0, MAX_CALLS_PER_MINUTE)
            .and_then(|n| u32::try_from(n).ok())
            .map(Rate)
            .ok_or_else(|| {
                must_be(
                    &format!("an integer from 0 (no limit) to {MAX_CALLS_PER_MINUTE}"),
                    &shown(&value),
                )
            })
    }
}

/// A whole number of milliseconds in `MIN..=MAX`.
#[derive(Debug, Clone, Copy)]
struct Millis<const MIN: u64, const MAX: u64>(Duration);

impl<'de, const MIN: u64, const MAX: u64> serde::Deserialize<'de> for Millis<MIN, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(deserializer)?;
        in_range(&value, MIN, MAX)
            .map(|ms| Millis(Duration::from_millis(ms)))
            .ok_or_else(|| {
                must_be(
                    &format!("a whole number of milliseconds from {MIN} to {MAX}"),
                    &shown(&value),
                )
            })
    }
}

/// `deviceOrigins`: a list of origins such as `https://bridge.example` or
/// `http://127.0.0.1:8080` (scheme, host, optional port; no path).
#[derive(Debug, Clone)]
struct Origins(Vec<String>);

impl<'de> serde::Deserialize<'de> for Origins {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(deserializer)?;
        let expected = format!(
            "a list of at most {MAX_DEVICE_ORIGINS} origins like `https://host` or `http://host:port`"
        );
        let toml::Value::Array(items) = &value else {
            return Err(must_be(&expected, &shown(&value)));
        };
        if items.len() > MAX_DEVICE_ORIGINS {
            return Err(must_be(&expected, &format!("{} origins", items.len())));
        }
        items
            .iter()
            .map(|item| match item {
                toml::Value::String(origin) if is_origin(origin) => Ok(origin.clone()),
                other => Err(must_be(&expected, &shown(other))),
            })
            .collect::<Result<_, _>>()
            .map(Origins)
    }
}

impl LimitsSection {
    fn settings(self) -> LimitSettings {
        LimitSettings {
            max_frame_bytes: self.max_frame_bytes.map(Count::get),
            handshake_timeout: self.handshake_timeout_ms.map(|m| m.0),
            max_pending_calls: self.max_pending_calls.map(Count::get),
            max_connections: self.max_connections.map(Count::get),
            max_connections_per_address: self.max_connections_per_address.map(Count::get),
            max_unauthenticated_per_address: self.max_unauthenticated_per_address.map(Count::get),
            admin_connections: self.admin_connections.map(Count::get),
            admin_connections_per_address: self.admin_connections_per_address.map(Count::get),
            mcp_connections: self.mcp_connections.map(Count::get),
            mcp_connections_per_address: self.mcp_connections_per_address.map(Count::get),
            header_read_timeout: self.header_read_timeout_ms.map(|m| m.0),
            idle_timeout: self.idle_timeout_ms.map(|m| m.0),
            max_frames_per_second: self.max_frames_per_second.map(Count::get),
            max_malformed_frames: self.max_malformed_frames.map(Count::get),
            ping_interval: self.ping_interval_ms.map(|m| m.0),
            consent_timeout: self.consent_timeout_ms.map(|m| m.0),
            approval_timeout: self.approval_timeout_ms.map(|m| m.0),
            call_timeout: self.call_timeout_ms.map(|m| m.0),
            durable_within: self.durable_within_ms.map(|m| m.0),
            device_origins: self.device_origins.map(|o| o.0),
        }
    }
}

impl RateLimitsSection {
    /// The settings, refused when a burst is given for a rate set to 0.
    fn settings(self) -> Result<RateLimitSettings, ConfigError> {
        let settings = RateLimitSettings {
            calls_per_minute: self.calls_per_minute.map(|r| r.0),
            burst: self.burst.map(Count::get),
            per_device_calls_per_minute: self.per_device_calls_per_minute.map(|r| r.0),
            per_device_burst: self.per_device_burst.map(Count::get),
        };
        for (rate, rate_key, burst, burst_key) in [
            (
                settings.calls_per_minute,
                "callsPerMinute",
                settings.burst,
                "burst",
            ),
            (
                settings.per_device_calls_per_minute,
                "perDeviceCallsPerMinute",
                settings.per_device_burst,
                "perDeviceBurst",
            ),
        ] {
            if rate == Some(0) && burst.is_some() {
                return Err(ConfigError::BurstWithoutRate {
                    burst: burst_key,
                    rate: rate_key,
                });
            }
        }
        Ok(settings)
    }
}

/// The message for what serde refused, at `path` (dotted keys; `.` for the
/// file itself).
fn refusal(error: &serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
    let path = error.path().to_string();
    let message = error.inner().message();
    if let Some(key) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    {
        // The path ends at the unknown key; the section is before it.
        let section = path
            .strip_suffix(key)
            .and_then(|section| section.strip_suffix('.'))
            .unwrap_or_default();
        let known = match section {
            "" => return ConfigError::UnknownKey(key.to_owned()),
            "limits" => field_names::<LimitsSection>(),
            "rateLimits" => field_names::<RateLimitsSection>(),
            _ => &[],
        };
        return ConfigError::UnknownKey(format!(
            "{section}.{key}` (known: {}; see docs/CONFIG.md",
            known.join(", ")
        ));
    }
    let problem = match message.rsplit_once(", expected ") {
        // A section that is not a table (the sections say `expecting`).
        Some((_, expected)) if message.starts_with("invalid type: ") => {
            format!("must be {expected}")
        }
        _ => message.to_owned(),
    };
    ConfigError::Invalid { key: path, problem }
}

/// The keys a section's serde struct takes, in their order: what its derived
/// `Deserialize` hands to `deserialize_struct`.
fn field_names<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    /// A deserializer that only notes the fields it is asked for.
    struct Names<'a>(&'a mut &'static [&'static str]);

    impl<'de> serde::Deserializer<'de> for Names<'_> {
        type Error = serde::de::value::Error;

        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("only the field names are read"))
        }

        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("only the field names are read"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    // The error is the point: the deserializer stops once it has the names.
    let _ = T::deserialize(Names(&mut fields));
    fields
}

impl VesselConfig {
    /// Reads and checks a configuration from TOML text (the binary reads the
    /// file: `dk_vessel::config::load`).
    pub fn parse(text: &str) -> Result<VesselConfig, ConfigError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(one_line(&e.to_string())))?;
        let file: ConfigFile = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|error| refusal(&error))?;
        let mut config = VesselConfig {
            limits: file.limits.map(LimitsSection::settings).unwrap_or_default(),
            rate_limits: file
                .rate_limits
                .map(RateLimitsSection::settings)
                .transpose()?,
            ..VesselConfig::default()
        };
        if let Some(value) = &file.run_limits {
            config.run_limits = Some(run_limits(value)?);
        }
        if let Some(value) = &file.streaming {
            config.streaming = streaming(value)?;
        }
        Ok(config)
    }
}

/// One bucket's rate from the file over `current` (the limits' own, else
/// `default`): a rate of 0 turns it off; a rate or burst left out keeps the
/// one in force.
fn rate_over(
    current: Option<RateLimit>,
    default: RateLimit,
    calls_per_minute: Option<u32>,
    burst: Option<u32>,
) -> Option<RateLimit> {
    if calls_per_minute.is_none() && burst.is_none() {
        return current;
    }
    let base = current.unwrap_or(default);
    let calls_per_minute = match calls_per_minute {
        Some(n) => NonZeroU32::new(n)?,
        None => base.calls_per_minute,
    };
    let burst = burst.and_then(NonZeroU32::new).unwrap_or(base.burst);
    Some(RateLimit {
        calls_per_minute,
        burst,
    })
}

impl RateLimitSettings {
    /// Sets in `limits` the rates this section sets (charging rates if the
    /// limits did not).
    fn apply_to(&self, limits: &mut Limits) {
        let mut rates = limits.rate_limits.take().unwrap_or_default();
        rates.overall = rate_over(
            rates.overall,
            DEFAULT_AGENT_RATE,
            self.calls_per_minute,
            self.burst,
        );
        rates.per_device = rate_over(
            rates.per_device,
            DEFAULT_DEVICE_RATE,
            self.per_device_calls_per_minute,
            self.per_device_burst,
        );
        limits.rate_limits = Some(rates);
    }
}

/// Whether `text` is an origin as a browser sends it: `http` or `https`,
/// `://`, a host of letters, digits, `-`, `.`, `[`, `]`, `:` (for IPv6),
/// an optional port, nothing else.
fn is_origin(text: &str) -> bool {
    let Some(rest) = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty()
        && rest.len() <= 255
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'[' | b']' | b':'))
}

impl LimitSettings {
    /// Sets in `limits` every value this section sets that the core keeps;
    /// the listeners' caps, deadlines and device origins are left to the
    /// host, which hands them to the HTTP layer.
    fn apply_to(&self, limits: &mut Limits) {
        fn set<T: Clone>(target: &mut T, value: &Option<T>) {
            if let Some(value) = value {
                *target = value.clone();
            }
        }
        set(&mut limits.max_frame_bytes, &self.max_frame_bytes);
        set(&mut limits.handshake_timeout, &self.handshake_timeout);
        set(&mut limits.max_pending_calls, &self.max_pending_calls);
        set(&mut limits.max_connections, &self.max_connections);
        set(
            &mut limits.max_connections_per_address,
            &self.max_connections_per_address,
        );
        set(
            &mut limits.max_unauthenticated_per_address,
            &self.max_unauthenticated_per_address,
        );
        set(
            &mut limits.max_frames_per_second,
            &self.max_frames_per_second,
        );
        set(&mut limits.max_malformed_frames, &self.max_malformed_frames);
        set(&mut limits.ping_interval, &self.ping_interval);
        set(&mut limits.consent_timeout, &self.consent_timeout);
        set(&mut limits.approval_timeout, &self.approval_timeout);
        set(&mut limits.call_timeout, &self.call_timeout);
        set(&mut limits.durable_within, &self.durable_within);
    }
}

impl VesselConfig {
    /// Sets what the file configures in `limits`: every value of
    /// `[limits]` the core keeps (the listeners' caps, deadlines and device
    /// origins stay in [`VesselConfig::limits`], for the host to hand to the
    /// HTTP layer), `[rateLimits]` in [`Limits::rate_limits`] (charging rates
    /// if the limits did not, unless both rates are 0), and `[runLimits]` as
    /// the agent-level layer of [`Limits::run_limits`] (charging runs if the
    /// limits did not). Streaming is set on the vessel itself
    /// ([`Vessel::set_streaming`](crate::Vessel::set_streaming)).
    pub fn apply_to(&self, limits: &mut Limits) {
        self.limits.apply_to(limits);
        if let Some(rates) = &self.rate_limits {
            rates.apply_to(limits);
        }
        if let Some(layer) = self.run_limits {
            let mut run_limits = limits.run_limits.take().unwrap_or_default();
            run_limits.agent_level = layer;
            limits.run_limits = Some(run_limits);
        }
    }
}
fn run_limits(value: &toml::Value) -> Result<RunLimitsLayer, ConfigError> {
    let json = serde_json::to_value(value).map_err(|e| ConfigError::Shape {
        key: format!("runLimits: {e}"),
        expected: "plain TOML values",
    })?;
    // A limit the vessel does not enforce is refused whatever its value.
    if let Some(limit) = json
        .as_object()
        .into_iter()
        .flat_map(|table| table.keys())
        .filter_map(|name| RunLimit::from_name(name))
        .find(|limit| !ENFORCED_RUN_LIMITS.contains(limit))
    {
        return Err(ConfigError::NotEnforced { limit });
    }
    let layer = RunLimitsLayer::from_json(&json).map_err(ConfigError::RunLimits)?;
    // Refused here rather than call by call.
    RunLimits::from_layer(&layer).map_err(ConfigError::RunLimits)?;
    Ok(layer)
}

/// A value as the person wrote it (in JSON's spelling), at most 64
/// characters, for a message.
fn shown(value: &toml::Value) -> String {
    let text = serde_json::to_string(value).unwrap_or_default();
    match text.char_indices().nth(64) {
        Some((cut, _)) => format!("{}...", text.get(..cut).unwrap_or_default()),
        None => text,
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn streaming(value: &toml::Value) -> Result<StreamingConfig, ConfigError> {
    let toml::Value::Table(kinds) = value else {
        return Err(ConfigError::Shape {
            key: "streaming".to_owned(),
            expected: "a table",
        });
    };
    let mut config = StreamingConfig::default();
    for (kind, section) in kinds {
        let policy_error = |error| ConfigError::Policy {
            kind: kind.clone(),
            error,
        };
        let class = DeviceClass::parse(kind).map_err(|error| ConfigError::Policy {
            kind: kind.clone(),
            error,
        })?;
        if !section.is_table() {
            return Err(ConfigError::Shape {
                key: format!("streaming.{kind}"),
                expected: "a table",
            });
        }
        // The contract's reader checks the shape (known keys only) and
        // `resolve` every value, exactly as for a JSON configuration.
        let json = serde_json::to_value(section).map_err(|e| ConfigError::Shape {
            key: format!("streaming.{kind}: {e}"),
            expected: "plain TOML values",
        })?;
        let raw = RawDevicePolicy::from_json(&json).map_err(policy_error)?;
        let resolved = resolve(class, &raw, &ResolveOptions::default()).map_err(policy_error)?;
        config = config.with_policy(resolved);
    }
    Ok(config)
}

#[cfg(test)]
mod tests;
