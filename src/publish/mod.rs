//! Publish and invalidate: fan one edit out to every copy of a key.
//!
//! An edit carries a [`Version`]. It is written to all N copies at once with the store's
//! compare-and-set ([`CopyStore::write_copies`] groups them per node), so a copy only moves forward
//! and a retry of the same version is idempotent. An invalidation writes a versioned tombstone
//! the same way, so a late write of an older version cannot resurrect the value.
//!
//! # The steps of a publish
//! 1. Resolve the key's family; choose the version (a `caller` family requires one, an
//!    `allocated` family refuses one and allocates from `K#v`, kept alive for twice the TTL).
//! 2. Fix each copy's absolute expiry once, in Unix milliseconds: `now + ttl` for a tombstone,
//!    `now + ttl × (1 + j)` for a value, `j` drawn in `heal.expiry_jitter_min..=max`.
//! 3. Write one `CopyWrite` per copy (grouped per node; with `sync_replicas`, write then `WAIT`
//!    per node on a dedicated connection); one failed write never fails the others.
//! 4. Clear retry entries a successful write covers; offer failed writes to the retry queue and
//!    wait until their spool record is synced; offer what applied to the near cache.
//! 5. Count each outcome and return the [`PublishReport`].
//!
//! # Layout
//! - this file: [`Publisher`], its entry points, version choice (a caller's, or an allocated
//!   one re-allocated above a refusal) and the replica-wait check;
//! - `fanout`: one version written to every copy, as named steps (the writes, sending within
//!   the deadline, shrink deletes, the retry queue's covered entries, near-cache offers, the
//!   counters, queueing the failed copies);
//! - `report`: [`PublishReport`], its lines and its [`PublishStatus`].

mod fanout;
mod report;

use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

pub use report::{CopyOutcome, CopyReport, PublishReport, PublishStatus};

use crate::deadline::{self, Deadline};
use crate::error::{Error, ErrorKind, Result};
use crate::family::{Families, Family, Versioning};
use crate::heal::RetryQueue;
use crate::key::{Key, Placement, Version};
use crate::layout::Layouts;
use crate::metrics::{Metrics, WriteOp};
use crate::near::NearCache;
use crate::store::{CopyStore, Payload, TopologyStore};
use fanout::VersionWrite;

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
    store: Arc<dyn CopyStore>,
    /// Which replicas each node has, for a synced publish; `None`: none known (every
    /// `sync_replicas` is refused, as on the embedded store).
    topology: Option<Arc<dyn TopologyStore>>,
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

/// What bounds a publish with a deadline ([`Publisher::publish_within`]).
#[derive(Debug, Clone, Copy)]
pub struct Within {
    /// Replicas to wait for after the writes (`WAIT`), as [`Publisher::publish_synced`].
    pub sync: Option<SyncReplicas>,
    /// When the publish must be answered.
    pub deadline: Deadline,
}

/// The optional bounds of one write: replicas to wait for, and a deadline.
#[derive(Debug, Clone, Copy, Default)]
struct WriteBounds {
    /// Replicas to wait for after the writes.
    sync: Option<SyncReplicas>,
    /// When the write must be answered.
    deadline: Option<Deadline>,
}

impl Publisher {
    /// A publisher writing through `store`.
    pub fn new(
        store: Arc<dyn CopyStore>,
        families: Arc<Families>,
        metrics: Arc<Metrics>,
    ) -> Publisher {
        Publisher {
            store,
            topology: None,
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

    /// Knows each node's replicas from `topology`, so a synced publish (`sync_replicas`) may ask
    /// for as many as a copy's node has. Default: none known.
    pub fn with_topology(mut self, topology: Arc<dyn TopologyStore>) -> Publisher {
        self.topology = Some(topology);
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
        self.write_value(key, version, value, WriteBounds::default())
            .await
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
        within: Within,
    ) -> Result<PublishReport> {
        let bounds = WriteBounds {
            sync: within.sync,
            deadline: Some(within.deadline),
        };
        self.write_value(key, version, value, bounds).await
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
        let bounds = WriteBounds {
            sync: Some(sync),
            deadline: None,
        };
        self.write_value(key, version, value, bounds).await
    }

    /// Writes a tombstone at `version` to every copy of `key`.
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub async fn invalidate(&self, key: &Key, version: VersionChoice) -> Result<PublishReport> {
        self.write(key, version, Payload::Tombstone, WriteBounds::default())
            .await
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
        let bounds = WriteBounds {
            sync: None,
            deadline: Some(deadline),
        };
        self.write(key, version, Payload::Tombstone, bounds).await
    }

    /// Publishes `value`: the body of the `publish*` methods.
    async fn write_value(
        &self,
        key: &Key,
        version: VersionChoice,
        value: Bytes,
        bounds: WriteBounds,
    ) -> Result<PublishReport> {
        self.write(key, version, owned_value(&value), bounds).await
    }

    /// Checks `sync` against the replicas known for every copy's node.
    fn check_sync(&self, key: &Key, family: &Family, sync: SyncReplicas) -> Result<()> {
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
        let topology = self
            .topology
            .as_ref()
            .map_or_else(Vec::new, |topology| topology.topology());
        // Every name a publish may write: `K#i`, and the tagged names of a `spread` family.
        let names = (0..family.copies).flat_map(|index| {
            [Placement::Suffix, family.placement]
                .map(|placement| (index, key.copy_key(index, placement)))
        });
        for (index, copy_key) in names {
            let node = self.store.node_of(&copy_key);
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

    /// Writes `payload` to every copy of `key`: a value is a publish, a tombstone an
    /// invalidation.
    async fn write(
        &self,
        key: &Key,
        choice: VersionChoice,
        payload: Payload,
        bounds: WriteBounds,
    ) -> Result<PublishReport> {
        let WriteBounds { sync, deadline } = bounds;
        let op = match payload {
            Payload::Tombstone => WriteOp::Invalidate,
            Payload::Value(_) => WriteOp::Publish,
        };
        let family = self.families.resolve(key);
        if let Some(sync) = sync {
            self.check_sync(key, family, sync)?;
        }
        // A family's own `sync_replicas` applies to its publishes that name none; it is not
        // checked against the replicas known (a node that lost its replica answers
        // `replicas_acked: 0`, which is what the caller must see).
        let sync = sync.or(match op {
            WriteOp::Publish if family.sync_replicas > 0 => Some(SyncReplicas {
                replicas: family.sync_replicas,
                timeout_ms: u64::try_from(family.sync_timeout.as_millis()).unwrap_or(u64::MAX),
            }),
            _ => None,
        });
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
            let edit = VersionWrite {
                key,
                family,
                version,
                payload: &payload,
                op,
                sync,
                until,
            };
            let (report, refused_at) = self.write_version(&edit).await?;
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

    async fn choose_version(
        &self,
        key: &Key,
        family: &Family,
        version: VersionChoice,
        floor: u64,
    ) -> Result<Version> {
        family
            .check_version(matches!(version, VersionChoice::Given(_)))
            .map_err(Error::refused)?;
        match version {
            VersionChoice::Given(version) => Ok(version),
            VersionChoice::Unspecified => {
                // The counter is meant to outlive every copy it versioned, so a later allocation
                // does not restart below a live copy; when it does not (another instance's
                // shorter TTL, a failover), the copies' refusals raise it (see `write`).
                let counter_ttl_ms = crate::duration::millis(family.ttl).saturating_mul(2);
                self.store
                    .allocate_version(key, counter_ttl_ms, floor)
                    .await
            }
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
    use crate::family::fixture;
    use crate::store::memory::MemoryStore;

    fn publisher(config: &str) -> Publisher {
        Publisher::new(
            Arc::new(MemoryStore::new()),
            Arc::new(fixture::families(config)),
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
        let families = fixture::families("[[family]]\nprefix = \"p:\"\ncopies = 2");
        let publisher = Publisher::new(store.clone(), Arc::new(families), Metrics::new());
        let buffer = Bytes::from(vec![7u8; 8192]);
        let value = buffer.slice(100..164);
        let key = Key::parse("p:1").unwrap();
        publisher.publish(&key, v(1), value.clone()).await.unwrap();
        let inside = buffer.as_ptr_range();
        for index in 0..2 {
            let record = store
                .read_copy(&key.copy_key(index, crate::key::Placement::Suffix))
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
