//! The copy store every part of the instance writes through ([`Noticing`]): after a write or
//! a delete it tells the tracking table which logical keys changed, so every path that changes
//! a copy here (a publish, an invalidation, a delete, a retry-queue heal, read repair, the
//! scrub, a split's fill and merge) invalidates
//! the client-side caches that may hold the key, without each path having to remember to.
//!
//! A change is told once the store answered, before the write's caller goes on: a publish's
//! reply is written after every tracking connection of this instance wrote the invalidation
//! to its socket (each writes it between its own replies; waited for at most
//! [`super::PUSH_WRITTEN_WITHIN`]), so a client that reads its cache on another connection
//! after the reply finds the invalidation there.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::Tracking;
use crate::error::Result;
use crate::key::{CopyKey, Key, Version};
use crate::store::{
    CasOutcome, CopyRead, CopyRecord, CopyStore, CopyWrite, NodeLabel, WriteResult,
};

/// A copy store that tells `tracking` of every copy it changed.
pub struct Noticing {
    /// The store written through.
    inner: Arc<dyn CopyStore>,
    /// The table told.
    tracking: Arc<Tracking>,
}

impl Noticing {
    /// `inner`, telling `tracking` of its changes.
    pub fn new(inner: Arc<dyn CopyStore>, tracking: Arc<Tracking>) -> Noticing {
        Noticing { inner, tracking }
    }

    /// Tells the table of the keys whose copies `writes` changed (`results`, in their order:
    /// the applied ones).
    async fn notice<'a>(
        &self,
        writes: &[CopyWrite],
        results: impl Iterator<Item = &'a WriteResult>,
    ) {
        let keys: BTreeSet<&str> = writes
            .iter()
            .zip(results)
            .filter(|(_, result)| matches!(result.outcome, Ok(CasOutcome::Applied)))
            .map(|(write, _)| write.copy_key.base())
            .collect();
        if !keys.is_empty() {
            self.tracking.changed(keys).written().await;
        }
    }
}

impl CopyStore for Noticing {
    fn node_of(&self, copy_key: &CopyKey) -> NodeLabel {
        self.inner.node_of(copy_key)
    }

    fn counter_node(&self, key: &Key) -> Option<NodeLabel> {
        self.inner.counter_node(key)
    }

    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>> {
        Box::pin(async move {
            let results = self.inner.write_copies(writes).await;
            self.notice(writes, results.iter()).await;
            results
        })
    }

    fn write_copies_synced<'a>(
        &'a self,
        writes: &'a [CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> BoxFuture<'a, Vec<(WriteResult, Option<u32>)>> {
        Box::pin(async move {
            let results = self
                .inner
                .write_copies_synced(writes, replicas, timeout_ms)
                .await;
            self.notice(writes, results.iter().map(|(result, _)| result))
                .await;
            results
        })
    }

    fn read_copy<'a>(&'a self, copy_key: &'a CopyKey) -> BoxFuture<'a, CopyRead> {
        self.inner.read_copy(copy_key)
    }

    fn read_replica_copy<'a>(
        &'a self,
        copy_key: &'a CopyKey,
        replica: &'a NodeLabel,
    ) -> BoxFuture<'a, CopyRead> {
        self.inner.read_replica_copy(copy_key, replica)
    }

    fn read_copy_stored<'a>(
        &'a self,
        copy_key: &'a CopyKey,
    ) -> BoxFuture<'a, Result<Option<CopyRecord>>> {
        self.inner.read_copy_stored(copy_key)
    }

    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let deleted = self.inner.delete_copies(copy_keys).await;
            // Told whatever the answer: a delete that failed on one node may have run on others.
            let keys: BTreeSet<&str> = copy_keys.iter().map(CopyKey::base).collect();
            if !keys.is_empty() {
                self.tracking.changed(keys).written().await;
            }
            deleted
        })
    }

    fn allocate_version<'a>(
        &'a self,
        key: &'a Key,
        ttl_ms: u64,
        floor: u64,
    ) -> BoxFuture<'a, Result<Version>> {
        self.inner.allocate_version(key, ttl_ms, floor)
    }
}
