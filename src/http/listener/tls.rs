//! TLS on the listeners: the rustls server configuration made from `server.tls_cert_file` and
//! `server.tls_key_file` (with the ring provider, as the Redis connections use), and the check
//! that turns a plain-HTTP request on a TLS port into a clear 400 instead of a handshake error.

use std::path::Path;
use std::sync::{Arc, LazyLock};

use tokio_rustls::TlsAcceptor;

use crate::error::{Error, ErrorKind, Result};

/// The first byte of a TLS record carrying a handshake: every TLS client's first byte.
const HANDSHAKE_RECORD: u8 = 0x16;

/// The problem body of the answer to plain HTTP on a TLS listener.
const PLAIN_HTTP_BODY: &str = r#"{"type":"urn:hotsplit:problem:invalid_parameter","title":"invalid parameter","status":400,"detail":"this port speaks HTTPS: send the request over TLS","code":"invalid_parameter"}"#;

/// The answer to plain HTTP on a TLS listener, written in the clear before closing.
pub(super) static PLAIN_HTTP: LazyLock<Vec<u8>> = LazyLock::new(|| {
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{PLAIN_HTTP_BODY}",
        PLAIN_HTTP_BODY.len()
    )
    .into_bytes()
});

/// The acceptor for `cert_file` (a PEM certificate chain, leaf first) and `key_file` (its PEM
/// private key), offering HTTP/1.1 by ALPN.
///
/// # Errors
/// [`ErrorKind::Config`] naming the file when one cannot be read, holds no certificate or key,
/// or the key does not match the certificate.
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor> {
    let chain = crate::tls::read_certs(cert_file, "server.tls_cert_file")?;
    let key = crate::tls::read_key(key_file, "server.tls_key_file")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| invalid(format!("server tls: {err}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|err| {
            invalid(format!(
                "server.tls_cert_file {} and server.tls_key_file {} do not make a server certificate: {err}",
                cert_file.display(),
                key_file.display()
            ))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Whether `first`, a connection's first byte, can open a TLS handshake.
pub(super) fn opens_handshake(first: u8) -> bool {
    first == HANDSHAKE_RECORD
}

/// A configuration error.
fn invalid(message: String) -> Error {
    Error::new(ErrorKind::Config, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_request_line_does_not_open_a_handshake() {
        assert!(!opens_handshake(b'G'));
        assert!(!opens_handshake(b'P'));
        assert!(opens_handshake(0x16));
    }

    #[test]
    fn the_plain_http_answer_declares_its_length() {
        let text = std::str::from_utf8(&PLAIN_HTTP).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "invalid_parameter");
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = acceptor(Path::new("/nonexistent/cert.pem"), Path::new("/k.pem"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }
}
