//! [`Cause`]: the error underneath one of the store's errors (the
//! database's, the file system's), kept whole rather than as its text, and
//! opaque so that no dependency's type appears in the store's signatures.

use std::error::Error;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// What went wrong underneath a [`StoreError`](crate::StoreError) or an
/// [`AuditKeyError`](crate::AuditKeyError): the database's or the file
/// system's own error, or only a text where there is no such error.
///
/// The error that holds a `Cause` gives the error underneath as its
/// [`source`](Error::source), so it can be downcast (to a
/// [`std::io::Error`], say) and a walk down the sources goes on from it.
/// The cause itself reads as that error does, dereferences to it (and so to
/// its own `source`), is cheap to clone (it is shared), and equals another
/// cause that reads the same.
///
/// A `Cause` is deliberately not an [`Error`] of its own: an error holding
/// it as `#[source]` then hands out the error underneath, not this wrapper,
/// which a downcast or a walk down the sources would have to know about.
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync + 'static>);

impl Cause {
    /// The cause `error`, kept whole.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Cause {
        Cause(Arc::new(error))
    }

    /// A cause that is only a text, where no error is underneath (a
    /// setting the database did not take, a test's failing store).
    pub fn msg(text: impl Into<String>) -> Cause {
        Cause::new(Message(text.into()))
    }
}

impl Deref for Cause {
    type Target = dyn Error + Send + Sync + 'static;

    /// The error underneath.
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Display for Cause {
    /// As the error underneath reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Cause").field(&self.0).finish()
    }
}

impl PartialEq for Cause {
    /// Two causes are equal when they read the same: errors underneath are
    /// seldom comparable, and what a caller can act on is what they say.
    fn eq(&self, other: &Cause) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

/// The error underneath a [`Cause::msg`]: only a text.
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Message {}

#[cfg(test)]
mod tests {
    use std::io;

    use super::Cause;

    /// An error with a source of its own, to see that it is reached.
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] io::Error);

    #[test]
    fn a_cause_reads_as_its_error_and_leads_to_its_source() {
        let cause = Cause::new(Outer(io::Error::other("inner")));
        assert_eq!(cause.to_string(), "outer");
        let source = cause.source().map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("inner"));
        assert!(cause.downcast_ref::<Outer>().is_some());
    }

    #[test]
    fn causes_are_equal_when_they_read_the_same() {
        assert_eq!(Cause::msg("disk full"), Cause::msg("disk full"));
        assert_eq!(
            Cause::msg("disk full"),
            Cause::new(io::Error::other("disk full"))
        );
        assert_ne!(Cause::msg("disk full"), Cause::msg("disk on fire"));
        assert!(Cause::msg("disk full").source().is_none());
    }
}
