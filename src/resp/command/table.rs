//! The command table: every command the door knows, once — its arity as Redis counts it, what
//! it needs of the connection's token, what `COMMAND` tells a client about it, and how it runs
//! (its struct's parser and handler, [`Run`]). The metrics' command labels come from it too.
//!
//! # Adding a command
//! Write its struct beside its kin (`read.rs`, `write.rs`, `connection.rs`, `info.rs`) with a
//! [`super::parse::Parse`] impl (its arguments through the cursor) and a
//! [`super::parse::Local`] or [`super::parse::Store`] impl (what it does), then add one row
//! here. Nothing else lists commands.

use bytes::Bytes;

use super::errors::RespError;
use super::parse::Run;
use super::{connection, info, multi, read, tracking, write};

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

/// One command: how Redis describes it and how the door runs it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The name, lowercase (as `COMMAND`, error texts and the metrics spell it).
    pub(crate) name: &'static str,
    /// Redis's arity: `n` exactly n arguments with the name, `-n` at least n.
    pub(crate) arity: i64,
    /// What it needs of the token.
    pub(crate) need: Need,
    /// How it is parsed and run.
    pub(crate) run: Run,
    /// `COMMAND`'s flags.
    pub(crate) flags: &'static [&'static str],
    /// `COMMAND`'s first key, last key, step.
    pub(crate) keys: (i64, i64, i64),
}

impl Spec {
    /// The command `name` with `arity`, needing `need` of the token, run as `run`; no flags,
    /// no keys.
    const fn new(name: &'static str, arity: i64, need: Need, run: Run) -> Spec {
        Spec {
            name,
            arity,
            need,
            run,
            flags: &[],
            keys: (0, 0, 0),
        }
    }

    /// With `COMMAND`'s `flags`.
    const fn flags(mut self, flags: &'static [&'static str]) -> Spec {
        self.flags = flags;
        self
    }

    /// With `COMMAND`'s key positions.
    const fn keys(mut self, first: i64, last: i64, step: i64) -> Spec {
        self.keys = (first, last, step);
        self
    }
}

/// A command known to Redis that the door refuses with `refusal`, whatever its arguments.
const fn refused(name: &'static str, arity: i64, refusal: &'static str) -> Spec {
    Spec::new(name, arity, Need::Token, Run::Refused(refusal))
}

const PUBSUB: &str =
    "pub/sub is not supported by hotsplit: it serves split-copy reads and versioned publishes (SUBSCRIBE takes only __redis__:invalidate, client-side caching's REDIRECT target)";
/// `COMMAND`'s flags of `SUBSCRIBE` and `UNSUBSCRIBE`.
const PUBSUB_FLAGS: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const NO_WATCH: &str =
    "WATCH is not supported by hotsplit: EXEC runs queued commands in order without isolation";

/// `COMMAND`'s flags of a read.
const READ_FAST: &[&str] = &["readonly", "fast"];
/// `COMMAND`'s flags of the commands that run before `AUTH`.
const HANDSHAKE: &[&str] = &["noscript", "loading", "stale", "fast", "no_auth"];
/// `COMMAND`'s flags of the introspection commands.
const LOADING_STALE: &[&str] = &["loading", "stale"];
/// `COMMAND`'s flags of `MULTI`, `DISCARD`, `UNWATCH`.
const TRANSACTION_FAST: &[&str] = &["noscript", "loading", "stale", "fast"];

/// Every command, once, in `COMMAND`'s order; the most frequent first, as [`find`] walks it.
/// A row names the command's struct, whose [`super::parse::Parse`] impl is its parser and whose
/// [`super::parse::Local`] or [`super::parse::Store`] impl is its handler; the metrics take
/// their labels from here.
pub(crate) static TABLE: &[Spec] = &[
    Spec::new("get", 2, Need::Read, Run::store::<read::Get>())
        .flags(READ_FAST)
        .keys(1, 1, 1),
    Spec::new("mget", -2, Need::Read, Run::store::<read::Mget>())
        .flags(READ_FAST)
        .keys(1, -1, 1),
    Spec::new(
        "hello",
        -1,
        Need::Nothing,
        Run::local::<connection::Hello>(),
    )
    .flags(HANDSHAKE),
    Spec::new("auth", -2, Need::Nothing, Run::local::<connection::Auth>()).flags(HANDSHAKE),
    Spec::new("ping", -1, Need::Token, Run::local::<connection::Ping>()).flags(&["fast"]),
    Spec::new("echo", 2, Need::Token, Run::local::<connection::Echo>()).flags(&["fast"]),
    Spec::new("quit", -1, Need::Nothing, Run::Quit).flags(HANDSHAKE),
    Spec::new("reset", 1, Need::Nothing, Run::Reset).flags(HANDSHAKE),
    Spec::new("select", 2, Need::Token, Run::local::<connection::Select>())
        .flags(&["loading", "stale", "fast"]),
    Spec::new(
        "client",
        -2,
        Need::Token,
        Run::local::<connection::Client>(),
    )
    .flags(LOADING_STALE),
    Spec::new("command", -1, Need::Token, Run::local::<info::Command>()).flags(LOADING_STALE),
    Spec::new("info", -1, Need::Token, Run::local::<info::Info>()).flags(LOADING_STALE),
    Spec::new("config", -2, Need::Token, Run::local::<info::ConfigGet>()).flags(LOADING_STALE),
    Spec::new("cluster", -2, Need::Token, Run::local::<info::Cluster>()).flags(LOADING_STALE),
    Spec::new("exists", -2, Need::Read, Run::store::<read::Exists>())
        .flags(READ_FAST)
        .keys(1, -1, 1),
    Spec::new("ttl", 2, Need::Read, Run::store::<read::Ttl>())
        .flags(READ_FAST)
        .keys(1, 1, 1),
    Spec::new("pttl", 2, Need::Read, Run::store::<read::Pttl>())
        .flags(READ_FAST)
        .keys(1, 1, 1),
    Spec::new("set", -3, Need::Write, Run::store::<write::Set>())
        .flags(&["write", "denyoom"])
        .keys(1, 1, 1),
    Spec::new("del", -2, Need::Write, Run::store::<write::Del>())
        .flags(&["write"])
        .keys(1, -1, 1),
    Spec::new("unlink", -2, Need::Write, Run::store::<write::Del>())
        .flags(&["write", "fast"])
        .keys(1, -1, 1),
    Spec::new("multi", 1, Need::Token, Run::Multi).flags(TRANSACTION_FAST),
    Spec::new("exec", 1, Need::Token, Run::Exec).flags(&["noscript", "loading", "stale"]),
    Spec::new("discard", 1, Need::Token, Run::Discard).flags(TRANSACTION_FAST),
    Spec::new("unwatch", 1, Need::Token, Run::local::<multi::Unwatch>()).flags(TRANSACTION_FAST),
    Spec::new(
        "hotsplit.read",
        -2,
        Need::Read,
        Run::store::<read::HotsplitRead>(),
    )
    .flags(READ_FAST)
    .keys(1, 1, 1),
    Spec::new(
        "hotsplit.publish",
        -4,
        Need::Write,
        Run::store::<write::HotsplitPublish>(),
    )
    .flags(&["write", "denyoom"])
    .keys(1, 1, 1),
    Spec::new(
        "hotsplit.invalidate",
        -3,
        Need::Write,
        Run::store::<write::HotsplitInvalidate>(),
    )
    .flags(&["write"])
    .keys(1, 1, 1),
    Spec::new(
        "hotsplit.client",
        -1,
        Need::Token,
        Run::local::<connection::HotsplitClient>(),
    )
    .flags(&["fast"]),
    Spec::new(
        "hotsplit.class",
        -1,
        Need::Token,
        Run::local::<connection::HotsplitClass>(),
    )
    .flags(&["fast"]),
    Spec::new(
        "hotsplit.session",
        -1,
        Need::Token,
        Run::local::<connection::HotsplitSession>(),
    )
    .flags(&["fast"]),
    refused("watch", -2, NO_WATCH),
    Spec::new(
        "subscribe",
        -2,
        Need::Token,
        Run::local::<tracking::SubscribeOn>(),
    )
    .flags(PUBSUB_FLAGS),
    refused("psubscribe", -2, PUBSUB),
    refused("ssubscribe", -2, PUBSUB),
    Spec::new(
        "unsubscribe",
        -1,
        Need::Token,
        Run::local::<tracking::SubscribeOff>(),
    )
    .flags(PUBSUB_FLAGS),
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

/// Whether a subscribed RESP2 connection may run `spec` (Redis's list).
pub(crate) fn runs_subscribed(spec: &Spec) -> bool {
    matches!(
        spec.name,
        "subscribe"
            | "unsubscribe"
            | "psubscribe"
            | "punsubscribe"
            | "ssubscribe"
            | "sunsubscribe"
            | "ping"
            | "quit"
            | "reset"
    )
}

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
