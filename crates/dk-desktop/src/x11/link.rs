//! [`XError`], why an X request failed, and what every part does with the
//! bare connection: drop what the server sent unasked, and wait until it
//! has done every request sent.

use x11rb::connection::Connection as _;
use x11rb::errors::{ConnectionError, ReplyError};
use x11rb::rust_connection::RustConnection;

/// Why an X request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XError {
    /// The connection is gone (the server exited, the socket closed).
    Gone(String),
    /// The server answered with an error, or something it sent cannot be
    /// used; the connection is fine.
    Failed(String),
}

impl From<ConnectionError> for XError {
    fn from(e: ConnectionError) -> Self {
        XError::Gone(e.to_string())
    }
}

impl From<ReplyError> for XError {
    fn from(e: ReplyError) -> Self {
        match e {
            ReplyError::ConnectionError(e) => XError::Gone(e.to_string()),
            ReplyError::X11Error(e) => XError::Failed(format!(
                "the X server refused a request: {:?}",
                e.error_kind
            )),
        }
    }
}

/// Reads and drops what the server sent unasked (errors of requests
/// without replies, MappingNotify); fails when the connection is gone.
pub(super) fn drain(conn: &RustConnection) -> Result<(), XError> {
    while conn.poll_for_event()?.is_some() {}
    Ok(())
}

/// Waits until the server has done every request sent.
pub(super) fn finish(conn: &RustConnection) -> Result<(), XError> {
    use x11rb::wrapper::ConnectionExt as _;
    conn.sync()?;
    drain(conn)
}
