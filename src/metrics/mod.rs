//! Prometheus metrics: what operators watch.
//!
//! One [`Metrics`] value is created at startup and shared. Counters on the hot read path are
//! resolved once, at construction, so a read only bumps an atomic.
//!
//! # Conventions
//! - The exposition is OpenMetrics 1.0 (prometheus-client's encoder writes `# EOF` and `# UNIT`),
//!   so `/metrics` is served as [`CONTENT_TYPE`], which Prometheus negotiates and scrapes.
//! - A measured quantity is in a base unit, registered with [`register_with_unit`] so that the
//!   name ends in `_seconds` or `_bytes` and a `# UNIT` line says so; never milliseconds.
//! - Distributions (request latency, replica lag) are histograms, never percentile gauges: a
//!   percentile cannot be aggregated across instances, buckets can.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};
use std::sync::atomic::AtomicU64;

mod register;
pub mod sharded;

use register::{register_copy_outcomes, register_heal, register_reads, HealMetrics};

/// The content type of every `/metrics` answer (the service's and `audit --watch`'s): the body is
/// OpenMetrics text, which ends in `# EOF`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of `hotsplit_build_info`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    /// The crate version, `CARGO_PKG_VERSION`.
    version: &'static str,
}

/// Labels of copy-write outcome counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CopyOutcomeLabels {
    /// `publish` or `invalidate`.
    op: &'static str,
    /// `applied`, `current`, `stale` or `failed`.
    outcome: &'static str,
}

/// Labels of read counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReadLabels {
    /// See [`ReadOutcome`].
    outcome: &'static str,
}

/// Labels of store error counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StoreErrorLabels {
    /// A stable error class, for example `timeout`, `io`, `cluster`, `function_missing`.
    kind: &'static str,
}

/// Labels of the direct read counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirectReadLabels {
    /// `sent` (on the store's direct connection), `passed` (through the client: the
    /// connection was not up or was full) or `refused` (the node refused it, for example with
    /// `MOVED`, and it went again through the client).
    outcome: &'static str,
}

/// Labels of the healing counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    /// The result.
    result: &'static str,
}

/// Labels of the layout mismatch gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FamilyLabels {
    /// The family's prefix, or `default`.
    family: String,
}

/// Labels of the retry drop counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    /// `overflow`, `expired` or `spool`.
    reason: &'static str,
}

/// Why a failed copy write left (or never entered) the retry queue unhealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDrop {
    /// The queue was full.
    Overflow,
    /// The entry's expiry passed.
    Expired,
    /// The spool could not record it.
    Spool,
}

impl RetryDrop {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryDrop::Overflow => "overflow",
            RetryDrop::Expired => "expired",
            RetryDrop::Spool => "spool",
        }
    }
}

/// The result of one retried copy write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryResult {
    /// The copy now holds the entry's version.
    Applied,
    /// The copy already held it.
    Current,
    /// The copy holds a newer version (kept).
    Stale,
    /// The write failed again.
    Failed,
}

/// The result of one read repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairResult {
    /// The stale copy was brought forward.
    Applied,
    /// The copy had caught up already (current or newer).
    Unneeded,
    /// The repair write failed.
    Failed,
    /// Too many repairs were running; this one was not attempted.
    Skipped,
}

/// Labels of the request latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// The HTTP method (`GET`, `PUT`, `DELETE`, or `OTHER`).
    pub(crate) method: &'static str,
    /// The matched route template, for example `/v1/keys/{key}`, or `unmatched`.
    pub(crate) route: &'static str,
    /// The status class: `2xx`, `3xx`, `4xx` or `5xx`.
    pub(crate) status: &'static str,
}

/// How an affine read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The affine copy served the value.
    Affine,
    /// A sibling copy served because the affine copy was missing, stale or unreachable.
    Fallback,
    /// The answer was 304 Not Modified.
    NotModified,
    /// The key is missing or a tombstone.
    NotFound,
    /// No consulted copy reached the version floor.
    BelowFloor,
    /// No copy could be read.
    Unavailable,
}

impl ReadOutcome {
    const ALL: [ReadOutcome; 6] = [
        ReadOutcome::Affine,
        ReadOutcome::Fallback,
        ReadOutcome::NotModified,
        ReadOutcome::NotFound,
        ReadOutcome::BelowFloor,
        ReadOutcome::Unavailable,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ReadOutcome::Affine => "affine",
            ReadOutcome::Fallback => "fallback",
            ReadOutcome::NotModified => "not_modified",
            ReadOutcome::NotFound => "not_found",
            ReadOutcome::BelowFloor => "below_floor",
            ReadOutcome::Unavailable => "unavailable",
        }
    }
}

/// How one copy write ended, as the copy-outcome counters label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyWriteOutcome {
    /// The copy took the version.
    Applied,
    /// The copy already had the version.
    Current,
    /// The copy had a newer version.
    Stale,
    /// The copy had this version with a different body.
    Conflict,
    /// The write failed (the copy was queued or dropped).
    Failed,
}

/// Whether a copy write belonged to a publish or an invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOp {
    /// `PUT /v1/keys/{key}`.
    Publish,
    /// `DELETE /v1/keys/{key}`.
    Invalidate,
}

/// Counter handles for one [`WriteOp`], one per copy outcome.
#[derive(Debug, Clone, Default)]
struct OutcomeCounters {
    applied: Counter,
    current: Counter,
    stale: Counter,
    conflict: Counter,
    failed: Counter,
}

/// Registers `metric` in `registry` under `name` with `help`, and returns it. A metric is a
/// shared handle, so what is counted into the returned value is what the registry renders.
pub fn register_metric<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Registers `metric` like [`register_metric`], in `unit`: the exported name is `name` followed
/// by `_seconds` or `_bytes`, and the exposition carries a `# UNIT` line.
pub fn register_with_unit<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Unit,
    metric: M,
) -> M {
    registry.register_with_unit(name, help, unit, metric.clone());
    metric
}

/// Creates a metric at its default (zero, or an empty family) and registers it: the way every
/// metric without a custom constructor is made.
pub fn register<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    register_metric(registry, name, help, M::default())
}

/// Every metric hotsplit exports.
#[derive(Debug)]
pub struct Metrics {
    /// The registry that renders the text exposition; locked only to register late metrics
    /// (routing, at startup) and to render.
    registry: std::sync::Mutex<Registry>,
    /// Copy outcomes of publishes.
    publish_outcomes: OutcomeCounters,
    /// Copy outcomes of invalidations.
    invalidate_outcomes: OutcomeCounters,
    /// Reads, indexed like [`ReadOutcome::ALL`].
    reads: Vec<Counter>,
    /// Store errors by kind.
    store_errors: Family<StoreErrorLabels, Counter>,
    /// Direct reads (`store::redis::direct`): sent, passed, refused.
    direct_reads: [Counter; 3],
    /// Request latency by route.
    request_duration: Family<RequestLabels, Histogram>,
    /// The retry queue's, read repair's and the spool's metrics.
    heal: HealMetrics,
    /// 1 when a family's recorded layout differs from this instance's config.
    layout_mismatch: Family<FamilyLabels, Gauge>,
    /// Per family: 1 while this instance reads the family's tagged (`spread`) copy names.
    placement_reads_spread: Family<FamilyLabels, Gauge>,
    /// Per family: the busiest master's share of a sample of the family's keys' copies, as
    /// the names this instance reads fall on the live slot map.
    placement_busiest_share: Family<FamilyLabels, Gauge<f64, AtomicU64>>,
    /// Per family: 1 once its placement compatibility window closed on this instance (a
    /// publish writes N copy names, `K#i` is deleted); 0 while it writes `K#i`.
    placement_window_closed: Family<FamilyLabels, Gauge>,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("hotsplit");
        // An info metric: `hotsplit_build_info{version="…"} 1`, to join on in queries and to
        // see a rollout's progress.
        registry.register(
            "build",
            "The running build: crate version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        let (publish_outcomes, invalidate_outcomes) = register_copy_outcomes(&mut registry);
        let reads = register_reads(&mut registry);
        let store_errors: Family<StoreErrorLabels, Counter> = register(
            &mut registry,
            "store_errors",
            "Errors returned by the store, by kind",
        );

        let direct_reads_family: Family<DirectReadLabels, Counter> = register(
            &mut registry,
            "store_direct_reads",
            "Primary copy reads by what the store's direct connection to the node did with them: sent, passed (through the client: not connected or full) or refused (by the node, e.g. MOVED; sent again through the client)",
        );
        let direct_reads = ["sent", "passed", "refused"].map(|outcome| {
            direct_reads_family
                .get_or_create(&DirectReadLabels { outcome })
                .clone()
        });

        let request_duration = register_with_unit(
            &mut registry,
            "http_request_duration",
            "HTTP request latency by method, route and status class",
            Unit::Seconds,
            Family::<RequestLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
            }),
        );

        let heal = register_heal(&mut registry);

        let layout_mismatch: Family<FamilyLabels, Gauge> = register(
            &mut registry,
            "layout_mismatch",
            "1 when the family's layout recorded in Redis differs from this instance's config",
        );

        let placement_reads_spread: Family<FamilyLabels, Gauge> = register(
            &mut registry,
            "placement_reads_spread",
            "1 while this instance reads the family's tagged (spread) copy names; 0 while it reads K#i",
        );
        let placement_busiest_share: Family<FamilyLabels, Gauge<f64, AtomicU64>> = register(
            &mut registry,
            "placement_busiest_share",
            "The busiest master's share of the copies of a sample of the family's keys, under the names this instance reads, on the live slot map (even is ceil(N / masters) / N)",
        );

        let placement_window_closed: Family<FamilyLabels, Gauge> = register(
            &mut registry,
            "placement_window_closed",
            "1 once every live instance reads the family's tagged copy names and this instance's publishes write N copies (K#i deleted); 0 while they also write K#i",
        );

        Arc::new(Metrics {
            heal,
            layout_mismatch,
            placement_reads_spread,
            placement_busiest_share,
            placement_window_closed,
            registry: std::sync::Mutex::new(registry),
            publish_outcomes,
            invalidate_outcomes,
            reads,
            store_errors,
            direct_reads,
            request_duration,
        })
    }

    /// Counts one copy write outcome.
    pub fn copy_outcome(&self, op: WriteOp, outcome: CopyWriteOutcome) {
        let counters = match op {
            WriteOp::Publish => &self.publish_outcomes,
            WriteOp::Invalidate => &self.invalidate_outcomes,
        };
        let counter = match outcome {
            CopyWriteOutcome::Applied => &counters.applied,
            CopyWriteOutcome::Current => &counters.current,
            CopyWriteOutcome::Stale => &counters.stale,
            CopyWriteOutcome::Conflict => &counters.conflict,
            CopyWriteOutcome::Failed => &counters.failed,
        };
        counter.inc();
    }

    /// Counts one read.
    pub fn read(&self, outcome: ReadOutcome) {
        let at = ReadOutcome::ALL
            .iter()
            .position(|candidate| *candidate == outcome)
            .unwrap_or(0);
        if let Some(counter) = self.reads.get(at) {
            counter.inc();
        }
    }

    /// Counts one store error of `kind` (a stable lowercase class name).
    pub fn store_error(&self, kind: &'static str) {
        self.store_errors
            .get_or_create(&StoreErrorLabels { kind })
            .inc();
    }

    /// Counts a primary copy read sent on the store's direct connection (`sent`), or through
    /// the client because that connection was not up or was full (`passed`).
    pub fn direct_read(&self, sent: bool) {
        self.direct_reads[usize::from(!sent)].inc();
    }

    /// Counts a direct read the node refused (sent again through the client).
    pub fn direct_read_refused(&self) {
        self.direct_reads[2].inc();
    }

    /// Sets the retry queue's depth, bytes and spool size gauges.
    pub fn retry_queue(&self, depth: usize, bytes: usize, spool_bytes: u64) {
        self.heal
            .retry_queue_depth
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
        self.heal
            .retry_queue_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.heal
            .spool_bytes
            .set(i64::try_from(spool_bytes).unwrap_or(i64::MAX));
    }

    /// Sets the age of the oldest retry queue entry.
    pub fn retry_oldest_age(&self, seconds: f64) {
        self.heal.retry_queue_oldest_age.set(seconds);
    }

    /// Counts one retried copy write.
    pub fn retry_attempt(&self, result: RetryResult) {
        let result = match result {
            RetryResult::Applied => "applied",
            RetryResult::Current => "current",
            RetryResult::Stale => "stale",
            RetryResult::Failed => "failed",
        };
        self.heal
            .retry_attempts
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts one failed copy write dropped unhealed.
    pub fn retry_drop(&self, reason: RetryDrop) {
        self.heal
            .retry_drops
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// How many failed copy writes were dropped for `reason` so far (what `spool drain`
    /// reports).
    pub fn retry_drops(&self, reason: RetryDrop) -> u64 {
        self.heal
            .retry_drops
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .get()
    }

    /// Counts the damaged stretches (and their bytes) skipped while replaying the spool.
    pub fn spool_damage(&self, regions: u64, skipped_bytes: u64) {
        self.heal.spool_damaged_regions.inc_by(regions);
        self.heal.spool_skipped_bytes.inc_by(skipped_bytes);
    }

    /// The counter of the spool's group commits, for the spool's writer to increment.
    pub(crate) fn spool_syncs(&self) -> Counter {
        self.heal.spool_syncs.clone()
    }

    /// Counts one pending entry replaced by a newer version.
    pub fn retry_superseded(&self) {
        self.heal.retry_superseded.inc();
    }

    /// Sets whether `family`'s recorded layout differs from this instance's config.
    pub fn layout_mismatch(&self, family: &str, mismatch: bool) {
        self.layout_mismatch
            .get_or_create(&FamilyLabels {
                family: family.to_owned(),
            })
            .set(i64::from(mismatch));
    }

    /// Sets whether this instance reads `family`'s tagged copy names.
    pub fn placement_reads_spread(&self, family: &str, spread: bool) {
        self.placement_reads_spread
            .get_or_create(&FamilyLabels {
                family: family.to_owned(),
            })
            .set(i64::from(spread));
    }

    /// Sets whether `family`'s placement compatibility window is closed on this instance.
    pub fn placement_window_closed(&self, family: &str, closed: bool) {
        self.placement_window_closed
            .get_or_create(&FamilyLabels {
                family: family.to_owned(),
            })
            .set(i64::from(closed));
    }

    /// Sets the busiest master's share of `family`'s copies on the live slot map.
    pub fn placement_busiest_share(&self, family: &str, share: f64) {
        self.placement_busiest_share
            .get_or_create(&FamilyLabels {
                family: family.to_owned(),
            })
            .set(share);
    }

    /// Counts one read repair.
    pub fn read_repair(&self, result: RepairResult) {
        let result = match result {
            RepairResult::Applied => "applied",
            RepairResult::Unneeded => "unneeded",
            RepairResult::Failed => "failed",
            RepairResult::Skipped => "skipped",
        };
        self.heal
            .read_repairs
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The latency histogram of one label combination, created (and so shown) on first use. The
    /// HTTP layer keeps it, so recording a request skips the family's lookup.
    pub(crate) fn request_histogram(&self, labels: &RequestLabels) -> Histogram {
        self.request_duration.get_or_create(labels).clone()
    }

    /// Registers metrics created after startup (the routing counters, which need the class
    /// table) in the same registry, so `/metrics` renders them too.
    pub fn register_with<T>(&self, register: impl FnOnce(&mut Registry) -> T) -> T {
        let mut registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        register(&mut registry)
    }

    /// Renders the OpenMetrics text exposition (served as [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in the encoder.
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counted_outcomes() {
        let metrics = Metrics::new();
        metrics.copy_outcome(WriteOp::Publish, CopyWriteOutcome::Applied);
        metrics.copy_outcome(WriteOp::Publish, CopyWriteOutcome::Failed);
        metrics.read(ReadOutcome::Fallback);
        metrics.store_error("timeout");
        let text = metrics.render();
        assert!(
            text.contains(
                r#"hotsplit_publish_copy_outcomes_total{op="publish",outcome="applied"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"hotsplit_publish_copy_outcomes_total{op="publish",outcome="failed"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"hotsplit_reads_total{outcome="fallback"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"hotsplit_store_errors_total{kind="timeout"} 1"#),
            "{text}"
        );
    }
}
