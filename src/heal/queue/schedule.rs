//! The retry worker's side of the queue: which nodes are due for a probe, the batch of writes
//! for one node, what became of each write, and the exponential backoff with full jitter.

use std::time::{Duration, Instant};

use rand::Rng;

use super::RetryQueue;
use crate::error::Error;
use crate::metrics::RetryDrop;
use crate::store::{now_unix_ms, CopyWrite, NodeLabel, Payload};

/// A batch of writes handed to a node's retry loop.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The writes, one per entry.
    pub(crate) writes: Vec<CopyWrite>,
}

impl RetryQueue {
    /// Nodes whose probe is due, marked busy; and when the next one is due.
    pub(crate) fn due_nodes(&self, now: Instant) -> (Vec<NodeLabel>, Option<Instant>) {
        let mut state = self.core.state();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (label, node) in state.nodes.iter_mut() {
            if node.busy {
                continue;
            }
            if node.next_probe <= now {
                node.busy = true;
                due.push(label.clone());
            } else {
                next = Some(next.map_or(node.next_probe, |at| at.min(node.next_probe)));
            }
        }
        (due, next)
    }

    /// Up to `limit` writes pending on `node`; expired entries are dropped on the way.
    pub(crate) fn batch(&self, node: &NodeLabel, limit: usize) -> Batch {
        let now_ms = now_unix_ms();
        let mut state = self.core.state();
        let keys: Vec<String> = match state.nodes.get(node) {
            Some(queue) => queue.keys.iter().take(limit).cloned().collect(),
            None => Vec::new(),
        };
        let mut writes = Vec::with_capacity(keys.len());
        let mut expired = 0;
        for copy_key in keys {
            let Some(entry) = state.entries.get(&copy_key) else {
                continue;
            };
            if entry.expire_at_ms <= now_ms {
                expired += 1;
                self.core.remove_if(&mut state, &copy_key, |_| true);
                self.core.metrics.retry_drop(RetryDrop::Expired);
            } else {
                writes.push(entry.write());
            }
        }
        if expired > 0 {
            self.reset_if_drained(&state);
            self.core.publish_gauges(&state);
        }
        Batch { writes }
    }

    /// A retried write reached its copy: the entry is done unless a newer one replaced it.
    pub(crate) fn completed(&self, write: &CopyWrite) {
        let tombstone = matches!(write.payload, Payload::Tombstone);
        let mut state = self.core.state();
        let removed = self
            .core
            .remove_if(&mut state, write.copy_key.as_str(), |entry| {
                entry.version == write.version && entry.is_tombstone() == tombstone
            });
        if removed {
            self.spool_complete(write.copy_key.as_str(), write.version, tombstone);
            self.reset_if_drained(&state);
            self.core.publish_gauges(&state);
        }
    }

    /// A retried write failed: count it on the entry.
    pub(crate) fn failed(&self, write: &CopyWrite, error: &Error) {
        let mut state = self.core.state();
        if let Some(entry) = state.entries.get_mut(write.copy_key.as_str()) {
            if entry.version == write.version {
                entry.attempts += 1;
                entry.last_error = Some(error.to_string());
            }
        }
    }

    /// Counts a retry attempt on the entry (a successful one).
    pub(crate) fn attempted(&self, write: &CopyWrite) {
        let mut state = self.core.state();
        if let Some(entry) = state.entries.get_mut(write.copy_key.as_str()) {
            entry.attempts += 1;
        }
    }

    /// The node's probe or flush ended; `ok` says whether the node answered. A node left with
    /// no entries is forgotten (logged as drained); else it backs off (after a failure) or is
    /// due at once (after a partial flush).
    pub(crate) fn node_done(&self, node: &NodeLabel, ok: bool) {
        let mut state = self.core.state();
        let Some(queue) = state.nodes.get_mut(node) else {
            return;
        };
        queue.busy = false;
        if queue.keys.is_empty() {
            let since = queue.since;
            state.nodes.remove(node);
            tracing::info!(node = %node, after_ms = since.elapsed().as_millis() as u64, "retry backlog drained on a node");
            return;
        }
        if ok {
            queue.failures = 0;
            queue.next_probe = Instant::now();
        } else {
            queue.failures = queue.failures.saturating_add(1);
            let ceiling = self
                .core
                .config
                .backoff_initial
                .saturating_mul(2u32.saturating_pow(queue.failures.min(20)))
                .min(self.core.config.backoff_cap);
            queue.next_probe = Instant::now() + jitter(ceiling);
        }
    }

    /// Makes `node`'s next probe due now (a health probe saw it answer) and wakes the worker.
    pub fn retry_now(&self, node: &NodeLabel) {
        let mut state = self.core.state();
        if let Some(queue) = state.nodes.get_mut(node) {
            queue.next_probe = Instant::now();
            drop(state);
            self.core.wake.notify_one();
        }
    }
}

/// A uniformly random duration in `0..=ceiling` (full jitter).
pub(super) fn jitter(ceiling: Duration) -> Duration {
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=millis))
}
#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn a_completion_keeps_a_newer_entry() {
        let queue = queue();
        offer(&queue, 1, &value(1), vec![failed(0, "a")]);
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        offer(&queue, 2, &value(1), vec![failed(0, "a")]);
        queue.completed(&batch.writes[0]);
        assert_eq!(queue.view(1).entries[0].version.get(), 2);
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        queue.completed(&batch.writes[0]);
        assert_eq!(queue.depth(), 0);
        assert!(queue.view(1).nodes.is_empty());
    }
}
