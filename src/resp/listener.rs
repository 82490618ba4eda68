//! The Redis-protocol accept loop: the connection bound, TLS, token revocation, drain.
//!
//! A [`RespListener`] accepts TCP connections on `resp.listen` and serves each on a task of the
//! service's tracker (`resp::conn`), with:
//! - a bound of its own, `resp.max_connections` (Redis's `maxclients`): a connection over it is
//!   answered `-ERR max number of clients reached` and closed, counted, logged at most once a
//!   second. Idle authenticated connections are never evicted to make room (a pool keeps them
//!   on purpose); with tokens configured, the oldest connection not yet authenticated is, when
//!   a bound is reached (`resp.max_unauthenticated`, see `slots`);
//! - TLS with the listeners' acceptor (`server.tls_cert_file`), the handshake bounded by
//!   `server.header_read_timeout`; a client whose first byte opens no handshake is answered in
//!   clear that the port speaks TLS ([`PLAIN_ON_TLS`]) and closed; over the bound a TLS client gets its refusal after a
//!   handshake too, on at most [`MAX_REFUSALS`] refusal tasks at once (beyond them it is closed
//!   without a word);
//! - `TCP_NODELAY`: a batch's replies go out in one write, and waiting for an ACK before the
//!   next would only add latency to pipelined clients;
//! - a per-connection `Signal`, not a shared token: when a reload stores a new token table
//!   (the accept loop watches [`crate::auth::TokenTable::changes`]) every connection is told to
//!   re-check its token, and on shutdown every connection is told to close once its batch is
//!   written. A connection's wake-ups then take no lock another connection takes (the reason
//!   the HTTP listener's `Activity` has its own `Notify`).
//!
//! On shutdown (the service's token is cancelled, after `server.drain_delay`) the loop stops
//! accepting, drops the listening socket, and tells every connection; the service waits for
//! their tasks within `server.shutdown_grace`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::codec::Limits;
use super::command::Budgets;
use super::conn::{Connection, Settings};
use super::metrics::RespMetrics;
use super::slots::{Connections, Signal};
use super::{Door, RespConfig};
use crate::door::{is_connection_error, ServerConfig, Throttle};

/// The reply to a connection over `resp.max_connections` (Redis's own text).
pub const MAX_CLIENTS: &[u8] = b"-ERR max number of clients reached\r\n";

/// The reply, in clear, to a client that does not open a TLS handshake on a TLS listener.
pub const PLAIN_ON_TLS: &[u8] =
    b"-ERR this port speaks TLS (server.tls_cert_file): connect with TLS, as redis-cli --tls does\r\n";

/// The first byte of a TLS record carrying a handshake: every TLS client's first byte.
const HANDSHAKE_RECORD: u8 = 0x16;

/// How many connections over the bound may be getting their refusal over TLS at once.
pub const MAX_REFUSALS: usize = 64;

/// How long a refusal over TLS may take, handshake included.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Room above the longest value a bulk argument may have: a key, a version, an option are all
/// shorter than this, even when `server.max_value_bytes` is tiny.
const BULK_SLACK: usize = 64 * 1024;

/// How long the loop pauses after an accept error that is not about one connection.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The Redis-protocol listener; [`RespListener::run`] is its accept loop.
pub struct RespListener {
    /// The bound socket.
    tcp: TcpListener,
    /// The commands.
    door: Door,
    /// The connections' limits and timeouts.
    settings: Arc<Settings>,
    /// The open connections.
    connections: Arc<Connections>,
    /// The door's metrics.
    metrics: RespMetrics,
    /// The TLS acceptor, when the listeners speak TLS.
    tls: Option<TlsAcceptor>,
    /// The next connection id.
    next_id: AtomicU64,
    /// Refusals over TLS in progress.
    refusals: Arc<AtomicUsize>,
}

impl RespListener {
    /// A listener on `tcp` running `door`'s commands with `resp`'s and `server`'s limits, over
    /// TLS when `tls` is given; registers the door's metrics in the door's registry.
    pub fn new(
        tcp: TcpListener,
        door: Door,
        resp: &RespConfig,
        server: &ServerConfig,
        tls: Option<TlsAcceptor>,
    ) -> RespListener {
        let metrics = RespMetrics::register(door.core().metrics());
        let door = door.with_budgets(
            Budgets {
                max_reply_bytes: resp.max_reply_bytes,
                max_queued_bytes: resp.max_queued_bytes,
            },
            metrics.clone(),
        );
        let settings = Settings {
            limits: Limits {
                max_bulk: server.max_value_bytes.saturating_add(BULK_SLACK),
                max_args: resp.max_args,
                max_inline: resp.max_inline_bytes,
            },
            max_pending: resp.max_pending_bytes,
            max_receiving: Some(resp.max_receiving_bytes).filter(|bound| *bound > 0),
            receive_timeout: resp.receive_timeout,
            auth_timeout: resp.auth_timeout,
            max_output: resp.max_output_bytes,
            write_timeout: resp.write_timeout,
            idle_timeout: Some(resp.idle_timeout).filter(|timeout| !timeout.is_zero()),
            handshake_timeout: server.header_read_timeout,
        };
        RespListener {
            tcp,
            door,
            settings: Arc::new(settings),
            connections: Connections::new(
                resp.max_connections,
                resp.max_unauthenticated.min(resp.max_connections),
                metrics.clone(),
            ),
            metrics,
            tls,
            next_id: AtomicU64::new(1),
            refusals: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Accepts connections until `shutdown` is cancelled, serving each on a task of
    /// `connections`; then drops the listening socket and tells every connection to close
    /// once its batch is written.
    pub async fn run(self, shutdown: CancellationToken, tasks: TaskTracker) {
        let mut tokens = self.door.core().tokens().changes();
        let overload = self.door.core().in_flight().clone();
        let mut refusals = Throttle::default();
        let mut accept_errors = Throttle::default();
        // False once the table's sender is gone (it lives as long as the state): no more changes.
        let mut watching = true;
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                changed = tokens.changed(), if watching => {
                    match changed {
                        Ok(()) => self.connections.tell_all(|signal| &signal.recheck),
                        Err(_) => watching = false,
                    }
                    continue;
                }
                accepted = self.tcp.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    if is_connection_error(&err) {
                        continue;
                    }
                    if let Some(suppressed) = accept_errors.due() {
                        tracing::error!(listener = "resp", error = %err, suppressed, "cannot accept connections (out of file descriptors?)");
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                    }
                }
            };
            let _ = stream.set_nodelay(true);
            let signal = Arc::new(Signal::default());
            let authenticated = self.door.core().tokens().load().is_none();
            let Some(slot) = self.connections.admit(signal.clone(), authenticated) else {
                self.metrics.refused();
                if let Some(suppressed) = refusals.due() {
                    tracing::warn!(listener = "resp", bound = self.connections.bound, suppressed, "connection refused: the Redis-protocol listener holds its most connections (resp.max_connections)");
                }
                self.refuse(stream, &tasks);
                continue;
            };
            let connection = Connection {
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                peer: Some(peer),
                door: self.door.clone(),
                settings: self.settings.clone(),
                overload: overload.clone(),
                metrics: self.metrics.clone(),
                signal,
                slot,
            };
            match &self.tls {
                None => {
                    tasks.spawn(connection.serve(stream));
                }
                Some(tls) => {
                    let tls = tls.clone();
                    let timeout = self.settings.handshake_timeout;
                    tasks.spawn(async move {
                        if !opens_handshake(&stream, timeout).await {
                            tracing::debug!(conn = connection.id, "a clear-text client on the TLS port");
                            let _ = stream.try_write(PLAIN_ON_TLS);
                            return;
                        }
                        match tokio::time::timeout(timeout, tls.accept(stream)).await {
                            Ok(Ok(stream)) => connection.serve(stream).await,
                            Ok(Err(err)) => {
                                tracing::debug!(conn = connection.id, error = %err, "TLS handshake failed")
                            }
                            Err(_) => {
                                tracing::debug!(conn = connection.id, "TLS handshake timed out")
                            }
                        }
                    });
                }
            }
        }
        drop(self.tcp);
        self.connections.tell_all(|signal| &signal.shut_down);
        tracing::debug!(listener = "resp", "stopped accepting connections");
    }

    /// Answers a connection over the bound `-ERR max number of clients reached` and closes it:
    /// in clear without waiting (a write the socket takes at once), or over TLS on a refusal
    /// task while fewer than [`MAX_REFUSALS`] are running.
    fn refuse(&self, stream: TcpStream, tasks: &TaskTracker) {
        let Some(tls) = &self.tls else {
            let _ = stream.try_write(MAX_CLIENTS);
            if let Ok(stream) = stream.into_std() {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
            return;
        };
        if self.refusals.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSALS {
            self.refusals.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let tls = tls.clone();
        let refusals = self.refusals.clone();
        tasks.spawn(async move {
            let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
                let mut stream = tls.accept(stream).await?;
                stream.write_all(MAX_CLIENTS).await?;
                stream.shutdown().await
            })
            .await;
            refusals.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Whether the client's first byte (waited for within `timeout`) opens a TLS handshake; true
/// when it cannot be told (the handshake then fails on its own).
async fn opens_handshake(stream: &TcpStream, timeout: Duration) -> bool {
    let mut first = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) => first[0] == HANDSHAKE_RECORD,
        _ => true,
    }
}
