//! The values that cross the ABI: status codes, options, outputs, calls,
//! and the checks every pointer and length passes on the way in.

use core::ffi::{c_char, c_void};
use core::ptr;

/// The length of the credentials blob a device keeps
/// (`dk_output_kind::DK_OUTPUT_STORE`) and is given back at creation.
pub const DK_CREDENTIALS_BYTES: usize = 66;

const _: () = assert!(DK_CREDENTIALS_BYTES == dk_device_core::CREDENTIALS_BYTES);

/// The longest buffer any function takes (a manifest, a message, a
/// result): longer is `DK_ERR_TOO_LONG`.
pub const DK_MAX_INPUT: usize = 1_048_576;

const _: () = assert!(DK_MAX_INPUT == dk_proto::MAX_FRAME_BYTES);

/// The smallest `max_frame_bytes` an option may set.
pub const DK_MIN_FRAME_BYTES: usize = 1024;

/// The most calls at once an option may set.
pub const DK_MAX_IN_FLIGHT: usize = 4096;

/// The most call ids an option may have remembered.
pub const DK_MAX_REMEMBERED_CALLS: usize = 65_536;

/// The bytes of the library's reserve: its own memory (in its data, not
/// the heap) that answers a small allocation the platform refused, so that
/// the call it happened in can end its connection and return
/// `DK_ERR_NO_MEMORY` instead of aborting.
pub const DK_RESERVE_BYTES: usize = 8192;

/// What a function made of its arguments. `DK_OK` is 0; every error is
/// negative, and `dk_status_text` names it.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum dk_status {
    /// Done.
    DK_OK = 0,
    /// A pointer that must not be NULL is, or NULL came with a length.
    DK_ERR_NULL = -1,
    /// A length over `DK_MAX_INPUT`, or not the length the value has.
    DK_ERR_TOO_LONG = -2,
    /// Text that is not UTF-8.
    DK_ERR_UTF8 = -3,
    /// A result or an event that is not JSON.
    DK_ERR_JSON = -4,
    /// The manifest is not valid (the error text says why).
    DK_ERR_MANIFEST = -5,
    /// The stored credentials cannot be read back.
    DK_ERR_CREDENTIALS = -6,
    /// A platform callback is missing, or other allocation callbacks are
    /// registered already.
    DK_ERR_PLATFORM = -7,
    /// The platform gave no random bytes.
    DK_ERR_ENTROPY = -8,
    /// No call with that id is running (answered already, or its
    /// connection ended: the vessel failed it).
    DK_ERR_NO_SUCH_CALL = -9,
    /// No connection is serving: nothing can be sent now.
    DK_ERR_NOT_CONNECTED = -10,
    /// The manifest declares no such capability.
    DK_ERR_UNKNOWN_CAPABILITY = -11,
    /// The vessel would refuse the frame (too large, nested too deep).
    DK_ERR_REFUSED = -12,
    /// Not now: a poll from inside a handler, a reply given twice.
    DK_ERR_BUSY = -13,
    /// The platform's allocator had no memory: the call did not happen, or
    /// the connection it belonged to was ended (a `DK_OUTPUT_ENDED` with
    /// `DK_END_RETRY` comes out of the next poll) and what it held freed.
    /// The device is still usable: connect again after a backoff.
    DK_ERR_NO_MEMORY = -14,
    /// An option out of its range (`dk_options` says each one's).
    DK_ERR_OPTIONS = -15,
}

/// Where the connection stands.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum dk_state {
    /// No connection: `dk_device_connect`
    /// starts one.
    DK_STATE_IDLE = 0,
    /// The dk/2 handshake runs.
    DK_STATE_HANDSHAKING = 1,
    /// `device:hello` was sent: the pairing runs.
    DK_STATE_PAIRING = 2,
    /// Paired or authenticated: calls are served.
    DK_STATE_SERVING = 3,
    /// The device closed and waits for the vessel's close.
    DK_STATE_CLOSING = 4,
    /// The connection ended.
    DK_STATE_ENDED = 5,
}

/// What `dk_device_poll` asks of the platform.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum dk_output_kind {
    /// Nothing (the poll returned false).
    DK_OUTPUT_NONE = 0,
    /// Send `data`/`len` as a WebSocket text message.
    DK_OUTPUT_SEND_TEXT = 1,
    /// Send `data`/`len` as a WebSocket binary message.
    DK_OUTPUT_SEND_BINARY = 2,
    /// Close the WebSocket with `close_code` (0: none) and the reason in
    /// `data`/`len`; send nothing after it.
    DK_OUTPUT_SEND_CLOSE = 3,
    /// The connection is open: the handshake is done and the vessel's key
    /// checked.
    DK_OUTPUT_CONNECTED = 4,
    /// Show the person the 6-digit pairing code in `data` (NUL-terminated).
    DK_OUTPUT_SHOW_CODE = 5,
    /// Keep the `DK_CREDENTIALS_BYTES` bytes in `data` (a secret: the
    /// device's key), replacing what was kept, and pass them to the next
    /// `dk_device_new`; when they cannot be kept,
    /// call `dk_device_storage_failed`.
    DK_OUTPUT_STORE = 6,
    /// Run the call in `call` (no handler is registered for its
    /// capability) and answer it with
    /// `dk_device_answer`.
    DK_OUTPUT_INVOKE = 7,
    /// Something to log (`data`, NUL-terminated), when no log callback is
    /// registered.
    DK_OUTPUT_NOTICE = 8,
    /// The connection ended (`end` says how, `data` why): close the socket
    /// now if it is still open (no `DK_OUTPUT_SEND_CLOSE` need come before
    /// this: a handshake that timed out, a connection ended for want of
    /// memory, end without one), and connect again after a backoff when
    /// `end` is `DK_END_RETRY`.
    DK_OUTPUT_ENDED = 9,
}

/// How a connection ended.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum dk_end {
    /// Not an end (the output is of another kind).
    DK_END_NONE = 0,
    /// Connecting again makes sense, after a backoff.
    DK_END_RETRY = 1,
    /// The device must not connect again on its own: the person must act
    /// (pair again, check the vessel's key).
    DK_END_STOP = 2,
    /// `dk_device_shutdown` or `dk_device_shutdown_within` asked for it.
    DK_END_SHUTDOWN = 3,
}

/// How a device runs; zero in a field means its default, and a NULL
/// options pointer means every default. A field out of its range is
/// `DK_ERR_OPTIONS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dk_options {
    /// The credentials the device kept (`DK_CREDENTIALS_BYTES` bytes), or
    /// NULL on its first run: a key is made at the first connection and
    /// given out to keep.
    pub credentials: *const u8,
    /// Their length: `DK_CREDENTIALS_BYTES`, or 0 with NULL (credentials
    /// of another length, 0 included, are `DK_ERR_CREDENTIALS`).
    pub credentials_len: usize,
    /// The largest frame taken from the vessel, in bytes
    /// (`DK_MIN_FRAME_BYTES` to `DK_MAX_INPUT`; default `DK_MAX_INPUT`).
    /// A device short of memory sets it to what its calls need: a call
    /// takes at most its frame and 8 KiB more.
    pub max_frame_bytes: usize,
    /// How many calls may run at once (1 to `DK_MAX_IN_FLIGHT`; default
    /// 64).
    pub max_in_flight: usize,
    /// How many call ids are remembered so that a repeat never runs, 8
    /// bytes each (1 to `DK_MAX_REMEMBERED_CALLS`; default 1024).
    pub remember_calls: usize,
    /// How long the handshake may take, in milliseconds (default 10000).
    pub handshake_timeout_ms: u32,
    /// How long to wait for the vessel's close after the device's, in
    /// milliseconds (default 1000).
    pub close_timeout_ms: u32,
}

/// A call to run: UTF-8 text, each NUL-terminated (the lengths leave the
/// NUL out, and none holds a NUL before its end: a call whose id has one is
/// answered with an error instead of run).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dk_call {
    /// The call's id, to answer with.
    pub call_id: *const c_char,
    /// Its length.
    pub call_id_len: usize,
    /// The capability called (one the manifest declares).
    pub capability: *const c_char,
    /// Its length.
    pub capability_len: usize,
    /// The input, a JSON object the vessel checked against the params.
    pub input: *const c_char,
    /// Its length.
    pub input_len: usize,
}

impl dk_call {
    pub(crate) const EMPTY: dk_call = dk_call {
        call_id: ptr::null(),
        call_id_len: 0,
        capability: ptr::null(),
        capability_len: 0,
        input: ptr::null(),
        input_len: 0,
    };
}

/// One thing for the platform to do, from
/// `dk_device_poll`. Its pointers stay valid
/// until the next poll or `dk_device_free`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dk_output {
    /// What to do.
    pub kind: dk_output_kind,
    /// The bytes of it (see each kind); NUL-terminated when text.
    pub data: *const u8,
    /// Their length (without the NUL).
    pub len: usize,
    /// `DK_OUTPUT_SEND_CLOSE`: the close code, 0 for none.
    pub close_code: u16,
    /// `DK_OUTPUT_ENDED`: how.
    pub end: dk_end,
    /// `DK_OUTPUT_INVOKE`: the call.
    pub call: dk_call,
}

impl dk_output {
    pub(crate) const NONE: dk_output = dk_output {
        kind: dk_output_kind::DK_OUTPUT_NONE,
        data: ptr::null(),
        len: 0,
        close_code: 0,
        end: dk_end::DK_END_NONE,
        call: dk_call::EMPTY,
    };
}

/// A handler's answer to one call, given with
/// `dk_reply_ok` or
/// `dk_reply_error` during the handler, which send it at once.
#[derive(Debug)]
pub struct dk_reply {
    /// The `dk_device` the call runs on (NULL: no call behind the reply),
    /// its type left to `device.rs`, which owns it.
    pub(crate) device: *mut c_void,
    /// The call's id, live through the handler.
    pub(crate) call_id: *const u8,
    pub(crate) call_id_len: usize,
    /// Whether the handler replied.
    pub(crate) given: bool,
}

impl Default for dk_reply {
    fn default() -> dk_reply {
        dk_reply {
            device: ptr::null_mut(),
            call_id: ptr::null(),
            call_id_len: 0,
            given: false,
        }
    }
}

/// `len` bytes at `ptr`, checked: NULL only with 0, at most `max`.
///
/// # Safety
///
/// A non-NULL `ptr` is readable for `len` bytes for `'a`.
pub(crate) unsafe fn bytes<'a>(
    ptr: *const u8,
    len: usize,
    max: usize,
) -> Result<&'a [u8], dk_status> {
    if len > max {
        return Err(dk_status::DK_ERR_TOO_LONG);
    }
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(dk_status::DK_ERR_NULL)
        };
    }
    // SAFETY: non-NULL and readable for `len` bytes (the caller's
    // promise); `len` is at most DK_MAX_INPUT, far below isize::MAX.
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// `len` bytes of UTF-8 text at `ptr`, checked as `bytes` does.
///
/// # Safety
///
/// As `bytes`.
pub(crate) unsafe fn text<'a>(ptr: *const c_char, len: usize) -> Result<&'a str, dk_status> {
    // SAFETY: the caller's promise, passed on.
    let bytes = unsafe { bytes(ptr.cast(), len, DK_MAX_INPUT) }?;
    core::str::from_utf8(bytes).map_err(|_| dk_status::DK_ERR_UTF8)
}
