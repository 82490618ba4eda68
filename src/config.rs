//! Configuration: the composition root of every subsystem's config.
//!
//! One [`Config`] is made of the sub-configs each subsystem owns, as linkerd's `app::Config` is:
//! [`ServerConfig`] in the door core (`door`), [`StoreConfig`] beside `store`, [`ReadConfig`] beside
//! `read`, [`HealConfig`] and [`ScrubConfig`] beside `heal`, [`RouteConfig`] and [`ClassConfig`] beside `route`, and
//! the family tables beside `family`. This module reads a TOML file (the binary then layers
//! command-line flags and `HOTSPLIT_*` environment variables over it), runs each sub-config's
//! own checks and the checks that span subsystems (a family's default class must exist in the
//! class table), and builds the family resolver. It imports downwards only: no module below it
//! imports `config`.
//!
//! [`Config::validate`] runs before anything binds. A field that is wrong stops startup with a
//! message naming it. Durations are written the humantime way: `"250ms"`, `"2s"`, `"10m"`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::family::{self, Families, MAX_COPIES};
use crate::route::Classes;

pub use crate::auth::AuthConfig;
pub use crate::door::ServerConfig;
pub use crate::family::{DefaultFamilyConfig, FamilyConfig};
pub use crate::fleet::{FleetConfig, SessionConfig};
pub use crate::heal::{HealConfig, ScrubConfig};
pub use crate::http::config::AdminConfig;
pub use crate::near::NearCacheConfig;
pub use crate::read::ReadConfig;
pub use crate::resp::RespConfig;
pub use crate::route::{ClassConfig, RouteConfig};
pub use crate::store::StoreConfig;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The HTTP server.
    pub server: ServerConfig,
    /// The admin listener.
    pub admin: AdminConfig,
    /// The Redis-protocol listener (`[resp]`), off unless `resp.listen` is set.
    pub resp: RespConfig,
    /// The store: embedded, or Redis.
    pub store: StoreConfig,
    /// The read path.
    pub read: ReadConfig,
    /// Healing: the retry queue, its spool, read repair and expiry jitter.
    pub heal: HealConfig,
    /// The anti-entropy scrub (Redis store only).
    pub scrub: ScrubConfig,
    /// The family every key not matched by a prefix belongs to.
    pub default_family: DefaultFamilyConfig,
    /// Key families by prefix; the longest matching prefix wins.
    #[serde(rename = "family")]
    pub families: Vec<FamilyConfig>,
    /// Read classes by name (`[classes.<name>]`), over the built-in ones (`advisory`,
    /// `re-derivable`, `decides-on-presence`, `primary`); a table with a built-in's name replaces
    /// it. Default: the built-ins only.
    pub classes: BTreeMap<String, ClassConfig>,
    /// Routing: lag monitor, pins.
    pub route: RouteConfig,
    /// The fleet: the instance registry.
    pub fleet: FleetConfig,
    /// API tokens.
    pub auth: AuthConfig,
    /// The per-instance near cache (`[near_cache]`); how old an answer each class accepts from
    /// it is `classes.<name>.near_cache_max_age`.
    pub near_cache: NearCacheConfig,
    /// Session tokens (`Hotsplit-Session`).
    pub session: SessionConfig,
    /// The hot-key detector (`[hot_keys]`).
    pub hot_keys: crate::hot::HotKeysConfig,
    /// The invalidation feed between instances (`[feed]`).
    pub feed: crate::feed::FeedConfig,
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

    /// The three listeners differ from one another.
    fn check_listeners(&self) -> Result<()> {
        if self.admin.listen == Some(self.server.listen) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "admin.listen: must differ from server.listen ({})",
                    self.server.listen
                ),
            ));
        }
        if let Some(resp) = self.resp.listen {
            if resp == self.server.listen || Some(resp) == self.admin.listen {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "resp.listen: must differ from server.listen and admin.listen ({resp})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks every field; the first problem found is returned, naming the field.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] with a message such as `family[1].copies: must be in 1..=1024, got 0`.
    pub fn validate(&self) -> Result<()> {
        self.server.validate()?;
        self.check_exposure()?;
        self.check_listeners()?;
        self.resp.validate(self.server.max_value_bytes)?;
        self.store.validate()?;
        if self.read.fallback_copies > MAX_COPIES {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "read.fallback_copies: must be at most {MAX_COPIES}, got {}",
                    self.read.fallback_copies
                ),
            ));
        }
        self.route.validate()?;
        self.near_cache.validate()?;
        self.hot_keys.validate()?;
        let classes = Classes::from_config(&self.classes)?;
        self.feed.validate(&classes)?;
        self.heal.validate()?;
        self.fleet.validate()?;
        self.session.validate()?;
        self.scrub.validate()?;
        family::check_copies_and_ttl(
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
        let redis = self.store.redis.is_some();
        family::check_sync(
            "default_family",
            self.default_family.sync_replicas,
            self.default_family.sync_timeout,
            redis,
        )?;
        let mut seen = HashSet::new();
        for (at, family) in self.families.iter().enumerate() {
            let field = format!("family[{at}]");
            family::check_copies_and_ttl(&field, family.copies, family.ttl)?;
            family::check_sync(&field, family.sync_replicas, family.sync_timeout, redis)?;
            check_family_route(
                &classes,
                &field,
                family.copies,
                &family.default_class,
                family.pin_window,
            )?;
            family::check_prefix(&field, &family.prefix)?;
            if let Some(split) = &family.split {
                check_split(&classes, &field, family, split)?;
            }
            if !seen.insert(family.prefix.as_str()) {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("{field}.prefix: {:?} is configured twice", family.prefix),
                ));
            }
        }
        // A copy whose record went before a sibling stopped serving could take an older write
        // while the sibling still serves the newer version.
        let spread = self
            .longest_ttl()
            .mul_f64(-self.heal.expiry_jitter_min.clamp(-0.5, 0.0));
        let retention = self.version_retention();
        if retention < spread {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "store.version_retention: {}",
                    format_args!(
                        "must be at least {}ms, the longest family TTL × -heal.expiry_jitter_min (the widest expiry spread), got {}ms",
                        spread.as_millis(),
                        retention.as_millis()
                    )
                ),
            ));
        }
        Ok(())
    }

    /// Who can reach the API, and how: without tokens the listener must be loopback unless
    /// `server.allow_unauthenticated` says otherwise; with tokens a non-loopback listener needs
    /// TLS on it (`server.tls_cert_file`) or in front of it (`server.tls_terminated_upstream`),
    /// so a token never crosses a network in clear.
    fn check_exposure(&self) -> Result<()> {
        let listeners = [
            ("server.listen", Some(self.server.listen)),
            ("admin.listen", self.admin.listen),
            ("resp.listen", self.resp.listen),
        ];
        for (field, listen) in listeners {
            let Some(listen) = listen else { continue };
            if listen.ip().is_loopback() {
                continue;
            }
            if self.auth.tokens_file.is_none() {
                if !self.server.allow_unauthenticated {
                    return Err(Error::new(
                        ErrorKind::Config,
                        format!("server.allow_unauthenticated: {field} {listen} is not a loopback address and no auth.tokens_file is configured, so anyone who reaches the port could write any key; configure auth.tokens_file, listen on 127.0.0.1, or set server.allow_unauthenticated = true"),
                    ));
                }
            } else if self.server.tls_cert_file.is_some() {
                continue;
            } else if field == "resp.listen" {
                // The Redis port has its own flag: a proxy terminating HTTPS in front of
                // hotsplit says nothing of the Redis port, whose AUTH tokens would go in clear.
                if !self.resp.tls_terminated_upstream {
                    let http_flag = if self.server.tls_terminated_upstream {
                        " (server.tls_terminated_upstream covers the HTTP listener only)"
                    } else {
                        ""
                    };
                    return Err(Error::new(
                        ErrorKind::Config,
                        format!("resp.tls_terminated_upstream: {field} {listen} is not a loopback address and has no TLS (server.tls_cert_file), so AUTH tokens would cross the network in clear{http_flag}; set resp.tls_terminated_upstream = true when TLS for the Redis port ends in a proxy in front of hotsplit"),
                    ));
                }
            } else if !self.server.tls_terminated_upstream {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("server.tls_terminated_upstream: {field} {listen} is not a loopback address and has no TLS (server.tls_cert_file), so bearer tokens would cross the network in clear; set server.tls_terminated_upstream = true when TLS ends in a proxy in front of hotsplit"),
                ));
            }
        }
        Ok(())
    }

    /// The configuration as TOML, with secrets left out: a Redis URL's password and query
    /// values are redacted, `HOTSPLIT_REDIS_PASSWORD` is never serialized, and tokens live in
    /// their own file (which `hotsplit config check` summarises by name). What `config check`
    /// prints; it parses back into this config.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] if a field cannot be written as TOML (a bug).
    pub fn redacted_toml(&self) -> Result<String> {
        let mut shown = self.clone();
        shown.store.redis = shown
            .store
            .redis
            .as_deref()
            .map(crate::store::redis::target::redact_url);
        shown.store.replicas = shown
            .store
            .replicas
            .iter()
            .map(|url| crate::store::redis::target::redact_url(url))
            .collect();
        toml::to_string(&shown).map_err(|err| {
            Error::new(
                ErrorKind::Config,
                format!("cannot write the config as toml: {err}"),
            )
        })
    }

    /// Whether `serve` answers every caller on a non-loopback address (the startup WARN).
    pub fn serves_unauthenticated_publicly(&self) -> bool {
        let public = !self.server.listen.ip().is_loopback()
            || self
                .resp
                .listen
                .is_some_and(|resp| !resp.ip().is_loopback());
        self.auth.tokens_file.is_none() && public
    }

    /// Checks that every listener's connection bound (`server.max_connections`, the admin
    /// listener's, `resp.max_connections` when `resp.listen` is set) fits under `open_files`,
    /// the process's open-file limit.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the fields and the limit.
    pub fn check_file_limit(&self, open_files: u64) -> Result<()> {
        self.server
            .check_file_limit(open_files, self.resp.connections_held())
    }

    /// The longest TTL of any family, the default family's included.
    pub fn longest_ttl(&self) -> Duration {
        self.families
            .iter()
            .map(|family| family.ttl)
            .fold(self.default_family.ttl, Duration::max)
    }

    /// `store.version_retention`, or its default: the longest family TTL.
    pub fn version_retention(&self) -> Duration {
        self.store
            .version_retention
            .unwrap_or_else(|| self.longest_ttl())
    }

    /// Each family's `split` table, by family name (families without one are absent).
    pub fn split_policies(&self) -> BTreeMap<String, crate::split::SplitConfig> {
        self.families
            .iter()
            .filter_map(|family| Some((family.prefix.clone(), family.split.clone()?)))
            .collect()
    }

    /// The family resolver of this (validated) config.
    pub fn families(&self) -> Families {
        Families::new(&self.default_family, &self.families)
    }

    /// The read-class table of this config: the built-ins with `[classes.*]` over them.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the class field that is malformed (never after
    /// [`Config::validate`] passed).
    pub fn classes(&self) -> Result<Classes> {
        Classes::from_config(&self.classes)
    }
}

/// Checks a family's default class against the class table, and its pin window: the one check
/// that spans `family` and `route`.
fn check_family_route(
    classes: &Classes,
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

/// Checks a family's `split` table, and that its default class does not decide on presence (a
/// split key's copies can disagree on presence, so such a family never splits).
fn check_split(
    classes: &Classes,
    field: &str,
    family: &FamilyConfig,
    split: &crate::split::SplitConfig,
) -> Result<()> {
    let field = format!("{field}.split");
    split.validate(&field, family.copies)?;
    let presence = classes
        .by_name(&family.default_class)
        .is_some_and(|class| classes.get(class).requires_single_copy());
    if presence {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "{field}: the family's default_class {:?} decides on presence, and a split key's copies can disagree on presence: such a family never splits",
                family.default_class
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::Versioning;
    use crate::key::Key;

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
        let families = config.families();
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
    fn placements_are_read_from_families_and_the_default_and_refused_when_unknown() {
        let config = Config::from_toml(
            "[default_family]\ncopies = 4\nplacement = \"spread\"\n[[family]]\nprefix = \"p:\"\ncopies = 8\nplacement = \"suffix\"\n[[family]]\nprefix = \"s:\"\ncopies = 8\n",
        )
        .unwrap();
        config.validate().unwrap();
        let families = config.families();
        use crate::placement::{Placement, PlacementReason};
        let of = |name: &str| {
            let family = families.resolve(&key(name));
            (family.placement, family.placement_reason)
        };
        assert_eq!(of("x"), (Placement::Spread, PlacementReason::Configured));
        assert_eq!(of("p:1"), (Placement::Suffix, PlacementReason::Configured));
        // Not configured: chosen at startup (`spread` for a family with no copies yet); until
        // then the naming every release reads.
        assert_eq!(of("s:1"), (Placement::Suffix, PlacementReason::Unset));
        // The printed config leaves an unset placement unset, so it parses back the same.
        let printed = Config::from_toml(&config.redacted_toml().unwrap()).unwrap();
        assert_eq!(printed.families[1].placement, None);
        assert_eq!(printed.families[0].placement, Some(Placement::Suffix));
        let err = Config::from_toml("[[family]]\nprefix = \"a\"\ncopies = 2\nplacement = \"even\"")
            .unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Config);
        assert!(err.message().contains("placement"), "{err}");
        assert!(err.message().contains("suffix"), "{err}");
    }

    /// Invalid configs and the field each error must name.
    const INVALID_FIELDS: &[(&str, &str)] = &[
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
            "[[family]]\nprefix = \"a\"\ncopies = 1\ndefault_class = \"decides-on-presence\"\nsplit = { max_copies = 8 }",
            "family[0].split: the family's default_class",
        ),
        (
            "[[family]]\nprefix = \"a\"\ncopies = 4\nsplit = { max_copies = 4 }",
            "family[0].split.max_copies",
        ),
        (
            "[[family]]\nprefix = \"a\"\ncopies = 1\nsplit = { max_copies = 8, cool_down = \"0s\" }",
            "family[0].split.cool_down",
        ),
        (
            "[[family]]\nprefix = \"a\"\ncopies = 1\nsplit = { max_copies = 8, mode = \"bogus\" }",
            "mode",
        ),
        (
            "[[family]]\nprefix = \"a\"\ncopies = 1\npin_window = \"0s\"",
            "family[0].pin_window",
        ),
        (
            "[[family]]\nprefix = \"a\"\ncopies = 1\nsync_replicas = 1",
            "family[0].sync_replicas: needs a Redis store",
        ),
        (
            "[store]\nredis = \"redis://127.0.0.1:6379\"\n[default_family]\nsync_replicas = 1\nsync_timeout = \"6s\"",
            "default_family.sync_timeout",
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
        ("[scrub]\ninterval = \"1ms\"", "scrub.interval"),
        (
            "[store]\nversion_retention = \"1m\"\n[heal]\nexpiry_jitter_min = -0.1",
            "store.version_retention",
        ),
        (
            "[server]\nlisten = \"0.0.0.0:7070\"",
            "server.allow_unauthenticated",
        ),
        (
            "[server]\nlisten = \"10.1.2.3:7070\"\n[auth]\ntokens_file = \"t\"",
            "server.tls_terminated_upstream",
        ),
        (
            "[server]\nlisten = \"[::]:7070\"\nallow_unauthenticated = true\n[auth]\ntokens_file = \"t\"",
            "server.tls_terminated_upstream",
        ),
        ("[server]\ntls_cert_file = \"c.pem\"", "server.tls_cert_file"),
        (
            "[admin]\nlisten = \"10.1.2.3:7071\"",
            "server.allow_unauthenticated",
        ),
        ("[admin]\nlisten = \"127.0.0.1:7070\"", "admin.listen"),
        ("[server]\nlog_level = \"info,=nope\"", "server.log_level"),
    ];

    #[test]
    fn invalid_fields_are_named() {
        for (text, field) in INVALID_FIELDS {
            let err = Config::from_toml(text)
                .and_then(|config| config.validate())
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(err.message().contains(field), "{text:?}: {err}");
        }
    }

    #[test]
    fn public_listeners_need_tokens_or_consent_and_tokens_need_tls() {
        let ok = [
            "[server]\nlisten = \"127.0.0.1:7070\"",
            "[server]\nlisten = \"[::1]:7070\"\n[auth]\ntokens_file = \"t\"",
            "[server]\nlisten = \"0.0.0.0:7070\"\nallow_unauthenticated = true",
            "[server]\nlisten = \"0.0.0.0:7070\"\ntls_terminated_upstream = true\n[auth]\ntokens_file = \"t\"",
        ];
        for text in ok {
            let config = Config::from_toml(text).unwrap();
            config
                .validate()
                .unwrap_or_else(|err| panic!("{text}: {err}"));
        }
        let open = Config::from_toml(ok[2]).unwrap();
        assert!(open.serves_unauthenticated_publicly());
        assert!(!Config::from_toml(ok[0])
            .unwrap()
            .serves_unauthenticated_publicly());
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
    fn the_redacted_toml_parses_back_and_hides_the_url_password() {
        let text = include_str!("../hotsplit.example.toml");
        let mut config = Config::from_toml(text).unwrap();
        config.store.redis = Some("redis://app:s3cret@10.0.0.1:6379".into());
        config.store.password = Some(crate::store::redis::Password::new("env-s3cret"));
        let shown = config.redacted_toml().unwrap();
        assert!(!shown.contains("s3cret"), "{shown}");
        let back = Config::from_toml(&shown).unwrap();
        back.validate().unwrap();
        assert_eq!(back.families.len(), config.families.len());
        assert_eq!(back.store.command_timeout, config.store.command_timeout);
        assert_eq!(back.classes.len(), config.classes.len());
    }

    #[test]
    fn the_resp_listener_follows_the_exposure_rules_and_counts_in_the_file_limit() {
        let public = Config::from_toml("[resp]\nlisten = \"0.0.0.0:6380\"\n").unwrap();
        let err = public.validate().unwrap_err();
        assert!(
            err.to_string().contains("resp.listen 0.0.0.0:6380"),
            "{err}"
        );
        assert!(public.serves_unauthenticated_publicly());
        let open = Config::from_toml(
            "[server]\nallow_unauthenticated = true\n[resp]\nlisten = \"0.0.0.0:6380\"\n",
        )
        .unwrap();
        open.validate().unwrap();
        let same = Config::from_toml("[resp]\nlisten = \"127.0.0.1:7070\"\n").unwrap();
        let err = same.validate().unwrap_err();
        assert!(
            err.to_string().contains("resp.listen: must differ"),
            "{err}"
        );
        let local = Config::from_toml("[resp]\nlisten = \"127.0.0.1:6380\"\n").unwrap();
        local.validate().unwrap();
        let tokens = "[auth]\ntokens_file = \"t\"\n";
        let http_flag_only = Config::from_toml(&format!(
            "[server]\ntls_terminated_upstream = true\n{tokens}[resp]\nlisten = \"0.0.0.0:6380\"\n"
        ))
        .unwrap();
        let err = http_flag_only.validate().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("resp.tls_terminated_upstream: "),
            "{err}"
        );
        assert!(err.to_string().contains("HTTP listener only"), "{err}");
        let own_flag = Config::from_toml(&format!(
            "{tokens}[resp]\nlisten = \"0.0.0.0:6380\"\ntls_terminated_upstream = true\n"
        ))
        .unwrap();
        own_flag.validate().unwrap();
        assert!(Config::default().check_file_limit(11_000).is_ok());
        let err = local.check_file_limit(11_000).unwrap_err();
        assert!(err.to_string().contains("resp.max_connections"), "{err}");
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../hotsplit.example.toml");
        Config::from_toml(text).unwrap().validate().unwrap();
    }

    #[test]
    fn the_previous_releases_refresh_ahead_is_accepted_and_changes_nothing() {
        let config = Config::from_toml("[near_cache]\nrefresh_ahead = 0.9\n").unwrap();
        assert_eq!(config.near_cache.refresh_ahead, Some(0.9));
        assert!((config.near_cache.refresh_lead_max - 0.01).abs() < f64::EPSILON);
        config.validate().unwrap();
        let wrong = Config::from_toml("[near_cache]\nrefresh_lead_max = 0.5\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            wrong.to_string().contains("near_cache.refresh_lead_max"),
            "{wrong}"
        );
    }
}
