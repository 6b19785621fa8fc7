//! The device core's wait between connections for C firmware, a pure
//! function of its arguments: no device, no pointer, nothing allocated.
//! (Whether an HTTP answer at the upgrade stops a device depends on the
//! device: `dk_device_stops_on_http_status`, beside the device.)

use core::time::Duration;

use dk_device_core::reconnect::next_backoff;

/// The wait before the next connection, in milliseconds: `random` (from
/// the platform's random bytes) spread uniformly over zero to
/// `initial_ms * 2^attempt`, that ceiling capped at `max_ms`, as every dk
/// device waits ("full jitter", so a fleet refused at once does not come
/// back at once). `attempt` counts the failed connections since the last
/// one that held.
#[unsafe(no_mangle)]
pub extern "C" fn dk_next_backoff_ms(
    initial_ms: u32,
    max_ms: u32,
    attempt: u32,
    random: u64,
) -> u32 {
    let wait = next_backoff(
        Duration::from_millis(u64::from(initial_ms)),
        Duration::from_millis(u64::from(max_ms)),
        attempt,
        random,
    );
    u32::try_from(wait.as_millis()).unwrap_or(u32::MAX)
}
