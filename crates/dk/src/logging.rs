//! Log output: lines go to standard error with every secret the running
//! vessel knows replaced by `[REDACTED]` first
//! ([`dk_vessel::redacting_log_writer`]). `DK_LOG` sets the level: `error`,
//! `warn` (the default), `info`, `debug` or `trace`.

use tracing::Level;

/// Installs the logger for the whole process (once; a second call changes nothing).
pub fn init() {
    let level = std::env::var("DK_LOG")
        .ok()
        .and_then(|level| level.parse::<Level>().ok())
        .unwrap_or(Level::WARN);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(|| dk_vessel::redacting_log_writer(std::io::stderr()))
        .try_init();
}
