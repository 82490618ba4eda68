//! Node health: which nodes are known to be failing, so publishes and reads stop waiting the
//! command timeout for them.
//!
//! [`NodeHealth`] owns the state. A node becomes *failing* when a command on it times out
//! ([`HealthStore`] sees every copy write and read), or when it misses `heal.probe_misses` probes in a
//! row: [`HealthProber`] also sends each healthy primary (every master of a cluster, or the one
//! standalone server) a `PING` every `heal.probe_interval`,
//! so a stopped primary is known failing within a few probe intervals even when no command has
//! waited out `store.command_timeout` on it yet. While it is failing, its copy writes are not sent
//! (they fail at once with [`ErrorKind::NodeFailing`], so the publisher queues them and reports
//! `queued` with the error `node_failing`), a version allocation whose counter lives there fails
//! at once (503 `unavailable`), and reads of its copies fail at once (the reader goes to the
//! siblings). [`HealthProber`] sends a cheap `PING` with a short timeout to each failing node;
//! once one answers, the node is *recovering*: writes and reads go to it again (the retry queue
//! flushes), and once the retry queue holds no entry for it, it is healthy. A node is readable
//! as soon as it is writable: a read right after a publish that landed on it is answered
//! there. What it missed while failing is guarded per copy, by the floor below.
//!
//! Monotonic reads across an outage: while the retry queue holds a pending entry for a copy,
//! that entry's version is a floor for reads of that copy, on any node: a read that finds the
//! copy below it is answered as a failed read, and the reader goes to the siblings, which hold
//! the version (the publish applied there).
//!
//! The per-read check is one relaxed atomic load while every node is healthy and the queue is
//! empty; otherwise a read-locked map lookup and, for a non-empty queue, one queue lookup.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use tokio_util::sync::CancellationToken;

use super::RetryQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::key::{CopyKey, Key, Version};
use crate::store::{
    CopyRead, CopyRecord, CopyStore, CopyWrite, LibraryStore, NodeLabel, ServedBy, TopologyStore,
    WriteResult,
};

/// How long each healthy primary may take to answer the `PING` of `/readyz` while some node is
/// failing.
pub const READY_PING_TIMEOUT: Duration = Duration::from_secs(1);

/// What is known about a node that is not healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sick {
    /// A command timed out and no probe has seen the node answer since.
    Failing,
    /// A probe saw it answer; its queued entries are not all flushed yet.
    Recovering,
}

/// The health of every node, shared by the store wrapper, the prober and `/readyz`.
#[derive(Debug, Default)]
pub struct NodeHealth {
    /// How many nodes are not healthy: the fast path of every check is this one load.
    unhealthy: AtomicUsize,
    /// The nodes that are not healthy. Never locked across an await.
    nodes: RwLock<HashMap<NodeLabel, Sick>>,
    /// The retry queue, whose pending versions are read floors (attached once it is open).
    queue: OnceLock<Arc<RetryQueue>>,
}

impl NodeHealth {
    /// A health table with every node healthy.
    pub fn new() -> Arc<NodeHealth> {
        Arc::new(NodeHealth::default())
    }

    /// Attaches the retry queue (once): its pending versions become read floors, and a
    /// recovering node is healthy once the queue holds nothing for it.
    pub fn attach_queue(&self, queue: Arc<RetryQueue>) {
        let _ = self.queue.set(queue);
    }

    /// Whether writes to `node` are not sent (it is failing).
    pub fn is_failing(&self, node: &NodeLabel) -> bool {
        self.state(node) == Some(Sick::Failing)
    }

    /// Whether reads avoid `node`: it is failing. A recovering node is read (a copy it holds
    /// below its queued version is answered as a failed read: [`HealthStore`]).
    pub fn avoids_reads(&self, node: &NodeLabel) -> bool {
        self.is_failing(node)
    }

    /// Whether `node` is healthy: neither failing nor recovering.
    pub fn is_healthy(&self, node: &NodeLabel) -> bool {
        self.state(node).is_none()
    }

    /// The nodes that are failing, then those recovering, in label order: for `/readyz` and
    /// logs.
    pub fn unhealthy(&self) -> (Vec<NodeLabel>, Vec<NodeLabel>) {
        let nodes = self.read();
        let mut failing: Vec<NodeLabel> = Vec::new();
        let mut recovering: Vec<NodeLabel> = Vec::new();
        for (node, sick) in nodes.iter() {
            match sick {
                Sick::Failing => failing.push(node.clone()),
                Sick::Recovering => recovering.push(node.clone()),
            }
        }
        failing.sort();
        recovering.sort();
        (failing, recovering)
    }

    /// Marks `node` failing; `why` says what showed it (for the log).
    pub fn mark_failing(&self, node: &NodeLabel, why: &str) {
        let mut nodes = self.write();
        if nodes.insert(node.clone(), Sick::Failing) != Some(Sick::Failing) {
            tracing::warn!(node = %node, why, "node marked failing: its copy writes queue at once and reads go to sibling copies until a probe sees it back");
        }
        self.unhealthy.store(nodes.len(), Ordering::Release);
    }

    /// Marks `node` failing when `result` is a timeout.
    fn observe<T>(&self, node: &NodeLabel, result: &Result<T>) {
        if matches!(result, Err(err) if err.kind() == ErrorKind::Timeout) {
            self.mark_failing(node, "a command timed out");
        }
    }

    /// Runs `command` on `node` unless the node is failing, when it fails at once
    /// ([`ErrorKind::NodeFailing`], naming `what`) rather than wait out the command timeout; a
    /// timeout marks the node failing. For commands outside the copy role that
    /// [`HealthStore`] guards (the scrub's scan).
    ///
    /// # Errors
    /// [`ErrorKind::NodeFailing`] when the node is failing; else `command`'s error.
    pub async fn unless_failing<T>(
        &self,
        node: &NodeLabel,
        what: impl FnOnce() -> String,
        command: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        if self.is_failing(node) {
            return Err(not_sent(node, &what()));
        }
        let result = command.await;
        self.observe(node, &result);
        result
    }

    /// The nodes that are failing or recovering (their queued copies not all flushed), in
    /// label order: for `/readyz`.
    pub fn avoided_nodes(&self) -> Vec<NodeLabel> {
        let (mut failing, recovering) = self.unhealthy();
        failing.extend(recovering);
        failing.sort();
        failing
    }

    /// Pings the store as this table sees it: every primary while every node is healthy
    /// ([`TopologyStore::ping`]); otherwise only the primaries that are not failing, each
    /// within [`READY_PING_TIMEOUT`] (the store serves around a failing node: its copies
    /// queue, its reads go to the siblings), and at once an error when every primary is
    /// failing (a PING would wait out the command timeout).
    ///
    /// # Errors
    /// [`ErrorKind::NodeFailing`] when every primary is failing; else the pings' errors.
    pub async fn ping(&self, store: &dyn TopologyStore) -> Result<()> {
        if self.unhealthy.load(Ordering::Acquire) == 0 {
            return store.ping().await;
        }
        let primaries: Vec<NodeLabel> = store
            .primaries()
            .into_iter()
            .filter(|node| !self.is_failing(node))
            .collect();
        if primaries.is_empty() {
            let (failing, _) = self.unhealthy();
            return Err(Error::new(
                ErrorKind::NodeFailing,
                format!(
                    "every primary is failing: {}",
                    failing
                        .iter()
                        .map(NodeLabel::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let pings = primaries
            .iter()
            .map(|node| store.ping_node(node, READY_PING_TIMEOUT));
        futures_util::future::join_all(pings)
            .await
            .into_iter()
            .collect()
    }

    /// A probe saw `node` answer: writes go to it again, reads wait for its queue to drain.
    fn mark_recovering(&self, node: &NodeLabel) {
        let mut nodes = self.write();
        if let Some(sick) = nodes.get_mut(node) {
            if *sick == Sick::Failing {
                tracing::info!(node = %node, "node answers again: flushing its queued copies before it takes reads back");
                *sick = Sick::Recovering;
            }
        }
    }

    /// The retry worker's final drain probes `node` with its queued writes: a failing node is
    /// let through as a recovering one (a write that times out marks it failing again).
    pub(crate) fn probe_at_shutdown(&self, node: &NodeLabel) {
        let mut nodes = self.write();
        if let Some(sick) = nodes.get_mut(node) {
            if *sick == Sick::Failing {
                tracing::info!(node = %node, "shutting down: sending the failing node's queued copies once more");
                *sick = Sick::Recovering;
            }
        }
    }

    /// `node` holds every queued copy again: it is healthy.
    fn mark_healthy(&self, node: &NodeLabel) {
        let mut nodes = self.write();
        if nodes.remove(node).is_some() {
            tracing::info!(node = %node, "node is healthy again and takes reads back");
        }
        self.unhealthy.store(nodes.len(), Ordering::Release);
    }

    /// The read floor the retry queue sets for `copy_key`: the version of its pending entry.
    fn pending_floor(&self, copy_key: &CopyKey) -> Option<Version> {
        self.queue
            .get()
            .and_then(|queue| queue.pending_version(copy_key))
    }

    fn state(&self, node: &NodeLabel) -> Option<Sick> {
        if self.unhealthy.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.read().get(node).copied()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<NodeLabel, Sick>> {
        // Every update is one insert or remove: a panic cannot leave the map inconsistent.
        self.nodes.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<NodeLabel, Sick>> {
        self.nodes.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The error of a command that was not sent because its node is failing.
fn not_sent(node: &NodeLabel, what: &str) -> Error {
    Error::new(
        ErrorKind::NodeFailing,
        format!("{what} on {node} not sent: the node is failing"),
    )
}

/// The copy role ([`CopyStore`]) of another store, consulting and feeding [`NodeHealth`]:
/// writes to a failing node and reads of a node reads avoid fail at once, every timeout marks
/// its node failing, and a read below a copy's queued version is answered as failed.
pub struct HealthStore {
    /// The store that does the work.
    inner: Arc<dyn CopyStore>,
    /// The health table this wrapper reads and feeds.
    health: Arc<NodeHealth>,
}

impl HealthStore {
    /// Wraps `inner`; every result it returns feeds `health`.
    pub fn new(inner: Arc<dyn CopyStore>, health: Arc<NodeHealth>) -> HealthStore {
        HealthStore { inner, health }
    }

    /// Marks the node failing when `result` is a timeout.
    fn observe<T>(&self, node: &NodeLabel, result: &Result<T>) {
        self.health.observe(node, result);
    }

    /// A read of `copy_key` on `node` through `read`, unless reads avoid that node; a record
    /// below the copy's pending retry version is answered as a failed read.
    async fn guarded_read(
        &self,
        copy_key: &CopyKey,
        node: NodeLabel,
        served_by: ServedBy,
        read: BoxFuture<'_, CopyRead>,
    ) -> CopyRead {
        if self.health.avoids_reads(&node) {
            return CopyRead {
                served_by,
                record: Err(not_sent(&node, &format!("read of copy {copy_key}"))),
            };
        }
        let mut answer = read.await;
        self.observe(&answer.served_by.node, &answer.record);
        if let Some(floor) = self.health.pending_floor(copy_key) {
            let behind = match &answer.record {
                Ok(Some(record)) => record.version < floor,
                Ok(None) => true,
                Err(_) => false,
            };
            if behind {
                answer.record = Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "copy {copy_key} on {} is behind its queued version {floor}",
                        answer.served_by.node
                    ),
                ));
            }
        }
        answer
    }
}

impl CopyStore for HealthStore {
    fn node_of(&self, copy_key: &CopyKey) -> NodeLabel {
        self.inner.node_of(copy_key)
    }

    fn counter_node(&self, key: &Key) -> Option<NodeLabel> {
        self.inner.counter_node(key)
    }

    fn write_copies<'a>(&'a self, writes: &'a [CopyWrite]) -> BoxFuture<'a, Vec<WriteResult>> {
        box_in_place!(async move {
            let nodes: Vec<NodeLabel> = writes
                .iter()
                .map(|write| self.inner.node_of(&write.copy_key))
                .collect();
            let skipped: Vec<bool> = nodes
                .iter()
                .map(|node| self.health.is_failing(node))
                .collect();
            let sent: Vec<CopyWrite> = writes
                .iter()
                .zip(&skipped)
                .filter(|(_, skip)| !**skip)
                .map(|(write, _)| write.clone())
                .collect();
            let mut results = if sent.is_empty() {
                Vec::new()
            } else {
                self.inner.write_copies(&sent).await
            }
            .into_iter();
            writes
                .iter()
                .zip(nodes)
                .zip(skipped)
                .map(|((write, node), skip)| {
                    if skip {
                        let error = not_sent(&node, &format!("write of copy {}", write.copy_key));
                        return WriteResult {
                            node,
                            outcome: Err(error),
                        };
                    }
                    let result = results.next().unwrap_or_else(|| WriteResult {
                        outcome: Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("no result for the write of copy {}", write.copy_key),
                        )),
                        node,
                    });
                    self.observe(&result.node, &result.outcome);
                    result
                })
                .collect()
        })
    }

    fn write_copies_synced<'a>(
        &'a self,
        writes: &'a [CopyWrite],
        replicas: u32,
        timeout_ms: u64,
    ) -> BoxFuture<'a, Vec<(WriteResult, Option<u32>)>> {
        box_in_place!(async move {
            let results = self
                .inner
                .write_copies_synced(writes, replicas, timeout_ms)
                .await;
            for (result, _) in &results {
                self.observe(&result.node, &result.outcome);
            }
            results
        })
    }

    fn read_copy<'a>(&'a self, copy_key: &'a CopyKey) -> BoxFuture<'a, CopyRead> {
        box_in_place!(async move {
            let node = self.inner.node_of(copy_key);
            let served_by = ServedBy::primary(node.clone());
            self.guarded_read(copy_key, node, served_by, self.inner.read_copy(copy_key))
                .await
        })
    }

    fn read_replica_copy<'a>(
        &'a self,
        copy_key: &'a CopyKey,
        replica: &'a NodeLabel,
    ) -> BoxFuture<'a, CopyRead> {
        box_in_place!(async move {
            let served_by = ServedBy {
                node: replica.clone(),
                role: crate::store::Role::Replica,
            };
            self.guarded_read(
                copy_key,
                replica.clone(),
                served_by,
                self.inner.read_replica_copy(copy_key, replica),
            )
            .await
        })
    }

    fn read_copy_stored<'a>(
        &'a self,
        copy_key: &'a CopyKey,
    ) -> BoxFuture<'a, Result<Option<CopyRecord>>> {
        box_in_place!(async move {
            let node = self.inner.node_of(copy_key);
            // No queued-version floor is checked here: a recovering node is left alone until
            // its queue is flushed.
            if !self.health.is_healthy(&node) {
                return Err(not_sent(&node, &format!("read of copy {copy_key}")));
            }
            let record = self.inner.read_copy_stored(copy_key).await;
            self.observe(&node, &record);
            record
        })
    }

    fn delete_copies<'a>(&'a self, copy_keys: &'a [CopyKey]) -> BoxFuture<'a, Result<u64>> {
        self.inner.delete_copies(copy_keys)
    }

    fn allocate_version<'a>(
        &'a self,
        key: &'a Key,
        ttl_ms: u64,
        floor: u64,
    ) -> BoxFuture<'a, Result<Version>> {
        box_in_place!(async move {
            let node = self.inner.counter_node(key);
            if let Some(node) = &node {
                if self.health.is_failing(node) {
                    return Err(not_sent(node, &format!("version allocation for {key}")));
                }
            }
            let result = self.inner.allocate_version(key, ttl_ms, floor).await;
            if let Some(node) = &node {
                self.observe(node, &result);
            }
            result
        })
    }
}

/// The store as `/readyz` and the lag monitor's store-up gauge see it: its kind, a ping through
/// [`NodeHealth::ping`], the primaries lacking the function library, the nodes reads avoid.
#[derive(Clone)]
pub struct StoreProbe {
    /// The store's shape and pings.
    pub topology: Arc<dyn TopologyStore>,
    /// Which primaries lack the function library.
    pub library: Arc<dyn LibraryStore>,
    /// Which nodes are failing (a fresh table, every node healthy, on the embedded store).
    pub health: Arc<NodeHealth>,
}

impl StoreProbe {
    /// The store kind: `embedded`, `redis` or `redis-cluster`.
    pub fn kind(&self) -> &'static str {
        self.topology.kind()
    }

    /// Pings the store around its failing nodes ([`NodeHealth::ping`]).
    ///
    /// # Errors
    /// As [`NodeHealth::ping`].
    pub async fn ping(&self) -> Result<()> {
        self.health.ping(&*self.topology).await
    }

    /// The primaries known to lack the function library.
    pub fn library_missing(&self) -> Vec<NodeLabel> {
        self.library.library_missing()
    }

    /// The nodes reads avoid ([`NodeHealth::avoided_nodes`]).
    pub fn avoided_nodes(&self) -> Vec<NodeLabel> {
        self.health.avoided_nodes()
    }
}

/// Probes failing nodes and returns recovered ones to service, and probes healthy primaries to
/// find a stopped one before any command waits out its timeout: the background task of
/// [`NodeHealth`].
pub struct HealthProber {
    /// The table it updates.
    pub health: Arc<NodeHealth>,
    /// The store the probes go through.
    pub store: Arc<dyn TopologyStore>,
    /// The retry queue: a recovering node is healthy once it holds nothing for it.
    pub queue: Arc<RetryQueue>,
    /// How often every failing node and every healthy primary is probed
    /// (`heal.probe_interval`).
    pub interval: Duration,
    /// How long a probe's `PING` may take before it counts as missed (`heal.probe_timeout`).
    pub timeout: Duration,
    /// How many probes in a row a healthy primary may miss before it is marked failing; 0
    /// probes no healthy primary (`heal.probe_misses`).
    pub misses_to_fail: u32,
}

impl HealthProber {
    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Healthy primaries → the probes they missed in a row (none: absent).
        let mut misses: HashMap<NodeLabel, u32> = HashMap::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => self.tick(&mut misses).await,
            }
        }
    }

    /// Whether `node` answers a `PING` within the probe timeout.
    async fn answers(&self, node: &NodeLabel) -> bool {
        let started = Instant::now();
        self.store.ping_node(node, self.timeout).await.is_ok() && started.elapsed() <= self.timeout
    }

    /// One round: a `PING` to every failing node and every healthy primary, at once; a
    /// recovering node with nothing queued becomes healthy; a healthy primary that missed
    /// `misses_to_fail` probes in a row, in rounds that count, is marked failing. With several
    /// primaries a round counts when another primary answered; a lone primary (a standalone
    /// server) has none to compare with, and its round counts unless a reference timer run
    /// beside the probes woke late (this process stalled).
    async fn tick(&self, misses: &mut HashMap<NodeLabel, u32>) {
        let (failing, recovering) = self.health.unhealthy();
        let primaries = if self.misses_to_fail == 0 {
            Vec::new()
        } else {
            self.store.primaries()
        };
        let lone_primary = primaries.len() == 1;
        let healthy: Vec<NodeLabel> = primaries
            .into_iter()
            .filter(|node| self.health.is_healthy(node))
            .collect();
        let probes = failing
            .iter()
            .map(|node| async move { (node, self.answers(node).await) });
        let sweeps = healthy
            .iter()
            .map(|node| async move { (node, self.answers(node).await) });
        // Half the probe timeout: it wakes late by more than that only when this process (or
        // its host) did not run for a while, and then a silent primary proves nothing.
        let reference = async {
            let started = Instant::now();
            tokio::time::sleep(self.timeout / 2).await;
            started.elapsed() > self.timeout
        };
        let (probed, swept, stalled) = tokio::join!(
            futures_util::future::join_all(probes),
            futures_util::future::join_all(sweeps),
            reference
        );
        for (node, answered) in probed {
            if answered {
                self.health.mark_recovering(node);
                // Its backoff may be long: let the retry worker flush it now.
                self.queue.retry_now(node);
            }
        }
        // Only the primaries probed this round keep a count: one marked failing, or gone from
        // the topology, starts again from zero.
        misses.retain(|node, _| healthy.contains(node));
        // A round in which no healthy primary answered says more about this process (a stall
        // on a loaded host) or its network than about any one node: it counts against none.
        // One stopped primary among answering ones is what this finds; when every primary
        // stops answering, command timeouts still mark them. A lone primary is judged by the
        // reference timer instead.
        let counts = if lone_primary {
            !stalled
        } else {
            swept.iter().any(|(_, answered)| *answered)
        };
        if !counts {
            return self.settle(recovering);
        }
        for (node, answered) in swept {
            if answered {
                misses.remove(node);
                continue;
            }
            let missed = misses.entry(node.clone()).or_insert(0);
            *missed += 1;
            if *missed >= self.misses_to_fail {
                misses.remove(node);
                self.health
                    .mark_failing(node, "it missed its health probes");
            }
        }
        self.settle(recovering);
    }

    /// Marks healthy each recovering node the retry queue holds nothing for.
    fn settle(&self, recovering: Vec<NodeLabel>) {
        for node in recovering {
            if self.queue.pending_on(&node) == 0 {
                self.health.mark_healthy(&node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_fails_recovers_and_turns_healthy() {
        let health = NodeHealth::default();
        let node = NodeLabel::new("127.0.0.1:1");
        let other = NodeLabel::new("127.0.0.1:2");
        assert!(!health.is_failing(&node) && !health.avoids_reads(&node));
        health.mark_failing(&node, "a test");
        assert!(health.is_failing(&node) && health.avoids_reads(&node));
        assert!(!health.avoids_reads(&other));
        health.mark_recovering(&node);
        assert!(!health.is_failing(&node), "writes go to a recovering node");
        assert!(!health.avoids_reads(&node), "and reads");
        assert!(!health.is_healthy(&node), "until its queue is flushed");
        health.mark_healthy(&node);
        assert!(health.is_healthy(&node));
        assert_eq!(health.unhealthy.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_command_on_a_failing_node_is_not_sent_and_a_timeout_marks_its_node() {
        let health = NodeHealth::default();
        let node = NodeLabel::new("127.0.0.1:1");
        let timed_out = health
            .unless_failing(&node, || "a scan".to_owned(), async {
                Err::<(), _>(Error::new(ErrorKind::Timeout, "timed out"))
            })
            .await;
        assert_eq!(timed_out.unwrap_err().kind(), ErrorKind::Timeout);
        assert!(health.is_failing(&node), "a timeout marks the node failing");
        let sent = std::sync::atomic::AtomicBool::new(false);
        let skipped = health
            .unless_failing(&node, || "a scan".to_owned(), async {
                sent.store(true, Ordering::Relaxed);
                Ok(())
            })
            .await;
        assert_eq!(skipped.unwrap_err().kind(), ErrorKind::NodeFailing);
        assert!(
            !sent.load(Ordering::Relaxed),
            "nothing is sent to a failing node"
        );
        assert_eq!(health.avoided_nodes(), vec![node]);
    }

    #[tokio::test]
    async fn the_ping_fails_at_once_when_every_primary_is_failing() {
        /// Two primaries whose pings answer only for the first.
        struct Two;
        impl TopologyStore for Two {
            fn kind(&self) -> &'static str {
                "redis-cluster"
            }
            fn topology(&self) -> Vec<crate::store::ReplicaSet> {
                Vec::new()
            }
            fn primaries(&self) -> Vec<NodeLabel> {
                vec![NodeLabel::new("a:1"), NodeLabel::new("b:1")]
            }
            fn refresh_topology(&self) -> BoxFuture<'_, Result<()>> {
                Box::pin(async { Ok(()) })
            }
            fn write_heartbeat<'a>(
                &'a self,
                _primary: &'a NodeLabel,
                _instance: &'a str,
                _stamp_us: u64,
            ) -> BoxFuture<'a, Result<()>> {
                Box::pin(async { Ok(()) })
            }
            fn read_heartbeat<'a>(
                &'a self,
                _replica: &'a NodeLabel,
                _instance: &'a str,
            ) -> BoxFuture<'a, Result<Option<u64>>> {
                Box::pin(async { Ok(None) })
            }
            fn replication_offset<'a>(
                &'a self,
                _node: &'a NodeLabel,
            ) -> BoxFuture<'a, Result<u64>> {
                Box::pin(async { Ok(0) })
            }
            fn ping(&self) -> BoxFuture<'_, Result<()>> {
                // The whole-store ping waits on every primary: the failing one does not answer.
                Box::pin(async { Err(Error::new(ErrorKind::Timeout, "b:1 timed out")) })
            }
            fn ping_node<'a>(
                &'a self,
                node: &'a NodeLabel,
                _timeout: Duration,
            ) -> BoxFuture<'a, Result<()>> {
                let answers = node.as_str() == "a:1";
                Box::pin(async move {
                    if answers {
                        Ok(())
                    } else {
                        Err(Error::new(ErrorKind::Timeout, "timed out"))
                    }
                })
            }
        }
        let health = NodeHealth::default();
        assert!(
            health.ping(&Two).await.is_err(),
            "all healthy: the whole store is pinged"
        );
        health.mark_failing(&NodeLabel::new("b:1"), "a test");
        assert!(
            health.ping(&Two).await.is_ok(),
            "the store serves around b:1"
        );
        health.mark_failing(&NodeLabel::new("a:1"), "a test");
        assert_eq!(
            health.ping(&Two).await.unwrap_err().kind(),
            ErrorKind::NodeFailing
        );
    }
}
