//! Read classes: what a read decides, and therefore where it may be served.
//!
//! A class is reviewable config (`[classes.<name>]`) over four built-ins. The table is built once
//! at startup; a read names its class by index ([`ReadClass`]), so routing never compares
//! strings after the class was resolved.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::config::{ClassConfig, OnBreach, RouteTarget};
use crate::error::{Error, ErrorKind, Result};

/// The class that decides on a key's presence: primary only, never on a split family.
pub const DECIDES_ON_PRESENCE: &str = "decides-on-presence";

/// A resolved read class: an index into [`Classes`]. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadClass(pub(crate) usize);

/// Where a class sends reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The primary that owns the copy, always.
    Primary,
    /// A replica of the copy's owner while its current lag is within `budget`.
    Replica {
        /// The largest lag a read of this class accepts.
        budget: Duration,
        /// What happens over budget.
        on_breach: OnBreach,
    },
}

/// One class: its name, route and the one-line reason a reviewer reads.
#[derive(Debug, Clone)]
pub struct ClassDef {
    /// The name reads use (`?class=`, `Hotsplit-Read-Class`).
    pub name: String,
    /// Where reads go.
    pub route: Route,
    /// Why this class may or may not be stale.
    pub reason: String,
    /// The largest age bound a near-cache entry may have to answer a read of this class;
    /// `None` when the class never reads the near cache.
    pub near_cache: Option<Duration>,
}

/// The classes whose near cache is on by default, at [`NEAR_CACHE_DEFAULT_SHARE`] of their
/// budget.
const NEAR_CACHE_BY_DEFAULT: [&str; 2] = ["advisory", "re-derivable"];

/// The share of the budget a class in [`NEAR_CACHE_BY_DEFAULT`] gives its near cache when
/// `near_cache_max_age` is not set: half, so a cached answer plus a replica at the edge of its
/// budget stays within the budget's order of magnitude, and refreshes are rare.
const NEAR_CACHE_DEFAULT_SHARE: u32 = 2;

impl ClassDef {
    /// Whether the class decides on presence, which split copies cannot answer consistently.
    pub fn requires_single_copy(&self) -> bool {
        self.name == DECIDES_ON_PRESENCE
    }
}

/// A class as `GET /v1/classes` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClassView {
    /// The class name.
    pub name: String,
    /// `replica` or `primary`.
    pub route: &'static str,
    /// Why this class may or may not be stale.
    pub reason: String,
    /// For replica routes, the budget in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_budget_ms: Option<u64>,
    /// For replica routes, `primary` or `fail`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_breach: Option<&'static str>,
    /// The largest age bound, in milliseconds, of a near-cache answer; absent when the class
    /// never reads the near cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_cache_max_age_ms: Option<u64>,
    /// Families (by prefix, `default` for the default family) whose default class this is.
    pub families: Vec<String>,
    /// Whether the class needs a family with `copies = 1`.
    pub requires_single_copy: bool,
}

/// Every class, built-ins first (in a fixed order), then configured ones by name.
#[derive(Debug, Clone)]
pub struct Classes {
    /// The classes; a [`ReadClass`] indexes this.
    defs: Vec<ClassDef>,
}

fn builtins() -> Vec<(&'static str, ClassConfig)> {
    vec![
        (
            "advisory",
            ClassConfig {
                route: RouteTarget::Replica,
                reason: "shown to people, re-read soon: a value a quarter second old is harmless".into(),
                staleness_budget: Some(Duration::from_millis(250)),
                on_breach: Some(OnBreach::Primary),
                near_cache_max_age: None,
            },
        ),
        (
            "re-derivable",
            ClassConfig {
                route: RouteTarget::Replica,
                reason: "derived from a source of truth and recomputed on change: a value two seconds old only delays a refresh".into(),
                staleness_budget: Some(Duration::from_secs(2)),
                on_breach: Some(OnBreach::Primary),
                near_cache_max_age: None,
            },
        ),
        (
            DECIDES_ON_PRESENCE,
            ClassConfig {
                route: RouteTarget::Primary,
                reason: "a sole-copy record (a claim, an allowance, work done): a lagging replica turns an old value into a wrong decision".into(),
                staleness_budget: None,
                on_breach: None,
                near_cache_max_age: None,
            },
        ),
        (
            "primary",
            ClassConfig {
                route: RouteTarget::Primary,
                reason: "the default: reads the owning primary, as before read classes; name a class to read replicas".into(),
                staleness_budget: None,
                on_breach: None,
                near_cache_max_age: None,
            },
        ),
    ]
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Classes {
    /// Builds the table from the built-ins and the configured `[classes.<name>]` tables.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field (`classes.<name>.staleness_budget`, …) when a
    /// class is malformed.
    pub fn from_config(configured: &BTreeMap<String, ClassConfig>) -> Result<Classes> {
        let mut entries: Vec<(String, ClassConfig)> = builtins()
            .into_iter()
            .map(|(name, class)| {
                (
                    name.to_owned(),
                    configured.get(name).cloned().unwrap_or(class),
                )
            })
            .collect();
        for (name, class) in configured {
            if !entries.iter().any(|(known, _)| known == name) {
                entries.push((name.clone(), class.clone()));
            }
        }
        let mut defs = Vec::with_capacity(entries.len());
        for (name, class) in entries {
            defs.push(ClassDef::from_config(&name, &class)?);
        }
        Ok(Classes { defs })
    }

    /// The class called `name`, if any.
    pub fn by_name(&self, name: &str) -> Option<ReadClass> {
        self.defs
            .iter()
            .position(|def| def.name == name)
            .map(ReadClass)
    }

    /// The definition of `class`.
    pub fn get(&self, class: ReadClass) -> &ClassDef {
        // A ReadClass only comes from this table, so the index is in range; fall back to the
        // first (built-in) class rather than panic.
        self.defs.get(class.0).unwrap_or(&self.defs[0])
    }

    /// Every class name, in table order.
    pub fn names(&self) -> Vec<&str> {
        self.defs.iter().map(|def| def.name.as_str()).collect()
    }

    /// Every class with its index.
    pub fn iter(&self) -> impl Iterator<Item = (ReadClass, &ClassDef)> {
        self.defs
            .iter()
            .enumerate()
            .map(|(at, def)| (ReadClass(at), def))
    }

    /// How many classes there are.
    pub fn len(&self) -> usize {
        self.defs.len()
    }

    /// Whether the table is empty (it never is: the built-ins are always there).
    pub fn is_empty(&self) -> bool {
        self.defs.is_empty()
    }
}

impl ClassDef {
    fn from_config(name: &str, class: &ClassConfig) -> Result<ClassDef> {
        let invalid = |field: &str, why: String| {
            Error::new(ErrorKind::Config, format!("classes.{name}{field}: {why}"))
        };
        if !valid_name(name) {
            return Err(invalid(
                "",
                "a class name is 1..=64 lowercase letters, digits, '-' or '_'".into(),
            ));
        }
        let reason = class.reason.trim();
        if reason.is_empty() || reason.contains('\n') {
            return Err(invalid(".reason", "must be one non-empty line".into()));
        }
        let route = match class.route {
            RouteTarget::Primary => {
                if class.staleness_budget.is_some() {
                    return Err(invalid(
                        ".staleness_budget",
                        "only replica routes take a budget".into(),
                    ));
                }
                if class.on_breach.is_some() {
                    return Err(invalid(
                        ".on_breach",
                        "only replica routes take on_breach".into(),
                    ));
                }
                Route::Primary
            }
            RouteTarget::Replica => {
                let Some(budget) = class.staleness_budget else {
                    return Err(invalid(
                        ".staleness_budget",
                        "a replica route needs a budget, like \"250ms\"".into(),
                    ));
                };
                if budget.is_zero() {
                    return Err(invalid(".staleness_budget", "must be positive".into()));
                }
                Route::Replica {
                    budget,
                    on_breach: class.on_breach.unwrap_or(OnBreach::Primary),
                }
            }
        };
        if name == DECIDES_ON_PRESENCE && route != Route::Primary {
            return Err(invalid(
                ".route",
                "decides-on-presence must route to the primary".into(),
            ));
        }
        let near_cache = match (route, class.near_cache_max_age) {
            (_, Some(age)) if age.is_zero() => None,
            (Route::Primary, Some(_)) => {
                return Err(invalid(
                    ".near_cache_max_age",
                    "a class routed to primaries reads what the primary holds now, so it never reads the near cache".into(),
                ))
            }
            (Route::Primary, None) => None,
            (Route::Replica { budget, .. }, Some(age)) if age > budget => {
                return Err(invalid(
                    ".near_cache_max_age",
                    format!(
                        "must be at most the class's staleness_budget ({} ms), got {} ms",
                        budget.as_millis(),
                        age.as_millis()
                    ),
                ))
            }
            (Route::Replica { .. }, Some(age)) => Some(age),
            (Route::Replica { budget, .. }, None) if NEAR_CACHE_BY_DEFAULT.contains(&name) => {
                Some(budget / NEAR_CACHE_DEFAULT_SHARE)
            }
            (Route::Replica { .. }, None) => None,
        };
        Ok(ClassDef {
            name: name.to_owned(),
            route,
            reason: reason.to_owned(),
            near_cache,
        })
    }

    /// The class as `GET /v1/classes` lists it, with the families that use it by default.
    pub fn view(&self, families: Vec<String>) -> ClassView {
        let (route, staleness_budget_ms, on_breach) = match self.route {
            Route::Primary => ("primary", None, None),
            Route::Replica { budget, on_breach } => (
                "replica",
                Some(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)),
                Some(match on_breach {
                    OnBreach::Primary => "primary",
                    OnBreach::Fail => "fail",
                }),
            ),
        };
        ClassView {
            name: self.name.clone(),
            route,
            reason: self.reason.clone(),
            staleness_budget_ms,
            on_breach,
            near_cache_max_age_ms: self
                .near_cache
                .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            families,
            requires_single_copy: self.requires_single_copy(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(text: &str) -> Result<Classes> {
        let configured: BTreeMap<String, ClassConfig> = toml::from_str::<ClassTables>(text)
            .map_err(|err| Error::new(ErrorKind::Config, err.to_string()))?
            .classes;
        Classes::from_config(&configured)
    }

    /// The `[classes.*]` tables of a config file, parsed without the rest of the config.
    #[derive(serde::Deserialize)]
    struct ClassTables {
        #[serde(default)]
        classes: BTreeMap<String, ClassConfig>,
    }

    #[test]
    fn builtins_are_there_and_overridable() {
        let table = classes("").unwrap();
        assert_eq!(
            table.names(),
            vec!["advisory", "re-derivable", "decides-on-presence", "primary"]
        );
        let advisory = table.get(table.by_name("advisory").unwrap());
        assert_eq!(
            advisory.route,
            Route::Replica {
                budget: Duration::from_millis(250),
                on_breach: OnBreach::Primary
            }
        );
        let table = classes(
            "[classes.advisory]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"50ms\"\non_breach = \"fail\"\n[classes.feed]\nroute = \"primary\"\nreason = \"y\"",
        )
        .unwrap();
        let advisory = table.get(table.by_name("advisory").unwrap());
        assert_eq!(
            advisory.route,
            Route::Replica {
                budget: Duration::from_millis(50),
                on_breach: OnBreach::Fail
            }
        );
        assert_eq!(table.len(), 5);
        assert!(table.by_name("feed").is_some());
        assert!(table.by_name("nope").is_none());
    }

    #[test]
    fn the_near_cache_is_on_for_advisory_and_re_derivable_within_their_budget() {
        let table = classes("").unwrap();
        let near = |table: &Classes, name: &str| table.get(table.by_name(name).unwrap()).near_cache;
        assert_eq!(near(&table, "advisory"), Some(Duration::from_millis(125)));
        assert_eq!(near(&table, "re-derivable"), Some(Duration::from_secs(1)));
        assert_eq!(near(&table, "decides-on-presence"), None);
        assert_eq!(near(&table, "primary"), None);
        let table = classes(
            "[classes.advisory]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"100ms\"\n[classes.feed]\nroute = \"replica\"\nreason = \"y\"\nstaleness_budget = \"1s\"\n[classes.feed2]\nroute = \"replica\"\nreason = \"y\"\nstaleness_budget = \"1s\"\nnear_cache_max_age = \"1s\"\n[classes.re-derivable]\nroute = \"replica\"\nreason = \"z\"\nstaleness_budget = \"1s\"\nnear_cache_max_age = \"0s\"",
        )
        .unwrap();
        assert_eq!(near(&table, "advisory"), Some(Duration::from_millis(50)));
        assert_eq!(near(&table, "feed"), None, "off unless configured");
        assert_eq!(near(&table, "feed2"), Some(Duration::from_secs(1)));
        assert_eq!(near(&table, "re-derivable"), None, "0s turns it off");
    }

    #[test]
    fn malformed_classes_name_the_field() {
        let cases = [
            ("[classes.a]\nroute = \"replica\"\nreason = \"x\"", "classes.a.staleness_budget"),
            ("[classes.a]\nroute = \"primary\"\nreason = \"x\"\nstaleness_budget = \"1s\"", "classes.a.staleness_budget"),
            ("[classes.a]\nroute = \"primary\"\nreason = \"\"", "classes.a.reason"),
            ("[classes.A]\nroute = \"primary\"\nreason = \"x\"", "classes.A"),
            ("[classes.decides-on-presence]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"1s\"", "classes.decides-on-presence.route"),
            ("[classes.decides-on-presence]\nroute = \"primary\"\nreason = \"x\"\nnear_cache_max_age = \"10ms\"", "classes.decides-on-presence.near_cache_max_age"),
            ("[classes.primary]\nroute = \"primary\"\nreason = \"x\"\nnear_cache_max_age = \"10ms\"", "classes.primary.near_cache_max_age"),
            ("[classes.a]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"100ms\"\nnear_cache_max_age = \"101ms\"", "classes.a.near_cache_max_age"),
        ];
        for (text, field) in cases {
            let err = classes(text).unwrap_err();
            assert!(err.message().contains(field), "{text}: {err}");
        }
    }
}
