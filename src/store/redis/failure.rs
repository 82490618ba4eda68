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
    /// `ERR Library not found`: a `FUNCTION DELETE` of a library the node does not hold
    /// (another instance deleted it first).
    LibraryMissing,
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
                } else if details.starts_with("ERR Library not found") {
                    Failure::LibraryMissing
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
            Failure::LibraryMissing => "library_missing",
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
        self.fail_as(what, Failure::of(err), &details(err))
    }

    /// Maps a classified failure to the crate's error and counts it: [`RedisStore::fail`]'s
    /// second half, and what the direct connection (`direct.rs`, which has no fred error)
    /// calls with its own `failure` and words.
    pub(super) fn fail_as(&self, what: fmt::Arguments<'_>, failure: Failure, why: &str) -> Error {
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
                format!("{what} failed ({}): {why}", failure.as_str()),
            ),
        }
    }

    /// An answer from Redis the store cannot interpret; counted as `other`.
    pub(super) fn corrupt(&self, message: String) -> Error {
        self.metrics.store_error(Failure::Other.as_str());
        Error::new(ErrorKind::Unavailable, message)
    }
}

/// fred's text for `err`, with an I/O error's Rust debug form (`Os { code: 111, kind:
/// ConnectionRefused, message: "Connection refused" }`, which fred writes for every
/// `std::io::Error`) replaced by its message in plain words (`connection refused`). Every
/// message that carries fred's text about an error takes it from here.
pub(super) fn details(err: &FredError) -> String {
    let details = err.details();
    if err.kind() == &FredErrorKind::IO {
        return io_words(details);
    }
    details.to_owned()
}

/// The words of an `std::io::Error` rendered with `{:?}`: its `message`; else its `kind` split
/// into words, followed by the name of a custom error's cause (a TLS failure's
/// `InvalidCertificate(UnknownIssuer)`, which says what to check); else a plain sentence when
/// the text is some other debug form.
fn io_words(debug: &str) -> String {
    if let Some((_, rest)) = debug.split_once("message: \"") {
        if let Some((message, _)) = rest.split_once('"') {
            return message.to_lowercase();
        }
    }
    let kind = debug
        .split_once("kind: ")
        .map(|(_, rest)| rest)
        .or_else(|| debug.strip_prefix("Kind("));
    if let Some(kind) = kind {
        let name: String = kind
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        if !name.is_empty() {
            let mut words = String::new();
            for (at, letter) in name.chars().enumerate() {
                if letter.is_ascii_uppercase() && at > 0 {
                    words.push(' ');
                }
                words.push(letter.to_ascii_lowercase());
            }
            if let Some((_, cause)) = debug.split_once("error: ") {
                let cause = cause.trim_end_matches(['}', ' ']).trim_matches('"');
                if !cause.is_empty() {
                    return format!("{words}: {cause}");
                }
            }
            return words;
        }
    }
    if debug.contains(['{', '(']) {
        return "the connection failed".to_owned();
    }
    debug.to_owned()
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
            format!("{what} failed ({}): {}", failure.as_str(), details(err)),
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn io_errors_are_told_in_words_not_rust_debug() {
        let cases = [
            (
                r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#,
                "connection refused",
            ),
            ("Kind(UnexpectedEof)", "unexpected eof"),
            (r#"Custom { kind: Other, error: "x" }"#, "other: x"),
            (
                "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }",
                "invalid data: InvalidCertificate(UnknownIssuer)",
            ),
            ("Weird(1)", "the connection failed"),
            ("broken pipe", "broken pipe"),
        ];
        for (debug, words) in cases {
            let err = FredError::new(FredErrorKind::IO, debug);
            assert_eq!(details(&err), words, "{debug}");
        }
        let other = FredError::new(FredErrorKind::Unknown, "ERR x");
        assert_eq!(details(&other), "ERR x");
    }

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
                FredErrorKind::Unknown,
                "ERR Library not found",
                Failure::LibraryMissing,
            ),
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
