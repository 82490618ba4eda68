//! Failure classification: [`Failure::of`] is the one place that reads fred's error kinds and
//! error text; [`RedisStore::fail`] counts a store error and maps it to the crate's [`Error`].

use std::fmt;
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind as FredErrorKind};

use super::RedisStore;
use crate::error::{Error, ErrorKind};

/// A stable class of store failure: the `kind` label of `hotsplit_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The command did not answer within the command timeout.
    Timeout,
    /// The connection failed.
    Io,
    /// A cluster error (MOVED/ASK beyond the redirection limit, CLUSTERDOWN) or no route.
    Cluster,
    /// `ERR Function not found`: the node lost the library.
    FunctionMissing,
    /// `READONLY`: the write reached a replica.
    ReadOnly,
    /// `NOSCRIPT`: a script cache miss.
    NoScript,
    /// `NOPERM`: the ACL user may not run the command (a configuration error, not a fault).
    NoPermission,
    /// The client is closing, or the command was dropped.
    Canceled,
    /// fred's command queue is full.
    Backpressure,
    /// Anything else, including replies the store cannot parse.
    Other,
}

impl Failure {
    /// Classifies a fred error. This is the one place that looks at error kinds and details:
    /// NOSCRIPT, READONLY and `ERR Function not found` all arrive as [`FredErrorKind::Unknown`].
    pub(super) fn of(err: &FredError) -> Failure {
        match err.kind() {
            FredErrorKind::Timeout => Failure::Timeout,
            FredErrorKind::IO => Failure::Io,
            FredErrorKind::Cluster | FredErrorKind::Routing => Failure::Cluster,
            FredErrorKind::Canceled => Failure::Canceled,
            FredErrorKind::Backpressure => Failure::Backpressure,
            FredErrorKind::Unknown => {
                let details = err.details();
                if details.starts_with("ERR Function not found") {
                    Failure::FunctionMissing
                } else if details.starts_with("READONLY") {
                    Failure::ReadOnly
                } else if details.starts_with("NOSCRIPT") {
                    Failure::NoScript
                } else if details.starts_with("NOPERM") {
                    Failure::NoPermission
                } else {
                    Failure::Other
                }
            }
            _ => Failure::Other,
        }
    }

    /// What an operator should check when connecting failed with `err`: a rejected
    /// certificate or rejected credentials, in words; empty for any other failure. Like
    /// [`Failure::of`], it reads fred's error text (rustls's and Redis's errors arrive as text).
    pub(super) fn connect_hint(err: &FredError) -> &'static str {
        let details = err.details();
        if details.contains("InvalidCertificate") || details.contains("CertificateRequired") {
            " (the tls certificate was not accepted: check store.tls_ca_file, that the server's certificate names the host or ip address hotsplit connects to, and store.tls_cert_file where the server requires client certificates)"
        } else if details.starts_with("WRONGPASS") || details.contains("NOAUTH") {
            " (check the user and password: the url's user:password@, store.username, store.password_file or HOTSPLIT_REDIS_PASSWORD)"
        } else if details.contains("InvalidContentType") || details.contains("CorruptMessage") {
            " (tls: is the server speaking tls? a rediss:// url needs a tls port)"
        } else {
            ""
        }
    }

    /// The metric label.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Io => "io",
            Failure::Cluster => "cluster",
            Failure::FunctionMissing => "function_missing",
            Failure::ReadOnly => "readonly",
            Failure::NoScript => "noscript",
            Failure::NoPermission => "noperm",
            Failure::Canceled => "canceled",
            Failure::Backpressure => "backpressure",
            Failure::Other => "other",
        }
    }
}

impl RedisStore {
    /// Maps a fred error to the crate's error and counts it. This is the one place where store
    /// errors are classified; `what` names the operation, the copy and the node.
    pub(super) fn fail(&self, what: fmt::Arguments<'_>, err: &FredError) -> Error {
        let failure = Failure::of(err);
        self.metrics.store_error(failure.as_str());
        match failure {
            Failure::Timeout => Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what} timed out after {} ms",
                    self.command_timeout.as_millis()
                ),
            ),
            _ => Error::new(
                ErrorKind::Unavailable,
                format!("{what} failed ({}): {}", failure.as_str(), err.details()),
            ),
        }
    }

    /// An answer from Redis the store cannot interpret; counted as `other`.
    pub(super) fn corrupt(&self, message: String) -> Error {
        self.metrics.store_error(Failure::Other.as_str());
        Error::new(ErrorKind::Unavailable, message)
    }
}

/// Maps a fred error of a read-only client to the crate's error (nothing is counted: the audit
/// has no service metrics).
pub(super) fn read_only_error(
    what: fmt::Arguments<'_>,
    err: &FredError,
    timeout: Duration,
) -> Error {
    match Failure::of(err) {
        Failure::Timeout => Error::new(
            ErrorKind::Timeout,
            format!("{what} timed out after {} ms", timeout.as_millis()),
        ),
        failure => Error::new(
            ErrorKind::Unavailable,
            format!("{what} failed ({}): {}", failure.as_str(), err.details()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_fred_errors() {
        let cases = [
            (
                FredErrorKind::Timeout,
                "Request timed out.",
                Failure::Timeout,
            ),
            (FredErrorKind::IO, "Connection reset", Failure::Io),
            (
                FredErrorKind::Cluster,
                "CLUSTERDOWN The cluster is down",
                Failure::Cluster,
            ),
            (
                FredErrorKind::Routing,
                "Failed to route command.",
                Failure::Cluster,
            ),
            (
                FredErrorKind::Unknown,
                "ERR Function not found",
                Failure::FunctionMissing,
            ),
            (
                FredErrorKind::Unknown,
                "READONLY You can't write against a read only replica.",
                Failure::ReadOnly,
            ),
            (
                FredErrorKind::Unknown,
                "NOSCRIPT No matching script.",
                Failure::NoScript,
            ),
            (FredErrorKind::Canceled, "Canceled.", Failure::Canceled),
            (
                FredErrorKind::Backpressure,
                "Max in-flight commands reached.",
                Failure::Backpressure,
            ),
            (
                FredErrorKind::Unknown,
                "ERR hotsplit_cas: version is not canonical",
                Failure::Other,
            ),
            (
                FredErrorKind::InvalidArgument,
                "WRONGTYPE Operation against a key",
                Failure::Other,
            ),
        ];
        for (kind, details, expected) in cases {
            assert_eq!(
                Failure::of(&FredError::new(kind, details)),
                expected,
                "{details}"
            );
        }
    }
}
