//! Draining a device: each output of the core handed out in order,
//! handlers run inside the poll, notices to the log callback.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString as _};
use core::ffi::c_void;

use dk_device_core::{End, Invocation, Message, Notice, Output, Retry, SetAside, printable};

use crate::abi::{dk_end, dk_output, dk_output_kind, dk_reply};

use super::{CallText, HandlerFn, Held, dk_device, live, with_nul};

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
        // SAFETY: live, and the borrow above ended.
        match unsafe { take(device, output) } {
            Step::Give(next) => {
                // SAFETY: live, as above.
                let Ok(d) = (unsafe { live(device) }) else {
                    return false;
                };
                // SAFETY: writable, the caller's promise.
                unsafe { out.write(d.held.pointed(next)) };
                return true;
            }
            Step::Next => {}
            Step::Stop => return false,
        }
    }
}

/// What one output of the core comes to.
enum Step {
    /// Hand this out.
    Give(dk_output),
    /// Nothing to hand out for it: on to the next.
    Next,
    /// The poll ends (the device was freed inside a callback).
    Stop,
}

/// Takes one output of the core: handed out as it is, logged, or a call
/// run inside the poll.
///
/// # Safety
///
/// `device` is live and not borrowed.
unsafe fn take(device: *mut dk_device, output: Output) -> Step {
    match output {
        Output::Pinned(key) => {
            let line = format!("the vessel's key is pinned: {}", key.fingerprint());
            // SAFETY: live and not borrowed, the caller's promise.
            unsafe { logged(device, line) }
        }
        // v1's tokens: this library speaks dk/2 only.
        Output::StoreToken(_) | Output::ForgetToken(_) => Step::Next,
        // SAFETY: live and not borrowed, the caller's promise.
        Output::Invoke(invocation) => unsafe { invoke(device, invocation) },
        // SAFETY: live and not borrowed, the caller's promise.
        Output::Notice(what) => unsafe { logged(device, notice_text(&what)) },
        handed => {
            // SAFETY: live and not borrowed, the caller's promise.
            let Ok(d) = (unsafe { live(device) }) else {
                return Step::Stop;
            };
            Step::Give(d.handed(handed))
        }
    }
}

/// A notice as a step: handed out, or told to the log callback.
///
/// # Safety
///
/// `device` is live and not borrowed.
unsafe fn logged(device: *mut dk_device, line: String) -> Step {
    let mut next = dk_output::NONE;
    // SAFETY: live and not borrowed, the caller's promise.
    match unsafe { notice(device, &mut next, line) } {
        Some(true) => Step::Give(next),
        Some(false) => Step::Next,
        None => Step::Stop,
    }
}

/// A call: refused when its id holds a NUL, run by its handler inside the
/// poll, or handed out as `DK_OUTPUT_INVOKE` when it has none.
///
/// # Safety
///
/// `device` is live and not borrowed.
unsafe fn invoke(device: *mut dk_device, invocation: Invocation) -> Step {
    // SAFETY: live and not borrowed, the caller's promise.
    let Ok(d) = (unsafe { live(device) }) else {
        return Step::Stop;
    };
    // C reads each text up to its NUL: a call whose id holds one would
    // reach the handler as another id.
    if invocation.call_id.contains('\0') {
        d.core.answer(&invocation.call_id, Err(NUL_IN_ID));
        let line = format!(
            "a call whose id holds a NUL byte was refused: {}",
            printable(&invocation.call_id)
        );
        // SAFETY: live, and the borrow above ends here.
        return unsafe { logged(device, line) };
    }
    let handler = d.handler_of(&invocation.capability);
    let call = match CallText::new(invocation) {
        Ok(call) => call,
        Err(id) => {
            d.core.answer(&id, Err("device is out of memory"));
            return Step::Next;
        }
    };
    let Some((run, ctx)) = handler else {
        let mut next = dk_output::NONE;
        next.kind = dk_output_kind::DK_OUTPUT_INVOKE;
        next.call = d.held.call.insert(call).abi();
        return Step::Give(next);
    };
    // SAFETY: `device` is live and not borrowed across the call.
    if unsafe { run_handler(device, &call, run, ctx) } {
        Step::Stop
    } else {
        Step::Next
    }
}

impl dk_device {
    /// The handler registered for `capability`, with its context.
    fn handler_of(&self, capability: &str) -> Option<(HandlerFn, *mut c_void)> {
        self.capabilities
            .iter()
            .position(|c| c == capability)
            .and_then(|at| self.handlers.get(at))
            .and_then(Option::as_ref)
            .map(|h| (h.run, h.ctx))
    }

    /// An output handed out as it is: a message to send, the connection
    /// open, a code to show, credentials to keep, the end. Its bytes are
    /// held until the next poll.
    fn handed(&mut self, output: Output) -> dk_output {
        let mut next = dk_output::NONE;
        match output {
            Output::Send(Message::Text(text)) => {
                next.kind = dk_output_kind::DK_OUTPUT_SEND_TEXT;
                self.held.data = with_nul(&text);
            }
            Output::Send(Message::Binary(message)) => {
                next.kind = dk_output_kind::DK_OUTPUT_SEND_BINARY;
                self.held.data = message;
            }
            Output::Send(Message::Close(frame)) => {
                next.kind = dk_output_kind::DK_OUTPUT_SEND_CLOSE;
                if let Some(frame) = frame {
                    next.close_code = frame.code;
                    self.held.data = with_nul(&frame.reason);
                }
            }
            Output::Connected => next.kind = dk_output_kind::DK_OUTPUT_CONNECTED,
            Output::ShowCode(code) => {
                next.kind = dk_output_kind::DK_OUTPUT_SHOW_CODE;
                self.held.data = with_nul(&code);
            }
            Output::Store(credentials) => {
                next.kind = dk_output_kind::DK_OUTPUT_STORE;
                let kept = self.held.secret.insert(Box::new(credentials.to_bytes()));
                next.data = kept.as_ptr();
                next.len = kept.len();
            }
            Output::Ended(end) => {
                next.kind = dk_output_kind::DK_OUTPUT_ENDED;
                let (end, mut why) = end_text(&end);
                if core::mem::take(&mut self.out_of_memory) && end == dk_end::DK_END_RETRY {
                    why = "the device ran out of memory: connect again after a backoff".to_string();
                }
                next.end = end;
                self.held.data = with_nul(&why);
            }
            // Taken before: logged, skipped or run (see `take`).
            Output::Pinned(_)
            | Output::StoreToken(_)
            | Output::ForgetToken(_)
            | Output::Invoke(_)
            | Output::Notice(_) => {}
        }
        next
    }
}

impl Held {
    /// `next` pointing at the text or bytes held for it, when it does not
    /// point elsewhere already (a text's length without its NUL).
    fn pointed(&self, mut next: dk_output) -> dk_output {
        if next.data.is_null() && !self.data.is_empty() {
            next.data = self.data.as_ptr();
            next.len = self.data.len();
            if next.kind != dk_output_kind::DK_OUTPUT_SEND_BINARY {
                next.len = next.len.saturating_sub(1);
            }
        }
        next
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
