//! [`Hook`]: something one part of the vessel installs in another after
//! both exist (a fleet member's hooks, the audit's), replaced at will.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

/// An `Arc<T>` set later, or never. Read by cloning the `Arc` out, so a
/// hook is called without the lock held (it may set hooks itself).
pub(crate) struct Hook<T: ?Sized>(RwLock<Option<Arc<T>>>);

impl<T: ?Sized> Hook<T> {
    /// Installs `value`, replacing any earlier one.
    pub(crate) fn set(&self, value: Arc<T>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(value);
    }

    /// What is installed now, if anything.
    pub(crate) fn get(&self) -> Option<Arc<T>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<T: ?Sized> Default for Hook<T> {
    fn default() -> Self {
        Hook(RwLock::new(None))
    }
}

impl<T: ?Sized> fmt::Debug for Hook<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.get().is_some();
        f.write_str(if set { "Hook(set)" } else { "Hook(unset)" })
    }
}
