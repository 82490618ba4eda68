//! TLS and credentials for every fred client the store and `audit` build: the rustls
//! configuration made from [`TlsOptions`] (the CA file, or the system's roots; an optional
//! client certificate for mutual TLS), and the ACL user and password of [`RedisSecurity`].
//!
//! The server's certificate is always verified, and so is its name: fred hands rustls the host
//! it connects to, so a node reached by IP address (as `CLUSTER SLOTS` reports nodes) needs
//! that IP address among its certificate's subject alternative names. Clusters whose
//! certificates name hosts instead want `cluster-preferred-endpoint-type hostname` on the
//! servers (Redis 7+), or fred's `TlsHostMapping`, which this store leaves at `None`.

use std::path::Path;
use std::sync::Arc;

use fred::types::config::{TlsConfig, TlsConnector, TlsHostMapping};
use fred::types::Builder;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use super::target::{RedisSecurity, TlsOptions};
use crate::error::{Error, ErrorKind, Result};

/// Puts `security`'s TLS configuration and credentials on `builder`.
///
/// # Errors
/// [`ErrorKind::Config`] when a TLS file cannot be read or holds no usable certificate or key;
/// the message names the file.
pub(super) fn secure(builder: &mut Builder, security: &RedisSecurity) -> Result<()> {
    let tls = security.tls.as_ref().map(tls_config).transpose()?;
    builder.with_config(|config| {
        config.tls = tls;
        config.username = security.username.clone();
        config.password = security
            .password
            .as_ref()
            .map(|password| password.expose().to_owned());
    });
    Ok(())
}

/// fred's TLS configuration for `options`: rustls with the ring provider, the configured CA
/// (or the system's roots), and the client certificate when one is configured.
fn tls_config(options: &TlsOptions) -> Result<TlsConfig> {
    let roots = match &options.ca_file {
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
    let config = match (&options.cert_file, &options.key_file) {
        (Some(cert_file), Some(key_file)) => {
            let chain = read_certs(cert_file, "tls cert file")?;
            let key = PrivateKeyDer::from_pem_file(key_file).map_err(|err| {
                invalid(format!(
                    "tls key file {}: no private key could be read: {err}",
                    key_file.display()
                ))
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|err| {
                invalid(format!(
                    "tls cert file {} and key file {} do not make a client certificate: {err}",
                    cert_file.display(),
                    key_file.display()
                ))
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(TlsConfig {
        connector: TlsConnector::from(config),
        hostnames: TlsHostMapping::None,
    })
}

/// Every certificate in the PEM file at `path`; at least one.
fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
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
