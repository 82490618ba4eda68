//! The registration of [`Metrics`](super::Metrics)' groups: the copy outcomes, the reads and
//! the healing metrics.

use super::*;

/// The healing metrics, registered together ([`register_heal`]): [`Metrics`]' `heal`.
#[derive(Debug)]
pub(super) struct HealMetrics {
    /// Retry queue entries.
    pub(super) retry_queue_depth: Gauge,
    /// Retry queue bytes.
    pub(super) retry_queue_bytes: Gauge,
    /// Age of the oldest retry queue entry, seconds.
    pub(super) retry_queue_oldest_age: Gauge<f64, AtomicU64>,
    /// Retried copy writes by result.
    pub(super) retry_attempts: Family<ResultLabels, Counter>,
    /// Failed copy writes dropped unhealed, by reason.
    pub(super) retry_drops: Family<ReasonLabels, Counter>,
    /// Pending entries replaced by a newer version of the same copy.
    pub(super) retry_superseded: Counter,
    /// Read repairs by result.
    pub(super) read_repairs: Family<ResultLabels, Counter>,
    /// The spool file's size.
    pub(super) spool_bytes: Gauge,
    /// Damaged stretches of the spool skipped at startup.
    pub(super) spool_damaged_regions: Counter,
    /// Bytes skipped in them.
    pub(super) spool_skipped_bytes: Counter,
    /// The spool writer's group commits (one `fdatasync` each), handed to the spool.
    pub(super) spool_syncs: Counter,
}

/// Registers the retry queue's, read repair's and the spool's metrics.
pub(super) fn register_heal(registry: &mut Registry) -> HealMetrics {
    let retry_queue_depth: Gauge = register(
        registry,
        "retry_queue_depth",
        "Failed copy writes waiting in the retry queue",
    );
    let retry_queue_bytes: Gauge = register_with_unit(
        registry,
        "retry_queue",
        "Bytes held by the retry queue (values once per key and version, plus entry overhead)",
        Unit::Bytes,
        Gauge::default(),
    );
    let retry_queue_oldest_age: Gauge<f64, AtomicU64> = register_with_unit(
        registry,
        "retry_queue_oldest_age",
        "Age of the oldest retry queue entry",
        Unit::Seconds,
        Gauge::default(),
    );
    let retry_attempts: Family<ResultLabels, Counter> = register(
        registry,
        "retry_attempts",
        "Retried copy writes by result (applied, current, stale, failed)",
    );
    let retry_drops: Family<ReasonLabels, Counter> = register(
        registry,
        "retry_drops",
        "Failed copy writes dropped unhealed, by reason (overflow, expired, spool)",
    );
    let retry_superseded: Counter = register(
        registry,
        "retry_superseded",
        "Pending retry entries replaced by a newer version of the same copy",
    );
    let read_repairs: Family<ResultLabels, Counter> = register(
        registry,
        "read_repairs",
        "Read repairs by result (applied, unneeded, failed, skipped)",
    );
    let spool_bytes: Gauge = register_with_unit(
        registry,
        "spool",
        "Size of the retry spool file",
        Unit::Bytes,
        Gauge::default(),
    );
    let spool_damaged_regions: Counter = register(
        registry,
        "spool_damaged_regions",
        "Damaged stretches of the retry spool skipped at startup (each held at least part of one record)",
    );
    let spool_skipped_bytes: Counter = register_with_unit(
        registry,
        "spool_skipped",
        "Bytes of the retry spool skipped as damaged at startup",
        Unit::Bytes,
        Counter::default(),
    );
    let spool_syncs: Counter = register(
        registry,
        "spool_syncs",
        "Group commits of the retry spool: each fdatasync that made a batch of appended records durable",
    );
    HealMetrics {
        retry_queue_depth,
        retry_queue_bytes,
        retry_queue_oldest_age,
        retry_attempts,
        retry_drops,
        retry_superseded,
        read_repairs,
        spool_bytes,
        spool_damaged_regions,
        spool_skipped_bytes,
        spool_syncs,
    }
}

/// Registers `publish_copy_outcomes` and returns the publish and invalidate counters.
pub(super) fn register_copy_outcomes(
    registry: &mut Registry,
) -> (OutcomeCounters, OutcomeCounters) {
    let copy_outcomes: Family<CopyOutcomeLabels, Counter> = register(
        registry,
        "publish_copy_outcomes",
        "Copy writes by operation (publish, invalidate) and outcome (applied, current, stale, conflict, failed)",
    );
    // Each handle is cloned in its own statement: `get_or_create` returns a read guard, and a
    // second call while one is alive (as in one struct expression) would deadlock.
    let resolve = |op: &'static str, outcome: &'static str| -> Counter {
        let counter = copy_outcomes
            .get_or_create(&CopyOutcomeLabels { op, outcome })
            .clone();
        counter
    };
    let counters = |op: &'static str| {
        let applied = resolve(op, "applied");
        let current = resolve(op, "current");
        let stale = resolve(op, "stale");
        let conflict = resolve(op, "conflict");
        let failed = resolve(op, "failed");
        OutcomeCounters {
            applied,
            current,
            stale,
            conflict,
            failed,
        }
    };
    (counters("publish"), counters("invalidate"))
}

/// Registers `reads` and returns one counter per [`ReadOutcome`], in [`ReadOutcome::ALL`]'s
/// order.
pub(super) fn register_reads(registry: &mut Registry) -> Vec<Counter> {
    let read_family: Family<ReadLabels, Counter> = register(
        registry,
        "reads",
        "Affine reads by outcome (affine, fallback, not_modified, not_found, below_floor, unavailable)",
    );
    ReadOutcome::ALL
        .iter()
        .map(|outcome| {
            let counter = read_family
                .get_or_create(&ReadLabels {
                    outcome: outcome.as_str(),
                })
                .clone();
            counter
        })
        .collect()
}
