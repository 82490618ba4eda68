//! The near cache's metrics, resolved once at startup: a hit is one counter add and one
//! observation of a pre-resolved per-class histogram, kept per thread
//! ([`crate::metrics::sharded`]).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::sharded::ShardedHistogram;
use crate::metrics::{register, register_with_unit};
use crate::route::{Classes, ReadClass};

/// Labels of the eviction counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    /// See [`EvictionCause`].
    cause: &'static str,
}

/// Labels of the served-age histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabels {
    /// The read class.
    class: String,
}

/// Why an entry or a high-water record left the near cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionCause {
    /// The byte bound: the cache's admission policy chose it (its version stays as a
    /// high-water record).
    Capacity,
    /// A high-water record pushed out by the records' own bound: a later fill of that copy
    /// below the record's version is no longer caught.
    HighWater,
    /// Every consulted copy was below the copy's high-water version (a lossy restart, or a
    /// copy set back): the entry and its record were dropped and the older version served.
    Rollback,
}

impl EvictionCause {
    const ALL: [EvictionCause; 3] = [
        EvictionCause::Capacity,
        EvictionCause::HighWater,
        EvictionCause::Rollback,
    ];

    fn as_str(self) -> &'static str {
        match self {
            EvictionCause::Capacity => "capacity",
            EvictionCause::HighWater => "high_water",
            EvictionCause::Rollback => "rollback",
        }
    }
}

/// Buckets of the served-age histogram: 0.5 ms doubling to about 4 s.
#[derive(Debug, Clone)]
struct AgeBuckets;

impl MetricConstructor<ShardedHistogram> for AgeBuckets {
    fn new_metric(&self) -> ShardedHistogram {
        ShardedHistogram::new(exponential_buckets(0.000_5, 2.0, 14))
    }
}

/// Every near-cache metric.
#[derive(Debug, Clone)]
pub struct NearMetrics {
    /// Reads answered from an entry.
    pub(crate) hits: Counter,
    /// Reads that found no entry young enough for their class and started a fill.
    pub(crate) misses: Counter,
    /// Reads that found no entry and waited for a fill another read had started.
    pub(crate) coalesced: Counter,
    /// Reads whose floor the entry did not meet, sent to Redis.
    pub(crate) floor_reads: Counter,
    /// Background refreshes started by refresh-ahead.
    pub(crate) refreshes: Counter,
    /// Fills below the copy's high-water version, re-read from the primary or left unserved.
    pub(crate) below_high_water: Counter,
    /// Rollbacks served: every consulted copy was below what this instance had served.
    pub(crate) rollbacks: Counter,
    /// Evictions, indexed like [`EvictionCause::ALL`].
    evictions: Vec<Counter>,
    /// Bytes held by entries and high-water records.
    pub(crate) bytes: Gauge,
    /// Entries held.
    pub(crate) entries: Gauge,
    /// The age bound of every answer served from the cache, per class (indexed by class):
    /// observed on every hit, so kept per thread ([`ShardedHistogram`]).
    served_age: Vec<ShardedHistogram>,
}

impl NearMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry, classes: &Classes) -> NearMetrics {
        let evictions_family: Family<CauseLabels, Counter> = register(
            registry,
            "near_cache_evictions",
            "Entries and high-water records that left the near cache, by cause (capacity, high_water, rollback)",
        );
        let evictions = EvictionCause::ALL
            .iter()
            .map(|cause| {
                evictions_family
                    .get_or_create(&CauseLabels {
                        cause: cause.as_str(),
                    })
                    .clone()
            })
            .collect();
        let age_family: Family<ClassLabels, ShardedHistogram, AgeBuckets> = register_with_unit(
            registry,
            "near_cache_served_age",
            "The age bound (source lag at fill + age) of each answer served from the near cache, per class",
            Unit::Seconds,
            Family::new_with_constructor(AgeBuckets),
        );
        let served_age = classes
            .iter()
            .map(|(_, def)| {
                age_family
                    .get_or_create(&ClassLabels {
                        class: def.name.clone(),
                    })
                    .clone()
            })
            .collect();
        NearMetrics {
            hits: register(registry, "near_cache_hits", "Reads answered from the near cache"),
            misses: register(
                registry,
                "near_cache_misses",
                "Reads that found no near-cache entry young enough for their class and started a fill",
            ),
            coalesced: register(
                registry,
                "near_cache_coalesced",
                "Reads that waited for a fill of the same copy and source started by another read",
            ),
            floor_reads: register(
                registry,
                "near_cache_floor_reads",
                "Reads whose version floor the near-cache entry did not meet, sent to Redis",
            ),
            refreshes: register(
                registry,
                "near_cache_refreshes",
                "Background refreshes of hot entries about to age out (refresh-ahead)",
            ),
            below_high_water: register(
                registry,
                "near_cache_fills_below_high_water",
                "Fills that returned a version below what this instance had already served for the copy",
            ),
            rollbacks: register(
                registry,
                "near_cache_rollbacks",
                "Reads where every consulted copy was below what this instance had served (a lossy restart or a copy set back): the older version was served",
            ),
            evictions,
            bytes: register_with_unit(
                registry,
                "near_cache",
                "Bytes held by near-cache entries and high-water records",
                Unit::Bytes,
                Gauge::default(),
            ),
            entries: register(registry, "near_cache_entries", "Near-cache entries held"),
            served_age,
        }
    }

    /// Metrics registered nowhere: for unit tests.
    #[cfg(test)]
    pub(crate) fn detached(classes: &Classes) -> NearMetrics {
        NearMetrics::register(&mut Registry::default(), classes)
    }

    /// Counts an eviction.
    pub(crate) fn evicted(&self, cause: EvictionCause) {
        let at = EvictionCause::ALL
            .iter()
            .position(|candidate| *candidate == cause)
            .unwrap_or(0);
        if let Some(counter) = self.evictions.get(at) {
            counter.inc();
        }
    }

    /// Records the age bound of an answer served to a read of `class`.
    pub(crate) fn served(&self, class: ReadClass, age_bound: Duration) {
        self.hits.inc();
        if let Some(histogram) = self.served_age.get(class.0) {
            histogram.observe(age_bound);
        }
    }
}
