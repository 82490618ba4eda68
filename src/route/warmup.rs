//! The readiness warm-up: at startup, `/readyz` waits until the replicas that replica-routed
//! reads may use are discovered and each has a first lag sample, for at most
//! `server.readiness_warm_up`.
//!
//! Without it an instance turned ready about 2.5 s before its first replica read: every
//! replica-routed read in between went to the primaries, a load spike on each rolling restart.
//! While the warm-up runs those reads still go to the primary, with reason `lag-unmeasured`
//! ([`super::RouteReason::LagUnmeasured`]) rather than `no-replica`, so the capacity bill says
//! why. After the bound the instance is ready anyway, and `/readyz` shows what is still missing.
//!
//! [`WarmUp`] is the state `/readyz` reads; [`WarmUpWatch`] is the background task that ends
//! the warm-up (and the lag table's `warming` flag) when nothing is pending or the bound
//! passes, whether or not anything asks `/readyz`.
//!
//! # Invariants
//! - The warm-up happens once: once ended it never starts again, so a replica lost later never
//!   turns a serving instance unready.
//! - Stores without replicas (the embedded store, a standalone Redis without `store.replicas`)
//!   and configs without replica-routed classes have no warm-up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::lag::LagTable;
use crate::store::{ReplicaSet, TopologyStore};

/// How often [`WarmUpWatch`] looks again: half the default heartbeat interval, so the warm-up
/// ends soon after the sample it waited for.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// What replica-routed reads cannot use yet: what the warm-up waits for, and what `/readyz`
/// shows as `warm_up_pending`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WarmUpPending {
    /// The cluster's topology has not been read yet (no primary is known). Absent when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub topology_unknown: bool,
    /// Cluster primaries (`host:port`) with no replica discovered yet. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub primaries_without_replicas: Vec<String>,
    /// Replicas (`host:port`) with no lag sample yet: reads they would serve go to the
    /// primary, reason `lag-unmeasured`. Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas_unmeasured: Vec<String>,
}

impl WarmUpPending {
    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        !self.topology_unknown
            && self.primaries_without_replicas.is_empty()
            && self.replicas_unmeasured.is_empty()
    }

    /// What is pending for `sets` (the store's topology) and `lag`, on a cluster when
    /// `cluster` (where a primary needs a discovered replica; a standalone primary's replicas
    /// are configured, so an empty topology means none).
    pub fn of(sets: &[ReplicaSet], lag: &LagTable, cluster: bool) -> WarmUpPending {
        let mut pending = WarmUpPending {
            topology_unknown: cluster && sets.is_empty(),
            ..WarmUpPending::default()
        };
        for set in sets {
            if set.replicas.is_empty() {
                if cluster {
                    pending
                        .primaries_without_replicas
                        .push(set.primary.to_string());
                }
                continue;
            }
            lag.with_replicas(&set.primary, |known| {
                for replica in &set.replicas {
                    let measured = known
                        .iter()
                        .find(|state| state.replica == *replica)
                        .is_some_and(|state| lag.current(state).is_some());
                    if !measured {
                        pending.replicas_unmeasured.push(replica.to_string());
                    }
                }
            });
        }
        pending.primaries_without_replicas.sort();
        pending.replicas_unmeasured.sort();
        pending
    }
}

/// Whether the instance is past its warm-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Still warming up, waiting for these.
    WarmingUp(WarmUpPending),
    /// Past the warm-up; what replica-routed reads still cannot use (empty when nothing).
    Ready(WarmUpPending),
}

/// The warm-up's state, shared by `/readyz` and [`WarmUpWatch`].
pub struct WarmUp {
    /// Where the topology comes from.
    store: Arc<dyn TopologyStore>,
    /// The lag table the monitor feeds (and whose `warming` flag this clears).
    lag: Arc<LagTable>,
    /// A cluster needs discovered replicas; a standalone primary's are configured.
    cluster: bool,
    /// Whether there is anything to wait for: some class reads replicas and the store may
    /// have some. When false nothing is ever pending.
    needed: bool,
    /// When the warm-up ends whatever is pending.
    until: Instant,
    /// Set once the warm-up has ended; never cleared.
    done: AtomicBool,
}

impl WarmUp {
    /// A warm-up of at most `bound` from now, when `replica_routed` (some class reads replicas)
    /// and `store` may have replicas; otherwise one that has already ended. Sets the lag
    /// table's `warming` flag while it runs.
    pub fn new(
        store: Arc<dyn TopologyStore>,
        lag: Arc<LagTable>,
        bound: Duration,
        replica_routed: bool,
    ) -> WarmUp {
        // The store kind is the one thing that says replicas are discovered (Cluster) rather
        // than configured (standalone): `topology()` may be empty for both until then.
        let cluster = store.kind() == "redis-cluster";
        let needed = replica_routed && (cluster || !store.topology().is_empty());
        let warming = needed && !bound.is_zero();
        lag.set_warming(warming);
        WarmUp {
            store,
            lag,
            cluster,
            needed,
            until: Instant::now() + bound,
            done: AtomicBool::new(!warming),
        }
    }

    /// What replica-routed reads cannot use yet.
    pub fn pending(&self) -> WarmUpPending {
        if !self.needed {
            return WarmUpPending::default();
        }
        WarmUpPending::of(&self.store.topology(), &self.lag, self.cluster)
    }

    /// Whether the instance is past its warm-up, ending it when nothing is pending or the
    /// bound has passed. The one call that ends it logs how (a WARN naming what is still
    /// pending when the bound ended it).
    pub fn readiness(&self) -> Readiness {
        self.settle(self.pending(), Instant::now())
    }

    /// [`WarmUp::readiness`] given what is pending at `now`.
    fn settle(&self, pending: WarmUpPending, now: Instant) -> Readiness {
        if self.done.load(Ordering::Acquire) {
            return Readiness::Ready(pending);
        }
        if !pending.is_empty() && now < self.until {
            return Readiness::WarmingUp(pending);
        }
        if !self.done.swap(true, Ordering::AcqRel) {
            self.lag.set_warming(false);
            if pending.is_empty() {
                tracing::info!(
                    "readiness warm-up complete: every replica is discovered and measured"
                );
            } else {
                tracing::warn!(
                    topology_unknown = pending.topology_unknown,
                    primaries_without_replicas = ?pending.primaries_without_replicas,
                    replicas_unmeasured = ?pending.replicas_unmeasured,
                    "server.readiness_warm_up passed with replicas still pending: ready anyway; reads they would serve go to the primary until they are measured"
                );
            }
        }
        Readiness::Ready(pending)
    }

    /// Whether the warm-up has ended.
    #[cfg(test)]
    pub(crate) fn has_ended(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// Ends the warm-up when nothing is pending or its bound passes, whether or not anything asks
/// `/readyz`.
pub struct WarmUpWatch {
    /// The warm-up to end.
    pub warm_up: Arc<WarmUp>,
}

impl WarmUpWatch {
    /// Runs until the warm-up has ended or `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        while matches!(self.warm_up.readiness(), Readiness::WarmingUp(_)) {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeLabel;

    fn lag_table() -> Arc<LagTable> {
        Arc::new(LagTable::new(
            Duration::from_millis(100),
            Duration::from_secs(60),
        ))
    }

    fn set(primary: &str, replicas: &[&str]) -> ReplicaSet {
        ReplicaSet {
            primary: NodeLabel::new(primary),
            replicas: replicas.iter().copied().map(NodeLabel::new).collect(),
        }
    }

    #[test]
    fn a_cluster_waits_for_a_replica_per_primary_and_a_sample_per_replica() {
        let lag = LagTable::new(Duration::from_millis(100), Duration::from_secs(60));
        let unknown = WarmUpPending::of(&[], &lag, true);
        assert!(unknown.topology_unknown && !unknown.is_empty());
        // A standalone primary without configured replicas has nothing to wait for.
        assert!(WarmUpPending::of(&[], &lag, false).is_empty());
        assert!(WarmUpPending::of(&[set("p:1", &[])], &lag, false).is_empty());

        let sets = [set("p:1", &["r:1"]), set("p:2", &[])];
        lag.set_topology(&sets);
        let pending = WarmUpPending::of(&sets, &lag, true);
        assert_eq!(pending.primaries_without_replicas, vec!["p:2".to_owned()]);
        assert_eq!(pending.replicas_unmeasured, vec!["r:1".to_owned()]);

        let sets = [set("p:1", &["r:1"]), set("p:2", &["r:2"])];
        lag.set_topology(&sets);
        let measured = lag.replicas_of(&NodeLabel::new("p:1")).unwrap()[0].clone();
        lag.record(&measured, Some(lag.now_us()));
        let pending = WarmUpPending::of(&sets, &lag, true);
        assert!(pending.primaries_without_replicas.is_empty());
        assert_eq!(pending.replicas_unmeasured, vec!["r:2".to_owned()]);
        // A failed heartbeat read is no sample.
        let failing = lag.replicas_of(&NodeLabel::new("p:2")).unwrap()[0].clone();
        lag.record(&failing, None);
        assert!(!WarmUpPending::of(&sets, &lag, true).is_empty());
        lag.record(&failing, Some(lag.now_us()));
        assert!(WarmUpPending::of(&sets, &lag, true).is_empty());
    }

    #[test]
    fn the_warm_up_ends_when_nothing_is_pending_or_at_its_bound_and_only_once() {
        let store: Arc<dyn TopologyStore> = Arc::new(crate::store::memory::MemoryStore::new());
        let lag = lag_table();
        let start = Instant::now();
        let warm_up = |bound: Duration| {
            lag.set_warming(true);
            WarmUp {
                store: store.clone(),
                lag: lag.clone(),
                cluster: false,
                needed: true,
                until: start + bound,
                done: AtomicBool::new(false),
            }
        };
        let unmeasured = WarmUpPending {
            replicas_unmeasured: vec!["r:1".to_owned()],
            ..WarmUpPending::default()
        };
        // Pending and within the bound: warming up, and reads are `lag-unmeasured`.
        let bounded = warm_up(Duration::from_secs(5));
        assert_eq!(
            bounded.settle(unmeasured.clone(), start),
            Readiness::WarmingUp(unmeasured.clone())
        );
        assert!(!bounded.has_ended() && lag.warming());
        // The bound passes with the replica still pending: ready, naming it.
        let late = start + Duration::from_secs(5);
        assert_eq!(
            bounded.settle(unmeasured.clone(), late),
            Readiness::Ready(unmeasured.clone())
        );
        assert!(bounded.has_ended() && !lag.warming());
        // Ended stays ended, even if something is pending again early on the clock.
        assert_eq!(
            bounded.settle(unmeasured.clone(), start),
            Readiness::Ready(unmeasured.clone())
        );
        assert!(!lag.warming());
        // Nothing pending ends it before the bound.
        let measured = warm_up(Duration::from_secs(5));
        assert_eq!(
            measured.settle(WarmUpPending::default(), start),
            Readiness::Ready(WarmUpPending::default())
        );
        assert!(measured.has_ended() && !lag.warming());
    }

    #[test]
    fn the_embedded_store_has_no_warm_up_and_an_ended_one_stays_ended() {
        let store: Arc<dyn TopologyStore> = Arc::new(crate::store::memory::MemoryStore::new());
        let lag = lag_table();
        let warm_up = WarmUp::new(store, lag.clone(), Duration::from_secs(60), true);
        assert!(warm_up.has_ended());
        assert!(!lag.warming());
        assert_eq!(
            warm_up.readiness(),
            Readiness::Ready(WarmUpPending::default())
        );
    }
}
