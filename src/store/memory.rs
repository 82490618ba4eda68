//! The embedded in-memory store: the default for trying hotsplit and for unit tests.
//!
//! It applies the same versioned compare-and-set, absolute expiry and tombstones as the Redis
//! store, so the conformance suite runs unchanged against both. It is never a stand-in for Redis
//! in a test that claims Redis behaviour. A copy past its expiry reads as missing; its record is
//! kept for the version retention (so older writes stay `stale`), then dropped lazily on access
//! and by [`MemoryStore::purge_expired`], which the server calls periodically.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures_util::future::BoxFuture;

use super::{
    live_member, now_unix_ms, retain_until_ms, valid_live_instance, CasOutcome, CopyRead,
    CopyRecord, CopyWrite, InstanceRecord, Layout, LayoutSwap, NodeLabel, Payload, ServedBy, Store,
    WriteResult, DEFAULT_VERSION_RETENTION_MS,
};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Version};

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
    /// Family name → live member (`<copies>:<instance>`) → (copies, lapse time in Unix ms).
    live: HashMap<String, HashMap<String, (u32, u64)>>,
    /// Instance id → (its registry record, lapse time in Unix ms): the registry of the one
    /// process that holds this store.
    instances: HashMap<String, (InstanceRecord, u64)>,
    /// The session key, once one was asked for.
    session_key: Option<String>,
}

/// The embedded store. Cheap operations under one mutex; no await while it is held.
#[derive(Debug)]
pub struct MemoryStore {
    /// The copies and counters.
    state: Mutex<State>,
    /// How long a copy's record outlives its expiry, milliseconds (`store.version_retention`).
    version_retention_ms: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            state: Mutex::default(),
            version_retention_ms: DEFAULT_VERSION_RETENTION_MS,
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
    pub fn with_version_retention(mut self, retention_ms: u64) -> MemoryStore {
        self.version_retention_ms = retention_ms;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every write is a
        // single map insert. Keep serving rather than propagate the poison.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one compare-and-set, exactly as the Redis store's Lua routine does.
    fn cas(&self, write: &CopyWrite, now_ms: u64) -> CasOutcome {
        let mut state = self.state();
        let retain_until_ms = retain_until_ms(write.expire_at_ms, self.version_retention_ms);
        let mut kept_until_ms = 0;
        if let Some(current) = state.copies.get(write.copy_key.as_str()) {
            if current.retain_until_ms > now_ms {
                kept_until_ms = current.retain_until_ms;
                let stored = &current.record;
                if stored.version > write.version {
                    return CasOutcome::Stale {
                        stored: stored.version,
                    };
                }
                if stored.version == write.version {
                    // Equal versions: a value never replaces a tombstone of its own version,
                    // while a tombstone replaces a value of its own version, so both arrival
                    // orders end as the tombstone. The same edit again is current while the copy
                    // is served, and refills it once it is not; another body is a conflict.
                    match (&stored.payload, &write.payload) {
                        (Payload::Value(_), Payload::Tombstone) => {}
                        (Payload::Tombstone, Payload::Value(_)) => {
                            return CasOutcome::Stale {
                                stored: stored.version,
                            }
                        }
                        (Payload::Value(held), Payload::Value(body)) if held != body => {
                            return CasOutcome::Conflict {
                                stored: stored.version,
                            }
                        }
                        _ => {
                            if stored.expire_at_ms > now_ms
                                || write.expire_at_ms <= stored.expire_at_ms
                            {
                                return CasOutcome::Current;
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
            state.copies.remove(write.copy_key.as_str());
        } else {
            state.copies.insert(
                write.copy_key.as_str().to_owned(),
                Stored {
                    record: CopyRecord {
                        version: write.version,
                        payload: write.payload.clone(),
                        expire_at_ms: write.expire_at_ms,
                    },
                    retain_until_ms,
                },
            );
        }
        CasOutcome::Applied
    }

    /// Drops every copy record past its retention and every expired counter; returns how many
    /// entries were removed.
    pub fn purge_expired(&self) -> usize {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        let before = state.copies.len() + state.counters.len();
        state
            .copies
            .retain(|_, stored| stored.retain_until_ms > now_ms);
        state
            .counters
            .retain(|_, counter| counter.expire_at_ms > now_ms);
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
    pub fn overwrite_for_test(&self, copy_key: &CopyKey, record: Option<CopyRecord>) {
        let mut state = self.state();
        match record {
            Some(record) => {
                let retain_until_ms =
                    retain_until_ms(record.expire_at_ms, self.version_retention_ms);
                let stored = Stored {
                    record,
                    retain_until_ms,
                };
                state.copies.insert(copy_key.as_str().to_owned(), stored);
            }
            None => {
                state.copies.remove(copy_key.as_str());
            }
        }
    }

    fn read(&self, copy_key: &CopyKey) -> Option<CopyRecord> {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        // A copy past its expiry reads as missing; its record stays for the retention.
        match state.copies.get(copy_key.as_str()) {
            Some(stored) if stored.record.expire_at_ms > now_ms => Some(stored.record.clone()),
            Some(stored) if stored.retain_until_ms <= now_ms => {
                state.copies.remove(copy_key.as_str());
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

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn node_of(&self, _copy_key: &CopyKey) -> NodeLabel {
        NodeLabel::embedded()
    }

    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>> {
        let now_ms = now_unix_ms();
        let results = writes
            .iter()
            .map(|write| WriteResult {
                node: NodeLabel::embedded(),
                outcome: Ok(self.cas(write, now_ms)),
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
        let mut state = self.state();
        let counter = state.counters.entry(key.counter_key()).or_insert(Counter {
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
        Box::pin(std::future::ready(result))
    }

    fn read_layout<'a>(&'a self, family: &'a str) -> BoxFuture<'a, Result<Option<Layout>>> {
        let layout = self.state().layouts.get(family).copied();
        Box::pin(std::future::ready(Ok(layout)))
    }

    fn write_layout<'a>(
        &'a self,
        family: &'a str,
        expected: Option<Layout>,
        layout: Layout,
    ) -> BoxFuture<'a, Result<LayoutSwap>> {
        let mut state = self.state();
        let current = state.layouts.get(family).copied();
        let swap = if current == expected {
            state.layouts.insert(family.to_owned(), layout);
            LayoutSwap::Applied
        } else {
            LayoutSwap::Changed(current)
        };
        Box::pin(std::future::ready(Ok(swap)))
    }

    fn join_layout<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        if !valid_live_instance(instance) {
            return Box::pin(std::future::ready(Err(Error::new(
                ErrorKind::Config,
                format!("invalid live-set instance name {instance:?}"),
            ))));
        }
        // Like the Lua library: lapsed members go first, then this one is (re)added.
        let now_ms = now_unix_ms();
        let mut state = self.state();
        let live = state.live.entry(family.to_owned()).or_default();
        live.retain(|_, (_, lapse_ms)| *lapse_ms > now_ms);
        let own = live_member(copies, instance);
        live.insert(own.clone(), (copies, now_ms.saturating_add(ttl_ms)));
        let others = live
            .iter()
            .filter(|(name, _)| **name != own)
            .map(|(_, (copies, _))| *copies)
            .collect();
        Box::pin(std::future::ready(Ok(others)))
    }

    fn leave_layout<'a>(
        &'a self,
        family: &'a str,
        copies: u32,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        if let Some(live) = self.state().live.get_mut(family) {
            live.remove(&live_member(copies, instance));
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn register_instance<'a>(
        &'a self,
        record: &'a InstanceRecord,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<()>> {
        if !valid_live_instance(&record.id) {
            return Box::pin(std::future::ready(Err(Error::new(
                ErrorKind::Config,
                format!("invalid instance id {:?}", record.id),
            ))));
        }
        let lapse_ms = now_unix_ms().saturating_add(ttl_ms);
        self.state()
            .instances
            .insert(record.id.clone(), (record.clone(), lapse_ms));
        Box::pin(std::future::ready(Ok(())))
    }

    fn deregister_instance<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        self.state().instances.remove(id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn instances(&self) -> BoxFuture<'_, Result<Vec<InstanceRecord>>> {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        state
            .instances
            .retain(|_, (_, lapse_ms)| *lapse_ms > now_ms);
        let mut records: Vec<InstanceRecord> = state
            .instances
            .values()
            .map(|(record, _)| record.clone())
            .collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Box::pin(std::future::ready(Ok(records)))
    }

    fn session_key<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<String>> {
        let key = self
            .state()
            .session_key
            .get_or_insert_with(|| candidate.to_owned())
            .clone();
        Box::pin(std::future::ready(Ok(key)))
    }

    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>> {
        let mut state = self.state();
        let removed = copy_keys
            .iter()
            .filter(|copy_key| state.copies.remove(copy_key.as_str()).is_some())
            .count();
        Box::pin(std::future::ready(Ok(removed as u64)))
    }

    fn scan_keys<'a>(
        &'a self,
        pattern: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>>> {
        let keys = self
            .state()
            .copies
            .keys()
            .filter(|key| glob_matches(pattern.as_bytes(), key.as_bytes()))
            .take(limit)
            .cloned()
            .collect();
        Box::pin(std::future::ready(Ok(keys)))
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }
}
