//! The store's config: `[store]`, which picks the embedded store or Redis and sets its timeouts.
//!
//! [`StoreConfig::redis_options`] is the one place the configured URLs become
//! [`RedisOptions`]; [`StoreConfig::validate`] reports a bad one naming its field.

use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, ErrorKind, Result};
use crate::store::redis::target::{RedisOptions, RedisTarget};

/// The store.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://host:port` (standalone) or `redis-cluster://host:port[,host:port]` (Cluster).
    /// Default: none, which runs the embedded in-memory store.
    pub redis: Option<String>,
    /// How long one Redis command may take before it fails; no request hangs on a paused node.
    /// Default: `500ms`.
    #[serde(with = "crate::duration")]
    pub command_timeout: Duration,
    /// How long connecting to Redis at startup may take. Default: `2s`.
    #[serde(with = "crate::duration")]
    pub connect_timeout: Duration,
    /// Replicas of a standalone primary, each `redis://host:port`, read by replica-routed
    /// classes. In Cluster mode replicas are discovered and this must be empty. A replica that
    /// is down at startup does not stop it: it is connected later and counts as over every
    /// budget until its heartbeat is seen.
    /// Default: none (the primary serves, reason `no-replica`).
    pub replicas: Vec<String>,
    /// How long a copy's record is kept after the copy expires (stops being served), so the
    /// compare-and-set still refuses an older version that arrives late (a slow caller, a
    /// queued retry, a replayed spool record): expiry makes a copy disappear, never come back
    /// older. An older version arriving later than this after the newer one expired is
    /// applied like a first publish. Must cover the expiry jitter of every family (at least
    /// its TTL × `-heal.expiry_jitter_min`, checked by [`crate::config::Config::validate`]), so
    /// no copy forgets a version while a sibling still serves it. Default: the longest family
    /// TTL ([`crate::config::Config::version_retention`]).
    #[serde(default, with = "crate::duration::option")]
    pub version_retention: Option<Duration>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            replicas: Vec::new(),
            redis: None,
            command_timeout: RedisOptions::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: RedisOptions::DEFAULT_CONNECT_TIMEOUT,
            version_retention: None,
        }
    }
}

impl StoreConfig {
    /// Checks every `store.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field (`store.redis`, `store.replicas[1]`, …).
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: String, why: String| {
            Err(Error::new(ErrorKind::Config, format!("{field}: {why}")))
        };
        if self.command_timeout.is_zero() {
            return invalid("store.command_timeout".into(), "must be positive".into());
        }
        if self.connect_timeout.is_zero() {
            return invalid("store.connect_timeout".into(), "must be positive".into());
        }
        if let Some(url) = &self.redis {
            if let Err(err) = RedisTarget::parse(url) {
                return invalid("store.redis".into(), err.message().to_owned());
            }
        }
        if !self.replicas.is_empty() {
            match &self.redis {
                Some(url) if url.trim_start().starts_with("redis-cluster://") => {
                    return invalid(
                        "store.replicas".into(),
                        "must be empty in cluster mode: replicas are discovered from the cluster"
                            .into(),
                    )
                }
                None => {
                    return invalid(
                        "store.replicas".into(),
                        "needs store.redis: the embedded store has no replicas".into(),
                    )
                }
                Some(_) => {}
            }
            for (at, url) in self.replicas.iter().enumerate() {
                replica_address(at, url)?;
            }
        }
        Ok(())
    }

    /// The options to connect Redis with, or `None` for the embedded store.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field when a URL does not parse (never after
    /// [`StoreConfig::validate`] passed).
    pub fn redis_options(&self) -> Result<Option<RedisOptions>> {
        let Some(url) = &self.redis else {
            return Ok(None);
        };
        let target = RedisTarget::parse(url).map_err(|err| {
            Error::new(ErrorKind::Config, format!("store.redis: {}", err.message()))
        })?;
        let mut options = RedisOptions::new(target);
        options.command_timeout = self.command_timeout;
        options.connect_timeout = self.connect_timeout;
        options.replicas = self
            .replicas
            .iter()
            .enumerate()
            .map(|(at, url)| replica_address(at, url))
            .collect::<Result<Vec<String>>>()?;
        Ok(Some(options))
    }
}

/// The `host:port` of `store.replicas[at]`, which must be a `redis://host:port` URL.
fn replica_address(at: usize, url: &str) -> Result<String> {
    let invalid =
        |why: String| Error::new(ErrorKind::Config, format!("store.replicas[{at}]: {why}"));
    match RedisTarget::parse(url) {
        Ok(RedisTarget::Standalone(address)) => Ok(address),
        Ok(_) => Err(invalid("must be a redis://host:port url".into())),
        Err(err) => Err(invalid(err.message().to_owned())),
    }
}
