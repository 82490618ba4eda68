//! The Redis-protocol door's config: `[resp]` (its listen address, its connection bound, the
//! request and output bounds of a connection, its timeouts).
//!
//! It sits beside `resp`, the door it configures, as `http::config` sits beside `http`. The
//! checks that span sections (the exposure rules of `resp.listen`, the open-file check) are in
//! [`crate::config::Config`].

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The smallest `resp.max_inline_bytes`: an inline `GET` of the longest key must fit.
pub const MIN_INLINE_BYTES: usize = 1024;

/// The Redis-protocol listener: `[resp]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RespConfig {
    /// The address the Redis-protocol (RESP2/RESP3) listener listens on. It follows
    /// `server.listen`'s exposure rules (tokens on anything but loopback, and then TLS on it or
    /// in front of it) and speaks TLS when `server.tls_cert_file` is set. Default: unset (no
    /// Redis-protocol listener).
    pub listen: Option<SocketAddr>,
    /// The most connections the listener holds open at once (Redis's `maxclients`); beyond it
    /// a new connection is answered `-ERR max number of clients reached` and closed. Idle
    /// connections are never evicted to make room: pooled clients keep theirs open on purpose.
    /// Counted in the open-file check at startup. Default: `4096` (Redis's `maxclients` is
    /// 10000; 4096 fits beside `server.max_connections`' 10000 under a 20,000 open-file limit,
    /// a common hard limit: raise both with the limit).
    pub max_connections: usize,
    /// The most arguments one command may have, its name included; a multibulk header that
    /// declares more is answered `-ERR Protocol error: invalid multibulk length` and the
    /// connection closed. Default: `4097` (an `MGET` of 4096 keys).
    pub max_args: usize,
    /// The longest inline command line (Redis's `PROTO_INLINE_MAX_SIZE`); a longer one is
    /// answered `-ERR Protocol error: too big inline request` and the connection closed.
    /// At least 1024. Default: `65536`.
    pub max_inline_bytes: usize,
    /// The most input bytes a connection may hold for the command it is receiving (the
    /// arguments already read and the bytes of the one being read); past it the connection is
    /// answered `-ERR Protocol error: too big request` and closed (Redis's
    /// `client-query-buffer-limit`, which is 1 GiB there). At least `server.max_value_bytes`
    /// plus 64 KiB. Default: `16777216` (16 MiB).
    pub max_pending_bytes: usize,
    /// How many reply bytes a connection may hold before it stops running the rest of a
    /// pipelined batch, writes what it holds, and then goes on (flow control, not a
    /// disconnect: Redis's normal-class `client-output-buffer-limit` is unlimited). One reply
    /// larger than it is still written whole. Default: `4194304` (4 MiB).
    pub max_output_bytes: usize,
    /// How long a write may make no progress (the client does not read its replies) before
    /// the connection is closed. Default: `30s`.
    #[serde(with = "crate::duration")]
    pub write_timeout: Duration,
    /// How long a connection may send nothing before it is closed; `0s` never closes an idle
    /// connection (Redis's `timeout 0`: pools keep idle connections on purpose). Default: `0s`.
    #[serde(with = "crate::duration")]
    pub idle_timeout: Duration,
}

impl Default for RespConfig {
    fn default() -> RespConfig {
        RespConfig {
            listen: None,
            max_connections: 4096,
            max_args: 4097,
            max_inline_bytes: 64 * 1024,
            max_pending_bytes: 16 * 1024 * 1024,
            max_output_bytes: 4 * 1024 * 1024,
            write_timeout: Duration::from_secs(30),
            idle_timeout: Duration::ZERO,
        }
    }
}

impl RespConfig {
    /// Checks every `resp.*` field against itself and `max_value_bytes`
    /// (`server.max_value_bytes`).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self, max_value_bytes: usize) -> Result<()> {
        let invalid = |message: String| Err(Error::new(ErrorKind::Config, message));
        if self.max_connections == 0 {
            return invalid("resp.max_connections: must be positive".to_owned());
        }
        if self.max_args < 2 {
            return invalid(format!(
                "resp.max_args: must be at least 2 (a command and one key), got {}",
                self.max_args
            ));
        }
        if self.max_inline_bytes < MIN_INLINE_BYTES {
            return invalid(format!(
                "resp.max_inline_bytes: must be at least {MIN_INLINE_BYTES}, got {}",
                self.max_inline_bytes
            ));
        }
        let least_pending = max_value_bytes.saturating_add(64 * 1024);
        if self.max_pending_bytes < least_pending {
            return invalid(format!(
                "resp.max_pending_bytes: must be at least server.max_value_bytes plus 64 KiB ({least_pending}), got {}",
                self.max_pending_bytes
            ));
        }
        if self.max_output_bytes == 0 {
            return invalid("resp.max_output_bytes: must be positive".to_owned());
        }
        if self.write_timeout.is_zero() {
            return invalid("resp.write_timeout: must be positive".to_owned());
        }
        Ok(())
    }

    /// The connections the listener may hold: `resp.max_connections` when it listens, else 0
    /// (for the open-file check).
    pub fn connections_held(&self) -> usize {
        if self.listen.is_some() {
            self.max_connections
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_bad_fields_are_named() {
        let defaults = RespConfig::default();
        assert!(defaults.validate(1024 * 1024).is_ok());
        assert_eq!(defaults.connections_held(), 0);
        let err = defaults.validate(64 * 1024 * 1024).unwrap_err();
        assert!(err.to_string().contains("resp.max_pending_bytes"), "{err}");
        let small = RespConfig {
            max_inline_bytes: 10,
            ..RespConfig::default()
        };
        let err = small.validate(1024).unwrap_err();
        assert!(err.to_string().contains("resp.max_inline_bytes"), "{err}");
        let parsed: RespConfig =
            toml::from_str("listen = \"127.0.0.1:6380\"\nidle_timeout = \"5m\"").unwrap();
        assert_eq!(parsed.connections_held(), 4096);
        assert_eq!(parsed.idle_timeout, Duration::from_secs(300));
        assert!(toml::from_str::<RespConfig>("lisen = \"127.0.0.1:1\"").is_err());
    }
}
