//! dk's device SDK for Python: the `dk_device._native` module, which the
//! `dk_device` package (`python/dk_device/__init__.py`) wraps in its
//! `Device` class. It is dk-device's client run on a tokio runtime of its
//! own, with the GIL released while it waits: pairing by the code the
//! person compares, the key kept in a key file (in dk's home unless named),
//! reconnecting with the core's jittered backoff, calls handed to Python
//! and answered, events queued for the vessel.
//!
//! Every rule is dk-device's or its core's: a call out of the manifest's
//! declared bounds is refused before Python hears of it, a declared event
//! whose data does not keep its params is refused to the sender, which
//! refusals a paired device believes and how long it waits to reconnect
//! are decided there. This crate only carries calls, events, errors and
//! time across to Python. No input from a vessel or from Python can make
//! it panic; what Python gets wrong is a typed exception
//! (`dk_device.DeviceError` and its subclasses).

#![forbid(unsafe_code)]

mod call;
mod device;
mod errors;
mod run;

use pyo3::prelude::*;

/// The module `dk_device._native`.
#[pymodule]
#[pyo3(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<device::NativeDevice>()?;
    module.add_class::<call::Reply>()?;
    module.add_class::<run::Stopper>()?;
    errors::add_to(module)
}
