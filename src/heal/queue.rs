//! The retry queue: failed copy writes waiting to be retried, coalesced per copy, grouped per
//! node, bounded, and mirrored to the [`Spool`].
//!
//! Every mutation happens under one mutex and, when it must survive a crash, sends its spool
//! record while that mutex is held, so the spool's order is the queue's order. Nothing awaits
//! while the mutex is held.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::Rng;
use serde::Serialize;
use tokio::sync::{oneshot, Notify};

use super::config::HealConfig;
use super::spool::{self, Record, Replay, Spool};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Version};
use crate::metrics::{Metrics, RetryDrop};
use crate::store::{now_unix_ms, CopyWrite, NodeLabel, Payload};

/// What one queued entry costs beyond its value and its key text, counted against
/// `heal.max_bytes`: the entry and its slots in the copy, node and value maps. Measured by
/// `cargo bench --bench heal` (192 bytes of fixed overhead plus the copy key held four times).
pub const ENTRY_OVERHEAD_BYTES: usize = 192;

/// The bytes counted for one entry of `copy_key`, beyond its (shared) value.
fn entry_cost(copy_key: &CopyKey) -> usize {
    ENTRY_OVERHEAD_BYTES + 4 * copy_key.as_str().len()
}

/// One pending copy write.
#[derive(Debug, Clone)]
struct Entry {
    /// The copy to heal.
    copy_key: CopyKey,
    /// The version to write.
    version: Version,
    /// The value (shared by every copy of one edit) or a tombstone.
    payload: Payload,
    /// The absolute expiry fixed at publish time.
    expire_at_ms: u64,
    /// The node the copy belonged to when the write failed.
    node: NodeLabel,
    /// Retries so far.
    attempts: u32,
    /// The last error, for the visibility endpoint.
    last_error: Option<String>,
    /// When the entry (or the first entry it replaced) was queued, Unix milliseconds.
    queued_at_ms: u64,
}

impl Entry {
    fn is_tombstone(&self) -> bool {
        matches!(self.payload, Payload::Tombstone)
    }

    fn value_len(&self) -> usize {
        match &self.payload {
            Payload::Value(bytes) => bytes.len(),
            Payload::Tombstone => 0,
        }
    }

    fn write(&self) -> CopyWrite {
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
fn covers(version: Version, tombstone: bool, held: Version, held_tombstone: bool) -> bool {
    version > held || (version == held && (tombstone || !held_tombstone))
}

/// What a node's retry loop is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Waiting for its next probe.
    Backoff,
    /// A probe or a flush is running.
    Retrying,
}

/// A node with pending entries.
#[derive(Debug)]
struct NodeQueue {
    /// The copy keys pending on this node.
    keys: HashSet<String>,
    /// Failed probes in a row, for the exponential backoff.
    failures: u32,
    /// When the next probe may start.
    next_probe: Instant,
    /// Whether a probe or flush is running.
    busy: bool,
    /// When the backlog started, for the drain log line.
    since: Instant,
}

/// Everything under the queue's lock.
#[derive(Debug, Default)]
struct State {
    /// Copy key → its one pending entry (the highest version).
    entries: HashMap<String, Entry>,
    /// Node → its pending copy keys and backoff.
    nodes: HashMap<NodeLabel, NodeQueue>,
    /// (key, version, tombstone) → (value length, entries sharing it): values count once.
    values: HashMap<(String, u64, bool), (usize, usize)>,
    /// Bytes counted against `heal.max_bytes`.
    bytes: usize,
    /// Spool records sent but not yet synced: record id → payload. Their entries join the maps
    /// only once the record is durable, and a compaction carries them over.
    unsynced: HashMap<u64, Bytes>,
    /// The next record id.
    next_record: u64,
    /// Entries of unsynced records, counted against `heal.max_entries`.
    reserved_entries: usize,
    /// Bytes of unsynced records, counted against `heal.max_bytes`.
    reserved_bytes: usize,
}

/// How one failed copy write was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The copy will be healed (by this entry, or by a newer pending one).
    Queued,
    /// The copy could not be queued.
    Dropped(DropReason),
}

/// Why a copy was dropped from (or never entered) the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue was full (entries or bytes).
    Overflow,
    /// The entry's expiry passed; the copy it would heal has expired too.
    Expired,
    /// The spool could not record it.
    Spool,
}

impl DropReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Overflow => "overflow",
            DropReason::Expired => "expired",
            DropReason::Spool => "spool",
        }
    }
}

/// One failed copy write offered to the queue.
#[derive(Debug, Clone)]
pub struct FailedCopy {
    /// The copy.
    pub copy_key: CopyKey,
    /// Its node.
    pub node: NodeLabel,
    /// Its absolute expiry.
    pub expire_at_ms: u64,
    /// Why the write failed.
    pub error: String,
}

/// Resolves with a spool record's outcome once it is synced (or failed).
type Settled = oneshot::Receiver<std::result::Result<(), String>>;

/// A batch of writes handed to a node's retry loop.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The writes, one per entry.
    pub(crate) writes: Vec<CopyWrite>,
}

/// The visibility endpoint's answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RetryQueueView {
    /// Pending entries.
    pub depth: usize,
    /// Bytes counted against `heal.max_bytes`.
    pub bytes: usize,
    /// Age of the oldest pending entry, in milliseconds (0 when empty).
    pub oldest_age_ms: u64,
    /// Nodes with pending entries.
    pub nodes: Vec<NodeView>,
    /// Up to `limit` pending entries, oldest first.
    pub entries: Vec<EntryView>,
}

/// One node in a [`RetryQueueView`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NodeView {
    /// `host:port`.
    pub node: String,
    /// `backoff` or `retrying`.
    pub state: NodeState,
    /// Milliseconds until the next probe (0 when retrying or due).
    pub next_probe_in_ms: u64,
    /// Pending entries on this node.
    pub entries: usize,
}

/// One entry in a [`RetryQueueView`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EntryView {
    /// The copy key, `K#i`.
    pub copy_key: String,
    /// The pending version.
    #[schema(value_type = u64)]
    pub version: Version,
    /// Retries so far.
    pub attempts: u32,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// The retry queue. Shared as `Arc<RetryQueue>` by the publisher, the retry worker and the HTTP
/// visibility endpoint.
#[derive(Debug)]
pub struct RetryQueue {
    /// The state, shared with the spool writer's callbacks (which admit entries once their
    /// record is durable, whether or not the publish that offered them still waits).
    core: Arc<Core>,
    /// The spool, `None` for an in-memory queue (the embedded store, tests).
    spool: Option<Spool>,
}

/// The queue's state and what admitting an entry needs.
#[derive(Debug)]
struct Core {
    /// The entries and nodes.
    state: Mutex<State>,
    /// Wakes the retry worker when a node gets its first entry.
    wake: Notify,
    /// Limits and backoff.
    config: HealConfig,
    /// Counters and gauges.
    metrics: Arc<Metrics>,
    /// The spool file's size, for its gauge (`None` without a spool).
    spool_size: Option<Arc<AtomicU64>>,
    /// How many entries are pending, kept beside the state so a read can skip the lock when
    /// there is none ([`RetryQueue::pending_version`]).
    pending: AtomicUsize,
}

impl Core {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation keeps the maps consistent between statements that cannot panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A spool record was synced (`Ok`) or failed: its entries join the queue, or are dropped.
    fn settle(
        &self,
        record: u64,
        entries: Vec<Entry>,
        reserved_bytes: usize,
        outcome: &std::result::Result<(), String>,
    ) {
        let mut state = self.state();
        state.unsynced.remove(&record);
        state.reserved_entries = state.reserved_entries.saturating_sub(entries.len());
        state.reserved_bytes = state.reserved_bytes.saturating_sub(reserved_bytes);
        let admitted = outcome.is_ok() && !entries.is_empty();
        match outcome {
            Ok(()) => {
                for entry in entries {
                    self.admit(&mut state, entry, true);
                }
            }
            Err(err) => {
                tracing::error!(error = %err, copies = entries.len(), "failed copy writes could not be made durable: reporting them dropped, not retrying them");
                for _ in &entries {
                    self.metrics.retry_drop(RetryDrop::Spool);
                }
            }
        }
        self.publish_gauges(&state);
        drop(state);
        if admitted {
            self.wake.notify_one();
        }
    }
}

impl RetryQueue {
    /// A queue that lives in memory only: its entries survive no restart, yet a publisher
    /// still reports them `queued`. The service uses it with the embedded store only, which
    /// never fails a copy write (a publish it cannot hold is refused before any copy changes).
    pub fn in_memory(config: HealConfig, metrics: Arc<Metrics>) -> RetryQueue {
        RetryQueue {
            core: Arc::new(Core {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                config,
                metrics,
                spool_size: None,
                pending: AtomicUsize::new(0),
            }),
            spool: None,
        }
    }

    /// A queue backed by the spool in `config.spool_dir`: opens it (taking its lock), replays
    /// it, drops expired entries and compacts it. `node_of` places replayed copies.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the spool cannot be opened, is locked by another process, or a
    /// record names an invalid key.
    pub fn open(
        config: HealConfig,
        max_value_bytes: usize,
        metrics: Arc<Metrics>,
        node_of: impl Fn(&CopyKey) -> NodeLabel,
    ) -> Result<RetryQueue> {
        // The largest record: a value, its key, and up to 1024 (index, expiry) pairs.
        let max_frame = max_value_bytes + 64 * 1024;
        let (spool, replay) = Spool::open(&config.spool_dir, max_frame)?;
        RetryQueue::with_spool(config, metrics, spool, replay, node_of)
    }

    fn with_spool(
        config: HealConfig,
        metrics: Arc<Metrics>,
        spool: Spool,
        replay: Replay,
        node_of: impl Fn(&CopyKey) -> NodeLabel,
    ) -> Result<RetryQueue> {
        let queue = RetryQueue {
            core: Arc::new(Core {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                config,
                metrics,
                spool_size: Some(spool.size_handle()),
                pending: AtomicUsize::new(0),
            }),
            spool: Some(spool),
        };
        queue.replay(replay, node_of)?;
        Ok(queue)
    }

    /// [`RetryQueue::open`] with a spool writer that waits for the test's word before each batch.
    #[cfg(test)]
    pub(crate) fn open_held(
        config: HealConfig,
        metrics: Arc<Metrics>,
        node_of: impl Fn(&CopyKey) -> NodeLabel,
    ) -> Result<(RetryQueue, spool::GateSender)> {
        let (spool, replay, gate) = Spool::open_held(&config.spool_dir, 1 << 20)?;
        Ok((
            RetryQueue::with_spool(config, metrics, spool, replay, node_of)?,
            gate,
        ))
    }

    /// Wakes the retry worker when a node gets its first entry.
    pub(crate) fn wake(&self) -> &Notify {
        &self.core.wake
    }

    fn replay(&self, replay: Replay, node_of: impl Fn(&CopyKey) -> NodeLabel) -> Result<()> {
        let now_ms = now_unix_ms();
        let records = replay.records.len();
        let mut state = self.core.state();
        for record in replay.records {
            match record {
                Record::Enqueue {
                    key,
                    version,
                    tombstone,
                    value,
                    copies,
                } => {
                    let key = Key::parse(&key).map_err(|err| {
                        Error::new(ErrorKind::Io, format!("spool record has a bad key: {err}"))
                    })?;
                    let version = Version::new(version).map_err(|err| {
                        Error::new(
                            ErrorKind::Io,
                            format!("spool record has a bad version: {err}"),
                        )
                    })?;
                    let payload = if tombstone {
                        Payload::Tombstone
                    } else {
                        Payload::Value(Bytes::from(value))
                    };
                    for (index, expire_at_ms) in copies {
                        let copy_key = key.copy_key(index);
                        let node = node_of(&copy_key);
                        // Replay ignores the bounds: these entries were accepted before.
                        self.core.admit(
                            &mut state,
                            Entry {
                                copy_key,
                                version,
                                payload: payload.clone(),
                                expire_at_ms,
                                node,
                                attempts: 0,
                                last_error: None,
                                queued_at_ms: now_ms,
                            },
                            false,
                        );
                    }
                }
                Record::Complete {
                    copy_key,
                    version,
                    tombstone,
                } => {
                    if let Ok(version) = Version::new(version) {
                        self.core.remove_if(&mut state, &copy_key, |entry| {
                            covers(version, tombstone, entry.version, entry.is_tombstone())
                        });
                    }
                }
            }
        }
        let expired: Vec<String> = state
            .entries
            .values()
            .filter(|entry| entry.expire_at_ms <= now_ms)
            .map(|entry| entry.copy_key.as_str().to_owned())
            .collect();
        for copy_key in &expired {
            self.core.remove_if(&mut state, copy_key, |_| true);
            self.core.metrics.retry_drop(RetryDrop::Expired);
        }
        self.core
            .metrics
            .spool_damage(replay.damage.regions, replay.damage.skipped_bytes);
        tracing::info!(
            records,
            entries = state.entries.len(),
            expired = expired.len(),
            format = replay.format,
            damaged_regions = replay.damage.regions,
            skipped_bytes = replay.damage.skipped_bytes,
            torn_bytes = replay.torn_bytes,
            kept_aside = replay
                .kept_aside
                .as_ref()
                .map(|path| path.display().to_string()),
            "replayed the retry spool"
        );
        self.compact_locked(&state);
        self.core.publish_gauges(&state);
        Ok(())
    }

    /// Offers the failed copy writes of one edit of `key` at `version`, and answers once each
    /// is settled: `Queued` only when a durable spool record (this edit's, or a newer pending
    /// entry's) holds it, so a crash after the answer loses nothing answered `Queued`.
    ///
    /// An offered copy joins the queue only after its record is synced; if the spool fails, the
    /// copy is `Dropped(Spool)` and is not retried. Dropping the returned future does not
    /// change what happens to the copies, only who hears of it.
    pub async fn enqueue(
        &self,
        key: &Key,
        version: Version,
        payload: &Payload,
        failed: Vec<FailedCopy>,
    ) -> Vec<Admission> {
        let (mut admissions, waiting) = self.offer(key, version, payload, failed);
        let Some((positions, durable)) = waiting else {
            return admissions;
        };
        let outcome = durable
            .await
            .unwrap_or_else(|_| Err("the spool writer has stopped".to_owned()));
        if outcome.is_err() {
            for position in positions {
                if let Some(admission) = admissions.get_mut(position) {
                    *admission = Admission::Dropped(DropReason::Spool);
                }
            }
        }
        admissions
    }

    /// The synchronous part of [`RetryQueue::enqueue`]: decides each copy under the lock and
    /// sends the spool record; returns the admissions (those waiting for the record are
    /// `Queued` provisionally) and, when a record was sent, their positions and its outcome.
    fn offer(
        &self,
        key: &Key,
        version: Version,
        payload: &Payload,
        failed: Vec<FailedCopy>,
    ) -> (Vec<Admission>, Option<(Vec<usize>, Settled)>) {
        let now_ms = now_unix_ms();
        let mut admissions = Vec::with_capacity(failed.len());
        let mut offered: Vec<Entry> = Vec::new();
        let mut positions: Vec<usize> = Vec::new();
        let tombstone = matches!(payload, Payload::Tombstone);
        let value_len = match payload {
            Payload::Value(bytes) => bytes.len(),
            Payload::Tombstone => 0,
        };
        let mut state = self.core.state();
        let config = &self.core.config;
        let mut reserve_bytes = 0usize;
        for copy in failed {
            if copy.expire_at_ms <= now_ms {
                self.core.metrics.retry_drop(RetryDrop::Expired);
                admissions.push(Admission::Dropped(DropReason::Expired));
                continue;
            }
            if let Some(held) = state.entries.get(copy.copy_key.as_str()) {
                if covers(held.version, held.is_tombstone(), version, tombstone) {
                    // A newer (or equal) entry will heal this copy past this version, and an
                    // entry is in the queue only once its record is durable.
                    self.core.metrics.retry_superseded();
                    admissions.push(Admission::Queued);
                    continue;
                }
            }
            let shares_value = !offered.is_empty()
                || state.values.contains_key(&(
                    copy.copy_key.base().to_owned(),
                    version.get(),
                    tombstone,
                ));
            let adds = entry_cost(&copy.copy_key) + if shares_value { 0 } else { value_len };
            if state.entries.len() + state.reserved_entries + offered.len() >= config.max_entries
                || state.bytes + state.reserved_bytes + reserve_bytes + adds > config.max_bytes
            {
                self.core.metrics.retry_drop(RetryDrop::Overflow);
                tracing::warn!(copy_key = %copy.copy_key, node = %copy.node, "retry queue full: dropping a failed copy write");
                admissions.push(Admission::Dropped(DropReason::Overflow));
                continue;
            }
            reserve_bytes += adds;
            positions.push(admissions.len());
            admissions.push(Admission::Queued);
            offered.push(Entry {
                copy_key: copy.copy_key,
                version,
                payload: payload.clone(),
                expire_at_ms: copy.expire_at_ms,
                node: copy.node,
                attempts: 0,
                last_error: Some(copy.error),
                queued_at_ms: now_ms,
            });
        }
        if offered.is_empty() {
            return (admissions, None);
        }
        let Some(spool) = &self.spool else {
            // An in-memory queue: nothing to wait for.
            for entry in offered {
                self.core.admit(&mut state, entry, true);
            }
            self.core.publish_gauges(&state);
            drop(state);
            self.core.wake.notify_one();
            return (admissions, None);
        };
        let copies: Vec<(u32, u64)> = offered
            .iter()
            .map(|entry| (entry.copy_key.index(), entry.expire_at_ms))
            .collect();
        let value: &[u8] = match payload {
            Payload::Value(bytes) => bytes,
            Payload::Tombstone => &[],
        };
        let record = match spool::encode_enqueue(
            key.as_str(),
            version.get(),
            tombstone,
            value,
            &copies,
        ) {
            Ok(record) => record,
            Err(err) => {
                tracing::error!(error = %err, "cannot encode a spool record: reporting the copies dropped");
                for position in positions {
                    self.core.metrics.retry_drop(RetryDrop::Spool);
                    admissions[position] = Admission::Dropped(DropReason::Spool);
                }
                return (admissions, None);
            }
        };
        let id = state.next_record;
        state.next_record += 1;
        state.unsynced.insert(id, record.clone());
        state.reserved_entries += offered.len();
        state.reserved_bytes += reserve_bytes;
        let (tell, settled) = oneshot::channel();
        let core = self.core.clone();
        let done: spool::Done = Box::new(move |outcome| {
            core.settle(id, offered, reserve_bytes, &outcome);
            let _ = tell.send(outcome);
        });
        // Sent under the lock, so the spool's order is the queue's order.
        if let Err(done) = spool.append_durable(record, done) {
            drop(done);
            state.unsynced.remove(&id);
            state.reserved_entries -= positions.len();
            state.reserved_bytes -= reserve_bytes;
            tracing::error!("the spool writer has stopped: reporting failed copies dropped");
            for &position in &positions {
                self.core.metrics.retry_drop(RetryDrop::Spool);
                admissions[position] = Admission::Dropped(DropReason::Spool);
            }
            return (admissions, None);
        }
        (admissions, Some((positions, settled)))
    }

    /// A direct write of `version` reached `copy_key` (applied, current, or a newer version is
    /// stored): pending entries it covers are done.
    pub fn clear_covered(&self, copy_key: &CopyKey, version: Version, tombstone: bool) {
        let mut state = self.core.state();
        if !state.entries.contains_key(copy_key.as_str()) {
            return;
        }
        let removed = self.core.remove_if(&mut state, copy_key.as_str(), |entry| {
            covers(version, tombstone, entry.version, entry.is_tombstone())
        });
        if removed {
            self.spool_complete(copy_key.as_str(), version, tombstone);
            self.reset_if_drained(&state);
            self.core.publish_gauges(&state);
        }
    }

    fn spool_complete(&self, copy_key: &str, version: Version, tombstone: bool) {
        if let Some(spool) = &self.spool {
            match spool::encode(&Record::Complete {
                copy_key: copy_key.to_owned(),
                version: version.get(),
                tombstone,
            }) {
                Ok(body) => spool.append(body),
                Err(err) => tracing::warn!(error = %err, "cannot record a completion"),
            }
        }
    }

    /// Truncates the spool to its header when the queue holds nothing (no entry, no unsynced
    /// record): sent under the lock, so every later record follows the reset. Resetting in
    /// place needs no free space, so a full disk does not keep a drained spool full.
    fn reset_if_drained(&self, state: &State) {
        if let Some(spool) = &self.spool {
            if state.entries.is_empty()
                && state.unsynced.is_empty()
                && spool.size_bytes() > spool::HEADER_LEN
            {
                spool.reset();
            }
        }
    }

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

    /// The version of the entry pending for `copy_key`, if any: a floor for reads of that copy
    /// (`heal::health`). One atomic load when the queue is empty.
    pub fn pending_version(&self, copy_key: &CopyKey) -> Option<Version> {
        if self.core.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.core
            .state()
            .entries
            .get(copy_key.as_str())
            .map(|entry| entry.version)
    }

    /// How many entries are pending on `node` (the node their write failed on).
    pub fn pending_on(&self, node: &NodeLabel) -> usize {
        self.core
            .state()
            .nodes
            .get(node)
            .map_or(0, |queue| queue.keys.len())
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

    /// Pending entries.
    pub fn depth(&self) -> usize {
        self.core.state().entries.len()
    }

    /// The view served by `GET /v1/retry-queue`, with up to `limit` entries, oldest first.
    pub fn view(&self, limit: usize) -> RetryQueueView {
        let now = Instant::now();
        let now_ms = now_unix_ms();
        let state = self.core.state();
        let mut oldest: Vec<&Entry> = state.entries.values().collect();
        oldest.sort_by_key(|entry| entry.queued_at_ms);
        let mut nodes: Vec<NodeView> = state
            .nodes
            .iter()
            .map(|(label, node)| NodeView {
                node: label.to_string(),
                state: if node.busy {
                    NodeState::Retrying
                } else {
                    NodeState::Backoff
                },
                next_probe_in_ms: if node.busy {
                    0
                } else {
                    u64::try_from(node.next_probe.saturating_duration_since(now).as_millis())
                        .unwrap_or(u64::MAX)
                },
                entries: node.keys.len(),
            })
            .collect();
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        RetryQueueView {
            depth: state.entries.len(),
            bytes: state.bytes,
            oldest_age_ms: oldest
                .first()
                .map_or(0, |entry| now_ms.saturating_sub(entry.queued_at_ms)),
            nodes,
            entries: oldest
                .into_iter()
                .take(limit)
                .map(|entry| EntryView {
                    copy_key: entry.copy_key.to_string(),
                    version: entry.version,
                    attempts: entry.attempts,
                    last_error: entry.last_error.clone(),
                })
                .collect(),
        }
    }

    /// Sets the queue gauges, including the oldest entry's age (a scan; called per scrape).
    pub fn refresh_gauges(&self) {
        let state = self.core.state();
        let now_ms = now_unix_ms();
        let oldest = state
            .entries
            .values()
            .map(|entry| entry.queued_at_ms)
            .min()
            .map_or(0, |at| now_ms.saturating_sub(at));
        self.core.metrics.retry_oldest_age(oldest as f64 / 1000.0);
        self.core.publish_gauges(&state);
    }

    /// The spool file's size in bytes (0 without a spool).
    pub fn spool_bytes(&self) -> u64 {
        self.spool.as_ref().map_or(0, Spool::size_bytes)
    }

    /// Rewrites the spool with only the live entries when it has grown well past them.
    pub(crate) fn maybe_compact(&self) {
        let Some(spool) = &self.spool else {
            return;
        };
        let size = spool.size_bytes();
        let state = self.core.state();
        if size > 4 * 1024 * 1024 && size > 4 * state.bytes as u64 {
            self.compact_locked(&state);
        }
    }

    /// Sends the live entries (one record per edit) as the spool's new content. Called with the
    /// lock held, so no record can slip between the snapshot and the compaction.
    fn compact_locked(&self, state: &State) {
        let Some(spool) = &self.spool else {
            return;
        };
        if state.entries.is_empty() && state.unsynced.is_empty() {
            spool.reset();
            return;
        }
        let mut edits: HashMap<EditId<'_>, EditCopies<'_>> = HashMap::new();
        for entry in state.entries.values() {
            edits
                .entry((
                    entry.copy_key.base(),
                    entry.version.get(),
                    entry.is_tombstone(),
                ))
                .or_insert_with(|| (&entry.payload, Vec::new()))
                .1
                .push((entry.copy_key.index(), entry.expire_at_ms));
        }
        let mut bodies = Vec::with_capacity(edits.len());
        for ((key, version, tombstone), (payload, copies)) in edits {
            let value: &[u8] = match payload {
                Payload::Value(bytes) => bytes,
                Payload::Tombstone => &[],
            };
            match spool::encode_enqueue(key, version, tombstone, value, &copies) {
                Ok(body) => bodies.push(body),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot compact the spool");
                    return;
                }
            }
        }
        // Records sent but not yet synced are carried over: they may be written to the old
        // file just before it is replaced.
        bodies.extend(state.unsynced.values().cloned());
        spool.compact(bodies);
    }

    /// Closes the spool (everything recorded so far is synced) and releases its lock, so
    /// another process may take the directory. Later enqueues are reported `dropped`.
    pub async fn close(&self) {
        if let Some(spool) = &self.spool {
            spool.close().await;
        }
    }

    /// Logs what is left, for shutdown.
    pub(crate) fn log_leftovers(&self) {
        let state = self.core.state();
        if state.entries.is_empty() {
            tracing::info!("retry queue is empty at shutdown");
        } else {
            // Every entry in the queue is in the spool: it joined the queue only once its
            // record was synced. Without a spool, none is.
            let on_disk = if self.spool.is_some() {
                state.entries.len()
            } else {
                0
            };
            tracing::warn!(
                entries = state.entries.len(),
                nodes = state.nodes.len(),
                bytes = state.bytes,
                on_disk,
                spool_bytes = self.spool_bytes(),
                "retry queue not drained at shutdown; the entries on disk replay at the next start"
            );
        }
    }
}

impl Core {
    /// Puts `entry` in the maps, replacing (as superseded) a weaker entry of the same copy.
    fn admit(&self, state: &mut State, entry: Entry, log: bool) {
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
    fn remove_if(
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

    fn publish_gauges(&self, state: &State) {
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

/// One edit in a compaction: (key, version, tombstone).
type EditId<'a> = (&'a str, u64, bool);

/// An edit's payload and its pending copies: (copy index, expiry).
type EditCopies<'a> = (&'a Payload, Vec<(u32, u64)>);

/// A uniformly random duration in `0..=ceiling` (full jitter).
fn jitter(ceiling: Duration) -> Duration {
    let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=millis))
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn key() -> Key {
        Key::parse("hot").unwrap()
    }

    fn failed(index: u32, node: &str) -> FailedCopy {
        FailedCopy {
            copy_key: key().copy_key(index),
            node: NodeLabel::new(node),
            expire_at_ms: now_unix_ms() + 60_000,
            error: "timeout".into(),
        }
    }

    fn value(n: usize) -> Payload {
        Payload::Value(Bytes::from(vec![b'v'; n]))
    }

    fn queue() -> RetryQueue {
        RetryQueue::in_memory(HealConfig::default(), Metrics::new())
    }

    /// Offers to an in-memory queue, which answers at once.
    fn offer(
        queue: &RetryQueue,
        version: u64,
        payload: &Payload,
        failed: Vec<FailedCopy>,
    ) -> Vec<Admission> {
        queue
            .enqueue(&key(), Version::new(version).unwrap(), payload, failed)
            .now_or_never()
            .expect("an in-memory queue answers at once")
    }

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
        queue.clear_covered(&key().copy_key(0), Version::new(999).unwrap(), false);
        assert_eq!(queue.depth(), 3);
        queue.clear_covered(&key().copy_key(0), Version::new(1001).unwrap(), false);
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
            copy_key: key().copy_key(0),
            version: Version::new(3).unwrap(),
            payload: Payload::Tombstone,
            expire_at_ms: 0,
        });
        assert_eq!(queue.view(0).bytes, cost + 500);
        queue.clear_covered(&key().copy_key(1), Version::new(3).unwrap(), false);
        assert_eq!(queue.view(0).bytes, 0);
    }

    #[test]
    fn bounds_drop_with_a_reason() {
        let config = HealConfig {
            max_entries: 2,
            ..HealConfig::default()
        };
        let queue = RetryQueue::in_memory(config, Metrics::new());
        let admissions = offer(
            &queue,
            1,
            &value(1),
            vec![failed(0, "a"), failed(1, "a"), failed(2, "a")],
        );
        assert_eq!(
            admissions,
            vec![
                Admission::Queued,
                Admission::Queued,
                Admission::Dropped(DropReason::Overflow)
            ]
        );
        let mut old = failed(3, "a");
        old.expire_at_ms = now_unix_ms() - 1;
        let admissions = offer(&queue, 2, &value(1), vec![old]);
        assert_eq!(admissions, vec![Admission::Dropped(DropReason::Expired)]);
    }

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

    fn spool_config(dir: &std::path::Path) -> HealConfig {
        HealConfig {
            spool_dir: dir.to_owned(),
            ..HealConfig::default()
        }
    }

    async fn reopen(config: &HealConfig) -> RetryQueue {
        for _ in 0..200 {
            match RetryQueue::open(config.clone(), 1 << 20, Metrics::new(), |_| {
                NodeLabel::new("a")
            }) {
                Ok(queue) => return queue,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        panic!("the spool stayed locked");
    }

    #[tokio::test]
    async fn the_spool_replays_into_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let config = spool_config(dir.path());
        {
            let queue = RetryQueue::open(config.clone(), 1 << 20, Metrics::new(), |_| {
                NodeLabel::new("a")
            })
            .unwrap();
            let admissions = queue
                .enqueue(
                    &key(),
                    Version::new(7).unwrap(),
                    &value(3),
                    vec![failed(0, "a"), failed(1, "a")],
                )
                .await;
            assert!(admissions.iter().all(|a| *a == Admission::Queued));
            let batch = queue.batch(&NodeLabel::new("a"), 1);
            queue.completed(&batch.writes[0]);
        }
        let queue = reopen(&config).await;
        assert_eq!(queue.depth(), 1);
        assert_eq!(queue.view(1).entries[0].version.get(), 7);
    }

    /// Issue 14 item 6: a copy covered by a pending entry of a newer version is answered
    /// `queued` only once that entry's record is synced. The writer is held so the newer
    /// record waits for its sync; then the process "crashes" (the writer stops without
    /// writing). Everything answered `queued` must be in the spool after the crash.
    #[tokio::test]
    async fn a_covered_copy_is_not_queued_before_its_cover_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let config = spool_config(dir.path());
        let answered: Vec<(u64, Vec<Admission>)>;
        {
            let (queue, gate) =
                RetryQueue::open_held(config.clone(), Metrics::new(), |_| NodeLabel::new("a"))
                    .unwrap();
            // Replay's compaction is the first batch: let it through.
            gate.send(spool::Gate::Go).unwrap();
            let (key, value) = (key(), value(4));
            // Version 9 of copy 0 is offered; its record waits for the held writer.
            let mut newer = Box::pin(queue.enqueue(
                &key,
                Version::new(9).unwrap(),
                &value,
                vec![failed(0, "a")],
            ));
            assert_eq!((&mut newer).now_or_never(), None);
            // Version 8 of the same copy fails while version 9 is unsynced: it must not be
            // answered before a durable record holds it.
            let mut older = Box::pin(queue.enqueue(
                &key,
                Version::new(8).unwrap(),
                &value,
                vec![failed(0, "a")],
            ));
            let early = (&mut older).now_or_never();
            assert_eq!(early, None, "a covered copy was answered before any sync");
            // The crash: the held batch is never written.
            gate.send(spool::Gate::Crash).unwrap();
            let (newer, older) = tokio::join!(newer, older);
            answered = vec![(9, newer), (8, older)];
        }
        let queue = reopen(&config).await;
        let held = queue
            .view(1)
            .entries
            .first()
            .map_or(0, |entry| entry.version.get());
        for (version, admissions) in &answered {
            if admissions.contains(&Admission::Queued) {
                assert!(
                    held >= *version,
                    "version {version} was answered queued; the spool holds {held}"
                );
            }
        }
        assert!(
            answered
                .iter()
                .all(|(_, admissions)| admissions == &vec![Admission::Dropped(DropReason::Spool)]),
            "{answered:?}"
        );

        drop(queue);

        // Without the crash both are queued, and the spool holds version 9.
        {
            let mut opened = None;
            for _ in 0..200 {
                match RetryQueue::open_held(config.clone(), Metrics::new(), |_| NodeLabel::new("a"))
                {
                    Ok(queue) => {
                        opened = Some(queue);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            let (queue, gate) = opened.expect("the spool reopens");
            // Every batch goes through, until the writer stops.
            std::thread::spawn(move || while gate.send(spool::Gate::Go).is_ok() {});
            let (key, value) = (key(), value(4));
            let newer = queue.enqueue(&key, Version::new(9).unwrap(), &value, vec![failed(0, "a")]);
            let older = queue.enqueue(&key, Version::new(8).unwrap(), &value, vec![failed(0, "a")]);
            let (newer, older) = tokio::join!(newer, older);
            assert_eq!(
                (newer, older),
                (vec![Admission::Queued], vec![Admission::Queued])
            );
            assert_eq!(queue.view(1).entries[0].version.get(), 9);
            // The queue's gauge and the covered answer agree: a covered offer now answers at once.
            let covered = queue
                .enqueue(&key, Version::new(7).unwrap(), &value, vec![failed(0, "a")])
                .now_or_never();
            assert_eq!(covered, Some(vec![Admission::Queued]));
        }
        let queue = reopen(&config).await;
        assert_eq!(queue.view(1).entries[0].version.get(), 9);
    }

    #[tokio::test]
    async fn a_drained_queue_resets_the_spool_to_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let config = spool_config(dir.path());
        let queue =
            RetryQueue::open(config, 1 << 20, Metrics::new(), |_| NodeLabel::new("a")).unwrap();
        queue
            .enqueue(
                &key(),
                Version::new(1).unwrap(),
                &value(100),
                vec![failed(0, "a"), failed(1, "a")],
            )
            .await;
        assert!(queue.spool_bytes() > spool::HEADER_LEN);
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        for write in &batch.writes {
            queue.completed(write);
        }
        assert_eq!(queue.depth(), 0);
        // The reset is processed by the writer after the completions; a durable append behind
        // it proves it ran.
        queue
            .enqueue(
                &key(),
                Version::new(2).unwrap(),
                &value(1),
                vec![failed(2, "a")],
            )
            .await;
        let one_record = std::fs::metadata(dir.path().join("spool.log"))
            .unwrap()
            .len();
        assert_eq!(one_record, queue.spool_bytes());
        assert!(one_record < spool::HEADER_LEN + 100, "{one_record}");
    }
}
