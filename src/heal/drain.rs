//! `hotsplit spool drain DIR`: replays the retry spool a dead instance left into the store.
//!
//! The spool is opened like a starting instance opens its own ([`RetryQueue::open`]): its lock
//! is taken (a spool a live process holds is refused), every format is read (0 and 1), damage
//! is skipped and kept aside, expired entries are dropped, and the records are coalesced into
//! one pending entry per copy (the highest version). Each node's entries are then written in
//! batches through the same compare-and-set as a retry, with each entry's own version, payload
//! and absolute expiry, so a drain never moves a copy backwards nor extends a life; a copy
//! already holding that version or a newer one counts as *already newer*. Completed entries
//! are recorded in the spool, so what fails stays there for another drain; a spool drained to
//! the end is left empty (its header only).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::metrics::{Metrics, RetryDrop};
use crate::store::{CasOutcome, CopyStore, NodeLabel};

use super::{HealConfig, RetryQueue};

/// How many times a node's writes may fail in a row before the drain gives up on it.
const NODE_ATTEMPTS: u32 = 3;

/// What a drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainSummary {
    /// Pending copies found in the spool (after coalescing, before dropping expired ones).
    pub entries: u64,
    /// Copies written (`applied`).
    pub replayed: u64,
    /// Copies that already held this version or a newer one (`current`, `stale`, `conflict`).
    pub already_newer: u64,
    /// Entries whose expiry had passed: the copy they would heal has expired too.
    pub expired: u64,
    /// Copy writes that failed (their entries stay in the spool).
    pub failed: u64,
    /// Entries left in the spool.
    pub left: u64,
}

/// Drain progress, reported after every batch.
#[derive(Debug, Clone, Copy)]
pub struct DrainProgress {
    /// Entries pending in the spool now.
    pub pending: u64,
    /// Entries written or found already newer so far.
    pub done: u64,
}

/// Opens the spool in `config.spool_dir` and writes every pending entry to `store`, calling
/// `progress` after each batch; gives up on a node after it failed [`NODE_ATTEMPTS`] times in a
/// row (backing off between attempts as the retry worker does).
///
/// # Errors
/// [`crate::ErrorKind::Io`] when the spool cannot be opened: another process holds its lock
/// (the message says so), its format is unknown, or a record names an invalid key.
pub async fn drain_spool(
    config: HealConfig,
    max_value_bytes: usize,
    store: Arc<dyn CopyStore>,
    progress: &mut dyn FnMut(&DrainProgress),
) -> Result<DrainSummary> {
    let metrics = Metrics::new();
    let placement = store.clone();
    let flush_batch = config.flush_batch.max(1);
    let queue = RetryQueue::open(config, max_value_bytes, metrics.clone(), move |copy_key| {
        placement.node_of(copy_key)
    })?;
    let expired_at_open = metrics.retry_drops(RetryDrop::Expired);
    let mut summary = DrainSummary {
        entries: queue.depth() as u64 + expired_at_open,
        ..DrainSummary::default()
    };
    // Per node, how many batches failed in a row. A node given up on stays marked busy, so
    // the queue offers it no more and the loop ends once every other node is drained.
    let mut failures: HashMap<NodeLabel, u32> = HashMap::new();
    loop {
        let (due, next) = queue.due_nodes(Instant::now());
        if due.is_empty() {
            let Some(next) = next else { break };
            tokio::time::sleep_until(next.into()).await;
            continue;
        }
        for node in due {
            let batch = queue.batch(&node, flush_batch);
            let results = store.write_copies(&batch.writes).await;
            let mut ok = true;
            for (write, result) in batch.writes.iter().zip(results) {
                match result.outcome {
                    Ok(outcome) => {
                        if outcome == CasOutcome::Applied {
                            summary.replayed += 1;
                        } else {
                            summary.already_newer += 1;
                        }
                        queue.completed(write);
                    }
                    Err(err) => {
                        tracing::warn!(copy_key = %write.copy_key, version = %write.version, error = %err, "spool drain: write failed");
                        summary.failed += 1;
                        queue.failed(write, &err);
                        ok = false;
                    }
                }
            }
            let failed_in_a_row = failures.entry(node.clone()).or_default();
            *failed_in_a_row = if ok { 0 } else { *failed_in_a_row + 1 };
            if *failed_in_a_row >= NODE_ATTEMPTS {
                tracing::warn!(node = %node, pending = queue.pending_on(&node), "spool drain: giving up on a node that keeps failing");
                continue;
            }
            queue.node_done(&node, ok);
            progress(&DrainProgress {
                pending: queue.depth() as u64,
                done: summary.replayed + summary.already_newer,
            });
        }
    }
    summary.expired = metrics.retry_drops(RetryDrop::Expired);
    summary.left = queue.depth() as u64;
    queue.close().await;
    Ok(summary)
}
