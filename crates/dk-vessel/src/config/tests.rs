//! The listeners' `[limits]`: each key lands in the listener that owns it.

use std::time::Duration;

use dk_http::HttpLimits;
use dk_http::listen::{ConnectionCaps, ListenerLimits};
use dk_mcp::McpOptions;

use super::{VesselConfig, apply_listener_limits};
use crate::Limits;

/// The listeners' limits after `text` is applied over the defaults.
fn applied(text: &str) -> (HttpLimits, McpOptions) {
    let config = VesselConfig::parse(text).unwrap();
    let (mut http, mut mcp) = (HttpLimits::default(), McpOptions::default());
    apply_listener_limits(&config, &mut http, &mut mcp);
    (http, mcp)
}

#[test]
fn each_listener_key_lands_in_the_listener_that_owns_it() {
    let (http, mcp) = applied(
        "[limits]\nheaderReadTimeoutMs = 2000\nidleTimeoutMs = 30000\nadminConnections = 7\n\
         adminConnectionsPerAddress = 3\nmcpConnections = 9\nmcpConnectionsPerAddress = 4\n\
         deviceOrigins = [\"https://bridge.example\"]\nmaxConnections = 100\n\
         maxConnectionsPerAddress = 10",
    );
    assert_eq!(
        http,
        HttpLimits {
            header_read_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            admin_connections: ConnectionCaps {
                total: 7,
                per_address: 3
            },
            device_origins: vec!["https://bridge.example".to_owned()],
        }
    );
    assert_eq!(
        mcp,
        McpOptions {
            listener: ListenerLimits {
                max_connections: 9,
                max_connections_per_address: 4,
                header_read_timeout: Duration::from_secs(2),
                idle_timeout: Duration::from_secs(30),
            },
            ..McpOptions::default()
        }
    );
    // The device listener: the core's connection counts, the same deadlines.
    let mut limits = Limits::default();
    VesselConfig::parse("[limits]\nmaxConnections = 100\nmaxConnectionsPerAddress = 10")
        .unwrap()
        .apply_to(&mut limits);
    assert_eq!(
        http.device_listener(&limits),
        ListenerLimits {
            max_connections: 100,
            max_connections_per_address: 10,
            header_read_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
        }
    );
    assert_eq!(http.admin_listener().max_connections_per_address, 3);
}

#[test]
fn what_the_file_does_not_set_keeps_the_defaults() {
    let (http, mcp) = applied("[limits]\nmaxPendingCalls = 8");
    assert_eq!(http, HttpLimits::default());
    assert_eq!(mcp, McpOptions::default());
    // The defaults docs/CONFIG.md gives.
    assert_eq!(
        http.admin_listener(),
        ListenerLimits {
            max_connections: 512,
            max_connections_per_address: 128,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    );
    assert_eq!(
        mcp.listener,
        ListenerLimits {
            max_connections: 2048,
            max_connections_per_address: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    );
}
