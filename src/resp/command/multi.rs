//! Transactions: `MULTI` queues, `EXEC` runs the queue in order — without isolation: another
//! connection's commands may run between two of them — and `DISCARD` drops it.
//!
//! A queue is bounded by its bytes (`resp.max_queued_bytes`, the queued arguments copied out of
//! the read buffer, so they are all it holds) and by [`MAX_QUEUED`] commands; `EXEC`'s reply
//! by `resp.max_reply_bytes`. `EXEC` stops before a queued command once the token the
//! connection authenticated with is revoked, or once the replies so far pass the reply bound,
//! and then answers an error, never a part of its replies.

use bytes::Bytes;

use super::errors::{Prefix, RespError};
use super::parse::{Args, Local, Parse, Run};
use super::table::Spec;
use super::{After, ConnState, Door};
use crate::deadline::Deadline;
use crate::resp::metrics::Budget;
use crate::resp::reply::Reply;

/// The most commands one transaction queues: past it the transaction is aborted, so a client
/// cannot grow a connection's memory without bound.
pub(crate) const MAX_QUEUED: usize = 10_000;

/// What a queued command is counted for beyond its arguments' bytes (its slots).
const QUEUED_OVERHEAD: usize = 32;

/// `UNWATCH`: `+OK` (there is never a `WATCH` to forget).
pub(crate) struct Unwatch;

impl Parse for Unwatch {
    fn parse(_args: &mut Args) -> Result<Unwatch, RespError> {
        Ok(Unwatch)
    }
}

impl Local for Unwatch {
    fn apply(self, _door: &Door, _conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(Reply::OK)
    }
}

/// An open transaction.
#[derive(Debug, Default)]
pub(crate) struct Multi {
    /// The commands queued, in order.
    queued: Vec<Vec<Bytes>>,
    /// The bytes they hold, counted against `resp.max_queued_bytes`.
    bytes: usize,
    /// Whether a queued command was refused: `EXEC` then answers `EXECABORT`.
    failed: bool,
}

impl Door {
    /// A command sent while a transaction is open: `EXEC`, `DISCARD` and nested `MULTI` are
    /// answered here, `QUIT` and `RESET` run at once (`None`), anything else is checked and
    /// queued.
    pub(super) async fn in_multi(
        &self,
        conn: &mut ConnState,
        spec: Option<&'static Spec>,
        args: &[Bytes],
        deadline: Option<Deadline>,
    ) -> Option<(Reply, After)> {
        let run = spec.map(|spec| spec.run);
        let reply = match run {
            Some(Run::Quit | Run::Reset) => return None,
            // Boxed: `EXEC` is rare, and its future (holding a queued command's) would otherwise
            // be a part of every command's.
            Some(Run::Exec) if args.len() == 1 => {
                return Some(box_in_place!(self.exec(conn, deadline)).await)
            }
            Some(Run::Discard) if args.len() == 1 => {
                conn.multi = None;
                Reply::OK
            }
            Some(Run::Multi) => RespError::err("MULTI calls can not be nested").into(),
            _ => match self.queue(conn, spec, args) {
                Ok(()) => Reply::Simple("QUEUED"),
                Err(error) => {
                    if let Some(multi) = conn.multi.as_mut() {
                        multi.failed = true;
                    }
                    error.into()
                }
            },
        };
        Some((reply, After::Continue))
    }

    /// Checks a command as it would run (name, arity, token, not refused) and queues it.
    fn queue(
        &self,
        conn: &mut ConnState,
        spec: Option<&'static Spec>,
        args: &[Bytes],
    ) -> Result<(), RespError> {
        let spec = self.admit(conn, spec, args)?;
        if let Run::Refused(refusal) = spec.run {
            return Err(RespError::err(refusal));
        }
        let Some(multi) = conn.multi.as_mut() else {
            return Ok(());
        };
        if multi.failed {
            // Its EXEC answers EXECABORT: nothing more is kept.
            return Ok(());
        }
        if multi.queued.len() >= MAX_QUEUED {
            return Err(RespError::err(format!(
                "a transaction queues at most {MAX_QUEUED} commands"
            )));
        }
        let bytes = args
            .iter()
            .map(|arg| arg.len() + QUEUED_OVERHEAD)
            .sum::<usize>();
        let max = self.budgets.max_queued_bytes;
        if multi.bytes.saturating_add(bytes) > max {
            // The queue is dropped now (its EXEC answers EXECABORT): it holds nothing more.
            multi.queued = Vec::new();
            multi.bytes = 0;
            self.exceeded(Budget::Queued);
            return Err(RespError::err(format!(
                "a transaction queues at most {max} bytes (resp.max_queued_bytes): it is discarded"
            )));
        }
        multi.bytes += bytes;
        // Copied: a slice would pin the whole read buffer it came in.
        multi
            .queued
            .push(args.iter().map(|arg| Bytes::copy_from_slice(arg)).collect());
        Ok(())
    }

    /// `EXEC`: the queued commands' replies, in order, each run as if sent alone.
    async fn exec(&self, conn: &mut ConnState, deadline: Option<Deadline>) -> (Reply, After) {
        let Some(multi) = conn.multi.take() else {
            return (RespError::err("EXEC without MULTI").into(), After::Continue);
        };
        if multi.failed {
            let abort = RespError::new(
                Prefix::ExecAbort,
                "Transaction discarded because of previous errors.",
            );
            return (abort.into(), After::Continue);
        }
        let queued = multi.queued.len();
        let mut replies = Vec::with_capacity(queued);
        let mut size = 0usize;
        let mut after = After::Continue;
        // The token table the connection's token was last checked against: checked before
        // the first queued command, and again after a reload stored a new one (an unchanged
        // table costs a pointer compare).
        let mut checked = None;
        for (at, args) in multi.queued.into_iter().enumerate() {
            let table = self.core.tokens().load_full();
            let changed = match (&checked, &table) {
                (Some(Some(before)), Some(now)) => !std::sync::Arc::ptr_eq(before, now),
                (Some(None), None) => false,
                _ => true,
            };
            checked = Some(table);
            if changed && !self.still_authorized(conn) {
                let revoked = RespError::err(format!(
                    "EXEC stopped before queued command {} of {queued}: the token this connection authenticated with was revoked",
                    at + 1
                ));
                return (revoked.into(), After::Close);
            }
            let spec = args.first().and_then(|name| super::table::find(name));
            let (reply, then) = self.run(conn, spec, args, deadline).await;
            size = size.saturating_add(reply.size());
            if size > self.budgets.max_reply_bytes {
                self.exceeded(Budget::Reply);
                let over = RespError::err(format!(
                    "EXEC stopped after queued command {} of {queued}: its replies passed resp.max_reply_bytes ({} bytes); the commands before it ran, those after it did not",
                    at + 1,
                    self.budgets.max_reply_bytes
                ));
                return (over.into(), after);
            }
            replies.push(reply);
            if then == After::Close {
                after = After::Close;
            }
        }
        (Reply::Array(replies), after)
    }
}
