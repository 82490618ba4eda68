//! The retry queue: failed copy writes waiting to be retried, coalesced per copy, grouped per
//! node, bounded, and mirrored to the [`Spool`].
//!
//! Every mutation happens under one mutex and, when it must survive a crash, sends its spool
//! record while that mutex is held, so the spool's order is the queue's order. Nothing awaits
//! while the mutex is held.
//!
//! This file holds the queue's handle, its shared core and its lifecycle (make, open, close).
//! The rest is one job per file:
//! - `table`: the entries under the lock: one per copy (the highest version), grouped per
//!   node, values counted once against the byte bound.
//! - `enqueue`: the publisher's side: offering failed copies, each answered `queued` only once
//!   a synced spool record holds it, and clearing the entries a direct write covered.
//! - `durable`: keeping the spool in step: replay at startup, completion records, the reset of
//!   a drained spool, compaction.
//! - `schedule`: the retry worker's side: which nodes are due, their batches, and the
//!   exponential backoff with full jitter.
//! - `view`: reading the queue: `GET /v1/retry-queue`, the gauges, read floors, the shutdown
//!   log line.

mod durable;
mod enqueue;
mod schedule;
mod table;
#[cfg(test)]
mod test_util;
mod view;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::config::HealConfig;
#[cfg(test)]
use super::spool;
use super::spool::{Replay, Spool};
use crate::error::Result;
use crate::key::CopyKey;
use crate::metrics::Metrics;
use crate::store::NodeLabel;

use table::State;
pub use table::ENTRY_OVERHEAD_BYTES;
pub use view::{EntryView, NodeState, NodeView, RetryQueueView};

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
    /// [`ErrorKind::Io`](crate::error::ErrorKind::Io) when the spool cannot be opened, is
    /// locked by another process, or a record names an invalid key.
    pub fn open(
        config: HealConfig,
        max_value_bytes: usize,
        metrics: Arc<Metrics>,
        node_of: impl Fn(&CopyKey) -> NodeLabel,
    ) -> Result<RetryQueue> {
        // The largest record: a value, its key, and up to 1024 (index, expiry) pairs.
        let max_frame = max_value_bytes + 64 * 1024;
        let (spool, replay) = Spool::open(&config.spool_dir, max_frame, metrics.spool_syncs())?;
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

    /// Closes the spool (everything recorded so far is synced) and releases its lock, so
    /// another process may take the directory. Later enqueues are reported `dropped`.
    pub async fn close(&self) {
        if let Some(spool) = &self.spool {
            spool.close().await;
        }
    }
}
