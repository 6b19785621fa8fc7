//! The exceptions Python sees: `DeviceError` and one subclass for each
//! thing a maker does something different about, and the client's
//! `ClientError` sorted into them. The texts are dk-device's.

use dk_device::ClientError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    dk_device,
    DeviceError,
    PyException,
    "Anything dk_device refuses or stops on; the subclasses say what."
);
create_exception!(
    dk_device,
    ManifestError,
    DeviceError,
    "The manifest cannot be read or is not valid, or the handlers do not match its capabilities."
);
create_exception!(
    dk_device,
    PairingError,
    DeviceError,
    "The pairing did not happen: the person said no or did not answer, the vessel refused the manifest, or the pairing exchange broke its rules (a relay may be in the middle)."
);
create_exception!(
    dk_device,
    CredentialError,
    DeviceError,
    "The device's key no longer pairs it (refused, unpaired, the manifest changed since the person approved it, the vessel's key changed), or the key file cannot be used: the person must act."
);
create_exception!(
    dk_device,
    ConnectError,
    DeviceError,
    "The vessel cannot be reached in a way retrying fixes: a bad URL, no dk/2, a refusal before pairing, TLS roots that cannot be used."
);
create_exception!(
    dk_device,
    EventError,
    DeviceError,
    "An event was not queued: no such event or capability, data that does not keep the event's params or is not JSON, or a full queue."
);

/// Adds the exceptions to the module.
pub(crate) fn add_to(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("DeviceError", py.get_type::<DeviceError>())?;
    module.add("ManifestError", py.get_type::<ManifestError>())?;
    module.add("PairingError", py.get_type::<PairingError>())?;
    module.add("CredentialError", py.get_type::<CredentialError>())?;
    module.add("ConnectError", py.get_type::<ConnectError>())?;
    module.add("EventError", py.get_type::<EventError>())?;
    Ok(())
}

/// The exception for why the client stopped, with its text.
pub(crate) fn client_error(error: &ClientError) -> PyErr {
    let text = error.to_string();
    match error {
        ClientError::PairingRefused(_)
        | ClientError::PairingBroken(_)
        | ClientError::AdmissionRefused(_) => PairingError::new_err(text),
        ClientError::AuthFailed
        | ClientError::Unpaired
        | ClientError::ManifestChanged
        | ClientError::VesselKeyChanged { .. }
        | ClientError::KeyFile { .. }
        | ClientError::TokenFile { .. } => CredentialError::new_err(text),
        ClientError::InvalidUrl { .. }
        | ClientError::Connect(_)
        | ClientError::Busy { .. }
        | ClientError::Refused(_)
        | ClientError::NotDk2
        | ClientError::GaveUp { .. }
        | ClientError::TlsRoot(_)
        | ClientError::Protocol(_) => ConnectError::new_err(text),
        _ => DeviceError::new_err(text),
    }
}
