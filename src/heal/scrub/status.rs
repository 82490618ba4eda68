//! What the scrub has done, for `GET /v1/scrub` and `/metrics`: [`ScrubStatus`] is shared by
//! the scrubber (which counts into it) and the HTTP layer (which shows [`ScrubView`]).

use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;

use crate::metrics::{register, register_metric, register_with_unit, Metrics};

/// Why a copy was repaired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairCause {
    /// The copy did not exist.
    Missing,
    /// The copy held an older version than a sibling (or a value where a sibling holds the
    /// tombstone of its version).
    Behind,
}

impl RepairCause {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairCause::Missing => "missing",
            RepairCause::Behind => "behind",
        }
    }
}

/// A scrub step that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrubFailure {
    /// A `SCAN` page.
    Scan,
    /// A copy read.
    Read,
    /// A repair write.
    Write,
}

impl ScrubFailure {
    /// The label value.
    fn as_str(self) -> &'static str {
        match self {
            ScrubFailure::Scan => "scan",
            ScrubFailure::Read => "read",
            ScrubFailure::Write => "write",
        }
    }
}

/// Labels of the repair counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    /// `missing` or `behind`.
    cause: &'static str,
}

/// Labels of the failure counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StepLabels {
    /// `scan`, `read` or `write`.
    step: &'static str,
}

/// Labels of the pass counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PassLabels {
    /// `complete` (every node's scan ended) or `aborted` (shutdown, a lost lease, or a node
    /// whose scan failed).
    result: &'static str,
}

/// The figures of one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PassFigures {
    /// When the pass started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// How long it ran, milliseconds (so far, for the current pass).
    pub duration_ms: u64,
    /// Keys `SCAN` returned (copy keys of the walked patterns), and split keys of one-copy
    /// families taken from the split index.
    pub keys_scanned: u64,
    /// Split keys whose copies were read and compared.
    pub keys_checked: u64,
    /// Copies repaired because they did not exist.
    pub repaired_missing: u64,
    /// Copies repaired because they were behind a sibling.
    pub repaired_behind: u64,
    /// Scans, reads and writes that failed (the copy is tried again next pass).
    pub failures: u64,
    /// Whether every node's scan ran to its end (`false`: shutdown, a lost lease or a failed
    /// scan cut it short; for the current pass, not finished yet).
    pub complete: bool,
}

/// The scrub as `GET /v1/scrub` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ScrubView {
    /// Whether this instance takes part (`scrub.enabled` and a Redis store).
    pub enabled: bool,
    /// This instance's name as a lease holder.
    pub instance: String,
    /// Whether this instance holds the lease (it is the one scrubbing).
    pub holds_lease: bool,
    /// The holder the last lease call saw (this instance or another); `null` before the first.
    pub lease_holder: Option<String>,
    /// Passes this instance finished, complete or not.
    pub passes: u64,
    /// The pass running now, if any.
    pub current: Option<PassFigures>,
    /// The last finished pass, if any.
    pub last: Option<PassFigures>,
    /// Families the scrub skips because their layout record disagrees with this instance's
    /// config.
    pub paused_families: Vec<String>,
}

/// The scrub's figures and counters, shared by the scrubber and the HTTP layer.
#[derive(Debug)]
pub struct ScrubStatus {
    /// What [`ScrubStatus::view`] shows.
    state: Mutex<ScrubView>,
    /// `hotsplit_scrub_keys_scanned_total`.
    keys_scanned: Counter,
    /// `hotsplit_scrub_keys_checked_total`.
    keys_checked: Counter,
    /// `hotsplit_scrub_repairs_total{cause}`.
    repairs: Family<CauseLabels, Counter>,
    /// `hotsplit_scrub_failures_total{step}`.
    failures: Family<StepLabels, Counter>,
    /// `hotsplit_scrub_passes_total{result}`.
    passes: Family<PassLabels, Counter>,
    /// `hotsplit_scrub_pass_duration_seconds`.
    pass_duration: Histogram,
    /// `hotsplit_scrub_lease_held`: 1 while this instance holds the lease.
    lease_held: Gauge,
}

impl ScrubStatus {
    /// Registers the scrub's metrics in `metrics` and starts with nothing done.
    pub fn new(metrics: &Metrics, enabled: bool, instance: &str) -> ScrubStatus {
        metrics.register_with(|registry: &mut Registry| ScrubStatus {
            state: Mutex::new(ScrubView {
                enabled,
                instance: instance.to_owned(),
                holds_lease: false,
                lease_holder: None,
                passes: 0,
                current: None,
                last: None,
                paused_families: Vec::new(),
            }),
            keys_scanned: register(
                registry,
                "scrub_keys_scanned",
                "Copy keys the scrub's SCAN returned, and split keys of one-copy families it took from the split index",
            ),
            keys_checked: register(
                registry,
                "scrub_keys_checked",
                "Split keys whose copies the scrub read and compared",
            ),
            repairs: register(
                registry,
                "scrub_repairs",
                "Copies the scrub repaired, by cause (missing, behind)",
            ),
            failures: register(
                registry,
                "scrub_failures",
                "Scrub steps that failed, by step (scan, read, write)",
            ),
            passes: register(
                registry,
                "scrub_passes",
                "Scrub passes this instance finished, by result (complete, aborted)",
            ),
            pass_duration: register_with_unit(
                registry,
                "scrub_pass_duration",
                "How long a scrub pass took",
                Unit::Seconds,
                Histogram::new(exponential_buckets(0.01, 4.0, 10)),
            ),
            lease_held: register_metric(
                registry,
                "scrub_lease_held",
                "1 while this instance holds the scrub lease",
                Gauge::default(),
            ),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScrubView> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `GET /v1/scrub` shows.
    pub fn view(&self) -> ScrubView {
        self.lock().clone()
    }

    /// Records who holds the lease after a lease call (`None`: the call failed).
    pub(super) fn lease(&self, holder: Option<String>) {
        let mut state = self.lock();
        let holds = holder.as_deref() == Some(state.instance.as_str());
        state.holds_lease = holds;
        if holder.is_some() {
            state.lease_holder = holder;
        }
        self.lease_held.set(i64::from(holds));
    }

    /// Starts a pass at `started_unix_ms`, skipping the `paused` families.
    pub(super) fn start(&self, started_unix_ms: u64, paused: Vec<String>) {
        let mut state = self.lock();
        state.current = Some(PassFigures {
            started_unix_ms,
            ..PassFigures::default()
        });
        state.paused_families = paused;
    }

    /// Applies `update` to the current pass.
    fn current(&self, update: impl FnOnce(&mut PassFigures)) {
        if let Some(current) = self.lock().current.as_mut() {
            update(current);
        }
    }

    /// Counts `keys` copy keys a `SCAN` page returned.
    pub(super) fn scanned(&self, keys: u64) {
        self.keys_scanned.inc_by(keys);
        self.current(|pass| pass.keys_scanned += keys);
    }

    /// Counts one split key read and compared.
    pub(super) fn checked(&self) {
        self.keys_checked.inc();
        self.current(|pass| pass.keys_checked += 1);
    }

    /// Counts one applied repair.
    pub(super) fn repaired(&self, cause: RepairCause) {
        self.repairs
            .get_or_create(&CauseLabels {
                cause: cause.as_str(),
            })
            .inc();
        self.current(|pass| match cause {
            RepairCause::Missing => pass.repaired_missing += 1,
            RepairCause::Behind => pass.repaired_behind += 1,
        });
    }

    /// Counts one failed step.
    pub(super) fn failed(&self, step: ScrubFailure) {
        self.failures
            .get_or_create(&StepLabels {
                step: step.as_str(),
            })
            .inc();
        self.current(|pass| pass.failures += 1);
    }

    /// Ends the current pass after `duration`; `complete` when every node's scan ended.
    pub(super) fn finish(&self, duration: std::time::Duration, complete: bool) {
        self.passes
            .get_or_create(&PassLabels {
                result: if complete { "complete" } else { "aborted" },
            })
            .inc();
        self.pass_duration.observe(duration.as_secs_f64());
        let mut state = self.lock();
        if let Some(mut pass) = state.current.take() {
            pass.duration_ms = crate::duration::millis(duration);
            pass.complete = complete;
            state.last = Some(pass);
            state.passes += 1;
        }
    }

    /// Shows the running pass's elapsed time.
    pub(super) fn tick(&self, elapsed: std::time::Duration) {
        self.current(|pass| {
            pass.duration_ms = crate::duration::millis(elapsed);
        });
    }
}
