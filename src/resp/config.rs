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
    /// in front of it: `resp.tls_terminated_upstream`) and speaks TLS when
    /// `server.tls_cert_file` is set. Default: unset (no Redis-protocol listener).
    pub listen: Option<SocketAddr>,
    /// Set when TLS for the Redis-protocol listener ends in a proxy in front of hotsplit (a
    /// TCP/TLS proxy that forwards RESP in clear): it lets `resp.listen` be a non-loopback
    /// address without `server.tls_cert_file`. The HTTP listener's
    /// `server.tls_terminated_upstream` does not cover this one. Default: `false`.
    pub tls_terminated_upstream: bool,
    /// The most connections the listener holds open at once (Redis's `maxclients`); beyond it
    /// a new connection is answered `-ERR max number of clients reached` and closed. Idle
    /// authenticated connections are never evicted to make room (pooled clients keep theirs
    /// open on purpose); with tokens configured, a connection that has not authenticated yet is
    /// (`resp.max_unauthenticated`). Counted in the open-file check at startup. Default: `4096`
    /// (Redis's `maxclients` is 10000; 4096 fits beside `server.max_connections`' 10000 under a 20,000 open-file limit,
    /// a common hard limit: raise both with the limit).
    pub max_connections: usize,
    /// With tokens configured, the most connections that have not authenticated yet. A new
    /// connection when this many are held, or when `resp.max_connections` are, closes the
    /// oldest connection that has not authenticated (it is answered `-ERR max number of
    /// clients reached`) and takes its place: clients without a token cannot keep clients with
    /// one out. Above `resp.max_connections` it is `resp.max_connections`. Default: `1024`.
    pub max_unauthenticated: usize,
    /// With tokens configured, how long a connection may take to authenticate (`AUTH` or
    /// `HELLO … AUTH`) from when it is accepted; then it is answered `-NOAUTH …` and closed.
    /// Default: `10s`.
    #[serde(with = "crate::duration")]
    pub auth_timeout: Duration,
    /// The most arguments one command may have, its name included; a multibulk header that
    /// declares more, or an inline line with more, is answered `-ERR Protocol error: invalid
    /// multibulk length` and the connection closed. Default: `4097` (an `MGET` of 4096 keys).
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
    /// The most input bytes all the connections together may hold for the commands they are
    /// receiving (the instance-wide bound beside `resp.max_pending_bytes`, as
    /// `server.max_receiving_bytes` is for HTTP bodies); a connection whose input passes it
    /// is answered `-ERR Protocol error: commands being received hold resp.max_receiving_bytes`
    /// and closed. `0` is no bound; else at least `resp.max_pending_bytes`. Default:
    /// `268435456` (256 MiB).
    pub max_receiving_bytes: usize,
    /// How long a command may take to arrive once its first byte has (as
    /// `server.body_read_timeout` for an HTTP body); then the connection is answered
    /// `-ERR Protocol error: command not received within resp.receive_timeout` and closed.
    /// Default: `30s`.
    #[serde(with = "crate::duration")]
    pub receive_timeout: Duration,
    /// The most bytes the commands one `MULTI` queues may hold (their arguments, copied); the
    /// command that would pass it is answered `-ERR …` and the transaction is dropped (its
    /// `EXEC` answers `-EXECABORT`). At least `server.max_value_bytes` plus 64 KiB. Default:
    /// `16777216` (16 MiB).
    pub max_queued_bytes: usize,
    /// The largest reply one command may build: an `MGET` or an `EXEC` whose reply would pass
    /// it is answered `-ERR … resp.max_reply_bytes …` whole, never a part of its reply (an
    /// `EXEC` stops at the queued command that passes it: those before it ran). At least
    /// `server.max_value_bytes` plus 64 KiB. Default: `67108864` (64 MiB).
    pub max_reply_bytes: usize,
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
    /// Client-side caching: the most bytes the keys tracked for every connection together
    /// are counted for (a key and about 400 bytes per key and connection); past it the keys
    /// whose leases end first are invalidated (pushed) to make room, as Redis's
    /// `tracking-table-max-keys` does. Default: `67108864` (64 MiB).
    pub tracking_max_bytes: usize,
    /// The same bound for one connection's tracked keys; past it the connection's own keys
    /// are invalidated to make room. Default: `4194304` (4 MiB).
    pub tracking_max_bytes_per_connection: usize,
    /// The most prefixes one `CLIENT TRACKING ON BCAST` connection may register. Default: `64`.
    pub tracking_max_prefixes: usize,
    /// The most bytes of invalidations one connection may have waiting to be written; past it
    /// the connection is closed (its client then drops its cache) rather than skip one.
    /// Default: `4194304` (4 MiB).
    pub tracking_max_push_bytes: usize,
}

impl Default for RespConfig {
    fn default() -> RespConfig {
        RespConfig {
            listen: None,
            tls_terminated_upstream: false,
            max_connections: 4096,
            max_unauthenticated: 1024,
            auth_timeout: Duration::from_secs(10),
            max_args: 4097,
            max_inline_bytes: 64 * 1024,
            max_pending_bytes: 16 * 1024 * 1024,
            max_receiving_bytes: 256 * 1024 * 1024,
            receive_timeout: Duration::from_secs(30),
            max_queued_bytes: 16 * 1024 * 1024,
            max_reply_bytes: 64 * 1024 * 1024,
            max_output_bytes: 4 * 1024 * 1024,
            write_timeout: Duration::from_secs(30),
            idle_timeout: Duration::ZERO,
            tracking_max_bytes: 64 * 1024 * 1024,
            tracking_max_bytes_per_connection: 4 * 1024 * 1024,
            tracking_max_prefixes: 64,
            tracking_max_push_bytes: 4 * 1024 * 1024,
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
        if self.max_unauthenticated == 0 {
            return invalid("resp.max_unauthenticated: must be positive".to_owned());
        }
        if self.auth_timeout.is_zero() {
            return invalid("resp.auth_timeout: must be positive".to_owned());
        }
        if self.receive_timeout.is_zero() {
            return invalid("resp.receive_timeout: must be positive".to_owned());
        }
        if self.max_receiving_bytes != 0 && self.max_receiving_bytes < self.max_pending_bytes {
            return invalid(format!(
                "resp.max_receiving_bytes: must be 0 (no bound) or at least resp.max_pending_bytes ({}), got {}",
                self.max_pending_bytes, self.max_receiving_bytes
            ));
        }
        for (field, value) in [
            ("max_queued_bytes", self.max_queued_bytes),
            ("max_reply_bytes", self.max_reply_bytes),
        ] {
            if value < least_pending {
                return invalid(format!(
                    "resp.{field}: must be at least server.max_value_bytes plus 64 KiB ({least_pending}), got {value}"
                ));
            }
        }
        if self.max_output_bytes == 0 {
            return invalid("resp.max_output_bytes: must be positive".to_owned());
        }
        if self.write_timeout.is_zero() {
            return invalid("resp.write_timeout: must be positive".to_owned());
        }
        self.validate_tracking()
    }

    /// Checks the `resp.tracking_*` bounds.
    fn validate_tracking(&self) -> Result<()> {
        let least = 1024;
        for (field, value) in [
            ("tracking_max_bytes", self.tracking_max_bytes),
            (
                "tracking_max_bytes_per_connection",
                self.tracking_max_bytes_per_connection,
            ),
            ("tracking_max_push_bytes", self.tracking_max_push_bytes),
        ] {
            if value < least {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("resp.{field}: must be at least {least} (a tracked key), got {value}"),
                ));
            }
        }
        if self.tracking_max_bytes_per_connection > self.tracking_max_bytes {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "resp.tracking_max_bytes_per_connection: must be at most resp.tracking_max_bytes ({}), got {}",
                    self.tracking_max_bytes, self.tracking_max_bytes_per_connection
                ),
            ));
        }
        Ok(())
    }

    /// The tracking table's bounds.
    pub fn tracking_limits(&self) -> crate::tracking::Limits {
        crate::tracking::Limits {
            max_bytes: self.tracking_max_bytes,
            max_bytes_per_connection: self.tracking_max_bytes_per_connection,
            max_prefixes: self.tracking_max_prefixes,
            max_push_bytes: self.tracking_max_push_bytes,
        }
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
        for (field, bad) in [
            ("max_unauthenticated", "max_unauthenticated = 0"),
            ("auth_timeout", "auth_timeout = \"0s\""),
            ("receive_timeout", "receive_timeout = \"0s\""),
            ("max_receiving_bytes", "max_receiving_bytes = 1024"),
            ("max_queued_bytes", "max_queued_bytes = 1024"),
            ("max_reply_bytes", "max_reply_bytes = 1024"),
        ] {
            let config: RespConfig = toml::from_str(bad).unwrap();
            let err = config.validate(1024).unwrap_err();
            assert!(err.to_string().contains(&format!("resp.{field}")), "{err}");
        }
        let parsed: RespConfig =
            toml::from_str("listen = \"127.0.0.1:6380\"\nidle_timeout = \"5m\"").unwrap();
        assert_eq!(parsed.connections_held(), 4096);
        assert_eq!(parsed.idle_timeout, Duration::from_secs(300));
        assert!(toml::from_str::<RespConfig>("lisen = \"127.0.0.1:1\"").is_err());
    }
}
