//! The retry queue: failed copy writes waiting to be retried, coalesced per copy, grouped per
//! node, bounded, and mirrored to the [`Spool`].
//!
//! Every mutation happens under one mutex and, when it must survive a crash, sends its spool
//! record while that mutex is held, so the spool's order is the queue's order. Nothing awaits
//! while the mutex is held.

use std::collections::{HashMap, HashSet};
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
    values: HashMap<(String, u64), (usize, usize)>,
    /// Bytes counted against `heal.max_bytes`.
    bytes: usize,
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

/// The answer of [`RetryQueue::enqueue`].
#[derive(Debug)]
pub struct Enqueued {
    /// One admission per offered copy, in order.
    pub admissions: Vec<Admission>,
    /// Resolves once the spool holds the admitted entries; `None` without a spool or when
    /// nothing new was admitted.
    durable: Option<oneshot::Receiver<std::result::Result<(), String>>>,
}

impl Enqueued {
    /// Waits until the admitted entries are durable; on a spool failure every `Queued`
    /// admission becomes `Dropped(Spool)` (the entries stay in memory and are still retried).
    pub async fn wait_durable(mut self, metrics: &Metrics) -> Vec<Admission> {
        let Some(durable) = self.durable.take() else {
            return self.admissions;
        };
        let failure = match durable.await {
            Ok(Ok(())) => return self.admissions,
            Ok(Err(err)) => err,
            Err(_) => "the spool writer has stopped".to_owned(),
        };
        tracing::error!(error = %failure, "queued copies are not durable; reporting them dropped");
        for admission in &mut self.admissions {
            if *admission == Admission::Queued {
                metrics.retry_drop(RetryDrop::Spool);
                *admission = Admission::Dropped(DropReason::Spool);
            }
        }
        self.admissions
    }
}

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
    /// The entries and nodes.
    state: Mutex<State>,
    /// Wakes the retry worker when a node gets its first entry.
    pub(crate) wake: Notify,
    /// The spool, `None` for an in-memory queue (the embedded store, tests).
    spool: Option<Spool>,
    /// Limits and backoff.
    config: HealConfig,
    /// Counters and gauges.
    metrics: Arc<Metrics>,
}

impl RetryQueue {
    /// A queue that lives in memory only: its entries survive no restart, yet a publisher
    /// still reports them `queued`. The service uses it with the embedded store only, which
    /// never fails a copy write.
    pub fn in_memory(config: HealConfig, metrics: Arc<Metrics>) -> RetryQueue {
        RetryQueue {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            spool: None,
            config,
            metrics,
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
        let queue = RetryQueue {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            spool: Some(spool),
            config,
            metrics,
        };
        queue.replay(replay, node_of)?;
        Ok(queue)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation keeps the maps consistent between statements that cannot panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn replay(&self, replay: Replay, node_of: impl Fn(&CopyKey) -> NodeLabel) -> Result<()> {
        let now_ms = now_unix_ms();
        let records = replay.records.len();
        let mut state = self.state();
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
                        self.admit(
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
                        self.remove_if(&mut state, &copy_key, |entry| {
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
            self.remove_if(&mut state, copy_key, |_| true);
            self.metrics.retry_drop(RetryDrop::Expired);
        }
        tracing::info!(
            records,
            entries = state.entries.len(),
            expired = expired.len(),
            truncated_bytes = replay.truncated_bytes,
            "replayed the retry spool"
        );
        self.compact_locked(&state);
        self.publish_gauges(&state);
        Ok(())
    }

    /// Offers the failed copy writes of one edit of `key` at `version`.
    pub fn enqueue(
        &self,
        key: &Key,
        version: Version,
        payload: &Payload,
        failed: Vec<FailedCopy>,
    ) -> Enqueued {
        let now_ms = now_unix_ms();
        let mut admissions = Vec::with_capacity(failed.len());
        let mut spooled: Vec<(u32, u64)> = Vec::new();
        let tombstone = matches!(payload, Payload::Tombstone);
        let value_len = match payload {
            Payload::Value(bytes) => bytes.len(),
            Payload::Tombstone => 0,
        };
        let mut state = self.state();
        for copy in failed {
            if copy.expire_at_ms <= now_ms {
                self.metrics.retry_drop(RetryDrop::Expired);
                admissions.push(Admission::Dropped(DropReason::Expired));
                continue;
            }
            if let Some(held) = state.entries.get(copy.copy_key.as_str()) {
                if covers(held.version, held.is_tombstone(), version, tombstone) {
                    // A newer (or equal) pending entry will heal this copy past this version.
                    self.metrics.retry_superseded();
                    admissions.push(Admission::Queued);
                    continue;
                }
            } else {
                let shares_value = state
                    .values
                    .contains_key(&(copy.copy_key.base().to_owned(), version.get()));
                let adds = entry_cost(&copy.copy_key) + if shares_value { 0 } else { value_len };
                if state.entries.len() >= self.config.max_entries
                    || state.bytes + adds > self.config.max_bytes
                {
                    self.metrics.retry_drop(RetryDrop::Overflow);
                    tracing::warn!(copy_key = %copy.copy_key, node = %copy.node, "retry queue full: dropping a failed copy write");
                    admissions.push(Admission::Dropped(DropReason::Overflow));
                    continue;
                }
            }
            spooled.push((copy.copy_key.index(), copy.expire_at_ms));
            self.admit(
                &mut state,
                Entry {
                    copy_key: copy.copy_key,
                    version,
                    payload: payload.clone(),
                    expire_at_ms: copy.expire_at_ms,
                    node: copy.node,
                    attempts: 0,
                    last_error: Some(copy.error),
                    queued_at_ms: now_ms,
                },
                true,
            );
            admissions.push(Admission::Queued);
        }
        let durable = match (&self.spool, spooled.is_empty()) {
            (Some(spool), false) => {
                let value: &[u8] = match payload {
                    Payload::Value(bytes) => bytes,
                    Payload::Tombstone => &[],
                };
                match spool::encode_enqueue(key.as_str(), version.get(), tombstone, value, &spooled)
                {
                    Ok(body) => Some(spool.append_durable(body)),
                    Err(err) => {
                        let (ack, done) = oneshot::channel();
                        let _ = ack.send(Err(err.to_string()));
                        Some(done)
                    }
                }
            }
            _ => None,
        };
        self.publish_gauges(&state);
        drop(state);
        if !spooled.is_empty() {
            self.wake.notify_one();
        }
        Enqueued {
            admissions,
            durable,
        }
    }

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
        let value_key = (entry.copy_key.base().to_owned(), entry.version.get());
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
        let value_key = (entry.copy_key.base().to_owned(), entry.version.get());
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

    /// A direct write of `version` reached `copy_key` (applied, current, or a newer version is
    /// stored): pending entries it covers are done.
    pub fn clear_covered(&self, copy_key: &CopyKey, version: Version, tombstone: bool) {
        let mut state = self.state();
        if !state.entries.contains_key(copy_key.as_str()) {
            return;
        }
        let removed = self.remove_if(&mut state, copy_key.as_str(), |entry| {
            covers(version, tombstone, entry.version, entry.is_tombstone())
        });
        if removed {
            self.spool_complete(copy_key.as_str(), version, tombstone);
            self.publish_gauges(&state);
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

    /// Nodes whose probe is due, marked busy; and when the next one is due.
    pub(crate) fn due_nodes(&self, now: Instant) -> (Vec<NodeLabel>, Option<Instant>) {
        let mut state = self.state();
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
        let mut state = self.state();
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
                self.remove_if(&mut state, &copy_key, |_| true);
                self.metrics.retry_drop(RetryDrop::Expired);
            } else {
                writes.push(entry.write());
            }
        }
        if expired > 0 {
            self.publish_gauges(&state);
        }
        Batch { writes }
    }

    /// A retried write reached its copy: the entry is done unless a newer one replaced it.
    pub(crate) fn completed(&self, write: &CopyWrite) {
        let tombstone = matches!(write.payload, Payload::Tombstone);
        let mut state = self.state();
        let removed = self.remove_if(&mut state, write.copy_key.as_str(), |entry| {
            entry.version == write.version && entry.is_tombstone() == tombstone
        });
        if removed {
            self.spool_complete(write.copy_key.as_str(), write.version, tombstone);
            self.publish_gauges(&state);
        }
    }

    /// A retried write failed: count it on the entry.
    pub(crate) fn failed(&self, write: &CopyWrite, error: &Error) {
        let mut state = self.state();
        if let Some(entry) = state.entries.get_mut(write.copy_key.as_str()) {
            if entry.version == write.version {
                entry.attempts += 1;
                entry.last_error = Some(error.to_string());
            }
        }
    }

    /// Counts a retry attempt on the entry (a successful one).
    pub(crate) fn attempted(&self, write: &CopyWrite) {
        let mut state = self.state();
        if let Some(entry) = state.entries.get_mut(write.copy_key.as_str()) {
            entry.attempts += 1;
        }
    }

    /// The node's probe or flush ended; `ok` says whether the node answered. A node left with
    /// no entries is forgotten (logged as drained); else it backs off (after a failure) or is
    /// due at once (after a partial flush).
    pub(crate) fn node_done(&self, node: &NodeLabel, ok: bool) {
        let mut state = self.state();
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
                .config
                .backoff_initial
                .saturating_mul(2u32.saturating_pow(queue.failures.min(20)))
                .min(self.config.backoff_cap);
            queue.next_probe = Instant::now() + jitter(ceiling);
        }
    }

    /// Pending entries.
    pub fn depth(&self) -> usize {
        self.state().entries.len()
    }

    /// The view served by `GET /v1/retry-queue`, with up to `limit` entries, oldest first.
    pub fn view(&self, limit: usize) -> RetryQueueView {
        let now = Instant::now();
        let now_ms = now_unix_ms();
        let state = self.state();
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
        let state = self.state();
        let now_ms = now_unix_ms();
        let oldest = state
            .entries
            .values()
            .map(|entry| entry.queued_at_ms)
            .min()
            .map_or(0, |at| now_ms.saturating_sub(at));
        self.metrics.retry_oldest_age(oldest as f64 / 1000.0);
        self.publish_gauges(&state);
    }

    fn publish_gauges(&self, state: &State) {
        self.metrics
            .retry_queue(state.entries.len(), state.bytes, self.spool_bytes());
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
        let state = self.state();
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
        let state = self.state();
        if state.entries.is_empty() {
            tracing::info!("retry queue is empty at shutdown");
        } else {
            tracing::warn!(
                entries = state.entries.len(),
                nodes = state.nodes.len(),
                bytes = state.bytes,
                spooled = self.spool.is_some(),
                "retry queue not drained at shutdown; the rest stays in the spool"
            );
        }
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

    #[test]
    fn coalesces_per_copy_and_counts_values_once() {
        let queue = queue();
        for v in 1..=1000 {
            let enqueued = queue.enqueue(
                &key(),
                Version::new(v).unwrap(),
                &value(1000),
                vec![failed(0, "a"), failed(1, "a"), failed(2, "b")],
            );
            assert!(enqueued.admissions.iter().all(|a| *a == Admission::Queued));
        }
        let view = queue.view(10);
        assert_eq!(view.depth, 3);
        assert!(view.entries.iter().all(|entry| entry.version.get() == 1000));
        assert_eq!(
            view.bytes,
            1000 + 3 * (ENTRY_OVERHEAD_BYTES + 4 * "hot#0".len())
        );
        // An older edit arriving late is superseded by the pending newer one.
        queue.enqueue(
            &key(),
            Version::new(5).unwrap(),
            &value(10),
            vec![failed(0, "a")],
        );
        assert_eq!(queue.view(10).entries[0].version.get(), 1000);
        // A direct write of a newer version clears the pending entry; an older one does not.
        queue.clear_covered(&key().copy_key(0), Version::new(999).unwrap(), false);
        assert_eq!(queue.depth(), 3);
        queue.clear_covered(&key().copy_key(0), Version::new(1001).unwrap(), false);
        assert_eq!(queue.depth(), 2);
        // A tombstone of the same version replaces a value; a value does not replace it.
        queue.enqueue(
            &key(),
            Version::new(1000).unwrap(),
            &Payload::Tombstone,
            vec![failed(1, "a")],
        );
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        assert_eq!(batch.writes.len(), 1);
        assert_eq!(batch.writes[0].payload, Payload::Tombstone);
    }

    #[test]
    fn bounds_drop_with_a_reason() {
        let config = HealConfig {
            max_entries: 2,
            ..HealConfig::default()
        };
        let queue = RetryQueue::in_memory(config, Metrics::new());
        let enqueued = queue.enqueue(
            &key(),
            Version::new(1).unwrap(),
            &value(1),
            vec![failed(0, "a"), failed(1, "a"), failed(2, "a")],
        );
        assert_eq!(
            enqueued.admissions,
            vec![
                Admission::Queued,
                Admission::Queued,
                Admission::Dropped(DropReason::Overflow)
            ]
        );
        let mut old = failed(3, "a");
        old.expire_at_ms = now_unix_ms() - 1;
        let enqueued = queue.enqueue(&key(), Version::new(2).unwrap(), &value(1), vec![old]);
        assert_eq!(
            enqueued.admissions,
            vec![Admission::Dropped(DropReason::Expired)]
        );
    }

    #[test]
    fn a_completion_keeps_a_newer_entry() {
        let queue = queue();
        queue.enqueue(
            &key(),
            Version::new(1).unwrap(),
            &value(1),
            vec![failed(0, "a")],
        );
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        queue.enqueue(
            &key(),
            Version::new(2).unwrap(),
            &value(1),
            vec![failed(0, "a")],
        );
        queue.completed(&batch.writes[0]);
        assert_eq!(queue.view(1).entries[0].version.get(), 2);
        let batch = queue.batch(&NodeLabel::new("a"), 10);
        queue.completed(&batch.writes[0]);
        assert_eq!(queue.depth(), 0);
        assert!(queue.view(1).nodes.is_empty());
    }

    #[tokio::test]
    async fn the_spool_replays_into_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let config = HealConfig {
            spool_dir: dir.path().to_owned(),
            ..HealConfig::default()
        };
        let node_of = |_: &CopyKey| NodeLabel::new("a");
        {
            let queue = RetryQueue::open(config.clone(), 1 << 20, Metrics::new(), node_of).unwrap();
            let enqueued = queue.enqueue(
                &key(),
                Version::new(7).unwrap(),
                &value(3),
                vec![failed(0, "a"), failed(1, "a")],
            );
            let admissions = enqueued.wait_durable(&Metrics::new()).await;
            assert!(admissions.iter().all(|a| *a == Admission::Queued));
            let batch = queue.batch(&NodeLabel::new("a"), 1);
            queue.completed(&batch.writes[0]);
        }
        let mut reopened = None;
        for _ in 0..200 {
            match RetryQueue::open(config.clone(), 1 << 20, Metrics::new(), node_of) {
                Ok(queue) => {
                    reopened = Some(queue);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        let queue = reopened.expect("the spool reopens");
        assert_eq!(queue.depth(), 1);
        assert_eq!(queue.view(1).entries[0].version.get(), 7);
    }
}
