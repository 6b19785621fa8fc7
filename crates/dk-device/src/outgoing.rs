//! What dk-device sends, checked before it goes: a frame the vessel would
//! refuse counts there as malformed and, repeated, closes the connection,
//! so none is ever sent.

use dk_proto::{DeviceFrame, FrameError};

/// Why the vessel would refuse `frame`, read by dk-proto's own parser with
/// the vessel's default limits (size, nesting depth).
pub(crate) fn refused_by_vessel(frame: &str) -> Option<FrameError> {
    DeviceFrame::parse(frame.as_bytes()).err()
}
