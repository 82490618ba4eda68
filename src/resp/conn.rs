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
//!   answered `OVERLOADED …` and does nothing; the next command is still tried. A `GET` the
//!   near cache answers ([`Door::get_now`]: no store call, nothing to wait on) takes neither:
//!   it is answered inline, and counted once per batch. `GET`s that need the store and come
//!   one after another are sent together and answered in order, each as if run in its turn
//!   (`ahead`: each takes its own slot; they share the deadline of the run's start).
//! - **One clock for the hits answered one after another.** The hits answered inline in a row
//!   share one reading of the clocks ([`crate::near::Now`]: the floors' expiry, the near-cache
//!   entry's expiry and age): it is read after every command of the batch arrived and before
//!   any of their replies leaves, so each hit is decided as of a moment within its own time in
//!   the door (an entry's age by it is at most the few microseconds of the hits before it
//!   younger than at its own turn). Anything that waits (a store read, a write of replies, a
//!   yield) reads it again.
//! - **Bounded memory.** Input: every length is bounded by the parser (by Redis's tighter
//!   pre-authentication bounds until a connection on an instance with tokens authenticates),
//!   the command being received (its declared bulk lengths included) by
//!   `resp.max_pending_bytes` and, with every other connection's, by `resp.max_receiving_bytes`,
//!   and it must arrive within `resp.receive_timeout` of its first byte. The buffer grows with
//!   the bytes that arrive, never ahead of them by more than a read's room, until a read's
//!   worth of a large bulk argument has come: then the rest of it is reserved at once.
//!   Output: once the replies held pass `resp.max_output_bytes` (16 KiB before `AUTH`) the
//!   rest of the batch waits until they are written; a write that makes no progress for
//!   `resp.write_timeout` (or is still waiting at `resp.auth_timeout` before `AUTH`) closes the
//!   connection; one reply is at most `resp.max_reply_bytes`. An idle connection holds no
//!   output buffer and at most a small input one.
//! - **Before `AUTH`** (with tokens configured): every command but `AUTH`, `HELLO`, `QUIT` and
//!   `RESET` is answered `NOAUTH` before its name is looked up; a connection that has not
//!   authenticated within `resp.auth_timeout` is answered `NOAUTH …` and closed; each refused
//!   `AUTH` is counted and its reply delayed (100 ms more for each failure on the connection,
//!   at most 2 s).
//! - **Arguments are slices of the read buffer.** A command that keeps an argument beyond its
//!   reply (in a cache, a table) must copy it, or it pins the whole read buffer.
//! - **Invalidations between replies.** A connection's outbox (client-side caching,
//!   [`crate::tracking`]) is drained after each command, before its reply is encoded (so an
//!   answer that must not be cached is preceded by its key's invalidation, in the same write,
//!   and nothing is ever written inside a reply, an `EXEC`'s included), and while the
//!   connection is idle. An outbox that says close (it passed `resp.tracking_max_push_bytes`,
//!   or its `REDIRECT` target closed) closes the connection after what it holds is written.
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

use super::codec::{encode, encode_invalidation, Limits, Parser, ProtocolError};
use super::metrics::{command_index, Budget, RespMetrics};
use super::slots::{Signal, Slot};
use super::{After, ConnState, Door, Reply};
use crate::deadline::Deadline;
use crate::door::InFlightBound;
use crate::near::Now;
use crate::tracking::{Close, Outbox, Tracking};
use ahead::Next;
use held::{Receiving, Writing};

/// The reply to a command refused at `server.max_in_flight`.
pub(super) const OVERLOADED: &str = "OVERLOADED too many requests in flight, retry later";

/// How much room a read has at least.
const SMALL_READ: usize = 4 * 1024;

/// How much room a read has after a read that filled its room (a pipelining client).
const LARGE_READ: usize = 64 * 1024;

/// An output buffer larger than this is given back once written, so an idle connection does
/// not keep the memory of its largest batch.
const KEEP_OUTPUT: usize = 64 * 1024;

/// How many reply bytes a connection that must still authenticate holds before it writes them
/// and waits for the client to read them (its replies are `NOAUTH`s and handshakes).
const UNAUTHENTICATED_MAX_OUTPUT: usize = 16 * 1024;

/// The last words of an unauthenticated connection evicted to make room for a new one.
const EVICTED: &[u8] = b"-ERR max number of clients reached: the oldest connection not yet authenticated is closed to make room (resp.max_unauthenticated)\r\n";

/// Resolves at `at`, never when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

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
    /// `resp.max_receiving_bytes`; `None` when `0`.
    pub(super) max_receiving: Option<usize>,
    /// `resp.receive_timeout`.
    pub(super) receive_timeout: Duration,
    /// `resp.auth_timeout`.
    pub(super) auth_timeout: Duration,
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
    /// `resp.auth_timeout` passed without `AUTH`.
    AuthTimeout,
    /// It was evicted, unauthenticated, to make room for a new connection.
    Evicted,
    /// Its invalidations could not be delivered (`tracking::Close`).
    Pushes,
}

/// What one connection's loop carries from turn to turn.
struct Serving {
    /// The connection's state, as its commands left it.
    state: ConnState,
    /// The request parser (its bounds tighter until the connection authenticates).
    parser: Parser,
    /// What was read and not parsed yet.
    input: BytesMut,
    /// The replies not written yet.
    output: BytesMut,
    /// How much room the next read has at least ([`SMALL_READ`] or [`LARGE_READ`]).
    room: usize,
    /// This connection's share of `resp.max_receiving_bytes`.
    receiving: Receiving,
    /// When the command being received sent its first byte (`resp.receive_timeout`).
    receiving_since: Option<Instant>,
    /// Whether it has authenticated (or needs not).
    authenticated: bool,
    /// With tokens and no `AUTH` yet: when the connection must have authenticated by.
    auth_deadline: Option<Instant>,
    /// `GET`s answered from memory since they were last counted (once per batch).
    answered_now: u64,
    /// Its place in the tracking table, left when the connection ends.
    _registered: Registered,
}

/// A connection's place in the tracking table (a `REDIRECT` target is found there), left when
/// the connection ends, however it ends.
struct Registered {
    /// The table.
    tracking: Arc<Tracking>,
    /// The connection.
    id: u64,
    /// Its outbox: nobody waits for it to write once it closed.
    outbox: Arc<Outbox>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.tracking.close(self.id);
        self.outbox.gone();
    }
}

impl Serving {
    /// Gives back a large empty input buffer, and reserves room for the next read.
    fn make_room(&mut self) {
        let input = &mut self.input;
        if input.is_empty() && input.capacity() > LARGE_READ {
            *input = BytesMut::new();
        }
        // Room for what arrives, not for what a length declares: a `$1048576` with nothing
        // after it costs a read's room, not a megabyte, until the bytes come. Once a large
        // read's worth of a bulk argument has come, the rest of it (already counted against
        // the budgets by `pending`) is reserved at once: a buffer grown a read at a time
        // would be copied and freed at every doubling, and the allocator keeps freed pages
        // for a while, so RSS would reach a few times the bytes held.
        let wanted = self.parser.wanted(input);
        if wanted > 0 && input.len() >= LARGE_READ {
            input.reserve(wanted);
        } else {
            input.reserve(wanted.min(LARGE_READ).max(self.room));
        }
    }
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
    pub(super) slot: Slot,
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
            if matches!(end, Ok(End::Protocol | End::Closed | End::AuthTimeout)) {
                linger(&mut stream).await;
            }
        }
        .instrument(span)
        .await;
    }

    /// The loop; see the module documentation. Each turn: run every whole command received
    /// ([`Connection::batch`]), bound what is still being received
    /// ([`Connection::bound_receiving`]), write the replies, make room, wait for more input or
    /// a signal ([`Connection::wait`]).
    async fn run<S>(&self, stream: &mut S) -> io::Result<End>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut serving = self.start();
        loop {
            let batched = self.batch(stream, &mut serving).await;
            if serving.answered_now > 0 {
                self.metrics
                    .gets_answered_now(std::mem::take(&mut serving.answered_now));
            }
            let (end, parsed) = batched?;
            let end = self.bound_receiving(&mut serving, end, parsed);
            if !serving.output.is_empty() {
                self.write(stream, &mut serving.output, serving.auth_deadline)
                    .await?;
                serving.state.tracking.outbox.wrote();
            }
            if let Some(end) = end {
                return Ok(end);
            }
            if self.signal.is_shut_down() {
                return Ok(End::Shutdown);
            }
            serving.make_room();
            if let Some(end) = self.wait(stream, &mut serving).await? {
                return Ok(end);
            }
        }
    }

    /// The loop's state when the connection opens.
    fn start(&self) -> Serving {
        let state = ConnState::new(self.id);
        let tracking = self.door.core().ops().tracking().clone();
        tracking.open(self.id, &state.tracking.outbox);
        let registered = Registered {
            tracking,
            id: self.id,
            outbox: state.tracking.outbox.clone(),
        };
        let authenticated = !self.must_authenticate(&state);
        self.slot.set_authenticated(authenticated);
        Serving {
            state,
            parser: Parser::new(self.settings.limits),
            input: BytesMut::new(),
            output: BytesMut::new(),
            room: SMALL_READ,
            receiving: Receiving::new(self.metrics.clone()),
            receiving_since: None,
            authenticated,
            auth_deadline: (!authenticated).then(|| Instant::now() + self.settings.auth_timeout),
            answered_now: 0,
            _registered: registered,
        }
    }

    /// Runs every whole command in the input, in order, encoding their replies; answers how the
    /// connection ends, if it does, and whether a command was parsed.
    async fn batch<S>(
        &self,
        stream: &mut S,
        serving: &mut Serving,
    ) -> io::Result<(Option<End>, bool)>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut parsed = false;
        // A command a run of GETs parsed and did not take: it runs next.
        let mut held = None;
        // The clock of the hits answered inline one after another: read once for them (every
        // command here had arrived before it was read, and no reply has left), read again
        // after anything that waited.
        let mut clock: Option<Now> = None;
        loop {
            let authenticated = serving.authenticated;
            serving.parser.set_unauthenticated(!authenticated);
            let next = match held.take() {
                Some(args) => Ok(Some(args)),
                None => serving.parser.next(&mut serving.input),
            };
            let args = match next {
                Ok(Some(args)) => args,
                Ok(None) => return Ok((None, parsed)),
                Err(err) => {
                    let end = self.protocol_error(&err, &mut serving.output);
                    return Ok((Some(end), parsed));
                }
            };
            parsed = true;
            if !authenticated {
                // Before AUTH every command is answered at once (`NOAUTH`, the handshake):
                // a pipeline of thousands would run without a pause and keep the worker
                // from every other connection. Each spends the task's budget, so the task
                // yields every few dozen.
                tokio::task::consume_budget().await;
                clock = None;
            }
            let max_output = if authenticated {
                self.settings.max_output
            } else {
                UNAUTHENTICATED_MAX_OUTPUT
            };
            if serving.output.len() >= max_output {
                self.write(stream, &mut serving.output, serving.auth_deadline)
                    .await?;
                serving.state.tracking.outbox.wrote();
                clock = None;
            }
            if serving.auth_deadline.is_some_and(|at| at <= Instant::now()) {
                return Ok((Some(self.auth_timeout(&mut serving.output)), parsed));
            }
            if self.signal.take_recheck() && !self.door.still_authorized(&serving.state) {
                return Ok((Some(self.revoked()), parsed));
            }
            let failures = serving.state.auth_failures;
            let mut inline = false;
            let after = match self.door.get_now(&mut serving.state, &args, &mut clock) {
                // A hit answered from memory waits on nothing: no slot, deadline or timer.
                Some(reply) => {
                    inline = true;
                    serving.answered_now += 1;
                    serving.parser.recycle(args);
                    self.answer(&serving.state, reply, After::Continue, &mut serving.output)
                }
                // A GET that needs the store: with the GETs pipelined after it, sent together.
                None => {
                    clock = None;
                    let start = self.run_start();
                    match self.start_ahead(serving, &args, start, true) {
                        Some(first) => {
                            serving.parser.recycle(args);
                            match self.run_ahead(stream, serving, start, first).await? {
                                Next::Nothing => After::Continue,
                                Next::Command(args) => {
                                    held = Some(args);
                                    After::Continue
                                }
                                Next::Broken(err) => {
                                    let end = self.protocol_error(&err, &mut serving.output);
                                    return Ok((Some(end), parsed));
                                }
                                Next::Closed(end) => return Ok((Some(end), parsed)),
                            }
                        }
                        None => {
                            self.command(&mut serving.state, args, &mut serving.output)
                                .await
                        }
                    }
                }
            };
            if after == After::Close {
                return Ok((Some(End::Closed), parsed));
            }
            if serving.state.auth_failures > failures {
                self.auth_failed(serving.state.auth_failures, serving.auth_deadline)
                    .await;
            }
            // A hit answered inline changed nothing of the connection's authentication (a
            // GET authenticates nothing, and a token table changed since is seen by the next
            // command's own authorisation, which a hit passed): the next other command
            // updates it.
            if !inline {
                serving.authenticated =
                    self.authentication(&serving.state, &mut serving.auth_deadline, authenticated);
            }
        }
    }

    /// Bounds the command still being received (`resp.max_pending_bytes`, with every other
    /// connection's `resp.max_receiving_bytes`) unless the connection already ends (`end`),
    /// and restarts its `resp.receive_timeout` when a command was `parsed` or one starts.
    fn bound_receiving(
        &self,
        serving: &mut Serving,
        mut end: Option<End>,
        parsed: bool,
    ) -> Option<End> {
        let settings = &self.settings;
        let pending = serving.parser.pending(&serving.input);
        if end.is_none() && pending > settings.max_pending {
            self.metrics.exceeded(Budget::Pending);
            end = Some(self.protocol_error(&ProtocolError::TooBigRequest, &mut serving.output));
        }
        if end.is_none() && !serving.receiving.hold(pending, settings.max_receiving) {
            self.metrics.exceeded(Budget::Receiving);
            end = Some(self.protocol_error(&ProtocolError::ReceivingBudget, &mut serving.output));
        }
        if pending == 0 {
            serving.receiving_since = None;
        } else if parsed || serving.receiving_since.is_none() {
            serving.receiving_since = Some(Instant::now());
        }
        end
    }

    /// Waits for input (read into the buffer: `None`), a signal, or a timeout; answers how the
    /// connection ends when it does.
    async fn wait<S>(&self, stream: &mut S, serving: &mut Serving) -> io::Result<Option<End>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let settings = &self.settings;
        let spare = serving.input.capacity() - serving.input.len();
        let idle = async {
            match settings.idle_timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        let received_by = serving
            .receiving_since
            .map(|since| since + settings.receive_timeout);
        tokio::select! {
            read = stream.read_buf(&mut serving.input) => {
                let read = read?;
                if read == 0 {
                    return Ok(Some(End::Eof));
                }
                serving.room = if read >= spare { LARGE_READ } else { SMALL_READ };
            }
            () = self.signal.notified() => return self.signalled(stream, serving).await,
            () = serving.state.tracking.outbox.ready() => {
                // Invalidations for an idle connection: written at once, between replies.
                if let Some(close) = self.pushes(&serving.state, &mut serving.output) {
                    self.write(stream, &mut serving.output, None).await?;
                    return Ok(Some(close));
                }
            }
            () = sleep_until(received_by) => {
                self.metrics.exceeded(Budget::ReceiveTimeout);
                let end = self.protocol_error(&ProtocolError::ReceiveTimeout, &mut serving.output);
                self.write(stream, &mut serving.output, None).await?;
                return Ok(Some(end));
            }
            () = sleep_until(serving.auth_deadline) => {
                let end = self.auth_timeout(&mut serving.output);
                self.write(stream, &mut serving.output, None).await?;
                return Ok(Some(end));
            }
            () = idle => return Ok(Some(End::Idle)),
        }
        Ok(None)
    }

    /// What the listener's signal asks of an idle connection: shut down, make room (evicted),
    /// re-check its token, or look again at whether it must authenticate.
    async fn signalled<S>(&self, stream: &mut S, serving: &mut Serving) -> io::Result<Option<End>>
    where
        S: AsyncWrite + Unpin,
    {
        if self.signal.is_shut_down() {
            return Ok(Some(End::Shutdown));
        }
        if self.signal.is_evicted() {
            let _ = self.finish(stream, EVICTED, serving.auth_deadline).await;
            return Ok(Some(End::Evicted));
        }
        if self.signal.take_recheck() && !self.door.still_authorized(&serving.state) {
            return Ok(Some(self.revoked()));
        }
        serving.authenticated = self.authentication(
            &serving.state,
            &mut serving.auth_deadline,
            serving.authenticated,
        );
        Ok(None)
    }

    /// Writes `line` (a whole RESP error line) as the connection's last words.
    async fn finish<S>(&self, stream: &mut S, line: &[u8], until: Option<Instant>) -> io::Result<()>
    where
        S: AsyncWrite + Unpin,
    {
        let mut output = BytesMut::from(line);
        self.write(stream, &mut output, until).await
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
                // Not boxed here: a command that waits on the store boxes its own future (the
                // table's `Run::Store`), so what an idle connection's task holds for this call
                // is small, and a command answered at once allocates nothing for it.
                let answered = self.door.execute(state, args, deadline).await;
                drop(slot);
                answered
            }
            Err(_bound) => (Reply::error(OVERLOADED), After::Continue),
        };
        self.metrics.command(index, started.elapsed());
        self.answer(state, reply, after, output)
    }

    /// Encodes a command's `reply` into `output`, after the invalidations waiting for the
    /// connection, and counts it when it is an error.
    fn answer(
        &self,
        state: &ConnState,
        reply: Reply,
        after: After,
        output: &mut BytesMut,
    ) -> After {
        if let Reply::Error(text) = &reply {
            self.metrics.error(text);
        }
        // Invalidations go between replies: those the command caused (an answer that must not
        // be cached is invalidated just before it) and any that came meanwhile. When the
        // outbox says the connection must close, its last words are the pushes it kept: no
        // reply comes after an invalidation it did not keep.
        match self.pushes(state, output) {
            Some(_) => After::Close,
            None => {
                encode(&reply, state.proto, output);
                after
            }
        }
    }

    /// Encodes the invalidations waiting in the connection's outbox into `output`; answers
    /// how the connection ends when the outbox says it must (it passed its bound, or the
    /// connection its invalidations are redirected to closed).
    fn pushes(&self, state: &ConnState, output: &mut BytesMut) -> Option<End> {
        let outbox = &state.tracking.outbox;
        if !outbox.is_ready() {
            return None;
        }
        let drained = outbox.drain();
        if let Some(form) = state.tracking.push_form(state.proto) {
            for key in &drained.keys {
                encode_invalidation(Some(key), form, output);
            }
        }
        let close = drained.close?;
        match close {
            Close::Overflow => tracing::info!(
                "closing the connection: its invalidations passed resp.tracking_max_push_bytes (the client did not read them)"
            ),
            Close::RedirectGone => tracing::info!(
                "closing the connection: the connection its invalidations were redirected to closed"
            ),
        }
        Some(End::Pushes)
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

    /// Writes all of `output`; a write (or flush) that makes no progress for
    /// `resp.write_timeout`, or is still waiting at `until` (an unauthenticated connection's
    /// `resp.auth_timeout`), fails with [`io::ErrorKind::TimedOut`].
    async fn write<S>(
        &self,
        stream: &mut S,
        output: &mut BytesMut,
        until: Option<Instant>,
    ) -> io::Result<()>
    where
        S: AsyncWrite + Unpin,
    {
        let timeout = self.settings.write_timeout;
        let limit = || {
            let stalled = Instant::now() + timeout;
            until.map_or(stalled, |until| until.min(stalled))
        };
        let stalled = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for resp.write_timeout (or resp.auth_timeout passed)",
            )
        };
        // The buffer's memory is counted while the client reads it (on every way out).
        let _writing = Writing::hold(&self.metrics, output.capacity());
        while !output.is_empty() {
            let written = tokio::time::timeout_at(limit(), stream.write(output))
                .await
                .map_err(|_| stalled())??;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            output.advance(written);
        }
        tokio::time::timeout_at(limit(), stream.flush())
            .await
            .map_err(|_| stalled())??;
        if output.capacity() > KEEP_OUTPUT {
            *output = BytesMut::new();
        }
        Ok(())
    }
}

mod ahead;
mod auth;
mod held;
#[cfg(test)]
mod tests;
