//! The HTTP server's config: `[server]` (listen address, body limit, shutdown grace, log line
//! format).
//!
//! It sits beside `http`, the server it configures, rather than beside `server`: `server`
//! builds the service from the whole `Config`, so a sub-config defined there would make
//! `config` and `server` import each other.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

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
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
        Ok(())
    }
}
