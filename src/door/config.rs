//! The listeners' shared config, `[server]`: the HTTP listen address, the value bound, connection
//! timeouts and limits, the request limits (deadline, in-flight bound, query length), TLS,
//! shutdown grace and drain, log line format. Both doors read it (the Redis door takes its TLS,
//! timeouts, deadline and in-flight bound from here); `[admin]` is the HTTP door's own
//! (`http::config`).
//!
//! It sits in the door core, below both doors, rather than beside `server`: `server` builds the
//! service from the whole `Config`, so a sub-config defined there would make `config` and
//! `server` import each other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::deadline::MAX_BUDGET;
use crate::error::{Error, ErrorKind, Result};

/// The listeners: `[server]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The address to listen on. Default: `127.0.0.1:7070`.
    pub listen: SocketAddr,
    /// The largest accepted value (request body), in bytes. Default: 1048576 (1 MiB).
    pub max_value_bytes: usize,
    /// How long shutdown waits for in-flight requests and background tasks. Default: `10s`.
    #[serde(with = "crate::duration")]
    pub shutdown_grace: Duration,
    /// How `serve` writes log lines: `text` or `json` (one JSON object a line, with the
    /// request's `request_id`). `--log-format` and `HOTSPLIT_LOG_FORMAT` override
    /// it. Default: `text`.
    pub log_format: LogFormat,
    /// The log filter: a default level and `target=level` pairs (`info`, `warn,hotsplit=debug`).
    /// Re-read on SIGHUP. `--log` and `HOTSPLIT_LOG` override it (and then a reload keeps
    /// theirs). Default: `info`.
    pub log_level: Option<String>,
    /// Serve without `[auth] tokens_file` on an address that is not loopback: anyone who
    /// reaches the port may read and write every key. Without it, `serve` refuses such an
    /// address; with it, `serve` says so at startup (WARN). Default: `false`.
    pub allow_unauthenticated: bool,
    /// TLS is terminated in front of hotsplit (a load balancer or proxy), so bearer tokens may
    /// arrive in clear on a non-loopback listener: the only way to use tokens on such a
    /// listener without `server.tls_cert_file`. It covers the HTTP listeners (`server.listen`,
    /// `admin.listen`); the Redis port has `resp.tls_terminated_upstream`. Default: `false`.
    pub tls_terminated_upstream: bool,
    /// How long a client has to send a request's head (request line and headers), counted from
    /// its first byte: a slowloris client that trickles a header is closed after it. Default:
    /// `10s`.
    #[serde(with = "crate::duration")]
    pub header_read_timeout: Duration,
    /// How long a client has to send a request's whole body once the server first waits for
    /// it; a publish whose body is late is answered 400 `invalid_parameter` and its connection
    /// closed. Default: `30s`.
    #[serde(with = "crate::duration")]
    pub body_read_timeout: Duration,
    /// How long a connection may sit with no request in progress and no byte received (a new
    /// connection that sends nothing, or a keep-alive connection between requests) before it is
    /// closed. Default: `60s`.
    #[serde(with = "crate::duration")]
    pub idle_timeout: Duration,
    /// The most connections the data listener holds open at once; beyond it a new connection
    /// is answered 503 and closed at once, counted and logged. It must fit under the process's
    /// open-file limit with room for Redis connections and the spool (the binary checks it at
    /// startup). Default: `10000`.
    pub max_connections: usize,
    /// The largest request head (request line and headers) accepted, in bytes; a larger one is
    /// answered 431 and its connection closed. At least 1024. Default: `16384`.
    pub max_header_bytes: usize,
    /// How long, after SIGTERM or ctrl-c, the listeners keep serving while `/readyz` answers
    /// 503 (reason `draining`), so load balancers stop sending before the listeners close; then
    /// in-flight requests drain within `server.shutdown_grace`. May be `0s`. Default: `5s`.
    #[serde(with = "crate::duration")]
    pub drain_delay: Duration,
    /// How long, at startup, `/readyz` may answer 503 `warming_up` while the replicas that
    /// replica-routed reads may use are not all discovered and measured (each with a first lag
    /// sample; until then their reads go to the primary, reason `lag-unmeasured`). After it the
    /// instance is ready anyway, logs a warning once, and `/readyz` lists what is still
    /// pending. No wait without replicas (the embedded store, a standalone Redis without
    /// `store.replicas`). `0s` turns the wait off; at most `1h`. Default: `5s`.
    #[serde(with = "crate::duration")]
    pub readiness_warm_up: Duration,
    /// How long a request may take: every store call a read or a publish makes is bounded by
    /// it. A read past it answers 503 `deadline_exceeded`; a publish stops waiting for copy
    /// writes shortly before it (a tenth of it, at most 250 ms, is kept for the retry queue's
    /// spool) and reports the copies that did not answer `queued`. `0s` turns the deadline off
    /// (only `store.command_timeout` bounds each call). At most `1h`. Default: `5s`.
    #[serde(with = "crate::duration")]
    pub request_deadline: Duration,
    /// How many requests may be in flight at once; more are answered 503 `overloaded` at once,
    /// before anything is read or written. `/healthz`, `/readyz` and `/metrics` are neither
    /// counted nor refused. `0` turns the bound off. Default: `1024`.
    pub max_in_flight: usize,
    /// The longest accepted query string, in bytes (after `?`, before decoding); a longer one is
    /// answered 414 `query_too_long`. Default: `4096`.
    pub max_query_bytes: usize,
    /// How many publish bodies may be arriving at once. A publish takes its
    /// `server.max_in_flight` slot (and starts its `server.request_deadline`) only once its
    /// body has arrived, so slow uploads cannot hold the slots reads need; bodies still
    /// arriving are bounded by this and `server.max_receiving_bytes` instead, and a publish past
    /// either is answered 503 `overloaded` before its body is read. `0` turns the bound off.
    /// Default: `256`.
    pub max_receiving_bodies: usize,
    /// How many bytes the publish bodies still arriving may hold at once: each reserves its
    /// declared `Content-Length`, or `server.max_value_bytes` without one. At least
    /// `server.max_value_bytes`; `0` turns the bound off. Default: `268435456` (256 MiB).
    pub max_receiving_bytes: u64,
    /// A PEM file with the certificate chain the listeners present; set with
    /// `server.tls_key_file`, every listener (data and admin) speaks HTTPS only. Default: unset
    /// (plain HTTP).
    pub tls_cert_file: Option<PathBuf>,
    /// A PEM file with the private key of `server.tls_cert_file`. Default: unset.
    pub tls_key_file: Option<PathBuf>,
    /// The threads that run the service (the async runtime's workers). `0`: one per CPU the
    /// process may use. Fewer cost less per request where the instance shares its cores with
    /// Redis or with its clients (each request handed between threads wakes one); more serve
    /// more at once on a host of its own. Read at start: a reload that changes it needs a
    /// restart. At most [`MAX_WORKER_THREADS`]. Default: `0`.
    pub worker_threads: usize,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object a line, for log shippers.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<LogFormat, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("expected text or json, got {other:?}")),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            max_value_bytes: 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
            log_format: LogFormat::Text,
            log_level: None,
            allow_unauthenticated: false,
            tls_terminated_upstream: false,
            tls_cert_file: None,
            tls_key_file: None,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            max_header_bytes: 16 * 1024,
            drain_delay: Duration::from_secs(5),
            readiness_warm_up: Duration::from_secs(5),
            request_deadline: Duration::from_secs(5),
            max_in_flight: 1024,
            max_query_bytes: 4096,
            max_receiving_bodies: 256,
            max_receiving_bytes: 256 * 1024 * 1024,
            worker_threads: 0,
        }
    }
}

impl ServerConfig {
    /// Checks every `server.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.max_value_bytes == 0 {
            return Err(Error::new(
                ErrorKind::Config,
                "server.max_value_bytes: must be positive",
            ));
        }
        if let Some(filter) = &self.log_level {
            filter
                .parse::<tracing_subscriber::filter::Targets>()
                .map_err(|err| Error::new(ErrorKind::Config, format!("server.log_level: {err}")))?;
        }
        let timeouts = [
            ("header_read_timeout", self.header_read_timeout),
            ("body_read_timeout", self.body_read_timeout),
            ("idle_timeout", self.idle_timeout),
        ];
        for (field, timeout) in timeouts {
            if timeout.is_zero() {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("server.{field}: must be positive"),
                ));
            }
        }
        if self.max_connections == 0 {
            return Err(Error::new(
                ErrorKind::Config,
                "server.max_connections: must be positive",
            ));
        }
        if self.max_header_bytes < MIN_HEADER_BYTES {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "server.max_header_bytes: must be at least {MIN_HEADER_BYTES}, got {}",
                    self.max_header_bytes
                ),
            ));
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => {
                return Err(Error::new(
                    ErrorKind::Config,
                    "server.tls_key_file: required with server.tls_cert_file",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::new(
                    ErrorKind::Config,
                    "server.tls_cert_file: required with server.tls_key_file",
                ))
            }
            _ => {}
        }
        if self.request_deadline > MAX_BUDGET {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "server.request_deadline: must be at most {} (or 0s for none)",
                    humantime::format_duration(MAX_BUDGET)
                ),
            ));
        }
        if self.readiness_warm_up > MAX_BUDGET {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "server.readiness_warm_up: must be at most {} (or 0s for none)",
                    humantime::format_duration(MAX_BUDGET)
                ),
            ));
        }
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "server.worker_threads: must be at most {MAX_WORKER_THREADS} (or 0 for one per CPU), got {}",
                    self.worker_threads
                ),
            ));
        }
        if self.max_query_bytes == 0 {
            return Err(Error::new(
                ErrorKind::Config,
                "server.max_query_bytes: must be positive",
            ));
        }
        if self.max_receiving_bytes != 0 && self.max_receiving_bytes < self.max_value_bytes as u64 {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "server.max_receiving_bytes: must be 0 (no bound) or at least server.max_value_bytes ({}), got {}",
                    self.max_value_bytes, self.max_receiving_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Checks that the listeners' connection bounds fit under `open_files`, the process's
    /// open-file limit, with [`RESERVED_FILES`] left for Redis connections, the spool and the
    /// listening sockets; `resp_connections` is the Redis-protocol listener's bound (0 when it
    /// is off).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming `server.max_connections` (and `resp.max_connections` when
    /// it counts) and the limit.
    pub fn check_file_limit(&self, open_files: u64, resp_connections: usize) -> Result<()> {
        let needed = self.max_connections as u64
            + ADMIN_MAX_CONNECTIONS as u64
            + resp_connections as u64
            + RESERVED_FILES;
        if needed > open_files {
            let resp = if resp_connections > 0 {
                format!(
                    ", {resp_connections} for the Redis-protocol listener (resp.max_connections)"
                )
            } else {
                String::new()
            };
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "server.max_connections: {} connections (plus {} for the admin listener{resp} and {RESERVED_FILES} kept for Redis and files) need {needed} open files, but the limit is {open_files}; lower server.max_connections{} or raise the limit (ulimit -n, LimitNOFILE=)",
                    self.max_connections,
                    ADMIN_MAX_CONNECTIONS,
                    if resp_connections > 0 { " or resp.max_connections" } else { "" },
                ),
            ));
        }
        Ok(())
    }
}

/// The most `server.worker_threads`.
pub const MAX_WORKER_THREADS: usize = 1024;

/// The admin listener's own connection bound (`[admin] listen`), which the open-file check counts.
pub const ADMIN_MAX_CONNECTIONS: usize = 128;

/// The smallest `server.max_header_bytes`: a request line with a long key and the headers a
/// normal client sends must fit.
pub const MIN_HEADER_BYTES: usize = 1024;

/// Open files kept for everything but the listeners' connections: Redis connections (one per
/// node, per replica and for `WAIT`), the spool's files, the listening sockets, stdio.
pub const RESERVED_FILES: u64 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limits_are_checked_naming_the_field() {
        let zero_timeout = ServerConfig {
            idle_timeout: Duration::ZERO,
            ..ServerConfig::default()
        };
        let err = zero_timeout.validate().unwrap_err();
        assert!(err.to_string().contains("server.idle_timeout"), "{err}");
        let small_head = ServerConfig {
            max_header_bytes: 100,
            ..ServerConfig::default()
        };
        let err = small_head.validate().unwrap_err();
        assert!(err.to_string().contains("server.max_header_bytes"), "{err}");
        let default = ServerConfig::default();
        assert!(default.check_file_limit(20_000, 0).is_ok());
        let err = default.check_file_limit(20_000, 10_000).unwrap_err();
        assert!(err.to_string().contains("resp.max_connections"), "{err}");
        let err = default.check_file_limit(1024, 0).unwrap_err();
        assert!(err.to_string().contains("server.max_connections"), "{err}");
        assert!(err.to_string().contains("1024"), "{err}");
    }

    #[test]
    fn worker_threads_are_zero_for_one_per_cpu_or_at_most_the_bound() {
        for threads in [0, 1, MAX_WORKER_THREADS] {
            let config = ServerConfig {
                worker_threads: threads,
                ..ServerConfig::default()
            };
            assert!(config.validate().is_ok(), "{threads}");
        }
        let too_many = ServerConfig {
            worker_threads: MAX_WORKER_THREADS + 1,
            ..ServerConfig::default()
        };
        let err = too_many.validate().unwrap_err();
        assert!(err.to_string().contains("server.worker_threads"), "{err}");
    }
}
