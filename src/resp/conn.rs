//! One Redis-protocol connection: read, parse every whole command, run them in order, write
//! their replies together.
//!
//! The loop reads into a [`BytesMut`], takes every whole command out of it ([`Parser`]) and runs
//! each through [`Door::execute`] in order, encoding each reply into one output buffer; when
//! the input holds no whole command more, the buffer is written in one write (a pipelined batch
//! costs one syscall), and the loop waits for more input.
//!
//! # Invariants
//! - **One command, one slot, one deadline.** Each command takes its own slot of
//!   `server.max_in_flight` (the counter HTTP requests take, so both doors together hold at
//!   most the bound) and its own `server.request_deadline`, from when it starts (a command late
//!   in a long batch is not charged for those before it). A command refused at the bound is
//!   answered `OVERLOADED …` and does nothing; the next command is still tried.
//! - **Bounded memory.** Input: every length is bounded by the parser (by Redis's tighter
//!   pre-authentication bounds until a connection on an instance with tokens authenticates),
//!   the command being
//!   received by `resp.max_pending_bytes`, and the buffer grows with the bytes that arrive,
//!   never ahead of them by more than a read's room. Output: once the replies held pass
//!   `resp.max_output_bytes` the rest of the batch waits until they are written; a write that
//!   makes no progress for `resp.write_timeout` closes the connection. An idle connection holds
//!   no output buffer and at most a small input one.
//! - **Arguments are slices of the read buffer.** A command that keeps an argument beyond its
//!   reply (in a cache, a table) must copy it, or it pins the whole read buffer.
//! - **Closing.** A protocol error is answered `-ERR Protocol error: …` after the replies before
//!   it, then the connection closes; [`After::Close`] writes its reply, then closes. When a
//!   reload stores a new token table, the listener tells every connection, idle ones included,
//!   and one that [`Door::still_authorized`] no longer admits closes before its next command. On
//!   shutdown a connection finishes the batch it is running, writes it, and closes; an idle one
//!   closes at once. `resp.idle_timeout` (off by default) closes a connection that sent nothing
//!   for that long.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tracing::Instrument;

use super::codec::{encode, Limits, Parser, ProtocolError};
use super::metrics::{command_index, RespMetrics};
use super::slots::{Signal, Slot};
use super::{After, ConnState, Door, Reply};
use crate::deadline::Deadline;
use crate::door::InFlightBound;

/// The reply to a command refused at `server.max_in_flight`.
pub(super) const OVERLOADED: &str = "OVERLOADED too many requests in flight, retry later";

/// How much room a read has at least.
const SMALL_READ: usize = 4 * 1024;

/// How much room a read has after a read that filled its room (a pipelining client).
const LARGE_READ: usize = 64 * 1024;

/// An output buffer larger than this is given back once written, so an idle connection does
/// not keep the memory of its largest batch.
const KEEP_OUTPUT: usize = 64 * 1024;

/// How long a connection closed by the server keeps reading what the client still sends.
const LINGER: Duration = Duration::from_secs(1);

/// How many bytes it reads at most meanwhile.
const LINGER_BYTES: usize = 1024 * 1024;

/// After the write side is shut down, reads and drops what the client still sends (within
/// [`LINGER`] and [`LINGER_BYTES`], until it closes): a socket closed with unread input sends a
/// reset, and a reset can make the client's kernel drop the last reply (the protocol error it
/// should read) before the client reads it.
async fn linger<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut scratch = vec![0u8; 16 * 1024];
    let mut left = LINGER_BYTES;
    let _ = tokio::time::timeout(LINGER, async {
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(read) => left = left.saturating_sub(read),
            }
        }
    })
    .await;
}

/// The connection settings of the listener, shared by its connections.
#[derive(Debug)]
pub(super) struct Settings {
    /// The parser's bounds.
    pub(super) limits: Limits,
    /// `resp.max_pending_bytes`.
    pub(super) max_pending: usize,
    /// `resp.max_output_bytes`.
    pub(super) max_output: usize,
    /// `resp.write_timeout`.
    pub(super) write_timeout: Duration,
    /// `resp.idle_timeout`; `None` when `0s`.
    pub(super) idle_timeout: Option<Duration>,
    /// How long a TLS handshake may take (`server.header_read_timeout`, as on HTTP).
    pub(super) handshake_timeout: Duration,
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client closed it.
    Eof,
    /// A command answered [`After::Close`].
    Closed,
    /// The input broke the protocol or a bound.
    Protocol,
    /// A reload revoked its token.
    Revoked,
    /// The listener shut down.
    Shutdown,
    /// `resp.idle_timeout` passed.
    Idle,
}

/// One connection, ready to serve.
pub(super) struct Connection {
    /// Its id (`CLIENT ID`, the log span).
    pub(super) id: u64,
    /// The client's address (the log span).
    pub(super) peer: Option<std::net::SocketAddr>,
    /// The commands.
    pub(super) door: Door,
    /// The limits and timeouts.
    pub(super) settings: Arc<Settings>,
    /// The in-flight bound and the request deadline (HTTP's).
    pub(super) overload: Arc<InFlightBound>,
    /// The door's metrics.
    pub(super) metrics: RespMetrics,
    /// How the listener tells it to re-check its token or to shut down.
    pub(super) signal: Arc<Signal>,
    /// Its place under `resp.max_connections`, released when the connection ends.
    pub(super) _slot: Slot,
}

impl Connection {
    /// Serves `stream` until the client closes it, a command closes it, or the listener tells
    /// it to; then shuts the stream down.
    pub(super) async fn serve<S>(self, mut stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let span = match self.peer {
            Some(peer) => tracing::info_span!("resp", conn = self.id, %peer),
            None => tracing::info_span!("resp", conn = self.id),
        };
        async move {
            tracing::debug!("connection opened");
            let end = self.run(&mut stream).await;
            match &end {
                Ok(end) => tracing::debug!(?end, "connection closed"),
                Err(err) => tracing::debug!(error = %err, "connection closed"),
            }
            let _ = tokio::time::timeout(self.settings.write_timeout, stream.shutdown()).await;
            if matches!(end, Ok(End::Protocol | End::Closed)) {
                linger(&mut stream).await;
            }
        }
        .instrument(span)
        .await;
    }

    /// The loop; see the module documentation.
    async fn run<S>(&self, stream: &mut S) -> io::Result<End>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let settings = &self.settings;
        let mut state = ConnState::new(self.id);
        let mut parser = Parser::new(settings.limits);
        let mut input = BytesMut::new();
        let mut output = BytesMut::new();
        let mut room = SMALL_READ;
        loop {
            let mut end = None;
            loop {
                parser.set_unauthenticated(self.must_authenticate(&state));
                let args = match parser.next(&mut input) {
                    Ok(Some(args)) => args,
                    Ok(None) => break,
                    Err(err) => {
                        end = Some(self.protocol_error(&err, &mut output));
                        break;
                    }
                };
                if output.len() >= settings.max_output {
                    self.write(stream, &mut output).await?;
                }
                if self.signal.take_recheck() && !self.door.still_authorized(&state) {
                    end = Some(self.revoked());
                    break;
                }
                if self.command(&mut state, args, &mut output).await == After::Close {
                    end = Some(End::Closed);
                    break;
                }
            }
            if end.is_none() && parser.pending(&input) > settings.max_pending {
                end = Some(self.protocol_error(&ProtocolError::TooBigRequest, &mut output));
            }
            if !output.is_empty() {
                self.write(stream, &mut output).await?;
            }
            if let Some(end) = end {
                return Ok(end);
            }
            if self.signal.is_shut_down() {
                return Ok(End::Shutdown);
            }
            if input.is_empty() && input.capacity() > LARGE_READ {
                input = BytesMut::new();
            }
            // Room for what arrives, not for what a length declares: a `$1048576` with nothing
            // after it costs a read's room, not a megabyte, until the bytes come.
            input.reserve(parser.wanted(&input).min(LARGE_READ).max(room));
            let spare = input.capacity() - input.len();
            let idle = async {
                match settings.idle_timeout {
                    Some(timeout) => tokio::time::sleep(timeout).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                read = stream.read_buf(&mut input) => {
                    let read = read?;
                    if read == 0 {
                        return Ok(End::Eof);
                    }
                    room = if read >= spare { LARGE_READ } else { SMALL_READ };
                }
                () = self.signal.notified() => {
                    if self.signal.is_shut_down() {
                        return Ok(End::Shutdown);
                    }
                    if self.signal.take_recheck() && !self.door.still_authorized(&state) {
                        return Ok(self.revoked());
                    }
                }
                () = idle => return Ok(End::Idle),
            }
        }
    }

    /// Runs one command with its own in-flight slot and deadline, and encodes its reply into
    /// `output`.
    async fn command(
        &self,
        state: &mut ConnState,
        args: Vec<bytes::Bytes>,
        output: &mut BytesMut,
    ) -> After {
        let index = args.first().map_or(usize::MAX, |name| command_index(name));
        let started = Instant::now();
        let (reply, after) = match self.overload.enter() {
            Ok(slot) => {
                let deadline = self.overload.request_deadline().map(Deadline::after);
                // Boxed: the command's future is only as large as it needs while it runs, not
                // a part of every idle connection's task.
                let answered = Box::pin(self.door.execute(state, args, deadline)).await;
                drop(slot);
                answered
            }
            Err(_bound) => (Reply::error(OVERLOADED), After::Continue),
        };
        self.metrics.command(index, started.elapsed());
        if let Reply::Error(text) = &reply {
            self.metrics.error(text);
        }
        encode(&reply, state.proto, output);
        after
    }

    /// Whether `state` must still authenticate: tokens are configured and it has none.
    fn must_authenticate(&self, state: &ConnState) -> bool {
        state.auth.is_none() && self.door.core().tokens().load().is_some()
    }

    /// Answers a protocol error (after the replies before it) and ends the connection.
    fn protocol_error(&self, err: &ProtocolError, output: &mut BytesMut) -> End {
        tracing::debug!(error = %err, "protocol error: closing the connection");
        self.metrics.protocol_error();
        let reply = Reply::error(err.reply_text());
        self.metrics.error(&err.reply_text());
        encode(&reply, super::Proto::Resp2, output);
        End::Protocol
    }

    /// Ends a connection whose token a reload revoked.
    fn revoked(&self) -> End {
        tracing::info!("the token this connection authenticated with was revoked: closing it");
        self.metrics.revoked();
        End::Revoked
    }

    /// Writes all of `output`; a write (or flush) that makes no progress for
    /// `resp.write_timeout` fails with [`io::ErrorKind::TimedOut`].
    async fn write<S>(&self, stream: &mut S, output: &mut BytesMut) -> io::Result<()>
    where
        S: AsyncWrite + Unpin,
    {
        let timeout = self.settings.write_timeout;
        let stalled = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for resp.write_timeout",
            )
        };
        while !output.is_empty() {
            let written = tokio::time::timeout(timeout, stream.write(output))
                .await
                .map_err(|_| stalled())??;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            output.advance(written);
        }
        tokio::time::timeout(timeout, stream.flush())
            .await
            .map_err(|_| stalled())??;
        if output.capacity() > KEEP_OUTPUT {
            *output = BytesMut::new();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
