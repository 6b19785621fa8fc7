//! The device: made, fed, drained and freed through the C functions.
//!
//! Every function that may allocate runs [`guarded`]: when the platform
//! refused memory meanwhile (a small allocation the library's reserve
//! answered, or a large one asked for with `try_reserve`), the device's
//! connection is ended, which frees what it held, and the function returns
//! `DK_ERR_NO_MEMORY`; the device stays usable. Frames bigger than the
//! reserve answers are built only once the platform showed it has room for
//! them ([`room_for`]).

use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use core::ffi::{CStr, c_char, c_void};
use core::fmt;
use core::time::Duration;

use dk_device_core::{
    Config, Credentials, DeviceCore, End, EventRefusal, Instant, Invocation, Message, Notice,
    Output, Received, Retry, SetAside, State, printable,
};
use serde_json::value::RawValue;
use zeroize::Zeroizing;

use crate::abi::{
    DK_CREDENTIALS_BYTES, DK_MAX_IN_FLIGHT, DK_MAX_INPUT, DK_MAX_REMEMBERED_CALLS,
    DK_MIN_FRAME_BYTES, DK_RESERVE_BYTES, bytes, dk_call, dk_end, dk_options, dk_output,
    dk_output_kind, dk_reply, dk_state, dk_status, text as utf8,
};
use crate::platform::{PlatformRandom, dk_handler_fn, dk_platform, refusals, register};

/// A dk device: its manifest, credentials, calls and the connection now
/// open. Opaque: made by `dk_device_new`, freed by `dk_device_free`,
/// used from one thread at a time.
pub struct dk_device {
    core: DeviceCore,
    capabilities: Vec<String>,
    /// The handler of each capability, at its index in `capabilities`:
    /// made with the device, so registering one asks for no memory.
    handlers: Vec<Option<Handler>>,
    log: Option<(LogFn, *mut c_void)>,
    /// The length of the manifest's JSON: the size of the frames that
    /// carry it (`device:hello`, `device:auth`).
    manifest_len: usize,
    /// What the last output points into.
    held: Held,
    /// A handler or the log runs: a poll now is refused, a free waits.
    polling: bool,
    free_asked: bool,
    /// The platform's time at the last call that gave one.
    now: Instant,
    /// The connection was ended for want of memory: its end says so.
    out_of_memory: bool,
}

type LogFn = unsafe extern "C" fn(*mut c_void, *const c_char, usize);
type HandlerFn = unsafe extern "C" fn(*mut c_void, *const dk_call, *mut dk_reply);

struct Handler {
    run: HandlerFn,
    ctx: *mut c_void,
}

/// The bytes the last `dk_output` points into, all on the heap: nothing
/// handed out points into the device itself.
#[derive(Default)]
struct Held {
    data: Vec<u8>,
    secret: Option<Box<Zeroizing<[u8; DK_CREDENTIALS_BYTES]>>>,
    call: Option<CallText>,
}

/// A call's id, capability and input as NUL-terminated text.
struct CallText {
    id: Vec<u8>,
    capability: Vec<u8>,
    input: Vec<u8>,
}

impl CallText {
    /// The call's texts with their NULs: the id and the capability copied
    /// (short), the input where it came, in the frame's buffer, which has
    /// room for its NUL. `Err` with the call's id when it does not.
    fn new(invocation: Invocation) -> Result<CallText, String> {
        let mut input = invocation.input.into_string().into_bytes();
        if input.try_reserve(1).is_err() {
            return Err(invocation.call_id);
        }
        input.push(0);
        Ok(CallText {
            id: with_nul(&invocation.call_id),
            capability: with_nul(&invocation.capability),
            input,
        })
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
}

fn with_nul(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    bytes
}

/// Whether the platform has `need` bytes to give now, for work that, once
/// the platform refused it memory, the reserve could not finish in its
/// place (a frame larger than its pieces, a long manifest's validation):
/// that much is asked for at once and given back. A need the reserve
/// covers is let through. Asked before the work starts: for an answer or
/// an event outside any guard, so that a refusal changes nothing (the call
/// still runs, the event is not sent); for the frame a handshake goes on
/// with, inside one, the connection ending when there is no room.
fn room_for(need: usize) -> bool {
    if need <= DK_RESERVE_BYTES / 2 {
        return true;
    }
    let mut room: Vec<u8> = Vec::new();
    room.try_reserve_exact(need).is_ok()
}

/// The caller's error buffer, written through `fmt::Write`: cut at a
/// character boundary to fit, always NUL-terminated, asking for no memory
/// (an error may be about memory, or come before an allocator exists).
struct ErrorText {
    buffer: *mut c_char,
    capacity: usize,
    len: usize,
}

impl ErrorText {
    /// # Safety
    ///
    /// `buffer` is NULL or writable for `capacity` bytes while this lives.
    unsafe fn new(buffer: *mut c_char, capacity: usize) -> ErrorText {
        let text = ErrorText {
            buffer: if capacity == 0 {
                core::ptr::null_mut()
            } else {
                buffer
            },
            capacity,
            len: 0,
        };
        if !text.buffer.is_null() {
            // SAFETY: writable for `capacity` > 0 bytes, the caller's promise.
            unsafe { text.buffer.write(0) };
        }
        text
    }

    /// Says why, replacing what was said; the status, for returning.
    fn say(&mut self, status: dk_status, why: fmt::Arguments<'_>) -> dk_status {
        self.len = 0;
        let _ = fmt::write(self, why);
        status
    }
}

impl fmt::Write for ErrorText {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if self.buffer.is_null() {
            return Ok(());
        }
        let room = self.capacity.saturating_sub(1).saturating_sub(self.len);
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // SAFETY: `buffer` is writable for `capacity` bytes and
        // `len + end + 1 <= capacity`; the text is not in the buffer.
        unsafe {
            core::ptr::copy_nonoverlapping(
                text.as_ptr(),
                self.buffer.add(self.len).cast::<u8>(),
                end,
            );
            self.buffer.add(self.len + end).write(0);
        }
        self.len += end;
        Ok(())
    }
}

/// Makes a device from its manifest's JSON (`manifest_len` bytes of UTF-8
/// at `manifest_json`), the platform's callbacks and `options` (NULL: every
/// default, and no credentials kept yet), into `*device`. The platform's
/// allocation callbacks are registered if they were not.
///
/// Returns `DK_OK`, or why not: `DK_ERR_NULL` (no platform, no `device`,
/// NULL with a length), `DK_ERR_PLATFORM` (a callback missing, other
/// allocation callbacks registered), `DK_ERR_OPTIONS`,
/// `DK_ERR_CREDENTIALS`, `DK_ERR_TOO_LONG`, `DK_ERR_UTF8`,
/// `DK_ERR_MANIFEST`, `DK_ERR_ENTROPY`, `DK_ERR_NO_MEMORY`, with `*device`
/// NULL and the reason in `error` (`error_capacity` bytes, NUL-terminated,
/// cut to fit; `error` may be NULL). Nothing is allocated before the
/// platform's allocator is registered, and a refused allocation after is
/// `DK_ERR_NO_MEMORY`, with everything made so far freed.
///
/// # Safety
///
/// `platform` and `options` are NULL or readable; `manifest_json` is
/// readable for `manifest_len` bytes, the options' credentials for their
/// length; `device` is NULL or writable; `error` is NULL or writable for
/// `error_capacity` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dk_device_new(
    platform: *const dk_platform,
    manifest_json: *const c_char,
    manifest_len: usize,
    options: *const dk_options,
    device: *mut *mut dk_device,
    error: *mut c_char,
    error_capacity: usize,
) -> dk_status {
    // SAFETY: NULL or writable for its capacity, the caller's promise.
    let mut why = unsafe { ErrorText::new(error, error_capacity) };
    // SAFETY: NULL or writable, the caller's promise.
    let Some(device) = (unsafe { device.as_mut() }) else {
        return why.say(
            dk_status::DK_ERR_NULL,
            format_args!("no place for the device"),
        );
    };
    *device = core::ptr::null_mut();
    // SAFETY: the caller's promises, passed on.
    match unsafe { new_device(platform, manifest_json, manifest_len, options, &mut why) } {
        Ok(made) => {
            *device = Box::into_raw(made);
            dk_status::DK_OK
        }
        Err(status) => status,
    }
}

/// The options in force: the caller's, or every default.
///
/// # Safety
///
/// `options` is NULL or readable.
unsafe fn options_of(options: *const dk_options) -> dk_options {
    // SAFETY: NULL or readable, the caller's promise.
    unsafe { options.as_ref() }.copied().unwrap_or(dk_options {
        credentials: core::ptr::null(),
        credentials_len: 0,
        max_frame_bytes: 0,
        max_in_flight: 0,
        remember_calls: 0,
        handshake_timeout_ms: 0,
        close_timeout_ms: 0,
    })
}

/// The configuration the options ask for; `Err` naming the first option
/// out of its range.
fn config_of(options: &dk_options) -> Result<Config, &'static str> {
    let mut config = Config::default();
    let in_range = |value: usize, range: core::ops::RangeInclusive<usize>, name| {
        if value == 0 || range.contains(&value) {
            Ok(())
        } else {
            Err(name)
        }
    };
    in_range(
        options.max_frame_bytes,
        DK_MIN_FRAME_BYTES..=DK_MAX_INPUT,
        "max_frame_bytes is not 0 or 1024 to DK_MAX_INPUT",
    )?;
    in_range(
        options.max_in_flight,
        1..=DK_MAX_IN_FLIGHT,
        "max_in_flight is not 0 or 1 to DK_MAX_IN_FLIGHT",
    )?;
    in_range(
        options.remember_calls,
        1..=DK_MAX_REMEMBERED_CALLS,
        "remember_calls is not 0 or 1 to DK_MAX_REMEMBERED_CALLS",
    )?;
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
    Ok(config)
}

/// What `dk_device_new` does, saying why it failed in `why`.
///
/// # Safety
///
/// As `dk_device_new`.
unsafe fn new_device(
    platform: *const dk_platform,
    manifest_json: *const c_char,
    manifest_len: usize,
    options: *const dk_options,
    why: &mut ErrorText,
) -> Result<Box<dk_device>, dk_status> {
    // Nothing here asks for memory until the allocator is registered.
    // SAFETY: NULL or readable, the caller's promise.
    let Some(platform) = (unsafe { platform.as_ref() }) else {
        return Err(why.say(
            dk_status::DK_ERR_NULL,
            format_args!("no platform callbacks"),
        ));
    };
    if register(platform) != dk_status::DK_OK {
        return Err(why.say(
            dk_status::DK_ERR_PLATFORM,
            format_args!("the platform needs alloc and free callbacks, the same for every device"),
        ));
    }
    let Some(random) = platform.random else {
        return Err(why.say(
            dk_status::DK_ERR_PLATFORM,
            format_args!("the platform needs a random callback"),
        ));
    };
    // SAFETY: NULL or readable, the caller's promise.
    let options = unsafe { options_of(options) };
    let config = config_of(&options)
        .map_err(|name| why.say(dk_status::DK_ERR_OPTIONS, format_args!("{name}")))?;
    if !options.credentials.is_null() && options.credentials_len == 0 {
        return Err(why.say(
            dk_status::DK_ERR_CREDENTIALS,
            format_args!("credentials of 0 bytes: pass NULL when none are kept"),
        ));
    }
    // SAFETY: readable for its length, the caller's promise.
    let kept = unsafe { bytes(options.credentials, options.credentials_len, DK_MAX_INPUT) }
        .map_err(|status| why.say(status, format_args!("credentials: {}", status_text(status))))?;
    let credentials = if kept.is_empty() {
        None
    } else {
        Some(
            Credentials::from_bytes(kept)
                .map_err(|e| why.say(dk_status::DK_ERR_CREDENTIALS, format_args!("{e}")))?,
        )
    };
    // SAFETY: readable for its length, the caller's promise.
    let manifest = unsafe { utf8(manifest_json, manifest_len) }
        .map_err(|status| why.say(status, format_args!("manifest: {}", status_text(status))))?;
    // Validating a manifest takes up to about ten times its length.
    if !room_for(manifest.len().saturating_mul(12)) {
        return Err(why.say(dk_status::DK_ERR_NO_MEMORY, format_args!("out of memory")));
    }
    let refused = refusals();
    let made = make(platform, random, manifest, config, credentials, why);
    if refusals() != refused {
        drop(made);
        return Err(why.say(dk_status::DK_ERR_NO_MEMORY, format_args!("out of memory")));
    }
    made
}

/// The device, made from what `new_device` checked.
fn make(
    platform: &dk_platform,
    random: unsafe extern "C" fn(*mut c_void, *mut u8, usize) -> bool,
    manifest_json: &str,
    config: Config,
    credentials: Option<Credentials>,
    why: &mut ErrorText,
) -> Result<Box<dk_device>, dk_status> {
    let manifest = dk_proto::validate_manifest_json(manifest_json)
        .map_err(|e| why.say(dk_status::DK_ERR_MANIFEST, format_args!("{e}")))?;
    let entropy = Box::new(PlatformRandom {
        random,
        ctx: platform.ctx,
    });
    let core = DeviceCore::new(&manifest, config, entropy, credentials, None).map_err(|_| {
        why.say(
            dk_status::DK_ERR_ENTROPY,
            format_args!("the platform gave no random bytes"),
        )
    })?;
    let capabilities: Vec<String> = manifest
        .capabilities()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let mut handlers = Vec::with_capacity(capabilities.len());
    handlers.resize_with(capabilities.len(), || None);
    Ok(Box::new(dk_device {
        core,
        capabilities,
        handlers,
        log: platform.log.map(|log| (log, platform.ctx)),
        manifest_len: manifest_json.len(),
        held: Held::default(),
        polling: false,
        free_asked: false,
        now: Instant::from_millis(0),
        out_of_memory: false,
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

impl dk_device {
    /// Ends the connection the device is on after the platform refused
    /// memory, freeing what it held: its end comes out of the next poll,
    /// saying why.
    fn ran_out_of_memory(&mut self) {
        if matches!(
            self.core.state(),
            State::Handshaking | State::Pairing | State::Serving | State::Closing
        ) {
            self.core.receive(self.now, Received::Lost);
            self.out_of_memory = true;
        }
    }
}

/// Runs `op` on the device behind `device` (at `now_ms` when given); when
/// the platform refused memory meanwhile, the device's connection is ended
/// and the answer is `DK_ERR_NO_MEMORY`.
///
/// # Safety
///
/// `device` is NULL or a live device, not borrowed.
unsafe fn guarded(
    device: *mut dk_device,
    now_ms: Option<u64>,
    op: impl FnOnce(&mut dk_device) -> Result<(), dk_status>,
) -> dk_status {
    // SAFETY: the caller's promise.
    let Ok(d) = (unsafe { live(device) }) else {
        return dk_status::DK_ERR_NULL;
    };
    if let Some(now) = now_ms {
        d.now = Instant::from_millis(now);
    }
    let refused = refusals();
    let result = op(d);
    if refusals() == refused {
        return status(result);
    }
    d.ran_out_of_memory();
    dk_status::DK_ERR_NO_MEMORY
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
    let outcome = if ok {
        if let Err(status) = json(text) {
            return status;
        }
        Ok(text)
    } else {
        Err(text)
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
    let outcome = if ok {
        if let Err(status) = json(text) {
            return status;
        }
        Ok(text)
    } else {
        Err(text)
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
                let kept = d.held.secret.insert(Box::new(credentials.to_bytes()));
                next.data = kept.as_ptr();
                next.len = kept.len();
            }
            Output::Pinned(key) => {
                let line = format!("the vessel's key is pinned: {}", key.fingerprint());
                // SAFETY: live and, the borrow above ended, not borrowed.
                match unsafe { notice(device, &mut next, line) } {
                    Some(true) => {}
                    Some(false) => continue,
                    None => return false,
                }
            }
            // v1's tokens: this library speaks dk/2 only.
            Output::StoreToken(_) | Output::ForgetToken(_) => continue,
            Output::Invoke(invocation) => {
                // C reads each text up to its NUL: a call whose id holds
                // one would reach the handler as another id.
                if invocation.call_id.contains('\0') {
                    d.core.answer(&invocation.call_id, Err(NUL_IN_ID));
                    let line = format!(
                        "a call whose id holds a NUL byte was refused: {}",
                        printable(&invocation.call_id)
                    );
                    // SAFETY: live and, the borrow above ended, not borrowed.
                    match unsafe { notice(device, &mut next, line) } {
                        Some(true) => {}
                        Some(false) => continue,
                        None => return false,
                    }
                } else {
                    let handler = d
                        .capabilities
                        .iter()
                        .position(|c| *c == invocation.capability)
                        .and_then(|at| d.handlers.get(at))
                        .and_then(Option::as_ref)
                        .map(|h| (h.run, h.ctx));
                    let call = match CallText::new(invocation) {
                        Ok(call) => call,
                        Err(id) => {
                            d.core.answer(&id, Err("device is out of memory"));
                            continue;
                        }
                    };
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
            }
            Output::Notice(what) => {
                // SAFETY: live and, the borrow above ended, not borrowed.
                match unsafe { notice(device, &mut next, notice_text(&what)) } {
                    Some(true) => {}
                    Some(false) => continue,
                    None => return false,
                }
            }
            Output::Ended(end) => {
                next.kind = dk_output_kind::DK_OUTPUT_ENDED;
                let (end, mut why) = end_text(&end);
                if core::mem::take(&mut d.out_of_memory) && end == dk_end::DK_END_RETRY {
                    why = "the device ran out of memory: connect again after a backoff".to_string();
                }
                next.end = end;
                d.held.data = with_nul(&why);
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

/// The error a call whose id holds a NUL byte is answered with.
const NUL_IN_ID: &str = "the call's id holds a NUL byte, which a C device cannot be given";

/// Runs a call's handler, which answers through its reply (at once) or
/// later with `dk_device_answer`; true when the device was freed from
/// inside it.
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
    let abi = call.abi();
    let mut reply = dk_reply {
        device: device.cast(),
        call_id: abi.call_id.cast(),
        call_id_len: abi.call_id_len,
        given: false,
    };
    // SAFETY: live, the caller's promise; the borrow ends here.
    if let Ok(d) = unsafe { live(device) } {
        d.polling = true;
    }
    // SAFETY: the platform's handler, given a call and a reply that live
    // through it; the device is not borrowed meanwhile.
    unsafe { run(ctx, &abi, &mut reply) };
    // SAFETY: still live (a free inside the handler only asked), and not
    // borrowed.
    unsafe { after_callback(device) }
}

/// A notice: into `next` as `DK_OUTPUT_NOTICE` (`Some(true)`), or to the
/// log callback (`Some(false)`: nothing to hand out); `None` when the log
/// callback freed the device.
///
/// # Safety
///
/// `device` is live (dk_device_poll's caller's promise) and not borrowed.
unsafe fn notice(device: *mut dk_device, next: &mut dk_output, line: String) -> Option<bool> {
    // SAFETY: live and not borrowed, the caller's promise.
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
        dk_status::DK_ERR_NO_MEMORY => c"the platform had no memory",
        dk_status::DK_ERR_OPTIONS => c"an option out of its range",
    }
}

/// What a status means, as static NUL-terminated text ("unknown status"
/// for a value that is none).
#[unsafe(no_mangle)]
pub extern "C" fn dk_status_text(status: i32) -> *const c_char {
    const ALL: [dk_status; 16] = [
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
        dk_status::DK_ERR_NO_MEMORY,
        dk_status::DK_ERR_OPTIONS,
    ];
    ALL.iter()
        .find(|s| **s as i32 == status)
        .map_or(c"unknown status", |known| status_cstr(*known))
        .as_ptr()
}
