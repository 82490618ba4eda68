//! The queue's table: one pending entry per copy (the highest version), grouped per node, with
//! each edit's value counted once against `heal.max_bytes`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;

use super::schedule::jitter;
use super::Core;
use crate::key::{CopyKey, Version};
use crate::store::{CopyWrite, NodeLabel, Payload};

/// What one queued entry costs beyond its value and its key text, counted against
/// `heal.max_bytes`: the entry and its slots in the copy, node and value maps. Measured by
/// `cargo bench --bench heal` (192 bytes of fixed overhead plus the copy key held four times).
pub const ENTRY_OVERHEAD_BYTES: usize = 192;

/// The bytes counted for one entry of `copy_key`, beyond its (shared) value.
pub(super) fn entry_cost(copy_key: &CopyKey) -> usize {
    ENTRY_OVERHEAD_BYTES + 4 * copy_key.as_str().len()
}

/// One pending copy write.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// The copy to heal.
    pub(super) copy_key: CopyKey,
    /// The version to write.
    pub(super) version: Version,
    /// The value (shared by every copy of one edit) or a tombstone.
    pub(super) payload: Payload,
    /// The absolute expiry fixed at publish time.
    pub(super) expire_at_ms: u64,
    /// The node the copy belonged to when the write failed.
    pub(super) node: NodeLabel,
    /// Retries so far.
    pub(super) attempts: u32,
    /// The last error, for the visibility endpoint.
    pub(super) last_error: Option<String>,
    /// When the entry (or the first entry it replaced) was queued, Unix milliseconds.
    pub(super) queued_at_ms: u64,
}

impl Entry {
    pub(super) fn is_tombstone(&self) -> bool {
        matches!(self.payload, Payload::Tombstone)
    }

    pub(super) fn value_len(&self) -> usize {
        match &self.payload {
            Payload::Value(bytes) => bytes.len(),
            Payload::Tombstone => 0,
        }
    }

    pub(super) fn write(&self) -> CopyWrite {
        CopyWrite {
            copy_key: self.copy_key.clone(),
            version: self.version,
            payload: self.payload.clone(),
            expire_at_ms: self.expire_at_ms,
        }
    }
}

/// Whether a write of (`version`, `tombstone`) makes a pending (`held`, `held_tombstone`) one
/// useless: it is newer, or the same version and at least as strong (a tombstone beats a value).
pub(super) fn covers(
    version: Version,
    tombstone: bool,
    held: Version,
    held_tombstone: bool,
) -> bool {
    version > held || (version == held && (tombstone || !held_tombstone))
}

/// A node with pending entries.
#[derive(Debug)]
pub(super) struct NodeQueue {
    /// The copy keys pending on this node.
    pub(super) keys: HashSet<String>,
    /// Failed probes in a row, for the exponential backoff.
    pub(super) failures: u32,
    /// When the next probe may start.
    pub(super) next_probe: Instant,
    /// Whether a probe or flush is running.
    pub(super) busy: bool,
    /// When the backlog started, for the drain log line.
    pub(super) since: Instant,
}

/// Everything under the queue's lock.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Copy key → its one pending entry (the highest version).
    pub(super) entries: HashMap<String, Entry>,
    /// Node → its pending copy keys and backoff.
    pub(super) nodes: HashMap<NodeLabel, NodeQueue>,
    /// (key, version, tombstone) → (value length, entries sharing it): values count once.
    pub(super) values: HashMap<(String, u64, bool), (usize, usize)>,
    /// Bytes counted against `heal.max_bytes`.
    pub(super) bytes: usize,
    /// Spool records sent but not yet synced: record id → payload. Their entries join the maps
    /// only once the record is durable, and a compaction carries them over.
    pub(super) unsynced: HashMap<u64, Bytes>,
    /// The next record id.
    pub(super) next_record: u64,
    /// Entries of unsynced records, counted against `heal.max_entries`.
    pub(super) reserved_entries: usize,
    /// Bytes of unsynced records, counted against `heal.max_bytes`.
    pub(super) reserved_bytes: usize,
}

impl Core {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation keeps the maps consistent between statements that cannot panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `entry` in the maps, replacing (as superseded) a weaker entry of the same copy.
    pub(super) fn admit(&self, state: &mut State, entry: Entry, log: bool) {
        let mut queued_at_ms = entry.queued_at_ms;
        if let Some(held) = state.entries.get(entry.copy_key.as_str()) {
            if covers(
                held.version,
                held.is_tombstone(),
                entry.version,
                entry.is_tombstone(),
            ) {
                return;
            }
            queued_at_ms = held.queued_at_ms;
            self.metrics.retry_superseded();
            if let Some(held) = Self::detach(state, entry.copy_key.as_str()) {
                if held.node != entry.node {
                    Self::leave_node(state, &held.node, held.copy_key.as_str());
                }
            }
        }
        let value_key = (
            entry.copy_key.base().to_owned(),
            entry.version.get(),
            entry.is_tombstone(),
        );
        let shared = state
            .values
            .entry(value_key)
            .or_insert((entry.value_len(), 0));
        if shared.1 == 0 {
            state.bytes += shared.0;
        }
        shared.1 += 1;
        state.bytes += entry_cost(&entry.copy_key);
        let now = Instant::now();
        let initial = self.config.backoff_initial;
        let node = state.nodes.entry(entry.node.clone()).or_insert_with(|| {
            if log {
                tracing::info!(node = %entry.node, "retry backlog started on a node");
            }
            NodeQueue {
                keys: HashSet::new(),
                failures: 0,
                next_probe: now + jitter(initial),
                busy: false,
                since: now,
            }
        });
        node.keys.insert(entry.copy_key.as_str().to_owned());
        state.entries.insert(
            entry.copy_key.as_str().to_owned(),
            Entry {
                queued_at_ms,
                ..entry
            },
        );
    }

    /// Removes the entry of `copy_key` when `predicate` holds; returns whether it did.
    pub(super) fn remove_if(
        &self,
        state: &mut State,
        copy_key: &str,
        predicate: impl Fn(&Entry) -> bool,
    ) -> bool {
        match state.entries.get(copy_key) {
            Some(entry) if predicate(entry) => {}
            _ => return false,
        }
        match Self::detach(state, copy_key) {
            Some(entry) => {
                Self::leave_node(state, &entry.node, copy_key);
                true
            }
            None => false,
        }
    }

    /// Takes the entry of `copy_key` out of the entry map and the byte count (not its node).
    fn detach(state: &mut State, copy_key: &str) -> Option<Entry> {
        let entry = state.entries.remove(copy_key)?;
        state.bytes = state.bytes.saturating_sub(entry_cost(&entry.copy_key));
        let value_key = (
            entry.copy_key.base().to_owned(),
            entry.version.get(),
            entry.is_tombstone(),
        );
        if let Some(shared) = state.values.get_mut(&value_key) {
            shared.1 = shared.1.saturating_sub(1);
            if shared.1 == 0 {
                state.bytes = state.bytes.saturating_sub(shared.0);
                state.values.remove(&value_key);
            }
        }
        Some(entry)
    }

    /// Takes `copy_key` off `node`; an idle node left empty is forgotten (logged as drained).
    fn leave_node(state: &mut State, node: &NodeLabel, copy_key: &str) {
        if let Some(queue) = state.nodes.get_mut(node) {
            queue.keys.remove(copy_key);
            if queue.keys.is_empty() && !queue.busy {
                let since = queue.since;
                state.nodes.remove(node);
                tracing::info!(node = %node, after_ms = since.elapsed().as_millis() as u64, "retry backlog drained on a node");
            }
        }
    }

    pub(super) fn publish_gauges(&self, state: &State) {
        self.pending.store(state.entries.len(), Ordering::Release);
        self.metrics.retry_queue(
            state.entries.len(),
            state.bytes,
            self.spool_size
                .as_ref()
                .map_or(0, |size| size.load(Ordering::Relaxed)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::Admission;
    use super::*;

    #[test]
    fn coalesces_per_copy_and_counts_values_once() {
        let queue = queue();
        for v in 1..=1000 {
            let admissions = offer(
                &queue,
                v,
                &value(1000),
                vec![failed(0, "a"), failed(1, "a"), failed(2, "b")],
            );
            assert!(admissions.iter().all(|a| *a == Admission::Queued));
        }
        let view = queue.view(10);
        assert_eq!(view.depth, 3);
        assert!(view.entries.iter().all(|entry| entry.version.get() == 1000));
        assert_eq!(
            view.bytes,
            1000 + 3 * (ENTRY_OVERHEAD_BYTES + 4 * "hot#0".len())
        );
        // An older edit arriving late is superseded by the pending newer one.
        offer(&queue, 5, &value(10), vec![failed(0, "a")]);
        assert_eq!(queue.view(10).entries[0].version.get(), 1000);
        // A direct write of a newer version clears the pending entry; an older one does not.
        queue.clear_covered(
            &key().copy_key(0, crate::key::Placement::Suffix),
            Version::new(999).unwrap(),
            false,
        );
        assert_eq!(queue.depth(), 3);
        queue.clear_covered(
            &key().copy_key(0, crate::key::Placement::Suffix),
            Version::new(1001).unwrap(),
            false,
        );
        assert_eq!(queue.depth(), 2);
        // A tombstone of the same version replaces a value; a value does not replace it.
        offer(&queue, 1000, &Payload::Tombstone, vec![failed(1, "a")]);
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        assert_eq!(batch.writes.len(), 1);
        assert_eq!(batch.writes[0].payload, Payload::Tombstone);
    }

    #[test]
    fn a_tombstone_and_a_value_of_one_version_count_apart() {
        let cost = ENTRY_OVERHEAD_BYTES + 4 * "hot#0".len();
        // The tombstone first: the value of the same version must still count its bytes.
        let queue = queue();
        offer(&queue, 3, &Payload::Tombstone, vec![failed(0, "a")]);
        assert_eq!(queue.view(0).bytes, cost);
        offer(&queue, 3, &value(500), vec![failed(1, "a")]);
        assert_eq!(queue.view(0).bytes, 2 * cost + 500);
        // The tombstone leaves: the value's bytes stay counted while the value is held.
        queue.completed(&CopyWrite {
            copy_key: key().copy_key(0, crate::key::Placement::Suffix),
            version: Version::new(3).unwrap(),
            payload: Payload::Tombstone,
            expire_at_ms: 0,
        });
        assert_eq!(queue.view(0).bytes, cost + 500);
        queue.clear_covered(
            &key().copy_key(1, crate::key::Placement::Suffix),
            Version::new(3).unwrap(),
            false,
        );
        assert_eq!(queue.view(0).bytes, 0);
    }
}
