//! Tests of the vessel configuration: the documented example, each section and its errors.

use super::*;

#[test]
fn the_documented_example_loads() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/config/vessel.toml");
    let config = VesselConfig::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
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
    assert_eq!(
        config.limits,
        LimitSettings {
            header_read_timeout: Some(Duration::from_secs(10)),
            approval_timeout: Some(Duration::from_secs(300)),
            ..LimitSettings::default()
        }
    );
    let layer = config.run_limits.unwrap();
    assert_eq!(layer.get(dk_policy::RunLimit::MaxToolCalls), Some(48));
    assert_eq!(layer.get(dk_policy::RunLimit::MaxWallTimeMs), Some(300_000));
    // The desktop kind's contract limits keep the host's maxTurns.
    assert_eq!(
        desktop
            .run_limits()
            .unwrap()
            .get(dk_policy::RunLimit::MaxTurns),
        16
    );
    // The example spells out the default rates.
    assert_eq!(
        config.rate_limits,
        Some(RateLimitSettings {
            calls_per_minute: Some(300),
            burst: Some(60),
            per_device_calls_per_minute: Some(120),
            per_device_burst: Some(20),
        })
    );
    let mut limits = Limits::default();
    config.apply_to(&mut limits);
    assert_eq!(
        limits.rate_limits,
        Some(crate::adapter::AgentRateLimits::default())
    );
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
        "[runLimits]\nmaxToolCalls = 257",
        "`runLimits`: maxToolCalls must be a positive safe integer at most 256",
    );
    refused(
        "[runLimits]\nmaxToolCall = 3",
        "`runLimits`: unknown run limit `maxToolCall`",
    );
    refused("runLimits = 3", "`runLimits`: runLimits must be an object");
    // A good section does not save the file when another is broken.
    refused(
        "[streaming.voice]\nenabled = true\nsandbox = \"s\"\n[streaming.desktop-control]\nnetwork = 1",
        "network must be a string",
    );
}

/// `[runLimits]` takes only what the vessel enforces: every other limit
/// of the contract is refused, whatever its value, saying who counts it.
#[test]
fn run_limits_the_vessel_does_not_enforce_are_refused() {
    let config =
        VesselConfig::parse("[runLimits]\nmaxToolCalls = 256\nmaxWallTimeMs = 1800000").unwrap();
    let layer = config.run_limits.unwrap();
    assert_eq!(layer.get(RunLimit::MaxToolCalls), Some(256));
    assert_eq!(layer.get(RunLimit::MaxWallTimeMs), Some(1_800_000));
    for limit in RunLimit::ALL {
        if ENFORCED_RUN_LIMITS.contains(&limit) {
            continue;
        }
        for value in ["16", "100000000"] {
            let text = format!("[runLimits]\nmaxToolCalls = 8\n{limit} = {value}");
            assert_eq!(
                VesselConfig::parse(&text).unwrap_err().to_string(),
                format!(
                    "`runLimits.{limit}` is not enforced by the vessel: the host that runs \
                         the model counts turns, provider calls and tokens, so set it there; here \
                         only `maxToolCalls` and `maxWallTimeMs` are allowed"
                ),
            );
        }
    }
    // The admission contract's table per kind still takes them all.
    let config = VesselConfig::parse(
        "[streaming.voice.runLimits]\nmaxTurns = 8\nmaxTotalTokens = 1000\nmaxToolCalls = 4",
    )
    .unwrap();
    let voice = config.streaming.run_limits(DeviceClass::Voice).unwrap();
    assert_eq!(voice.get(RunLimit::MaxTurns), 8);
    assert_eq!(voice.get(RunLimit::MaxTotalTokens), 1000);
}

/// Each `[rateLimits]` key: at its minimum and maximum it is taken (and
/// lands in `Limits`), one past either end and a wrong type refuse the
/// whole file with the key's range; a rate of 0 turns its limit off.
#[test]
fn rate_limits_are_set_within_their_ranges_and_refused_outside_them() {
    use crate::adapter::AgentRateLimits;
    type Read = fn(&AgentRateLimits) -> Option<u32>;
    let cases: [(&str, u32, u32, Read); 4] = [
        ("callsPerMinute", 1, 60_000, |r| {
            r.overall.map(|l| l.calls_per_minute.get())
        }),
        ("burst", 1, 10_000, |r| r.overall.map(|l| l.burst.get())),
        ("perDeviceCallsPerMinute", 1, 60_000, |r| {
            r.per_device.map(|l| l.calls_per_minute.get())
        }),
        ("perDeviceBurst", 1, 10_000, |r| {
            r.per_device.map(|l| l.burst.get())
        }),
    ];
    for (key, min, max, read) in cases {
        for good in [min, max] {
            let config = VesselConfig::parse(&format!("[rateLimits]\n{key} = {good}")).unwrap();
            let mut limits = Limits::default();
            config.apply_to(&mut limits);
            assert_eq!(
                read(limits.rate_limits.as_ref().unwrap()),
                Some(good),
                "{key}"
            );
        }
        let low = if key.contains("Burst") || key == "burst" {
            "0".to_owned()
        } else {
            "-1".to_owned()
        };
        for bad in [
            low,
            (max + 1).to_string(),
            "\"10\"".to_owned(),
            "1.5".to_owned(),
        ] {
            refused(
                &format!("[rateLimits]\n{key} = {bad}"),
                &format!("`rateLimits.{key}` must be an integer from "),
            );
        }
    }
    refused(
        "[rateLimits]\ncallsPerMinute = 60001",
        "`rateLimits.callsPerMinute` must be an integer from 0 (no limit) to 60000, not 60001",
    );
    refused(
        "[rateLimits]\nperDeviceBurst = 0",
        "`rateLimits.perDeviceBurst` must be an integer from 1 to 10000, not 0",
    );
    refused(
        "[rateLimits]\ncallsPerMinut = 10",
        "unknown key `rateLimits.callsPerMinut` (known: callsPerMinute, burst, perDeviceCallsPerMinute, perDeviceBurst; see docs/CONFIG.md`",
    );
    refused("rateLimits = 3", "`rateLimits` must be a table");
    refused(
        "[rateLimits]\nperDeviceCallsPerMinute = 0\nperDeviceBurst = 5",
        "`rateLimits.perDeviceBurst` is set but `rateLimits.perDeviceCallsPerMinute` is 0, which turns that limit off",
    );
    // A rate of 0 turns its limit off; both off, nothing is charged.
    let mut limits = Limits::default();
    VesselConfig::parse("[rateLimits]\nperDeviceCallsPerMinute = 0\nburst = 5")
        .unwrap()
        .apply_to(&mut limits);
    let rates = limits.rate_limits.unwrap();
    assert_eq!(rates.per_device, None);
    assert_eq!(
        rates
            .overall
            .map(|l| (l.calls_per_minute.get(), l.burst.get())),
        Some((300, 5))
    );
    let mut limits = Limits::default();
    VesselConfig::parse("[rateLimits]\ncallsPerMinute = 0\nperDeviceCallsPerMinute = 0")
        .unwrap()
        .apply_to(&mut limits);
    let rates = limits.rate_limits.unwrap();
    assert_eq!((rates.overall, rates.per_device), (None, None));
    // An empty section, or none, keeps what is in force.
    for text in ["", "[rateLimits]"] {
        let mut limits = Limits {
            rate_limits: None,
            ..Limits::default()
        };
        VesselConfig::parse(text).unwrap().apply_to(&mut limits);
        let expected = if text.is_empty() {
            None
        } else {
            Some(AgentRateLimits::default())
        };
        assert_eq!(limits.rate_limits, expected, "{text:?}");
    }
}

/// Each `[limits]` key: at its minimum and maximum it is taken (and
/// lands in `Limits`), one past either end and a wrong type refuse the
/// whole file with the key's range.
#[test]
fn every_limit_is_set_within_its_range_and_refused_outside_it() {
    type Read = fn(&Limits, &LimitSettings) -> u64;
    fn ms(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap()
    }
    // The listeners' keys land in the settings the host hands to the
    // HTTP layer, not in `Limits`.
    fn count(n: Option<usize>) -> u64 {
        n.unwrap() as u64
    }
    let cases: [(&str, u64, u64, Read); 19] = [
        ("maxFrameBytes", 1024, 16 << 20, |l, _| {
            l.max_frame_bytes as u64
        }),
        ("handshakeTimeoutMs", 1000, 300_000, |l, _| {
            ms(l.handshake_timeout)
        }),
        ("maxPendingCalls", 1, 4096, |l, _| {
            l.max_pending_calls as u64
        }),
        ("maxConnections", 1, 1_000_000, |l, _| {
            l.max_connections as u64
        }),
        ("maxConnectionsPerAddress", 1, 1_000_000, |l, _| {
            l.max_connections_per_address as u64
        }),
        ("maxUnauthenticatedPerAddress", 1, 65_536, |l, _| {
            l.max_unauthenticated_per_address as u64
        }),
        ("adminConnections", 1, 65_536, |_, s| {
            count(s.admin_connections)
        }),
        ("adminConnectionsPerAddress", 1, 65_536, |_, s| {
            count(s.admin_connections_per_address)
        }),
        ("mcpConnections", 1, 65_536, |_, s| count(s.mcp_connections)),
        ("mcpConnectionsPerAddress", 1, 65_536, |_, s| {
            count(s.mcp_connections_per_address)
        }),
        ("headerReadTimeoutMs", 1000, 300_000, |_, s| {
            ms(s.header_read_timeout.unwrap())
        }),
        ("idleTimeoutMs", 20_000, 86_400_000, |_, s| {
            ms(s.idle_timeout.unwrap())
        }),
        ("maxFramesPerSecond", 1, 1_000_000, |l, _| {
            u64::from(l.max_frames_per_second)
        }),
        ("maxMalformedFrames", 0, 1000, |l, _| {
            u64::from(l.max_malformed_frames)
        }),
        ("pingIntervalMs", 1000, 600_000, |l, _| ms(l.ping_interval)),
        ("consentTimeoutMs", 5000, 86_400_000, |l, _| {
            ms(l.consent_timeout)
        }),
        ("approvalTimeoutMs", 5000, 86_400_000, |l, _| {
            ms(l.approval_timeout)
        }),
        ("callTimeoutMs", 100, 3_600_000, |l, _| ms(l.call_timeout)),
        ("durableWithinMs", 100, 60_000, |l, _| ms(l.durable_within)),
    ];
    for (key, min, max, read) in cases {
        for good in [min, max] {
            let config = VesselConfig::parse(&format!("[limits]\n{key} = {good}")).unwrap();
            let mut limits = Limits::default();
            config.apply_to(&mut limits);
            assert_eq!(read(&limits, &config.limits), good, "{key}");
        }
        let range = format!("`limits.{key}` must be ");
        for bad in [
            min.checked_sub(1)
                .map_or("-1".to_owned(), |n| n.to_string()),
            (max + 1).to_string(),
            "\"10\"".to_owned(),
            "1.5".to_owned(),
        ] {
            refused(&format!("[limits]\n{key} = {bad}"), &range);
        }
    }
    // Every key the section knows is in the message for one it does not.
    refused(
        "[limits]\nheaderReadTimeout = 1000",
        "unknown key `limits.headerReadTimeout`",
    );
    refused("[limits]\nheaderReadTimeout = 1000", "idleTimeoutMs");
    refused("limits = 3", "`limits` must be a table");
    // A good limit does not save a file with a bad one.
    refused(
        "[limits]\nidleTimeoutMs = 60000\ncallTimeoutMs = 0",
        "`limits.callTimeoutMs` must be a whole number of milliseconds from 100 to 3600000, not 0",
    );
    // What is not set keeps its default.
    let mut limits = Limits::default();
    VesselConfig::parse("[limits]\nmaxPendingCalls = 8")
        .unwrap()
        .apply_to(&mut limits);
    assert_eq!(
        limits,
        Limits {
            max_pending_calls: 8,
            ..Limits::default()
        }
    );
}

/// Every key the serde structs take is a row of docs/CONFIG.md's
/// tables, and the unknown-key message lists them all, in order.
#[test]
fn every_key_is_documented_and_listed() {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CONFIG.md"),
    )
    .unwrap();
    let limits = field_names::<LimitsSection>();
    let rates = field_names::<RateLimitsSection>();
    assert_eq!((limits.len(), rates.len()), (20, 4));
    for key in limits.iter().chain(rates) {
        assert!(
            docs.contains(&format!("| `{key}` |")),
            "{key} is not in docs/CONFIG.md"
        );
    }
    for (section, keys) in [("limits", limits), ("rateLimits", rates)] {
        refused(
            &format!("[{section}]\nnone = 1"),
            &format!(
                "unknown key `{section}.none` (known: {}; see docs/CONFIG.md`",
                keys.join(", ")
            ),
        );
    }
    assert!(field_names::<ConfigFile>().contains(&"rateLimits"));
}

#[test]
fn device_origins_are_origins() {
    let config = VesselConfig::parse(
        "[limits]\ndeviceOrigins = [\"https://bridge.example\", \"http://[::1]:8080\"]",
    )
    .unwrap();
    assert_eq!(
        config.limits.device_origins.unwrap(),
        ["https://bridge.example", "http://[::1]:8080"]
    );
    for bad in [
        "\"https://bridge.example\"",
        "[\"bridge.example\"]",
        "[\"https://\"]",
        "[\"https://bridge.example/path\"]",
        "[\"ftp://bridge.example\"]",
        "[\"https://a b\"]",
        "[1]",
    ] {
        refused(
            &format!("[limits]\ndeviceOrigins = {bad}"),
            "`limits.deviceOrigins` must be a list of at most 64 origins",
        );
    }
}
