//! Reading the queue without changing it: the `GET /v1/retry-queue` view, the gauges, pending
//! versions as read floors, and the shutdown log line.

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;

use super::super::spool::Spool;
use super::table::Entry;
use super::RetryQueue;
use crate::key::{CopyKey, Version};
use crate::store::{now_unix_ms, NodeLabel};

/// What a node's retry loop is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Waiting for its next probe.
    Backoff,
    /// A probe or a flush is running.
    Retrying,
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

impl RetryQueue {
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
