//! The ABI called as C calls it: the header cbindgen writes, NULLs, bad
//! lengths and text, and a whole pairing against a vessel written on
//! dk-channel's scripted vessel.
//!
//! Every unsafe call here passes NULL on purpose, or a live device and
//! buffers readable or writable for the lengths given.

#![allow(clippy::undocumented_unsafe_blocks)]

use std::path::Path;

/// Where the checked-in header lives.
fn header_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include/dk_device.h")
}

#[test]
fn the_checked_in_header_is_what_cbindgen_writes() {
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(Path::new(crate_dir).join("cbindgen.toml")).unwrap();
    let mut written = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap()
        .write(&mut written);
    let written = String::from_utf8(written).unwrap();
    if std::env::var_os("DK_BLESS").is_some() {
        std::fs::write(header_path(), &written).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(header_path()).unwrap_or_default();
    assert!(
        checked_in == written,
        "crates/dk-device-c/include/dk_device.h is not what cbindgen writes from the crate: \
         run `DK_BLESS=1 cargo test -p dk-device-c header` to rewrite it"
    );
}

use std::ffi::{CStr, c_char, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use core::alloc::{GlobalAlloc as _, Layout};
use dk_channel::{RecordLimits, ScriptedVessel, StaticKey};
use dk_proto::MAX_FRAME_BYTES;

use crate::*;
use memory::{call, platform_alloc, platform_free};

mod firmware;
mod hostile;
pub(crate) mod memory;

pub(crate) const LAMP: &str = include_str!("../../../../fixtures/manifests/valid/desk-lamp.json");

/// Random bytes from a counter kept at `ctx`.
unsafe extern "C" fn counter(ctx: *mut c_void, buf: *mut u8, len: usize) -> bool {
    // SAFETY: ctx is a u8 the test owns; buf is writable for len.
    let (next, out) = unsafe {
        (
            &mut *ctx.cast::<u8>(),
            std::slice::from_raw_parts_mut(buf, len),
        )
    };
    for byte in out {
        *byte = *next;
        *next = next.wrapping_add(7);
    }
    true
}

unsafe extern "C" fn no_random(_: *mut c_void, _: *mut u8, _: usize) -> bool {
    false
}

pub(crate) fn platform(seed: &mut u8) -> dk_platform {
    dk_platform {
        ctx: ptr::from_mut(seed).cast(),
        random: Some(counter),
        alloc: Some(platform_alloc),
        free: Some(platform_free),
        log: None,
    }
}

/// The options of a device that kept `credentials`, every other default.
pub(crate) fn options(credentials: Option<&[u8]>) -> dk_options {
    dk_options {
        credentials: credentials.map_or(ptr::null(), <[u8]>::as_ptr),
        credentials_len: credentials.map_or(0, <[u8]>::len),
        max_frame_bytes: 0,
        max_in_flight: 0,
        remember_calls: 0,
        handshake_timeout_ms: 0,
        close_timeout_ms: 0,
    }
}

/// A device made with `options`, or the status and error text.
pub(crate) fn made(
    platform: &dk_platform,
    manifest: &[u8],
    options: &dk_options,
) -> Result<*mut dk_device, (dk_status, String)> {
    let mut error = [0x7f as c_char; 256];
    let mut device = ptr::dangling_mut();
    // SAFETY: every pointer is live for its length.
    let status = call(|| unsafe {
        dk_device_new(
            platform,
            manifest.as_ptr().cast(),
            manifest.len(),
            options,
            &mut device,
            error.as_mut_ptr(),
            error.len(),
        )
    });
    // SAFETY: dk_device_new NUL-terminates what it writes.
    let why = unsafe { CStr::from_ptr(error.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    if status != dk_status::DK_OK {
        assert!(device.is_null(), "no device on {status:?}");
        return Err((status, why));
    }
    assert!(!device.is_null() && why.is_empty(), "{why}");
    Ok(device)
}

/// A device of the lamp, or the error text.
fn new_device(
    platform: &dk_platform,
    manifest: &[u8],
    credentials: Option<&[u8]>,
) -> Result<*mut dk_device, String> {
    made(platform, manifest, &options(credentials)).map_err(|(_, why)| why)
}

/// What a poll gave, copied out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Out {
    Text(String),
    Binary(Vec<u8>),
    Close(u16, String),
    Connected,
    Code(String),
    Store(Vec<u8>),
    Invoke {
        id: String,
        capability: String,
        input: String,
    },
    Notice(String),
    Ended(dk_end, String),
}

fn text_of(ptr: *const c_char, len: usize) -> String {
    // SAFETY: the output's pointers are valid until the next poll.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8(bytes.to_vec()).unwrap()
}

pub(crate) fn drain(device: *mut dk_device) -> Vec<Out> {
    let mut outs = Vec::new();
    let mut out = dk_output::NONE;
    // SAFETY: a live device and a writable output.
    while call(|| unsafe { dk_device_poll(device, &mut out) }) {
        let data = || text_of(out.data.cast(), out.len);
        // SAFETY: valid until the next poll.
        let bytes = || unsafe { std::slice::from_raw_parts(out.data, out.len) }.to_vec();
        outs.push(match out.kind {
            dk_output_kind::DK_OUTPUT_SEND_TEXT => Out::Text(data()),
            dk_output_kind::DK_OUTPUT_SEND_BINARY => Out::Binary(bytes()),
            dk_output_kind::DK_OUTPUT_SEND_CLOSE => Out::Close(
                out.close_code,
                if out.len == 0 { String::new() } else { data() },
            ),
            dk_output_kind::DK_OUTPUT_CONNECTED => Out::Connected,
            dk_output_kind::DK_OUTPUT_SHOW_CODE => Out::Code(data()),
            dk_output_kind::DK_OUTPUT_STORE => Out::Store(bytes()),
            dk_output_kind::DK_OUTPUT_INVOKE => Out::Invoke {
                id: text_of(out.call.call_id, out.call.call_id_len),
                capability: text_of(out.call.capability, out.call.capability_len),
                input: text_of(out.call.input, out.call.input_len),
            },
            dk_output_kind::DK_OUTPUT_NOTICE => Out::Notice(data()),
            dk_output_kind::DK_OUTPUT_ENDED => Out::Ended(out.end, data()),
            dk_output_kind::DK_OUTPUT_NONE => unreachable!(),
        });
    }
    assert_eq!(out.kind, dk_output_kind::DK_OUTPUT_NONE);
    outs
}

/// A vessel's side of one connection (dk-channel's scripted vessel), with
/// the nonce its pairing reveals.
pub(crate) struct Vessel {
    channel: ScriptedVessel,
    pub(crate) nv: [u8; 32],
}

impl Vessel {
    pub(crate) fn new(secret: u8) -> Vessel {
        let key = StaticKey::from_secret([secret; 32]).unwrap();
        let limits = RecordLimits {
            max_text: MAX_FRAME_BYTES,
            max_binary: MAX_FRAME_BYTES,
        };
        Vessel {
            channel: ScriptedVessel::new(&key, limits).unwrap(),
            nv: [9; 32],
        }
    }

    /// Ready for the device's next connection.
    pub(crate) fn restart(&mut self) {
        self.channel.restart().unwrap();
    }

    pub(crate) fn hash(&self) -> [u8; 32] {
        self.channel.handshake_hash()
    }

    pub(crate) fn second(&mut self, first: &[u8]) -> Vec<u8> {
        self.channel.second(first).unwrap()
    }

    pub(crate) fn third(&mut self, third: &[u8]) {
        self.channel.third(third).unwrap();
    }

    pub(crate) fn open(&mut self, record: &[u8]) -> Option<String> {
        self.channel.open(record).unwrap()
    }

    /// The records of a text frame to the device.
    pub(crate) fn seal(&mut self, frame: &str) -> Vec<Vec<u8>> {
        self.channel.seal(frame).unwrap()
    }

    /// Sends `frame` to the device; what it gave back, with its frames
    /// opened.
    pub(crate) fn tell(&mut self, device: *mut dk_device, frame: &str) -> (Vec<Out>, Vec<String>) {
        let records = self.seal(frame);
        for record in records {
            // SAFETY: a live device and a buffer of that length.
            let status = call(|| unsafe {
                dk_device_receive_binary(device, 5, record.as_ptr(), record.len())
            });
            assert_eq!(status, dk_status::DK_OK);
        }
        self.drained(device)
    }

    pub(crate) fn drained(&mut self, device: *mut dk_device) -> (Vec<Out>, Vec<String>) {
        let outs = drain(device);
        let frames = outs
            .iter()
            .filter_map(|o| match o {
                Out::Binary(b) => self.open(b),
                _ => None,
            })
            .collect();
        (outs, frames)
    }

    /// The handshake; the device's frames after it, opened.
    fn shake(&mut self, device: *mut dk_device) -> (Vec<Out>, Vec<String>) {
        // SAFETY: a live device.
        assert_eq!(
            call(|| unsafe { dk_device_connect(device, 1) }),
            dk_status::DK_OK
        );
        let started = drain(device);
        let Some(Out::Binary(first)) = started.iter().find(|o| matches!(o, Out::Binary(_))) else {
            panic!("no first message: {started:?}");
        };
        let second = self.second(first);
        // SAFETY: a live device and a buffer of that length.
        let status =
            call(|| unsafe { dk_device_receive_binary(device, 2, second.as_ptr(), second.len()) });
        assert_eq!(status, dk_status::DK_OK);
        let outs = drain(device);
        let mut binaries = outs.iter().filter_map(|o| match o {
            Out::Binary(b) => Some(b.clone()),
            _ => None,
        });
        self.third(&binaries.next().unwrap());
        let frames = binaries.filter_map(|b| self.open(&b)).collect();
        (started.into_iter().chain(outs).collect(), frames)
    }
}

/// The handler of `set_light`: answers with the input it was given.
unsafe extern "C" fn set_light(ctx: *mut c_void, call: *const dk_call, reply: *mut dk_reply) {
    // SAFETY: ctx is the test's counter; call lives through the handler.
    let (calls, call) = unsafe { (&*ctx.cast::<AtomicUsize>(), &*call) };
    calls.fetch_add(1, Ordering::Relaxed);
    let input = text_of(call.input, call.input_len);
    // SAFETY: the handler's reply, and a buffer of that length.
    let status = unsafe { dk_reply_ok(reply, input.as_ptr().cast(), input.len()) };
    assert_eq!(status, dk_status::DK_OK);
    // Answered once only.
    // SAFETY: as above.
    let again = unsafe { dk_reply_error(reply, c"twice".as_ptr(), 5) };
    assert_eq!(again, dk_status::DK_ERR_BUSY);
}

/// Pairs a new lamp with `vessel`: the device and the credentials kept.
pub(crate) fn pair(seed: &mut u8, vessel: &mut Vessel) -> (*mut dk_device, Vec<u8>) {
    let platform = platform(seed);
    let device = new_device(&platform, LAMP.as_bytes(), None).unwrap();
    let (outs, frames) = vessel.shake(device);
    assert!(outs.contains(&Out::Connected), "{outs:?}");
    assert!(matches!(outs.first(), Some(Out::Store(b)) if b.len() == DK_CREDENTIALS_BYTES));
    assert!(frames[0].contains("device:hello"), "{frames:?}");
    // SAFETY: a live device.
    assert_eq!(
        unsafe { dk_device_state(device) },
        dk_state::DK_STATE_PAIRING
    );
    let commitment = dk_channel::commitment(&vessel.nv, &vessel.hash());
    let commit = format!(
        r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
        dk_channel::to_hex32(&commitment)
    );
    let (_, frames) = vessel.tell(device, &commit);
    let nonce: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    let nd = dk_channel::from_hex32(nonce["nonce"].as_str().unwrap()).unwrap();
    let reveal = format!(
        r#"{{"type":"device:pair-reveal","nonce":"{}"}}"#,
        dk_channel::to_hex32(&vessel.nv)
    );
    let (outs, _) = vessel.tell(device, &reveal);
    let code = dk_channel::pairing_code(&vessel.hash(), &nd, &vessel.nv);
    assert_eq!(outs, vec![Out::Code(code)]);
    let (outs, _) = vessel.tell(device, r#"{"type":"device:paired"}"#);
    let Some(Out::Store(kept)) = outs.iter().find(|o| matches!(o, Out::Store(_))) else {
        panic!("nothing to keep: {outs:?}");
    };
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Notice(n) if n.starts_with("the vessel's key is pinned")))
    );
    // SAFETY: a live device.
    assert_eq!(
        unsafe { dk_device_state(device) },
        dk_state::DK_STATE_SERVING
    );
    (device, kept.clone())
}

#[test]
fn a_lamp_pairs_through_the_abi_runs_calls_and_reconnects_by_key() {
    let mut seed = 1u8;
    let mut vessel = Vessel::new(42);
    let (device, kept) = pair(&mut seed, &mut vessel);

    // A handler answers at once.
    let calls = AtomicUsize::new(0);
    // SAFETY: a live device; the handler and its ctx outlive it.
    let status = unsafe {
        dk_device_on(
            device,
            c"set_light".as_ptr(),
            9,
            Some(set_light),
            ptr::from_ref(&calls).cast_mut().cast(),
        )
    };
    assert_eq!(status, dk_status::DK_OK);
    let (outs, frames) = vessel.tell(
        device,
        r#"{"type":"device:invoke","callId":"c1","capability":"set_light","input":{"on":true}}"#,
    );
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(outs.len(), 1, "{outs:?}");
    let result: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(result["ok"], true);
    assert_eq!(result["result"]["on"], true);

    // Without a handler the call comes out, and is answered later.
    let (outs, _) = vessel.tell(
        device,
        r#"{"type":"device:invoke","callId":"c2","capability":"read_light","input":{}}"#,
    );
    let [
        Out::Invoke {
            id,
            capability,
            input,
        },
    ] = &outs[..]
    else {
        panic!("{outs:?}");
    };
    assert_eq!(
        (id.as_str(), capability.as_str(), input.as_str()),
        ("c2", "read_light", "{}")
    );
    let answer = |ok: bool, text: &str| {
        // SAFETY: a live device and buffers of their lengths.
        unsafe {
            dk_device_answer(
                device,
                c"c2".as_ptr(),
                2,
                ok,
                text.as_ptr().cast(),
                text.len(),
            )
        }
    };
    assert_eq!(answer(true, "{not json"), dk_status::DK_ERR_JSON);
    assert_eq!(
        answer(true, r#"{"on":true,"brightness":40}"#),
        dk_status::DK_OK
    );
    assert_eq!(answer(false, "again"), dk_status::DK_ERR_NO_SUCH_CALL);
    let (_, frames) = vessel.drained(device);
    let result: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(result["result"]["brightness"], 40);

    // An event.
    let data = r#"{"on":false}"#;
    // SAFETY: a live device and buffers of their lengths.
    let status = unsafe {
        dk_device_emit(
            device,
            c"set_light".as_ptr(),
            9,
            data.as_ptr().cast(),
            data.len(),
        )
    };
    assert_eq!(status, dk_status::DK_OK);
    let (_, frames) = vessel.drained(device);
    assert!(frames[0].contains("device:event"), "{frames:?}");

    // A shutdown: a close 1000, then the vessel's close ends it.
    // SAFETY: a live device.
    assert_eq!(unsafe { dk_device_shutdown(device, 9) }, dk_status::DK_OK);
    let outs = drain(device);
    assert!(matches!(&outs[..], [Out::Close(1000, _)]), "{outs:?}");
    // SAFETY: a live device and an empty reason.
    assert_eq!(
        unsafe { dk_device_receive_close(device, 9, 1000, ptr::null(), 0) },
        dk_status::DK_OK
    );
    assert!(matches!(
        &drain(device)[..],
        [Out::Ended(dk_end::DK_END_SHUTDOWN, _)]
    ));
    // SAFETY: live, freed once.
    unsafe { dk_device_free(device) };

    // Restarted with what it kept: device:auth by key, no pairing.
    let platform = platform(&mut seed);
    let device = new_device(&platform, LAMP.as_bytes(), Some(&kept)).unwrap();
    vessel.restart();
    let (_, frames) = vessel.shake(device);
    let auth: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(auth["type"], "device:auth");
    // SAFETY: a live device.
    assert_eq!(
        unsafe { dk_device_state(device) },
        dk_state::DK_STATE_SERVING
    );
    // SAFETY: live, freed once.
    unsafe { dk_device_free(device) };

    // Another vessel's key: closed before message 3, and the device stops.
    let device = new_device(&platform, LAMP.as_bytes(), Some(&kept)).unwrap();
    let mut impostor = Vessel::new(7);
    // SAFETY: a live device.
    unsafe { dk_device_connect(device, 1) };
    let outs = drain(device);
    let [Out::Binary(first)] = &outs[..] else {
        panic!("{outs:?}");
    };
    let second = impostor.second(first);
    // SAFETY: a live device and a buffer of that length.
    unsafe { dk_device_receive_binary(device, 2, second.as_ptr(), second.len()) };
    let outs = drain(device);
    assert!(
        matches!(&outs[..], [Out::Close(0, _), Out::Ended(dk_end::DK_END_STOP, why)]
        if why.contains("the vessel's key changed")),
        "{outs:?}"
    );
    // SAFETY: live, freed once.
    unsafe { dk_device_free(device) };
}

/// Answers call `id` of `device` with `text` through the ABI.
fn answer_ok(device: *mut dk_device, id: &str, text: &str) -> dk_status {
    // SAFETY: a live device and buffers of their lengths.
    unsafe {
        dk_device_answer(
            device,
            id.as_ptr().cast(),
            id.len(),
            true,
            text.as_ptr().cast(),
            text.len(),
        )
    }
}

#[test]
fn a_shutdown_within_a_grace_lets_running_calls_answer_and_refuses_new_ones() {
    let mut seed = 3u8;
    let mut vessel = Vessel::new(42);
    let (device, _) = pair(&mut seed, &mut vessel);
    let read = r#"{"type":"device:invoke","callId":"c1","capability":"read_light","input":{}}"#;
    let (outs, _) = vessel.tell(device, read);
    assert!(matches!(&outs[..], [Out::Invoke { .. }]), "{outs:?}");

    // SAFETY: a live device.
    let status = unsafe { dk_device_shutdown_within(device, 100, 5_000) };
    assert_eq!(status, dk_status::DK_OK);
    assert!(drain(device).is_empty(), "c1 has its grace");
    let mut at = 0u64;
    // SAFETY: a live device and a place for the time.
    assert!(unsafe { dk_device_next_timeout(device, &mut at) });
    assert_eq!(at, 5_100);

    // A new call is refused and never comes out.
    let (outs, frames) = vessel.tell(device, &read.replace("c1", "c2"));
    assert!(matches!(&outs[..], [Out::Binary(_)]), "{outs:?}");
    let refused: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(refused["callId"], "c2");
    assert_eq!(refused["error"], "device is shutting down");

    // c1's answer goes out; then the close is due at once.
    assert_eq!(answer_ok(device, "c1", r#"{"on":false}"#), dk_status::DK_OK);
    let (_, frames) = vessel.drained(device);
    let result: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(result["callId"], "c1");
    assert_eq!(result["ok"], true);
    // SAFETY: a live device and a place for the time.
    assert!(unsafe { dk_device_next_timeout(device, &mut at) });
    assert!(at <= 200, "due now: {at}");
    // SAFETY: a live device.
    assert_eq!(
        unsafe { dk_device_handle_timeout(device, 200) },
        dk_status::DK_OK
    );
    let outs = drain(device);
    assert!(matches!(&outs[..], [Out::Close(1000, _)]), "{outs:?}");
    // SAFETY: live, freed once.
    unsafe { dk_device_free(device) };

    // A call that outlives the grace is dropped by the close.
    let mut vessel = Vessel::new(43);
    let (device, _) = pair(&mut seed, &mut vessel);
    vessel.tell(device, read);
    // SAFETY: a live device.
    unsafe { dk_device_shutdown_within(device, 100, 50) };
    // SAFETY: a live device.
    unsafe { dk_device_handle_timeout(device, 149) };
    assert!(drain(device).is_empty(), "not yet");
    // SAFETY: a live device.
    unsafe { dk_device_handle_timeout(device, 150) };
    assert!(matches!(&drain(device)[..], [Out::Close(1000, _)]));
    assert_eq!(
        answer_ok(device, "c1", "{}"),
        dk_status::DK_ERR_NO_SUCH_CALL
    );
    // SAFETY: live, freed once.
    unsafe { dk_device_free(device) };
}

#[test]
fn bad_arguments_are_answered_with_a_status_never_a_crash() {
    let mut seed = 1u8;
    let good = platform(&mut seed);
    let mut error = [0 as c_char; 64];
    let mut device = ptr::dangling_mut();
    // SAFETY: NULLs, and a writable error buffer and device of their
    // lengths.
    let status = unsafe {
        dk_device_new(
            ptr::null(),
            ptr::null(),
            0,
            ptr::null(),
            &mut device,
            error.as_mut_ptr(),
            64,
        )
    };
    assert_eq!(status, dk_status::DK_ERR_NULL);
    assert!(device.is_null());
    // SAFETY: NUL-terminated by dk_device_new.
    let why = unsafe { CStr::from_ptr(error.as_ptr()) };
    assert_eq!(why.to_str().unwrap(), "no platform callbacks");
    // SAFETY: NULL with a length, and no error buffer: refused.
    let status = unsafe {
        dk_device_new(
            &good,
            ptr::null(),
            12,
            ptr::null(),
            &mut device,
            ptr::null_mut(),
            0,
        )
    };
    assert_eq!(status, dk_status::DK_ERR_NULL);
    // SAFETY: nowhere to put the device.
    let status = unsafe {
        dk_device_new(
            &good,
            LAMP.as_ptr().cast(),
            LAMP.len(),
            ptr::null(),
            ptr::null_mut(),
            error.as_mut_ptr(),
            64,
        )
    };
    assert_eq!(status, dk_status::DK_ERR_NULL);
    // Each refusal its status.
    let status_of =
        |manifest: &[u8], options: &dk_options| made(&good, manifest, options).unwrap_err();
    assert_eq!(
        status_of(b"{", &options(None)).0,
        dk_status::DK_ERR_MANIFEST
    );
    assert_eq!(status_of(b"\xff", &options(None)).0, dk_status::DK_ERR_UTF8);
    assert_eq!(
        status_of(LAMP.as_bytes(), &options(Some(&[1; 12]))).0,
        dk_status::DK_ERR_CREDENTIALS
    );
    // Credentials of no length are refused, not read as none.
    let kept = [0u8; DK_CREDENTIALS_BYTES];
    let mut empty = options(Some(&kept));
    empty.credentials_len = 0;
    assert_eq!(
        status_of(LAMP.as_bytes(), &empty),
        (
            dk_status::DK_ERR_CREDENTIALS,
            "credentials of 0 bytes: pass NULL when none are kept".to_owned()
        )
    );
    // Options out of their ranges are refused, not clamped.
    for (max_frame_bytes, max_in_flight, remember_calls) in [
        (1023, 0, 0),
        (DK_MAX_INPUT + 1, 0, 0),
        (1, 0, 0),
        (0, DK_MAX_IN_FLIGHT + 1, 0),
        (0, 0, DK_MAX_REMEMBERED_CALLS + 1),
        (0, 0, usize::MAX),
    ] {
        let mut out_of_range = options(None);
        out_of_range.max_frame_bytes = max_frame_bytes;
        out_of_range.max_in_flight = max_in_flight;
        out_of_range.remember_calls = remember_calls;
        let (status, why) = status_of(LAMP.as_bytes(), &out_of_range);
        assert_eq!(status, dk_status::DK_ERR_OPTIONS, "{why}");
        assert!(why.contains(" is not 0 or "), "{why}");
    }
    let mut smallest = options(None);
    (
        smallest.max_frame_bytes,
        smallest.max_in_flight,
        smallest.remember_calls,
    ) = (DK_MIN_FRAME_BYTES, 1, 1);
    let device = made(&good, LAMP.as_bytes(), &smallest).unwrap();
    // SAFETY: live, freed once.
    unsafe { dk_device_free(device) };
    let refused = |manifest: &[u8], credentials: Option<&[u8]>| {
        new_device(&good, manifest, credentials).unwrap_err()
    };
    assert_eq!(
        refused(b"\xff\xfe", None),
        "manifest: text that is not UTF-8"
    );
    assert!(
        refused(b"{", None).starts_with("manifest is not valid JSON"),
        "{}",
        refused(b"{", None)
    );
    assert_eq!(
        refused(br#"{"id":"x"}"#, None),
        "manifest must declare at least one capability"
    );
    assert_eq!(
        refused(LAMP.as_bytes(), Some(&[1; 12])),
        "stored credentials are 12 bytes, not 66"
    );
    let mut bad_layout = [0u8; DK_CREDENTIALS_BYTES];
    bad_layout[0] = 9;
    assert_eq!(
        refused(LAMP.as_bytes(), Some(&bad_layout)),
        "stored credentials of unknown layout 9"
    );
    // A manifest over the limit.
    let huge = vec![b' '; DK_MAX_INPUT + 1];
    assert!(refused(&huge, None).starts_with("manifest: a length over the limit"));
    // No random bytes: no device.
    let mut dry = good;
    dry.random = Some(no_random);
    assert!(new_device(&dry, LAMP.as_bytes(), None).is_err());
    dry.random = None;
    assert_eq!(
        new_device(&dry, LAMP.as_bytes(), None).unwrap_err(),
        "the platform needs a random callback"
    );
    // Other allocation callbacks than the ones registered.
    let mut other = good;
    other.free = None;
    assert!(new_device(&other, LAMP.as_bytes(), None).is_err());
    // SAFETY: a readable platform with other callbacks.
    assert_eq!(
        unsafe { dk_platform_init(&other) },
        dk_status::DK_ERR_PLATFORM
    );
    // SAFETY: NULL.
    assert_eq!(
        unsafe { dk_platform_init(ptr::null()) },
        dk_status::DK_ERR_NULL
    );

    // An error cut at a character boundary to fit the buffer.
    let mut small = [0x7f as c_char; 5];
    let manifest = "é".repeat(3);
    let mut device = ptr::dangling_mut();
    // SAFETY: buffers of their lengths.
    let status = unsafe {
        dk_device_new(
            &good,
            manifest.as_ptr().cast(),
            manifest.len(),
            ptr::null(),
            &mut device,
            small.as_mut_ptr(),
            5,
        )
    };
    assert_eq!(status, dk_status::DK_ERR_MANIFEST);
    assert!(device.is_null());
    // SAFETY: NUL-terminated within its 5 bytes.
    let cut = unsafe { CStr::from_ptr(small.as_ptr()) };
    assert_eq!(cut.to_str().unwrap(), "mani");

    let device = new_device(&good, LAMP.as_bytes(), None).unwrap();
    let null: *mut dk_device = ptr::null_mut();
    // SAFETY: each call passes NULL, or a live device with NULL or buffers
    // of their lengths.
    unsafe {
        assert_eq!(dk_device_connect(null, 0), dk_status::DK_ERR_NULL);
        assert_eq!(dk_device_lost(null, 0), dk_status::DK_ERR_NULL);
        assert_eq!(dk_device_shutdown(null, 0), dk_status::DK_ERR_NULL);
        assert_eq!(
            dk_device_shutdown_within(null, 0, 10),
            dk_status::DK_ERR_NULL
        );
        assert_eq!(dk_device_handle_timeout(null, 0), dk_status::DK_ERR_NULL);
        assert_eq!(dk_device_storage_failed(null, 0), dk_status::DK_ERR_NULL);
        assert_eq!(dk_device_state(null), dk_state::DK_STATE_IDLE);
        let mut at = 0u64;
        assert!(!dk_device_next_timeout(null, &mut at));
        assert!(!dk_device_next_timeout(device, ptr::null_mut()));
        assert!(!dk_device_poll(device, ptr::null_mut()));
        let mut out = dk_output::NONE;
        assert!(!dk_device_poll(null, &mut out));
        assert_eq!(
            dk_device_receive_binary(null, 0, ptr::null(), 0),
            dk_status::DK_ERR_NULL
        );
        assert_eq!(
            dk_device_receive_binary(device, 0, ptr::null(), 3),
            dk_status::DK_ERR_NULL
        );
        let bytes = [0u8; 4];
        assert_eq!(
            dk_device_receive_binary(device, 0, bytes.as_ptr(), DK_MAX_INPUT + 1),
            dk_status::DK_ERR_TOO_LONG
        );
        assert_eq!(
            dk_device_receive_binary(device, 0, ptr::null(), 0),
            dk_status::DK_OK
        );
        assert_eq!(
            dk_device_receive_text(device, 0, c"\xff".as_ptr(), 1),
            dk_status::DK_ERR_UTF8
        );
        assert_eq!(
            dk_device_receive_close(device, 0, 1000, ptr::null(), 7),
            dk_status::DK_ERR_NULL
        );
        assert_eq!(
            dk_device_on(device, c"fly".as_ptr(), 3, Some(set_light), ptr::null_mut()),
            dk_status::DK_ERR_UNKNOWN_CAPABILITY
        );
        assert_eq!(
            dk_device_on(device, ptr::null(), 3, None, ptr::null_mut()),
            dk_status::DK_ERR_NULL
        );
        assert_eq!(
            dk_device_on(device, c"strobe".as_ptr(), 6, None, ptr::null_mut()),
            dk_status::DK_OK
        );
        assert_eq!(
            dk_device_answer(device, c"c1".as_ptr(), 2, false, c"no".as_ptr(), 2),
            dk_status::DK_ERR_NO_SUCH_CALL
        );
        assert_eq!(
            dk_device_answer(device, c"c1".as_ptr(), 2, true, ptr::null(), 1),
            dk_status::DK_ERR_NULL
        );
        assert_eq!(
            dk_device_emit(device, c"set_light".as_ptr(), 9, c"{}".as_ptr(), 2),
            dk_status::DK_ERR_NOT_CONNECTED
        );
        assert_eq!(
            dk_device_emit(device, c"fly".as_ptr(), 3, c"{}".as_ptr(), 2),
            dk_status::DK_ERR_UNKNOWN_CAPABILITY
        );
        assert_eq!(
            dk_device_emit(device, c"set_light".as_ptr(), 9, c"{".as_ptr(), 1),
            dk_status::DK_ERR_JSON
        );
        assert_eq!(
            dk_reply_ok(ptr::null_mut(), c"1".as_ptr(), 1),
            dk_status::DK_ERR_NULL
        );
        let mut reply = dk_reply::default();
        assert_eq!(
            dk_reply_ok(&mut reply, c"{".as_ptr(), 1),
            dk_status::DK_ERR_JSON
        );
        assert_eq!(
            dk_reply_error(&mut reply, c"\xff".as_ptr(), 1),
            dk_status::DK_ERR_UTF8
        );
        assert_eq!(
            CStr::from_ptr(dk_status_text(-9)).to_str().unwrap(),
            "no such call is running"
        );
        assert_eq!(
            CStr::from_ptr(dk_status_text(77)).to_str().unwrap(),
            "unknown status"
        );
        dk_device_free(device);
        dk_device_free(null);
    }
}

#[test]
fn the_platform_allocator_hands_out_the_platforms_memory() {
    let mut seed = 1u8;
    let good = platform(&mut seed);
    // SAFETY: a readable platform.
    assert_eq!(unsafe { dk_platform_init(&good) }, dk_status::DK_OK);
    let layout = Layout::from_size_align(96, 16).unwrap();
    // SAFETY: a layout of non-zero size; freed with it.
    unsafe {
        let block = PlatformAllocator.alloc(layout);
        assert!(!block.is_null());
        assert_eq!(block.align_offset(16), 0);
        PlatformAllocator.dealloc(block, layout);
    }
}

#[test]
fn devices_made_at_once_on_many_threads_all_get_the_platform() {
    // The first registration races the others: none may be refused
    // for seeing it half done.
    let threads: Vec<_> = (0..8u8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut seed = i;
                let platform = platform(&mut seed);
                // SAFETY: a readable platform.
                unsafe { dk_platform_init(&platform) }
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(thread.join().unwrap(), dk_status::DK_OK);
    }
}

/// A handler that frees its device (its ctx) and then replies.
unsafe extern "C" fn free_then_reply(
    ctx: *mut c_void,
    _call: *const dk_call,
    reply: *mut dk_reply,
) {
    unsafe {
        dk_device_free(ctx.cast());
        assert_eq!(dk_reply_ok(reply, c"1".as_ptr(), 1), dk_status::DK_OK);
        // A poll from inside a handler is refused.
        let mut out = dk_output::NONE;
        assert!(!dk_device_poll(ctx.cast(), &mut out));
    }
}

#[test]
fn a_device_freed_inside_its_handler_is_freed_once_the_handler_returns() {
    let mut seed = 3u8;
    let mut vessel = Vessel::new(42);
    let (device, _) = pair(&mut seed, &mut vessel);
    let status = unsafe {
        dk_device_on(
            device,
            c"read_light".as_ptr(),
            10,
            Some(free_then_reply),
            device.cast(),
        )
    };
    assert_eq!(status, dk_status::DK_OK);
    let records = vessel
        .seal(r#"{"type":"device:invoke","callId":"f1","capability":"read_light","input":{}}"#);
    for record in &records {
        unsafe { dk_device_receive_binary(device, 5, record.as_ptr(), record.len()) };
    }
    let mut out = dk_output::NONE;
    // The handler runs, frees the device, and the poll ends: the device is
    // gone and is not touched again.
    assert!(!unsafe { dk_device_poll(device, &mut out) });
    assert_eq!(out.kind, dk_output_kind::DK_OUTPUT_NONE);
}
