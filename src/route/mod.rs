//! Read routing: classes, replica choice under a measured staleness budget, read-your-writes.
//!
//! A read is classified by what it decides, not by who asks ([`classes`]). The [`Router`] turns
//! a class, the reader's write floor ([`pins`]) and request pin into a [`Plan`], and a plan plus
//! the copy's owner into a [`Target`]: a replica whose *current* lag ([`lag`]) is within the
//! class's budget, or the primary with a [`RouteReason`]. Every read is counted by class,
//! served-by and reason ([`bill`]).
//!
//! # Invariants
//! - Deciding a route takes no lock across an await and allocates nothing on the replica path
//!   but the chosen replica's label (a reference-count increment).
//! - `decides-on-presence` reads never reach a replica, and are refused on split families.
//! - A replica whose heartbeat cannot be read is over every budget.

pub mod bill;
pub mod classes;
pub mod config;
pub mod lag;
pub mod monitor;
pub mod pins;
pub mod warmup;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::error::{Error, ErrorKind, Result};
use crate::family::Families;
use crate::key::{Key, Version};
use crate::store::NodeLabel;

pub use bill::{ClassRouting, RouteMetrics, ServedRole};
pub use classes::{ClassDef, ClassView, Classes, ReadClass, Route};
pub use config::{ClassConfig, OnBreach, RouteConfig, RouteTarget};
pub use lag::{LagFigures, LagTable};
pub use monitor::LagMonitor;
pub use pins::{Floors, Pins};
pub use warmup::{Readiness, WarmUp, WarmUpPending, WarmUpWatch};

/// Why a read was served where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteReason {
    /// Where the class says: a replica for replica classes, the primary for primary classes.
    Class,
    /// The reader's own write floor was above the replica's copy; the primary served.
    OwnWrite,
    /// The read carried the id of a request that wrote; the primary served.
    RequestPin,
    /// Every replica was over the class's budget; the primary served.
    LagBreach,
    /// No replica is known for the copy's owner (or it could not be read); the primary served.
    NoReplica,
    /// The reader's `min_version` was above the replica's copy; the primary served.
    VersionFloor,
    /// The owner's replicas have no lag sample yet (or, during the startup warm-up, none is
    /// discovered yet): whether one is within budget is not known; the primary served.
    LagUnmeasured,
}

impl RouteReason {
    /// Every reason, in counter order.
    pub const ALL: [RouteReason; 7] = [
        RouteReason::Class,
        RouteReason::OwnWrite,
        RouteReason::RequestPin,
        RouteReason::LagBreach,
        RouteReason::NoReplica,
        RouteReason::VersionFloor,
        RouteReason::LagUnmeasured,
    ];

    /// The wire spelling, used in `Hotsplit-Route` and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::Class => "class",
            RouteReason::OwnWrite => "own-write",
            RouteReason::RequestPin => "request-pin",
            RouteReason::LagBreach => "lag-breach",
            RouteReason::NoReplica => "no-replica",
            RouteReason::VersionFloor => "version-floor",
            RouteReason::LagUnmeasured => "lag-unmeasured",
        }
    }

    fn index(self) -> usize {
        match self {
            RouteReason::Class => 0,
            RouteReason::OwnWrite => 1,
            RouteReason::RequestPin => 2,
            RouteReason::LagBreach => 3,
            RouteReason::NoReplica => 4,
            RouteReason::VersionFloor => 5,
            RouteReason::LagUnmeasured => 6,
        }
    }
}

/// How one read is routed, decided once per read before any copy is consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The read's class.
    pub class: ReadClass,
    /// Replica (with budget) or primary (with the reason).
    pub route: PlanRoute,
    /// The reader's own write floor for this key, if its window is open.
    pub own_floor: Option<Version>,
    /// The highest version a moved read (served by the primary for a replica class, or by a
    /// sibling copy) returned to this reader for this key, if its window is open.
    pub seen_floor: Option<Version>,
}

impl Plan {
    /// The floor this instance holds for the reader: the higher of its write and seen floors.
    pub fn held_floor(&self) -> Option<Version> {
        self.own_floor.max(self.seen_floor)
    }
}

/// The route part of a [`Plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanRoute {
    /// Primaries serve, for this reason.
    Primary(RouteReason),
    /// A replica within `budget` may serve.
    Replica {
        /// The class's budget.
        budget: Duration,
        /// What happens over budget.
        on_breach: OnBreach,
    },
}

/// Where one copy read goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// This replica.
    Replica(NodeLabel),
    /// The owning primary, for this reason.
    Primary(RouteReason),
    /// Every replica is over budget and the class fails rather than read the primary.
    Breach {
        /// The lowest current lag among the replicas, `None` when none was ever measured.
        lag: Option<Duration>,
        /// The class's budget.
        budget: Duration,
    },
}

/// One replica's line of `GET /v1/lag`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReplicaLagView {
    /// The replica, `host:port`.
    pub replica: String,
    /// Its primary, `host:port`.
    pub primary: String,
    /// Lag in milliseconds: now, p50, p99, p999 and max over the window.
    pub lag_ms: LagFigures,
    /// `master_repl_offset` on the primary minus `slave_repl_offset` on the replica.
    pub offset_gap_bytes: Option<u64>,
    /// The window length in seconds.
    pub window_s: f64,
    /// For each replica class, whether the current lag is within its budget.
    pub within_budget: std::collections::BTreeMap<String, bool>,
}

/// The part of routing a SIGHUP reload replaces: the class definitions and each family's
/// default class. The class names, and so every [`ReadClass`] index, never change while the
/// process runs.
#[derive(Debug)]
struct ClassTable {
    /// Every class.
    classes: Classes,
    /// Default class per family prefix (`""` for the default family), in the order of
    /// [`Families::iter`].
    defaults: Vec<(String, ReadClass)>,
}

impl ClassTable {
    /// The table of `classes` with each family's default class named by `default_class`
    /// (given a family's prefix).
    fn new(
        classes: Classes,
        families: &Families,
        default_class: impl Fn(&str) -> Option<String>,
    ) -> Result<ClassTable> {
        let mut defaults = Vec::new();
        for family in families.iter() {
            let name =
                default_class(&family.prefix).unwrap_or_else(|| family.default_class.clone());
            let class = classes.by_name(&name).ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    format!("family {:?}: unknown default_class {name:?}", family.name()),
                )
            })?;
            defaults.push((family.prefix.clone(), class));
        }
        Ok(ClassTable { classes, defaults })
    }
}

/// The class table a read loaded: it dereferences to [`Classes`], and holds them as they were
/// when loaded even if a reload replaces them meanwhile.
pub struct ClassesGuard(arc_swap::Guard<Arc<ClassTable>>);

impl std::ops::Deref for ClassesGuard {
    type Target = Classes;

    fn deref(&self) -> &Classes {
        &self.0.classes
    }
}

/// Decides where reads go. One per service, shared.
#[derive(Debug)]
pub struct Router {
    /// The classes and default classes, swapped whole by a reload and loaded without a lock.
    table: ArcSwap<ClassTable>,
    /// The families (their prefixes never change while the process runs).
    families: Arc<Families>,
    /// Write floors and request pins.
    pins: Pins,
    /// Replica lag.
    lag: Arc<LagTable>,
    /// Counters.
    metrics: Arc<RouteMetrics>,
}

impl Router {
    /// Builds the router from a validated `[route]` config and the class table.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when a family's default class is not in `classes`.
    pub fn new(
        config: &RouteConfig,
        classes: Classes,
        families: Arc<Families>,
        lag: Arc<LagTable>,
        metrics: Arc<RouteMetrics>,
    ) -> Result<Router> {
        let table = ClassTable::new(classes, &families, |_| None)?;
        Ok(Router {
            table: ArcSwap::from_pointee(table),
            families,
            pins: Pins::new(
                config.max_pins,
                config.max_floors_per_client,
                config.request_pin_window,
                metrics.floor_evictions().clone(),
            ),
            lag,
            metrics,
        })
    }

    /// A router with a lag table of its own (no monitor feeds it, so every replica-routed read
    /// goes to the primary with reason `no-replica`) and counters registered nowhere: for unit
    /// tests.
    ///
    /// # Errors
    /// As [`Router::new`].
    #[cfg(test)]
    pub(crate) fn detached(
        config: &RouteConfig,
        classes: Classes,
        families: Arc<Families>,
    ) -> Result<Router> {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(RouteMetrics::register(&mut registry, &classes));
        let lag = Arc::new(LagTable::new(config.heartbeat_interval, config.lag_window));
        Router::new(config, classes, families, lag, metrics)
    }

    #[cfg(test)]
    pub(crate) fn for_tests(
        config: &RouteConfig,
        classes: &std::collections::BTreeMap<String, ClassConfig>,
        families: Arc<Families>,
    ) -> Router {
        Router::detached(config, Classes::from_config(classes).unwrap(), families).unwrap()
    }

    /// The class table in force.
    pub fn classes(&self) -> ClassesGuard {
        ClassesGuard(self.table.load())
    }

    /// Replaces the class definitions and the families' default classes (`default_class`
    /// names a family's class given its prefix, `""` for the default family; `None` keeps
    /// the family's configured one), and the budget gauges. Reads that start afterwards route
    /// by the new table.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when `classes` names other classes than the table in force (a
    /// class added or removed needs a restart: its counters are resolved at startup), or a
    /// default class is unknown; nothing changes then.
    pub fn reload_classes(
        &self,
        classes: Classes,
        default_class: impl Fn(&str) -> Option<String>,
    ) -> Result<()> {
        if classes.names() != self.classes().names() {
            return Err(Error::new(
                ErrorKind::Config,
                "classes: adding or removing a class needs a restart",
            ));
        }
        let table = ClassTable::new(classes, &self.families, default_class)?;
        self.metrics.set_budgets(&table.classes);
        self.table.store(Arc::new(table));
        Ok(())
    }

    /// The lag table.
    pub fn lag(&self) -> &Arc<LagTable> {
        &self.lag
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<RouteMetrics> {
        &self.metrics
    }

    /// Plans a read of `key`: resolves its class, and finds the reader's pins.
    ///
    /// # Errors
    /// - [`ErrorKind::UnknownClass`] when `class` names no class;
    /// - [`ErrorKind::ClassNotAllowed`] when it names `decides-on-presence` on a split family.
    pub fn plan(
        &self,
        key: &Key,
        class: Option<&str>,
        client: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<Plan> {
        let family = self.families.resolve(key);
        let table = self.table.load();
        let classes = &table.classes;
        let class = match class {
            Some(name) => {
                let class = classes.by_name(name).ok_or_else(|| {
                    Error::new(
                        ErrorKind::UnknownClass,
                        format!(
                            "unknown read class {name:?}; known: {}",
                            classes.names().join(", ")
                        ),
                    )
                })?;
                if (family.copies > 1 || family.split.is_some())
                    && classes.get(class).requires_single_copy()
                {
                    return Err(Error::new(
                        ErrorKind::ClassNotAllowed,
                        format!(
                            "class {name:?} decides on presence, but family {:?} has {} copies, which can disagree on presence",
                            family.name(),
                            family.copies
                        ),
                    ));
                }
                class
            }
            None => table
                .defaults
                .iter()
                .find(|(prefix, _)| *prefix == family.prefix)
                .map_or(ReadClass(0), |(_, class)| *class),
        };
        let floors = client.map_or_else(Floors::default, |client| self.pins.floors(client, key));
        let route = match classes.get(class).route {
            Route::Primary => PlanRoute::Primary(RouteReason::Class),
            Route::Replica { .. } if request_id.is_some_and(|id| self.pins.request_pinned(id)) => {
                PlanRoute::Primary(RouteReason::RequestPin)
            }
            Route::Replica { budget, on_breach } => PlanRoute::Replica { budget, on_breach },
        };
        Ok(Plan {
            class,
            route,
            own_floor: floors.written,
            seen_floor: floors.seen,
        })
    }

    /// Where a read of a copy owned by `primary` goes under `plan`.
    pub fn target(&self, plan: &Plan, primary: &NodeLabel) -> Target {
        let (budget, on_breach) = match plan.route {
            PlanRoute::Primary(reason) => return Target::Primary(reason),
            PlanRoute::Replica { budget, on_breach } => (budget, on_breach),
        };
        self.lag.with_replicas(primary, |replicas| {
            if replicas.is_empty() {
                // During the startup warm-up a replica may yet be discovered: its lag is not
                // measured, which is not the same as there being none.
                return Target::Primary(if self.lag.warming() {
                    RouteReason::LagUnmeasured
                } else {
                    RouteReason::NoReplica
                });
            }
            let mut best: Option<(Duration, &NodeLabel)> = None;
            for replica in replicas {
                if let Some(lag) = self.lag.current(replica) {
                    if best.is_none_or(|(held, _)| lag < held) {
                        best = Some((lag, &replica.replica));
                    }
                }
            }
            match best {
                Some((lag, replica)) if lag <= budget => Target::Replica(replica.clone()),
                None if on_breach == OnBreach::Primary => {
                    Target::Primary(RouteReason::LagUnmeasured)
                }
                _ if on_breach == OnBreach::Primary => Target::Primary(RouteReason::LagBreach),
                _ => Target::Breach {
                    lag: best.map(|(lag, _)| lag),
                    budget,
                },
            }
        })
    }

    /// The current lag of `replica`, whichever primary it replicates; `None` when it is not
    /// known (no heartbeat seen, or not a replica in the topology).
    pub fn lag_of_replica(&self, replica: &NodeLabel) -> Option<Duration> {
        let snapshot = self.lag.snapshot();
        snapshot
            .values()
            .flatten()
            .find(|lag| lag.replica == *replica)
            .and_then(|lag| self.lag.current(lag))
    }

    /// The current lag of `replica`, a replica of `primary`; `None` when it is not known (no
    /// heartbeat seen, or not a replica of `primary`).
    pub fn replica_lag(&self, primary: &NodeLabel, replica: &NodeLabel) -> Option<Duration> {
        self.lag.with_replicas(primary, |replicas| {
            replicas
                .iter()
                .find(|lag| lag.replica == *replica)
                .and_then(|lag| self.lag.current(lag))
        })
    }

    /// Counts one served read.
    pub fn count(&self, class: ReadClass, role: ServedRole, reason: RouteReason) {
        self.metrics.count(class, role, reason);
    }

    /// Records a write: the client's floor for `key` (for its family's `pin_window`), and the
    /// request pin.
    pub fn record_write(
        &self,
        key: &Key,
        version: Version,
        client: Option<&str>,
        request_id: Option<&str>,
    ) {
        if let Some(client) = client.filter(|client| !client.is_empty()) {
            let window = self.families.resolve(key).pin_window;
            self.pins.record_write(client, key, version, window);
        }
        if let Some(id) = request_id.filter(|id| !id.is_empty()) {
            self.pins.record_request(id);
        }
    }

    /// Records that a read for `client` returned `version` of `key` from somewhere other than
    /// its usual place, for the family's `pin_window`: its next reads do not go below it.
    pub fn record_seen(&self, key: &Key, version: Version, client: &str) {
        if client.is_empty() {
            return;
        }
        let window = self.families.resolve(key).pin_window;
        self.pins.record_seen(client, key, version, window);
    }

    /// The classes with the families that use each by default.
    pub fn classes_view(&self) -> Vec<ClassView> {
        let table = self.table.load();
        table
            .classes
            .iter()
            .map(|(class, def)| {
                let families = self
                    .families
                    .iter()
                    .zip(&table.defaults)
                    .filter(|(_, (_, default))| *default == class)
                    .map(|(family, _)| family.name().to_owned())
                    .collect();
                def.view(families)
            })
            .collect()
    }

    /// Every replica's lag and whether each replica class accepts it now.
    pub fn lag_view(&self) -> Vec<ReplicaLagView> {
        let snapshot = self.lag.snapshot();
        let table = self.table.load();
        let mut lines: Vec<ReplicaLagView> = snapshot
            .values()
            .flatten()
            .map(|replica| {
                let current = self.lag.current(replica);
                let within_budget = table
                    .classes
                    .iter()
                    .filter_map(|(_, def)| match def.route {
                        Route::Replica { budget, .. } => {
                            Some((def.name.clone(), current.is_some_and(|lag| lag <= budget)))
                        }
                        Route::Primary => None,
                    })
                    .collect();
                ReplicaLagView {
                    replica: replica.replica.to_string(),
                    primary: replica.primary.to_string(),
                    lag_ms: self.lag.figures(replica),
                    offset_gap_bytes: self.lag.offset_gap(replica),
                    window_s: self.lag.window().as_secs_f64(),
                    within_budget,
                }
            })
            .collect();
        lines.sort_by(|a, b| a.replica.cmp(&b.replica));
        lines
    }
}

/// Test fixtures: the `[route]` and `[classes.*]` sections of a config text, for the unit tests
/// of modules the config depends on (which must not depend on the config themselves); the
/// family sections are read by `crate::family::fixture::families`.
#[cfg(test)]
pub(crate) mod fixture {
    use super::{ClassConfig, RouteConfig};

    /// The route sections of a config text; every other section is ignored.
    #[derive(serde::Deserialize)]
    pub(crate) struct Sections {
        /// `[classes.*]`.
        #[serde(default)]
        pub(crate) classes: std::collections::BTreeMap<String, ClassConfig>,
        /// `[route]`.
        #[serde(default)]
        pub(crate) route: RouteConfig,
    }

    /// The route sections of `text`, a config in TOML.
    ///
    /// # Panics
    /// When the route sections do not parse: a broken fixture.
    pub(crate) fn sections(text: &str) -> Sections {
        toml::from_str(text).expect("the fixture's route sections")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::fixture;
    use crate::store::ReplicaSet;

    fn router(text: &str) -> Router {
        let config = super::fixture::sections(text);
        config.route.validate().unwrap();
        let families = Arc::new(fixture::families(text));
        let classes = Classes::from_config(&config.classes).unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(RouteMetrics::register(&mut registry, &classes));
        let lag = Arc::new(LagTable::new(
            Duration::from_millis(100),
            Duration::from_secs(60),
        ));
        Router::new(&config.route, classes.clone(), families, lag, metrics).unwrap()
    }

    const CONFIG: &str = "[[family]]\nprefix = \"s:\"\ncopies = 4\ndefault_class = \"advisory\"\n[default_family]\ndefault_class = \"decides-on-presence\"";

    #[test]
    fn classes_resolve_and_bad_ones_are_refused() {
        let router = router(CONFIG);
        let split = Key::parse("s:1").unwrap();
        let single = Key::parse("u:1").unwrap();
        let plan = router.plan(&split, None, None, None).unwrap();
        assert_eq!(router.classes().get(plan.class).name, "advisory");
        let plan = router.plan(&single, None, None, None).unwrap();
        assert_eq!(plan.route, PlanRoute::Primary(RouteReason::Class));
        let err = router.plan(&split, Some("nope"), None, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownClass);
        let err = router
            .plan(&split, Some("decides-on-presence"), None, None)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ClassNotAllowed);
        assert!(router.plan(&single, Some("advisory"), None, None).is_ok());
    }

    #[test]
    fn a_family_that_may_split_refuses_presence_reads_at_one_copy() {
        let router = router(
            "[[family]]\nprefix = \"a:\"\ncopies = 1\nsplit = { max_copies = 8 }\n[default_family]\ndefault_class = \"decides-on-presence\"",
        );
        let splittable = Key::parse("a:1").unwrap();
        let err = router
            .plan(&splittable, Some("decides-on-presence"), None, None)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ClassNotAllowed);
        let unsplit = Key::parse("u:1").unwrap();
        assert!(router
            .plan(&unsplit, Some("decides-on-presence"), None, None)
            .is_ok());
    }

    #[test]
    fn targets_follow_lag_pins_and_replicas() {
        let router = router(CONFIG);
        let key = Key::parse("s:1").unwrap();
        let primary = NodeLabel::new("p:1");
        let plan = router.plan(&key, None, Some("alice"), None).unwrap();
        assert_eq!(
            router.target(&plan, &primary),
            Target::Primary(RouteReason::NoReplica)
        );
        router.lag().set_topology(&[ReplicaSet {
            primary: primary.clone(),
            replicas: vec![NodeLabel::new("r:1")],
        }]);
        // No heartbeat seen yet: the lag is not measured, the primary serves.
        assert_eq!(
            router.target(&plan, &primary),
            Target::Primary(RouteReason::LagUnmeasured)
        );
        let replica = router.lag().replicas_of(&primary).unwrap()[0].clone();
        router.lag().record(&replica, Some(router.lag().now_us()));
        assert_eq!(
            router.target(&plan, &primary),
            Target::Replica(NodeLabel::new("r:1"))
        );
        // While the startup warm-up runs, a primary with no replica known yet is unmeasured too.
        let other = NodeLabel::new("p:2");
        assert_eq!(
            router.target(&plan, &other),
            Target::Primary(RouteReason::NoReplica)
        );
        router.lag().set_warming(true);
        assert_eq!(
            router.target(&plan, &other),
            Target::Primary(RouteReason::LagUnmeasured)
        );
        router.lag().set_warming(false);
        // A write by alice pins her floor; a request id pins its reads to primaries.
        router.record_write(&key, Version::new(7).unwrap(), Some("alice"), Some("req-1"));
        let plan = router.plan(&key, None, Some("alice"), None).unwrap();
        assert_eq!(plan.own_floor, Version::new(7).ok());
        assert_eq!(
            router
                .plan(&key, None, Some("bob"), None)
                .unwrap()
                .own_floor,
            None
        );
        let pinned = router.plan(&key, None, None, Some("req-1")).unwrap();
        assert_eq!(pinned.route, PlanRoute::Primary(RouteReason::RequestPin));
    }

    #[test]
    fn a_fail_policy_breaches() {
        let router = router("[classes.strict]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"10ms\"\non_breach = \"fail\"");
        let primary = NodeLabel::new("p:1");
        router.lag().set_topology(&[ReplicaSet {
            primary: primary.clone(),
            replicas: vec![NodeLabel::new("r:1")],
        }]);
        let plan = router
            .plan(&Key::parse("k").unwrap(), Some("strict"), None, None)
            .unwrap();
        assert!(matches!(
            router.target(&plan, &primary),
            Target::Breach { lag: None, .. }
        ));
    }
}
