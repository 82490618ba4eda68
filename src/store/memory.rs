//! The embedded in-memory store: the default for trying hotsplit and for unit tests.
//!
//! It applies the same versioned compare-and-set, absolute expiry and tombstones as the Redis
//! store, so the conformance suite runs unchanged against both. It is never a stand-in for Redis
//! in a test that claims Redis behaviour. Expired copies are dropped lazily on access and by
//! [`MemoryStore::purge_expired`], which the server calls periodically.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures_util::future::BoxFuture;

use super::{
    now_unix_ms, CasOutcome, CopyRead, CopyRecord, CopyWrite, Layout, NodeLabel, Payload, ServedBy,
    Store, WriteResult,
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

/// Everything the store holds, behind one lock.
#[derive(Debug, Default)]
struct State {
    /// Copy key → record.
    copies: HashMap<String, CopyRecord>,
    /// Counter key → counter.
    counters: HashMap<String, Counter>,
    /// Family name → recorded layout.
    layouts: HashMap<String, Layout>,
}

/// The embedded store. Cheap operations under one mutex; no await while it is held.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// The copies and counters.
    state: Mutex<State>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every write is a
        // single map insert. Keep serving rather than propagate the poison.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one compare-and-set, exactly as the Redis store's Lua routine does.
    fn cas(&self, write: &CopyWrite, now_ms: u64) -> CasOutcome {
        let mut state = self.state();
        if let Some(current) = state.copies.get(write.copy_key.as_str()) {
            if current.expire_at_ms > now_ms {
                if current.version == write.version {
                    // Equal versions: a retry of the same edit is current. A value never
                    // replaces a tombstone of its own version, while a tombstone replaces a
                    // value of its own version, so both arrival orders end as the tombstone.
                    match (&current.payload, &write.payload) {
                        (Payload::Value(_), Payload::Tombstone) => {}
                        (Payload::Tombstone, Payload::Value(_)) => {
                            return CasOutcome::Stale {
                                stored: current.version,
                            }
                        }
                        _ => return CasOutcome::Current,
                    }
                }
                if current.version > write.version {
                    return CasOutcome::Stale {
                        stored: current.version,
                    };
                }
            }
        }
        if write.expire_at_ms <= now_ms {
            // Redis deletes a key whose PEXPIREAT lies in the past; so do we.
            state.copies.remove(write.copy_key.as_str());
        } else {
            state.copies.insert(
                write.copy_key.as_str().to_owned(),
                CopyRecord {
                    version: write.version,
                    payload: write.payload.clone(),
                    expire_at_ms: write.expire_at_ms,
                },
            );
        }
        CasOutcome::Applied
    }

    /// Drops every expired copy and counter; returns how many entries were removed.
    pub fn purge_expired(&self) -> usize {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        let before = state.copies.len() + state.counters.len();
        state
            .copies
            .retain(|_, record| record.expire_at_ms > now_ms);
        state
            .counters
            .retain(|_, counter| counter.expire_at_ms > now_ms);
        before - state.copies.len() - state.counters.len()
    }

    /// The number of copies held, expired or not.
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
                state.copies.insert(copy_key.as_str().to_owned(), record);
            }
            None => {
                state.copies.remove(copy_key.as_str());
            }
        }
    }

    fn read(&self, copy_key: &CopyKey) -> Option<CopyRecord> {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        match state.copies.get(copy_key.as_str()) {
            Some(record) if record.expire_at_ms > now_ms => Some(record.clone()),
            Some(_) => {
                state.copies.remove(copy_key.as_str());
                None
            }
            None => None,
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

    fn allocate_version<'a>(&'a self, key: &'a Key, ttl_ms: u64) -> BoxFuture<'a, Result<Version>> {
        let now_ms = now_unix_ms();
        let mut state = self.state();
        let counter = state.counters.entry(key.counter_key()).or_insert(Counter {
            last: 0,
            expire_at_ms: 0,
        });
        if counter.expire_at_ms <= now_ms {
            counter.last = 0;
        }
        let result = match counter.last.checked_add(1) {
            Some(next) => {
                counter.last = next;
                counter.expire_at_ms = now_ms.saturating_add(ttl_ms);
                Version::new(next)
            }
            None => Err(Error::new(
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

    fn write_layout<'a>(&'a self, family: &'a str, layout: Layout) -> BoxFuture<'a, Result<()>> {
        self.state().layouts.insert(family.to_owned(), layout);
        Box::pin(std::future::ready(Ok(())))
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
