//! The library's one error type.
//!
//! Every fallible public function returns [`Error`]. Callers branch on [`Error::kind`], never on
//! the message text; the HTTP edge maps each [`ErrorKind`] to a status and a stable problem `code`.

use std::fmt;

/// What went wrong, in terms a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A key failed validation (length, printable bytes, `{`, `}` or `#`).
    InvalidKey,
    /// A version was missing where required, present where forbidden, or not canonical decimal.
    InvalidVersion,
    /// An affine read arrived without a client id.
    MissingClient,
    /// A named copy index is outside `0..copies`.
    InvalidCopy,
    /// Some other request parameter did not parse or is out of range.
    InvalidParameter,
    /// A value is larger than the configured limit.
    ValueTooLarge,
    /// The key has no live value (missing, expired, or a tombstone).
    NotFound,
    /// No consulted copy reached the reader's version floor.
    BelowVersionFloor,
    /// The store could not be reached or answered with an error.
    Unavailable,
    /// A store command did not answer within the configured timeout.
    Timeout,
    /// A store command was not sent: its node is known to be failing (a command there timed
    /// out and no probe has seen it answer since).
    NodeFailing,
    /// The configuration is invalid; the message names the field.
    Config,
    /// A read named a class that does not exist.
    UnknownClass,
    /// A read named a class its key's family cannot serve (a presence decision on split copies).
    ClassNotAllowed,
    /// Every replica was over the class's staleness budget and the class fails rather than
    /// read the primary.
    StalenessBudgetExceeded,
    /// An I/O error outside the store (binding a socket, reading a file).
    Io,
    /// The service asked for a bearer token and none, or no valid one, was sent (HTTP 401;
    /// what [`crate::client::Client`] reports).
    Unauthorized,
    /// The bearer token lacks the scope the endpoint needs (HTTP 403).
    Forbidden,
    /// The embedded store holds as many bytes as `store.memory_max_bytes` allows: a publish
    /// that would grow it is refused whole, before any copy changes.
    StoreFull,
    /// The request's deadline passed before the store answered (see [`crate::deadline`]).
    DeadlineExceeded,
}

impl ErrorKind {
    /// A short lowercase name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidKey => "invalid_key",
            ErrorKind::InvalidVersion => "invalid_version",
            ErrorKind::MissingClient => "missing_client",
            ErrorKind::InvalidCopy => "invalid_copy",
            ErrorKind::InvalidParameter => "invalid_parameter",
            ErrorKind::ValueTooLarge => "value_too_large",
            ErrorKind::NotFound => "not_found",
            ErrorKind::BelowVersionFloor => "below_version_floor",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Config => "config",
            ErrorKind::UnknownClass => "unknown_class",
            ErrorKind::ClassNotAllowed => "class_not_allowed",
            ErrorKind::StalenessBudgetExceeded => "staleness_budget_exceeded",
            ErrorKind::Io => "io",
            ErrorKind::NodeFailing => "node_failing",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::StoreFull => "store_full",
            ErrorKind::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

/// The error returned by every fallible function in this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// What kind of failure this is; callers branch on it.
    kind: ErrorKind,
    /// A lowercase sentence fragment that says what failed, safe to log.
    message: String,
    /// The tombstone's version (a raw `u64`, so `error` stays below `key` in the module graph),
    /// for a [`ErrorKind::NotFound`] that a tombstone caused: the HTTP
    /// edge reports it as `Hotsplit-Version`, so a reader can hold it as a floor.
    invalidated_at: Option<u64>,
    /// The rule a publish broke, as facts each door words its own way ([`Refusal`]).
    refusal: Option<Box<Refusal>>,
}

/// A publish refused by a rule of its key's family or of the instance, before any copy was
/// written: the facts, for each door to word in its own vocabulary (HTTP names its query
/// parameters, the Redis door its arguments). The error's own message says it in neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The family takes its versions from the caller (`versioning = caller`) and the publish
    /// named none ([`ErrorKind::InvalidVersion`]).
    VersionMissing {
        /// The family's name (its prefix).
        family: String,
    },
    /// The family allocates its versions (`versioning = allocated`) and the publish named one
    /// ([`ErrorKind::InvalidVersion`]).
    VersionGiven {
        /// The family's name (its prefix).
        family: String,
    },
    /// The value is larger than `server.max_value_bytes` ([`ErrorKind::ValueTooLarge`]).
    ValueTooLarge {
        /// The value's length.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

impl Refusal {
    /// The kind of error it is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Refusal::VersionMissing { .. } | Refusal::VersionGiven { .. } => {
                ErrorKind::InvalidVersion
            }
            Refusal::ValueTooLarge { .. } => ErrorKind::ValueTooLarge,
        }
    }

    /// The rule in words of no door: for logs and library callers.
    fn describe(&self) -> String {
        match self {
            Refusal::VersionMissing { family } => {
                format!("family {family:?} takes versions from the caller, and none was given")
            }
            Refusal::VersionGiven { family } => {
                format!("family {family:?} allocates its versions, and one was given")
            }
            Refusal::ValueTooLarge { bytes, limit } => {
                format!("the value is {bytes} bytes, larger than server.max_value_bytes ({limit})")
            }
        }
    }
}

impl Error {
    /// Creates an error of `kind` with a lowercase message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            invalidated_at: None,
            refusal: None,
        }
    }

    /// The error of a publish refused by `refusal` (its kind, and a message in no door's words).
    pub fn refused(refusal: Refusal) -> Self {
        Error {
            refusal: Some(Box::new(refusal.clone())),
            ..Error::new(refusal.kind(), refusal.describe())
        }
    }

    /// The rule a refused publish broke, for a door to word ([`Error::refused`]).
    pub fn refusal(&self) -> Option<&Refusal> {
        self.refusal.as_deref()
    }

    /// A [`ErrorKind::NotFound`] caused by a tombstone at `version`.
    pub fn invalidated(version: u64) -> Self {
        Error {
            invalidated_at: Some(version),
            ..Error::new(ErrorKind::NotFound, "key was invalidated")
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The tombstone's version when a tombstone caused this [`ErrorKind::NotFound`]; `None` for
    /// a key that is simply missing and for every other kind.
    pub fn invalidated_at(&self) -> Option<u64> {
        self.invalidated_at
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Error::new(ErrorKind::Io, format!("io error: {err}"))
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
