//! The HTTP server's config: `[server]` (listen address, body limit, shutdown grace, log line
//! format).
//!
//! It sits beside `http`, the server it configures, rather than beside `server`: `server`
//! builds the service from the whole `Config`, so a sub-config defined there would make
//! `config` and `server` import each other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The HTTP server.
#[derive(Debug, Clone, Deserialize)]
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
    /// request's span and its `request_id`). `--log-format` and `HOTSPLIT_LOG_FORMAT` override
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
    /// listener without `server.tls_cert_file`. Default: `false`.
    pub tls_terminated_upstream: bool,
    /// PEM certificate chain of TLS on the listeners. Not built in this release yet: setting it
    /// is a config error, so a listener is never plaintext while the file says TLS. Default:
    /// none.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `server.tls_cert_file`. Default: none.
    pub tls_key_file: Option<PathBuf>,
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
        // The listener's TLS is built by the listener work (issue 11); until then a certificate
        // must not be accepted and silently ignored.
        for (field, value) in [
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ] {
            if value.is_some() {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("server.{field}: TLS on the listener is not built in this release; terminate TLS in front of hotsplit and set server.tls_terminated_upstream = true"),
                ));
            }
        }
        Ok(())
    }
}
