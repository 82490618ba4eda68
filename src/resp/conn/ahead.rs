//! A pipelined batch's `GET`s that need the store, sent together and answered in order.
//!
//! Run one at a time, a batch of `GET`s waits for one store round trip per command, and a
//! connection has at most one read in flight: 16 pipelined decision reads cost 16 round trips,
//! where a proxy sends them together. When a plain `GET` the near cache cannot answer starts a
//! batch's run, the `GET`s after it (up to [`RUN_MAX`], while the in-flight bound has room:
//! [`crate::door::InFlightBound::enter_ahead`]) are started with it: each read's floors are
//! taken at once (`Ops::begin_ahead`), their store reads are awaited together, then each is
//! concluded in its turn, in the order the commands came (`Ops::conclude_ahead`).
//!
//! # Invariants
//! - **Answered in order, as if run in order.** A read's after-answer step (the floors it
//!   leaves: the session's, the high-water, pins) runs in its turn. A read whose floors moved
//!   between its start and its turn (a `GET` before it in the run raised the key's high-water,
//!   a floor expired) drops what it fetched, having left nothing, and is read again then, so
//!   every answer is one the same read run in its turn could have given, a moment earlier.
//!   Counted: `hotsplit_resp_gets_ahead_total` and `hotsplit_resp_gets_read_again_total`.
//! - **Each command its own slot**, and the run's deadline, taken when the run starts
//!   (`server.request_deadline` from then: the commands of a run arrived together). The run's
//!   reads are awaited under that one timer, not a timer each; when it passes, every read of
//!   the run still waiting is answered `DeadlineExceeded`, as each would have been. A `GET`
//!   that finds the bound's half taken ends the run and goes the usual way after it.
//! - Nothing but plain `GET`s joins a run (not inside `MULTI`, not on a tracking or subscribed
//!   connection); the first other command ends it, and runs after the run's replies.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::super::codec::ProtocolError;
use super::super::command::After;
use super::super::metrics::command_index;
use super::{Connection, End, Serving};
use crate::deadline::{self, Deadline};
use crate::door::InFlight;
use crate::ops::Ahead;

/// The most `GET`s one run sends together.
const RUN_MAX: usize = 32;

/// One `GET` of a run: its read and its slot.
pub(super) struct Started {
    /// The read, started.
    ahead: Ahead,
    /// Its place under `server.max_in_flight`, given back when it is answered.
    slot: Option<InFlight>,
}

/// A run's start, shared by its `GET`s: the clock read once for all of them.
#[derive(Clone, Copy)]
pub(super) struct RunStart {
    /// When the run started (each command's duration is counted from it).
    at: Instant,
    /// The run's deadline (`server.request_deadline` from `at`).
    deadline: Option<Deadline>,
}

/// What ended a run, for the batch to go on with.
pub(super) enum Next {
    /// No whole command is left in the input.
    Nothing,
    /// A command that did not join the run: the batch runs it next.
    Command(Vec<Bytes>),
    /// The input broke the protocol after the run's commands.
    Broken(ProtocolError),
    /// A reply closed the connection.
    Closed(End),
}

impl Connection {
    /// A run's start, now.
    pub(super) fn run_start(&self) -> RunStart {
        let at = Instant::now();
        RunStart {
            at,
            deadline: self
                .overload
                .request_deadline()
                .map(|budget| Deadline::starting_at(at, budget)),
        }
    }

    /// Starts `args` as a `GET` of the run started at `start` when it is a plain `GET` and a
    /// slot is free (`first`: any slot under the bound; later ones:
    /// [`crate::door::InFlightBound::enter_ahead`]); `None`, having changed nothing,
    /// otherwise.
    pub(super) fn start_ahead(
        &self,
        serving: &mut Serving,
        args: &[Bytes],
        start: RunStart,
        first: bool,
    ) -> Option<Started> {
        let slot = if first {
            Arc::clone(&self.overload).enter()
        } else {
            Arc::clone(&self.overload).enter_ahead()
        }
        .ok()?;
        let ahead = self
            .door
            .get_ahead(&mut serving.state, args, start.deadline)?;
        Some(Started { ahead, slot })
    }

    /// Runs a batch's run of `GET`s from `first`, started at `start`: takes the `GET`s that
    /// follow it in the input into it, awaits their reads together under the run's deadline,
    /// and encodes each reply in order (writing when the replies held pass the connection's
    /// bound). Answers what ended the run.
    pub(super) async fn run_ahead<S>(
        &self,
        stream: &mut S,
        serving: &mut Serving,
        start: RunStart,
        first: Started,
    ) -> std::io::Result<Next>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut run = vec![first];
        let mut next = Next::Nothing;
        while run.len() < RUN_MAX {
            match serving.parser.next(&mut serving.input) {
                Ok(Some(args)) => match self.start_ahead(serving, &args, start, false) {
                    Some(started) => {
                        serving.parser.recycle(args);
                        run.push(started);
                    }
                    None => {
                        next = Next::Command(args);
                        break;
                    }
                },
                Ok(None) => break,
                Err(err) => {
                    next = Next::Broken(err);
                    break;
                }
            }
        }
        let door = &self.door;
        if run.len() > 1 {
            self.metrics.gets_ahead(run.len() as u64);
        }
        // Every read of the run bounded by the run's deadline, under one timer.
        let fetched = deadline::within(start.deadline, async {
            Ok(if let [only] = run.as_slice() {
                // Alone (no other GET was pipelined after it): it is `Ops::read`, run in
                // place.
                vec![door.fetch_ahead(&only.ahead).await]
            } else {
                let reads = run.iter().map(|started| door.fetch_ahead(&started.ahead));
                futures_util::future::join_all(reads).await
            })
        })
        .await
        .unwrap_or_else(|exceeded| run.iter().map(|_| Err(exceeded.clone())).collect());
        let index = command_index(b"get");
        for (turn, (started, fetched)) in run.into_iter().zip(fetched).enumerate() {
            if serving.output.len() >= self.settings.max_output {
                self.write(stream, &mut serving.output, serving.auth_deadline)
                    .await?;
                serving.state.tracking.outbox.wrote();
            }
            let Started { ahead, slot } = started;
            let (reply, again) = door
                .conclude_get(&mut serving.state, ahead, fetched, turn > 0)
                .await;
            drop(slot);
            if again {
                self.metrics.get_read_again();
            }
            self.metrics.command(index, start.at.elapsed());
            if self.answer(&serving.state, reply, After::Continue, &mut serving.output)
                == After::Close
            {
                // Any later reply of the run is dropped with the connection, as the commands
                // after a closing one are.
                return Ok(Next::Closed(End::Closed));
            }
        }
        Ok(next)
    }
}
