//! The vessel's configuration file (TOML, `dk vessel --config FILE`): which
//! streaming device kinds the vessel admits and their caps, and the run
//! budget every agent session's device calls are charged to. Every key is
//! documented in `docs/CONFIG.md`.
//!
//! The file is read fail-closed: a syntax error, an unknown key, a wrong type
//! or a value out of range refuses the whole file, with the key that is wrong.
//! Each streaming kind is resolved with dk-policy's admission contract
//! ([`dk_policy::resolve`]), so a file that loads holds only valid policies. A
//! kind the file does not configure is not admitted (deny by default).

use std::path::Path;

use dk_policy::{
    DeviceClass, RawDevicePolicy, ResolveOptions, ResolvedPolicy, RunLimits, RunLimitsLayer,
    resolve,
};

use crate::vessel::Limits;

/// Largest configuration file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
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
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("`{path}` is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: String,
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
    /// `[runLimits]` is refused by the run-limit rules.
    #[error("`runLimits`: {0}")]
    RunLimits(dk_policy::InputError),
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
    pub fn with_policy(mut self, policy: ResolvedPolicy) -> StreamingConfig {
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
    pub fn largest_chunk_cap(&self) -> Option<u64> {
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
    /// `[runLimits]`: the agent-level run budget every agent session's
    /// device calls are charged to (see [`VesselConfig::apply_to`]); absent,
    /// the vessel's defaults stand.
    pub run_limits: Option<RunLimitsLayer>,
}

impl VesselConfig {
    /// Reads and checks a configuration file (at most [`MAX_CONFIG_BYTES`]).
    pub fn load(path: &Path) -> Result<VesselConfig, ConfigError> {
        use std::io::Read as _;
        let shown = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|source| ConfigError::Read {
                path: shown.clone(),
                source,
            })?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge { path: shown });
        }
        VesselConfig::parse(&text)
    }

    /// Reads and checks a configuration from TOML text.
    pub fn parse(text: &str) -> Result<VesselConfig, ConfigError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(one_line(&e.to_string())))?;
        let mut config = VesselConfig::default();
        for (key, value) in &table {
            match key.as_str() {
                "streaming" => config.streaming = streaming(value)?,
                "runLimits" => config.run_limits = Some(run_limits(value)?),
                other => return Err(ConfigError::UnknownKey(other.to_owned())),
            }
        }
        Ok(config)
    }
}

impl VesselConfig {
    /// Sets what the file configures in `limits`: `[runLimits]` becomes the
    /// agent-level layer of [`Limits::run_limits`] (charging calls if the
    /// limits did not). Streaming is set on the vessel itself
    /// ([`Vessel::set_streaming`](crate::Vessel::set_streaming)).
    pub fn apply_to(&self, limits: &mut Limits) {
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
    let layer = RunLimitsLayer::from_json(&json).map_err(ConfigError::RunLimits)?;
    // Refused here rather than call by call.
    RunLimits::from_layer(&layer).map_err(ConfigError::RunLimits)?;
    Ok(layer)
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
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/config/vessel.toml");
        let config = VesselConfig::load(&path).unwrap();
        let voice = config.streaming.configured(DeviceClass::Voice).unwrap();
        assert!(voice.enabled());
        assert!(!voice.requires_approval());
        assert_eq!(voice.max_chunk_bytes(), 65_536);
        assert_eq!(voice.max_concurrent_sessions(), 1);
        assert_eq!(voice.sandbox(), Some("voice-sandbox"));
        assert_eq!(
            voice
                .run_limits()
                .unwrap()
                .get(dk_policy::RunLimit::MaxToolCalls),
            32
        );
        let desktop = config
            .streaming
            .configured(DeviceClass::DesktopControl)
            .unwrap();
        assert!(desktop.requires_approval());
        assert_eq!(desktop.max_chunk_bytes(), 4 * 1024 * 1024);
        assert_eq!(desktop.max_concurrent_sessions(), 2);
        assert_eq!(config.streaming.largest_chunk_cap(), Some(4 * 1024 * 1024));
        let layer = config.run_limits.unwrap();
        assert_eq!(layer.get(dk_policy::RunLimit::MaxToolCalls), Some(48));
        assert_eq!(layer.get(dk_policy::RunLimit::MaxWallTimeMs), Some(300_000));
        let mut limits = Limits::default();
        config.apply_to(&mut limits);
        let applied = limits.run_limits.unwrap();
        assert_eq!(applied.agent_level, layer);
        assert_eq!(
            applied.max_tracked_runs,
            crate::adapter::AgentRunLimits::default().max_tracked_runs
        );
        // Without [runLimits] the limits are left as they were.
        let mut limits = Limits {
            run_limits: None,
            ..Limits::default()
        };
        VesselConfig::parse("").unwrap().apply_to(&mut limits);
        assert_eq!(limits.run_limits, None);
    }

    #[test]
    fn an_empty_file_admits_nothing() {
        let config = VesselConfig::parse("").unwrap();
        assert_eq!(config, VesselConfig::default());
        assert_eq!(config.streaming.largest_chunk_cap(), None);
        for kind in DeviceClass::ALL {
            assert!(config.streaming.configured(kind).is_none());
        }
    }

    #[track_caller]
    fn refused(text: &str, expected: &str) {
        let error = VesselConfig::parse(text).unwrap_err().to_string();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }

    #[test]
    fn broken_files_are_refused_whole() {
        refused("streaming = [", "not valid TOML");
        refused("listen = \"x\"", "unknown key `listen`");
        refused("streaming = 1", "`streaming` must be a table");
        refused(
            "[streaming]\nvoice = 1",
            "`streaming.voice` must be a table",
        );
        refused(
            "[streaming.speaker]\nenabled = true",
            "device kind must be 'voice' or 'desktop-control' (ERR_PRISM_DEVICE_INPUT)",
        );
        refused(
            "[streaming.voice]\nenabeld = true",
            "`streaming.voice`: device policy is malformed: unknown field `enabeld`",
        );
        refused(
            "[streaming.voice.limits]\nmaxChunkBytes = 8388609",
            "maxChunkBytes must be a positive safe integer at most 8388608",
        );
        refused(
            "[streaming.voice.limits]\nmaxChunkByte = 1",
            "unknown field `limits.maxChunkByte`",
        );
        refused(
            "[streaming.desktop-control.limits]\nmaxConcurrentSessions = 5",
            "maxConcurrentSessions must be a positive safe integer at most 4",
        );
        refused(
            "[streaming.voice.runLimits]\nmaxToolCall = 3",
            "unknown run limit `maxToolCall`",
        );
        refused(
            "[streaming.voice.runLimits]\nmaxToolCalls = 257",
            "maxToolCalls must be a positive safe integer at most 256",
        );
        refused("[streaming.voice]\nsandbox = 3", "sandbox must be a string");
        refused(
            "[runLimits]\nmaxTurns = 65",
            "`runLimits`: maxTurns must be a positive safe integer at most 64",
        );
        refused("runLimits = 3", "`runLimits`: runLimits must be an object");
        // A good section does not save the file when another is broken.
        refused(
            "[streaming.voice]\nenabled = true\nsandbox = \"s\"\n[streaming.desktop-control]\nnetwork = 1",
            "network must be a string",
        );
    }
}
