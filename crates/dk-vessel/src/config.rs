//! The vessel's configuration file, read at the edge: this module opens the
//! file and dk-core's [`VesselConfig::parse`] checks its text into typed
//! values (everything else is dk-core's `config`, re-exported).

use std::io::Read as _;
use std::path::Path;

pub use dk_core::config::*;

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
