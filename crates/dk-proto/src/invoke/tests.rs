//! Tests of the call errors: each reads as 8DK words it.

use super::*;

#[track_caller]
fn check(error: InvokeError, text: &str, from_device: bool) {
    assert_eq!(error.to_string(), text);
    assert_eq!(error.is_device_error(), from_device, "{error:?}");
}

#[test]
fn invoke_errors_read_as_before() {
    check(
        InvokeError::Device("bulb broken".into()),
        "bulb broken",
        true,
    );
    let none = InvokeError::Device(InvokeError::NO_DEVICE_TEXT.into());
    check(none, "device error", true);
    let ms = Duration::from_millis(250);
    check(
        InvokeError::Timeout(ms),
        "device did not answer within 250ms",
        false,
    );
    let backed_up = InvokeError::Send(SendError::BackedUp);
    check(backed_up, "send failed: connection is backed up", false);
    let closed = InvokeError::Send(SendError::Closed);
    check(closed, "send failed: connection closed", false);
    let late = InvokeError::SendTimeout(Duration::from_secs(2));
    check(late, "send failed: not sent within 2000ms", false);
    let many = InvokeError::TooManyInFlight(64);
    check(many, "too many calls in flight (at most 64)", false);
    let gone = InvokeError::Closed(LinkClosed::Disconnected);
    check(gone, "device disconnected", false);
    let replaced = InvokeError::Closed(LinkClosed::Replaced);
    check(replaced, "replaced by a newer connection", false);
    let dropped = InvokeError::Closed(LinkClosed::Dropped);
    check(dropped, "connection closed", false);
    // A device may say anything, even what the vessel says: the variant
    // still tells them apart.
    let mimic = InvokeError::Device("device disconnected".into());
    check(mimic, "device disconnected", true);
}
