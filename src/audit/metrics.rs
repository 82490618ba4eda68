//! The Prometheus metrics of `hotsplit audit --watch`, and the router that serves them.
//!
//! Gauges hold the last successful round's figures, per read role (`primary`, `replica`);
//! counters and the skew histogram add up every round. The conventions are the service's
//! ([`crate::metrics`]): OpenMetrics, base units with `# UNIT`, histograms rather than
//! percentile gauges. Names start with `hotsplit_audit_`, so they never clash with the
//! service's own metrics when both are scraped.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::figures::ReadRole;
use super::report::Report;
use crate::metrics::{register, register_metric, register_with_unit};

/// Labels of the per-role metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RoleLabels {
    /// `primary` or `replica`.
    role: &'static str,
}

/// Labels of the round counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    /// `ok` or `failed`.
    result: &'static str,
}

/// A gauge of a fraction or a rate.
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric of the watch mode.
#[derive(Debug)]
pub struct AuditMetrics {
    /// The registry that renders the text exposition.
    registry: std::sync::Mutex<Registry>,
    /// Every round: per-key skew, in versions, by role (one observation per key).
    skew: Family<RoleLabels, Histogram>,
    /// Last round: the largest per-key skew, by role.
    skew_max: Family<RoleLabels, Gauge>,
    /// Last round: copies behind / copy reads, by role.
    share_behind: Family<RoleLabels, FloatGauge>,
    /// Last round: inconsistent copy reads per million, by role.
    inconsistency_per_million: Family<RoleLabels, FloatGauge>,
    /// Last round: copies behind, by role.
    copies_behind: Family<RoleLabels, Gauge>,
    /// Last round: keys read.
    keys: Gauge,
    /// Last round: keys with a disagreeing copy read.
    inconsistent_keys: Gauge,
    /// Last round: how long it took.
    round_seconds: FloatGauge,
    /// Every round: copy reads that answered, by role.
    copy_reads_total: Family<RoleLabels, Counter>,
    /// Every round: copy reads that failed, by role.
    failed_reads_total: Family<RoleLabels, Counter>,
    /// Every round: copies found behind, by role.
    copies_behind_total: Family<RoleLabels, Counter>,
    /// Rounds by result.
    rounds_total: Family<ResultLabels, Counter>,
}

impl Default for AuditMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AuditMetrics {
    /// Creates and registers every metric.
    pub fn new() -> AuditMetrics {
        let mut registry = Registry::with_prefix("hotsplit_audit");
        let skew = register_metric(
            &mut registry,
            "version_skew",
            "Per-key version skew (newest version minus the oldest present copy read), one observation per key and round, by read role",
            Family::<RoleLabels, Histogram>::new_with_constructor(|| {
                Histogram::new([0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0])
            }),
        );
        let skew_max: Family<RoleLabels, Gauge> = register(
            &mut registry,
            "version_skew_max",
            "Last round: the largest per-key version skew, by read role",
        );
        let share_behind: Family<RoleLabels, FloatGauge> = register(
            &mut registry,
            "copies_behind_ratio",
            "Last round: share of copy reads behind their key's newest version (missing copies included), by read role",
        );
        let inconsistency_per_million: Family<RoleLabels, FloatGauge> = register(
            &mut registry,
            "inconsistency_per_million",
            "Last round: copy reads disagreeing with their key's newest version, per million copy reads, by read role",
        );
        let copies_behind: Family<RoleLabels, Gauge> = register(
            &mut registry,
            "round_copies_behind",
            "Last round: copy reads behind their key's newest version, by read role",
        );
        let keys: Gauge = register(&mut registry, "keys", "Last round: keys read");
        let inconsistent_keys: Gauge = register(
            &mut registry,
            "inconsistent_keys",
            "Last round: keys with at least one disagreeing copy read",
        );
        let round_seconds: FloatGauge = register_with_unit(
            &mut registry,
            "round_duration",
            "Last round: how long it took",
            Unit::Seconds,
            FloatGauge::default(),
        );
        let copy_reads_total: Family<RoleLabels, Counter> = register(
            &mut registry,
            "copy_reads",
            "Copy reads that answered, by read role",
        );
        let failed_reads_total: Family<RoleLabels, Counter> = register(
            &mut registry,
            "failed_reads",
            "Copy reads that failed, by read role",
        );
        let copies_behind_total: Family<RoleLabels, Counter> = register(
            &mut registry,
            "copies_behind",
            "Copy reads found behind their key's newest version, by read role",
        );
        let rounds_total: Family<ResultLabels, Counter> = register(
            &mut registry,
            "rounds",
            "Audit rounds by result (ok, failed)",
        );
        AuditMetrics {
            registry: std::sync::Mutex::new(registry),
            skew,
            skew_max,
            share_behind,
            inconsistency_per_million,
            copies_behind,
            keys,
            inconsistent_keys,
            round_seconds,
            copy_reads_total,
            failed_reads_total,
            copies_behind_total,
            rounds_total,
        }
    }

    /// Records a successful round.
    pub fn record(&self, report: &Report) {
        let saturate = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        let figures = &report.figures;
        for role in ReadRole::ALL {
            let label = RoleLabels {
                role: role.as_str(),
            };
            let counts = figures.role(role);
            let skew = self.skew.get_or_create(&label).clone();
            for key_skew in &counts.skew.sorted {
                skew.observe(*key_skew as f64);
            }
            self.skew_max
                .get_or_create(&label)
                .set(saturate(counts.skew.max));
            self.share_behind
                .get_or_create(&label)
                .set(counts.share_behind);
            self.inconsistency_per_million
                .get_or_create(&label)
                .set(counts.inconsistency_per_million);
            self.copies_behind
                .get_or_create(&label)
                .set(saturate(counts.copies_behind));
            self.copy_reads_total
                .get_or_create(&label)
                .inc_by(counts.copy_reads);
            self.failed_reads_total
                .get_or_create(&label)
                .inc_by(counts.failed_reads);
            self.copies_behind_total
                .get_or_create(&label)
                .inc_by(counts.copies_behind);
        }
        self.keys
            .set(i64::try_from(figures.keys).unwrap_or(i64::MAX));
        self.inconsistent_keys
            .set(i64::try_from(figures.inconsistent_keys).unwrap_or(i64::MAX));
        self.round_seconds.set(report.elapsed_ms as f64 / 1000.0);
        self.rounds_total
            .get_or_create(&ResultLabels { result: "ok" })
            .inc();
    }

    /// Counts a round that failed; the gauges keep the last successful round.
    pub(crate) fn round_failed(&self) {
        self.rounds_total
            .get_or_create(&ResultLabels { result: "failed" })
            .inc();
    }

    /// Renders the OpenMetrics text exposition (served as [`crate::metrics::CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Writing into a String cannot fail; an error here would be a bug in the encoder.
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `GET /metrics` over `metrics`; every other path is 404.
pub fn router(metrics: Arc<AuditMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .with_state(metrics)
}

/// The OpenMetrics text exposition.
async fn render(State(metrics): State<Arc<AuditMetrics>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::figures::{compute, CopyObservation, CopyState, KeySample};
    use crate::key::Version;
    use crate::store::{CopyStamp, NodeLabel};
    use tower::ServiceExt;

    fn report() -> Report {
        let read = |copy, role, version| CopyObservation {
            copy,
            node: NodeLabel::new("n:1"),
            role,
            state: CopyState::Present(CopyStamp {
                version: Version::new(version).unwrap(),
                tombstone: false,
            }),
        };
        let sample = KeySample {
            key: "k".to_owned(),
            copies: 2,
            reads: vec![
                read(0, ReadRole::Primary, 5),
                read(1, ReadRole::Primary, 3),
                read(0, ReadRole::Replica, 5),
                read(1, ReadRole::Replica, 3),
            ],
        };
        Report {
            target: "redis://n:1".to_owned(),
            cluster: false,
            primaries: 1,
            replicas: 1,
            unreachable_replicas: Vec::new(),
            prefix: None,
            copy_counts: "inferred",
            scanned_keys: 2,
            scan_complete: true,
            unsplit_keys: 0,
            stray_copies: 0,
            rate: 10,
            elapsed_ms: 250,
            figures: compute(&[sample]),
        }
    }

    #[tokio::test]
    async fn the_router_serves_the_last_round() {
        let metrics = Arc::new(AuditMetrics::new());
        metrics.record(&report());
        metrics.record(&report());
        metrics.round_failed();
        let response = router(Arc::clone(&metrics))
            .oneshot(
                axum::http::Request::get("/metrics")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = metrics.render();
        for line in [
            r#"hotsplit_audit_version_skew_max{role="primary"} 2"#,
            r#"hotsplit_audit_version_skew_count{role="replica"} 2"#,
            r#"hotsplit_audit_version_skew_bucket{le="1.0",role="replica"} 0"#,
            r#"hotsplit_audit_version_skew_bucket{le="2.0",role="replica"} 2"#,
            r#"hotsplit_audit_copies_behind_ratio{role="primary"} 0.5"#,
            r#"hotsplit_audit_inconsistency_per_million{role="replica"} 500000.0"#,
            r#"hotsplit_audit_round_copies_behind{role="primary"} 1"#,
            r#"hotsplit_audit_copies_behind_total{role="primary"} 2"#,
            r#"hotsplit_audit_copy_reads_total{role="replica"} 4"#,
            r#"hotsplit_audit_rounds_total{result="ok"} 2"#,
            r#"hotsplit_audit_rounds_total{result="failed"} 1"#,
            "hotsplit_audit_keys 1",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }
}
