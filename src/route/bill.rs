//! The capacity bill: reads by class × served-by × reason; the replica lag histogram, the class
//! budgets it is judged against, and whether each node answers.
//!
//! Counters are resolved once, at startup, into a flat table indexed by class, role and reason,
//! so counting a read is one index and one atomic add.
//!
//! Lag is exported as a histogram in seconds, one observation per heartbeat read: the monitor's
//! own window percentiles ([`LagTable::figures`]) stay for `/v1/lag` and routing, but a
//! percentile gauge cannot be aggregated or re-windowed by Prometheus. The histogram's buckets
//! include every class's staleness budget, so the share of samples over a budget is exact.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;

use super::classes::{Classes, ReadClass, Route};
use super::lag::{LagTable, ReplicaLag};
use super::RouteReason;
use crate::metrics::{register, register_with_unit};
use crate::store::NodeLabel;

/// Labels of the routed-read counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    /// The read class.
    class: String,
    /// `replica` or `primary`.
    served_by: &'static str,
    /// See [`RouteReason`].
    reason: &'static str,
}

/// Labels of the lag histogram and the offset gap gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReplicaLabels {
    /// The replica, `host:port`.
    replica: String,
    /// Its primary, `host:port`.
    primary: String,
}

/// Labels of the class budget gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabels {
    /// The read class.
    class: String,
}

/// Labels of the store-up gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeLabels {
    /// The node, `host:port`; the store's kind (`embedded`, `redis`, `redis-cluster`) while no
    /// node is known.
    node: String,
    /// `primary` or `replica`.
    role: &'static str,
}

/// Makes each replica's lag histogram with the same bucket bounds.
#[derive(Debug, Clone)]
struct LagBuckets(Arc<[f64]>);

impl LagBuckets {
    /// 0.5 ms, doubling, up to about 16 s, plus every replica-routed class's budget.
    fn new(classes: &Classes) -> LagBuckets {
        let mut buckets: Vec<f64> = exponential_buckets(0.000_5, 2.0, 16).collect();
        buckets.extend(classes.iter().filter_map(|(_, def)| match def.route {
            Route::Replica { budget, .. } => Some(budget.as_secs_f64()),
            Route::Primary => None,
        }));
        buckets.sort_by(f64::total_cmp);
        buckets.dedup();
        LagBuckets(buckets.into())
    }
}

impl MetricConstructor<Histogram> for LagBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// Routing metrics, registered in the service's registry.
#[derive(Debug)]
pub struct RouteMetrics {
    /// Class names, in [`Classes`] order.
    classes: Vec<String>,
    /// Counters, `[(class * 2 + served_by) * REASONS + reason]`.
    reads: Vec<Counter>,
    /// Lag samples in seconds by replica, one per heartbeat read.
    lag: Family<ReplicaLabels, Histogram, LagBuckets>,
    /// Offset gap in bytes by replica.
    offset_gap: Family<ReplicaLabels, Gauge>,
    /// Client floors evicted while their window was still open.
    floor_evictions: Counter,
    /// 1 while a node answered its last heartbeat write (primaries) or read (replicas), else 0.
    store_up: Family<NodeLabels, Gauge>,
    /// Each replica-routed class's staleness budget in seconds; a reload sets it again.
    budgets: Family<ClassLabels, Gauge<f64, AtomicU64>>,
}

/// Whether a replica or a primary served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedRole {
    /// A replica.
    Replica,
    /// A primary (or the embedded store).
    Primary,
}

impl ServedRole {
    fn index(self) -> usize {
        match self {
            ServedRole::Replica => 0,
            ServedRole::Primary => 1,
        }
    }
}

/// One class's line of `GET /v1/routing`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ClassRouting {
    /// The class.
    pub class: String,
    /// Reads counted.
    pub reads: u64,
    /// Reads a replica served.
    pub replica: u64,
    /// Reads a primary served.
    pub primary: u64,
    /// `primary / reads`, 0 when there were none.
    pub primary_fraction: f64,
    /// Primary-served reads by reason.
    pub primary_by_reason: BTreeMap<String, u64>,
}

impl RouteMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry, classes: &Classes) -> RouteMetrics {
        let reads_family: Family<RouteLabels, Counter> = register(
            registry,
            "route_reads",
            "Reads by class, served_by (replica, primary) and reason (class, own-write, request-pin, lag-breach, no-replica, version-floor, lag-unmeasured)",
        );
        let mut reads = Vec::with_capacity(classes.len() * 2 * RouteReason::ALL.len());
        for (_, def) in classes.iter() {
            for served_by in ["replica", "primary"] {
                for reason in RouteReason::ALL {
                    let counter = reads_family
                        .get_or_create(&RouteLabels {
                            class: def.name.clone(),
                            served_by,
                            reason: reason.as_str(),
                        })
                        .clone();
                    reads.push(counter);
                }
            }
        }
        let lag = register_with_unit(
            registry,
            "replica_lag",
            "Replica lag measured by heartbeats, one sample per heartbeat read",
            Unit::Seconds,
            Family::new_with_constructor(LagBuckets::new(classes)),
        );
        let offset_gap: Family<ReplicaLabels, Gauge> = register_with_unit(
            registry,
            "replica_offset_gap",
            "master_repl_offset on the primary minus slave_repl_offset on the replica; -1 when unknown",
            Unit::Bytes,
            Family::default(),
        );
        let budgets: Family<ClassLabels, Gauge<f64, AtomicU64>> = register_with_unit(
            registry,
            "class_staleness_budget",
            "The staleness budget of each replica-routed read class",
            Unit::Seconds,
            Family::default(),
        );
        let store_up: Family<NodeLabels, Gauge> = register(
            registry,
            "store_up",
            "1 while the node answered this instance's last heartbeat write (primaries) or read (replicas), else 0",
        );
        let floor_evictions = Counter::default();
        registry.register(
            "route_floor_evictions",
            "Client floors (written or seen) evicted from the bounded floor table while their window was still open",
            floor_evictions.clone(),
        );
        let metrics = RouteMetrics {
            budgets,
            classes: classes.iter().map(|(_, def)| def.name.clone()).collect(),
            reads,
            lag,
            offset_gap,
            floor_evictions,
            store_up,
        };
        metrics.set_budgets(classes);
        metrics
    }

    /// Sets the staleness budget gauges to `classes` (a class routed to the primary has none).
    pub fn set_budgets(&self, classes: &Classes) {
        for (_, def) in classes.iter() {
            let labels = ClassLabels {
                class: def.name.clone(),
            };
            match def.route {
                Route::Replica { budget, .. } => {
                    self.budgets
                        .get_or_create(&labels)
                        .set(budget.as_secs_f64());
                }
                Route::Primary => {
                    self.budgets.remove(&labels);
                }
            }
        }
    }

    /// The counter of live floors evicted, shared with the floor table.
    pub fn floor_evictions(&self) -> &Counter {
        &self.floor_evictions
    }

    fn slot(class: ReadClass, role: ServedRole, reason: RouteReason) -> usize {
        (class.0 * 2 + role.index()) * RouteReason::ALL.len() + reason.index()
    }

    /// Counts one read.
    pub fn count(&self, class: ReadClass, role: ServedRole, reason: RouteReason) {
        if let Some(counter) = self.reads.get(Self::slot(class, role, reason)) {
            counter.inc();
        }
    }

    /// Per class, the share of reads the primary served and why.
    pub fn summary(&self) -> Vec<ClassRouting> {
        self.classes
            .iter()
            .enumerate()
            .map(|(at, name)| {
                let class = ReadClass(at);
                let get = |role, reason| {
                    self.reads
                        .get(Self::slot(class, role, reason))
                        .map_or(0, Counter::get)
                };
                let replica: u64 = RouteReason::ALL
                    .iter()
                    .map(|reason| get(ServedRole::Replica, *reason))
                    .sum();
                let mut primary_by_reason = BTreeMap::new();
                let mut primary = 0;
                for reason in RouteReason::ALL {
                    let count = get(ServedRole::Primary, reason);
                    primary += count;
                    if count > 0 {
                        primary_by_reason.insert(reason.as_str().to_owned(), count);
                    }
                }
                let reads = replica + primary;
                ClassRouting {
                    class: name.clone(),
                    reads,
                    replica,
                    primary,
                    primary_fraction: if reads == 0 {
                        0.0
                    } else {
                        primary as f64 / reads as f64
                    },
                    primary_by_reason,
                }
            })
            .collect()
    }

    /// Records one heartbeat read of a replica: its current lag into the histogram (nothing
    /// before its first heartbeat; after it, a replica that stopped answering keeps adding
    /// rising samples), and its offset gap.
    pub fn record_lag(&self, table: &LagTable, lag: &ReplicaLag) {
        let labels = ReplicaLabels {
            replica: lag.replica.to_string(),
            primary: lag.primary.to_string(),
        };
        if let Some(current) = table.current(lag) {
            self.lag
                .get_or_create(&labels)
                .observe(current.as_secs_f64());
        }
        let gap = table
            .offset_gap(lag)
            .map_or(-1, |gap| i64::try_from(gap).unwrap_or(i64::MAX));
        self.offset_gap.get_or_create(&labels).set(gap);
    }

    /// Sets whether `node`, in `role` (`primary` or `replica`), answered.
    pub fn store_up(&self, node: &NodeLabel, role: &'static str, up: bool) {
        self.store_up
            .get_or_create(&NodeLabels {
                node: node.to_string(),
                role,
            })
            .set(i64::from(up));
    }
}
