//! The accept loop: hotsplit's own HTTP/1 server over hyper, in place of `axum::serve`, for the
//! limits a server facing the open network needs.
//!
//! A [`Listener`] accepts TCP connections on one bound socket and serves each on a task of the
//! service's tracker, with:
//! - a bound on open connections (`server.max_connections`; [`ADMIN_MAX_CONNECTIONS`] on the
//!   admin listener), so the process never reaches its open-file limit: at the bound a new
//!   connection makes room by evicting an idle one (`slots`), and when none is idle it gets a
//!   fixed 503 answer and is closed at once, counted, and logged at most once a second;
//! - a header-read timeout, an idle timeout and a body-read timeout (`conn`);
//! - a header size limit (hyper's `max_header_size`: 431 and close);
//! - graceful shutdown: when the token is cancelled the loop stops accepting and drops the
//!   listening socket, idle connections close at once and in-flight requests finish (the
//!   service waits for them within `server.shutdown_grace`).
//!
//! # Layout
//! - `activity`: what a connection's timeouts are judged by (busy or idle, since when).
//! - `conn`: one connection: the task that drives hyper and closes the connection on a timeout
//!   or an eviction, and the request and response body wrappers.
//! - `metrics`: the connection gauges and counters, per listener.
//! - `slots`: the connection bound, and the eviction of idle connections at it.
//! - [`tls`]: the TLS acceptor from `server.tls_cert_file` and `server.tls_key_file`.

mod activity;
mod conn;
mod metrics;
mod slots;
pub mod tls;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use activity::Activity;
pub use metrics::{ConnectionMetrics, ListenerMetrics};
use slots::{Admission, Slots};

use super::App;
use crate::door::{is_connection_error, ServerConfig, Throttle};

/// The connection bound of the admin listener: enough for a few scrapers and probes, and kept
/// apart from the data listener's, so a flood of data connections cannot lock out `/metrics`
/// and `/readyz`.
pub use crate::door::config::ADMIN_MAX_CONNECTIONS;

/// How long the accept loop pauses after an accept error that is not about one connection (the
/// process or the system is out of file descriptors), so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The problem body of the fixed answer to a connection over the bound.
const REFUSED_BODY: &str = r#"{"type":"urn:hotsplit:problem:unavailable","title":"unavailable","status":503,"detail":"too many open connections","code":"unavailable"}"#;

/// The fixed answer to a connection over the bound, written without reading the request.
static REFUSED: LazyLock<Vec<u8>> = LazyLock::new(|| {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{REFUSED_BODY}",
        REFUSED_BODY.len()
    )
    .into_bytes()
});

/// Which of the service's listeners a [`Listener`] is: the label of its metrics and log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The data API (and, without an admin listener, every route).
    Data,
    /// The admin routes only (`[admin] listen`).
    Admin,
}

impl Role {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Admin => "admin",
        }
    }
}

/// The connection settings of a listener, shared by its connection tasks.
#[derive(Debug)]
pub(crate) struct Settings {
    /// `server.header_read_timeout`.
    header_read_timeout: Duration,
    /// `server.body_read_timeout`.
    body_read_timeout: Duration,
    /// `server.idle_timeout`.
    idle_timeout: Duration,
    /// hyper's HTTP/1 settings (keep-alive, the header size limit), cloned into each connection.
    http: http1::Builder,
}

impl Settings {
    /// The settings `config` gives.
    fn new(config: &ServerConfig) -> Settings {
        let mut http = http1::Builder::new();
        // hyper's own header timeout would also start whenever a connection goes idle, so an
        // idle keep-alive connection would get the header timeout instead of the idle one; the
        // connection task judges both (`conn`).
        http.timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true)
            .max_header_size(config.max_header_bytes);
        Settings {
            header_read_timeout: config.header_read_timeout,
            body_read_timeout: config.body_read_timeout,
            idle_timeout: config.idle_timeout,
            http,
        }
    }
}

/// One listening socket and how its connections are served. [`Listener::run`] is its accept
/// loop.
pub struct Listener {
    /// Which listener this is.
    role: Role,
    /// The bound socket.
    tcp: TcpListener,
    /// The routes this listener serves.
    app: App,
    /// The timeouts and hyper's settings.
    settings: Arc<Settings>,
    /// The open connections and the bound.
    slots: Arc<Slots>,
    /// Connection gauges and counters.
    metrics: ListenerMetrics,
    /// The TLS acceptor, when the listener speaks HTTPS.
    tls: Option<TlsAcceptor>,
}

impl Listener {
    /// A listener serving `app` on `tcp` with `config`'s timeouts and limits, in plain HTTP
    /// ([`Listener::with_tls`] makes it HTTPS): the data listener's bound is
    /// `server.max_connections`, the admin listener's [`ADMIN_MAX_CONNECTIONS`].
    pub fn new(
        role: Role,
        tcp: TcpListener,
        app: App,
        config: &ServerConfig,
        metrics: ListenerMetrics,
    ) -> Listener {
        let bound = match role {
            Role::Data => config.max_connections,
            Role::Admin => ADMIN_MAX_CONNECTIONS,
        };
        Listener {
            role,
            tcp,
            app,
            settings: Arc::new(Settings::new(config)),
            slots: Slots::new(bound),
            metrics,
            tls: None,
        }
    }

    /// This listener speaking HTTPS through `tls` when it is given.
    #[must_use]
    pub fn with_tls(self, tls: Option<TlsAcceptor>) -> Listener {
        Listener { tls, ..self }
    }

    /// Accepts connections until `shutdown` is cancelled, serving each on a task of
    /// `connections`; then drops the listening socket and tells every open connection, through
    /// its own `Activity`, which shuts it down gracefully.
    pub async fn run(self, shutdown: CancellationToken, connections: TaskTracker) {
        let mut refusals = Throttle::default();
        let mut evictions = Throttle::default();
        let mut accept_errors = Throttle::default();
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.tcp.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    if is_connection_error(&err) {
                        continue;
                    }
                    if let Some(suppressed) = accept_errors.due() {
                        tracing::error!(listener = self.role.as_str(), error = %err, suppressed, "cannot accept connections (out of file descriptors?)");
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                    }
                }
            };
            let activity = Arc::new(Activity::new());
            let slot = match self.slots.admit(activity.clone()) {
                Admission::Admitted(slot) => slot,
                Admission::Evicted(slot) => {
                    if let Some(suppressed) = evictions.due() {
                        tracing::warn!(listener = self.role.as_str(), open = self.metrics.open.get(), suppressed, "closed an idle connection to make room: the listener holds its most connections (server.max_connections)");
                    }
                    slot
                }
                Admission::Refused => {
                    self.metrics.refused.inc();
                    if let Some(suppressed) = refusals.due() {
                        tracing::warn!(listener = self.role.as_str(), open = self.metrics.open.get(), suppressed, "connection refused: the listener holds its most connections (server.max_connections) and none is idle");
                    }
                    refuse(stream);
                    continue;
                }
            };
            // Answers go out in one write each; waiting for an ACK before the next would only
            // add latency to pipelined requests.
            let _ = stream.set_nodelay(true);
            let connection = conn::Connection {
                app: self.app.clone(),
                settings: self.settings.clone(),
                metrics: self.metrics.clone(),
                activity,
                _slot: slot,
                tls: self.tls.clone(),
            };
            connections.spawn(connection.serve(stream));
        }
        // Each connection is told through its own signal, not by watching the token: see
        // `Activity::signal`. Every connection admitted is in the table until its task ends.
        self.slots.shut_down_all();
        tracing::debug!(
            listener = self.role.as_str(),
            "stopped accepting connections"
        );
    }
}

/// Writes the fixed 503 to a connection over the bound, if the socket takes it at once, and
/// closes it.
fn refuse(stream: TcpStream) {
    // A non-blocking write and a shutdown that does not wait: a refused connection must not
    // cost the accept loop a wait, nor leave a task behind.
    let _ = stream.try_write(&REFUSED);
    if let Ok(stream) = stream.into_std() {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_the_problem_an_unavailable_answer_carries() {
        let text = std::str::from_utf8(&REFUSED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        let problem = crate::http::problem::Problem {
            type_uri: "urn:hotsplit:problem:unavailable".to_owned(),
            title: crate::http::problem::Code::Unavailable.title().to_owned(),
            status: 503,
            detail: "too many open connections".to_owned(),
            code: crate::http::problem::Code::Unavailable,
        };
        assert_eq!(body, serde_json::to_value(problem).unwrap());
    }
}
