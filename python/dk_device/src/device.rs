//! `NativeDevice`: a dk-device `Device` from a manifest, every capability's
//! handler being the Python dispatcher of the run; the capabilities Python
//! gave handlers for (checked as dk-device checks them, with its texts);
//! the event queue; and one run at a time, with its [`Stopper`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use dk_device::{
    ClientOptions, ConnectionEvent, DefineError, Device, EmitError, EventReceiver, EventSender,
    Home, ServeOptions,
};
use pyo3::prelude::*;
use serde_json::Value;

use crate::call::{Dispatcher, Handling, call};
use crate::errors::{ConnectError, CredentialError, DeviceError, EventError, ManifestError};
use crate::run::{Stopper, run};

/// How many events wait for the vessel by default (while disconnected,
/// or faster than the connection takes them).
const DEFAULT_EVENT_QUEUE: usize = 64;

/// A device defined from its manifest, for the `dk_device.Device` class.
#[pyclass(module = "dk_device._native", frozen)]
pub(crate) struct NativeDevice {
    device: Device,
    dispatcher: Dispatcher,
    /// The capabilities given a handler.
    handled: Mutex<BTreeSet<String>>,
    /// Those whose handler may block.
    blocking: Arc<Mutex<BTreeSet<String>>>,
    events: Mutex<Events>,
    /// The run in progress.
    running: Mutex<Option<Stopper>>,
}

/// The event queue: the sender `emit` uses, and the receiver the next run
/// takes (a run's end closes its queue, so a new one is made).
struct Events {
    sender: EventSender,
    receiver: Option<EventReceiver>,
    capacity: usize,
}

/// A lock that a panic elsewhere did not spoil: the data is kept whole by
/// every holder.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[pymethods]
impl NativeDevice {
    /// A device from its manifest's JSON text, with room for `event_queue`
    /// events waiting for the vessel.
    #[new]
    #[pyo3(signature = (manifest, event_queue = DEFAULT_EVENT_QUEUE))]
    fn new(manifest: &str, event_queue: usize) -> PyResult<Self> {
        let manifest = dk_proto::validate_manifest_json(manifest)
            .map_err(|e| ManifestError::new_err(DefineError::InvalidManifest(e).to_string()))?;
        let dispatcher = Dispatcher::default();
        let blocking: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let names: Vec<String> = manifest
            .capabilities()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        let device = names
            .into_iter()
            .fold(Device::define_validated(manifest), |device, name| {
                let dispatcher = Arc::clone(&dispatcher);
                let blocking = Arc::clone(&blocking);
                let capability = name.clone();
                device.handler(&name, move |input| {
                    let how = if lock(&blocking).contains(&capability) {
                        Handling::Blocking
                    } else {
                        Handling::Inline
                    };
                    call(Arc::clone(&dispatcher), capability.clone(), input, how)
                })
            })
            .build()
            .map_err(|e| ManifestError::new_err(e.to_string()))?;
        let (sender, receiver) = device.events(event_queue);
        Ok(NativeDevice {
            device,
            dispatcher,
            handled: Mutex::new(BTreeSet::new()),
            blocking,
            events: Mutex::new(Events {
                sender,
                receiver: Some(receiver),
                capacity: event_queue,
            }),
            running: Mutex::new(None),
        })
    }

    /// The manifest's id.
    #[getter]
    fn id(&self) -> &str {
        self.device.manifest().id()
    }

    /// The manifest's name.
    #[getter]
    fn name(&self) -> &str {
        self.device.manifest().name()
    }

    /// The capabilities' names, in the manifest's order.
    #[getter]
    fn capabilities(&self) -> Vec<String> {
        let manifest = self.device.manifest();
        manifest
            .capabilities()
            .iter()
            .map(|c| c.name().to_owned())
            .collect()
    }

    /// The declared events' names, in the manifest's order.
    #[getter]
    fn events(&self) -> Vec<String> {
        let manifest = self.device.manifest();
        manifest
            .events()
            .iter()
            .map(|e| e.name().to_owned())
            .collect()
    }

    /// Notes that capability `name` has a handler, one that may block when
    /// `blocking`: `ManifestError` when the manifest has no such capability
    /// or it has one already.
    #[pyo3(signature = (name, blocking = false))]
    fn handle(&self, name: &str, blocking: bool) -> PyResult<()> {
        if self.device.manifest().capability(name).is_none() {
            return Err(ManifestError::new_err(
                DefineError::UnknownHandler(name.to_owned()).to_string(),
            ));
        }
        if !lock(&self.handled).insert(name.to_owned()) {
            return Err(ManifestError::new_err(
                DefineError::DuplicateHandler(name.to_owned()).to_string(),
            ));
        }
        if blocking {
            lock(&self.blocking).insert(name.to_owned());
        }
        Ok(())
    }

    /// Queues event `name` with `data` (JSON text) for the vessel without
    /// waiting: `EventError` when the manifest declares no such event (nor
    /// a capability of its name), the data does not keep the event's
    /// params, or the queue is full.
    fn emit(&self, name: &str, data: &str) -> PyResult<()> {
        let data: Value = serde_json::from_str(data)
            .map_err(|e| EventError::new_err(EmitError::NotJson(e.to_string()).to_string()))?;
        let sender = lock(&self.events).sender.clone();
        sender
            .try_emit(name, data)
            .map_err(|e| EventError::new_err(e.to_string()))
    }

    /// Where the device keeps its key unless told otherwise:
    /// `devices/<id>.key` in dk's home.
    #[getter]
    fn default_key_file(&self) -> PyResult<PathBuf> {
        let home = Home::locate().map_err(|e| {
            CredentialError::new_err(format!("{e}; or name the key file with key_file="))
        })?;
        Ok(home.device_file(self.device.manifest().id(), "key"))
    }

    /// Runs the device against the vessel at `url` until `stopper` stops
    /// it (Ok), the client stops on an error (its exception), or a signal
    /// handler raises (its exception, once the device stopped).
    #[pyo3(signature = (url, dispatch, stopper, on_code, on_connection, key_file = None, tls_root = None))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the keyword arguments of Device.run, passed through from Python"
    )]
    fn run(
        &self,
        py: Python<'_>,
        url: String,
        dispatch: Py<PyAny>,
        stopper: PyRef<'_, Stopper>,
        on_code: Py<PyAny>,
        on_connection: Py<PyAny>,
        key_file: Option<PathBuf>,
        tls_root: Option<PathBuf>,
    ) -> PyResult<()> {
        let stopper: Stopper = stopper.clone();
        // Every capability has a handler: dk-device's rule, in manifest order.
        {
            let handled = lock(&self.handled);
            if let Some(missing) = self
                .device
                .manifest()
                .capabilities()
                .iter()
                .find(|c| !handled.contains(c.name()))
            {
                return Err(ManifestError::new_err(
                    DefineError::MissingHandler(missing.name().to_owned()).to_string(),
                ));
            }
        }
        let key_file = match key_file {
            Some(path) => path,
            None => self.default_key_file()?,
        };
        let tls_root = match tls_root {
            Some(path) => Some(std::fs::read(&path).map_err(|e| {
                ConnectError::new_err(format!(
                    "cannot read the TLS roots `{}`: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        {
            let mut running = lock(&self.running);
            if running.is_some() {
                return Err(DeviceError::new_err(
                    "the device is running already: one run at a time",
                ));
            }
            *running = Some(stopper.clone());
        }
        let receiver = {
            let mut events = lock(&self.events);
            match events.receiver.take() {
                Some(receiver) => receiver,
                None => {
                    let (sender, receiver) = self.device.events(events.capacity);
                    events.sender = sender;
                    receiver
                }
            }
        };
        let mut options = ClientOptions::new(url)
            .key_file(key_file)
            .on_code(move |code| call_back(&on_code, (code.to_owned(),)))
            .on_connection(move |event| match event {
                ConnectionEvent::Connected => {
                    call_back(&on_connection, (true, None::<String>, None::<f64>));
                }
                ConnectionEvent::Disconnected { why, retry_in } => call_back(
                    &on_connection,
                    (false, Some(why.clone()), Some(retry_in.as_secs_f64())),
                ),
                _ => {}
            })
            .serve(ServeOptions::new().events(receiver));
        if let Some(pem) = tls_root {
            options = options.tls_root(pem);
        }
        *lock(&self.dispatcher) = Some(dispatch);
        let outcome = run(py, self.device.clone(), options, &stopper);
        // The run's queue closed with it: events emitted from now on wait
        // in a new one for the next run.
        {
            let mut events = lock(&self.events);
            let (sender, receiver) = self.device.events(events.capacity);
            events.sender = sender;
            events.receiver = Some(receiver);
        }
        let dispatch = lock(&self.dispatcher).take();
        drop(dispatch);
        *lock(&self.running) = None;
        outcome
    }

    /// Stops the run in progress, if any (from any thread).
    fn stop(&self) {
        if let Some(stopper) = lock(&self.running).as_ref() {
            stopper.stop();
        }
    }

    /// Whether the device runs.
    #[getter]
    fn running(&self) -> bool {
        lock(&self.running).is_some()
    }
}

/// Calls a Python callback from the client's thread; what it raises is
/// reported as Python reports an exception nobody can catch.
fn call_back<A>(callback: &Py<PyAny>, args: A)
where
    A: for<'py> pyo3::call::PyCallArgs<'py>,
{
    Python::attach(|py| {
        if let Err(error) = callback.call1(py, args) {
            error.write_unraisable(py, Some(callback.bind(py)));
        }
    });
}
