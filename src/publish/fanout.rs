//! The fan-out of one version of an edit: the copy writes, sent per node within the deadline,
//! then the named steps each result goes through (the retry queue's covered entries, the near
//! cache, the counters, the report's line), and the failed copies queued.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::{PublishReport, Publisher, SyncReplicas};
use crate::deadline;
use crate::error::{Error, ErrorKind, Result};
use crate::family::Family;
use crate::heal::{jitter, Admission, FailedCopy};
use crate::key::{Key, Placement, Version};
use crate::metrics::{CopyWriteOutcome, WriteOp};
use crate::near::Offer;
use crate::route::RouteReason;
use crate::store::{
    now_unix_ms, CasOutcome, CopyRecord, CopyWrite, NodeLabel, Payload, ServedBy, WriteResult,
};

/// One version of one edit being written: what every step of the fan-out needs.
pub(super) struct VersionWrite<'a> {
    /// The key.
    pub(super) key: &'a Key,
    /// Its family (copies, TTL).
    pub(super) family: &'a Family,
    /// The version written.
    pub(super) version: Version,
    /// The value or the tombstone.
    pub(super) payload: &'a Payload,
    /// Publish or invalidate, for the counters.
    pub(super) op: WriteOp,
    /// The replica wait after each write.
    pub(super) sync: Option<SyncReplicas>,
    /// When the publish stops waiting for the copies' nodes.
    pub(super) until: Option<Instant>,
}

impl Publisher {
    /// Writes `edit.version` of `edit.payload` to every copy of `edit.key`, waiting for the
    /// copies' nodes until `edit.until` at most; returns the report and the highest version a
    /// copy refused this one with (stale or conflict), if any.
    ///
    /// # Errors
    /// [`ErrorKind::StoreFull`] when the embedded store refused the whole batch (nothing
    /// changed, nothing is queued); [`ErrorKind::Unavailable`] when the family's split records
    /// were never read (nothing is written).
    pub(super) async fn write_version(
        &self,
        edit: &VersionWrite<'_>,
    ) -> Result<(PublishReport, Option<Version>)> {
        if let Some(layouts) = &self.layouts {
            layouts.splits().ensure_read(edit.family.name())?;
        }
        let writes = self.copy_writes(edit);
        // The copies an edit applied were at least this new on their primaries from the moment
        // the write began: the age bound of the near-cache entries they become.
        let started = std::time::Instant::now();
        let (results, acks) = match edit.until {
            None => self.send(&writes, edit.sync).await,
            Some(until) => self.send_until(&writes, edit.sync, until).await,
        };
        // The embedded store refuses a batch that would pass its memory bound whole: nothing
        // changed, and a retry could not hold it either, so the publish fails as one.
        if let Some(full) = results.iter().find_map(|result| match &result.outcome {
            Err(err) if err.kind() == ErrorKind::StoreFull => Some(err.clone()),
            _ => None,
        }) {
            return Err(full);
        }
        // Copies, not names: a `spread` family writes two names of each copy but copy 0.
        let write_count = writes
            .iter()
            .map(|write| write.copy_key.index() + 1)
            .max()
            .unwrap_or(0);
        self.delete_shrunk(edit, write_count).await;
        let mut report = PublishReport::new(edit.key, edit.version, write_count);
        let mut refused_at: Option<Version> = None;
        let mut failed: Vec<(usize, FailedCopy)> = Vec::new();
        let mut acks = acks.into_iter();
        for (write, result) in writes.iter().zip(results) {
            if let Ok(CasOutcome::Stale { stored } | CasOutcome::Conflict { stored }) =
                &result.outcome
            {
                refused_at = refused_at.max(Some(*stored));
            }
            if let Some(copy) = self.clear_covered(edit, write, &result) {
                failed.push((report.outcomes.len(), copy));
            }
            self.offer_applied(write, &result, started);
            self.metrics.copy_outcome(edit.op, counted(&result));
            report.record(write, result, acks.next().flatten());
        }
        self.queue_failed(edit, &mut report, failed).await;
        Ok((report, refused_at))
    }

    /// One write per copy name, with its expiry: the TTL from now, a value's shortened by the
    /// jitter, a tombstone's whole. Copies a live instance with more copies reads are written
    /// too, so they never miss an edit while it serves them (ARCHITECTURE.md, "A resize across
    /// instances").
    fn copy_writes(&self, edit: &VersionWrite<'_>) -> Vec<CopyWrite> {
        let now_ms = now_unix_ms();
        let ttl_ms = crate::duration::millis(edit.family.ttl);
        let (jitter_min, jitter_max) = self.expiry_jitter;
        let tombstone = matches!(edit.payload, Payload::Tombstone);
        let write_count = self.layouts.as_ref().map_or(edit.family.copies, |layouts| {
            layouts.key_write_copies(edit.family.name(), edit.key.as_str(), edit.family.copies)
        });
        // The names written (`layout::placing`): with layouts, `K#i` while any live instance
        // may read it (the compatibility window is open) and the tagged names while this
        // family is, or another live instance is, configured `spread`; without (no live
        // instances to agree with), the configured names only.
        let placements: &[Placement] = match &self.layouts {
            Some(layouts) => layouts.write_placements(edit.family),
            None => std::slice::from_ref(&edit.family.placement),
        };
        let mut writes = Vec::with_capacity(write_count as usize * placements.len());
        for index in 0..write_count {
            for (nth, &placement) in placements.iter().enumerate() {
                // Copy 0 is `K#0` under both: written once.
                if index == 0 && nth > 0 {
                    continue;
                }
                writes.push(CopyWrite {
                    copy_key: edit.key.copy_key(index, placement),
                    version: edit.version,
                    payload: edit.payload.clone(),
                    expire_at_ms: if tombstone {
                        now_ms.saturating_add(ttl_ms)
                    } else {
                        jitter::expire_at_ms(now_ms, ttl_ms, jitter_min, jitter_max)
                    },
                });
            }
        }
        writes
    }

    /// Deletes the copies from `write_count` up to the largest layout recorded for the family,
    /// when a shrink left some (best effort: a failure is logged and the sweep retries). Both
    /// namings are deleted: no instance reads a copy beyond the write count under either, and
    /// one the family wrote before a placement change is gone as well.
    async fn delete_shrunk(&self, edit: &VersionWrite<'_>, write_count: u32) {
        let Some(layouts) = &self.layouts else {
            return;
        };
        let max_copies = layouts.max_copies(edit.family.name(), edit.family.copies);
        if max_copies <= write_count {
            return;
        }
        let removed: Vec<_> = (write_count..max_copies)
            .flat_map(|index| {
                [Placement::Suffix, Placement::Spread]
                    .map(|placement| edit.key.copy_key(index, placement))
            })
            .collect();
        let deleting = self.store.delete_copies(&removed);
        let deleted = match edit.until {
            None => deleting.await,
            Some(until) => tokio::time::timeout_at(until, deleting)
                .await
                .unwrap_or_else(|_| Err(deadline::exceeded())),
        };
        if let Err(err) = deleted {
            tracing::debug!(key = %edit.key, error = %err, "could not delete copies removed by a shrink");
        }
    }

    /// Clears the retry queue's entries a copy's answer covers (it holds this version, or a
    /// newer one); returns the copy to queue when its write failed. Nothing without a queue.
    fn clear_covered(
        &self,
        edit: &VersionWrite<'_>,
        write: &CopyWrite,
        result: &WriteResult,
    ) -> Option<FailedCopy> {
        let queue = self.retry_queue.as_ref()?;
        let tombstone = matches!(edit.payload, Payload::Tombstone);
        match &result.outcome {
            Ok(CasOutcome::Applied | CasOutcome::Current) => {
                queue.clear_covered(&write.copy_key, edit.version, tombstone)
            }
            Ok(CasOutcome::Stale { stored } | CasOutcome::Conflict { stored }) => {
                queue.clear_covered(&write.copy_key, *stored, false)
            }
            Err(err) => {
                return Some(FailedCopy {
                    copy_key: write.copy_key.clone(),
                    node: result.node.clone(),
                    expire_at_ms: write.expire_at_ms,
                    error: err.to_string(),
                })
            }
        }
        None
    }

    /// Offers an applied copy to the near cache, as of `started`. Only an applied copy holds
    /// the expiry written: a `current` one kept its own, which the compare-and-set does not
    /// report, and an entry must not outlive its copy.
    fn offer_applied(&self, write: &CopyWrite, result: &WriteResult, started: std::time::Instant) {
        let (Some(near), Ok(CasOutcome::Applied)) = (&self.near, &result.outcome) else {
            return;
        };
        let served_by = if result.node == NodeLabel::embedded() {
            ServedBy::embedded()
        } else {
            ServedBy::primary(result.node.clone())
        };
        near.offer(
            &write.copy_key,
            Offer {
                record: CopyRecord {
                    version: write.version,
                    payload: write.payload.clone(),
                    expire_at_ms: write.expire_at_ms,
                },
                served_by,
                reason: RouteReason::Class,
                as_of: started,
                fill_time: None,
            },
        );
    }

    /// Queues the `failed` copies (each with its line's position in `report`) and marks each
    /// line queued or dropped as the queue admitted it.
    async fn queue_failed(
        &self,
        edit: &VersionWrite<'_>,
        report: &mut PublishReport,
        failed: Vec<(usize, FailedCopy)>,
    ) {
        let Some(queue) = &self.retry_queue else {
            return;
        };
        if failed.is_empty() {
            return;
        }
        let (positions, failed): (Vec<usize>, Vec<FailedCopy>) = failed.into_iter().unzip();
        let expiries: Vec<u64> = failed.iter().map(|copy| copy.expire_at_ms).collect();
        let admissions = queue
            .enqueue(edit.key, edit.version, edit.payload, failed)
            .await;
        for ((position, admission), expire_at_ms) in
            positions.into_iter().zip(admissions).zip(expiries)
        {
            report.settle_failed(position, admission == Admission::Queued, expire_at_ms);
        }
    }

    /// Sends `writes` (with the replica wait of `sync`), all at once; returns one result and one
    /// acknowledgement count (only with `sync`) per write, in order.
    async fn send(
        &self,
        writes: &[CopyWrite],
        sync: Option<SyncReplicas>,
    ) -> (Vec<WriteResult>, Vec<Option<u32>>) {
        match sync {
            None => (self.store.write_copies(writes).await, Vec::new()),
            Some(sync) => self
                .store
                .write_copies_synced(writes, sync.replicas, sync.timeout_ms)
                .await
                .into_iter()
                .unzip(),
        }
    }

    /// [`Publisher::send`], waiting for each node's writes until `until` at most: the writes are
    /// sent as one group per owning node, all groups at once, so a node that does not answer in
    /// time fails only its own copies (`deadline_exceeded`), and the others keep their outcomes.
    async fn send_until(
        &self,
        writes: &[CopyWrite],
        sync: Option<SyncReplicas>,
        until: Instant,
    ) -> (Vec<WriteResult>, Vec<Option<u32>>) {
        let mut groups: BTreeMap<NodeLabel, Vec<usize>> = BTreeMap::new();
        for (at, write) in writes.iter().enumerate() {
            groups
                .entry(self.store.node_of(&write.copy_key))
                .or_default()
                .push(at);
        }
        let sent = join_all(groups.into_iter().map(|(node, positions)| async move {
            let batch: Vec<CopyWrite> = positions.iter().map(|&at| writes[at].clone()).collect();
            let answered = tokio::time::timeout_at(until, self.send(&batch, sync)).await;
            (node, positions, answered.ok())
        }))
        .await;
        let mut results: Vec<Option<WriteResult>> = writes.iter().map(|_| None).collect();
        let mut acks: Vec<Option<u32>> = writes.iter().map(|_| None).collect();
        for (node, positions, answered) in sent {
            match answered {
                Some((group_results, group_acks)) => {
                    let mut group_acks = group_acks.into_iter();
                    for (at, result) in positions.into_iter().zip(group_results) {
                        results[at] = Some(result);
                        acks[at] = group_acks.next().flatten();
                    }
                }
                None => {
                    for at in positions {
                        results[at] = Some(WriteResult {
                            node: node.clone(),
                            outcome: Err(deadline::exceeded()),
                        });
                    }
                }
            }
        }
        let results = results
            .into_iter()
            .zip(writes)
            .map(|(result, write)| {
                result.unwrap_or_else(|| WriteResult {
                    node: self.store.node_of(&write.copy_key),
                    outcome: Err(Error::new(
                        ErrorKind::Unavailable,
                        "the store gave no result for this copy",
                    )),
                })
            })
            .collect();
        (results, if sync.is_some() { acks } else { Vec::new() })
    }
}

/// How a copy write's result is counted.
fn counted(result: &WriteResult) -> CopyWriteOutcome {
    match &result.outcome {
        Ok(CasOutcome::Applied) => CopyWriteOutcome::Applied,
        Ok(CasOutcome::Current) => CopyWriteOutcome::Current,
        Ok(CasOutcome::Stale { .. }) => CopyWriteOutcome::Stale,
        Ok(CasOutcome::Conflict { .. }) => CopyWriteOutcome::Conflict,
        Err(_) => CopyWriteOutcome::Failed,
    }
}
