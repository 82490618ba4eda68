//! Key families: which keys are split, into how many copies, how the copies are named, for how
//! long, and who versions them.
//!
//! A family is chosen by the longest configured prefix that a key starts with; every other key
//! belongs to the default family. [`Families`] is the resolver the publish and read paths call
//! on every request; [`FamilyConfig`] and [`DefaultFamilyConfig`] are the `[[family]]` and
//! `[default_family]` tables it is built from. A family's default read class is a name here;
//! the config's composition root checks it against the class table, since classes belong to
//! `route`, which sits above this module.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Refusal, Result};
use crate::key::Key;
use crate::placement::{Placement, PlacementReason};

pub use crate::key::MAX_COPIES;

/// Who chooses a family's versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Versioning {
    /// The caller sends the version with each publish, an edit counter from its source of
    /// truth.
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultFamilyConfig {
    /// Copies per key. Default: 1 (unsplit).
    pub copies: u32,
    /// How long a value lives after it is published. Default: `1h`.
    #[serde(with = "crate::duration")]
    pub ttl: Duration,
    /// Who chooses versions. Default: `caller`.
    pub versioning: Versioning,
    /// The read class of reads that name none. Default: `primary`.
    pub default_class: String,
    /// How long a client's write floor, or the seen floor a moved read left it, holds its reads
    /// of that key. Default: `2s`.
    #[serde(with = "crate::duration")]
    pub pin_window: Duration,
    /// How copies beyond copy 0 are named: `suffix` (`K#i`) or `spread` (`K#i{t}`, spread
    /// evenly over the cluster's slots; see `placement`). Default: absent, which is `spread`
    /// for a family with no copies yet and `suffix` for one that already has `K#i` copies
    /// (decided at startup and logged, [`PlacementReason`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// As [`FamilyConfig::sync_replicas`]. Default: 0 (off).
    pub sync_replicas: u32,
    /// As [`FamilyConfig::sync_timeout`]. Default: `100ms`.
    #[serde(with = "crate::duration")]
    pub sync_timeout: Duration,
}

impl Default for DefaultFamilyConfig {
    fn default() -> Self {
        DefaultFamilyConfig {
            copies: 1,
            ttl: Duration::from_secs(3600),
            versioning: Versioning::Caller,
            default_class: DEFAULT_CLASS.to_owned(),
            pin_window: DEFAULT_PIN_WINDOW,
            placement: None,
            sync_replicas: 0,
            sync_timeout: DEFAULT_SYNC_TIMEOUT,
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

/// The default `sync_timeout` of a family.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_millis(100);

/// The longest `sync_timeout` (a publish's `sync_timeout_ms` has the same bound).
pub const MAX_SYNC_TIMEOUT: Duration = Duration::from_secs(5);

fn default_sync_timeout() -> Duration {
    DEFAULT_SYNC_TIMEOUT
}

/// A key family: keys that start with `prefix`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyConfig {
    /// The key prefix; the longest matching prefix wins. Required, non-empty.
    pub prefix: String,
    /// Copies per key, 1..=1024. Required.
    pub copies: u32,
    /// How long a value lives after it is published; must be positive. Default: `1h`.
    #[serde(with = "crate::duration", default = "default_ttl")]
    pub ttl: Duration,
    /// Who chooses versions. Default: `caller`.
    #[serde(default)]
    pub versioning: Versioning,
    /// The read class of reads that name none. Default: `primary`.
    #[serde(default = "default_class")]
    pub default_class: String,
    /// How long a client's write floor holds its reads of that key. Default: `2s`.
    #[serde(with = "crate::duration", default = "default_pin_window")]
    pub pin_window: Duration,
    /// How copies beyond copy 0 are named: `suffix` or `spread`. Default: absent, as
    /// [`DefaultFamilyConfig::placement`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// How far the family's hot keys split on their own (`crate::split`). Default: absent (no
    /// automatic split).
    #[serde(default)]
    pub split: Option<crate::split::SplitConfig>,
    /// Replicas of each copy's node that every publish of the family waits for before it is
    /// answered (`WAIT`, as a publish's `sync_replicas`, which overrides it): its report lines
    /// then carry `replicas_acked`, and a line with at least 1 survives a failover (docs/API.md,
    /// "Partitions and failovers"). Needs a Redis store. 0 turns it off. Default: 0.
    #[serde(default)]
    pub sync_replicas: u32,
    /// How long such a publish waits for them, 1ms..=5s. Default: `100ms`.
    #[serde(with = "crate::duration", default = "default_sync_timeout")]
    pub sync_timeout: Duration,
}

fn default_ttl() -> Duration {
    Duration::from_secs(3600)
}

/// Checks a family's `sync_timeout` when it waits for replicas, and that the store has
/// replicas to wait for; `field` is its config path.
///
/// # Errors
/// [`ErrorKind::Config`] naming the field.
pub fn check_sync(
    field: &str,
    sync_replicas: u32,
    sync_timeout: Duration,
    redis: bool,
) -> Result<()> {
    if sync_replicas == 0 {
        return Ok(());
    }
    if !redis {
        return Err(Error::new(
            ErrorKind::Config,
            format!("{field}.sync_replicas: needs a Redis store with replicas (store.redis); the embedded store has none"),
        ));
    }
    if sync_timeout.is_zero() || sync_timeout > MAX_SYNC_TIMEOUT {
        return Err(Error::new(
            ErrorKind::Config,
            format!("{field}.sync_timeout: must be in 1ms..=5s, got {sync_timeout:?}"),
        ));
    }
    Ok(())
}

/// Checks a family's copy count and TTL; `field` is its config path (`family[1]`,
/// `default_family`).
///
/// # Errors
/// [`ErrorKind::Config`] with a message such as `family[1].copies: must be in 1..=1024, got 0`.
pub fn check_copies_and_ttl(field: &str, copies: u32, ttl: Duration) -> Result<()> {
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

/// Checks a family's prefix; `field` is its config path (`family[1]`).
///
/// # Errors
/// [`ErrorKind::Config`] naming `{field}.prefix` when it is empty or not a valid key prefix.
pub fn check_prefix(field: &str, prefix: &str) -> Result<()> {
    let invalid = |why: String| {
        Err(Error::new(
            ErrorKind::Config,
            format!("{field}.prefix: {why}"),
        ))
    };
    if prefix.is_empty() {
        return invalid("must not be empty".into());
    }
    if let Err(err) = Key::parse(prefix) {
        return invalid(format!("is not a valid key prefix: {err}"));
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
    /// How the family's copies are named, as configured or chosen at startup (which names
    /// reads use while a placement change rolls out is `layout`'s to say).
    pub placement: Placement,
    /// Why it is that placement: configured, or the default chosen at startup.
    pub placement_reason: PlacementReason,
    /// The mode of the family's `split` table (`None`: no automatic split). A family with one
    /// may get copies of its own for a key, so it refuses presence reads like a split family.
    pub split: Option<crate::split::SplitMode>,
    /// Replicas every publish waits for (`WAIT`) when it names none itself; 0: none.
    pub sync_replicas: u32,
    /// How long that wait lasts.
    pub sync_timeout: Duration,
}

impl Family {
    /// Whether a publish that names a version (`given`) or none fits who chooses this family's
    /// versions: the one home of that rule, which the publisher and the operations layer both
    /// apply.
    ///
    /// # Errors
    /// [`Refusal::VersionMissing`] or [`Refusal::VersionGiven`], naming the family.
    pub fn check_version(&self, given: bool) -> std::result::Result<(), Refusal> {
        match (self.versioning, given) {
            (Versioning::Caller, false) => Err(Refusal::VersionMissing {
                family: self.name().to_owned(),
            }),
            (Versioning::Allocated, true) => Err(Refusal::VersionGiven {
                family: self.name().to_owned(),
            }),
            _ => Ok(()),
        }
    }

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
    /// Builds the table from the validated `[default_family]` and `[[family]]` entries.
    pub fn new(default: &DefaultFamilyConfig, prefixed: &[FamilyConfig]) -> Families {
        let mut by_prefix: Vec<Family> = prefixed
            .iter()
            .map(|family| Family {
                prefix: family.prefix.clone(),
                copies: family.copies,
                ttl: family.ttl,
                versioning: family.versioning,
                default_class: family.default_class.clone(),
                pin_window: family.pin_window,
                placement: family.placement.unwrap_or(Placement::Suffix),
                placement_reason: reason_of(family.placement),
                split: family.split.as_ref().map(|split| split.mode),
                sync_replicas: family.sync_replicas,
                sync_timeout: family.sync_timeout,
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
                copies: default.copies,
                ttl: default.ttl,
                versioning: default.versioning,
                default_class: default.default_class.clone(),
                pin_window: default.pin_window,
                placement: default.placement.unwrap_or(Placement::Suffix),
                placement_reason: reason_of(default.placement),
                split: None,
                sync_replicas: default.sync_replicas,
                sync_timeout: default.sync_timeout,
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

    /// Sets the placement of the family named `name` (a default chosen at startup, `reason`
    /// saying why); nothing for a family the table does not have.
    pub fn choose_placement(&mut self, name: &str, placement: Placement, reason: PlacementReason) {
        let family = self
            .by_prefix
            .iter_mut()
            .chain(std::iter::once(&mut self.default))
            .find(|family| family.name() == name);
        if let Some(family) = family {
            family.placement = placement;
            family.placement_reason = reason;
        }
    }
}

/// Why a family built from a config entry with `placement` (or none) runs it, before startup
/// looks at the store: configured, or not set (`suffix`, the naming every release reads, until
/// `layout::choose_placements` chooses: `spread` for a family with no copies yet).
fn reason_of(configured: Option<Placement>) -> PlacementReason {
    match configured {
        Some(_) => PlacementReason::Configured,
        None => PlacementReason::Unset,
    }
}

/// Test fixtures: a family table from the `[default_family]` and `[[family]]` sections of a
/// config text, built the way `Config::families` builds it, for the unit tests of modules the
/// config depends on (which must not depend on the config themselves).
#[cfg(test)]
pub(crate) mod fixture {
    use super::{DefaultFamilyConfig, Families, FamilyConfig};

    /// The family sections of a config text; every other section is ignored.
    #[derive(serde::Deserialize)]
    struct Sections {
        /// `[default_family]`; its defaults when absent.
        #[serde(default)]
        default_family: DefaultFamilyConfig,
        /// The `[[family]]` entries.
        #[serde(default, rename = "family")]
        families: Vec<FamilyConfig>,
    }

    /// The family table of `text`, a config in TOML.
    ///
    /// # Panics
    /// When the family sections do not parse: a broken fixture.
    pub(crate) fn families(text: &str) -> Families {
        let sections: Sections = toml::from_str(text).expect("the fixture's family sections");
        Families::new(&sections.default_family, &sections.families)
    }
}
