//! What each `dk_status` means, as text.

use core::ffi::{CStr, c_char};

use crate::abi::dk_status;

pub(crate) fn status_text(status: dk_status) -> &'static str {
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
