//! The lag monitor: the background task that feeds the [`LagTable`], the lag histogram and the
//! store-up gauge (its heartbeats are the one signal that reaches every node continuously).
//!
//! It sits apart from [`super::lag`] (the table the read path consults) and
//! [`super::bill`] (the counters and gauges), which both depend on the table only; the monitor
//! depends on both, so the three form no cycle.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use super::bill::RouteMetrics;
use super::lag::LagTable;
use crate::heal::StoreProbe;
use crate::store::{NodeLabel, ReplicaSet};

/// Writes heartbeats on every primary and reads them on every replica, forever.
pub struct LagMonitor {
    /// Where heartbeats go (`probe.topology`), with the ping, around failing nodes, that the
    /// store-up gauge follows while no node is known, and the primaries lacking the library.
    pub probe: StoreProbe,
    /// Where lag is recorded.
    pub table: Arc<LagTable>,
    /// This instance's heartbeat name (unique per process).
    pub instance: String,
    /// Offsets are read every this many ticks (INFO is heavier than GET).
    pub offset_every: u32,
    /// The lag histogram and store-up gauge to update.
    pub metrics: Arc<RouteMetrics>,
}

impl LagMonitor {
    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        // Two loops in one task: a topology refresh (which may connect new replicas, bounded
        // by the connect timeout) never delays a heartbeat.
        tokio::join!(self.refresh_loop(&shutdown), self.beat_loop(&shutdown));
    }

    /// Refreshes the topology at once, then every second while some primary has no replica
    /// known (Redis leaves a replica out of `CLUSTER SLOTS` until it has replicated some
    /// data) or lacks the function library (the refresh retries loading it), every 10 s
    /// otherwise.
    async fn refresh_loop(&self, shutdown: &CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                refreshed = self.probe.topology.refresh_topology() => {
                    if let Err(err) = refreshed {
                        tracing::debug!(error = %err, "topology refresh failed");
                    }
                }
            }
            let sets = self.probe.topology.topology();
            // Also look again soon while some replica has shown no heartbeat: it may have no
            // client yet (it was down when this instance started).
            let unseen = self
                .table
                .snapshot()
                .values()
                .flatten()
                .any(|lag| self.table.current(lag).is_none());
            let missing = unseen
                || sets.is_empty()
                || sets.iter().any(|set| set.replicas.is_empty())
                || !self.probe.library_missing().is_empty();
            let every = if missing {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(10)
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Every interval: heartbeats on every primary, read back on every replica.
    async fn beat_loop(&self, shutdown: &CancellationToken) {
        let mut ticker = tokio::time::interval(self.table.interval());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tick: u32 = 0;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let sets = self.probe.topology.topology();
            self.table.set_topology(&sets);
            // Heartbeats go to every primary even before replicas are known: Redis leaves a
            // replica out of CLUSTER SLOTS until it has replicated some data.
            if sets.is_empty() {
                // No node known (the embedded store, or a cluster not discovered yet): the
                // store-up gauge follows a ping, under the store's kind.
                let bound = self.table.interval().max(Duration::from_millis(5));
                let up = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    pinged = tokio::time::timeout(bound, self.probe.ping()) => {
                        matches!(pinged, Ok(Ok(())))
                    }
                };
                self.metrics
                    .store_up(&NodeLabel::new(self.probe.kind()), "primary", up);
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.beat(&sets, tick.is_multiple_of(self.offset_every.max(1))) => {}
            }
            tick = tick.wrapping_add(1);
        }
    }

    /// One round: write every primary's heartbeat, then read every replica's.
    async fn beat(&self, sets: &[ReplicaSet], offsets: bool) {
        let bound = self.table.interval().max(Duration::from_millis(5));
        let stamp = self.table.now_us();
        let writes = sets.iter().map(|set| async move {
            let written = tokio::time::timeout(
                bound,
                self.probe
                    .topology
                    .write_heartbeat(&set.primary, &self.instance, stamp),
            )
            .await;
            if let Ok(Err(err)) = &written {
                tracing::debug!(primary = %set.primary, error = %err, "heartbeat write failed");
            }
            self.metrics
                .store_up(&set.primary, "primary", matches!(written, Ok(Ok(()))));
        });
        join_all(writes).await;
        let table = self.table.snapshot();
        let reads = table.values().flatten().map(|lag| async move {
            let read = tokio::time::timeout(
                bound,
                self.probe
                    .topology
                    .read_heartbeat(&lag.replica, &self.instance),
            )
            .await;
            let stamp = match read {
                Ok(Ok(stamp)) => {
                    self.metrics.store_up(&lag.replica, "replica", true);
                    stamp
                }
                Ok(Err(err)) => {
                    tracing::debug!(replica = %lag.replica, error = %err, "heartbeat read failed");
                    self.metrics.store_up(&lag.replica, "replica", false);
                    None
                }
                Err(_) => {
                    self.metrics.store_up(&lag.replica, "replica", false);
                    None
                }
            };
            self.table.record(lag, stamp);
            if offsets {
                let gap = tokio::time::timeout(bound, async {
                    let primary = self
                        .probe
                        .topology
                        .replication_offset(&lag.primary)
                        .await
                        .ok()?;
                    let replica = self
                        .probe
                        .topology
                        .replication_offset(&lag.replica)
                        .await
                        .ok()?;
                    Some(primary.saturating_sub(replica))
                })
                .await
                .ok()
                .flatten();
                self.table.record_offset_gap(lag, gap);
            }
            self.metrics.record_lag(&self.table, lag);
        });
        join_all(reads).await;
    }
}
