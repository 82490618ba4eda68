//! The store's config: `[store]`, which picks the embedded store or Redis, sets its timeouts,
//! and says how to secure the connections (TLS files, ACL user, password file).
//!
//! [`StoreConfig::redis_options`] is the one place the configured URLs, TLS files and
//! credentials become [`RedisOptions`]; [`StoreConfig::validate`] reports a bad one naming its
//! field. A password never reaches a message: it is a [`Password`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::store::memory::DEFAULT_MEMORY_MAX_BYTES;
use crate::store::redis::target::{
    redact_url, Password, RedisOptions, RedisSecurity, RedisTarget, RedisUrl, TlsOptions,
};

/// The store.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://host:port` (standalone) or `redis-cluster://host:port[,host:port]` (Cluster);
    /// `rediss://` and `rediss-cluster://` connect with TLS; `valkey://`, `valkeys://`,
    /// `valkey-cluster://` and `valkeys-cluster://` are synonyms. It may carry
    /// `user:password@` (percent-encoded), though `username` and `password_file` keep the
    /// password out of the file. Default: none, which runs the embedded in-memory store.
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
    /// The PEM file of the certificate authorities that sign the Redis servers' certificates
    /// (needs a `rediss` URL). Default: none, which trusts the system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// The PEM client certificate for mutual TLS (needs a `rediss` URL and `tls_key_file`).
    /// Default: none, no client certificate.
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `tls_cert_file`. Default: none.
    pub tls_key_file: Option<PathBuf>,
    /// The ACL user every connection authenticates as. Default: none, the `default` user (or
    /// the user of the URL).
    pub username: Option<String>,
    /// A file whose content (one trailing newline dropped) is the password. Default: none; the
    /// `HOTSPLIT_REDIS_PASSWORD` environment variable or the URL may give it instead.
    pub password_file: Option<PathBuf>,
    /// The most bytes the embedded store holds: each copy's key and value plus 136 bytes of
    /// per-entry overhead (the measured 218 bytes of memory per copy of a 64-byte value), and
    /// each version counter. A publish that would pass it is refused whole with 507
    /// `store_full` before any copy changes; invalidations, and writes that do not grow the
    /// store, are always accepted. Only for the embedded store (Redis has `maxmemory`): setting
    /// it with `store.redis` is an error. Default: 1073741824 (1 GiB, about 4.9 million copies
    /// of 64-byte values), so a runaway publisher cannot take the host's memory while the
    /// embedded store is used to try hotsplit or in tests.
    pub memory_max_bytes: Option<u64>,
    /// Send the primary reads of copies (the decision reads) on one pipelined connection of
    /// hotsplit's own per primary, with the same TLS, user and timeout, instead of through the
    /// Redis client's per-command path; a read the node refuses (`MOVED`, …) and every read
    /// while that connection is not up go through the client. `false` sends every read
    /// through the client. Default: `true`.
    pub direct_reads: bool,
    /// The password from the `HOTSPLIT_REDIS_PASSWORD` environment variable, set by the
    /// binary; never read from the file. It overrides `password_file`.
    #[serde(skip)]
    pub password: Option<Password>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            replicas: Vec::new(),
            redis: None,
            command_timeout: RedisOptions::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: RedisOptions::DEFAULT_CONNECT_TIMEOUT,
            version_retention: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            username: None,
            password_file: None,
            memory_max_bytes: None,
            direct_reads: true,
            password: None,
        }
    }
}

impl StoreConfig {
    /// `store.memory_max_bytes`, or its default.
    pub(crate) fn memory_max_bytes(&self) -> u64 {
        self.memory_max_bytes.unwrap_or(DEFAULT_MEMORY_MAX_BYTES)
    }

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
        match (self.memory_max_bytes, &self.redis) {
            (Some(0), _) => {
                return invalid("store.memory_max_bytes".into(), "must be positive".into())
            }
            (Some(_), Some(_)) => return invalid(
                "store.memory_max_bytes".into(),
                "bounds the embedded store only; with store.redis, bound Redis with its maxmemory"
                    .into(),
            ),
            _ => {}
        }
        let url = match &self.redis {
            Some(url) => Some(RedisUrl::parse(url).map_err(|err| {
                Error::new(ErrorKind::Config, format!("store.redis: {}", err.message()))
            })?),
            None => None,
        };
        let tls = url.as_ref().is_some_and(|url| url.tls);
        for (field, set) in [
            ("store.tls_ca_file", self.tls_ca_file.is_some()),
            ("store.tls_cert_file", self.tls_cert_file.is_some()),
            ("store.tls_key_file", self.tls_key_file.is_some()),
        ] {
            if set && !tls {
                return invalid(
                    field.into(),
                    "needs a tls url in store.redis (rediss:// or rediss-cluster://)".into(),
                );
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return invalid(
                "store.tls_cert_file".into(),
                "a client certificate needs store.tls_key_file, and a key needs the certificate"
                    .into(),
            );
        }
        if url.is_none() && (self.username.is_some() || self.password_file.is_some()) {
            return invalid(
                "store.username".into(),
                "credentials need store.redis: the embedded store has no users".into(),
            );
        }
        if let Some(url) = &url {
            if url.username.is_some() && self.username.is_some() && url.username != self.username {
                return invalid(
                    "store.username".into(),
                    "differs from the user in store.redis; set one".into(),
                );
            }
            if url.password.is_some() && (self.password_file.is_some() || self.password.is_some()) {
                return invalid(
                    "store.password_file".into(),
                    "store.redis carries a password (user:password@), and store.password_file or HOTSPLIT_REDIS_PASSWORD gives one too; give it one way only"
                        .into(),
                );
            }
        }
        if let Some(username) = &self.username {
            if username.is_empty() || username.chars().any(|c| c.is_whitespace()) {
                return invalid(
                    "store.username".into(),
                    "must be a non-empty name without spaces".into(),
                );
            }
        }
        if !self.replicas.is_empty() {
            match &url {
                Some(url) if matches!(url.target, RedisTarget::Cluster(_)) => {
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
                replica_address(at, url, tls)?;
            }
        }
        // Reads the password file, so that a missing one stops startup before anything binds.
        self.redis_options()?;
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
        let url = RedisUrl::parse(url).map_err(|err| {
            Error::new(ErrorKind::Config, format!("store.redis: {}", err.message()))
        })?;
        let mut options = RedisOptions::new(url.target);
        options.command_timeout = self.command_timeout;
        options.connect_timeout = self.connect_timeout;
        options.direct_reads = self.direct_reads;
        options.replicas = self
            .replicas
            .iter()
            .enumerate()
            .map(|(at, replica)| replica_address(at, replica, url.tls))
            .collect::<Result<Vec<String>>>()?;
        let password = match (&url.password, &self.password, &self.password_file) {
            (Some(password), _, _) | (None, Some(password), _) => Some(password.clone()),
            (None, None, Some(path)) => Some(read_password_file(path)?),
            (None, None, None) => None,
        };
        options.security = RedisSecurity {
            tls: url.tls.then(|| TlsOptions {
                ca_file: self.tls_ca_file.clone(),
                cert_file: self.tls_cert_file.clone(),
                key_file: self.tls_key_file.clone(),
            }),
            username: url.username.or_else(|| self.username.clone()),
            password,
        };
        Ok(Some(options))
    }
}

/// Reads the password in `path`, without one trailing newline.
fn read_password_file(path: &std::path::Path) -> Result<Password> {
    let invalid = |why: String| {
        Error::new(
            ErrorKind::Config,
            format!("store.password_file: {}: {why}", path.display()),
        )
    };
    let text =
        std::fs::read_to_string(path).map_err(|err| invalid(format!("cannot read: {err}")))?;
    let text = text
        .strip_suffix('\n')
        .map(|text| text.strip_suffix('\r').unwrap_or(text))
        .unwrap_or(&text);
    if text.is_empty() {
        return Err(invalid("is empty".to_owned()));
    }
    Ok(Password::new(text))
}

/// The `host:port` of `store.replicas[at]`, which must be a one-server URL without
/// credentials (the primary's are used), with TLS exactly when the primary's URL has it.
fn replica_address(at: usize, url: &str, tls: bool) -> Result<String> {
    let invalid =
        |why: String| Error::new(ErrorKind::Config, format!("store.replicas[{at}]: {why}"));
    let parsed = RedisUrl::parse(url).map_err(|err| invalid(err.message().to_owned()))?;
    if parsed.username.is_some() || parsed.password.is_some() {
        return Err(invalid(format!(
            "{:?} carries credentials; replicas use the primary's",
            redact_url(url)
        )));
    }
    if parsed.tls != tls {
        let wanted = if tls { "rediss://" } else { "redis://" };
        return Err(invalid(format!(
            "must be a {wanted}host:port url, like store.redis"
        )));
    }
    match parsed.target {
        RedisTarget::Standalone(address) => Ok(address),
        RedisTarget::Cluster(_) => Err(invalid("must name one server, not a cluster".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(text: &str) -> StoreConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn tls_files_and_credentials_become_the_security_of_every_connection() {
        let dir = tempfile::tempdir().unwrap();
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, "hunter2\n").unwrap();
        let mut config = store(&format!(
            "redis = \"rediss://10.0.0.1:6380\"\nreplicas = [\"rediss://10.0.0.2:6380\"]\ntls_ca_file = \"/ca.pem\"\ntls_cert_file = \"/c.pem\"\ntls_key_file = \"/c.key\"\nusername = \"hotsplit\"\npassword_file = {:?}\n",
            password_file.display().to_string()
        ));
        config.validate().unwrap();
        let options = config.redis_options().unwrap().unwrap();
        assert_eq!(options.replicas, vec!["10.0.0.2:6380".to_owned()]);
        let security = &options.security;
        let tls = security.tls.as_ref().unwrap();
        assert_eq!(
            tls.ca_file.as_deref(),
            Some(std::path::Path::new("/ca.pem"))
        );
        assert_eq!(
            tls.key_file.as_deref(),
            Some(std::path::Path::new("/c.key"))
        );
        assert_eq!(security.username.as_deref(), Some("hotsplit"));
        assert_eq!(security.password, Some(Password::new("hunter2")));
        assert!(!format!("{config:?}{options:?}").contains("hunter2"));

        // The environment's password wins over the file.
        config.password = Some(Password::new("from-env"));
        let options = config.redis_options().unwrap().unwrap();
        assert_eq!(options.security.password, Some(Password::new("from-env")));
    }

    #[test]
    fn inconsistent_security_settings_name_the_field() {
        let cases = [
            (
                "redis = \"redis://h:1\"\ntls_ca_file = \"/ca\"",
                "store.tls_ca_file: needs a tls url",
            ),
            (
                "redis = \"rediss://h:1\"\ntls_cert_file = \"/c\"",
                "store.tls_cert_file",
            ),
            ("tls_key_file = \"/k\"", "store.tls_key_file"),
            (
                "username = \"u\"",
                "store.username: credentials need store.redis",
            ),
            (
                "redis = \"redis://a@h:1\"\nusername = \"b\"",
                "store.username: differs",
            ),
            (
                "redis = \"redis://a:pw@h:1\"\npassword_file = \"/p\"",
                "store.password_file",
            ),
            (
                "redis = \"redis://h:1\"\npassword_file = \"/nonexistent/pw\"",
                "cannot read",
            ),
            (
                "redis = \"rediss://h:1\"\nreplicas = [\"redis://r:1\"]",
                "must be a rediss://",
            ),
            (
                "redis = \"redis://h:1\"\nreplicas = [\"redis://u:hunter2@r:1\"]",
                "carries credentials",
            ),
            (
                "redis = \"valkey://h:1\"\nreplicas = [\"valkey://r:1\"]",
                "",
            ),
            (
                "memory_max_bytes = 0",
                "store.memory_max_bytes: must be positive",
            ),
            (
                "redis = \"redis://h:1\"\nmemory_max_bytes = 1000",
                "store.memory_max_bytes: bounds the embedded store only",
            ),
            ("memory_max_bytes = 1000", ""),
        ];
        for (text, expected) in cases {
            let result = store(text).validate();
            if expected.is_empty() {
                result.unwrap();
                continue;
            }
            let err = result.unwrap_err();
            assert!(err.message().contains(expected), "{text}: {err}");
            assert!(!err.message().contains("hunter2"), "{err}");
        }
    }
}
