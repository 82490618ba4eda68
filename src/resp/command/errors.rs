//! The door's error replies, in one place: every error a command answers starts with one of
//! the [`Prefix`]es here, so a client can branch on it and the connection loop can count errors
//! by prefix ([`Prefix::of`]).
//!
//! hotsplit never answers `MOVED`, `ASK`, `READONLY`, `LOADING`, `CLUSTERDOWN`, `TRYAGAIN` or
//! `BUSY`: clients act on those (redirect, reconnect, retry in a loop), and none of them means
//! what a refused read means here.

use crate::error::{Error, ErrorKind, Refusal};

/// The first word of an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefix {
    /// Bad input, an unknown command, a refused option: what Redis answers `ERR` for.
    Err,
    /// A command before `AUTH` on an instance with tokens (`NOAUTH Authentication required.`).
    NoAuth,
    /// `AUTH` or `HELLO … AUTH` with a user other than `default` or an unknown token.
    WrongPass,
    /// The token lacks the scope the command needs.
    NoPerm,
    /// `HELLO` with a protocol version other than 2 or 3.
    NoProto,
    /// `EXEC` of a transaction in which a queued command was refused.
    ExecAbort,
    /// No copy reached the read's version floor (a `MINVERSION`, the connection's session, or
    /// the instance's high-water); retry later or lower the floor.
    Floor,
    /// A node the command needs did not answer, or answered with an error; retry later.
    Unavailable,
    /// The instance is at its in-flight bound (`server.max_in_flight`); the command did
    /// nothing. The connection loop answers it.
    Overloaded,
    /// The command's deadline (`server.request_deadline`) passed before the store answered.
    Deadline,
    /// Every replica is over the class's staleness budget and the class fails rather than read
    /// the primary.
    Stale,
    /// The embedded store is full (`store.memory_max_bytes`): the publish changed nothing.
    Full,
}

impl Prefix {
    /// Every prefix.
    pub const ALL: [Prefix; 12] = [
        Prefix::Err,
        Prefix::NoAuth,
        Prefix::WrongPass,
        Prefix::NoPerm,
        Prefix::NoProto,
        Prefix::ExecAbort,
        Prefix::Floor,
        Prefix::Unavailable,
        Prefix::Overloaded,
        Prefix::Deadline,
        Prefix::Stale,
        Prefix::Full,
    ];

    /// The prefix as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Prefix::Err => "ERR",
            Prefix::NoAuth => "NOAUTH",
            Prefix::WrongPass => "WRONGPASS",
            Prefix::NoPerm => "NOPERM",
            Prefix::NoProto => "NOPROTO",
            Prefix::ExecAbort => "EXECABORT",
            Prefix::Floor => "FLOOR",
            Prefix::Unavailable => "UNAVAILABLE",
            Prefix::Overloaded => "OVERLOADED",
            Prefix::Deadline => "DEADLINE",
            Prefix::Stale => "STALE",
            Prefix::Full => "FULL",
        }
    }

    /// The prefix an error reply's text starts with, `None` for a text no command here writes.
    pub fn of(text: &str) -> Option<Prefix> {
        let word = text.split(' ').next().unwrap_or_default();
        Prefix::ALL
            .into_iter()
            .find(|prefix| prefix.as_str() == word)
    }
}

/// One error reply: its prefix and the sentence after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RespError {
    /// The first word.
    pub prefix: Prefix,
    /// The rest (no CR or LF).
    pub text: String,
}

impl RespError {
    /// An error with `prefix` and `text` (CR and LF in it become spaces).
    pub fn new(prefix: Prefix, text: impl Into<String>) -> RespError {
        let mut text = text.into();
        if text.contains(['\r', '\n']) {
            text = text.replace(['\r', '\n'], " ");
        }
        RespError { prefix, text }
    }

    /// An `ERR` error.
    pub fn err(text: impl Into<String>) -> RespError {
        RespError::new(Prefix::Err, text)
    }

    /// The whole text of the reply: the prefix, a space, the sentence.
    pub fn line(&self) -> String {
        format!("{} {}", self.prefix.as_str(), self.text)
    }

    /// `ERR wrong number of arguments for 'NAME' command`, as Redis words it (the name in
    /// lowercase; `container|sub` for a subcommand).
    pub fn arity(name: &str) -> RespError {
        RespError::err(format!(
            "wrong number of arguments for '{}' command",
            name.to_ascii_lowercase()
        ))
    }

    /// `ERR syntax error`.
    pub fn syntax() -> RespError {
        RespError::err("syntax error")
    }

    /// `ERR value is not an integer or out of range`.
    pub fn not_integer() -> RespError {
        RespError::err("value is not an integer or out of range")
    }

    /// `NOAUTH Authentication required.`
    pub fn no_auth() -> RespError {
        RespError::new(Prefix::NoAuth, "Authentication required.")
    }

    /// `OVERLOADED …`: what the connection loop answers a command refused by
    /// `server.max_in_flight` (the command did nothing; the next ones are still tried).
    pub fn overloaded() -> RespError {
        RespError::new(
            Prefix::Overloaded,
            "the instance is at server.max_in_flight; the command did nothing, retry later",
        )
    }

    /// `DEADLINE …`: what the connection loop answers a command whose deadline passed before it
    /// started.
    pub fn deadline() -> RespError {
        RespError::new(
            Prefix::Deadline,
            "the store did not answer within server.request_deadline",
        )
    }

    /// `WRONGPASS invalid username-password pair or user is disabled.`
    pub fn wrong_pass() -> RespError {
        RespError::new(
            Prefix::WrongPass,
            "invalid username-password pair or user is disabled.",
        )
    }

    /// A publish refused by a rule, in this door's words (its arguments).
    pub fn refused(refusal: &Refusal) -> RespError {
        RespError::err(match refusal {
            Refusal::VersionMissing { family } => format!(
                "family {family:?} takes the caller's versions (versioning = caller): send the version"
            ),
            Refusal::VersionGiven { family } => format!(
                "family {family:?} allocates its versions (versioning = allocated): send * as the version"
            ),
            Refusal::ValueTooLarge { bytes, limit } => format!(
                "the value is {bytes} bytes, larger than server.max_value_bytes ({limit})"
            ),
        })
    }

    /// A write command that needs a version (`SET`, `DEL`) refused on a family that takes the
    /// caller's: names `instead`, the command to use. Other errors as [`RespError::from_error`].
    pub fn versionless(error: &Error, command: &str, instead: &str) -> RespError {
        match error.refusal() {
            Some(Refusal::VersionMissing { family }) => RespError::err(format!(
                "{command} needs a version on family {family:?} (versioning = caller): use {instead}"
            )),
            _ => RespError::from_error(error),
        }
    }

    /// The error reply for a library error of a read or a publish. Input errors carry their
    /// sentence (it names the rule broken: `ERR invalid key: key contains '{' …`); store
    /// failures say only what to do, never a node's internals.
    pub fn from_error(error: &Error) -> RespError {
        if let Some(refusal) = error.refusal() {
            return RespError::refused(refusal);
        }
        let message = error.message();
        match error.kind() {
            ErrorKind::InvalidKey => RespError::err(format!("invalid key: {message}")),
            ErrorKind::InvalidVersion
            | ErrorKind::MissingClient
            | ErrorKind::InvalidCopy
            | ErrorKind::InvalidParameter
            | ErrorKind::ValueTooLarge
            | ErrorKind::UnknownClass
            | ErrorKind::ClassNotAllowed
            | ErrorKind::Config => RespError::err(message),
            ErrorKind::NotFound => RespError::err("no such key"),
            ErrorKind::BelowVersionFloor => RespError::new(
                Prefix::Floor,
                format!("no copy reached the version floor: {message}"),
            ),
            ErrorKind::Unavailable
            | ErrorKind::Timeout
            | ErrorKind::NodeFailing
            | ErrorKind::Io => RespError::new(
                Prefix::Unavailable,
                "a store node did not answer; retry later",
            ),
            ErrorKind::DeadlineExceeded => RespError::deadline(),
            ErrorKind::StalenessBudgetExceeded => RespError::new(
                Prefix::Stale,
                format!("every replica is over the class's staleness budget: {message}"),
            ),
            ErrorKind::Unauthorized => RespError::no_auth(),
            ErrorKind::Forbidden => RespError::new(Prefix::NoPerm, message),
            ErrorKind::StoreFull => RespError::new(
                Prefix::Full,
                "the embedded store is full (store.memory_max_bytes); nothing changed",
            ),
        }
    }
}

impl From<RespError> for super::Reply {
    fn from(error: RespError) -> super::Reply {
        super::Reply::Error(error.line())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prefix_reads_back_from_its_reply_and_no_redirect_is_among_them() {
        for prefix in Prefix::ALL {
            let line = RespError::new(prefix, "x\r\ny").line();
            assert_eq!(Prefix::of(&line), Some(prefix), "{line}");
            assert!(!line.contains('\n'));
        }
        for redirect in [
            "MOVED",
            "ASK",
            "READONLY",
            "LOADING",
            "CLUSTERDOWN",
            "TRYAGAIN",
        ] {
            assert_eq!(Prefix::of(&format!("{redirect} 1")), None);
        }
        assert_eq!(
            RespError::arity("GET").line(),
            "ERR wrong number of arguments for 'get' command"
        );
    }
}
