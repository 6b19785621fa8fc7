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
use alloc::string::{String, ToString as _};
use alloc::vec::Vec;
use core::ffi::{c_char, c_void};
use core::fmt;
use core::time::Duration;

use dk_device_core::{Config, Credentials, DeviceCore, Instant, Invocation, Received, State};
use zeroize::Zeroizing;

use crate::abi::{
    DK_CREDENTIALS_BYTES, DK_MAX_IN_FLIGHT, DK_MAX_INPUT, DK_MAX_REMEMBERED_CALLS,
    DK_MIN_FRAME_BYTES, DK_RESERVE_BYTES, bytes, dk_call, dk_options, dk_reply, dk_status,
    text as utf8,
};
use crate::platform::{PlatformRandom, dk_platform, refusals, register};

pub(crate) mod answer;
pub(crate) mod feed;
pub(crate) mod poll;
pub(crate) mod status;

use status::status_text;

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
