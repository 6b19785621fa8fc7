//! Calls answered: handlers registered, answers later or through the
//! handler's reply, and events sent.

use core::ffi::{c_char, c_void};

use dk_device_core::EventRefusal;
use serde_json::value::RawValue;

use crate::abi::{DK_MAX_INPUT, bytes, dk_reply, dk_status, text as utf8};
use crate::platform::dk_handler_fn;

use super::{Handler, dk_device, guarded, live, room_for, status};

/// Registers `handler` (with its `ctx`) for calls of `capability` (`len`
/// bytes of UTF-8), replacing any; a NULL handler removes it. Calls of a
/// capability without a handler come out of `dk_device_poll` as
/// `DK_OUTPUT_INVOKE`. Asks for no memory.
///
/// # Safety
///
/// `device` is NULL or a live device; `capability` is readable for `len`
/// bytes; the handler behaves as `dk_handler_fn` says.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_on(
    device: *mut dk_device,
    capability: *const c_char,
    len: usize,
    handler: dk_handler_fn,
    ctx: *mut c_void,
) -> dk_status {
    // SAFETY: the caller's promises.
    status(unsafe { live(device) }.and_then(|d| {
        // SAFETY: readable for `len` bytes, the caller's promise.
        let capability = unsafe { utf8(capability, len) }?;
        let slot = d
            .capabilities
            .iter()
            .position(|c| c == capability)
            .and_then(|at| d.handlers.get_mut(at))
            .ok_or(dk_status::DK_ERR_UNKNOWN_CAPABILITY)?;
        *slot = handler.map(|run| Handler { run, ctx });
        Ok(())
    }))
}

/// Answers the running call `id` of `d` with `outcome`, once the platform
/// has room for the frame; `DK_ERR_NO_SUCH_CALL` when no such call runs.
///
/// # Safety
///
/// `device` is NULL or a live device, not borrowed.
unsafe fn answer(device: *mut dk_device, id: &str, outcome: Result<&str, &str>) -> dk_status {
    let text = match outcome {
        Ok(text) | Err(text) => text,
    };
    if !room_for((text.len() + id.len() + 128).saturating_mul(4)) {
        return dk_status::DK_ERR_NO_MEMORY;
    }
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, None, |d| {
            if d.core.answer(id, outcome) {
                Ok(())
            } else {
                Err(dk_status::DK_ERR_NO_SUCH_CALL)
            }
        })
    }
}

/// Answers the running call `call_id` (`id_len` bytes): with `ok`, `text`
/// is the result as JSON (`DK_ERR_JSON` when it is not, and the call still
/// runs); without, it is the error's text. `DK_ERR_NO_SUCH_CALL` when no
/// such call runs (answered already, or its connection ended);
/// `DK_ERR_NO_MEMORY` when the platform has no memory for the answer's
/// frame (the call still runs: answer it again, or with a shorter text).
///
/// # Safety
///
/// `device` is NULL or a live device; `call_id` and `text` are readable
/// for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_answer(
    device: *mut dk_device,
    call_id: *const c_char,
    id_len: usize,
    ok: bool,
    text: *const c_char,
    len: usize,
) -> dk_status {
    if device.is_null() {
        return dk_status::DK_ERR_NULL;
    }
    // SAFETY: readable for their lengths, the caller's promise.
    let checked = unsafe { utf8(call_id, id_len).and_then(|id| Ok((id, utf8(text, len)?))) };
    let (id, text) = match checked {
        Ok(both) => both,
        Err(status) => return status,
    };
    let outcome = match outcome(ok, text) {
        Ok(outcome) => outcome,
        Err(status) => return status,
    };
    // SAFETY: the caller's promise.
    unsafe { answer(device, id, outcome) }
}

/// Whether `text` is JSON, read without building it.
fn json(text: &str) -> Result<(), dk_status> {
    serde_json::from_str::<&RawValue>(text)
        .map(|_| ())
        .map_err(|_| dk_status::DK_ERR_JSON)
}

/// An answer from its `ok` flag and text: a result, which must be JSON
/// (else `DK_ERR_JSON`), or an error's words.
fn outcome(ok: bool, text: &str) -> Result<Result<&str, &str>, dk_status> {
    if ok {
        json(text)?;
        Ok(Ok(text))
    } else {
        Ok(Err(text))
    }
}

/// The handler's result, as JSON (`len` bytes of UTF-8 at `json`), sent at
/// once: `DK_ERR_JSON` when it is not JSON, `DK_ERR_BUSY` when the call
/// was answered already, `DK_ERR_NO_MEMORY` as `dk_device_answer` says.
///
/// # Safety
///
/// `reply` is NULL or the handler's; `json` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_reply_ok(
    reply: *mut dk_reply,
    json_ptr: *const c_char,
    len: usize,
) -> dk_status {
    // SAFETY: the caller's promises.
    unsafe { give(reply, json_ptr, len, true) }
}

/// The handler's error, as text (`len` bytes of UTF-8 at `error`), which
/// the agent reads after `device error: `, sent at once. `DK_ERR_BUSY`
/// when the call was answered already.
///
/// # Safety
///
/// `reply` is NULL or the handler's; `error` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_reply_error(
    reply: *mut dk_reply,
    error: *const c_char,
    len: usize,
) -> dk_status {
    // SAFETY: the caller's promises.
    unsafe { give(reply, error, len, false) }
}

/// # Safety
///
/// As `dk_reply_ok`.
unsafe fn give(reply: *mut dk_reply, ptr: *const c_char, len: usize, ok: bool) -> dk_status {
    // SAFETY: NULL or the handler's reply, the caller's promise.
    let Some(reply) = (unsafe { reply.as_mut() }) else {
        return dk_status::DK_ERR_NULL;
    };
    if reply.given {
        return dk_status::DK_ERR_BUSY;
    }
    // SAFETY: readable for `len` bytes, the caller's promise.
    let text = match unsafe { utf8(ptr, len) } {
        Ok(text) => text,
        Err(status) => return status,
    };
    let outcome = match outcome(ok, text) {
        Ok(outcome) => outcome,
        Err(status) => return status,
    };
    // SAFETY: the call's id, live through the handler (run_handler made
    // the reply from it).
    let id = unsafe { bytes(reply.call_id, reply.call_id_len, DK_MAX_INPUT) }
        .ok()
        .and_then(|id| core::str::from_utf8(id).ok());
    let (Some(id), false) = (id, reply.device.is_null()) else {
        return dk_status::DK_ERR_NO_SUCH_CALL;
    };
    // SAFETY: the device the handler runs on, live through it and not
    // borrowed while it runs.
    let answered = unsafe { answer(reply.device.cast(), id, outcome) };
    // Refused for want of memory before anything was sent, the call still
    // runs and the handler may reply again.
    reply.given = matches!(answered, dk_status::DK_OK | dk_status::DK_ERR_NO_SUCH_CALL);
    answered
}

/// Sends `device:event {capability, data}` for a declared capability or a
/// declared event (the manifest's `events`, `capability_len` bytes), with
/// `data` as JSON (`len` bytes), when a connection is serving; the message
/// to send then comes out of `dk_device_poll`. A declared event's data
/// must keep its params (`DK_ERR_REFUSED` otherwise, nothing sent); an
/// unknown name is `DK_ERR_UNKNOWN_CAPABILITY`.
/// `DK_ERR_NO_MEMORY` when the platform has no memory for the event's
/// frame.
///
/// # Safety
///
/// `device` is NULL or a live device; `capability` and `data` are readable
/// for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_emit(
    device: *mut dk_device,
    capability: *const c_char,
    capability_len: usize,
    data: *const c_char,
    len: usize,
) -> dk_status {
    if device.is_null() {
        return dk_status::DK_ERR_NULL;
    }
    // SAFETY: readable for their lengths, the caller's promise.
    let checked =
        unsafe { utf8(capability, capability_len).and_then(|c| Ok((c, utf8(data, len)?))) };
    let (capability, data) = match checked {
        Ok(both) => both,
        Err(status) => return status,
    };
    if !room_for((capability.len() + data.len() + 128).saturating_mul(4)) {
        return dk_status::DK_ERR_NO_MEMORY;
    }
    // SAFETY: the caller's promise.
    unsafe {
        guarded(device, None, |d| {
            d.core
                .emit(capability, data)
                .map_err(|refusal| match refusal {
                    EventRefusal::UnknownCapability(_) => dk_status::DK_ERR_UNKNOWN_CAPABILITY,
                    EventRefusal::NotJson(_) => dk_status::DK_ERR_JSON,
                    EventRefusal::NotConnected => dk_status::DK_ERR_NOT_CONNECTED,
                    _ => dk_status::DK_ERR_REFUSED,
                })
        })
    }
}
