//! One connection: hyper's HTTP/1 connection driven beside a watchdog that closes it when a
//! timeout passes (judged by its [`Activity`]), when the listener evicts it, or, on shutdown,
//! once the request in progress is answered.
//!
//! A busy connection's request body must arrive within `server.body_read_timeout` of the first
//! wait for it ([`DeadlineBody`]); past it the handler sees a body error, answers, and hyper
//! ends the connection, whose body was not read to its end. hyper never shuts the socket down
//! itself: a connection it ended is closed lingering ([`linger`]), so the rest of a refused body
//! is read and discarded and the client reads the answer rather than a reset.
//!
//! The watchdog is one timer per connection, re-armed when it fires or when a head starts
//! arriving without ending in the same read: a request whose head arrives whole touches no
//! timer. An eviction or the listener's shutdown reaches the connection through its own
//! [`Activity`] (a flag and a `Notify` no other connection touches), so a wake-up by the socket
//! takes no lock that the listener's other connections take.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body as AxumBody;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::activity::{Activity, Verdict};
use super::metrics::{ListenerMetrics, Timeout};
use super::slots::Slot;
use super::{tls, Settings};
use crate::http::{App, AppFuture};

/// What a connection task needs besides its socket.
pub(super) struct Connection {
    /// The routes served.
    pub(super) app: App,
    /// The timeouts and hyper's settings.
    pub(super) settings: Arc<Settings>,
    /// The listener's connection metrics.
    pub(super) metrics: ListenerMetrics,
    /// What the connection's timeouts are judged by; also in the listener's slot table.
    pub(super) activity: Arc<Activity>,
    /// The listener's slot this connection holds; dropping it frees the slot.
    pub(super) _slot: Slot,
    /// The TLS acceptor, when the listener speaks HTTPS.
    pub(super) tls: Option<TlsAcceptor>,
}

impl Connection {
    /// Serves `stream` (after a TLS handshake on a TLS listener) until the client closes, a
    /// timeout passes, the listener evicts it, or the listener shuts down and the request in
    /// progress (if any) is answered.
    pub(super) async fn serve(self, stream: TcpStream) {
        self.metrics.open.inc();
        match self.tls.clone() {
            None => self.serve_http(stream).await,
            Some(acceptor) => {
                let handshake = tokio::time::timeout(
                    self.settings.header_read_timeout,
                    handshake(acceptor, stream),
                );
                tokio::select! {
                    shaken = handshake => match shaken {
                        Ok(Some(tls)) => self.serve_http(tls).await,
                        Ok(None) => {}
                        Err(_) => {
                            self.metrics.timed_out(Timeout::Handshake);
                        }
                    },
                    () = self.activity.signal.notified() => {
                        if self.activity.was_evicted() {
                            self.metrics.evicted.inc();
                        }
                    }
                }
            }
        }
        self.metrics.open.dec();
    }

    /// Serves HTTP/1 on `io` until the client closes, a timeout passes, or the listener evicts
    /// the connection or shuts down (told through the connection's [`Activity`]).
    async fn serve_http<S>(&self, io: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = self.activity.clone();
        let service = ConnService {
            app: self.app.clone(),
            activity: activity.clone(),
            body_read_timeout: self.settings.body_read_timeout,
        };
        let io = TokioIo::new(Watched {
            inner: io,
            activity: activity.clone(),
        });
        // Polled without shutting the socket down at its end, so an answer given before the
        // request body was read can be followed by a lingering close (`linger`).
        let mut connection = self.settings.http.serve_connection(io, service);
        let signal = activity.signal.notified();
        let mut signal = std::pin::pin!(signal);
        // Whether `signal` was polled: once is enough to leave the task's waker with the
        // connection's `Notify`, and the flags then say what woke it, so a wake-up by the
        // socket costs two atomic loads here, not a lock.
        let mut listening = false;
        let watchdog = tokio::time::sleep(self.settings.idle_timeout);
        let mut watchdog = std::pin::pin!(watchdog);
        let mut draining = false;
        // The head start the watchdog was last armed for: a head that starts on this
        // connection pulls the watchdog in to its header deadline.
        let mut armed_for = 0;
        loop {
            let event = std::future::poll_fn(|cx| {
                if let Poll::Ready(served) = connection.poll_without_shutdown(cx) {
                    return Poll::Ready(Event::Ended(served));
                }
                if !listening {
                    // Ready only if a signal came before this first poll; its flag says which.
                    let _ = signal.as_mut().poll(cx);
                    listening = true;
                }
                if !draining && activity.is_shut_down() {
                    return Poll::Ready(Event::ShutDown);
                }
                if !draining && activity.was_evicted() {
                    return Poll::Ready(Event::Evicted);
                }
                // Checked after each poll of the connection, so the usual request, whose
                // head arrives whole, never touches the timer.
                let started = activity.head_started_ms.load(Ordering::Relaxed);
                if started != 0 && started != armed_for {
                    armed_for = started;
                    let deadline = activity.at_ms(started - 1) + self.settings.header_read_timeout;
                    if deadline < watchdog.deadline() {
                        watchdog.as_mut().reset(deadline);
                    }
                }
                if watchdog.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Watchdog);
                }
                Poll::Pending
            })
            .await;
            match event {
                Event::Ended(served) => {
                    if let Err(err) = served {
                        tracing::debug!(error = %err, "connection ended with an error");
                    }
                    let mut io = connection.into_parts().io.into_inner();
                    if activity.is_shut_down() || activity.was_evicted() {
                        // No linger, but the socket is still shut down as hyper would have
                        // (a TLS close_notify, then the FIN).
                        let _ = tokio::time::timeout(LINGER_IDLE, io.shutdown()).await;
                    } else {
                        linger(io, &activity).await;
                    }
                    break;
                }
                Event::ShutDown => {
                    // Idle connections close at once; a request in progress is answered first.
                    Pin::new(&mut connection).graceful_shutdown();
                    draining = true;
                }
                Event::Evicted => {
                    self.metrics.evicted.inc();
                    if activity.in_flight.load(Ordering::Relaxed) == 0 {
                        // Idle, or a head still arriving: hyper's graceful shutdown would
                        // wait for that head, so the connection is dropped.
                        break;
                    }
                    // A request began after the listener chose this connection: answer it.
                    Pin::new(&mut connection).graceful_shutdown();
                    draining = true;
                }
                Event::Watchdog => match activity.verdict(Instant::now(), &self.settings) {
                    Verdict::Close(timeout) => {
                        self.metrics.timed_out(timeout);
                        tracing::debug!(
                            timeout = timeout.as_str(),
                            "connection closed by a timeout"
                        );
                        break;
                    }
                    Verdict::CheckAt(at) => watchdog.as_mut().reset(at),
                },
            }
        }
        if activity.body_timed_out.load(Ordering::Relaxed) {
            self.metrics.timed_out(Timeout::Body);
        }
    }
}

/// The longest a lingering close keeps reading after the answer.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// A lingering close ends when the client sends nothing for this long.
const LINGER_IDLE: Duration = Duration::from_secs(1);
/// The most bytes a lingering close reads and discards.
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// A lingering close, as nginx's: the answer has been written; the write side is shut down
/// and whatever the client still sends (a request body refused with 413, or cut off by the body
/// timeout) is read and discarded until it closes, for at most [`LINGER_TIME`] and
/// [`LINGER_BYTES`] (or [`LINGER_IDLE`] of silence), before the socket is closed. Closing a
/// socket with unread bytes makes the kernel send a reset, which can discard the answer before
/// a client that sends its whole body first has read it. A shutdown or an eviction ends it.
async fn linger<S>(mut io: Watched<S>, activity: &Activity)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    if io.shutdown().await.is_err() {
        return;
    }
    let until = Instant::now() + LINGER_TIME;
    let mut discarded = 0usize;
    let mut buffer = vec![0u8; 16 * 1024];
    let signal = activity.signal.notified();
    let mut signal = std::pin::pin!(signal);
    while discarded < LINGER_BYTES && !activity.is_shut_down() && !activity.was_evicted() {
        let idle = (Instant::now() + LINGER_IDLE).min(until);
        tokio::select! {
            read = io.read(&mut buffer) => match read {
                Ok(read) if read > 0 => discarded += read,
                _ => return,
            },
            () = tokio::time::sleep_until(idle) => return,
            () = signal.as_mut() => return,
        }
    }
}

/// The TLS handshake on `stream`; `None` when it fails, or when the client speaks plain HTTP
/// (then it gets a 400 in the clear saying the port speaks HTTPS).
async fn handshake(acceptor: TlsAcceptor, mut stream: TcpStream) -> Option<TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    if !matches!(stream.peek(&mut first).await, Ok(1)) {
        return None;
    }
    if !tls::opens_handshake(first[0]) {
        // Read what the client already sent, so closing does not reset the connection before
        // it reads the answer.
        let mut sent = [0u8; 4096];
        while matches!(stream.try_read(&mut sent), Ok(read) if read > 0) {}
        let _ = stream.write_all(&tls::PLAIN_HTTP).await;
        let _ = stream.shutdown().await;
        return None;
    }
    match acceptor.accept(stream).await {
        Ok(tls) => Some(tls),
        Err(err) => {
            tracing::debug!(error = %err, "tls handshake failed");
            None
        }
    }
}

/// What woke a connection task.
enum Event {
    /// hyper's connection ended (the client closed, or an error).
    Ended(hyper::Result<()>),
    /// The service is shutting down.
    ShutDown,
    /// The listener evicted this connection to make room for a new one.
    Evicted,
    /// The watchdog's timer fired.
    Watchdog,
}

/// The socket, reporting arriving bytes to the connection's [`Activity`].
struct Watched<S> {
    /// The socket (TCP, or TLS over TCP).
    inner: S,
    /// Where arrivals are reported.
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The request service of one connection: the routes, with the request marked busy until its
/// response body is handed over, and its body (if it has one) under the body-read timeout.
#[derive(Clone)]
struct ConnService {
    /// The routes.
    app: App,
    /// The connection's activity.
    activity: Arc<Activity>,
    /// `server.body_read_timeout`.
    body_read_timeout: Duration,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = ConnFuture;

    fn call(&self, request: Request<Incoming>) -> ConnFuture {
        self.activity.request_started();
        let guard = RequestGuard(self.activity.clone());
        let request = request.map(|body| {
            if body.is_end_stream() {
                // No body (a GET): nothing to wait for, so no timer and no wrapper to box.
                AxumBody::empty()
            } else {
                AxumBody::new(DeadlineBody {
                    inner: body,
                    timeout: self.body_read_timeout,
                    deadline: None,
                    activity: self.activity.clone(),
                })
            }
        });
        ConnFuture {
            answer: self.app.call(request),
            guard: Some(guard),
        }
    }
}

/// The future of one request: the routes' answer, its body wrapped in [`TrackedBody`] (a named
/// type, so hyper's connection polls it in place rather than through a box per request).
struct ConnFuture {
    /// The routes' answer.
    answer: AppFuture,
    /// Ends the request when dropped; moved into the response body once the answer is ready.
    guard: Option<RequestGuard>,
}

impl Future for ConnFuture {
    type Output = Result<Response<TrackedBody>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let response = match Pin::new(&mut this.answer).poll(cx) {
            Poll::Ready(Ok(response)) => response,
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => return Poll::Pending,
        };
        let guard = this.guard.take();
        Poll::Ready(Ok(response.map(|body| TrackedBody {
            inner: body,
            _guard: guard,
        })))
    }
}

/// Marks its request ended when dropped: with the response body once hyper has written it, or
/// with the request's future when the connection goes away first.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that ends its request when hyper drops it.
pub(super) struct TrackedBody {
    /// The routes' body.
    inner: AxumBody,
    /// Ends the request on drop (taken from its [`ConnFuture`], which holds it until then).
    _guard: Option<RequestGuard>,
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails once it has kept the server waiting for
/// `server.body_read_timeout`. The timer starts at the first wait, so a body that arrives with
/// its head (or a request with none) never arms one.
struct DeadlineBody {
    /// hyper's body.
    inner: Incoming,
    /// `server.body_read_timeout`.
    timeout: Duration,
    /// The deadline, once the body has made the server wait.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The connection's activity, told when the deadline passes.
    activity: Arc<Activity>,
}

/// Why a request body could not be read.
#[derive(Debug)]
enum BodyError {
    /// hyper failed to read it (the client went away, or sent a malformed chunk).
    Read(hyper::Error),
    /// It did not arrive within `server.body_read_timeout`.
    TimedOut,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Read(err) => write!(f, "reading the request body failed: {err}"),
            BodyError::TimedOut => f.write_str("the request body did not arrive in time"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Read(err) => Some(err),
            BodyError::TimedOut => None,
        }
    }
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(BodyError::Read)));
        }
        let timeout = this.timeout;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.as_mut().poll(cx).is_ready() {
            this.activity.body_timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyError::TimedOut)));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
