//! TLS for throwaway servers: [`TlsFiles`] (the PEM files a node serves with, and that this
//! crate's own RESP client presents) and the rustls client configuration built from them.
//!
//! A TLS node listens on its port with TLS only (`--port 0 --tls-port P`), replicates and talks
//! on the cluster bus over TLS, and, unless told otherwise with `--tls-auth-clients`, requires
//! a client certificate signed by the same CA.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{DevClusterError, Result};

/// The PEM files of a TLS node. The certificate must name `127.0.0.1` (an IP subject
/// alternative name): every client, this crate's included, verifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signs the servers' and the clients' certificates (`--tls-ca-cert-file`).
    pub ca_file: PathBuf,
    /// The server certificate (`--tls-cert-file`); this crate's probes present it as their
    /// client certificate, as Redis does on the cluster bus and for replication.
    pub cert_file: PathBuf,
    /// The key of `cert_file` (`--tls-key-file`).
    pub key_file: PathBuf,
}

impl TlsFiles {
    /// The `redis-server` arguments of a TLS node on `port` (its plain port is 0): TLS for
    /// clients, replication and the cluster bus. The paths are made absolute, because a node
    /// runs in a directory of its own.
    pub(crate) fn server_args(&self, port: u16) -> Vec<String> {
        let path = |path: &PathBuf| {
            std::path::absolute(path)
                .unwrap_or_else(|_| path.clone())
                .display()
                .to_string()
        };
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(&self.cert_file),
            "--tls-key-file".into(),
            path(&self.key_file),
            "--tls-ca-cert-file".into(),
            path(&self.ca_file),
            "--tls-replication".into(),
            "yes".into(),
            "--tls-cluster".into(),
            "yes".into(),
        ]
    }

    /// The `redis-cli` arguments that make it speak TLS with these files.
    pub(crate) fn cli_args(&self) -> Vec<String> {
        let path = |path: &PathBuf| path.display().to_string();
        vec![
            "--tls".into(),
            "--cacert".into(),
            path(&self.ca_file),
            "--cert".into(),
            path(&self.cert_file),
            "--key".into(),
            path(&self.key_file),
        ]
    }

    /// The rustls client configuration of this crate's RESP client: trusts the CA, presents
    /// the certificate.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] when a file cannot be read or does not hold what it should.
    pub(crate) fn client_config(&self) -> Result<Arc<ClientConfig>> {
        let bad = |what: &str, path: &PathBuf, why: String| DevClusterError::Io {
            context: format!("reading the tls {what} {}", path.display()),
            source: io::Error::new(io::ErrorKind::InvalidData, why),
        };
        let read_certs = |path: &PathBuf, what: &str| {
            CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|err| bad(what, path, err.to_string()))
        };
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&self.ca_file, "ca file")? {
            roots
                .add(cert)
                .map_err(|err| bad("ca file", &self.ca_file, err.to_string()))?;
        }
        let chain = read_certs(&self.cert_file, "cert file")?;
        let key = PrivateKeyDer::from_pem_file(&self.key_file)
            .map_err(|err| bad("key file", &self.key_file, err.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| bad("ca file", &self.ca_file, err.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|err| bad("cert file", &self.cert_file, err.to_string()))?;
        Ok(Arc::new(config))
    }
}
