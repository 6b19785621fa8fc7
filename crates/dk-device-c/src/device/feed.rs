//! Feeding a device: a connection opened, messages received, its loss,
//! the timer, the shutdown, the credentials not kept; where it stands, and
//! which refusal from outside the channel stops it.

use core::ffi::c_char;
use core::time::Duration;

use dk_device_core::{Received, State};

use crate::abi::{DK_MAX_INPUT, bytes, dk_state, dk_status, text as utf8};

use super::{dk_device, guarded, live, room_for};

/// Starts a connection on a WebSocket just opened to the vessel (with the
/// `dk.2` subprotocol): the first handshake message is then polled. A
/// connection still open is forgotten, its calls abandoned.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_connect(device: *mut dk_device, now_ms: u64) -> dk_status {
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            d.out_of_memory = false;
            d.core.connect(d.now);
            Ok(())
        })
    }
}

/// Feeds a received message to the core, once the platform has room for
/// what it makes: the frame a handshake's message 2 answers with carries
/// the manifest.
fn receive(d: &mut dk_device, message: Received<'_>) -> Result<(), dk_status> {
    if d.core.state() == State::Handshaking
        && !room_for(d.manifest_len.saturating_add(256).saturating_mul(3))
    {
        d.ran_out_of_memory();
        return Err(dk_status::DK_ERR_NO_MEMORY);
    }
    d.core.receive(d.now, message);
    Ok(())
}

/// Feeds a binary WebSocket message received (dk/2's handshake messages
/// and records), `len` bytes at `data`.
///
/// # Safety
///
/// `device` is NULL or a live device; `data` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_receive_binary(
    device: *mut dk_device,
    now_ms: u64,
    data: *const u8,
    len: usize,
) -> dk_status {
    // SAFETY: readable for `len` bytes, the caller's promise.
    let message = match unsafe { bytes(data, len, DK_MAX_INPUT) } {
        Ok(message) => message,
        Err(status) if !device.is_null() => return status,
        Err(_) => return dk_status::DK_ERR_NULL,
    };
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            receive(d, Received::Binary(message))
        })
    }
}

/// Feeds a text WebSocket message received, `len` bytes of UTF-8 at
/// `text` (on dk/2 a text message breaks the channel: everything travels
/// in binary records).
///
/// # Safety
///
/// `device` is NULL or a live device; `data` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_receive_text(
    device: *mut dk_device,
    now_ms: u64,
    data: *const c_char,
    len: usize,
) -> dk_status {
    // SAFETY: readable for `len` bytes, the caller's promise.
    let message = match unsafe { utf8(data, len) } {
        Ok(message) => message,
        Err(status) if !device.is_null() => return status,
        Err(_) => return dk_status::DK_ERR_NULL,
    };
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            receive(d, Received::Text(message))
        })
    }
}

/// Feeds the vessel's close: its code (0 when it gave none) and reason
/// (`len` bytes of UTF-8; ignored without a code).
///
/// # Safety
///
/// `device` is NULL or a live device; `reason` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_receive_close(
    device: *mut dk_device,
    now_ms: u64,
    code: u16,
    reason: *const c_char,
    len: usize,
) -> dk_status {
    // SAFETY: readable for `len` bytes, the caller's promise.
    let reason = match unsafe { utf8(reason, len) } {
        Ok(reason) => reason,
        Err(status) if !device.is_null() => return status,
        Err(_) => return dk_status::DK_ERR_NULL,
    };
    let frame = (code != 0).then_some((code, reason));
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            d.core.receive(d.now, Received::Close(frame));
            Ok(())
        })
    }
}

/// Says the connection dropped, or could not be written to, without a
/// close.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_lost(device: *mut dk_device, now_ms: u64) -> dk_status {
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            d.core.receive(d.now, Received::Lost);
            Ok(())
        })
    }
}

/// When `dk_device_handle_timeout` is due, in the platform's
/// milliseconds: true and `*at_ms` set when a timer runs, false when none
/// does (or `device` or `at_ms` is NULL).
///
/// # Safety
///
/// `device` is NULL or a live device; `at_ms` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_next_timeout(device: *mut dk_device, at_ms: *mut u64) -> bool {
    // SAFETY: the caller's promises.
    let (Ok(device), Some(at)) = (unsafe { live(device) }, unsafe { at_ms.as_mut() }) else {
        return false;
    };
    match device.core.poll_timeout() {
        Some(deadline) => {
            *at = deadline.as_millis();
            true
        }
        None => false,
    }
}

/// Handles the timer once `now_ms` is past `dk_device_next_timeout`'s
/// instant; earlier, nothing happens.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_handle_timeout(
    device: *mut dk_device,
    now_ms: u64,
) -> dk_status {
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            d.core.handle_timeout(d.now);
            Ok(())
        })
    }
}

/// Ends the connection on the device's side at once: a close 1000 to
/// send, then the vessel's close (or the close timeout) ends it. Calls
/// still running are dropped (the vessel fails them); to let them finish,
/// `dk_device_shutdown_within`.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_shutdown(device: *mut dk_device, now_ms: u64) -> dk_status {
    // SAFETY: the caller's promise.
    unsafe { dk_device_shutdown_within(device, now_ms, 0) }
}

/// Ends the connection on the device's side, giving the calls that run
/// `grace_ms` to be answered (`dk_device_answer`): meanwhile a new call is
/// refused ("device is shutting down") and never reaches a handler, and
/// the close 1000 comes once the last is answered or when the grace ends,
/// whichever is first. `dk_device_next_timeout` says when to call
/// `dk_device_handle_timeout` (at once, after the last answer). With no
/// call running, or a grace of 0, it is `dk_device_shutdown`. Calling it
/// again can only bring the close nearer.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_shutdown_within(
    device: *mut dk_device,
    now_ms: u64,
    grace_ms: u64,
) -> dk_status {
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            d.core.shutdown(d.now, Duration::from_millis(grace_ms));
            Ok(())
        })
    }
}

/// Says the credentials of `DK_OUTPUT_STORE` could not be kept: the
/// connection is closed and the device stops, rather than run with a key
/// it would lose.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_storage_failed(
    device: *mut dk_device,
    now_ms: u64,
) -> dk_status {
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, Some(now_ms), |d| {
            d.core.storage_failed(d.now);
            Ok(())
        })
    }
}

/// Where the connection stands (`DK_STATE_IDLE` for NULL).
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_state(device: *mut dk_device) -> dk_state {
    // SAFETY: the caller's promise.
    let Ok(device) = (unsafe { live(device) }) else {
        return dk_state::DK_STATE_IDLE;
    };
    match device.core.state() {
        State::Idle => dk_state::DK_STATE_IDLE,
        State::Handshaking => dk_state::DK_STATE_HANDSHAKING,
        State::Pairing => dk_state::DK_STATE_PAIRING,
        State::Serving => dk_state::DK_STATE_SERVING,
        State::Closing => dk_state::DK_STATE_CLOSING,
        State::Ended => dk_state::DK_STATE_ENDED,
    }
}

/// Whether the device stops connecting after the vessel's upgrade answered
/// HTTP `status` instead of a WebSocket (the device core's rule,
/// `reconnect::believe`). A device paired over dk/2 hears its vessel's
/// refusals inside the channel, so a 403 before it, which anyone on the
/// path can forge, does not stop it: false, connect again after the
/// backoff. A device not paired stops on a 403 (the vessel does not take
/// it there; the person must act). Any other status, a busy 503 included,
/// never stops a device; nor does a NULL device. Asks for no memory.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_stops_on_http_status(
    device: *mut dk_device,
    status: u16,
) -> bool {
    // SAFETY: the caller's promise.
    let Ok(device) = (unsafe { live(device) }) else {
        return false;
    };
    let paired = device
        .core
        .credentials()
        .is_some_and(dk_device_core::Credentials::is_paired);
    let answer = dk_device_core::reconnect::outside_status(status, None);
    dk_device_core::reconnect::believe(answer, paired) == dk_device_core::reconnect::Verdict::Stop
}
