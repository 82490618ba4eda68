//! The retry worker: probes failing nodes with backoff and flushes their entries.
//!
//! Each node with pending entries has one probe at a time: one entry is retried through the
//! store's compare-and-set. When it answers (`applied`, `current` or `stale` all complete the
//! entry: a retry never moves a copy backwards, and the expiry sent is the entry's absolute one),
//! the node's entries are flushed in batches; when it fails, the node backs off exponentially
//! with full jitter (`heal.backoff_initial` to `heal.backoff_cap`).
//!
//! At shutdown every node with entries gets one more probe, ignoring its backoff and what the
//! health table last saw of it (a node marked failing may answer again by then, and the prober
//! has stopped): its writes are sent, and a node that does not answer keeps its entries in the
//! spool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::queue::RetryQueue;
use super::NodeHealth;
use crate::metrics::{Metrics, RetryResult};
use crate::store::{CasOutcome, CopyStore, NodeLabel};

/// Retries queued copy writes until shutdown. Spawn [`RetryWorker::run`] on the server's
/// task tracker.
pub struct RetryWorker {
    /// The queue to drain.
    queue: Arc<RetryQueue>,
    /// Where the copies live.
    store: Arc<dyn CopyStore>,
    /// Attempt counters.
    metrics: Arc<Metrics>,
    /// Entries per flush batch.
    flush_batch: usize,
    /// How long the final drain may run at shutdown.
    drain_for: Duration,
    /// The health table the store consults (with Redis): the final drain lets a failing node's
    /// writes through.
    health: Option<Arc<NodeHealth>>,
}

impl RetryWorker {
    /// A worker draining `queue` into `store`; at shutdown it keeps draining for `drain_for`.
    pub fn new(
        queue: Arc<RetryQueue>,
        store: Arc<dyn CopyStore>,
        metrics: Arc<Metrics>,
        flush_batch: usize,
        drain_for: Duration,
    ) -> RetryWorker {
        RetryWorker {
            queue,
            store,
            metrics,
            flush_batch: flush_batch.max(1),
            drain_for,
            health: None,
        }
    }

    /// The worker, with `health` the table its store consults: at shutdown, a node marked
    /// failing is probed once more like every other (its writes are sent).
    #[must_use]
    pub fn with_health(mut self, health: Arc<NodeHealth>) -> RetryWorker {
        self.health = Some(health);
        self
    }

    /// Runs until `shutdown`, then tries to drain the queue for the grace period and logs what
    /// is left (which stays in the spool).
    pub async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let mut running: JoinSet<()> = JoinSet::new();
        loop {
            let (due, next) = this.queue.due_nodes(Instant::now());
            for node in due {
                let worker = this.clone();
                running.spawn(async move { worker.serve_node(node).await });
            }
            let wait = next.map_or(Duration::from_secs(1), |at| {
                at.saturating_duration_since(Instant::now())
            });
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = this.queue.wake().notified() => {}
                () = tokio::time::sleep(wait) => {}
                Some(_) = running.join_next(), if !running.is_empty() => {
                    this.queue.maybe_compact();
                }
            }
        }
        // Shutdown: let running probes finish, then give every node with entries one more
        // probe (ignoring its backoff); a node that answers is flushed completely, one that
        // does not keeps its entries in the spool. All within the grace period.
        let deadline = tokio::time::Instant::now() + this.drain_for;
        let drained = tokio::time::timeout_at(deadline, async {
            while running.join_next().await.is_some() {}
            let (due, _) = this
                .queue
                .due_nodes(Instant::now() + Duration::from_secs(86_400));
            for node in due {
                if let Some(health) = &this.health {
                    health.probe_at_shutdown(&node);
                }
                let worker = this.clone();
                running.spawn(async move { worker.serve_node(node).await });
            }
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            running.abort_all();
        }
        this.queue.log_leftovers();
    }

    /// One probe of `node`, then batches while it answers.
    async fn serve_node(&self, node: NodeLabel) {
        let mut limit = 1;
        loop {
            let batch = self.queue.batch(&node, limit);
            if batch.writes.is_empty() {
                self.queue.node_done(&node, true);
                return;
            }
            let results = self.store.write_copies(&batch.writes).await;
            let mut answered = true;
            for (write, result) in batch.writes.iter().zip(results) {
                match result.outcome {
                    Ok(outcome) => {
                        self.metrics.retry_attempt(match outcome {
                            CasOutcome::Applied => RetryResult::Applied,
                            CasOutcome::Current => RetryResult::Current,
                            // A conflict (this version holds another body) completes the entry
                            // like a newer version does: the copy is never overwritten.
                            CasOutcome::Stale { .. } | CasOutcome::Conflict { .. } => {
                                RetryResult::Stale
                            }
                        });
                        self.queue.attempted(write);
                        self.queue.completed(write);
                    }
                    Err(err) => {
                        self.metrics.retry_attempt(RetryResult::Failed);
                        tracing::debug!(copy_key = %write.copy_key, node = %node, error = %err, "retry failed");
                        self.queue.failed(write, &err);
                        answered = false;
                    }
                }
            }
            if !answered {
                self.queue.node_done(&node, false);
                return;
            }
            limit = self.flush_batch;
        }
    }
}
