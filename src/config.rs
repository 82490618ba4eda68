//! Configuration: one [`Config`] made of per-subsystem sub-configs.
//!
//! It is read from a TOML file, then overridden by command-line flags and `HOTSPLIT_*`
//! environment variables (the binary does that), and validated by [`Config::validate`] before
//! anything binds. A field that is wrong stops startup with a message naming it. Durations are
//! written the humantime way: `"250ms"`, `"2s"`, `"10m"`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, ErrorKind, Result};
use crate::key::Key;
use crate::store::redis::target::{RedisOptions, RedisTarget};

/// The largest number of copies a family may have.
pub const MAX_COPIES: u32 = 1024;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The HTTP server.
    pub server: ServerConfig,
    /// The store: embedded, or Redis.
    pub store: StoreConfig,
    /// The read path.
    pub read: ReadConfig,
    /// Healing: the retry queue, its spool, read repair and expiry jitter.
    pub heal: HealConfig,
    /// The family every key not matched by a prefix belongs to.
    pub default_family: DefaultFamilyConfig,
    /// Key families by prefix; the longest matching prefix wins.
    #[serde(rename = "family")]
    pub families: Vec<FamilyConfig>,
    /// Read classes by name (`[classes.<name>]`), over the built-in ones (`advisory`,
    /// `re-derivable`, `decides-on-presence`, `primary`); a table with a built-in's name replaces
    /// it. Default: the built-ins only.
    pub classes: std::collections::BTreeMap<String, ClassConfig>,
    /// Routing: lag monitor, pins.
    pub route: RouteConfig,
}

/// Where a read class sends reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteTarget {
    /// A replica of the node that owns the copy, within the class's staleness budget.
    Replica,
    /// The primary that owns the copy.
    Primary,
}

/// What a replica-routed read does when the replica is over the class's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBreach {
    /// The primary serves (reason `lag-breach`).
    Primary,
    /// The read fails with 503 `staleness_budget_exceeded`.
    Fail,
}

/// One read class (`[classes.<name>]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// `replica` or `primary`. Required.
    pub route: RouteTarget,
    /// One line: why reads of this class may, or may not, be stale. Required, non-empty.
    pub reason: String,
    /// For `replica` routes: the largest replica lag a read accepts. Required for `replica`
    /// routes, refused for `primary` ones.
    #[serde(default, with = "opt_duration")]
    pub staleness_budget: Option<Duration>,
    /// For `replica` routes: what happens over budget. Default: `primary`.
    #[serde(default)]
    pub on_breach: Option<OnBreach>,
}

/// Routing: the lag monitor and read-your-writes pins.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteConfig {
    /// How often each instance writes its heartbeat on every primary and reads it back on every
    /// replica. Default: `100ms`.
    #[serde(with = "duration")]
    pub heartbeat_interval: Duration,
    /// The sliding window of lag samples reported per replica. Default: `60s`.
    #[serde(with = "duration")]
    pub lag_window: Duration,
    /// How long a request id that wrote pins later reads carrying it to primaries. Default: `5s`.
    #[serde(with = "duration")]
    pub request_pin_window: Duration,
    /// The most (client, key) floors (written and seen) and request pins held in memory; the least recently
    /// used go first. Default: 100000.
    pub max_pins: usize,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            heartbeat_interval: Duration::from_millis(100),
            lag_window: Duration::from_secs(60),
            request_pin_window: Duration::from_secs(5),
            max_pins: 100_000,
        }
    }
}

/// The HTTP server.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The address to listen on. Default: `127.0.0.1:7070`.
    pub listen: SocketAddr,
    /// The largest accepted value (request body), in bytes. Default: 1048576 (1 MiB).
    pub max_value_bytes: usize,
    /// How long shutdown waits for in-flight requests and background tasks. Default: `10s`.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            max_value_bytes: 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// The store.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://host:port` (standalone) or `redis-cluster://host:port[,host:port]` (Cluster).
    /// Default: none, which runs the embedded in-memory store.
    pub redis: Option<String>,
    /// How long one Redis command may take before it fails; no request hangs on a paused node.
    /// Default: `500ms`.
    #[serde(with = "duration")]
    pub command_timeout: Duration,
    /// How long connecting to Redis at startup may take. Default: `2s`.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Replicas of a standalone primary, each `redis://host:port`, read by replica-routed
    /// classes. In Cluster mode replicas are discovered and this must be empty. A replica that
    /// is down at startup does not stop it: it is connected later and counts as over every
    /// budget until its heartbeat is seen.
    /// Default: none (the primary serves, reason `no-replica`).
    pub replicas: Vec<String>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            replicas: Vec::new(),
            redis: None,
            command_timeout: RedisOptions::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: RedisOptions::DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// The read path.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadConfig {
    /// How many sibling copies a read consults when its affine copy is below the floor, missing
    /// or unreachable. Default: 2.
    pub fallback_copies: u32,
    /// The `Retry-After` sent with 503 answers. Default: `1s`.
    #[serde(with = "duration")]
    pub retry_after: Duration,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            fallback_copies: 2,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// Healing of copies whose write failed: the retry queue, its spool, read repair, expiry jitter.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealConfig {
    /// The directory of the retry spool (created if missing; one process owns it, through a lock
    /// file). Used with the Redis store only: the embedded store never fails a copy write.
    /// Default: `hotsplit-data/spool`, relative to the working directory.
    pub spool_dir: PathBuf,
    /// The most entries the retry queue holds; a failed copy beyond it is `dropped`.
    /// Default: 100000.
    pub max_entries: usize,
    /// The most bytes (values counted once per key and version, plus per-entry overhead) the
    /// retry queue holds; a failed copy beyond it is `dropped`. Default: 268435456 (256 MiB).
    pub max_bytes: usize,
    /// The first wait before probing a failing node again. Default: `50ms`.
    #[serde(with = "duration")]
    pub backoff_initial: Duration,
    /// The longest wait between probes of a failing node (exponential, full jitter).
    /// Default: `5s`.
    #[serde(with = "duration")]
    pub backoff_cap: Duration,
    /// How many entries one flush command batch carries once a node answers again. Default: 256.
    pub flush_batch: usize,
    /// The lower bound of each value copy's expiry jitter, as a fraction of the family TTL in
    /// -0.5..=0. Default: -0.1.
    pub expiry_jitter_min: f64,
    /// The upper bound of each value copy's expiry jitter, in `expiry_jitter_min..=0`, so no
    /// copy outlives the family TTL. Default: 0.
    pub expiry_jitter_max: f64,
    /// How many read repairs may run at once; a repair beyond it is skipped (and counted).
    /// Default: 16.
    pub repair_concurrency: usize,
    /// How often each family's layout record is re-read to detect a mismatch. Default: `5s`.
    #[serde(with = "duration")]
    pub layout_interval: Duration,
    /// How often, after a family shrank, its keys are scanned and copies beyond its copy count
    /// deleted. Default: `1m`.
    #[serde(with = "duration")]
    pub sweep_interval: Duration,
}

impl Default for HealConfig {
    fn default() -> Self {
        HealConfig {
            spool_dir: PathBuf::from("hotsplit-data/spool"),
            max_entries: 100_000,
            max_bytes: 256 * 1024 * 1024,
            backoff_initial: Duration::from_millis(50),
            backoff_cap: Duration::from_secs(5),
            flush_batch: 256,
            expiry_jitter_min: -0.1,
            expiry_jitter_max: 0.0,
            repair_concurrency: 16,
            layout_interval: Duration::from_secs(5),
            sweep_interval: Duration::from_secs(60),
        }
    }
}

/// Who chooses a family's versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Versioning {
    /// The caller sends `?version=V`, an edit counter from its source of truth.
    #[default]
    Caller,
    /// hotsplit allocates versions from a per-key counter on the primary.
    Allocated,
}

impl Versioning {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Versioning::Caller => "caller",
            Versioning::Allocated => "allocated",
        }
    }
}

/// The built-in family that covers every key no prefix matches.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultFamilyConfig {
    /// Copies per key. Default: 1 (unsplit).
    pub copies: u32,
    /// How long a value lives after it is published. Default: `1h`.
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// Who chooses versions. Default: `caller`.
    pub versioning: Versioning,
    /// The read class of reads that name none. Default: `primary`.
    pub default_class: String,
    /// How long a client's write floor, or the seen floor a moved read left it, holds its reads
    /// of that key. Default: `2s`.
    #[serde(with = "duration")]
    pub pin_window: Duration,
}

impl Default for DefaultFamilyConfig {
    fn default() -> Self {
        DefaultFamilyConfig {
            copies: 1,
            ttl: Duration::from_secs(3600),
            versioning: Versioning::Caller,
            default_class: DEFAULT_CLASS.to_owned(),
            pin_window: DEFAULT_PIN_WINDOW,
        }
    }
}

/// The default `default_class` of a family: reads go to the primary, as in the Core.
pub const DEFAULT_CLASS: &str = "primary";

/// The default `pin_window` of a family.
pub const DEFAULT_PIN_WINDOW: Duration = Duration::from_secs(2);

fn default_class() -> String {
    DEFAULT_CLASS.to_owned()
}

fn default_pin_window() -> Duration {
    DEFAULT_PIN_WINDOW
}

/// A key family: keys that start with `prefix`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyConfig {
    /// The key prefix; the longest matching prefix wins. Required, non-empty.
    pub prefix: String,
    /// Copies per key, 1..=1024. Required.
    pub copies: u32,
    /// How long a value lives after it is published; must be positive. Default: `1h`.
    #[serde(with = "duration", default = "default_ttl")]
    pub ttl: Duration,
    /// Who chooses versions. Default: `caller`.
    #[serde(default)]
    pub versioning: Versioning,
    /// The read class of reads that name none. Default: `primary`.
    #[serde(default = "default_class")]
    pub default_class: String,
    /// How long a client's write floor holds its reads of that key. Default: `2s`.
    #[serde(with = "duration", default = "default_pin_window")]
    pub pin_window: Duration,
}

fn default_ttl() -> Duration {
    Duration::from_secs(3600)
}

impl Config {
    /// Reads a TOML file.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the file cannot be read or does not parse; the message names
    /// the file and, for a bad field, the field.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!("cannot read config file {}: {err}", path.display()),
            )
        })?;
        Config::from_toml(&text).map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!("config file {}: {}", path.display(), err.message()),
            )
        })
    }

    /// Parses TOML text.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field that does not parse.
    pub fn from_toml(text: &str) -> Result<Config> {
        toml::from_str(text)
            .map_err(|err| Error::new(ErrorKind::Config, err.to_string().trim_end().to_owned()))
    }

    /// Checks every field; the first problem found is returned, naming the field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] with a message such as `family[1].copies: must be in 1..=1024, got 0`.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: String, why: String| {
            Err(Error::new(ErrorKind::Config, format!("{field}: {why}")))
        };
        if self.server.max_value_bytes == 0 {
            return invalid("server.max_value_bytes".into(), "must be positive".into());
        }
        if self.store.command_timeout.is_zero() {
            return invalid("store.command_timeout".into(), "must be positive".into());
        }
        if self.store.connect_timeout.is_zero() {
            return invalid("store.connect_timeout".into(), "must be positive".into());
        }
        if let Some(url) = &self.store.redis {
            if let Err(err) = RedisTarget::parse(url) {
                return invalid("store.redis".into(), err.message().to_owned());
            }
        }
        if self.read.fallback_copies > MAX_COPIES {
            return invalid(
                "read.fallback_copies".into(),
                format!(
                    "must be at most {MAX_COPIES}, got {}",
                    self.read.fallback_copies
                ),
            );
        }
        if !self.store.replicas.is_empty() {
            match &self.store.redis {
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
            for (at, url) in self.store.replicas.iter().enumerate() {
                match RedisTarget::parse(url) {
                    Ok(RedisTarget::Standalone(_)) => {}
                    Ok(_) => {
                        return invalid(
                            format!("store.replicas[{at}]"),
                            "must be a redis://host:port url".into(),
                        )
                    }
                    Err(err) => {
                        return invalid(format!("store.replicas[{at}]"), err.message().to_owned())
                    }
                }
            }
        }
        let route = &self.route;
        if route.heartbeat_interval < Duration::from_millis(1) {
            return invalid(
                "route.heartbeat_interval".into(),
                "must be at least 1ms".into(),
            );
        }
        if route.lag_window < route.heartbeat_interval {
            return invalid(
                "route.lag_window".into(),
                "must be at least route.heartbeat_interval".into(),
            );
        }
        if route.request_pin_window.is_zero() {
            return invalid("route.request_pin_window".into(), "must be positive".into());
        }
        if route.max_pins == 0 {
            return invalid("route.max_pins".into(), "must be positive".into());
        }
        let classes = crate::route::Classes::from_config(self)?;
        self.heal.validate()?;
        check_family(
            "default_family",
            self.default_family.copies,
            self.default_family.ttl,
        )?;
        check_family_route(
            &classes,
            "default_family",
            self.default_family.copies,
            &self.default_family.default_class,
            self.default_family.pin_window,
        )?;
        let mut seen = std::collections::HashSet::new();
        for (at, family) in self.families.iter().enumerate() {
            let field = format!("family[{at}]");
            check_family(&field, family.copies, family.ttl)?;
            check_family_route(
                &classes,
                &field,
                family.copies,
                &family.default_class,
                family.pin_window,
            )?;
            if family.prefix.is_empty() {
                return invalid(format!("{field}.prefix"), "must not be empty".into());
            }
            if let Err(err) = Key::parse(&family.prefix) {
                return invalid(
                    format!("{field}.prefix"),
                    format!("is not a valid key prefix: {err}"),
                );
            }
            if !seen.insert(family.prefix.as_str()) {
                return invalid(
                    format!("{field}.prefix"),
                    format!("{:?} is configured twice", family.prefix),
                );
            }
        }
        Ok(())
    }
}

impl HealConfig {
    /// Checks every `heal.*` field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, why: String| {
            Err(Error::new(
                ErrorKind::Config,
                format!("heal.{field}: {why}"),
            ))
        };
        if self.spool_dir.as_os_str().is_empty() {
            return invalid("spool_dir", "must not be empty".into());
        }
        if self.max_entries == 0 {
            return invalid("max_entries", "must be positive".into());
        }
        if self.max_bytes == 0 {
            return invalid("max_bytes", "must be positive".into());
        }
        if self.backoff_initial.is_zero() {
            return invalid("backoff_initial", "must be positive".into());
        }
        if self.backoff_cap < self.backoff_initial {
            return invalid(
                "backoff_cap",
                "must be at least heal.backoff_initial".into(),
            );
        }
        if self.flush_batch == 0 {
            return invalid("flush_batch", "must be positive".into());
        }
        if !(-0.5..=0.0).contains(&self.expiry_jitter_min) {
            return invalid(
                "expiry_jitter_min",
                format!("must be in -0.5..=0, got {}", self.expiry_jitter_min),
            );
        }
        if !(self.expiry_jitter_min..=0.0).contains(&self.expiry_jitter_max) {
            return invalid(
                "expiry_jitter_max",
                format!(
                    "must be in heal.expiry_jitter_min..=0, got {}",
                    self.expiry_jitter_max
                ),
            );
        }
        if self.repair_concurrency == 0 {
            return invalid("repair_concurrency", "must be positive".into());
        }
        if self.layout_interval.is_zero() {
            return invalid("layout_interval", "must be positive".into());
        }
        if self.sweep_interval.is_zero() {
            return invalid("sweep_interval", "must be positive".into());
        }
        Ok(())
    }
}

fn check_family(field: &str, copies: u32, ttl: Duration) -> Result<()> {
    if !(1..=MAX_COPIES).contains(&copies) {
        return Err(Error::new(
            ErrorKind::Config,
            format!("{field}.copies: must be in 1..={MAX_COPIES}, got {copies}"),
        ));
    }
    if ttl < Duration::from_millis(1) {
        return Err(Error::new(
            ErrorKind::Config,
            format!("{field}.ttl: must be at least 1ms"),
        ));
    }
    Ok(())
}

fn check_family_route(
    classes: &crate::route::Classes,
    field: &str,
    copies: u32,
    default_class: &str,
    pin_window: Duration,
) -> Result<()> {
    let Some(class) = classes.by_name(default_class) else {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "{field}.default_class: unknown class {default_class:?}; known: {}",
                classes.names().join(", ")
            ),
        ));
    };
    if copies > 1 && classes.get(class).requires_single_copy() {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "{field}.default_class: class {default_class:?} decides on presence and needs copies = 1, but the family has {copies} copies, which can disagree on presence"
            ),
        ));
    }
    if pin_window.is_zero() {
        return Err(Error::new(
            ErrorKind::Config,
            format!("{field}.pin_window: must be positive"),
        ));
    }
    Ok(())
}

/// A resolved family, as the publish and read paths use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The prefix, or empty for the default family.
    pub prefix: String,
    /// Copies per key.
    pub copies: u32,
    /// How long a value lives after it is published.
    pub ttl: Duration,
    /// Who chooses versions.
    pub versioning: Versioning,
    /// The read class of reads that name none.
    pub default_class: String,
    /// How long a client's write floor holds its reads of a key.
    pub pin_window: Duration,
}

impl Family {
    /// The family's display name: its prefix, or `default`.
    pub fn name(&self) -> &str {
        if self.prefix.is_empty() {
            "default"
        } else {
            &self.prefix
        }
    }
}

/// The family table: longest prefix wins, the default family covers the rest.
#[derive(Debug, Clone)]
pub struct Families {
    /// Prefixed families, longest prefix first.
    by_prefix: Vec<Family>,
    /// The family of every other key.
    default: Family,
}

impl Families {
    /// Builds the table from a validated config.
    pub fn from_config(config: &Config) -> Families {
        let mut by_prefix: Vec<Family> = config
            .families
            .iter()
            .map(|family| Family {
                prefix: family.prefix.clone(),
                copies: family.copies,
                ttl: family.ttl,
                versioning: family.versioning,
                default_class: family.default_class.clone(),
                pin_window: family.pin_window,
            })
            .collect();
        by_prefix.sort_by(|a, b| {
            b.prefix
                .len()
                .cmp(&a.prefix.len())
                .then(a.prefix.cmp(&b.prefix))
        });
        Families {
            by_prefix,
            default: Family {
                prefix: String::new(),
                copies: config.default_family.copies,
                ttl: config.default_family.ttl,
                versioning: config.default_family.versioning,
                default_class: config.default_family.default_class.clone(),
                pin_window: config.default_family.pin_window,
            },
        }
    }

    /// The family of `key`: the longest matching prefix, or the default family.
    pub fn resolve(&self, key: &Key) -> &Family {
        self.by_prefix
            .iter()
            .find(|family| key.as_str().starts_with(&family.prefix))
            .unwrap_or(&self.default)
    }

    /// Every family, the default one last.
    pub fn iter(&self) -> impl Iterator<Item = &Family> {
        self.by_prefix.iter().chain(std::iter::once(&self.default))
    }
}

/// Serde support for optional humantime durations.
pub(crate) mod opt_duration {
    use std::time::Duration;

    use serde::Deserializer;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::duration::deserialize(deserializer).map(Some)
    }
}

/// Serde support for humantime durations (`"250ms"`, `"10m"`).
pub(crate) mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(|err| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration ({err}); write it like \"250ms\", \"2s\" or \"10m\""
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> Key {
        Key::parse(raw).unwrap()
    }

    #[test]
    fn longest_prefix_wins_and_default_covers_the_rest() {
        let config = Config::from_toml(
            r#"
            [[family]]
            prefix = "post:"
            copies = 8
            [[family]]
            prefix = "post:hot:"
            copies = 32
            ttl = "30s"
            versioning = "allocated"
            "#,
        )
        .unwrap();
        config.validate().unwrap();
        let families = Families::from_config(&config);
        assert_eq!(families.resolve(&key("post:9")).copies, 8);
        let hot = families.resolve(&key("post:hot:1"));
        assert_eq!(
            (hot.copies, hot.ttl, hot.versioning),
            (32, Duration::from_secs(30), Versioning::Allocated)
        );
        assert_eq!(families.resolve(&key("user:1")).copies, 1);
        assert_eq!(families.resolve(&key("user:1")).name(), "default");
    }

    #[test]
    fn invalid_fields_are_named() {
        let cases = [
            ("[[family]]\nprefix = \"a\"\ncopies = 0", "family[0].copies"),
            (
                "[[family]]\nprefix = \"a\"\ncopies = 1025",
                "family[0].copies",
            ),
            (
                "[[family]]\nprefix = \"a{\"\ncopies = 2",
                "family[0].prefix",
            ),
            (
                "[[family]]\nprefix = \"a\"\ncopies = 2\n[[family]]\nprefix = \"a\"\ncopies = 3",
                "family[1].prefix",
            ),
            (
                "[[family]]\nprefix = \"a\"\ncopies = 2\nttl = \"0s\"",
                "family[0].ttl",
            ),
            ("[store]\nredis = \"http://x\"", "store.redis"),
            ("[default_family]\ncopies = 0", "default_family.copies"),
            (
                "[[family]]\nprefix = \"a\"\ncopies = 2\ndefault_class = \"decides-on-presence\"",
                "family[0].default_class",
            ),
            (
                "[default_family]\ncopies = 2\ndefault_class = \"decides-on-presence\"",
                "default_family.default_class",
            ),
            (
                "[[family]]\nprefix = \"a\"\ncopies = 1\ndefault_class = \"nope\"",
                "family[0].default_class",
            ),
            (
                "[[family]]\nprefix = \"a\"\ncopies = 1\npin_window = \"0s\"",
                "family[0].pin_window",
            ),
            (
                "[classes.x]\nroute = \"replica\"\nreason = \"r\"",
                "classes.x.staleness_budget",
            ),
            (
                "[route]\nheartbeat_interval = \"0s\"",
                "route.heartbeat_interval",
            ),
            ("[route]\nlag_window = \"1ms\"", "route.lag_window"),
            (
                "[route]\nrequest_pin_window = \"0s\"",
                "route.request_pin_window",
            ),
            ("[store]\nreplicas = [\"redis://r:1\"]", "store.replicas"),
            (
                "[store]\nredis = \"redis-cluster://a:1\"\nreplicas = [\"redis://r:1\"]",
                "store.replicas",
            ),
            (
                "[store]\nredis = \"redis://a:1\"\nreplicas = [\"http://r:1\"]",
                "store.replicas[0]",
            ),
            ("[heal]\nmax_entries = 0", "heal.max_entries"),
            ("[heal]\nexpiry_jitter_max = 0.1", "heal.expiry_jitter_max"),
            ("[heal]\nbackoff_cap = \"1ms\"", "heal.backoff_cap"),
        ];
        for (text, field) in cases {
            let err = Config::from_toml(text)
                .and_then(|config| config.validate())
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(err.message().contains(field), "{text:?}: {err}");
        }
    }

    #[test]
    fn parse_errors_name_the_field() {
        let err = Config::from_toml("[store]\ncommand_timeout = \"soon\"").unwrap_err();
        assert!(err.message().contains("command_timeout"), "{err}");
        let err = Config::from_toml("[server]\nlisten_on = \"x\"").unwrap_err();
        assert!(err.message().contains("listen_on"), "{err}");
        // Budgets and windows that do not parse stop startup naming the field.
        for (text, field) in [
            (
                "[classes.advisory]\nroute = \"replica\"\nreason = \"r\"\nstaleness_budget = \"quick\"",
                "staleness_budget",
            ),
            ("[[family]]\nprefix = \"a\"\ncopies = 1\npin_window = \"2 parsecs\"", "pin_window"),
            ("[route]\nlag_window = \"a minute\"", "lag_window"),
            ("[route]\nrequest_pin_window = \"x\"", "request_pin_window"),
            ("[route]\nheartbeat_interval = \"often\"", "heartbeat_interval"),
            ("[classes.advisory]\nroute = \"sideways\"\nreason = \"r\"", "route"),
            ("[classes.advisory]\nroute = \"replica\"\nreason = \"r\"\nstaleness_budget = \"1s\"\non_breach = \"panic\"", "on_breach"),
        ] {
            let err = Config::from_toml(text).unwrap_err();
            assert!(err.message().contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../hotsplit.example.toml");
        Config::from_toml(text).unwrap().validate().unwrap();
    }
}
