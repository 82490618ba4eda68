//! The capacity bill: reads by class × served-by × reason, and the lag gauges.
//!
//! Counters are resolved once, at startup, into a flat table indexed by class, role and reason,
//! so counting a read is one index and one atomic add.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::classes::{Classes, ReadClass};
use super::lag::{LagTable, ReplicaLag};
use super::RouteReason;
use crate::metrics::register;

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

/// Labels of the lag gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LagLabels {
    /// The replica, `host:port`.
    replica: String,
    /// Its primary, `host:port`.
    primary: String,
    /// `now`, `p50`, `p99`, `p999` or `max`.
    stat: &'static str,
}

/// Labels of the offset gap gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GapLabels {
    /// The replica, `host:port`.
    replica: String,
    /// Its primary, `host:port`.
    primary: String,
}

/// Routing metrics, registered in the service's registry.
#[derive(Debug)]
pub struct RouteMetrics {
    /// Class names, in [`Classes`] order.
    classes: Vec<String>,
    /// Counters, `[(class * 2 + served_by) * REASONS + reason]`.
    reads: Vec<Counter>,
    /// Lag in milliseconds by replica and statistic.
    lag_ms: Family<LagLabels, Gauge<f64, AtomicU64>>,
    /// Offset gap in bytes by replica.
    offset_gap: Family<GapLabels, Gauge>,
    /// Client floors evicted while their window was still open.
    floor_evictions: Counter,
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
            "Reads by class, served_by (replica, primary) and reason (class, own-write, request-pin, lag-breach, no-replica, version-floor)",
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
        let lag_ms: Family<LagLabels, Gauge<f64, AtomicU64>> = register(
            registry,
            "replica_lag_milliseconds",
            "Replica lag measured by heartbeats: the current value and window percentiles",
        );
        let offset_gap: Family<GapLabels, Gauge> = register(
            registry,
            "replica_offset_gap_bytes",
            "master_repl_offset on the primary minus slave_repl_offset on the replica",
        );
        let floor_evictions = Counter::default();
        registry.register(
            "route_floor_evictions",
            "Client floors (written or seen) evicted from the bounded floor table while their window was still open",
            floor_evictions.clone(),
        );
        RouteMetrics {
            classes: classes.iter().map(|(_, def)| def.name.clone()).collect(),
            reads,
            lag_ms,
            offset_gap,
            floor_evictions,
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

    /// Sets the lag gauges of one replica.
    pub fn record_lag(&self, table: &LagTable, lag: &ReplicaLag) {
        let figures = table.figures(lag);
        for (stat, value) in [
            ("now", figures.now),
            ("p50", figures.p50),
            ("p99", figures.p99),
            ("p999", figures.p999),
            ("max", figures.max),
        ] {
            self.lag_ms
                .get_or_create(&LagLabels {
                    replica: lag.replica.to_string(),
                    primary: lag.primary.to_string(),
                    stat,
                })
                .set(value.unwrap_or(f64::NAN));
        }
        let gap = table
            .offset_gap(lag)
            .map_or(-1, |gap| i64::try_from(gap).unwrap_or(i64::MAX));
        self.offset_gap
            .get_or_create(&GapLabels {
                replica: lag.replica.to_string(),
                primary: lag.primary.to_string(),
            })
            .set(gap);
    }
}
