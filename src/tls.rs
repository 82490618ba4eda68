//! The rustls client configuration every TLS client of hotsplit builds: the Redis connections
//! (`store::redis`, through fred) and `hotsplit probe` against an `https://` listener.
//!
//! The trust anchors are the certificates of a CA file, or the system's roots when none is
//! named; a client certificate and key are presented when both are given (mutual TLS). The
//! ring provider is the one fred and the listeners use. Certificate and name verification are
//! never turned off: there is no setting for it.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{Error, ErrorKind, Result};

/// A client certificate chain and its key, as PEM files (mutual TLS).
#[derive(Debug, Clone, Copy)]
pub struct ClientCert<'a> {
    /// The PEM certificate chain, leaf first.
    pub cert_file: &'a Path,
    /// The PEM private key of `cert_file`.
    pub key_file: &'a Path,
}

/// A rustls client configuration that trusts the certificates in `ca_file` (or the system's
/// roots when `None`) and presents `client_cert` when given.
///
/// # Errors
/// [`ErrorKind::Config`] when a file cannot be read or holds no usable certificate or key, or
/// when no CA file is named and the system has no usable root; the message names the file.
pub fn client_config(
    ca_file: Option<&Path>,
    client_cert: Option<ClientCert<'_>>,
) -> Result<ClientConfig> {
    let roots = match ca_file {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(path, "tls ca file")? {
                roots.add(cert).map_err(|err| {
                    invalid(format!(
                        "tls ca file {}: a certificate is not usable as a trust anchor: {err}",
                        path.display()
                    ))
                })?;
            }
            roots
        }
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| invalid(format!("tls: {err}")))?
        .with_root_certificates(roots);
    let Some(ClientCert {
        cert_file,
        key_file,
    }) = client_cert
    else {
        return Ok(builder.with_no_client_auth());
    };
    let chain = read_certs(cert_file, "tls cert file")?;
    let key = read_key(key_file, "tls key file")?;
    builder.with_client_auth_cert(chain, key).map_err(|err| {
        invalid(format!(
            "tls cert file {} and key file {} do not make a client certificate: {err}",
            cert_file.display(),
            key_file.display()
        ))
    })
}

/// Every certificate in the PEM file at `path`; at least one. `what` names the setting in the
/// error.
pub(crate) fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|err| invalid(format!("{what} {}: cannot read: {err}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "{what} {}: holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The private key in the PEM file at `path`. `what` names the setting in the error.
pub(crate) fn read_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|err| {
        invalid(format!(
            "{what} {}: no private key could be read: {err}",
            path.display()
        ))
    })
}

/// The system's trusted roots (as fred's own `TlsConnector::default_rustls` loads them).
fn system_roots() -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        // A system root rustls cannot use is skipped, as browsers do.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(invalid(
            "tls: no tls ca file is configured and the system has no usable root certificates"
                .to_owned(),
        ));
    }
    Ok(roots)
}

/// A configuration error.
fn invalid(message: String) -> Error {
    Error::new(ErrorKind::Config, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let err = client_config(Some(Path::new("/nonexistent/ca.pem")), None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = client_config(Some(&empty), None).unwrap_err();
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
    }
}
