//! Transactions: `MULTI` queues, `EXEC` runs the queue in order — without isolation: another
//! connection's commands may run between two of them — and `DISCARD` drops it.

use bytes::Bytes;

use super::errors::{Prefix, RespError};
use super::table::{Cmd, Spec};
use super::{After, ConnState, Door};
use crate::deadline::Deadline;
use crate::resp::reply::Reply;

/// The most commands one transaction queues: past it the transaction is aborted, so a client
/// cannot grow a connection's memory without bound.
pub(crate) const MAX_QUEUED: usize = 10_000;

/// An open transaction.
#[derive(Debug, Default)]
pub(crate) struct Multi {
    /// The commands queued, in order.
    queued: Vec<Vec<Bytes>>,
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
        let cmd = spec.map(|spec| spec.cmd);
        let reply = match cmd {
            Some(Cmd::Quit | Cmd::Reset) => return None,
            Some(Cmd::Exec) if args.len() == 1 => return Some(self.exec(conn, deadline).await),
            Some(Cmd::Discard) if args.len() == 1 => {
                conn.multi = None;
                Reply::OK
            }
            Some(Cmd::Multi) => RespError::err("MULTI calls can not be nested").into(),
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
        if spec.cmd == Cmd::Refused {
            return Err(RespError::err(spec.refusal));
        }
        let Some(multi) = conn.multi.as_mut() else {
            return Ok(());
        };
        if multi.queued.len() >= MAX_QUEUED {
            return Err(RespError::err(format!(
                "a transaction queues at most {MAX_QUEUED} commands"
            )));
        }
        multi.queued.push(args.to_vec());
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
        let mut replies = Vec::with_capacity(multi.queued.len());
        let mut after = After::Continue;
        for args in multi.queued {
            let spec = super::table::find(&args[0]);
            let (reply, then) = self.run(conn, spec, args, deadline).await;
            replies.push(reply);
            if then == After::Close {
                after = After::Close;
            }
        }
        (Reply::Array(replies), after)
    }
}
