//! What each command does for a connection: the handshake, reads and writes through
//! [`crate::ops`], transactions, and the refusals. The connection loop (`resp::conn`) calls
//! [`Door::execute`] once per command, in order, with the connection's [`ConnState`].
//!
//! # How a command runs
//! `Door::execute` finds its name in the table (`table.rs`: each command once, with its
//! arity, the scope it needs, `COMMAND`'s flags and how it runs), checks the token and the
//! arity (`Door::admit`), then parses the arguments once, through the cursor of `parse.rs`,
//! into the command's struct (`Get { key }`, `Set { key, value }`, …) and hands that to its
//! handler: a `Local` one answered at once, or a `Store` one that reads or writes through
//! [`crate::ops`]. No handler reads the arguments. Inside `MULTI` a command is checked (name,
//! arity, token) and queued as sent, and parsed when `EXEC` runs it, so its other errors are
//! among `EXEC`'s replies, as Redis answers them. The metrics' command labels come from the
//! table (`resp::metrics`).
//!
//! # Commands
//! Names are case-insensitive; an argument count Redis would refuse answers
//! `ERR wrong number of arguments for 'get' command`. Answers are the same in RESP2 and RESP3
//! except where a map is named: RESP3 `%` map, RESP2 a flat array of name, value pairs (as
//! `HGETALL` answers); nil is `$-1` (RESP2) or `_` (RESP3).
//!
//! **Connection** (`connection.rs`)
//! - `HELLO [2|3] [AUTH user password] [SETNAME name]`: switches the protocol and answers the
//!   map Redis answers (`server` redis, `version` 7.4.0, `proto`, `id`, `mode` standalone,
//!   `role` master, `modules` []). Another version: `NOPROTO unsupported protocol version`.
//!   Without `AUTH` on an unauthenticated connection with tokens: `NOAUTH HELLO must be called
//!   with the client already authenticated, …` (go-redis then falls back to RESP2).
//! - `AUTH [user] password`: the password is an API token (`[auth] tokens_file`), the user
//!   `default` or absent; its scopes apply per command (`read`: `GET`, `MGET`, `EXISTS`,
//!   `TTL`, `PTTL`, `HOTSPLIT.READ`; `write`: `SET`, `DEL`, `UNLINK`, `HOTSPLIT.PUBLISH`,
//!   `HOTSPLIT.INVALIDATE`; any token: the rest). A wrong token or user:
//!   `WRONGPASS invalid username-password pair or user is disabled.`; a command before it:
//!   `NOAUTH Authentication required.`; a missing scope: `NOPERM User NAME has no
//!   permissions to run the 'set' command (the token lacks the write scope)`. With no tokens
//!   configured no command needs one, and `AUTH` answers `+OK` whatever it is sent.
//! - `PING [message]` (`+PONG` or the message), `ECHO message`, `QUIT` (`+OK`, then the
//!   connection closes), `SELECT 0` (others: `ERR DB index is out of range`).
//! - `RESET`: `+RESET`; back to RESP2, unauthenticated (with tokens), no name, no client id,
//!   no class, no session floors, no transaction.
//! - `CLIENT SETNAME name` (a label only: never a client id), `GETNAME`, `ID`, `INFO` (a
//!   verbatim string), `SETINFO LIB-NAME|LIB-VER value`, `NO-EVICT on|off`, `NO-TOUCH on|off`
//!   (`+OK`, nothing to do); other subcommands are refused.
//! - Client-side caching (`tracking.rs`): `CLIENT TRACKING ON|OFF [REDIRECT id] [PREFIX p]…
//!   [BCAST] [OPTIN] [OPTOUT] [NOLOOP]`, `CLIENT CACHING YES|NO`, `CLIENT GETREDIR`,
//!   `CLIENT TRACKINGINFO`, and `SUBSCRIBE`/`UNSUBSCRIBE __redis__:invalidate` (the only
//!   channel) for a RESP2 `REDIRECT` target; a subscribed RESP2 connection runs only pub/sub
//!   commands, `PING`, `QUIT` and `RESET`, as in Redis. Every read command tracks the logical
//!   keys it reads (misses included); the invalidations are written between replies.
//! - `HOTSPLIT.CLIENT [id]`: sets (or, without an argument, answers) the connection's client
//!   id, which chooses its affine copy and carries its own-write floors. Without one a
//!   connection reads as `INSTANCE/resp/CONNECTION-ID` and its reads take the instance's
//!   high-water as a floor ([`crate::ops::HighWater`]): pooled connections never see a key go
//!   back, and always see a write published through this instance.
//!   `HOTSPLIT.CLIENT ""` drops the explicit id.
//! - `HOTSPLIT.CLASS [name]`: sets (or answers) the read class of `GET`/`MGET`/`TTL`;
//!   `HOTSPLIT.CLASS ""` goes back to each family's default class.
//! - `HOTSPLIT.SESSION [token…]`: answers the connection's session token (the floors of its
//!   reads and writes, as HTTP's `Hotsplit-Session`), or takes one from another instance
//!   (several are merged, a floor only ever rising; an unknown or garbled token starts an empty
//!   session, never an error) and answers `+OK`.
//!
//! **Introspection** (`info.rs`): `COMMAND` (Redis's 10-field entries), `COMMAND COUNT`,
//! `COMMAND INFO name…`, `COMMAND LIST`, `COMMAND DOCS` (an empty map); `INFO [section…]` (a
//! verbatim string: `server` with `redis_version:7.4.0` and `hotsplit_version`, `clients`,
//! `persistence` with `loading:0`, `replication` with `role:master`, `stats` with this
//! connection's command count (the instance's counts are in `/metrics`), `hotsplit`);
//! `CONFIG GET pattern…` (a map: `save` "", `appendonly` "no", `databases` "1"; other names
//! nothing); `CLUSTER …`: `ERR This instance has cluster support disabled`.
//!
//! **Reads** (`read.rs`): `GET key` (the value, or nil when missing or tombstoned), `MGET key…`
//! (an array; any key that cannot be answered truthfully fails the whole command with its
//! error), `EXISTS key…` (how many are present, read as `decides-on-presence`: refused on a
//! family with more than one copy, whose copies can disagree on presence), `TTL`/`PTTL key`
//! (the served copy's remaining life; -2 when missing), `HOTSPLIT.READ key [CLASS c]
//! [MINVERSION v] [CLIENT id] [SESSION token…]` (a map: `value`, `version`, `copy`,
//! `served_by`, `route`, `age_ms` — nil unless the near cache answered; nil when missing).
//!
//! **Per-call sessions**: `SESSION token…`, the last option of `HOTSPLIT.READ`,
//! `HOTSPLIT.PUBLISH` and `HOTSPLIT.INVALIDATE` (every argument after it is a token), gives the
//! call a session of its own (the tokens merged), leaving the connection's untouched; the
//! answer's map gains `session`, the call's new token (a read's miss then answers a map of nils
//! with it).
//!
//! **Writes** (`write.rs`): `HOTSPLIT.PUBLISH key version value [SYNC replicas timeout_ms]
//! [SESSION token…]` (`*` as the version on an `allocated` family), `HOTSPLIT.INVALIDATE key
//! version|* [SESSION token…]`: the
//! publish report as a map (`key`, `version`, `copies`, `applied`, `current`, `stale`,
//! `conflict`, `failed`, `queued`, `dropped`, `status`, `http_status`: what the HTTP answer's
//! status would be). `SET key value` (no options) and `DEL`/`UNLINK key…` on `allocated`
//! families; on `caller` families they are refused naming `HOTSPLIT.PUBLISH`. `DEL` answers how
//! many of its keys' invalidations landed (applied or queued on some copy): hotsplit does not
//! read every copy to learn whether a key held a value, so a key with no value counts too; a
//! `DEL` of several keys stops at the first key whose write fails and answers that error (the
//! keys before it are deleted).
//!
//! **Transactions** (`multi.rs`): `MULTI`, then `+QUEUED` per command, `EXEC` runs them in
//! order **without isolation** (other connections' commands may interleave) and answers their
//! replies as an array; a queued command with an unknown name, a wrong arity, a refused name or
//! a missing scope makes `EXEC` answer `EXECABORT Transaction discarded because of previous
//! errors.`; `DISCARD`; nested `MULTI`: `ERR MULTI calls can not be nested`; `EXEC` without
//! `MULTI`: `ERR EXEC without MULTI`. `WATCH` is refused; `UNWATCH` answers `+OK`. The queued
//! commands share `EXEC`'s deadline.
//!
//! **Refused**: the pub/sub commands (but `SUBSCRIBE`/`UNSUBSCRIBE __redis__:invalidate`),
//! `MONITOR`, `WATCH`, with a sentence saying so. Anything else: `ERR unknown command 'X', with
//! args beginning with: 'a' 'b' `, exactly as Redis words it; the connection stays usable.
//!
//! # Errors
//! Every error starts with a prefix of [`errors::Prefix`]: `ERR` (bad input: the sentence names
//! the rule, e.g. `ERR invalid key: key contains '{' at byte 3: …`), `NOAUTH`, `WRONGPASS`,
//! `NOPERM`, `NOPROTO`, `EXECABORT`, `FLOOR` (no copy reached the read's floor), `UNAVAILABLE`
//! (a node did not answer), `OVERLOADED` (the in-flight bound, answered by the connection loop),
//! `DEADLINE` (`server.request_deadline` passed), `STALE` (every replica over the class's
//! staleness budget), `FULL` (the embedded store is full). Never `MOVED`, `ASK`, `READONLY`,
//! `LOADING` or `CLUSTERDOWN`.

mod connection;
pub mod errors;
mod info;
mod multi;
mod parse;
mod read;
pub(crate) mod table;
#[cfg(test)]
mod tests;
mod tracking;
mod write;

use bytes::Bytes;

use self::errors::{Prefix, RespError};
use self::parse::Run;
use self::table::{Need, Spec};
use super::reply::{Proto, Reply};
use crate::auth::{Scope, Scopes, Verdict};
use crate::deadline::Deadline;
use crate::door::Core;
use crate::ops::{Caller, ClientSession};

pub use errors::Prefix as ErrorPrefix;
pub use tracking::TrackingState;

/// What the door shares across connections: the operations, the token table, the metrics, the
/// limits. Cheap to clone.
#[derive(Clone)]
pub struct Door {
    /// What both doors share: the operations, the tokens, the metrics, the in-flight bound.
    core: Core,
    /// The bounds of what one command may build.
    budgets: Budgets,
    /// The door's metrics, where a command passing a budget is counted (`None` in a door no
    /// listener serves).
    metrics: Option<super::metrics::RespMetrics>,
}

/// The bounds of what one command may build (set by the listener from `[resp]`; unbounded
/// in a door no listener configured, as the unit tests build one).
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    /// `resp.max_reply_bytes`: the largest reply (an `MGET`, an `EXEC`).
    pub max_reply_bytes: usize,
    /// `resp.max_queued_bytes`: the bytes one transaction's queued commands may hold.
    pub max_queued_bytes: usize,
}

impl Default for Budgets {
    fn default() -> Budgets {
        Budgets {
            max_reply_bytes: usize::MAX,
            max_queued_bytes: usize::MAX,
        }
    }
}

impl Door {
    /// The door over the service's `core`.
    pub fn new(core: Core) -> Door {
        Door {
            core,
            budgets: Budgets::default(),
            metrics: None,
        }
    }

    /// The door with `budgets` as its bounds, counting the commands refused at them in
    /// `metrics`.
    pub fn with_budgets(mut self, budgets: Budgets, metrics: super::metrics::RespMetrics) -> Door {
        self.budgets = budgets;
        self.metrics = Some(metrics);
        self
    }

    /// Counts a command refused at `budget`.
    fn exceeded(&self, budget: super::metrics::Budget) {
        if let Some(metrics) = &self.metrics {
            metrics.exceeded(budget);
        }
    }

    /// What both doors share.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Runs one command (`args[0]` its name, as sent) for the connection `conn`, bounded by
    /// `deadline` where it calls the store; says whether the connection goes on.
    pub async fn execute(
        &self,
        conn: &mut ConnState,
        args: Vec<Bytes>,
        deadline: Option<Deadline>,
    ) -> (Reply, After) {
        // Counted per connection: a counter every connection shares would be one cache line
        // written by every core on every command (the instance's counts are in `/metrics`).
        conn.commands += 1;
        let Some(name) = args.first() else {
            return (RespError::err("empty command").into(), After::Continue);
        };
        let spec = table::find(name);
        if conn.multi.is_some() {
            if let Some(answer) = self.in_multi(conn, spec, &args, deadline).await {
                conn.tracking.after_command(conn.multi.is_some());
                return answer;
            }
        }
        let answer = self.run(conn, spec, args, deadline).await;
        conn.tracking.after_command(conn.multi.is_some());
        answer
    }

    /// Whether `conn` may still run commands: false once a reload removed the token it
    /// authenticated with, or changed its scopes (the connection loop then closes it). A
    /// connection that never authenticated stays (its commands are refused with `NOAUTH`
    /// while tokens are configured).
    pub fn still_authorized(&self, conn: &ConnState) -> bool {
        let Some(auth) = &conn.auth else {
            return true;
        };
        let tokens = self.core.tokens().load();
        let Some(tokens) = tokens.as_ref() else {
            // No tokens any more: no command needs one.
            return true;
        };
        match tokens.verify(&auth.token.0) {
            Verdict::Known(id) => id.name == auth.name && id.scopes == auth.scopes,
            Verdict::Unknown => false,
        }
    }

    /// Runs one command outside a transaction's queue (or queued, at `EXEC`).
    async fn run(
        &self,
        conn: &mut ConnState,
        spec: Option<&'static Spec>,
        args: Vec<Bytes>,
        deadline: Option<Deadline>,
    ) -> (Reply, After) {
        let spec = match self.admit(conn, spec, &args) {
            Ok(spec) => spec,
            Err(error) => return (error.into(), After::Continue),
        };
        if conn.tracking.in_subscribed_mode(conn.proto) && !table::runs_subscribed(spec) {
            return (
                tracking::subscribed_refusal(spec.name).into(),
                After::Continue,
            );
        }
        // Parsed into the command's struct here, once: a queued command is parsed when `EXEC`
        // runs it, so its syntax errors are among `EXEC`'s replies, as Redis answers them.
        let args = parse::Args::new(spec.name, args);
        let reply = match spec.run {
            Run::Local(run) => run(self, conn, args),
            Run::Store(start) => {
                let id = conn.id;
                let write = spec.need == Need::Write;
                match start(self, conn, args, deadline) {
                    // A write names its connection as the origin of the copies it changes, so a
                    // `NOLOOP` connection is not told of its own change.
                    Ok(pending) if write => crate::tracking::as_origin(id, pending).await,
                    Ok(pending) => pending.await,
                    Err(error) => Err(error),
                }
            }
            Run::Quit => return (Reply::OK, After::Close),
            Run::Reset => Ok(self.reset(conn)),
            Run::Multi => {
                conn.multi = Some(multi::Multi::default());
                Ok(Reply::OK)
            }
            Run::Exec => Err(RespError::err("EXEC without MULTI")),
            Run::Discard => Err(RespError::err("DISCARD without MULTI")),
            Run::Refused(refusal) => Err(RespError::err(refusal)),
        };
        (reply.unwrap_or_else(Reply::from), After::Continue)
    }

    /// The checks before a command runs (or is queued): a known name, its arity, the token.
    fn admit(
        &self,
        conn: &ConnState,
        spec: Option<&'static Spec>,
        args: &[Bytes],
    ) -> Result<&'static Spec, RespError> {
        // Before authentication anything but the few commands that need no token is answered
        // `NOAUTH` before its name is looked up: an unknown command's reply (which quotes its
        // arguments) would give a client without a token more bytes out than it sent.
        let needs_token = spec.is_none_or(|spec| spec.need != Need::Nothing);
        if needs_token && conn.auth.is_none() && self.core.tokens().load().is_some() {
            return Err(RespError::no_auth());
        }
        let Some(spec) = spec else {
            return Err(table::unknown(args));
        };
        if !table::arity_ok(spec, args.len()) {
            return Err(RespError::arity(spec.name));
        }
        self.authorize(conn, spec)?;
        Ok(spec)
    }

    /// Whether the connection's token allows `spec`.
    fn authorize(&self, conn: &ConnState, spec: &Spec) -> Result<(), RespError> {
        let scope = match spec.need {
            Need::Nothing => return Ok(()),
            Need::Token => None,
            Need::Read => Some(Scope::Read),
            Need::Write => Some(Scope::Write),
        };
        if self.core.tokens().load().is_none() {
            return Ok(());
        }
        let Some(auth) = &conn.auth else {
            return Err(RespError::no_auth());
        };
        match scope {
            Some(scope) if !auth.scopes.contains(scope) => Err(RespError::new(
                Prefix::NoPerm,
                format!(
                    "User {} has no permissions to run the '{}' command (the token lacks the {} scope)",
                    auth.name,
                    spec.name,
                    scope.as_str()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Who a read or write of `conn` is for: the client it named (for this call, or with
    /// `HOTSPLIT.CLIENT`), else the connection as a pooled caller (what that brings is the
    /// operations layer's: [`crate::ops::Ops::pooled`]).
    fn caller(&self, conn: &mut ConnState, per_call: Option<String>) -> Caller {
        if let Some(id) = per_call.or_else(|| conn.client.clone()) {
            return Caller::Client(id);
        }
        conn.pooled
            .get_or_insert_with(|| self.core.ops().pooled(conn.id))
            .clone()
    }
}

/// What a connection goes on with after a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Read the next command.
    Continue,
    /// Write the reply, then close (`QUIT`, a revoked token).
    Close,
}

/// A token as presented, kept to check it again after a reload; never printed.
#[derive(Clone)]
pub struct Secret(Bytes);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Who a connection authenticated as.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The token's name in the tokens file (logs, `NOPERM` texts).
    pub name: String,
    /// Its scopes when it authenticated.
    pub scopes: Scopes,
    /// The token, to check it is still in the table ([`Door::still_authorized`]).
    token: Secret,
}

/// One connection's state, carried from command to command.
#[derive(Debug, Default)]
pub struct ConnState {
    /// The connection's id (`CLIENT ID`, logs, the default client id).
    pub id: u64,
    /// The protocol it speaks.
    pub proto: Proto,
    /// The session floors it carries (one per connection; `HOTSPLIT.SESSION`).
    pub session: ClientSession,
    /// The token it authenticated with (`AUTH`, `HELLO … AUTH`); `None` before.
    pub auth: Option<Authenticated>,
    /// `CLIENT SETNAME`: a label only, never a client id (pools share one name).
    pub name: Option<String>,
    /// `CLIENT SETINFO LIB-NAME`.
    pub lib_name: Option<String>,
    /// `CLIENT SETINFO LIB-VER`.
    pub lib_ver: Option<String>,
    /// `HOTSPLIT.CLIENT`: the explicit client id of its reads and writes.
    pub client: Option<String>,
    /// `HOTSPLIT.CLASS`: the read class of its reads; `None`: the family's default.
    pub class: Option<String>,
    /// The open transaction (`MULTI`), if any.
    multi: Option<multi::Multi>,
    /// Who it reads and writes as without an explicit client, made on first use.
    pooled: Option<Caller>,
    /// Commands it sent (`INFO stats`).
    commands: u64,
    /// `AUTH` (or `HELLO … AUTH`) attempts refused `WRONGPASS`: the connection loop counts and
    /// slows each one.
    pub auth_failures: u32,
    /// Client-side caching: its mode, and the outbox its invalidations wait in.
    pub tracking: TrackingState,
}

impl ConnState {
    /// The state of a new connection with id `id`.
    pub fn new(id: u64) -> ConnState {
        ConnState {
            id,
            ..ConnState::default()
        }
    }

    /// Whether a transaction is open (`MULTI` without `EXEC` or `DISCARD` yet).
    pub fn in_transaction(&self) -> bool {
        self.multi.is_some()
    }
}
