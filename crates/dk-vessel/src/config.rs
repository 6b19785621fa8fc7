//! The vessel's configuration file, read at the edge: this module opens the
//! file and dk-core's [`VesselConfig::parse`] checks its text into typed
//! values (everything else is dk-core's `config`, re-exported), and hands
//! the listeners' `[limits]` to the crates that own the listeners
//! ([`apply_listener_limits`]).

use std::io::Read as _;
use std::path::Path;

pub use dk_core::config::*;
use dk_http::HttpLimits;
use dk_mcp::McpOptions;

/// Largest configuration file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// Reads and checks the configuration file at `path` (at most
/// [`MAX_CONFIG_BYTES`]); any error refuses the whole file.
pub fn load(path: &Path) -> Result<VesselConfig, ConfigError> {
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
        return Err(ConfigError::TooLarge {
            path: shown,
            limit: MAX_CONFIG_BYTES,
        });
    }
    VesselConfig::parse(&text)
}

/// Sets in `http` and `mcp` what `config`'s `[limits]` sets for the
/// listeners (their caps, the header-read deadline and idle timeout of
/// every listener, the `Origin` values the `/device` route allows); what
/// it does not set keeps its value. The rest of `[limits]` is the core's
/// ([`VesselConfig::apply_to`]).
pub fn apply_listener_limits(config: &VesselConfig, http: &mut HttpLimits, mcp: &mut McpOptions) {
    fn set<T: Clone>(target: &mut T, value: Option<&T>) {
        if let Some(value) = value {
            *target = value.clone();
        }
    }
    let limits = &config.limits;
    set(
        &mut http.header_read_timeout,
        limits.header_read_timeout.as_ref(),
    );
    set(&mut http.idle_timeout, limits.idle_timeout.as_ref());
    set(
        &mut http.admin_connections.total,
        limits.admin_connections.as_ref(),
    );
    set(
        &mut http.admin_connections.per_address,
        limits.admin_connections_per_address.as_ref(),
    );
    set(&mut http.device_origins, limits.device_origins.as_ref());
    let listener = &mut mcp.listener;
    set(
        &mut listener.max_connections,
        limits.mcp_connections.as_ref(),
    );
    set(
        &mut listener.max_connections_per_address,
        limits.mcp_connections_per_address.as_ref(),
    );
    set(
        &mut listener.header_read_timeout,
        limits.header_read_timeout.as_ref(),
    );
    set(&mut listener.idle_timeout, limits.idle_timeout.as_ref());
}

#[cfg(test)]
mod tests;
