//! Publish and invalidate: fan one edit out to every copy of a key.
//!
//! An edit carries a [`Version`]. It is written to all N copies at once with the store's
//! compare-and-set ([`Store::write_copies`] groups them per node), so a copy only moves forward
//! and a retry of the same version is idempotent. An invalidation writes a versioned tombstone
//! the same way, so a late write of an older version cannot resurrect the value.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use serde::Serialize;
use tokio::time::Instant;

use crate::deadline::{self, Deadline};
use crate::error::{Error, ErrorKind, Result};
use crate::family::{Families, Family, Versioning};
use crate::heal::{jitter, Admission, FailedCopy, Layouts, RetryQueue};
use crate::key::{Key, Version};
use crate::metrics::{CopyWriteOutcome, Metrics, WriteOp};
use crate::near::NearCache;
use crate::route::RouteReason;
use crate::store::{
    now_unix_ms, CasOutcome, CopyRecord, CopyWrite, NodeLabel, Payload, ServedBy, Store,
    WriteResult,
};

/// The outcome of one copy write, as reported to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CopyOutcome {
    /// The copy now holds this version.
    Applied,
    /// The copy already held exactly this version.
    Current,
    /// The copy holds a newer version, which was kept.
    Stale,
    /// The copy holds this version with a different body (a version used twice), which was
    /// kept.
    Conflict,
    /// The write failed (an error or a timeout) and no retry queue took it; retrying the same
    /// version is safe.
    Failed,
    /// The write failed and was durably queued: hotsplit retries it until it lands or expires.
    Queued,
    /// The write failed and could not be queued (the queue was full, the entry had expired, or
    /// the spool failed); retrying the same version is safe.
    Dropped,
}

/// One copy's line in a [`PublishReport`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CopyReport {
    /// The copy index.
    pub copy: u32,
    /// The stored key, `K#i`.
    pub copy_key: String,
    /// The node that owns the copy (`host:port`, or `embedded`).
    pub node: String,
    /// What happened.
    pub outcome: CopyOutcome,
    /// For a failed (queued or dropped) write, the error class: `timeout`, `unavailable`,
    /// `node_failing` (not sent: the node is known to be failing, see [`crate::heal::health`]),
    /// or `deadline_exceeded` (no answer before the request's deadline; the write may still
    /// land, see [`crate::deadline`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `sync_replicas`: how many replicas of the copy's node acknowledged the write
    /// within `sync_timeout_ms` (the reply of `WAIT`); absent when the wait failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_acked: Option<u32>,
}

/// What a publish or invalidate did to every copy.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PublishReport {
    /// The key.
    pub key: String,
    /// The version written (allocated by hotsplit for `allocated` families).
    #[schema(value_type = u64)]
    pub version: Version,
    /// How many copies were written: the family's copy count, or more while a live instance
    /// with more copies of the family reads them.
    pub copies: u32,
    /// Copies that now hold this version.
    pub applied: u32,
    /// Copies that already held it.
    pub current: u32,
    /// Copies that hold a newer version.
    pub stale: u32,
    /// Copies that hold this version with a different body.
    pub conflict: u32,
    /// Copies whose write failed (including those queued or dropped).
    pub failed: u32,
    /// Failed copies durably queued for retry.
    pub queued: u32,
    /// Failed copies that could not be queued.
    pub dropped: u32,
    /// One line per copy, in copy order.
    pub outcomes: Vec<CopyReport>,
    /// When the last copy this edit applied or queued expires, Unix ms: how long what it stored
    /// (or will store) can be read. `None` when it applied none and queued none (a `current`
    /// copy kept its own expiry, which the compare-and-set does not report).
    #[serde(skip)]
    lasts_until_ms: Option<u64>,
}

/// How a [`PublishReport`] ends, which the HTTP layer maps to a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStatus {
    /// No copy failed, and at least one applied or all are current.
    Done,
    /// Some copy holds this version with a different body: the version was used for two
    /// bodies (a caller's mistake, or an allocated version after three re-allocations).
    Conflict,
    /// Nothing applied, some copy holds a newer version, none failed.
    Stale,
    /// Some copy failed and every failed copy was durably queued for retry.
    Queued,
    /// Some copy failed and was not queued; retrying the same version is safe.
    Incomplete,
}

impl PublishReport {
    /// When the last copy this edit applied or queued expires, Unix ms; `None` when it applied
    /// and queued none.
    pub fn lasts_until_ms(&self) -> Option<u64> {
        self.lasts_until_ms
    }

    /// The overall result.
    pub fn status(&self) -> PublishStatus {
        if self.conflict > 0 {
            PublishStatus::Conflict
        } else if self.failed > 0 && self.queued == self.failed {
            PublishStatus::Queued
        } else if self.failed > 0 {
            PublishStatus::Incomplete
        } else if self.applied == 0 && self.stale > 0 {
            PublishStatus::Stale
        } else {
            PublishStatus::Done
        }
    }
}

/// Which version an edit carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionChoice {
    /// The caller's version (required by `caller` families, refused by `allocated` ones).
    Given(Version),
    /// No version given: `allocated` families allocate one, `caller` families refuse.
    Unspecified,
}

impl From<Option<Version>> for VersionChoice {
    fn from(version: Option<Version>) -> Self {
        match version {
            Some(version) => VersionChoice::Given(version),
            None => VersionChoice::Unspecified,
        }
    }
}

/// Wait for replication after a write: `WAIT replicas timeout_ms` on each written copy's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncReplicas {
    /// How many replicas must acknowledge; at most the replicas known for each copy's node.
    pub replicas: u32,
    /// How long to wait, 1..=5000 ms.
    pub timeout_ms: u64,
}

impl SyncReplicas {
    /// The largest accepted `timeout_ms`.
    pub const MAX_TIMEOUT_MS: u64 = 5_000;
}

/// Publishes and invalidates keys.
pub struct Publisher {
    /// Where copies live.
    store: Arc<dyn Store>,
    /// Copies, TTL and versioning per key family.
    families: Arc<Families>,
    /// Outcome counters.
    metrics: Arc<Metrics>,
    /// Where failed copy writes are queued for retry; `None` reports them `failed`.
    retry_queue: Option<Arc<RetryQueue>>,
    /// The expiry jitter range of value copies, fractions of the TTL in `-0.5..=0`.
    expiry_jitter: (f64, f64),
    /// Recorded layouts and live copy counts: copies a larger live instance reads are written,
    /// and copies removed by a shrink are deleted when their key is published.
    layouts: Option<Arc<Layouts>>,
    /// The instance's near cache, updated with every copy an edit applied.
    near: Option<Arc<NearCache>>,
}

impl Publisher {
    /// A publisher writing through `store`.
    pub fn new(store: Arc<dyn Store>, families: Arc<Families>, metrics: Arc<Metrics>) -> Publisher {
        Publisher {
            store,
            families,
            metrics,
            retry_queue: None,
            expiry_jitter: (0.0, 0.0),
            layouts: None,
            near: None,
        }
    }

    /// Writes copies up to the largest live copy count of `layouts`, and deletes the copies from
    /// there up to `max_copies` of each published key when `layouts` records a larger layout
    /// (a shrink). Default: the family's copies only, no deletion.
    pub fn with_layouts(mut self, layouts: Arc<Layouts>) -> Publisher {
        self.layouts = Some(layouts);
        self
    }

    /// Offers every copy an edit applied to `near`, so readers through this instance see the
    /// edit at once; an invalidation offers a tombstone entry. A copy found `current` is not
    /// offered: it kept its own expiry, which the compare-and-set does not report. Default: no
    /// near cache.
    pub fn with_near_cache(mut self, near: Arc<NearCache>) -> Publisher {
        self.near = Some(near);
        self
    }

    /// Queues failed copy writes in `retry_queue` (reported `queued` or `dropped`).
    pub fn with_retry_queue(mut self, retry_queue: Arc<RetryQueue>) -> Publisher {
        self.retry_queue = Some(retry_queue);
        self
    }

    /// Shortens each value copy's lifetime by a random fraction of the TTL in `min..=max`
    /// (validated as `-0.5 <= min <= max <= 0`). Tombstones get the full TTL, so a tombstone
    /// outlives every pending retry of an older value. Default: no jitter.
    pub fn with_expiry_jitter(mut self, min: f64, max: f64) -> Publisher {
        self.expiry_jitter = (min, max);
        self
    }

    /// Writes `value` at `version` to every copy of `key`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidVersion`] when the version does not fit the family's versioning;
    /// store errors from allocating a version; [`ErrorKind::StoreFull`] when the embedded
    /// store would pass its memory bound (no copy changed). Failed copy writes are not errors:
    /// they are reported per copy, and [`PublishReport::status`] is then `Incomplete`.
    pub async fn publish(
        &self,
        key: &Key,
        version: VersionChoice,
        value: Bytes,
    ) -> Result<PublishReport> {
        self.write_value(key, version, value, None, None).await
    }

    /// Like [`Publisher::publish`] (or [`Publisher::publish_synced`] with `sync`), bounded by
    /// `deadline`: copies whose node has not answered at [`Deadline::copy_writes_until`] are
    /// reported failed with the class `deadline_exceeded`, then queued for retry like any failed
    /// copy (the write may still land; the retry is idempotent).
    ///
    /// # Errors
    /// As [`Publisher::publish_synced`]; [`ErrorKind::DeadlineExceeded`] when the deadline
    /// passes before any copy write is sent (nothing was written).
    pub async fn publish_within(
        &self,
        key: &Key,
        version: VersionChoice,
        value: Bytes,
        sync: Option<SyncReplicas>,
        deadline: Deadline,
    ) -> Result<PublishReport> {
        self.write_value(key, version, value, sync, Some(deadline))
            .await
    }

    /// Like [`Publisher::publish`], then waits for `sync.replicas` replicas of each written
    /// copy's node to acknowledge, and reports the count per copy.
    ///
    /// # Errors
    /// As [`Publisher::publish`]; [`ErrorKind::InvalidParameter`] when `sync.timeout_ms` is
    /// outside 1..=5000 or `sync.replicas` exceeds the replicas known for some copy's node.
    pub async fn publish_synced(
        &self,
        key: &Key,
        version: VersionChoice,
        value: Bytes,
        sync: SyncReplicas,
    ) -> Result<PublishReport> {
        self.write_value(key, version, value, Some(sync), None)
            .await
    }

    /// Writes a tombstone at `version` to every copy of `key`.
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub async fn invalidate(&self, key: &Key, version: VersionChoice) -> Result<PublishReport> {
        self.write_tombstone(key, version, None).await
    }

    /// Like [`Publisher::invalidate`], bounded by `deadline` as [`Publisher::publish_within`].
    ///
    /// # Errors
    /// As [`Publisher::publish_within`].
    pub async fn invalidate_within(
        &self,
        key: &Key,
        version: VersionChoice,
        deadline: Deadline,
    ) -> Result<PublishReport> {
        self.write_tombstone(key, version, Some(deadline)).await
    }

    /// Publishes `value`: the body of the `publish*` methods.
    async fn write_value(
        &self,
        key: &Key,
        version: VersionChoice,
        value: Bytes,
        sync: Option<SyncReplicas>,
        deadline: Option<Deadline>,
    ) -> Result<PublishReport> {
        let payload = owned_value(&value);
        self.write(key, version, payload, WriteOp::Publish, sync, deadline)
            .await
    }

    /// Writes a tombstone: the body of the `invalidate*` methods.
    async fn write_tombstone(
        &self,
        key: &Key,
        version: VersionChoice,
        deadline: Option<Deadline>,
    ) -> Result<PublishReport> {
        let payload = Payload::Tombstone;
        self.write(key, version, payload, WriteOp::Invalidate, None, deadline)
            .await
    }

    /// Checks `sync` against the replicas known for every copy's node.
    fn check_sync(&self, key: &Key, copies: u32, sync: SyncReplicas) -> Result<()> {
        if !(1..=SyncReplicas::MAX_TIMEOUT_MS).contains(&sync.timeout_ms) {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!(
                    "sync_timeout_ms must be in 1..={}, got {}",
                    SyncReplicas::MAX_TIMEOUT_MS,
                    sync.timeout_ms
                ),
            ));
        }
        let topology = self.store.topology();
        for index in 0..copies {
            let node = self.store.node_of(&key.copy_key(index));
            let known = topology
                .iter()
                .find(|set| set.primary == node)
                .map_or(0, |set| set.replicas.len());
            if sync.replicas == 0 || sync.replicas as usize > known {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!(
                        "sync_replicas must be in 1..={known}: the node of copy {index} has {known} replicas known, got {}",
                        sync.replicas
                    ),
                ));
            }
        }
        Ok(())
    }

    async fn write(
        &self,
        key: &Key,
        choice: VersionChoice,
        payload: Payload,
        op: WriteOp,
        sync: Option<SyncReplicas>,
        deadline: Option<Deadline>,
    ) -> Result<PublishReport> {
        let family = self.families.resolve(key);
        if let Some(sync) = sync {
            self.check_sync(key, family.copies, sync)?;
        }
        let until = deadline.map(|deadline| deadline.copy_writes_until());
        let mut floor = 0;
        let mut allocations = 1;
        loop {
            let choosing = self.choose_version(key, family, choice, floor);
            let version = match until {
                None => choosing.await?,
                Some(until) => tokio::time::timeout_at(until, choosing)
                    .await
                    .map_err(|_| deadline::exceeded())??,
            };
            // Nothing is sent once the time for copy writes is over (a slow body, or an
            // allocation that took it): the publish fails whole, and a retry is safe.
            if until.is_some_and(|until| Instant::now() >= until) {
                return Err(deadline::exceeded());
            }
            let (report, refused_at) = self
                .write_version(key, family, version, &payload, op, sync, until)
                .await?;
            // An allocated version that some copy refused (a newer version stored, or this
            // version with another body) came from a counter behind the copies: it lost
            // increments in a failover, or expired before them. Allocate again above the highest
            // version the copies reported, so the counter catches up and this edit lands.
            match refused_at {
                Some(highest)
                    if family.versioning == Versioning::Allocated
                        && allocations < MAX_ALLOCATIONS =>
                {
                    tracing::info!(key = %key, version = %version, highest = %highest, "allocated version refused by a copy: allocating above it");
                    floor = highest.get();
                    allocations += 1;
                }
                _ => return Ok(report),
            }
        }
    }

    /// Writes `version` of `payload` to every copy of `key`, waiting for the copies' nodes until
    /// `until` at most; returns the report and the highest version a copy refused this one with
    /// (stale or conflict), if any.
    ///
    /// # Errors
    /// [`ErrorKind::StoreFull`] when the embedded store refused the whole batch (nothing
    /// changed, nothing is queued).
    #[allow(clippy::too_many_arguments)]
    async fn write_version(
        &self,
        key: &Key,
        family: &Family,
        version: Version,
        payload: &Payload,
        op: WriteOp,
        sync: Option<SyncReplicas>,
        until: Option<Instant>,
    ) -> Result<(PublishReport, Option<Version>)> {
        let now_ms = now_unix_ms();
        let ttl_ms = crate::duration::millis(family.ttl);
        let (jitter_min, jitter_max) = self.expiry_jitter;
        let tombstone = matches!(payload, Payload::Tombstone);
        let mut refused_at: Option<Version> = None;
        // Copies a live instance with more copies reads are written too, so they never miss an
        // edit while it serves them (ARCHITECTURE.md, "A resize across instances").
        let write_count = self.layouts.as_ref().map_or(family.copies, |layouts| {
            layouts.write_copies(family.name(), family.copies)
        });
        let writes: Vec<CopyWrite> = (0..write_count)
            .map(|index| CopyWrite {
                copy_key: key.copy_key(index),
                version,
                payload: payload.clone(),
                expire_at_ms: if tombstone {
                    now_ms.saturating_add(ttl_ms)
                } else {
                    jitter::expire_at_ms(now_ms, ttl_ms, jitter_min, jitter_max)
                },
            })
            .collect();
        // The copies an edit applied were at least this new on their primaries from the moment
        // the write began: the age bound of the near-cache entries they become.
        let started = std::time::Instant::now();
        let (results, acks) = match until {
            None => self.send(&writes, sync).await,
            Some(until) => self.send_until(&writes, sync, until).await,
        };
        // The embedded store refuses a batch that would pass its memory bound whole: nothing
        // changed, and a retry could not hold it either, so the publish fails as one.
        if let Some(full) = results.iter().find_map(|result| match &result.outcome {
            Err(err) if err.kind() == ErrorKind::StoreFull => Some(err.clone()),
            _ => None,
        }) {
            return Err(full);
        }
        let mut acks = acks.into_iter();
        if let Some(layouts) = &self.layouts {
            let max_copies = layouts.max_copies(family.name(), family.copies);
            if max_copies > write_count {
                let removed: Vec<_> = (write_count..max_copies)
                    .map(|index| key.copy_key(index))
                    .collect();
                let deleting = self.store.delete_copies(&removed);
                let deleted = match until {
                    None => deleting.await,
                    Some(until) => tokio::time::timeout_at(until, deleting)
                        .await
                        .unwrap_or_else(|_| Err(deadline::exceeded())),
                };
                if let Err(err) = deleted {
                    tracing::debug!(key = %key, error = %err, "could not delete copies removed by a shrink");
                }
            }
        }

        let mut report = PublishReport {
            key: key.to_string(),
            version,
            copies: write_count,
            applied: 0,
            current: 0,
            stale: 0,
            conflict: 0,
            failed: 0,
            queued: 0,
            dropped: 0,
            outcomes: Vec::with_capacity(writes.len()),
            lasts_until_ms: None,
        };
        let mut failed_copies: Vec<(usize, FailedCopy)> = Vec::new();
        for (write, result) in writes.iter().zip(results) {
            let replicas_acked = acks.next().flatten();
            if let Some(queue) = &self.retry_queue {
                match &result.outcome {
                    Ok(CasOutcome::Applied | CasOutcome::Current) => {
                        queue.clear_covered(&write.copy_key, version, tombstone)
                    }
                    Ok(CasOutcome::Stale { stored } | CasOutcome::Conflict { stored }) => {
                        queue.clear_covered(&write.copy_key, *stored, false)
                    }
                    Err(err) => failed_copies.push((
                        report.outcomes.len(),
                        FailedCopy {
                            copy_key: write.copy_key.clone(),
                            node: result.node.clone(),
                            expire_at_ms: write.expire_at_ms,
                            error: err.to_string(),
                        },
                    )),
                }
            }
            if let Ok(CasOutcome::Stale { stored } | CasOutcome::Conflict { stored }) =
                &result.outcome
            {
                refused_at = refused_at.max(Some(*stored));
            }
            // Only an applied copy holds the expiry written: a `current` one kept its own, which
            // the compare-and-set does not report, and an entry must not outlive its copy.
            if let (Some(near), Ok(CasOutcome::Applied)) = (&self.near, &result.outcome) {
                let served_by = if result.node == NodeLabel::embedded() {
                    ServedBy::embedded()
                } else {
                    ServedBy::primary(result.node.clone())
                };
                near.offer(
                    &write.copy_key,
                    CopyRecord {
                        version,
                        payload: write.payload.clone(),
                        expire_at_ms: write.expire_at_ms,
                    },
                    served_by,
                    RouteReason::Class,
                    started,
                    None,
                );
            }
            let counted = match &result.outcome {
                Ok(CasOutcome::Applied) => CopyWriteOutcome::Applied,
                Ok(CasOutcome::Current) => CopyWriteOutcome::Current,
                Ok(CasOutcome::Stale { .. }) => CopyWriteOutcome::Stale,
                Ok(CasOutcome::Conflict { .. }) => CopyWriteOutcome::Conflict,
                Err(_) => CopyWriteOutcome::Failed,
            };
            self.metrics.copy_outcome(op, counted);
            let (outcome, error) = match result.outcome {
                Ok(CasOutcome::Applied) => (CopyOutcome::Applied, None),
                Ok(CasOutcome::Current) => (CopyOutcome::Current, None),
                Ok(CasOutcome::Stale { .. }) => (CopyOutcome::Stale, None),
                Ok(CasOutcome::Conflict { .. }) => (CopyOutcome::Conflict, None),
                Err(err) => {
                    tracing::warn!(copy_key = %write.copy_key, node = %result.node, error = %err, "copy write failed");
                    let class = match err.kind() {
                        ErrorKind::Timeout => "timeout",
                        ErrorKind::NodeFailing => "node_failing",
                        ErrorKind::DeadlineExceeded => "deadline_exceeded",
                        _ => "unavailable",
                    };
                    (CopyOutcome::Failed, Some(class.to_owned()))
                }
            };
            match outcome {
                CopyOutcome::Applied => {
                    report.applied += 1;
                    report.lasts_until_ms = report.lasts_until_ms.max(Some(write.expire_at_ms));
                }
                CopyOutcome::Current => report.current += 1,
                CopyOutcome::Stale => report.stale += 1,
                CopyOutcome::Conflict => report.conflict += 1,
                CopyOutcome::Failed | CopyOutcome::Queued | CopyOutcome::Dropped => {
                    report.failed += 1
                }
            }
            report.outcomes.push(CopyReport {
                copy: write.copy_key.index(),
                copy_key: write.copy_key.to_string(),
                node: result.node.to_string(),
                outcome,
                error,
                replicas_acked,
            });
        }
        if let (Some(queue), false) = (&self.retry_queue, failed_copies.is_empty()) {
            let (positions, failed): (Vec<usize>, Vec<FailedCopy>) =
                failed_copies.into_iter().unzip();
            let expiries: Vec<u64> = failed.iter().map(|copy| copy.expire_at_ms).collect();
            let admissions = queue.enqueue(key, version, payload, failed).await;
            for ((position, admission), expire_at_ms) in
                positions.into_iter().zip(admissions).zip(expiries)
            {
                if let Some(line) = report.outcomes.get_mut(position) {
                    if admission == Admission::Queued {
                        line.outcome = CopyOutcome::Queued;
                        report.queued += 1;
                        report.lasts_until_ms = report.lasts_until_ms.max(Some(expire_at_ms));
                    } else {
                        line.outcome = CopyOutcome::Dropped;
                        report.dropped += 1;
                    }
                }
            }
        }
        Ok((report, refused_at))
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

    async fn choose_version(
        &self,
        key: &Key,
        family: &Family,
        version: VersionChoice,
        floor: u64,
    ) -> Result<Version> {
        match (family.versioning, version) {
            (Versioning::Caller, VersionChoice::Given(version)) => Ok(version),
            (Versioning::Caller, VersionChoice::Unspecified) => Err(Error::new(
                ErrorKind::InvalidVersion,
                format!(
                    "family {:?} takes versions from the caller: send ?version=V",
                    family.name()
                ),
            )),
            (Versioning::Allocated, VersionChoice::Unspecified) => {
                // The counter is meant to outlive every copy it versioned, so a later allocation
                // does not restart below a live copy; when it does not (another instance's
                // shorter TTL, a failover), the copies' refusals raise it (see `write`).
                let counter_ttl_ms = crate::duration::millis(family.ttl).saturating_mul(2);
                self.store
                    .allocate_version(key, counter_ttl_ms, floor)
                    .await
            }
            (Versioning::Allocated, VersionChoice::Given(_)) => Err(Error::new(
                ErrorKind::InvalidVersion,
                format!(
                    "family {:?} allocates versions: do not send ?version",
                    family.name()
                ),
            )),
        }
    }
}

/// The value as a payload that owns exactly its bytes. A request body arrives as a slice of
/// the connection's read buffer (8 KiB or more); kept as is, every stored copy and queued entry
/// would keep that whole buffer alive (measured: ~8 KB of RSS per stored key, whatever the
/// value's size). One copy here is shared by every copy write, the store and the retry queue.
fn owned_value(value: &[u8]) -> Payload {
    Payload::Value(Bytes::copy_from_slice(value))
}

/// How many versions one publish of an `allocated` family allocates at most: the first, and two
/// more after copies refused it (the counter was behind them, or another publish was allocated
/// meanwhile).
const MAX_ALLOCATIONS: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::memory::MemoryStore;

    fn publisher(config: &str) -> Publisher {
        let config = Config::from_toml(config).unwrap();
        config.validate().unwrap();
        Publisher::new(
            Arc::new(MemoryStore::new()),
            Arc::new(config.families()),
            Metrics::new(),
        )
    }

    fn v(n: u64) -> VersionChoice {
        VersionChoice::Given(Version::new(n).unwrap())
    }

    #[tokio::test]
    async fn publish_reports_every_copy() {
        let publisher = publisher("[[family]]\nprefix = \"p:\"\ncopies = 4");
        let key = Key::parse("p:1").unwrap();
        let report = publisher
            .publish(&key, v(3), Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(
            (report.copies, report.applied, report.status()),
            (4, 4, PublishStatus::Done)
        );
        let copies: Vec<u32> = report.outcomes.iter().map(|line| line.copy).collect();
        assert_eq!(copies, vec![0, 1, 2, 3]);

        let again = publisher
            .publish(&key, v(3), Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!((again.current, again.status()), (4, PublishStatus::Done));
        let older = publisher
            .publish(&key, v(2), Bytes::from_static(b"y"))
            .await
            .unwrap();
        assert_eq!((older.stale, older.status()), (4, PublishStatus::Stale));
    }

    /// Issue 10 finding 4: a stored value must not keep the buffer it was sliced from alive.
    #[tokio::test]
    async fn a_stored_value_does_not_share_the_request_buffer() {
        let store = Arc::new(MemoryStore::new());
        let config = Config::from_toml("[[family]]\nprefix = \"p:\"\ncopies = 2").unwrap();
        let publisher = Publisher::new(store.clone(), Arc::new(config.families()), Metrics::new());
        let buffer = Bytes::from(vec![7u8; 8192]);
        let value = buffer.slice(100..164);
        let key = Key::parse("p:1").unwrap();
        publisher.publish(&key, v(1), value.clone()).await.unwrap();
        let inside = buffer.as_ptr_range();
        for index in 0..2 {
            let record = store
                .read_copy(&key.copy_key(index))
                .await
                .record
                .unwrap()
                .unwrap();
            let Payload::Value(stored) = record.payload else {
                panic!("a value was published");
            };
            assert_eq!(stored, value);
            assert!(
                !inside.contains(&stored.as_ptr()),
                "copy {index} is a slice of the request buffer"
            );
        }
    }

    #[tokio::test]
    async fn versioning_rules_are_enforced() {
        let publisher =
            publisher("[[family]]\nprefix = \"a:\"\ncopies = 2\nversioning = \"allocated\"");
        let caller_key = Key::parse("c:1").unwrap();
        let err = publisher
            .publish(&caller_key, VersionChoice::Unspecified, Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidVersion);

        let allocated_key = Key::parse("a:1").unwrap();
        let err = publisher
            .publish(&allocated_key, v(1), Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidVersion);
        let first = publisher
            .publish(&allocated_key, VersionChoice::Unspecified, Bytes::new())
            .await
            .unwrap();
        let second = publisher
            .invalidate(&allocated_key, VersionChoice::Unspecified)
            .await
            .unwrap();
        assert_eq!((first.version.get(), second.version.get()), (1, 2));
        assert_eq!(second.applied, 2);
    }
}
