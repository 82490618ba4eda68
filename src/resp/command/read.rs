//! The reads: `GET`, `MGET`, `EXISTS`, `TTL`, `PTTL`, `HOTSPLIT.READ`, each a struct parsed
//! from its arguments ([`super::parse`]) and one [`crate::ops::Ops::read`] per key. A key is
//! checked (`ERR invalid key: …`) when it is read: an `MGET` answers the first failure among
//! its keys in order, whether a key breaks a rule or its read fails.
//!
//! `HOTSPLIT.READ`, `HOTSPLIT.PUBLISH` and `HOTSPLIT.INVALIDATE` take a per-call session
//! (`SESSION tok…`, always the last option: every argument after it is a token, none at all
//! starts an empty session): the tokens are merged ([`crate::ops::Ops::session`]), the call
//! reads and leaves its floors in that session instead of the connection's, and the answer's
//! `session` field is the call's new token. The connection's `HOTSPLIT.SESSION` is untouched, so
//! the calls of a pooled connection each carry their own caller's session.
//!
//! A read without an explicit client id (`HOTSPLIT.CLIENT`, `HOTSPLIT.READ … CLIENT`) goes as a
//! pooled caller ([`crate::ops::Caller::Pooled`]); the floor that brings is the operations
//! layer's.

use bytes::Bytes;

use super::errors::RespError;
use super::parse::{text, Args, Parse, Store};
use super::{ConnState, Door};
use crate::deadline::Deadline;
use crate::error::{Error, ErrorKind};
use crate::key::{Key, Version};
use crate::near::Now;
use crate::ops::{Ahead, ClientSession, Concluded, Ops, ReadRequest};
use crate::read::{Read, ReadAnswer};
use crate::resp::reply::Reply;
use crate::route::classes::DECIDES_ON_PRESENCE;
use crate::store::now_unix_ms;

/// What a read asks beyond its key.
#[derive(Debug, Default)]
pub(crate) struct ReadOptions {
    /// The class; `None`: the connection's, else the family's default.
    pub(crate) class: Option<String>,
    /// A floor the caller sent.
    pub(crate) min_version: Option<Version>,
    /// A client id for this read only.
    pub(crate) client: Option<String>,
    /// The command's deadline (`server.request_deadline`), where the read calls the store.
    pub(crate) deadline: Option<Deadline>,
}

impl ReadOptions {
    /// No option but the command's `deadline`.
    pub(crate) fn until(deadline: Option<Deadline>) -> ReadOptions {
        ReadOptions {
            deadline,
            ..ReadOptions::default()
        }
    }
}

/// The session of one call (`SESSION tok…`): the tokens merged, the floors the call leaves.
#[derive(Debug)]
pub(crate) struct CallSession {
    /// The floors: the tokens', then what the call added.
    pub(crate) session: ClientSession,
    /// The token as sent, when one came: sent back as it came while the session is exactly it.
    as_sent: Option<Bytes>,
}

impl CallSession {
    /// The session `tokens` carry (none: an empty one), merged and counted by `ops`.
    pub(crate) fn new(ops: &Ops, tokens: &[Bytes]) -> CallSession {
        let lines: Vec<&[u8]> = tokens.iter().map(Bytes::as_ref).collect();
        let session = match lines.is_empty() {
            true => ClientSession::started(),
            false => ops.session(&lines, now_unix_ms()),
        };
        CallSession {
            session,
            as_sent: match tokens {
                [one] => Some(one.clone()),
                _ => None,
            },
        }
    }

    /// The `session` field of the answer: the call's new token.
    pub(crate) fn reply(&self, ops: &Ops) -> (Reply, Reply) {
        let token = match &self.as_sent {
            Some(text) if self.session.is_exact() => text.clone(),
            _ => ops.session_token(&self.session),
        };
        (Reply::bulk("session"), Reply::Bulk(token))
    }
}

/// `key` as a [`Key`], or the `ERR invalid key: …` naming the rule it breaks.
pub(crate) fn key(raw: &Bytes) -> Result<Key, RespError> {
    let parsed = match std::str::from_utf8(raw) {
        Ok(text) => Key::parse(text),
        Err(error) => {
            let at = error.valid_up_to();
            Err(Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "key contains a non-printable or non-ascii byte 0x{:02x} at byte {at}",
                    raw[at]
                ),
            ))
        }
    };
    parsed.map_err(|error| RespError::from_error(&error))
}

/// A version as a reply: an integer when it fits one, else its decimal text.
pub(crate) fn version_reply(version: Version) -> Reply {
    match i64::try_from(version.get()) {
        Ok(number) => Reply::Int(number),
        Err(_) => Reply::bulk(version.to_string()),
    }
}

/// A version argument (canonical decimal, at least 1).
pub(crate) fn version_arg(raw: &Bytes) -> Result<Version, RespError> {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|text| text.parse::<Version>().ok())
        .ok_or_else(|| {
            RespError::err(format!(
                "invalid version '{}': a version is canonical decimal in 1..=18446744073709551615",
                String::from_utf8_lossy(&raw[..raw.len().min(64)])
            ))
        })
}

impl Door {
    /// Reads `raw` for `conn`: `None` when the key is missing, expired or tombstoned.
    pub(crate) async fn read_key(
        &self,
        conn: &mut ConnState,
        raw: &Bytes,
        options: ReadOptions,
    ) -> Result<Option<ReadAnswer>, RespError> {
        self.read_key_in(conn, raw, options, None).await
    }

    /// [`Door::read_key`] in `per_call`'s session when given, else in the connection's.
    async fn read_key_in(
        &self,
        conn: &mut ConnState,
        raw: &Bytes,
        options: ReadOptions,
        per_call: Option<&mut ClientSession>,
    ) -> Result<Option<ReadAnswer>, RespError> {
        let key = key(raw)?;
        let caller = self.caller(conn, options.client);
        let class = options.class.or_else(|| conn.class.clone());
        // Tracked from before the read (client-side caching): a change while it runs is
        // pushed before its reply.
        let tracked = self.track_begin(conn, &key, class.as_ref());
        let request = ReadRequest {
            key,
            caller,
            min_version: options.min_version,
            if_none_match: None,
            class,
            request_id: None,
            deadline: options.deadline,
        };
        let session = match per_call {
            Some(session) => session,
            None => &mut conn.session,
        };
        let answer = self.core.ops().read(request, session).await;
        if let Some(tracked) = tracked {
            self.track_settle(conn, tracked, &answer);
        }
        match answer {
            Ok(answer) => Ok(Some(answer)),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(None),
            Err(error) => Err(RespError::from_error(&error)),
        }
    }
}

impl Door {
    /// `GET key` answered from memory, without a future, slot or deadline: the same reply
    /// [`Get`] gives, through the same read ([`Ops::read_now`]) and after-answer step. `None`,
    /// having changed nothing, when the command is not a plain `GET` the near cache (or, with
    /// one, a refusal made before any store call) answers: inside `MULTI`, refused by the token or the
    /// arity, on a subscribed or tracking connection, a key that breaks a rule, a read that
    /// needs the store. The caller then runs it through [`Door::execute`]. `clock` is the clock
    /// it is decided by, read into it when it holds none ([`Ops::read_now`]).
    pub fn get_now(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        clock: &mut Option<Now>,
    ) -> Option<Reply> {
        let request = self.plain_get(conn, args, None)?;
        let answer = self
            .core
            .ops()
            .read_now(&request, &mut conn.session, clock)?;
        Some(self.got(conn, answer))
    }

    /// `GET key` started ahead of its turn, with the deadline `deadline`: a pipelined batch's
    /// `GET`s that need the store are sent together ([`Door::fetch_ahead`]) and answered in
    /// order ([`Door::conclude_get`]). `None`, having changed nothing, when the command is not
    /// a plain `GET` (as [`Door::get_now`]).
    pub fn get_ahead(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Option<Ahead> {
        let request = self.plain_get(conn, args, deadline)?;
        Some(self.core.ops().begin_ahead(request, &conn.session))
    }

    /// The store reads of a `GET` started ahead ([`Ops::fetch_ahead`]); the caller bounds
    /// them by the deadline it gave [`Door::get_ahead`].
    ///
    /// # Errors
    /// As [`Ops::read`], but a passed deadline, which the caller's bound gives.
    pub async fn fetch_ahead(&self, ahead: &Ahead) -> crate::error::Result<Read> {
        self.core.ops().fetch_ahead(ahead).await
    }

    /// A `GET` started ahead, answered in its turn: what it fetched when the floors it was
    /// sent with still hold (or it is the first of its run: `after_others` false), else the
    /// read run again now ([`Ops::conclude_ahead`]); its second answer is `true`.
    pub async fn conclude_get(
        &self,
        conn: &mut ConnState,
        ahead: Ahead,
        fetched: crate::error::Result<Read>,
        after_others: bool,
    ) -> (Reply, bool) {
        let ops = self.core.ops();
        let concluded = ops.conclude_ahead(ahead, fetched, after_others, &mut conn.session);
        let (answer, again) = match concluded {
            Concluded::Answered(answer) => (answer, false),
            Concluded::Again(request) => (ops.read(*request, &mut conn.session).await, true),
        };
        (self.got(conn, answer), again)
    }

    /// The request of a plain `GET` (not inside `MULTI`, not on a tracking or subscribed
    /// connection, allowed by the token, a key that keeps the rules); `None` otherwise.
    fn plain_get(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Option<ReadRequest> {
        let [name, raw] = args else {
            return None;
        };
        if !name.eq_ignore_ascii_case(b"get")
            || conn.multi.is_some()
            || conn.tracking.wants()
            || conn.tracking.in_subscribed_mode(conn.proto)
        {
            return None;
        }
        let spec = super::table::find(name)?;
        self.authorize(conn, spec).ok()?;
        let key = key(raw).ok()?;
        let caller = self.caller(conn, None);
        Some(ReadRequest {
            key,
            caller,
            min_version: None,
            if_none_match: None,
            class: conn.class.clone(),
            request_id: None,
            deadline,
        })
    }

    /// A plain `GET`'s reply to `answer`, counted as the connection's command.
    fn got(&self, conn: &mut ConnState, answer: crate::error::Result<ReadAnswer>) -> Reply {
        conn.commands += 1;
        conn.tracking.after_command(false);
        match answer {
            Ok(answer) => value_reply(Some(answer)),
            Err(error) if error.kind() == ErrorKind::NotFound => value_reply(None),
            Err(error) => RespError::from_error(&error).into(),
        }
    }
}

/// `GET key`.
pub(crate) struct Get {
    /// The key as sent.
    key: Bytes,
}

impl Parse for Get {
    // No allocation: the key is moved out of the frame (a slice of the read buffer), and it is
    // checked as a `Key` only when read.
    fn parse(args: &mut Args) -> Result<Get, RespError> {
        Ok(Get {
            key: args.next_bytes()?,
        })
    }
}

impl Store for Get {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let answer = door
            .read_key(conn, &self.key, ReadOptions::until(deadline))
            .await?;
        Ok(value_reply(answer))
    }
}

/// `MGET key…`: every key or none (the first error fails the command).
pub(crate) struct Mget {
    /// The keys as sent, each checked as it is read.
    keys: std::vec::IntoIter<Bytes>,
}

impl Parse for Mget {
    fn parse(args: &mut Args) -> Result<Mget, RespError> {
        Ok(Mget { keys: args.rest() })
    }
}

impl Store for Mget {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let count = self.keys.len();
        let mut values = Vec::with_capacity(count);
        let mut size = 0usize;
        for raw in self.keys {
            let answer = door
                .read_key(conn, &raw, ReadOptions::until(deadline))
                .await?;
            let value = value_reply(answer);
            size = size.saturating_add(value.size());
            if size > door.budgets.max_reply_bytes {
                door.exceeded(crate::resp::metrics::Budget::Reply);
                return Err(RespError::err(format!(
                    "the reply would pass resp.max_reply_bytes ({} bytes) at key {} of {count}: MGET fewer keys",
                    door.budgets.max_reply_bytes,
                    values.len() + 1,
                )));
            }
            values.push(value);
        }
        Ok(Reply::Array(values))
    }
}

/// `EXISTS key…`: how many of the keys (counted as often as named) hold a value, each read as
/// `decides-on-presence`, which a family with several copies refuses.
pub(crate) struct Exists {
    /// The keys as sent, each checked as it is read.
    keys: std::vec::IntoIter<Bytes>,
}

impl Parse for Exists {
    fn parse(args: &mut Args) -> Result<Exists, RespError> {
        Ok(Exists { keys: args.rest() })
    }
}

impl Store for Exists {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let mut present = 0;
        for raw in self.keys {
            let options = ReadOptions {
                class: Some(DECIDES_ON_PRESENCE.to_owned()),
                ..ReadOptions::until(deadline)
            };
            if door.read_key(conn, &raw, options).await?.is_some() {
                present += 1;
            }
        }
        Ok(Reply::Int(present))
    }
}

/// The unit `TTL` (seconds, rounded) and `PTTL` (milliseconds) answer in.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// `TTL`.
    Seconds,
    /// `PTTL`.
    Millis,
}

/// `TTL key`: the served copy's remaining life in seconds; -2 when missing, -1 without one.
pub(crate) struct Ttl {
    /// The key as sent.
    key: Bytes,
}

/// `PTTL key`: as `TTL`, in milliseconds.
pub(crate) struct Pttl {
    /// The key as sent.
    key: Bytes,
}

impl Parse for Ttl {
    fn parse(args: &mut Args) -> Result<Ttl, RespError> {
        Ok(Ttl {
            key: args.next_bytes()?,
        })
    }
}

impl Parse for Pttl {
    fn parse(args: &mut Args) -> Result<Pttl, RespError> {
        Ok(Pttl {
            key: args.next_bytes()?,
        })
    }
}

impl Store for Ttl {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        door.ttl(conn, &self.key, deadline, Unit::Seconds).await
    }
}

impl Store for Pttl {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        door.ttl(conn, &self.key, deadline, Unit::Millis).await
    }
}

impl Door {
    /// The remaining life of the copy `raw` reads, in `unit`.
    async fn ttl(
        &self,
        conn: &mut ConnState,
        raw: &Bytes,
        deadline: Option<Deadline>,
        unit: Unit,
    ) -> Result<Reply, RespError> {
        let answer = self
            .read_key(conn, raw, ReadOptions::until(deadline))
            .await?;
        let Some(ReadAnswer::Value { expire_at_ms, .. }) = answer else {
            return Ok(Reply::Int(-2));
        };
        if expire_at_ms == 0 {
            return Ok(Reply::Int(-1));
        }
        let left = expire_at_ms.saturating_sub(now_unix_ms());
        let left = match unit {
            Unit::Millis => left,
            Unit::Seconds => (left + 500) / 1000,
        };
        Ok(Reply::Int(i64::try_from(left).unwrap_or(i64::MAX)))
    }
}

/// `HOTSPLIT.READ key [CLASS c] [MINVERSION v] [CLIENT id] [SESSION tok…]`: the value with
/// where it came from, as a map (nil when missing; with `SESSION`, a map of nils and the
/// `session` field, so the call's token comes back).
pub(crate) struct HotsplitRead {
    /// The key as sent (checked after the options, as their errors come first).
    key: Bytes,
    /// `CLASS`, `MINVERSION`, `CLIENT`.
    options: ReadOptions,
    /// `SESSION tok…`: the call's own session's tokens (`None`: the connection's session).
    session: Option<Vec<Bytes>>,
}

impl Parse for HotsplitRead {
    fn parse(args: &mut Args) -> Result<HotsplitRead, RespError> {
        let key = args.next_bytes()?;
        let mut options = ReadOptions::default();
        let mut session = None;
        // Each option once, in any order; `SESSION` last (every argument after it a token).
        while let Some(name) = args.next_option() {
            if name == b"SESSION" {
                session = Some(args.rest().collect());
                break;
            }
            let Some(value) = args.next_optional() else {
                return Err(RespError::syntax());
            };
            match name.as_slice() {
                b"CLASS" if options.class.is_none() => {
                    options.class = Some(text(&value, "a class name")?);
                }
                b"MINVERSION" if options.min_version.is_none() => {
                    options.min_version = Some(version_arg(&value)?);
                }
                b"CLIENT" if options.client.is_none() => {
                    if value.is_empty() {
                        return Err(RespError::err("CLIENT needs a non-empty client id"));
                    }
                    options.client = Some(text(&value, "a client id")?);
                }
                _ => return Err(RespError::syntax()),
            }
        }
        Ok(HotsplitRead {
            key,
            options,
            session,
        })
    }
}

impl Store for HotsplitRead {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let ops = door.core.ops();
        let mut call = self.session.map(|tokens| CallSession::new(ops, &tokens));
        let per_call = call.as_mut().map(|call| &mut call.session);
        let options = ReadOptions {
            deadline,
            ..self.options
        };
        let answer = door.read_key_in(conn, &self.key, options, per_call).await?;
        let session = call.map(|call| call.reply(ops));
        Ok(door.read_reply(answer, session))
    }
}

impl Door {
    /// `HOTSPLIT.READ`'s answer: the map of `answer` (nil when missing, or a map of nils when
    /// the call carries a `session`), with its `session` field.
    fn read_reply(&self, answer: Option<ReadAnswer>, session: Option<(Reply, Reply)>) -> Reply {
        let Some(ReadAnswer::Value {
            value,
            version,
            copy,
            served_by,
            route,
            ..
        }) = answer
        else {
            let Some(session) = session else {
                return Reply::Nil;
            };
            let nil = |name: &'static str| (Reply::bulk(name), Reply::Nil);
            return Reply::Map(vec![
                nil("value"),
                nil("version"),
                nil("copy"),
                nil("served_by"),
                nil("route"),
                nil("age_ms"),
                session,
            ]);
        };
        let route_text = {
            let classes = self.core.ops().classes();
            route.text(&classes.get(route.class).name)
        };
        let age_ms = route
            .near_cache_age
            .map(|age| Reply::Int(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)));
        let mut fields = vec![
            (Reply::bulk("value"), Reply::Bulk(value)),
            (Reply::bulk("version"), version_reply(version)),
            (Reply::bulk("copy"), Reply::Int(i64::from(copy))),
            (Reply::bulk("served_by"), Reply::bulk(served_by.to_string())),
            (Reply::bulk("route"), Reply::bulk(route_text)),
            (Reply::bulk("age_ms"), age_ms.unwrap_or(Reply::Nil)),
        ];
        fields.extend(session);
        Reply::Map(fields)
    }
}

/// A read's value, or nil.
fn value_reply(answer: Option<ReadAnswer>) -> Reply {
    match answer {
        Some(ReadAnswer::Value { value, .. }) => Reply::Bulk(value),
        // A read without If-None-Match is never "not modified".
        Some(ReadAnswer::NotModified { .. }) | None => Reply::Nil,
    }
}
