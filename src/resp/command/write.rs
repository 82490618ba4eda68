//! The writes: `HOTSPLIT.PUBLISH`, `HOTSPLIT.INVALIDATE`, and `SET`, `DEL`, `UNLINK` on
//! `allocated` families, each a struct parsed from its arguments ([`super::parse`]) and one
//! [`crate::ops::Ops::publish`] per key. A write goes as the
//! connection's client id (explicit or its own), so its reads hold the version it wrote.
//! `HOTSPLIT.PUBLISH` and `HOTSPLIT.INVALIDATE` take a per-call session as `HOTSPLIT.READ`
//! does (`SESSION tok…`, last; see `read.rs`): the written floor goes into it, and the report's
//! `session` field is the call's new token.

use bytes::Bytes;

use super::errors::{Prefix, RespError};
use super::parse::{integer, Args, Parse, Store};
use super::read::{key as key_arg, version_arg, version_reply, CallSession};
use super::{ConnState, Door};
use crate::deadline::Deadline;
use crate::key::{Key, Version};
use crate::ops::{ClientSession, Edit, PublishCall, PublishOutcome, Writer};
use crate::publish::{PublishStatus, SyncReplicas};
use crate::resp::reply::Reply;

/// The status the HTTP answer of a write that ended `status` would have.
fn http_status(status: PublishStatus) -> i64 {
    match status {
        PublishStatus::Done => 200,
        PublishStatus::Queued => 202,
        PublishStatus::Stale | PublishStatus::Conflict => 409,
        PublishStatus::Incomplete => 503,
    }
}

/// The status's name in the report.
fn status_name(status: PublishStatus) -> &'static str {
    match status {
        PublishStatus::Done => "done",
        PublishStatus::Queued => "queued",
        PublishStatus::Stale => "stale",
        PublishStatus::Conflict => "conflict",
        PublishStatus::Incomplete => "incomplete",
    }
}

/// The publish report as a map, with the call's `session` field when it carried one.
fn report_reply(outcome: &PublishOutcome, session: Option<(Reply, Reply)>) -> Reply {
    let report = &outcome.report;
    let count = |name: &'static str, value: u32| (Reply::bulk(name), Reply::Int(i64::from(value)));
    let mut fields = vec![
        (Reply::bulk("key"), Reply::bulk(report.key.clone())),
        (Reply::bulk("version"), version_reply(report.version)),
        count("copies", report.copies),
        count("applied", report.applied),
        count("current", report.current),
        count("stale", report.stale),
        count("conflict", report.conflict),
        count("failed", report.failed),
        count("queued", report.queued),
        count("dropped", report.dropped),
        (
            Reply::bulk("status"),
            Reply::bulk(status_name(outcome.status)),
        ),
        (
            Reply::bulk("http_status"),
            Reply::Int(http_status(outcome.status)),
        ),
    ];
    fields.extend(session);
    Reply::Map(fields)
}

impl Door {
    /// Publishes or invalidates as `call` says (its writer filled in: `conn`'s caller), in
    /// `per_call`'s session when given, else in the connection's.
    async fn edit(
        &self,
        conn: &mut ConnState,
        mut call: PublishCall,
        per_call: Option<&mut ClientSession>,
    ) -> Result<PublishOutcome, RespError> {
        call.writer = Writer {
            caller: Some(self.caller(conn, None)),
            request_id: None,
        };
        let session = match per_call {
            Some(session) => session,
            None => &mut conn.session,
        };
        self.core
            .ops()
            .publish(call, session)
            .await
            .map_err(|error| RespError::from_error(&error))
    }
}

/// A version argument: `*` (none: the family allocates it), or a version. Whether the key's
/// family takes that is the operations layer's rule ([`crate::ops::Ops::check_edit`]).
fn version_arg_or_star(raw: &Bytes) -> Result<Option<Version>, RespError> {
    match raw.as_ref() {
        b"*" => Ok(None),
        _ => version_arg(raw).map(Some),
    }
}

/// `HOTSPLIT.PUBLISH key version value [SYNC replicas timeout_ms] [SESSION tok…]`.
pub(crate) struct HotsplitPublish {
    /// The key, checked.
    key: Key,
    /// The version (`None`: `*`, the family allocates it).
    version: Option<Version>,
    /// The value.
    value: Bytes,
    /// `SYNC replicas timeout_ms`.
    sync: Option<SyncReplicas>,
    /// `SESSION tok…`: the call's own session's tokens.
    session: Option<Vec<Bytes>>,
}

impl Parse for HotsplitPublish {
    fn parse(args: &mut Args) -> Result<HotsplitPublish, RespError> {
        let key = args.next_bytes()?;
        let version = args.next_bytes()?;
        let value = args.next_bytes()?;
        let key = key_arg(&key)?;
        let version = version_arg_or_star(&version)?;
        // The options' shape is checked before their numbers: `SYNC` once, with two values;
        // `SESSION` last.
        let mut sync = None;
        let mut session = None;
        while let Some(name) = args.next_option() {
            match name.as_slice() {
                b"SESSION" => {
                    session = Some(args.rest().collect());
                    break;
                }
                b"SYNC" if sync.is_none() && args.len() >= 2 => {
                    sync = Some((args.next_bytes()?, args.next_bytes()?));
                }
                _ => return Err(RespError::syntax()),
            }
        }
        let sync = match sync {
            Some((replicas, timeout_ms)) => Some(SyncReplicas {
                replicas: integer(&replicas)?,
                timeout_ms: integer(&timeout_ms)?,
            }),
            None => None,
        };
        Ok(HotsplitPublish {
            key,
            version,
            value,
            sync,
            session,
        })
    }
}

impl Store for HotsplitPublish {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let edit = Edit::Value(self.value);
        let call = edit_call(self.key, self.version, edit, self.sync, deadline);
        door.edit_in_call(conn, call, self.session).await
    }
}

/// `HOTSPLIT.INVALIDATE key version [SESSION tok…]`.
pub(crate) struct HotsplitInvalidate {
    /// The key, checked.
    key: Key,
    /// The version (`None`: `*`).
    version: Option<Version>,
    /// `SESSION tok…`: the call's own session's tokens.
    session: Option<Vec<Bytes>>,
}

impl Parse for HotsplitInvalidate {
    fn parse(args: &mut Args) -> Result<HotsplitInvalidate, RespError> {
        let key = args.next_bytes()?;
        let version = args.next_bytes()?;
        // Anything but `SESSION` after the version is refused before the key is checked.
        let session = match args.next_option() {
            None => None,
            Some(name) if name == b"SESSION" => Some(args.rest().collect()),
            Some(_) => return Err(RespError::syntax()),
        };
        Ok(HotsplitInvalidate {
            key: key_arg(&key)?,
            version: version_arg_or_star(&version)?,
            session,
        })
    }
}

impl Store for HotsplitInvalidate {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let call = edit_call(self.key, self.version, Edit::Tombstone, None, deadline);
        door.edit_in_call(conn, call, self.session).await
    }
}

impl Door {
    /// Runs `call` in the session its `SESSION` tokens carry (`None`: the connection's), and
    /// answers its report (with the call's `session` field when it carried one).
    async fn edit_in_call(
        &self,
        conn: &mut ConnState,
        call: PublishCall,
        tokens: Option<Vec<Bytes>>,
    ) -> Result<Reply, RespError> {
        let ops = self.core.ops();
        let mut session = tokens.map(|tokens| CallSession::new(ops, &tokens));
        let per_call = session.as_mut().map(|session| &mut session.session);
        let outcome = self.edit(conn, call, per_call).await?;
        Ok(report_reply(
            &outcome,
            session.map(|session| session.reply(ops)),
        ))
    }
}

/// `SET key value`, on an `allocated` family: `+OK` once every copy applied it or a failed copy
/// is queued for retry.
pub(crate) struct Set {
    /// The key as sent (checked after the options are refused).
    key: Bytes,
    /// The value.
    value: Bytes,
}

impl Parse for Set {
    fn parse(args: &mut Args) -> Result<Set, RespError> {
        let key = args.next_bytes()?;
        let value = args.next_bytes()?;
        if let Some(option) = args.next_optional() {
            return Err(RespError::err(format!(
                "SET option '{}' is not supported by hotsplit (no EX, PX, EXAT, PXAT, NX, XX, GET or KEEPTTL): a key lives its family's ttl",
                String::from_utf8_lossy(&option[..option.len().min(32)])
            )));
        }
        Ok(Set { key, value })
    }
}

impl Store for Set {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let key = key_arg(&self.key)?;
        let value = Edit::Value(self.value);
        door.core
            .ops()
            .check_edit(&key, None, &value)
            .map_err(|error| {
                RespError::versionless(&error, "SET", "HOTSPLIT.PUBLISH key version value")
            })?;
        let outcome = door
            .edit(conn, edit_call(key, None, value, None, deadline), None)
            .await?;
        written(&outcome).map(|()| Reply::OK)
    }
}

/// `DEL key…` and `UNLINK key…`, on `allocated` families: how many invalidations landed.
pub(crate) struct Del {
    /// `del` or `unlink`: the refusal names it.
    name: &'static str,
    /// The keys as sent.
    keys: std::vec::IntoIter<Bytes>,
}

impl Parse for Del {
    fn parse(args: &mut Args) -> Result<Del, RespError> {
        Ok(Del {
            name: args.name(),
            keys: args.rest(),
        })
    }
}

impl Store for Del {
    async fn apply(
        self,
        door: &Door,
        conn: &mut ConnState,
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let command = self.name.to_ascii_uppercase();
        let keys = self
            .keys
            .map(|raw| key_arg(&raw))
            .collect::<Result<Vec<Key>, RespError>>()?;
        // Every key is checked before any is written, so a refusal deletes nothing.
        for key in &keys {
            door.core
                .ops()
                .check_edit(key, None, &Edit::Tombstone)
                .map_err(|error| {
                    RespError::versionless(&error, &command, "HOTSPLIT.INVALIDATE key version")
                })?;
        }
        let mut deleted = 0;
        for key in keys {
            let call = edit_call(key, None, Edit::Tombstone, None, deadline);
            let outcome = door.edit(conn, call, None).await?;
            written(&outcome)?;
            if outcome.floor.is_some() {
                deleted += 1;
            }
        }
        Ok(Reply::Int(deleted))
    }
}

/// A publish or invalidate of `key` as a command parsed it; the door fills in the writer.
fn edit_call(
    key: Key,
    version: Option<Version>,
    edit: Edit,
    sync: Option<SyncReplicas>,
    deadline: Option<Deadline>,
) -> PublishCall {
    PublishCall {
        key,
        version,
        edit,
        writer: Writer::default(),
        sync,
        deadline,
    }
}

/// Whether a `SET` or `DEL` write counts as done, else its error (the report's own shortfall).
fn written(outcome: &PublishOutcome) -> Result<(), RespError> {
    let Some(shortfall) = outcome.report.shortfall() else {
        return Ok(());
    };
    Err(match outcome.status {
        PublishStatus::Incomplete => {
            RespError::new(Prefix::Unavailable, format!("{shortfall}; retry"))
        }
        _ => RespError::err(shortfall),
    })
}
