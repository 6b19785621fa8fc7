//! TLS for `wss://` URLs, for a vessel behind a TLS proxy: rustls with the
//! ring provider, trusting the platform's roots or, when given, only the
//! certificates of a pinned PEM (a private CA or the proxy's own
//! self-signed certificate). dk/2 still runs inside: TLS adds the proxy's
//! identity, it does not replace the vessel's.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::{ClientConfig, RootCertStore};
use tokio_tungstenite::Connector;

use super::error::ClientError;

/// The connector for `wss://`: the pinned roots in `pem` when given, else
/// the platform's.
pub(super) fn connector(pem: Option<&[u8]>) -> Result<Connector, ClientError> {
    let refused = |why: String| ClientError::TlsRoot(why);
    let mut roots = RootCertStore::empty();
    match pem {
        Some(pem) => {
            let mut added = 0usize;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| refused(format!("not a PEM certificate: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| refused(format!("a certificate rustls cannot use: {e}")))?;
                added += 1;
            }
            if added == 0 {
                return Err(refused("the PEM holds no certificate".to_owned()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A platform certificate rustls cannot parse is skipped, as
                // browsers do.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(refused(
                    "the platform has no root certificates; give the server's with tls_root"
                        .to_owned(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Connector::Rustls(Arc::new(config)))
}
