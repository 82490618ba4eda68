//! The embedded in-memory store: the default for trying hotsplit and for unit tests.
//!
//! It applies the same versioned compare-and-set, absolute expiry and tombstones as the Redis
//! store, so the conformance suite runs unchanged against both. It is never a stand-in for Redis
//! in a test that claims Redis behaviour. A copy past its expiry reads as missing; its record is
//! kept for the version retention (so older writes stay `stale`), then dropped lazily on access
//! and by [`MemoryStore::purge_expired`], which the server calls periodically.
//!
//! # The memory bound
//! The store counts the bytes it holds: each copy's key and value plus
//! [`COPY_OVERHEAD_BYTES`], and each version counter's key plus [`COUNTER_OVERHEAD_BYTES`]
//! (layout records, live-set entries and instance records, a few per family or process, are
//! not counted). A batch of copy writes that would take the count past the bound
//! (`store.memory_max_bytes`) is refused whole with [`ErrorKind::StoreFull`] before any copy
//! changes; a batch that does not grow the count, or that writes only tombstones (an
//! invalidation), is always applied. A version counter is counted but never refused: it is one
//! per key, a few dozen bytes, and expires after twice its family's TTL. A record past its
//! retention is counted until it is dropped (on access, or by the next purge).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures_util::future::BoxFuture;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Unit;

mod records;

use super::{
    now_unix_ms, retain_until_ms, CasOutcome, CopyRead, CopyRecord, CopyStore, CopyWrite,
    InstanceRecord, Layout, LayoutWriter, NodeLabel, Payload, ServedBy, WriteResult,
    DEFAULT_VERSION_RETENTION_MS,
};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Version};
use crate::metrics::{register_with_unit, Metrics};

/// What one stored copy costs beyond its key's and value's bytes: its map slot (an 80-byte
/// key-and-record pair) at the hash table's average spare capacity, and the allocator's rounding
/// of the key's and the value's blocks. Measured on the release binary: 218 bytes of RSS per
/// copy at 200,000 copies with 18-byte copy keys and 64-byte values (the `memory::` integration
/// test), so 218 - 18 - 64 = 136.
pub const COPY_OVERHEAD_BYTES: u64 = 136;

/// What one version counter costs beyond its key's bytes: its map slot (a 40-byte key-and-counter
/// pair) at the table's average spare capacity and the rounding of the key's block.
pub(crate) const COUNTER_OVERHEAD_BYTES: u64 = 72;

/// The default bound of the bytes the embedded store holds: 1 GiB, about 4.9 million copies of
/// 64-byte values at the measured 218 bytes each. The embedded store is for trying hotsplit and
/// for tests; the bound keeps a runaway publisher from taking the host's memory.
pub(crate) const DEFAULT_MEMORY_MAX_BYTES: u64 = 1 << 30;

/// The bytes one copy is counted for.
fn copy_bytes(copy_key: &str, payload: &Payload) -> u64 {
    let value = match payload {
        Payload::Value(value) => value.len(),
        Payload::Tombstone => 0,
    };
    (copy_key.len() + value) as u64 + COPY_OVERHEAD_BYTES
}

/// The bytes one version counter is counted for.
fn counter_bytes(counter_key: &str) -> u64 {
    counter_key.len() as u64 + COUNTER_OVERHEAD_BYTES
}

/// A per-key version counter of an `allocated` family.
#[derive(Debug, Clone, Copy)]
struct Counter {
    /// The last version handed out.
    last: u64,
    /// Absolute expiry, Unix milliseconds.
    expire_at_ms: u64,
}

/// A stored copy: its record, and when the record itself is forgotten (the Redis key's expiry).
#[derive(Debug, Clone)]
struct Stored {
    /// What the copy holds; served while `record.expire_at_ms` is in the future.
    record: CopyRecord,
    /// When the record is dropped, Unix milliseconds: until then older writes are `stale`.
    retain_until_ms: u64,
}

/// Everything the store holds, behind one lock.
#[derive(Debug, Default)]
struct State {
    /// Copy key → stored copy.
    copies: HashMap<String, Stored>,
    /// Counter key → counter.
    counters: HashMap<String, Counter>,
    /// Family name → recorded layout.
    layouts: HashMap<String, Layout>,
    /// Family name → key → its split record's text.
    splits: HashMap<String, HashMap<String, String>>,
    /// Family name → who wrote its layout record.
    layout_writers: HashMap<String, LayoutWriter>,
    /// Family name → live member (`<copies>:<instance>`) → (copies, lapse time in Unix ms).
    live: HashMap<String, HashMap<String, (u32, u64)>>,
    /// Instance id → (its registry record, lapse time in Unix ms): the registry of the one
    /// process that holds this store.
    instances: HashMap<String, (InstanceRecord, u64)>,
    /// The session key, once one was asked for.
    session_key: Option<String>,
    /// The bytes counted for `copies` and `counters` (see the module's "memory bound").
    held_bytes: u64,
}

impl State {
    /// Stores `stored` as `copy_key`'s record, counting its bytes.
    fn put_copy(&mut self, copy_key: &str, stored: Stored) {
        self.held_bytes += copy_bytes(copy_key, &stored.record.payload);
        if let Some(slot) = self.copies.get_mut(copy_key) {
            let old = std::mem::replace(slot, stored);
            self.held_bytes -= copy_bytes(copy_key, &old.record.payload);
        } else {
            self.copies.insert(copy_key.to_owned(), stored);
        }
    }

    /// Forgets `copy_key`'s record; returns whether there was one.
    fn remove_copy(&mut self, copy_key: &str) -> bool {
        match self.copies.remove(copy_key) {
            Some(old) => {
                self.held_bytes -= copy_bytes(copy_key, &old.record.payload);
                true
            }
            None => false,
        }
    }

    /// How many bytes applying `step` to `copy_key` adds to the count (negative: frees).
    fn growth(&self, copy_key: &str, write: &CopyWrite, step: &Step) -> i128 {
        let held = self.copies.get(copy_key).map_or(0, |old| {
            i128::from(copy_bytes(copy_key, &old.record.payload))
        });
        match step {
            Step::Keep(_) => 0,
            Step::Remove => -held,
            Step::Store { .. } => i128::from(copy_bytes(copy_key, &write.payload)) - held,
        }
    }
}

/// What a compare-and-set does to one copy.
#[derive(Debug)]
enum Step {
    /// Nothing changes; the outcome is `current`, `stale` or `conflict`.
    Keep(CasOutcome),
    /// The write applies with a retention already past: the record is dropped (like Redis's
    /// `PEXPIREAT` in the past).
    Remove,
    /// The write applies and the record is kept until `retain_until_ms`.
    Store {
        /// When the record is dropped, Unix milliseconds.
        retain_until_ms: u64,
    },
}

/// The byte bound and its gauges.
#[derive(Debug)]
struct Bound {
    /// The most bytes the store holds (`store.memory_max_bytes`).
    max_bytes: u64,
    /// `hotsplit_store_memory_bytes`: the bytes held, set after every change. `None` until
    /// [`MemoryStore::with_metrics`].
    held_gauge: Option<Gauge>,
}

/// The embedded store. Cheap operations under one mutex; no await while it is held.
#[derive(Debug)]
pub struct MemoryStore {
    /// The copies and counters.
    state: Mutex<State>,
    /// How long a copy's record outlives its expiry, milliseconds (`store.version_retention`).
    version_retention_ms: u64,
    /// The byte bound of what the store holds.
    bound: Bound,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            state: Mutex::default(),
            version_retention_ms: DEFAULT_VERSION_RETENTION_MS,
            bound: Bound {
                max_bytes: DEFAULT_MEMORY_MAX_BYTES,
                held_gauge: None,
            },
        }
    }
}

impl MemoryStore {
    /// An empty store with the default version retention (one hour).
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Keeps each copy's record `retention_ms` past its expiry, so older writes stay `stale`
    /// after the value stopped being served. Default: one hour.
    pub(crate) fn with_version_retention(mut self, retention_ms: u64) -> MemoryStore {
        self.version_retention_ms = retention_ms;
        self
    }

    /// Bounds the bytes the store holds (`store.memory_max_bytes`): a publish that would go past
    /// `max_bytes` is refused whole. Default: [`DEFAULT_MEMORY_MAX_BYTES`] (1 GiB).
    pub fn with_memory_bound(mut self, max_bytes: u64) -> MemoryStore {
        self.bound.max_bytes = max_bytes;
        self
    }

    /// Exports the bytes held (`hotsplit_store_memory_bytes`) and the bound
    /// (`hotsplit_store_memory_max_bytes`) in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: &Metrics) -> MemoryStore {
        let (held, max) = metrics.register_with(|registry| {
            let held: Gauge = register_with_unit(
                registry,
                "store_memory",
                "Bytes the embedded store holds: keys, values and per-entry overhead",
                Unit::Bytes,
                Gauge::default(),
            );
            let max: Gauge = register_with_unit(
                registry,
                "store_memory_max",
                "The bound of the bytes the embedded store holds (store.memory_max_bytes)",
                Unit::Bytes,
                Gauge::default(),
            );
            (held, max)
        });
        max.set(i64::try_from(self.bound.max_bytes).unwrap_or(i64::MAX));
        held.set(i64::try_from(self.memory_bytes()).unwrap_or(i64::MAX));
        self.bound.held_gauge = Some(held);
        self
    }

    /// The bytes the store counts as held (see the module's "memory bound").
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.state().held_bytes
    }

    /// Sets the bytes-held gauge from `state`.
    fn publish_held(&self, state: &State) {
        if let Some(gauge) = &self.bound.held_gauge {
            gauge.set(i64::try_from(state.held_bytes).unwrap_or(i64::MAX));
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every write is a
        // single map insert. Keep serving rather than propagate the poison.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the compare-and-set of `write` does to a copy holding `current`, exactly as the
    /// Redis store's Lua routine decides.
    fn step(&self, current: Option<&Stored>, write: &CopyWrite, now_ms: u64) -> Step {
        let retain_until_ms = retain_until_ms(write.expire_at_ms, self.version_retention_ms);
        let mut kept_until_ms = 0;
        if let Some(current) = current {
            if current.retain_until_ms > now_ms {
                kept_until_ms = current.retain_until_ms;
                let stored = &current.record;
                if stored.version > write.version {
                    return Step::Keep(CasOutcome::Stale {
                        stored: stored.version,
                    });
                }
                if stored.version == write.version {
                    // Equal versions: a value never replaces a tombstone of its own version,
                    // while a tombstone replaces a value of its own version, so both arrival
                    // orders end as the tombstone. The same edit again is current while the copy
                    // is served, and refills it once it is not; another body is a conflict.
                    match (&stored.payload, &write.payload) {
                        (Payload::Value(_), Payload::Tombstone) => {}
                        (Payload::Tombstone, Payload::Value(_)) => {
                            return Step::Keep(CasOutcome::Stale {
                                stored: stored.version,
                            })
                        }
                        (Payload::Value(held), Payload::Value(body)) if held != body => {
                            return Step::Keep(CasOutcome::Conflict {
                                stored: stored.version,
                            })
                        }
                        _ => {
                            if stored.expire_at_ms > now_ms
                                || write.expire_at_ms <= stored.expire_at_ms
                            {
                                return Step::Keep(CasOutcome::Current);
                            }
                        }
                    }
                }
            }
        }
        // Like PEXPIREAT GT on an existing Redis key: a write never makes the record go sooner.
        let retain_until_ms = retain_until_ms.max(kept_until_ms);
        if retain_until_ms <= now_ms {
            // Redis deletes a key whose PEXPIREAT lies in the past; so do we.
            Step::Remove
        } else {
            Step::Store { retain_until_ms }
        }
    }

    /// Applies one compare-and-set to `state`.
    fn cas(&self, state: &mut State, write: &CopyWrite, now_ms: u64) -> CasOutcome {
        let copy_key = write.copy_key.as_str();
        match self.step(state.copies.get(copy_key), write, now_ms) {
            Step::Keep(outcome) => outcome,
            Step::Remove => {
                state.remove_copy(copy_key);
                CasOutcome::Applied
            }
            Step::Store { retain_until_ms } => {
                let record = CopyRecord {
                    version: write.version,
                    payload: write.payload.clone(),
                    expire_at_ms: write.expire_at_ms,
                };
                let stored = Stored {
                    record,
                    retain_until_ms,
                };
                state.put_copy(copy_key, stored);
                CasOutcome::Applied
            }
        }
    }

    /// Applies a batch of compare-and-sets under one lock, or none: a batch that writes a value
    /// and would take the bytes held past the bound is refused whole ([`ErrorKind::StoreFull`]).
    /// A batch that names a copy twice is checked against the copies as they were before it
    /// (the publisher names each copy once).
    fn write_batch(&self, writes: &[CopyWrite], now_ms: u64) -> Vec<Result<CasOutcome>> {
        let mut state = self.state();
        let writes_a_value = writes
            .iter()
            .any(|write| matches!(write.payload, Payload::Value(_)));
        if writes_a_value {
            let growth: i128 = writes
                .iter()
                .map(|write| {
                    let copy_key = write.copy_key.as_str();
                    let step = self.step(state.copies.get(copy_key), write, now_ms);
                    state.growth(copy_key, write, &step)
                })
                .sum();
            let held = i128::from(state.held_bytes);
            if growth > 0 && held + growth > i128::from(self.bound.max_bytes) {
                tracing::debug!(
                    held,
                    growth,
                    max = self.bound.max_bytes,
                    "publish refused: the embedded store is full"
                );
                let full = Error::new(
                    ErrorKind::StoreFull,
                    format!(
                        "the embedded store holds {held} bytes of its {}-byte bound (store.memory_max_bytes), and this publish needs {growth} more",
                        self.bound.max_bytes
                    ),
                );
                return writes.iter().map(|_| Err(full.clone())).collect();
            }
        }
        let outcomes = writes
            .iter()
            .map(|write| Ok(self.cas(&mut state, write, now_ms)))
            .collect();
        self.publish_held(&state);
        outcomes
    }

    /// Drops every copy record past its retention and every expired counter; returns how many
    /// entries were removed.
    pub(crate) fn purge_expired(&self) -> usize {
        let now_ms = now_unix_ms();
        let mut guard = self.state();
        let state = &mut *guard;
        let before = state.copies.len() + state.counters.len();
        let mut freed = 0;
        state.copies.retain(|copy_key, stored| {
            let keep = stored.retain_until_ms > now_ms;
            if !keep {
                freed += copy_bytes(copy_key, &stored.record.payload);
            }
            keep
        });
        state.counters.retain(|counter_key, counter| {
            let keep = counter.expire_at_ms > now_ms;
            if !keep {
                freed += counter_bytes(counter_key);
            }
            keep
        });
        state.held_bytes -= freed;
        self.publish_held(state);
        before - state.copies.len() - state.counters.len()
    }

    /// The number of copy records held, served or not.
    pub fn len(&self) -> usize {
        self.state().copies.len()
    }

    /// Whether the store holds no copies.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces a copy's record without any compare-and-set, for tests that need to make a copy
    /// stale on purpose (the Redis equivalent is writing the hash directly).
    #[cfg(test)]
    pub(crate) fn overwrite_for_test(&self, copy_key: &CopyKey, record: Option<CopyRecord>) {
        let mut state = self.state();
        match record {
            Some(record) => {
                let retain_until_ms =
                    retain_until_ms(record.expire_at_ms, self.version_retention_ms);
                let stored = Stored {
                    record,
                    retain_until_ms,
                };
                state.put_copy(copy_key.as_str(), stored);
            }
            None => {
                state.remove_copy(copy_key.as_str());
            }
        }
        self.publish_held(&state);
    }

    fn read(&self, copy_key: &CopyKey) -> Option<CopyRecord> {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        // A copy past its expiry reads as missing; its record stays for the retention.
        match state.copies.get(copy_key.as_str()) {
            Some(stored) if stored.record.expire_at_ms > now_ms => Some(stored.record.clone()),
            Some(stored) if stored.retain_until_ms <= now_ms => {
                state.remove_copy(copy_key.as_str());
                self.publish_held(&state);
                None
            }
            _ => None,
        }
    }
}

/// Redis-style glob matching of `*`, `?` and backslash escapes (no `[...]` classes).
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|at| glob_matches(rest, &text[at..])),
        Some((b'?', rest)) => !text.is_empty() && glob_matches(rest, &text[1..]),
        Some((b'\\', rest)) if !rest.is_empty() => {
            text.first() == rest.first() && glob_matches(&rest[1..], &text[1..])
        }
        Some((byte, rest)) => text.first() == Some(byte) && glob_matches(rest, &text[1..]),
    }
}

impl CopyStore for MemoryStore {
    fn node_of(&self, _copy_key: &CopyKey) -> NodeLabel {
        NodeLabel::embedded()
    }

    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>> {
        let results = self
            .write_batch(writes, now_unix_ms())
            .into_iter()
            .map(|outcome| WriteResult {
                node: NodeLabel::embedded(),
                outcome,
            })
            .collect();
        Box::pin(std::future::ready(results))
    }

    fn read_copy<'a>(&'a self, copy_key: &'a CopyKey) -> BoxFuture<'a, CopyRead> {
        let read = CopyRead {
            served_by: ServedBy::embedded(),
            record: Ok(self.read(copy_key)),
        };
        Box::pin(std::future::ready(read))
    }

    fn allocate_version<'a>(
        &'a self,
        key: &'a Key,
        ttl_ms: u64,
        floor: u64,
    ) -> BoxFuture<'a, Result<Version>> {
        let now_ms = now_unix_ms();
        let mut guard = self.state();
        let state = &mut *guard;
        let counter_key = key.counter_key();
        if !state.counters.contains_key(&counter_key) {
            state.held_bytes += counter_bytes(&counter_key);
        }
        let counter = state.counters.entry(counter_key).or_insert(Counter {
            last: 0,
            expire_at_ms: 0,
        });
        if counter.expire_at_ms <= now_ms {
            counter.last = 0;
        }
        // The same bound as Redis's INCR (signed 64-bit), so both stores exhaust alike.
        let result = match counter.last.max(floor).checked_add(1) {
            Some(next) if i64::try_from(next).is_ok() => {
                counter.last = next;
                // Like the Lua library: the counter's time to live only grows.
                counter.expire_at_ms = counter.expire_at_ms.max(now_ms.saturating_add(ttl_ms));
                Version::new(next)
            }
            _ => Err(Error::new(
                ErrorKind::InvalidVersion,
                format!("the version counter of {key} is exhausted"),
            )),
        };
        self.publish_held(state);
        Box::pin(std::future::ready(result))
    }

    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>> {
        let mut state = self.state();
        let removed = copy_keys
            .iter()
            .filter(|copy_key| state.remove_copy(copy_key.as_str()))
            .count();
        self.publish_held(&state);
        Box::pin(std::future::ready(Ok(removed as u64)))
    }

    fn counter_node(&self, _key: &Key) -> Option<NodeLabel> {
        // One process, no nodes: the counters live beside the copies.
        None
    }

    fn write_copies_synced<'a>(
        &'a self,
        writes: &'a [CopyWrite],
        _replicas: u32,
        _timeout_ms: u64,
    ) -> BoxFuture<'a, Vec<(WriteResult, Option<u32>)>> {
        // No replica acknowledges anything here (the publisher refuses `sync_replicas` before
        // it gets this far, as no node has replicas known).
        Box::pin(async move {
            self.write_copies(writes)
                .await
                .into_iter()
                .map(|result| (result, None))
                .collect()
        })
    }

    fn read_replica_copy<'a>(
        &'a self,
        copy_key: &'a CopyKey,
        _replica: &'a NodeLabel,
    ) -> BoxFuture<'a, CopyRead> {
        // The embedded store has no replicas (its topology is empty, so no read is routed to
        // one); a read that names one is the one copy there is.
        self.read_copy(copy_key)
    }

    fn read_copy_stored<'a>(
        &'a self,
        copy_key: &'a CopyKey,
    ) -> BoxFuture<'a, Result<Option<CopyRecord>>> {
        // A record past its expiry is dropped or read as missing here: the embedded store never
        // fails a copy write, so its copies never fall behind one another and there is nothing
        // for a scrub to tell apart.
        Box::pin(async move { self.read_copy(copy_key).await.record })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `"k#3"` as a copy key.
    fn copy_key(text: &str) -> CopyKey {
        let (key, index) = text.split_once('#').unwrap();
        Key::parse(key)
            .unwrap()
            .copy_key(index.parse().unwrap(), crate::key::Placement::Suffix)
    }

    /// A value write of `body` at `version` to `copy_key`, served for a minute.
    fn value(copy_key: &str, version: u64, body: &'static [u8]) -> CopyWrite {
        CopyWrite {
            copy_key: self::copy_key(copy_key),
            version: Version::new(version).unwrap(),
            payload: Payload::Value(bytes::Bytes::from_static(body)),
            expire_at_ms: now_unix_ms() + 60_000,
        }
    }

    /// A tombstone write at `version` to `copy_key`.
    fn tombstone(copy_key: &str, version: u64) -> CopyWrite {
        CopyWrite {
            payload: Payload::Tombstone,
            ..value(copy_key, version, b"")
        }
    }

    async fn write(store: &MemoryStore, writes: &[CopyWrite]) -> Vec<Result<CasOutcome>> {
        store
            .write_copies(writes)
            .await
            .into_iter()
            .map(|result| result.outcome)
            .collect()
    }

    async fn version_of(store: &MemoryStore, copy_key: &str) -> Option<u64> {
        let copy_key = self::copy_key(copy_key);
        let read = store.read_copy(&copy_key).await;
        read.record.unwrap().map(|record| record.version.get())
    }

    #[test]
    fn the_overheads_cover_a_map_slot() {
        let copy_slot = std::mem::size_of::<(String, Stored)>() as u64;
        let counter_slot = std::mem::size_of::<(String, Counter)>() as u64;
        assert!(copy_slot <= COPY_OVERHEAD_BYTES, "{copy_slot}");
        assert!(counter_slot <= COUNTER_OVERHEAD_BYTES, "{counter_slot}");
    }

    #[tokio::test]
    async fn the_bytes_held_follow_every_change() {
        let store = MemoryStore::new();
        assert_eq!(store.memory_bytes(), 0);
        write(&store, &[value("k#0", 1, b"0123456789")]).await;
        assert_eq!(store.memory_bytes(), 3 + 10 + COPY_OVERHEAD_BYTES);
        // A newer, shorter value replaces it; a stale write changes nothing.
        write(&store, &[value("k#0", 2, b"01234")]).await;
        write(&store, &[value("k#0", 1, b"0123456789")]).await;
        assert_eq!(store.memory_bytes(), 3 + 5 + COPY_OVERHEAD_BYTES);
        write(&store, &[tombstone("k#0", 3)]).await;
        assert_eq!(store.memory_bytes(), 3 + COPY_OVERHEAD_BYTES);
        let key = Key::parse("k").unwrap();
        store.allocate_version(&key, 60_000, 0).await.unwrap();
        store.allocate_version(&key, 60_000, 0).await.unwrap();
        assert_eq!(
            store.memory_bytes(),
            3 + COPY_OVERHEAD_BYTES + 3 + COUNTER_OVERHEAD_BYTES
        );
        store.delete_copies(&[copy_key("k#0")]).await.unwrap();
        assert_eq!(store.memory_bytes(), 3 + COUNTER_OVERHEAD_BYTES);

        // A record past its retention is dropped by the purge, and uncounted.
        let store = MemoryStore::new().with_version_retention(0);
        let mut gone = value("g#0", 1, b"x");
        gone.expire_at_ms = now_unix_ms() + 1;
        write(&store, &[gone]).await;
        assert_eq!(store.memory_bytes(), 4 + COPY_OVERHEAD_BYTES);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(store.purge_expired(), 1);
        assert_eq!(store.memory_bytes(), 0);
    }

    #[tokio::test]
    async fn a_publish_past_the_bound_is_refused_whole_and_changes_nothing() {
        let one = 3 + 10 + COPY_OVERHEAD_BYTES;
        let store = MemoryStore::new().with_memory_bound(2 * one);
        let metrics = Metrics::new();
        let store = store.with_metrics(&metrics);
        let first = [value("a#0", 1, b"0123456789")];
        assert_eq!(write(&store, &first).await, vec![Ok(CasOutcome::Applied)]);

        // Two more copies would pass the bound: neither is written, and the held copy stays.
        let batch = [
            value("a#0", 2, b"0123456789"),
            value("a#1", 2, b"0123456789"),
        ];
        let refused = write(
            &store,
            &[
                batch[0].clone(),
                batch[1].clone(),
                value("a#2", 2, b"0123456789"),
            ],
        )
        .await;
        for outcome in &refused {
            let err = outcome.as_ref().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::StoreFull, "{err}");
        }
        assert_eq!(version_of(&store, "a#0").await, Some(1));
        assert_eq!(version_of(&store, "a#1").await, None);
        assert_eq!(store.memory_bytes(), one);

        // Exactly up to the bound fits.
        assert_eq!(
            write(&store, &batch).await,
            vec![Ok(CasOutcome::Applied), Ok(CasOutcome::Applied)]
        );
        assert_eq!(store.memory_bytes(), 2 * one);
        let text = metrics.render();
        let held = format!("hotsplit_store_memory_bytes {}", 2 * one);
        let max = format!("hotsplit_store_memory_max_bytes {}", 2 * one);
        assert!(text.lines().any(|line| line == held), "{text}");
        assert!(text.lines().any(|line| line == max), "{text}");
    }

    #[tokio::test]
    async fn a_full_store_still_takes_invalidations_and_writes_that_do_not_grow_it() {
        let one = 3 + 10 + COPY_OVERHEAD_BYTES;
        let store = MemoryStore::new().with_memory_bound(one);
        write(&store, &[value("f#0", 1, b"0123456789")]).await;
        let grow = write(&store, &[value("f#1", 1, b"x")]).await;
        assert_eq!(grow[0].as_ref().unwrap_err().kind(), ErrorKind::StoreFull);

        // A newer value of the same size, and a stale one, do not grow the store.
        let same = write(&store, &[value("f#0", 2, b"9876543210")]).await;
        assert_eq!(same, vec![Ok(CasOutcome::Applied)]);
        let stale = write(&store, &[value("f#0", 1, b"0123456789")]).await;
        assert_eq!(
            stale,
            vec![Ok(CasOutcome::Stale {
                stored: Version::new(2).unwrap()
            })]
        );

        // An invalidation is taken even where it creates records past the bound.
        let invalidated = write(&store, &[tombstone("f#0", 3), tombstone("f#1", 3)]).await;
        assert_eq!(
            invalidated,
            vec![Ok(CasOutcome::Applied), Ok(CasOutcome::Applied)]
        );
        assert!(store.memory_bytes() > one, "{}", store.memory_bytes());
        assert_eq!(version_of(&store, "f#1").await, Some(3));
    }
}
