//! The device: made, fed, drained and freed through the C functions.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use core::ffi::{CStr, c_char, c_void};
use core::time::Duration;

use dk_device_core::{
    Config, Credentials, DeviceCore, End, EventRefusal, Instant, Invocation, Message, Notice,
    Output, Retry, SetAside, State, printable,
};
use serde_json::value::RawValue;
use zeroize::Zeroizing;

use crate::abi::{
    DK_CREDENTIALS_BYTES, DK_MAX_INPUT, bytes, dk_call, dk_end, dk_options, dk_output,
    dk_output_kind, dk_reply, dk_state, dk_status, text as utf8,
};
use crate::platform::{PlatformRandom, dk_handler_fn, dk_platform, register};

/// A dk device: its manifest, credentials, calls and the connection now
/// open. Opaque: made by `dk_device_new`, freed by `dk_device_free`,
/// used from one thread at a time.
pub struct dk_device {
    core: DeviceCore,
    capabilities: Vec<String>,
    handlers: Vec<Handler>,
    log: Option<(LogFn, *mut c_void)>,
    /// What the last output points into.
    held: Held,
    /// A handler or the log runs: a poll now is refused, a free waits.
    polling: bool,
    free_asked: bool,
}

type LogFn = unsafe extern "C" fn(*mut c_void, *const c_char, usize);
type HandlerFn = unsafe extern "C" fn(*mut c_void, *const dk_call, *mut dk_reply);

struct Handler {
    capability: String,
    run: HandlerFn,
    ctx: *mut c_void,
}

/// The bytes the last `dk_output` points into.
#[derive(Default)]
struct Held {
    data: Vec<u8>,
    secret: Option<Zeroizing<[u8; DK_CREDENTIALS_BYTES]>>,
    call: Option<CallText>,
}

/// A call's id, capability and input as NUL-terminated text.
struct CallText {
    id: Vec<u8>,
    capability: Vec<u8>,
    input: Vec<u8>,
}

impl CallText {
    fn new(invocation: &Invocation) -> CallText {
        CallText {
            id: with_nul(&invocation.call_id),
            capability: with_nul(&invocation.capability),
            input: with_nul(invocation.input.as_str()),
        }
    }

    fn abi(&self) -> dk_call {
        let len = |text: &Vec<u8>| text.len().saturating_sub(1);
        dk_call {
            call_id: self.id.as_ptr().cast(),
            call_id_len: len(&self.id),
            capability: self.capability.as_ptr().cast(),
            capability_len: len(&self.capability),
            input: self.input.as_ptr().cast(),
            input_len: len(&self.input),
        }
    }

    fn id(&self) -> &str {
        let id = self.id.split_last().map_or(&[][..], |(_, id)| id);
        core::str::from_utf8(id).unwrap_or_default()
    }
}

fn with_nul(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    bytes
}

/// Writes `message` into the caller's buffer, cut at a character boundary
/// to fit, NUL-terminated; nothing when there is no buffer.
///
/// # Safety
///
/// A non-NULL `error` is writable for `capacity` bytes.
unsafe fn write_error(error: *mut c_char, capacity: usize, message: &str) {
    if error.is_null() || capacity == 0 {
        return;
    }
    let mut end = message.len().min(capacity - 1);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    // SAFETY: `error` is writable for `capacity` > `end` bytes, and the
    // message is not in the caller's buffer.
    unsafe {
        core::ptr::copy_nonoverlapping(message.as_ptr(), error.cast::<u8>(), end);
        error.add(end).write(0);
    }
}

/// Makes a device from its manifest's JSON (`manifest_len` bytes of UTF-8
/// at `manifest_json`), the platform's callbacks and `options` (NULL: every
/// default, and no credentials kept yet). The platform's allocation
/// callbacks are registered if they were not.
///
/// Returns NULL when the manifest is not valid, the credentials cannot be
/// read back, a callback is missing or the platform gives no random bytes,
/// with why in `error` (`error_capacity` bytes, NUL-terminated, cut to fit;
/// `error` may be NULL).
///
/// # Safety
///
/// `platform` and `options` are NULL or readable; `manifest_json` is
/// readable for `manifest_len` bytes, the options' credentials for their
/// length; `error` is NULL or writable for `error_capacity` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_new(
    platform: *const dk_platform,
    manifest_json: *const c_char,
    manifest_len: usize,
    options: *const dk_options,
    error: *mut c_char,
    error_capacity: usize,
) -> *mut dk_device {
    // SAFETY: the caller's promises, passed on.
    match unsafe { new_device(platform, manifest_json, manifest_len, options) } {
        Ok(device) => Box::into_raw(device),
        Err(why) => {
            // SAFETY: the caller's promise on `error`.
            unsafe { write_error(error, error_capacity, &why) };
            core::ptr::null_mut()
        }
    }
}

/// What `dk_device_new` does, with its error's text.
///
/// # Safety
///
/// As `dk_device_new`.
unsafe fn new_device(
    platform: *const dk_platform,
    manifest_json: *const c_char,
    manifest_len: usize,
    options: *const dk_options,
) -> Result<Box<dk_device>, String> {
    // SAFETY: NULL or readable, the caller's promise.
    let Some(platform) = (unsafe { platform.as_ref() }) else {
        return Err("no platform callbacks".to_string());
    };
    if register(platform) != dk_status::DK_OK {
        return Err(
            "the platform needs alloc and free callbacks, the same for every device".to_string(),
        );
    }
    let Some(random) = platform.random else {
        return Err("the platform needs a random callback".to_string());
    };
    // SAFETY: readable for its length, the caller's promise.
    let manifest = match unsafe { utf8(manifest_json, manifest_len) } {
        Ok(manifest) => manifest,
        Err(status) => return Err(format!("manifest: {}", status_text(status))),
    };
    let manifest = dk_proto::validate_manifest_json(manifest).map_err(|e| e.to_string())?;
    // SAFETY: NULL or readable, the caller's promise.
    let options = unsafe { options.as_ref() }.copied().unwrap_or(dk_options {
        credentials: core::ptr::null(),
        credentials_len: 0,
        max_frame_bytes: 0,
        max_in_flight: 0,
        remember_calls: 0,
        handshake_timeout_ms: 0,
        close_timeout_ms: 0,
    });
    // SAFETY: readable for its length, the caller's promise.
    let kept = unsafe { bytes(options.credentials, options.credentials_len, DK_MAX_INPUT) }
        .map_err(|status| format!("credentials: {}", status_text(status)))?;
    let credentials = if kept.is_empty() {
        None
    } else {
        Some(Credentials::from_bytes(kept).map_err(|e| e.to_string())?)
    };
    let mut config = Config::default();
    let or = |value: usize, default: usize| if value == 0 { default } else { value };
    config.max_frame_bytes = or(options.max_frame_bytes, config.max_frame_bytes);
    config.max_in_flight = or(options.max_in_flight, config.max_in_flight);
    config.remember_calls = or(options.remember_calls, config.remember_calls);
    if options.handshake_timeout_ms != 0 {
        config.handshake_timeout = Duration::from_millis(options.handshake_timeout_ms.into());
    }
    if options.close_timeout_ms != 0 {
        config.close_timeout = Duration::from_millis(options.close_timeout_ms.into());
    }
    let entropy = Box::new(PlatformRandom {
        random,
        ctx: platform.ctx,
    });
    let core = DeviceCore::new(&manifest, config, entropy, credentials, None)
        .map_err(|e| e.to_string())?;
    Ok(Box::new(dk_device {
        core,
        capabilities: manifest
            .capabilities()
            .iter()
            .map(|c| c.name().to_string())
            .collect(),
        handlers: Vec::new(),
        log: platform.log.map(|log| (log, platform.ctx)),
        held: Held::default(),
        polling: false,
        free_asked: false,
    }))
}

/// Frees a device and everything it holds (its key is wiped). NULL is
/// ignored. From inside a handler, the device is freed once the handler
/// returns and the poll that ran it returns false.
///
/// # Safety
///
/// `device` is NULL or from `dk_device_new`, not freed yet; nothing it
/// gave out is used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_free(device: *mut dk_device) {
    if device.is_null() {
        return;
    }
    // SAFETY: a live device, the caller's promise.
    let live = unsafe { &mut *device };
    if live.polling {
        live.free_asked = true;
        return;
    }
    // SAFETY: made by Box::into_raw in dk_device_new, freed once.
    drop(unsafe { Box::from_raw(device) });
}

/// The device behind `device`, or `DK_ERR_NULL`.
///
/// # Safety
///
/// `device` is NULL or a live device.
unsafe fn live<'a>(device: *mut dk_device) -> Result<&'a mut dk_device, dk_status> {
    // SAFETY: NULL or live, the caller's promise.
    unsafe { device.as_mut() }.ok_or(dk_status::DK_ERR_NULL)
}

fn status(result: Result<(), dk_status>) -> dk_status {
    result.err().unwrap_or(dk_status::DK_OK)
}

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
    status(unsafe { live(device) }.map(|d| d.core.connect(Instant::from_millis(now_ms))))
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
    // SAFETY: the caller's promises.
    status(unsafe { live(device) }.and_then(|d| {
        // SAFETY: readable for `len` bytes, the caller's promise.
        let message = unsafe { bytes(data, len, DK_MAX_INPUT) }?;
        d.core.receive(
            Instant::from_millis(now_ms),
            dk_device_core::Received::Binary(message),
        );
        Ok(())
    }))
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
    // SAFETY: the caller's promises.
    status(unsafe { live(device) }.and_then(|d| {
        // SAFETY: readable for `len` bytes, the caller's promise.
        let message = unsafe { utf8(data, len) }?;
        d.core.receive(
            Instant::from_millis(now_ms),
            dk_device_core::Received::Text(message),
        );
        Ok(())
    }))
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
    // SAFETY: the caller's promises.
    status(unsafe { live(device) }.and_then(|d| {
        // SAFETY: readable for `len` bytes, the caller's promise.
        let reason = unsafe { utf8(reason, len) }?;
        let frame = (code != 0).then_some((code, reason));
        d.core.receive(
            Instant::from_millis(now_ms),
            dk_device_core::Received::Close(frame),
        );
        Ok(())
    }))
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
    status(unsafe { live(device) }.map(|d| {
        d.core
            .receive(Instant::from_millis(now_ms), dk_device_core::Received::Lost)
    }))
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
    status(unsafe { live(device) }.map(|d| d.core.handle_timeout(Instant::from_millis(now_ms))))
}

/// Ends the connection on the device's side: a close 1000 to send, then
/// the vessel's close (or the close timeout) ends it.
///
/// # Safety
///
/// `device` is NULL or a live device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_shutdown(device: *mut dk_device, now_ms: u64) -> dk_status {
    // SAFETY: the caller's promise.
    status(unsafe { live(device) }.map(|d| d.core.shutdown(Instant::from_millis(now_ms))))
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
    status(unsafe { live(device) }.map(|d| d.core.storage_failed(Instant::from_millis(now_ms))))
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

/// Registers `handler` (with its `ctx`) for calls of `capability` (`len`
/// bytes of UTF-8), replacing any; a NULL handler removes it. Calls of a
/// capability without a handler come out of `dk_device_poll` as
/// `DK_OUTPUT_INVOKE`.
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
        if !d.capabilities.iter().any(|c| c == capability) {
            return Err(dk_status::DK_ERR_UNKNOWN_CAPABILITY);
        }
        d.handlers.retain(|h| h.capability != capability);
        if let Some(run) = handler {
            d.handlers.push(Handler {
                capability: capability.to_string(),
                run,
                ctx,
            });
        }
        Ok(())
    }))
}

/// Answers the running call `call_id` (`id_len` bytes): with `ok`, `text`
/// is the result as JSON (`DK_ERR_JSON` when it is not, and the call still
/// runs); without, it is the error's text. `DK_ERR_NO_SUCH_CALL` when no
/// such call runs (answered already, or its connection ended).
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
    // SAFETY: the caller's promises.
    status(unsafe { live(device) }.and_then(|d| {
        // SAFETY: readable for their lengths, the caller's promise.
        let (id, answer) = unsafe { (utf8(call_id, id_len)?, utf8(text, len)?) };
        let outcome = if ok {
            json(answer)?;
            Ok(answer)
        } else {
            Err(answer)
        };
        if d.core.answer(id, outcome) {
            Ok(())
        } else {
            Err(dk_status::DK_ERR_NO_SUCH_CALL)
        }
    }))
}

fn json(text: &str) -> Result<(), dk_status> {
    serde_json::from_str::<&RawValue>(text)
        .map(|_| ())
        .map_err(|_| dk_status::DK_ERR_JSON)
}

/// The handler's result, as JSON (`len` bytes of UTF-8 at `json`):
/// `DK_ERR_JSON` when it is not, `DK_ERR_BUSY` when the call was answered
/// already.
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
    status(unsafe { give(reply, json_ptr, len, true) })
}

/// The handler's error, as text (`len` bytes of UTF-8 at `error`), which
/// the agent reads after `device error: `. `DK_ERR_BUSY` when the call was
/// answered already.
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
    status(unsafe { give(reply, error, len, false) })
}

/// # Safety
///
/// As `dk_reply_ok`.
unsafe fn give(
    reply: *mut dk_reply,
    ptr: *const c_char,
    len: usize,
    ok: bool,
) -> Result<(), dk_status> {
    // SAFETY: NULL or the handler's reply, the caller's promise.
    let reply = unsafe { reply.as_mut() }.ok_or(dk_status::DK_ERR_NULL)?;
    if reply.outcome.is_some() {
        return Err(dk_status::DK_ERR_BUSY);
    }
    // SAFETY: readable for `len` bytes, the caller's promise.
    let answer = unsafe { utf8(ptr, len) }?;
    if ok {
        json(answer)?;
        reply.outcome = Some(Ok(answer.to_string()));
    } else {
        reply.outcome = Some(Err(answer.to_string()));
    }
    Ok(())
}

/// Sends `device:event {capability, data}` for a declared capability
/// (`capability_len` bytes), with `data` as JSON (`len` bytes), when a
/// connection is serving; the message to send then comes out of
/// `dk_device_poll`.
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
    // SAFETY: the caller's promises.
    status(unsafe { live(device) }.and_then(|d| {
        // SAFETY: readable for their lengths, the caller's promise.
        let (capability, data) = unsafe { (utf8(capability, capability_len)?, utf8(data, len)?) };
        d.core
            .emit(capability, data)
            .map_err(|refusal| match refusal {
                EventRefusal::UnknownCapability(_) => dk_status::DK_ERR_UNKNOWN_CAPABILITY,
                EventRefusal::NotJson(_) => dk_status::DK_ERR_JSON,
                EventRefusal::NotConnected => dk_status::DK_ERR_NOT_CONNECTED,
                _ => dk_status::DK_ERR_REFUSED,
            })
    }))
}

/// The next thing to do, in order, into `*out`: true when there is one,
/// false once all is done (then `out->kind` is `DK_OUTPUT_NONE`). Calls of
/// capabilities with a handler run inside the poll and are answered as
/// their handler says; notices go to the log callback when there is one.
/// `out`'s pointers stay valid until the next poll or free. False, too,
/// for a NULL argument or a poll from inside a handler.
///
/// # Safety
///
/// `device` is NULL or a live device; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_poll(device: *mut dk_device, out: *mut dk_output) -> bool {
    if out.is_null() {
        return false;
    }
    // SAFETY: writable, the caller's promise.
    unsafe { out.write(dk_output::NONE) };
    loop {
        // SAFETY: NULL or live, the caller's promise; this borrow ends
        // before any callback runs.
        let Ok(d) = (unsafe { live(device) }) else {
            return false;
        };
        if d.polling {
            return false;
        }
        d.held = Held::default();
        let Some(output) = d.core.poll() else {
            return false;
        };
        let mut next = dk_output::NONE;
        match output {
            Output::Send(Message::Text(text)) => {
                next.kind = dk_output_kind::DK_OUTPUT_SEND_TEXT;
                d.held.data = with_nul(&text);
            }
            Output::Send(Message::Binary(message)) => {
                next.kind = dk_output_kind::DK_OUTPUT_SEND_BINARY;
                d.held.data = message;
            }
            Output::Send(Message::Close(frame)) => {
                next.kind = dk_output_kind::DK_OUTPUT_SEND_CLOSE;
                if let Some(frame) = frame {
                    next.close_code = frame.code;
                    d.held.data = with_nul(&frame.reason);
                }
            }
            Output::Connected => next.kind = dk_output_kind::DK_OUTPUT_CONNECTED,
            Output::ShowCode(code) => {
                next.kind = dk_output_kind::DK_OUTPUT_SHOW_CODE;
                d.held.data = with_nul(&code);
            }
            Output::Store(credentials) => {
                next.kind = dk_output_kind::DK_OUTPUT_STORE;
                let kept = d.held.secret.insert(credentials.to_bytes());
                next.data = kept.as_ptr();
                next.len = kept.len();
            }
            Output::Pinned(key) => {
                let line = format!("the vessel's key is pinned: {}", key.fingerprint());
                match notice(device, &mut next, line) {
                    Some(true) => {}
                    Some(false) => continue,
                    None => return false,
                }
            }
            // v1's tokens: this library speaks dk/2 only.
            Output::StoreToken(_) | Output::ForgetToken(_) => continue,
            Output::Invoke(invocation) => {
                let call = CallText::new(&invocation);
                let handler = d
                    .handlers
                    .iter()
                    .find(|h| h.capability == invocation.capability)
                    .map(|h| (h.run, h.ctx));
                let Some((run, ctx)) = handler else {
                    next.kind = dk_output_kind::DK_OUTPUT_INVOKE;
                    next.call = d.held.call.insert(call).abi();
                    // SAFETY: writable, the caller's promise.
                    unsafe { out.write(next) };
                    return true;
                };
                // SAFETY: `device` is live and not borrowed across the call.
                if unsafe { run_handler(device, &call, run, ctx) } {
                    return false;
                }
                continue;
            }
            Output::Notice(what) => match notice(device, &mut next, notice_text(&what)) {
                Some(true) => {}
                Some(false) => continue,
                None => return false,
            },
            Output::Ended(end) => {
                next.kind = dk_output_kind::DK_OUTPUT_ENDED;
                let (end, why) = end_text(&end);
                next.end = end;
                // SAFETY: live, as above; the notice borrow has ended.
                if let Ok(d) = unsafe { live(device) } {
                    d.held.data = with_nul(&why);
                }
            }
        }
        // SAFETY: live, as above.
        let Ok(d) = (unsafe { live(device) }) else {
            return false;
        };
        if next.data.is_null() && !d.held.data.is_empty() {
            next.data = d.held.data.as_ptr();
            next.len = d.held.data.len();
            if next.kind != dk_output_kind::DK_OUTPUT_SEND_BINARY {
                next.len = next.len.saturating_sub(1);
            }
        }
        // SAFETY: writable, the caller's promise.
        unsafe { out.write(next) };
        return true;
    }
}

/// Runs a call's handler and answers the call as it replied; true when
/// the device was freed from inside it.
///
/// # Safety
///
/// `device` is live and not borrowed; `run` is a handler as
/// `dk_handler_fn` says.
unsafe fn run_handler(
    device: *mut dk_device,
    call: &CallText,
    run: HandlerFn,
    ctx: *mut c_void,
) -> bool {
    let mut reply = dk_reply::default();
    let abi = call.abi();
    // SAFETY: live, the caller's promise; the borrow ends here.
    if let Ok(d) = unsafe { live(device) } {
        d.polling = true;
    }
    // SAFETY: the platform's handler, given a call and a reply that live
    // through it; the device is not borrowed meanwhile.
    unsafe { run(ctx, &abi, &mut reply) };
    // SAFETY: still live: a free inside the handler only asked.
    if let Ok(d) = unsafe { live(device) }
        && let Some(outcome) = &reply.outcome
    {
        let outcome = match outcome {
            Ok(result) => Ok(result.as_str()),
            Err(error) => Err(error.as_str()),
        };
        d.core.answer(call.id(), outcome);
    }
    // SAFETY: live and not borrowed.
    unsafe { after_callback(device) }
}

/// A notice: into `next` as `DK_OUTPUT_NOTICE` (`Some(true)`), or to the
/// log callback (`Some(false)`: nothing to hand out); `None` when the log
/// callback freed the device.
fn notice(device: *mut dk_device, next: &mut dk_output, line: String) -> Option<bool> {
    // SAFETY: live (dk_device_poll's caller's promise), not borrowed.
    let Ok(d) = (unsafe { live(device) }) else {
        return None;
    };
    let Some((log, ctx)) = d.log else {
        next.kind = dk_output_kind::DK_OUTPUT_NOTICE;
        d.held.data = with_nul(&line);
        return Some(true);
    };
    d.polling = true;
    let line = with_nul(&line);
    // SAFETY: the platform's log callback, given NUL-terminated text that
    // lives through it; the device is not borrowed meanwhile.
    unsafe { log(ctx, line.as_ptr().cast(), line.len().saturating_sub(1)) };
    // SAFETY: live and not borrowed: a free inside the callback only asked.
    if unsafe { after_callback(device) } {
        return None;
    }
    Some(false)
}

/// Ends a callback's run: the device may be polled again, or is freed
/// when the callback asked for that (then true).
///
/// # Safety
///
/// `device` is live and not borrowed.
unsafe fn after_callback(device: *mut dk_device) -> bool {
    // SAFETY: live, the caller's promise.
    let Ok(d) = (unsafe { live(device) }) else {
        return true;
    };
    d.polling = false;
    if d.free_asked {
        // SAFETY: made by Box::into_raw in dk_device_new; not borrowed.
        drop(unsafe { Box::from_raw(device) });
        return true;
    }
    false
}

fn notice_text(notice: &Notice) -> String {
    match notice {
        Notice::SetAside(aside) => match aside {
            SetAside::Refused(why) => format!("a frame from the vessel was set aside: {why}"),
            SetAside::DuplicateCall(id) => {
                format!("a call reusing the id of a running call: {}", printable(id))
            }
            SetAside::Pairing(_) | SetAside::Paired(_) => {
                "a pairing frame outside the pairing was set aside".to_string()
            }
            SetAside::Revoked(Some(capability)) => {
                format!("the vessel revoked the grant of {}", printable(capability))
            }
            SetAside::Revoked(None) => "the vessel ended the pairing".to_string(),
            SetAside::VesselError(why) => format!("the vessel refused a frame: {why}"),
            SetAside::NotACall(kind) => format!("a {kind} frame set aside"),
            _ => "a frame from the vessel was set aside".to_string(),
        },
        Notice::Ignored(kind) => format!("a {kind} frame before the pairing ended was ignored"),
        Notice::InvalidCode(code) => format!("a pairing code that is not 6 digits: {code}"),
        Notice::UnannouncedClose(code) => {
            format!("a close {code} not announced inside the channel: connecting again")
        }
        Notice::IgnoredBinary => "a binary message the device has no use for".to_string(),
        other => format!("{other:?}"),
    }
}

fn end_text(end: &End) -> (dk_end, String) {
    match end {
        End::Retry(Retry::Closed { code, reason }) => (
            dk_end::DK_END_RETRY,
            format!("the vessel closed the connection ({code} {reason})"),
        ),
        End::Retry(Retry::Lost) => (dk_end::DK_END_RETRY, "the connection dropped".to_string()),
        End::Retry(Retry::Handshake(why)) => (
            dk_end::DK_END_RETRY,
            format!("the dk/2 handshake failed: {why}"),
        ),
        End::Stop(stop) => (dk_end::DK_END_STOP, stop.to_string()),
        End::Shutdown => (dk_end::DK_END_SHUTDOWN, "the device shut down".to_string()),
    }
}

fn status_text(status: dk_status) -> &'static str {
    status_cstr(status).to_str().unwrap_or_default()
}

fn status_cstr(status: dk_status) -> &'static CStr {
    match status {
        dk_status::DK_OK => c"ok",
        dk_status::DK_ERR_NULL => c"a NULL pointer",
        dk_status::DK_ERR_TOO_LONG => c"a length over the limit or not the value's",
        dk_status::DK_ERR_UTF8 => c"text that is not UTF-8",
        dk_status::DK_ERR_JSON => c"not JSON",
        dk_status::DK_ERR_MANIFEST => c"the manifest is not valid",
        dk_status::DK_ERR_CREDENTIALS => c"the stored credentials cannot be read back",
        dk_status::DK_ERR_PLATFORM => c"a platform callback is missing or differs",
        dk_status::DK_ERR_ENTROPY => c"the platform gave no random bytes",
        dk_status::DK_ERR_NO_SUCH_CALL => c"no such call is running",
        dk_status::DK_ERR_NOT_CONNECTED => c"no connection to the vessel",
        dk_status::DK_ERR_UNKNOWN_CAPABILITY => c"the manifest declares no such capability",
        dk_status::DK_ERR_REFUSED => c"the vessel would refuse the frame",
        dk_status::DK_ERR_BUSY => c"not now (inside a handler, or answered already)",
    }
}

/// What a status means, as static NUL-terminated text ("unknown status"
/// for a value that is none).
#[unsafe(no_mangle)]
pub extern "C" fn dk_status_text(status: i32) -> *const c_char {
    const ALL: [dk_status; 14] = [
        dk_status::DK_OK,
        dk_status::DK_ERR_NULL,
        dk_status::DK_ERR_TOO_LONG,
        dk_status::DK_ERR_UTF8,
        dk_status::DK_ERR_JSON,
        dk_status::DK_ERR_MANIFEST,
        dk_status::DK_ERR_CREDENTIALS,
        dk_status::DK_ERR_PLATFORM,
        dk_status::DK_ERR_ENTROPY,
        dk_status::DK_ERR_NO_SUCH_CALL,
        dk_status::DK_ERR_NOT_CONNECTED,
        dk_status::DK_ERR_UNKNOWN_CAPABILITY,
        dk_status::DK_ERR_REFUSED,
        dk_status::DK_ERR_BUSY,
    ];
    ALL.iter()
        .find(|s| **s as i32 == status)
        .map_or(c"unknown status", |known| status_cstr(*known))
        .as_ptr()
}
