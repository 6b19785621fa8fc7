//! Running the client: a tokio runtime of its own (one worker thread, the
//! connection's, on which handlers are called; another takes it over
//! while a blocking handler runs), waited on with the GIL released
//! and woken every [`SIGNAL_CHECK`] to let Python run its signal handlers,
//! so Ctrl-C stops the device as [`Stopper::stop`] does (the connection
//! closed after the calls in flight get their grace) and then raises
//! `KeyboardInterrupt`.

use std::future::Future;
use std::time::Duration;

use dk_device::{ClientError, ClientOptions, Device, run_client};
use pyo3::prelude::*;
use tokio::sync::watch;

use crate::errors::{DeviceError, client_error};

/// How often the waiting thread takes the GIL back to run signal handlers.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// How long a stopped runtime waits for handlers still running before it
/// leaves them to finish on their own threads.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Stops one run of a device, before it starts or while it runs, from any
/// thread: a handler, a signal handler, an asyncio task.
#[pyclass(module = "dk_device._native", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct Stopper {
    stop: watch::Sender<bool>,
}

#[pymethods]
impl Stopper {
    /// A stopper for a run not started yet.
    #[new]
    fn new() -> Self {
        Stopper {
            stop: watch::Sender::new(false),
        }
    }

    /// Stops the run: its connection is closed once the calls in flight
    /// have had their grace, and the run returns.
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Whether [`Stopper::stop`] was called.
    #[getter]
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

impl Stopper {
    /// Resolves once [`Stopper::stop`] is called.
    fn stopped_future(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopped = self.stop.subscribe();
        async move {
            // The sender lives as long as the run: an error cannot come first.
            let _ = stopped.wait_for(|s| *s).await;
        }
    }
}

/// Runs `device` with `options` until `stopper` stops it or the client
/// stops on an error, with the GIL released but every [`SIGNAL_CHECK`].
pub(crate) fn run(
    py: Python<'_>,
    device: Device,
    options: ClientOptions,
    stopper: &Stopper,
) -> PyResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("dk-device")
        .enable_all()
        .build()
        .map_err(|e| DeviceError::new_err(format!("cannot start a runtime: {e}")))?;
    let stopped = stopper.stopped_future();
    let mut client = runtime.spawn(async move { run_client(&device, options, stopped).await });
    let outcome = loop {
        let done = py.detach(|| {
            runtime.block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut client).await.ok() })
        });
        match done {
            Some(Ok(result)) => break result.map_err(|e| client_error(&e)),
            Some(Err(_)) => break Err(DeviceError::new_err("the device client stopped")),
            None => {}
        }
        if let Err(interrupted) = py.check_signals() {
            // Ctrl-C, or another signal handler's exception: stop as
            // `stop()` does, then let it through.
            stopper.stop();
            let _: Result<Result<(), ClientError>, _> = py.detach(|| runtime.block_on(&mut client));
            break Err(interrupted);
        }
    };
    // A handler still running wants the GIL back to finish: the runtime is
    // shut down without it.
    py.detach(move || runtime.shutdown_timeout(SHUTDOWN_WAIT));
    outcome
}
