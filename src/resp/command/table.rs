//! The command table: every command the door knows, its arity as Redis counts it, what it
//! needs of the connection's token, and what `COMMAND` tells a client about it.

use bytes::Bytes;

use super::errors::RespError;

/// What a command needs of the connection's token (with tokens configured; without, nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: it runs before `AUTH` (`HELLO`, `AUTH`, `QUIT`, `RESET`).
    Nothing,
    /// Any valid token.
    Token,
    /// A token with the `read` scope.
    Read,
    /// A token with the `write` scope.
    Write,
}

/// Which command a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    Hello,
    Auth,
    Ping,
    Echo,
    Quit,
    Reset,
    Select,
    Client,
    Command,
    Info,
    Config,
    Cluster,
    Get,
    Mget,
    Exists,
    Ttl,
    Pttl,
    Set,
    Del,
    Multi,
    Exec,
    Discard,
    Unwatch,
    HotsplitRead,
    HotsplitPublish,
    HotsplitInvalidate,
    HotsplitClient,
    HotsplitClass,
    HotsplitSession,
    /// Known to Redis, refused here with the reason ([`Spec::refusal`]).
    Refused,
}

/// One command.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The name, lowercase (as `COMMAND` and error texts spell it).
    pub(crate) name: &'static str,
    /// Redis's arity: `n` exactly n arguments with the name, `-n` at least n.
    pub(crate) arity: i64,
    /// What it needs of the token.
    pub(crate) need: Need,
    /// Which command it is.
    pub(crate) cmd: Cmd,
    /// `COMMAND`'s flags.
    pub(crate) flags: &'static [&'static str],
    /// `COMMAND`'s first key, last key, step.
    pub(crate) keys: (i64, i64, i64),
    /// For a refused command, why.
    pub(crate) refusal: &'static str,
}

const fn spec(
    name: &'static str,
    arity: i64,
    need: Need,
    cmd: Cmd,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
) -> Spec {
    Spec {
        name,
        arity,
        need,
        cmd,
        flags,
        keys,
        refusal: "",
    }
}

const fn refused(name: &'static str, arity: i64, refusal: &'static str) -> Spec {
    Spec {
        name,
        arity,
        need: Need::Token,
        cmd: Cmd::Refused,
        flags: &[],
        keys: (0, 0, 0),
        refusal,
    }
}

const PUBSUB: &str =
    "pub/sub is not supported by hotsplit: it serves split-copy reads and versioned publishes";
const NO_WATCH: &str =
    "WATCH is not supported by hotsplit: EXEC runs queued commands in order without isolation";

/// Every command, in `COMMAND`'s order; the most frequent first, as [`find`] walks it.
pub(crate) static TABLE: &[Spec] = &[
    spec(
        "get",
        2,
        Need::Read,
        Cmd::Get,
        &["readonly", "fast"],
        (1, 1, 1),
    ),
    spec(
        "mget",
        -2,
        Need::Read,
        Cmd::Mget,
        &["readonly", "fast"],
        (1, -1, 1),
    ),
    spec(
        "hello",
        -1,
        Need::Nothing,
        Cmd::Hello,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        (0, 0, 0),
    ),
    spec(
        "auth",
        -2,
        Need::Nothing,
        Cmd::Auth,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        (0, 0, 0),
    ),
    spec("ping", -1, Need::Token, Cmd::Ping, &["fast"], (0, 0, 0)),
    spec("echo", 2, Need::Token, Cmd::Echo, &["fast"], (0, 0, 0)),
    spec(
        "quit",
        -1,
        Need::Nothing,
        Cmd::Quit,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        (0, 0, 0),
    ),
    spec(
        "reset",
        1,
        Need::Nothing,
        Cmd::Reset,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        (0, 0, 0),
    ),
    spec(
        "select",
        2,
        Need::Token,
        Cmd::Select,
        &["loading", "stale", "fast"],
        (0, 0, 0),
    ),
    spec(
        "client",
        -2,
        Need::Token,
        Cmd::Client,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    spec(
        "command",
        -1,
        Need::Token,
        Cmd::Command,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    spec(
        "info",
        -1,
        Need::Token,
        Cmd::Info,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    spec(
        "config",
        -2,
        Need::Token,
        Cmd::Config,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    spec(
        "cluster",
        -2,
        Need::Token,
        Cmd::Cluster,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    spec(
        "exists",
        -2,
        Need::Read,
        Cmd::Exists,
        &["readonly", "fast"],
        (1, -1, 1),
    ),
    spec(
        "ttl",
        2,
        Need::Read,
        Cmd::Ttl,
        &["readonly", "fast"],
        (1, 1, 1),
    ),
    spec(
        "pttl",
        2,
        Need::Read,
        Cmd::Pttl,
        &["readonly", "fast"],
        (1, 1, 1),
    ),
    spec(
        "set",
        -3,
        Need::Write,
        Cmd::Set,
        &["write", "denyoom"],
        (1, 1, 1),
    ),
    spec("del", -2, Need::Write, Cmd::Del, &["write"], (1, -1, 1)),
    spec(
        "unlink",
        -2,
        Need::Write,
        Cmd::Del,
        &["write", "fast"],
        (1, -1, 1),
    ),
    spec(
        "multi",
        1,
        Need::Token,
        Cmd::Multi,
        &["noscript", "loading", "stale", "fast"],
        (0, 0, 0),
    ),
    spec(
        "exec",
        1,
        Need::Token,
        Cmd::Exec,
        &["noscript", "loading", "stale"],
        (0, 0, 0),
    ),
    spec(
        "discard",
        1,
        Need::Token,
        Cmd::Discard,
        &["noscript", "loading", "stale", "fast"],
        (0, 0, 0),
    ),
    spec(
        "unwatch",
        1,
        Need::Token,
        Cmd::Unwatch,
        &["noscript", "loading", "stale", "fast"],
        (0, 0, 0),
    ),
    spec(
        "hotsplit.read",
        -2,
        Need::Read,
        Cmd::HotsplitRead,
        &["readonly", "fast"],
        (1, 1, 1),
    ),
    spec(
        "hotsplit.publish",
        -4,
        Need::Write,
        Cmd::HotsplitPublish,
        &["write", "denyoom"],
        (1, 1, 1),
    ),
    spec(
        "hotsplit.invalidate",
        -3,
        Need::Write,
        Cmd::HotsplitInvalidate,
        &["write"],
        (1, 1, 1),
    ),
    spec(
        "hotsplit.client",
        -1,
        Need::Token,
        Cmd::HotsplitClient,
        &["fast"],
        (0, 0, 0),
    ),
    spec(
        "hotsplit.class",
        -1,
        Need::Token,
        Cmd::HotsplitClass,
        &["fast"],
        (0, 0, 0),
    ),
    spec(
        "hotsplit.session",
        -1,
        Need::Token,
        Cmd::HotsplitSession,
        &["fast"],
        (0, 0, 0),
    ),
    refused("watch", -2, NO_WATCH),
    refused("subscribe", -2, PUBSUB),
    refused("psubscribe", -2, PUBSUB),
    refused("ssubscribe", -2, PUBSUB),
    refused("unsubscribe", -1, PUBSUB),
    refused("punsubscribe", -1, PUBSUB),
    refused("sunsubscribe", -1, PUBSUB),
    refused("publish", 3, PUBSUB),
    refused("spublish", 3, PUBSUB),
    refused("pubsub", -2, PUBSUB),
    refused(
        "monitor",
        1,
        "MONITOR is not supported by hotsplit: see its metrics and logs",
    ),
];

/// The command named `name` (any case), if the door knows it.
pub(crate) fn find(name: &[u8]) -> Option<&'static Spec> {
    position(name).map(|at| &TABLE[at])
}

/// Where the command named `name` (any case) stands in [`TABLE`] (its metric's index).
pub(crate) fn position(name: &[u8]) -> Option<usize> {
    TABLE
        .iter()
        .position(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether `args` (the name included) fits `spec`'s arity.
pub(crate) fn arity_ok(spec: &Spec, args: usize) -> bool {
    let args = args as i64;
    if spec.arity >= 0 {
        args == spec.arity
    } else {
        args >= -spec.arity
    }
}

/// `ERR unknown command 'NAME', with args beginning with: 'a' 'b' `, as Redis words it: the
/// name and the arguments cut at 128 characters in all, CR and LF as spaces.
pub(crate) fn unknown(args: &[Bytes]) -> RespError {
    let clean = |bytes: &[u8], at_most: usize| -> String {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(at_most)]);
        text.replace(['\r', '\n'], " ")
    };
    let name = args
        .first()
        .map(|name| clean(name, 128))
        .unwrap_or_default();
    // As Redis builds it: each argument cut to what is left of 128 bytes of the list.
    let mut list = String::new();
    for arg in args.iter().skip(1) {
        if list.len() >= 128 {
            break;
        }
        let shown = clean(arg, 128 - list.len());
        list.push('\'');
        list.push_str(&shown);
        list.push_str("' ");
    }
    let text = format!("unknown command '{name}', with args beginning with: {list}");
    RespError::err(text)
}

/// `ERR unknown subcommand 'SUB'. Try NAME HELP.`, as Redis words it.
pub(crate) fn unknown_subcommand(name: &str, sub: &[u8]) -> RespError {
    let sub = String::from_utf8_lossy(&sub[..sub.len().min(128)]).replace(['\r', '\n'], " ");
    RespError::err(format!(
        "unknown subcommand '{sub}'. Try {} HELP.",
        name.to_ascii_uppercase()
    ))
}
