//! Direct reads: a primary read of a copy (`HMGET key ver val tomb exp`, the decision path's
//! read) sent on a pipelined connection of the store's own to the node, one per primary,
//! instead of through fred's per-command path (a command future of about 8 KB, a hop through
//! its router task, a oneshot and a timer per command: most of a decision read's CPU).
//!
//! # How a direct read goes
//! [`DirectReads::send`] appends the command's bytes to the node's output buffer and a waiter
//! to its queue, under one lock, and wakes the connection's task only when the buffer was
//! empty. Woken, the task first lets every task ready on its thread run (a yield: the runtime
//! wakes it again once it has run out of ready tasks and polled for I/O), so the reads those
//! tasks make leave in the same write: one write per round of the runtime, as a proxy's event
//! loop writes once per round, not one per read (at one command per client, 0.7 writes to Redis
//! per read before, 0.18 after). The task writes the buffer (a timer only for a write the
//! socket does not take at once), parses replies in place (a value is a slice of the read
//! buffer, not a copy) and hands each to the oldest waiter: Redis answers a connection in
//! order.
//!
//! # What it keeps of the store's rules
//! - **A timeout**: one timer per connection, not per command, and no clock read per read: a
//!   read is stamped with the connection's coarse clock (its last write or tick, read once per
//!   write and per tick), never later than the read and at most a tick before it, unless a
//!   write was under way. When the oldest waiting read's stamp is older than the command
//!   timeout and one tick (checked every tenth of the timeout: a read fails from one to 1.2
//!   timeouts after it was sent, sooner only when a slow write, a node not reading, held the
//!   clock back), or a write to the node takes the timeout, the connection is closed and every
//!   read waiting on it fails with `timeout`: a paused node fails its reads within about the
//!   timeout, as through fred.
//! - **Fail-fast health**: the node health guard stands in front of every read
//!   ([`crate::read`]), so a node it marked failing gets no read here either. A connection
//!   that breaks fails its waiting reads at once (`io`); it is opened again in the background
//!   (100 ms, doubling to 2 s, between attempts), and until it is up the node's reads go
//!   through fred. Nothing waits for a connection to open.
//! - **Ordering**: a read is sent after everything the caller saw acknowledged (its own
//!   publish went through fred's connection and was answered first), on one connection per
//!   node, so a read after a caller's write sees it. Nothing is cached or merged: every
//!   read is its own `HMGET`.
//! - **Redirections and every refusal** (`MOVED` after a failover or a slot migration,
//!   `ASK`, `CLUSTERDOWN`, `LOADING`, `NOPERM`, …): the read is sent again through fred, which
//!   follows the redirection and updates its slot map (the next read goes to the new owner)
//!   or classifies the error. The connection never sends `READONLY`, so a demoted primary
//!   answers `MOVED` rather than its replica's data.
//! - **TLS and ACL users**: the connection is made with the same rustls configuration
//!   ([`crate::tls::client_config`]) and authenticates as the same user (`AUTH`) as fred's.
//!
//! `store.direct_reads = false` turns it off: every read then goes through fred.
//! `hotsplit_store_direct_reads_total{outcome}` counts the reads sent here (`sent`), those
//! sent through fred because the connection was not up or was full (`passed`), and those the
//! node refused, sent again through fred (`refused`).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use fred::types::Value;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::failure::Failure;
use super::target::{parse_address, RedisOptions};
use super::COPY_FIELDS;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::store::NodeLabel;
use crate::tls::{client_config, ClientCert};

/// The most reads one connection holds unanswered; past it a read goes through fred.
const MAX_WAITING: usize = 8_192;

/// A value up to this many bytes is copied out of the read buffer; a larger one is a slice of
/// it (its copy would cost more than the buffer it keeps).
const COPY_VALUES_UP_TO: usize = 4_096;

/// The first wait before a connection is opened again after it broke or failed to open.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between attempts to open a connection.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What a direct read got.
pub(super) enum DirectReply {
    /// The node's reply to `HMGET`: an array of the four fields.
    Fields(Value),
    /// The node refused the command (its error's text): send it again through fred.
    Refused(String),
    /// The connection broke before the reply, or the reply was overdue.
    Failed(Failure, String),
}

/// The direct connections of one store, one per primary, opened on first use.
pub(super) struct DirectReads {
    settings: Arc<Settings>,
    nodes: RwLock<HashMap<NodeLabel, Arc<Lane>>>,
}

impl Drop for DirectReads {
    /// Closes every connection: the store that owned them is gone.
    fn drop(&mut self) {
        self.settings.closed.cancel();
    }
}

/// How connections are made and bounded: the store's options.
struct Settings {
    command_timeout: Duration,
    connect_timeout: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The `AUTH` command's bytes, when the store authenticates.
    auth: Option<Vec<u8>>,
    metrics: Arc<Metrics>,
    /// Cancelled when the store is dropped: every connection's task and attempt ends.
    closed: CancellationToken,
}

/// One node's connection and what waits on it.
struct Lane {
    address: NodeLabel,
    settings: Arc<Settings>,
    shared: Mutex<Shared>,
    /// Wakes the connection's task: there are bytes to write.
    wake: Notify,
}

struct Shared {
    state: State,
    /// Counts the connections opened, so a broken one's task cannot close its successor.
    generation: u64,
    /// The next wait after a failed attempt to open the connection.
    backoff: Duration,
    /// The commands not yet written.
    out: BytesMut,
    /// The reads sent (or about to be), oldest first.
    waiting: VecDeque<Waiting>,
    /// The connection's coarse clock: its last write or tick. A read is stamped with it (no
    /// clock read per read); it is never later than the read.
    stamp: Instant,
}

enum State {
    /// Not connected; the next read at or after `retry_at` starts an attempt.
    Down { retry_at: Instant },
    /// An attempt to open the connection is under way.
    Connecting,
    /// Connected: reads are sent.
    Up,
}

struct Waiting {
    /// The connection's coarse clock when the read was sent (at most a tick or a write
    /// before it).
    sent: Instant,
    reply: oneshot::Sender<DirectReply>,
}

impl DirectReads {
    /// Direct reads with `options`' timeouts, TLS and credentials; `None` when
    /// `options.direct_reads` is off.
    ///
    /// # Errors
    /// [`crate::error::ErrorKind::Config`] when a TLS file cannot be read (fred's client was
    /// built from the same files first, so this does not happen after it connected).
    pub(super) fn new(options: &RedisOptions, metrics: Arc<Metrics>) -> Result<Option<Self>> {
        if !options.direct_reads {
            return Ok(None);
        }
        let tls = match &options.security.tls {
            Some(tls) => {
                let client_cert = match (&tls.cert_file, &tls.key_file) {
                    (Some(cert_file), Some(key_file)) => Some(ClientCert {
                        cert_file,
                        key_file,
                    }),
                    _ => None,
                };
                Some(Arc::new(client_config(
                    tls.ca_file.as_deref(),
                    client_cert,
                )?))
            }
            None => None,
        };
        let auth = options.security.password.as_ref().map(|password| {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &options.security.username {
                args.push(user.as_bytes());
            }
            args.push(password.expose().as_bytes());
            let mut bytes = BytesMut::new();
            encode(&mut bytes, &args);
            bytes.to_vec()
        });
        Ok(Some(DirectReads {
            settings: Arc::new(Settings {
                command_timeout: options.command_timeout,
                connect_timeout: options.connect_timeout,
                tls,
                auth,
                metrics,
                closed: CancellationToken::new(),
            }),
            nodes: RwLock::new(HashMap::new()),
        }))
    }

    /// Sends `HMGET copy_key ver val tomb exp` to `node`; `None` (nothing sent) when its
    /// connection is not up or is full, and the read goes through fred.
    pub(super) fn send(
        &self,
        node: &NodeLabel,
        copy_key: &str,
    ) -> Option<oneshot::Receiver<DirectReply>> {
        let lane = self.lane(node);
        let sent = lane.send(copy_key);
        self.settings.metrics.direct_read(sent.is_some());
        sent
    }

    /// Counts a read the node refused, which goes through fred.
    pub(super) fn count_refused(&self) {
        self.settings.metrics.direct_read_refused();
    }

    fn lane(&self, node: &NodeLabel) -> Arc<Lane> {
        if let Some(lane) = self
            .nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(node)
        {
            return Arc::clone(lane);
        }
        let mut nodes = self.nodes.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(nodes.entry(node.clone()).or_insert_with(|| {
            Arc::new(Lane {
                address: node.clone(),
                settings: Arc::clone(&self.settings),
                shared: Mutex::new(Shared {
                    state: State::Down {
                        retry_at: Instant::now(),
                    },
                    generation: 0,
                    backoff: FIRST_BACKOFF,
                    out: BytesMut::new(),
                    waiting: VecDeque::new(),
                    stamp: Instant::now(),
                }),
                wake: Notify::new(),
            })
        }))
    }
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn send(self: &Arc<Self>, copy_key: &str) -> Option<oneshot::Receiver<DirectReply>> {
        let mut shared = self.lock();
        match shared.state {
            State::Up => {}
            State::Connecting => return None,
            State::Down { retry_at } => {
                if Instant::now() >= retry_at {
                    shared.state = State::Connecting;
                    tokio::spawn(Arc::clone(self).open());
                }
                return None;
            }
        }
        if shared.waiting.len() >= MAX_WAITING {
            return None;
        }
        let (reply, receiver) = oneshot::channel();
        let was_empty = shared.out.is_empty();
        encode_hmget(&mut shared.out, copy_key.as_bytes());
        let sent = shared.stamp;
        shared.waiting.push_back(Waiting { sent, reply });
        drop(shared);
        if was_empty {
            self.wake.notify_one();
        }
        Some(receiver)
    }

    /// Opens the connection (within the connect timeout) and runs it; on failure, schedules
    /// the next attempt.
    async fn open(self: Arc<Self>) {
        let opened = tokio::select! {
            opened = tokio::time::timeout(self.settings.connect_timeout, self.connect()) => opened,
            () = self.settings.closed.cancelled() => return,
        };
        let why = match opened {
            Ok(Ok(Stream::Plain(stream))) => return self.start(stream),
            Ok(Ok(Stream::Tls(stream))) => return self.start(*stream),
            Ok(Err(why)) => why,
            Err(_) => format!(
                "not connected within {} ms",
                self.settings.connect_timeout.as_millis()
            ),
        };
        let mut shared = self.lock();
        let backoff = shared.backoff;
        shared.backoff = (backoff * 2).min(MAX_BACKOFF);
        shared.state = State::Down {
            retry_at: Instant::now() + backoff,
        };
        drop(shared);
        // The first failure in a row is worth a warning (a refused handshake or AUTH keeps
        // every read of the node on the client); the retries after it are not.
        if backoff == FIRST_BACKOFF {
            tracing::warn!(node = %self.address, error = %why, "direct read connection not opened; reads of this node go through the client until it is");
        } else {
            tracing::debug!(node = %self.address, error = %why, retry_in_ms = backoff.as_millis(), "direct read connection not opened");
        }
    }

    async fn connect(&self) -> std::result::Result<Stream, String> {
        let (host, port) = parse_address(self.address.as_str())?;
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|err| err.to_string())?;
        tcp.set_nodelay(true).map_err(|err| err.to_string())?;
        match &self.settings.tls {
            None => {
                let mut stream = tcp;
                self.authenticate(&mut stream).await?;
                Ok(Stream::Plain(stream))
            }
            Some(config) => {
                let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                    .map_err(|err| format!("{host} is not a tls server name: {err}"))?;
                let mut stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                    .connect(name, tcp)
                    .await
                    .map_err(|err| format!("tls: {err}"))?;
                self.authenticate(&mut stream).await?;
                Ok(Stream::Tls(Box::new(stream)))
            }
        }
    }

    /// Sends `AUTH` when the store authenticates, and reads its `+OK`.
    async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
    ) -> std::result::Result<(), String> {
        let Some(auth) = &self.settings.auth else {
            return Ok(());
        };
        stream
            .write_all(auth)
            .await
            .map_err(|err| err.to_string())?;
        let mut line = Vec::with_capacity(64);
        while !line.ends_with(b"\r\n") {
            let byte = stream.read_u8().await.map_err(|err| err.to_string())?;
            if line.len() >= 512 {
                return Err("AUTH's reply is too long".to_owned());
            }
            line.push(byte);
        }
        if line == b"+OK\r\n" {
            Ok(())
        } else {
            Err(format!(
                "AUTH refused: {}",
                String::from_utf8_lossy(&line).trim_end()
            ))
        }
    }

    fn start<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let mut shared = self.lock();
        shared.generation += 1;
        shared.backoff = FIRST_BACKOFF;
        shared.state = State::Up;
        shared.stamp = Instant::now();
        let generation = shared.generation;
        drop(shared);
        tracing::debug!(node = %self.address, "direct read connection open");
        tokio::spawn(self.run(stream, generation));
    }

    /// The connection's task: writes what is sent, hands out replies in order, and closes the
    /// connection when a reply is overdue or the connection fails.
    async fn run<S>(self: Arc<Self>, stream: S, generation: u64)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let timeout = self.settings.command_timeout;
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut output = BytesMut::new();
        let period = (timeout / 10).max(Duration::from_millis(5));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut wake = std::pin::pin!(self.wake.notified());
        let (failure, why) = loop {
            if input.capacity() - input.len() < 4096 {
                input.reserve(16 * 1024);
            }
            tokio::select! {
                biased;
                read = reader.read_buf(&mut input) => match read {
                    Ok(0) => break (Failure::Io, "the node closed the connection".to_owned()),
                    Err(err) => break (Failure::Io, err.to_string()),
                    Ok(_) => {
                        if let Err(why) = self.answer(&mut input) {
                            break (Failure::Other, why);
                        }
                    }
                },
                () = &mut wake => {
                    wake.set(self.wake.notified());
                    // The tasks ready on this worker run first, and the reads they send join
                    // this write: one write per round of the runtime, as a proxy's event loop
                    // writes once per round, not one per read.
                    tokio::task::yield_now().await;
                    let stamp = Instant::now();
                    {
                        let mut shared = self.lock();
                        std::mem::swap(&mut shared.out, &mut output);
                        shared.stamp = stamp;
                    }
                    match write_within(&mut writer, &output, timeout).await {
                        Ok(()) => output.clear(),
                        Err(failed) => break failed,
                    }
                },
                () = self.settings.closed.cancelled() => {
                    break (Failure::Canceled, "the store was closed".to_owned());
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    let overdue = {
                        let mut shared = self.lock();
                        shared.stamp = now;
                        // A stamp is at most a tick (or a write) before its read was sent.
                        shared
                            .waiting
                            .front()
                            .is_some_and(|oldest| now.duration_since(oldest.sent) >= timeout + period)
                    };
                    if overdue {
                        break (Failure::Timeout, format!("timed out after {} ms", timeout.as_millis()));
                    }
                },
            }
        };
        self.close(generation, failure, why);
    }

    /// Hands every complete reply in `input` to its waiter.
    fn answer(&self, input: &mut BytesMut) -> std::result::Result<(), String> {
        while let Some(reply) = parse_reply(input)? {
            let waiting = self
                .lock()
                .waiting
                .pop_front()
                .ok_or("a reply to no command")?;
            // A reader that stopped waiting (its deadline passed) dropped its receiver.
            let _ = waiting.reply.send(reply);
        }
        Ok(())
    }

    /// Closes connection `generation`: its waiting reads fail with `failure`, and the next
    /// read after the first backoff opens a new one.
    fn close(&self, generation: u64, failure: Failure, why: String) {
        let mut shared = self.lock();
        if shared.generation != generation {
            return;
        }
        shared.state = State::Down {
            retry_at: Instant::now() + FIRST_BACKOFF,
        };
        shared.out.clear();
        let waiting = std::mem::take(&mut shared.waiting);
        drop(shared);
        if failure == Failure::Canceled {
            tracing::debug!(node = %self.address, "direct read connection closed with its store");
        } else {
            tracing::warn!(node = %self.address, error = %why, failed_reads = waiting.len(), "direct read connection closed; reads of this node go through the client until it is open again");
        }
        for read in waiting {
            let _ = read.reply.send(DirectReply::Failed(failure, why.clone()));
        }
    }
}

/// Writes `bytes` whole within `timeout`. A write the socket takes at once (nearly every one)
/// arms no timer.
async fn write_within<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    timeout: Duration,
) -> std::result::Result<(), (Failure, String)> {
    let mut write = std::pin::pin!(writer.write_all(bytes));
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(write.as_mut(), cx))
    })
    .await;
    let written = match first {
        std::task::Poll::Ready(written) => written,
        std::task::Poll::Pending => tokio::time::timeout(timeout, write).await.map_err(|_| {
            (
                Failure::Timeout,
                format!("a write took over {} ms", timeout.as_millis()),
            )
        })?,
    };
    written.map_err(|err| (Failure::Io, err.to_string()))
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Appends a command of `args` in RESP.
fn encode(out: &mut BytesMut, args: &[&[u8]]) {
    let mut header = String::with_capacity(16);
    let _ = write!(header, "*{}\r\n", args.len());
    out.put_slice(header.as_bytes());
    for arg in args {
        put_bulk(out, arg);
    }
}

fn put_bulk(out: &mut BytesMut, arg: &[u8]) {
    out.put_u8(b'$');
    let mut digits = [0; 20];
    out.put_slice(format_len(&mut digits, arg.len()));
    out.put_slice(b"\r\n");
    out.put_slice(arg);
    out.put_slice(b"\r\n");
}

/// `len` in decimal, written at the end of `digits`.
fn format_len(digits: &mut [u8; 20], mut len: usize) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        // `len % 10` is below 10.
        digits[at] = b'0' + (len % 10) as u8;
        len /= 10;
        if len == 0 {
            return &digits[at..];
        }
    }
}

/// Appends `HMGET copy_key ver val tomb exp`.
fn encode_hmget(out: &mut BytesMut, copy_key: &[u8]) {
    out.put_slice(b"*6\r\n$5\r\nHMGET\r\n");
    put_bulk(out, copy_key);
    for field in COPY_FIELDS {
        put_bulk(out, field.as_bytes());
    }
}

/// Parses one reply off the front of `input`: `None` while it is incomplete. An `HMGET`'s
/// reply is an array of bulk strings or nulls; an error line is a refusal; anything else is a
/// protocol error, which closes the connection.
fn parse_reply(input: &mut BytesMut) -> std::result::Result<Option<DirectReply>, String> {
    let Some((first, mut at)) = line(input, 0) else {
        return Ok(None);
    };
    match first.first() {
        Some(b'-') => {
            let text = String::from_utf8_lossy(&first[1..]).into_owned();
            let _ = input.split_to(at);
            Ok(Some(DirectReply::Refused(text)))
        }
        Some(b'*') => {
            let count = number(&first[1..])?;
            let count = usize::try_from(count)
                .map_err(|_| format!("an array of {count} elements is not an HMGET reply"))?;
            let mut fields = Vec::with_capacity(count);
            for _ in 0..count {
                let Some((header, after)) = line(input, at) else {
                    return Ok(None);
                };
                if header.first() != Some(&b'$') {
                    return Err("an HMGET reply holds something other than bulk strings".into());
                }
                let len = number(&header[1..])?;
                if len < 0 {
                    fields.push(None);
                    at = after;
                    continue;
                }
                let len = usize::try_from(len).map_err(|_| "a bulk string's length overflows")?;
                let end = after + len;
                if input.len() < end + 2 {
                    return Ok(None);
                }
                if &input[end..end + 2] != b"\r\n" {
                    return Err("a bulk string does not end in CRLF".into());
                }
                fields.push(Some((after, end)));
                at = end + 2;
            }
            let frame = input.split_to(at).freeze();
            let values = fields
                .into_iter()
                .enumerate()
                .map(|(at, field)| match field {
                    // A small value (the second field) is copied out: it may be kept (the near
                    // cache), and a slice would keep the whole read buffer it came in alive.
                    Some((start, end)) if at == 1 && end - start <= COPY_VALUES_UP_TO => {
                        Value::Bytes(Bytes::copy_from_slice(&frame[start..end]))
                    }
                    Some((start, end)) => Value::Bytes(frame.slice(start..end)),
                    None => Value::Null,
                })
                .collect();
            Ok(Some(DirectReply::Fields(Value::Array(values))))
        }
        _ => Err(format!(
            "unexpected reply {:?}",
            String::from_utf8_lossy(&first[..first.len().min(32)])
        )),
    }
}

/// The line starting at `at` (without its CRLF) and where the next one starts; `None` while
/// it is incomplete.
fn line(input: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = input.get(at..)?;
    let newline = rest.iter().position(|&byte| byte == b'\n')?;
    let text = rest[..newline]
        .strip_suffix(b"\r")
        .unwrap_or(&rest[..newline]);
    Some((text, at + newline + 1))
}

fn number(text: &[u8]) -> std::result::Result<i64, String> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("{:?} is not a length", String::from_utf8_lossy(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(reply: DirectReply) -> Vec<Option<String>> {
        let DirectReply::Fields(Value::Array(values)) = reply else {
            panic!("not fields");
        };
        values
            .into_iter()
            .map(|value| value.as_str().map(|text| text.into_owned()))
            .collect()
    }

    #[test]
    fn hmget_is_encoded_as_redis_reads_it() {
        let mut out = BytesMut::new();
        encode_hmget(&mut out, b"k#1");
        assert_eq!(
            &out[..],
            b"*6\r\n$5\r\nHMGET\r\n$3\r\nk#1\r\n$3\r\nver\r\n$3\r\nval\r\n$4\r\ntomb\r\n$3\r\nexp\r\n"
        );
        let mut auth = BytesMut::new();
        encode(&mut auth, &[b"AUTH", b"u", b"p1234567890"]);
        assert_eq!(
            &auth[..],
            b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$11\r\np1234567890\r\n"
        );
    }

    #[test]
    fn replies_are_parsed_whole_or_not_at_all() {
        let reply = b"*4\r\n$1\r\n7\r\n$5\r\nhello\r\n$1\r\n0\r\n$-1\r\n-MOVED 12 127.0.0.1:7001\r\n*4\r\n$-1\r\n$-1\r\n$-1\r\n$-1\r\n";
        // Every prefix that cuts the first reply parses to nothing and consumes nothing.
        for cut in 0..34 {
            let mut input = BytesMut::from(&reply[..cut]);
            assert!(parse_reply(&mut input).unwrap().is_none(), "cut at {cut}");
            assert_eq!(input.len(), cut);
        }
        let mut input = BytesMut::from(&reply[..]);
        assert_eq!(
            fields(parse_reply(&mut input).unwrap().unwrap()),
            [
                Some("7".into()),
                Some("hello".into()),
                Some("0".into()),
                None
            ]
        );
        let Some(DirectReply::Refused(text)) = parse_reply(&mut input).unwrap() else {
            panic!("not a refusal");
        };
        assert_eq!(text, "MOVED 12 127.0.0.1:7001");
        assert_eq!(
            fields(parse_reply(&mut input).unwrap().unwrap()),
            [None, None, None, None]
        );
        assert!(input.is_empty());
        assert!(parse_reply(&mut input).unwrap().is_none());
    }

    #[test]
    fn a_reply_that_is_not_an_hmget_reply_is_a_protocol_error() {
        for bad in [
            &b":1\r\n"[..],
            b"*1\r\n:1\r\n",
            b"*1\r\n$1\r\nabc\r\n",
            b"*x\r\n",
        ] {
            let mut input = BytesMut::from(bad);
            assert!(parse_reply(&mut input).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lengths_are_written_in_decimal() {
        let mut digits = [0; 20];
        assert_eq!(format_len(&mut digits, 0), b"0");
        assert_eq!(format_len(&mut digits, 1234567), b"1234567");
        assert_eq!(
            format_len(&mut digits, usize::MAX),
            usize::MAX.to_string().as_bytes()
        );
    }
}
