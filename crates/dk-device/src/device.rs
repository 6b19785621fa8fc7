//! A device: a validated manifest and exactly one handler per capability.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use dk_proto::{Manifest, ManifestError, validate_manifest};
use futures::FutureExt as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// What a handler's future resolves to, once erased.
type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, HandlerError>> + Send>>;
/// A handler, erased so every capability's handler has the same type.
type Handler = Arc<dyn Fn(Map<String, Value>) -> HandlerFuture + Send + Sync>;

/// Why a handler failed. The message is sent to the vessel as the call's
/// error (`{ok:false, error:<message>}`), so it should be short and say what
/// went wrong in the device's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(String);

impl HandlerError {
    /// A handler error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        HandlerError(message.into())
    }

    /// The message sent to the vessel.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> Self {
        HandlerError(message.to_owned())
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> Self {
        HandlerError(message)
    }
}

/// Why a call to a device gave no result. `Display` is the error text the
/// vessel is sent (`{ok:false, error:<text>}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The device declares no such capability (8DK's text).
    #[error("unknown capability \"{0}\"")]
    UnknownCapability(String),
    /// The capability's handler failed; its message.
    #[error(transparent)]
    Failed(#[from] HandlerError),
    /// The capability's handler panicked.
    #[error("handler for \"{0}\" panicked")]
    Panicked(String),
    /// The capability's handler was stopped before it answered.
    #[error("handler for \"{0}\" was stopped")]
    Stopped(String),
    /// A call id the device already received (a replay): not run again.
    #[error("call \"{0}\" was already received: not run again")]
    AlreadyReceived(String),
    /// The device already runs its most calls at once.
    #[error("device is busy: {0} calls in flight")]
    Busy(usize),
    /// The handler's result cannot be written as JSON.
    #[error("result of \"{capability}\" is not JSON: {why}")]
    NotJson {
        /// The capability called.
        capability: String,
        /// What the JSON writer said.
        why: String,
    },
    /// The result or error frame would be refused by the vessel (too
    /// large, nested too deep), so this is sent in its place.
    #[error("the {what} of \"{capability}\" cannot be sent: {why}")]
    CannotBeSent {
        /// `result` or `error`.
        what: &'static str,
        /// The capability called.
        capability: String,
        /// Why the vessel would refuse the frame.
        why: String,
    },
}

/// Why a device could not be defined. `Display` gives 8DK's `defineDevice`
/// messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefineError {
    /// The manifest breaks a v1 rule.
    #[error("invalid manifest: {0}")]
    InvalidManifest(#[source] ManifestError),
    /// A capability of the manifest has no handler (the first one, in
    /// manifest order).
    #[error("no handler for capability \"{0}\"")]
    MissingHandler(String),
    /// A handler names no capability of the manifest (the first one, in the
    /// order handlers were given).
    #[error("handler given for no capability named \"{0}\"")]
    UnknownHandler(String),
    /// Two handlers were given for one capability.
    #[error("handler given twice for capability \"{0}\"")]
    DuplicateHandler(String),
}

/// A device: a validated manifest and exactly one handler per capability.
///
/// Cheap to clone: clones share the manifest and the handlers.
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

struct Inner {
    manifest: Manifest,
    handlers: HashMap<String, Handler>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.inner.manifest.id())
            .field(
                "capabilities",
                &self
                    .inner
                    .manifest
                    .capabilities()
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Device {
    /// Starts defining a device from an untrusted manifest; it is validated
    /// by [`DeviceBuilder::build`].
    pub fn define(manifest: &Value) -> DeviceBuilder {
        DeviceBuilder {
            manifest: validate_manifest(manifest),
            handlers: Vec::new(),
        }
    }

    /// Starts defining a device from a manifest already validated.
    pub fn define_validated(manifest: Manifest) -> DeviceBuilder {
        DeviceBuilder {
            manifest: Ok(manifest),
            handlers: Vec::new(),
        }
    }

    /// The device's validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// Runs the handler of `capability` with `input` and returns its result,
    /// or why there is none: the handler's error, an unknown capability
    /// (`unknown capability "<name>"`, 8DK's text), or a handler that
    /// panicked (`handler for "<name>" panicked`).
    pub async fn invoke(
        &self,
        capability: &str,
        input: Map<String, Value>,
    ) -> Result<Value, CallError> {
        self.call(capability, input).await
    }

    /// [`Device::invoke`] as a future that owns everything it needs, so it
    /// can be spawned.
    pub(crate) fn call(
        &self,
        capability: &str,
        input: Map<String, Value>,
    ) -> impl Future<Output = Result<Value, CallError>> + Send + 'static {
        let handler = self.inner.handlers.get(capability).cloned();
        let capability = capability.to_owned();
        async move {
            let Some(handler) = handler else {
                return Err(CallError::UnknownCapability(capability));
            };
            // The handler is called inside the guarded future, so a panic
            // before its first await is caught too.
            match AssertUnwindSafe(async move { handler(input).await })
                .catch_unwind()
                .await
            {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(error)) => Err(CallError::Failed(error)),
                Err(_) => Err(CallError::Panicked(capability)),
            }
        }
    }

    /// True when the manifest declares `capability`.
    pub(crate) fn has_capability(&self, capability: &str) -> bool {
        self.inner.handlers.contains_key(capability)
    }
}

/// Defines a [`Device`]: give one handler per capability, then
/// [`build`](DeviceBuilder::build).
///
/// ```
/// use dk_device::{Device, HandlerError};
/// use serde_json::{Value, json};
///
/// let device = Device::define(&json!({
///     "id": "door-bell", "name": "Door bell", "kind": "bell", "version": "1.0.0",
///     "capabilities": [{"name": "ring", "kind": "actuator", "description": "Ring the bell."}]
/// }))
/// .handler("ring", |_input| async move { Ok::<Value, HandlerError>(json!({"rang": true})) })
/// .build()
/// .map_err(|e| e.to_string())?;
/// assert_eq!(device.manifest().id(), "door-bell");
/// # Ok::<(), String>(())
/// ```
pub struct DeviceBuilder {
    manifest: Result<Manifest, ManifestError>,
    handlers: Vec<(String, Handler)>,
}

impl fmt::Debug for DeviceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuilder")
            .field("manifest", &self.manifest.as_ref().map(Manifest::id))
            .field(
                "handlers",
                &self.handlers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl DeviceBuilder {
    /// Gives the handler of capability `name`: an async function from the
    /// call's input object to a JSON result or a [`HandlerError`].
    pub fn handler<F, Fut>(mut self, name: &str, handler: F) -> Self
    where
        F: Fn(Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |input| Box::pin(handler(input)));
        self.handlers.push((name.to_owned(), handler));
        self
    }

    /// Gives the handler of capability `name` as an async function of typed
    /// input and output. Input that does not deserialise into `I` answers
    /// `invalid input for "<name>": <why>`; a result that does not serialise
    /// to JSON answers `result of "<name>" is not JSON: <why>`.
    pub fn typed_handler<I, O, F, Fut>(self, name: &str, handler: F) -> Self
    where
        I: DeserializeOwned,
        O: Serialize,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let capability: Arc<str> = Arc::from(name);
        self.handler(name, move |input| {
            let handler = Arc::clone(&handler);
            let capability = Arc::clone(&capability);
            async move {
                let input = serde_json::from_value::<I>(Value::Object(input)).map_err(|e| {
                    HandlerError(format!("invalid input for \"{capability}\": {e}"))
                })?;
                let output = handler(input).await?;
                serde_json::to_value(output).map_err(|e| {
                    HandlerError(format!("result of \"{capability}\" is not JSON: {e}"))
                })
            }
        })
    }

    /// Checks the manifest and the handlers, in 8DK's order: the manifest;
    /// then every capability has a handler (manifest order); then every
    /// handler names a capability (the order given); then no capability was
    /// given two handlers.
    pub fn build(self) -> Result<Device, DefineError> {
        let manifest = self.manifest.map_err(DefineError::InvalidManifest)?;
        if let Some(missing) = manifest
            .capabilities()
            .iter()
            .find(|c| !self.handlers.iter().any(|(name, _)| name == c.name()))
        {
            return Err(DefineError::MissingHandler(missing.name().to_owned()));
        }
        if let Some((unknown, _)) = self
            .handlers
            .iter()
            .find(|(name, _)| manifest.capability(name).is_none())
        {
            return Err(DefineError::UnknownHandler(unknown.clone()));
        }
        let mut handlers = HashMap::with_capacity(self.handlers.len());
        for (name, handler) in self.handlers {
            if handlers.contains_key(&name) {
                return Err(DefineError::DuplicateHandler(name));
            }
            handlers.insert(name, handler);
        }
        Ok(Device {
            inner: Arc::new(Inner { manifest, handlers }),
        })
    }
}

#[cfg(test)]
mod tests;
