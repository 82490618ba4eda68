//! Read repair: a copy found missing or older than a sibling during an affine read is written
//! back with the sibling's record, off the request path.
//!
//! The write goes through the same compare-and-set as a publish, with the sibling's version and
//! absolute expiry, so a repair can never move a copy backwards nor extend its life. At most
//! `heal.repair_concurrency` repairs run at once; a repair beyond that is skipped and counted
//! (the next read that falls back tries again).

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::metrics::{Metrics, RepairResult};
use crate::store::{CasOutcome, CopyStore, CopyWrite};

/// Schedules read repairs. Cheap to share behind the reader.
pub struct Repairer {
    /// Where the copies live.
    store: Arc<dyn CopyStore>,
    /// Bounds the repairs running at once.
    permits: Arc<Semaphore>,
    /// Tracks the repair tasks, so shutdown waits for them.
    tracker: TaskTracker,
    /// Repair counters.
    metrics: Arc<Metrics>,
}

impl Repairer {
    /// A repairer running at most `concurrency` repairs at once on `tracker`.
    pub fn new(
        store: Arc<dyn CopyStore>,
        concurrency: usize,
        tracker: TaskTracker,
        metrics: Arc<Metrics>,
    ) -> Repairer {
        Repairer {
            store,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            tracker,
            metrics,
        }
    }

    /// Writes `write` in the background, or skips it when too many repairs are running.
    pub fn repair(&self, write: CopyWrite) {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.metrics.read_repair(RepairResult::Skipped);
            return;
        };
        if self.tracker.is_closed() {
            self.metrics.read_repair(RepairResult::Skipped);
            return;
        }
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        self.tracker.spawn(async move {
            let results = store.write_copies(std::slice::from_ref(&write)).await;
            let result = match results.into_iter().next().map(|result| result.outcome) {
                Some(Ok(CasOutcome::Applied)) => RepairResult::Applied,
                Some(Ok(
                    CasOutcome::Current | CasOutcome::Stale { .. } | CasOutcome::Conflict { .. },
                )) => RepairResult::Unneeded,
                Some(Err(err)) => {
                    tracing::debug!(copy_key = %write.copy_key, error = %err, "read repair failed");
                    RepairResult::Failed
                }
                None => RepairResult::Failed,
            };
            if result == RepairResult::Applied {
                tracing::debug!(copy_key = %write.copy_key, version = %write.version, "read repair applied");
            }
            metrics.read_repair(result);
            drop(permit);
        });
    }
}
