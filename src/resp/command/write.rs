//! The writes: `HOTSPLIT.PUBLISH`, `HOTSPLIT.INVALIDATE`, and `SET`, `DEL`, `UNLINK` on
//! `allocated` families, each one [`crate::ops::Ops::publish`] per key. A write goes as the
//! connection's client id (explicit or its own), so its reads hold the version it wrote.
//! `HOTSPLIT.PUBLISH` and `HOTSPLIT.INVALIDATE` take a per-call session as `HOTSPLIT.READ`
//! does (`SESSION tok…`, last; see `read.rs`): the written floor goes into it, and the report's
//! `session` field is the call's new token.

use bytes::Bytes;

use super::errors::{Prefix, RespError};
use super::read::{key, split_session, version_arg, version_reply, CallSession};
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

    /// A version argument: `*` (none: the family allocates it), or a version. Whether the
    /// key's family takes that is the operations layer's rule ([`crate::ops::Ops::check_edit`]).
    fn version_arg_or_star(raw: &Bytes) -> Result<Option<Version>, RespError> {
        match raw.as_ref() {
            b"*" => Ok(None),
            _ => version_arg(raw).map(Some),
        }
    }

    /// `HOTSPLIT.PUBLISH key version value [SYNC replicas timeout_ms] [SESSION tok…]`.
    pub(crate) async fn hotsplit_publish(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let (args, tokens) = split_session(args, 4, |name| {
            if name.eq_ignore_ascii_case(b"SYNC") {
                3
            } else {
                1
            }
        });
        let key = key(&args[1])?;
        let version = Door::version_arg_or_star(&args[2])?;
        let sync = match args.get(4..).unwrap_or_default() {
            [] => None,
            [option, replicas, timeout_ms] if option.eq_ignore_ascii_case(b"SYNC") => {
                let number = |raw: &Bytes| {
                    std::str::from_utf8(raw)
                        .ok()
                        .and_then(|text| text.parse::<u64>().ok())
                        .ok_or_else(RespError::not_integer)
                };
                let replicas =
                    u32::try_from(number(replicas)?).map_err(|_| RespError::not_integer())?;
                Some(SyncReplicas {
                    replicas,
                    timeout_ms: number(timeout_ms)?,
                })
            }
            _ => return Err(RespError::syntax()),
        };
        let Some(value) = args.get(3) else {
            return Err(RespError::arity("hotsplit.publish"));
        };
        let value = Edit::Value(value.clone());
        let mut call = tokens.map(|tokens| CallSession::new(self.core.ops(), tokens));
        let per_call = call.as_mut().map(|call| &mut call.session);
        let outcome = self
            .edit(
                conn,
                edit_call(key, version, value, sync, deadline),
                per_call,
            )
            .await?;
        Ok(report_reply(
            &outcome,
            call.map(|call| call.reply(self.core.ops())),
        ))
    }

    /// `HOTSPLIT.INVALIDATE key version [SESSION tok…]`.
    pub(crate) async fn hotsplit_invalidate(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let (args, tokens) = split_session(args, 3, |_| 1);
        if args.len() != 3 {
            return Err(RespError::syntax());
        }
        let key = key(&args[1])?;
        let version = Door::version_arg_or_star(&args[2])?;
        let mut call = tokens.map(|tokens| CallSession::new(self.core.ops(), tokens));
        let per_call = call.as_mut().map(|call| &mut call.session);
        let outcome = self
            .edit(
                conn,
                edit_call(key, version, Edit::Tombstone, None, deadline),
                per_call,
            )
            .await?;
        Ok(report_reply(
            &outcome,
            call.map(|call| call.reply(self.core.ops())),
        ))
    }

    /// `SET key value`, on an `allocated` family: `+OK` once every copy applied it or a failed
    /// copy is queued for retry.
    pub(crate) async fn set(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        if args.len() > 3 {
            return Err(RespError::err(format!(
                "SET option '{}' is not supported by hotsplit (no EX, PX, EXAT, PXAT, NX, XX, GET or KEEPTTL): a key lives its family's ttl",
                String::from_utf8_lossy(&args[3][..args[3].len().min(32)])
            )));
        }
        let key = key(&args[1])?;
        let value = Edit::Value(args[2].clone());
        self.core
            .ops()
            .check_edit(&key, None, &value)
            .map_err(|error| {
                RespError::versionless(&error, "SET", "HOTSPLIT.PUBLISH key version value")
            })?;
        let outcome = self
            .edit(conn, edit_call(key, None, value, None, deadline), None)
            .await?;
        written(&outcome).map(|()| Reply::OK)
    }

    /// `DEL key…` and `UNLINK key…`, on `allocated` families: how many invalidations landed.
    pub(crate) async fn del(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Result<Reply, RespError> {
        let command = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let keys = args[1..]
            .iter()
            .map(key)
            .collect::<Result<Vec<Key>, RespError>>()?;
        // Every key is checked before any is written, so a refusal deletes nothing.
        for key in &keys {
            self.core
                .ops()
                .check_edit(key, None, &Edit::Tombstone)
                .map_err(|error| {
                    RespError::versionless(&error, &command, "HOTSPLIT.INVALIDATE key version")
                })?;
        }
        let mut deleted = 0;
        for key in keys {
            let outcome = self
                .edit(
                    conn,
                    edit_call(key, None, Edit::Tombstone, None, deadline),
                    None,
                )
                .await?;
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
