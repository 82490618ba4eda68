//! TLS and credentials for every fred client the store and `audit` build: the rustls
//! configuration made from [`TlsOptions`] by [`crate::tls`] (the CA file, or the system's roots;
//! an optional client certificate for mutual TLS), and the ACL user and password of
//! [`RedisSecurity`].
//!
//! The server's certificate is always verified, and so is its name: fred hands rustls the host
//! it connects to, so a node reached by IP address (as `CLUSTER SLOTS` reports nodes) needs
//! that IP address among its certificate's subject alternative names. Clusters whose
//! certificates name hosts instead want `cluster-preferred-endpoint-type hostname` on the
//! servers (Redis 7+), or fred's `TlsHostMapping`, which this store leaves at `None`.

use fred::types::config::{TlsConfig, TlsConnector, TlsHostMapping};
use fred::types::Builder;

use super::target::{RedisSecurity, TlsOptions};
use crate::error::Result;
use crate::tls::{client_config, ClientCert};

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

/// fred's TLS configuration for `options` ([`crate::tls::client_config`]), with no host
/// mapping.
fn tls_config(options: &TlsOptions) -> Result<TlsConfig> {
    let client_cert = match (&options.cert_file, &options.key_file) {
        (Some(cert_file), Some(key_file)) => Some(ClientCert {
            cert_file,
            key_file,
        }),
        _ => None,
    };
    let config = client_config(options.ca_file.as_deref(), client_cert)?;
    Ok(TlsConfig {
        connector: TlsConnector::from(config),
        hostnames: TlsHostMapping::None,
    })
}
