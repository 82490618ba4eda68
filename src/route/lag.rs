//! Replica lag, measured continuously by heartbeats.
//!
//! Every `route.heartbeat_interval` the [`super::LagMonitor`] writes this instance's heartbeat key on
//! every primary (a key whose slot that primary owns) carrying this instance's monotonic clock
//! in microseconds, then reads it back on every replica. A replica's lag is the time since the
//! newest heartbeat it has shown was written. Only this instance's own clock is compared with
//! itself, so clock skew between hosts drops out.
//!
//! # Current value versus percentiles
//! The routing gate uses the replica's *current* lag: a read is about to be served now, and
//! what matters is whether this replica, now, is within the class's budget. A replica that just
//! stalled has a fine p99 and a current lag that is already rising; a replica that recovered a
//! second ago has a bad p999 and is fine now. The window percentiles (p50, p99, p999, max over
//! `route.lag_window`) are what operators report and tune budgets with: a budget below the
//! healthy p99 sends a steady share of reads to the primary.
//!
//! A heartbeat that cannot be read is not a sample of zero: the lag keeps rising from the last
//! heartbeat seen, so an unreachable or stopped replica goes over every budget.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::store::{NodeLabel, ReplicaSet};

/// Lag not known (no heartbeat seen yet).
const UNKNOWN: u64 = u64::MAX;

/// The largest number of samples a window keeps, whatever the interval.
const MAX_SAMPLES: usize = 100_000;

/// One replica's lag state. The gate reads two atomics; the window is for reports.
#[derive(Debug)]
pub struct ReplicaLag {
    /// The replica.
    pub replica: NodeLabel,
    /// The primary it replicates.
    pub primary: NodeLabel,
    /// Lag at the last successful heartbeat read, µs; [`UNKNOWN`] before the first.
    lag_at_sample_us: AtomicU64,
    /// When that read happened, µs on the table's clock.
    sampled_at_us: AtomicU64,
    /// The newest heartbeat stamp the replica has shown, µs; [`UNKNOWN`] before the first.
    newest_stamp_us: AtomicU64,
    /// `master_repl_offset` on the primary minus `slave_repl_offset` on the replica, bytes;
    /// [`UNKNOWN`] when not read.
    offset_gap: AtomicU64,
    /// Samples `(taken at µs, lag µs)` over the window.
    window: Mutex<VecDeque<(u64, u64)>>,
}

/// A replica's figures, as `GET /v1/lag` reports them.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LagFigures {
    /// The current lag.
    pub now: Option<f64>,
    /// Window percentiles and maximum.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
    /// Maximum.
    pub max: Option<f64>,
}

/// Every replica's lag, shared by the monitor (writer) and the read path (reader).
#[derive(Debug)]
pub struct LagTable {
    /// The clock heartbeats carry.
    epoch: Instant,
    /// How often heartbeats are written and read.
    interval: Duration,
    /// How long samples are kept.
    window: Duration,
    /// Primary → its replicas' state, replaced when the topology changes.
    by_primary: RwLock<Arc<HashMap<NodeLabel, Vec<Arc<ReplicaLag>>>>>,
    /// Whether any topology set so far listed a replica. It stays set: while a failover or a
    /// refresh leaves a primary without known replicas, its reads still move back to a
    /// replica later, so moved reads keep leaving floors.
    replicated: AtomicBool,
    /// Set while the startup warm-up runs ([`super::warmup`]): a primary with no replica known
    /// yet may still get one, so its reads are `lag-unmeasured`, not `no-replica`.
    warming: AtomicBool,
}

impl LagTable {
    /// An empty table.
    pub fn new(interval: Duration, window: Duration) -> LagTable {
        LagTable {
            epoch: Instant::now(),
            interval,
            window,
            by_primary: RwLock::new(Arc::new(HashMap::new())),
            replicated: AtomicBool::new(false),
            warming: AtomicBool::new(false),
        }
    }

    /// Microseconds on this table's monotonic clock.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// The replicas of `primary` and their state.
    pub fn replicas_of(&self, primary: &NodeLabel) -> Option<Vec<Arc<ReplicaLag>>> {
        let map = self.snapshot();
        map.get(primary).filter(|set| !set.is_empty()).cloned()
    }

    /// The replicas of `primary`, calling `each` on them without cloning the list.
    pub fn with_replicas<T>(
        &self,
        primary: &NodeLabel,
        each: impl FnOnce(&[Arc<ReplicaLag>]) -> T,
    ) -> T {
        let guard = self
            .by_primary
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        each(guard.get(primary).map(Vec::as_slice).unwrap_or(&[]))
    }

    /// Every replica's state.
    pub fn snapshot(&self) -> Arc<HashMap<NodeLabel, Vec<Arc<ReplicaLag>>>> {
        self.by_primary
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether any replica was ever known: then a read a primary served may be followed by a
    /// read a replica serves.
    pub fn replicated(&self) -> bool {
        self.replicated.load(Ordering::Relaxed)
    }

    /// Whether the startup warm-up is running (see [`LagTable::set_warming`]).
    pub fn warming(&self) -> bool {
        self.warming.load(Ordering::Relaxed)
    }

    /// Starts or ends the startup warm-up: while it runs, a primary with no replica known is
    /// routed with reason `lag-unmeasured`.
    pub fn set_warming(&self, warming: bool) {
        self.warming.store(warming, Ordering::Relaxed);
    }

    /// Replaces the topology, keeping the state of replicas that stay.
    pub fn set_topology(&self, sets: &[ReplicaSet]) {
        if sets.iter().any(|set| !set.replicas.is_empty()) {
            self.replicated.store(true, Ordering::Relaxed);
        }
        let current = self.snapshot();
        let same = sets.len() == current.len()
            && sets.iter().all(|set| {
                current.get(&set.primary).is_some_and(|known| {
                    known.len() == set.replicas.len()
                        && known
                            .iter()
                            .zip(&set.replicas)
                            .all(|(a, b)| a.replica == *b)
                })
            });
        if same {
            return;
        }
        let mut by_primary = HashMap::new();
        for set in sets {
            let replicas = set
                .replicas
                .iter()
                .map(|replica| {
                    current
                        .get(&set.primary)
                        .and_then(|known| known.iter().find(|lag| lag.replica == *replica))
                        .cloned()
                        .unwrap_or_else(|| {
                            Arc::new(ReplicaLag {
                                replica: replica.clone(),
                                primary: set.primary.clone(),
                                lag_at_sample_us: AtomicU64::new(UNKNOWN),
                                sampled_at_us: AtomicU64::new(0),
                                newest_stamp_us: AtomicU64::new(UNKNOWN),
                                offset_gap: AtomicU64::new(UNKNOWN),
                                window: Mutex::new(VecDeque::new()),
                            })
                        })
                })
                .collect();
            by_primary.insert(set.primary.clone(), replicas);
        }
        *self
            .by_primary
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(by_primary);
    }

    /// The replica's current lag: the lag at the last heartbeat read plus all the time since
    /// that read. The replica holds at least what it showed then, so this is the most its data
    /// can be behind now. `None` when no heartbeat was ever seen (over every budget).
    ///
    /// Every microsecond since the read counts. An earlier rule counted only the time past the
    /// next expected read (one `route.heartbeat_interval` of grace): a replica that stalled
    /// just after a read then looked up to one interval younger than it was, and `hotsplit
    /// check` measured replica reads 290 ms stale under a 250 ms budget.
    pub fn current(&self, lag: &ReplicaLag) -> Option<Duration> {
        self.current_at(lag, self.now_us())
    }

    fn current_at(&self, lag: &ReplicaLag, now_us: u64) -> Option<Duration> {
        let at_sample = lag.lag_at_sample_us.load(Ordering::Acquire);
        if at_sample == UNKNOWN {
            return None;
        }
        let sampled_at = lag.sampled_at_us.load(Ordering::Acquire);
        let since = now_us.saturating_sub(sampled_at);
        Some(Duration::from_micros(at_sample.saturating_add(since)))
    }

    /// Records a heartbeat read on `lag`'s replica: `stamp_us` is the newest heartbeat it
    /// showed, `None` when the read failed or found none.
    pub fn record(&self, lag: &ReplicaLag, stamp_us: Option<u64>) {
        let now = self.now_us();
        if let Some(stamp) = stamp_us {
            // Lag counts from the newest heartbeat seen; a stamp from the future reads as zero.
            let newest = match lag.newest_stamp_us.load(Ordering::Acquire) {
                UNKNOWN => stamp,
                seen => seen.max(stamp),
            };
            lag.newest_stamp_us.store(newest, Ordering::Release);
            lag.lag_at_sample_us
                .store(now.saturating_sub(newest), Ordering::Release);
            lag.sampled_at_us.store(now, Ordering::Release);
        }
        if let Some(current) = self.current_at(lag, now) {
            let micros = u64::try_from(current.as_micros()).unwrap_or(u64::MAX);
            let mut window = lag.window.lock().unwrap_or_else(PoisonError::into_inner);
            window.push_back((now, micros));
            let window_us = u64::try_from(self.window.as_micros()).unwrap_or(u64::MAX);
            while window
                .front()
                .is_some_and(|(at, _)| now.saturating_sub(*at) > window_us)
                || window.len() > MAX_SAMPLES
            {
                window.pop_front();
            }
        }
    }

    /// Records the replication offset gap of `lag`'s replica, in bytes.
    pub fn record_offset_gap(&self, lag: &ReplicaLag, gap: Option<u64>) {
        lag.offset_gap
            .store(gap.unwrap_or(UNKNOWN), Ordering::Release);
    }

    /// The offset gap, if known.
    pub fn offset_gap(&self, lag: &ReplicaLag) -> Option<u64> {
        match lag.offset_gap.load(Ordering::Acquire) {
            UNKNOWN => None,
            gap => Some(gap),
        }
    }

    /// Current value, p50, p99, p999 and max over the window, in milliseconds.
    pub fn figures(&self, lag: &ReplicaLag) -> LagFigures {
        let now = self.current(lag).map(|d| d.as_secs_f64() * 1000.0);
        let mut samples: Vec<u64> = {
            let window = lag.window.lock().unwrap_or_else(PoisonError::into_inner);
            window.iter().map(|(_, micros)| *micros).collect()
        };
        samples.sort_unstable();
        let pick = |quantile: f64| -> Option<f64> {
            if samples.is_empty() {
                return None;
            }
            let rank = ((quantile * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            Some(samples[rank - 1] as f64 / 1000.0)
        };
        LagFigures {
            now,
            p50: pick(0.50),
            p99: pick(0.99),
            p999: pick(0.999),
            max: samples.last().map(|max| *max as f64 / 1000.0),
        }
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How often heartbeats are written and read.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (LagTable, Arc<ReplicaLag>) {
        let table = LagTable::new(Duration::from_millis(100), Duration::from_secs(60));
        table.set_topology(&[ReplicaSet {
            primary: NodeLabel::new("p:1"),
            replicas: vec![NodeLabel::new("r:1")],
        }]);
        let lag = table.replicas_of(&NodeLabel::new("p:1")).unwrap()[0].clone();
        (table, lag)
    }

    #[test]
    fn lag_is_unknown_until_a_heartbeat_is_seen_and_rises_without_new_ones() {
        let (table, lag) = table();
        assert_eq!(table.current(&lag), None);
        table.record(&lag, None);
        assert_eq!(table.current(&lag), None);
        // The table's clock starts at zero; let it pass the stamp used below.
        std::thread::sleep(Duration::from_millis(5));
        let now = table.now_us();
        table.record(&lag, Some(now.saturating_sub(3_000)));
        let current = table.current(&lag).unwrap();
        assert!(current >= Duration::from_millis(3), "{current:?}");
        assert!(current < Duration::from_millis(100), "{current:?}");
        // No newer heartbeat: the lag rises with the clock from the read on, not only once
        // the next read is overdue (the replica may have stalled just after this one).
        let sampled_at = lag.sampled_at_us.load(Ordering::Acquire);
        let soon = table.current_at(&lag, sampled_at + 50_000).unwrap();
        assert!(soon >= Duration::from_millis(53), "{soon:?}");
        let later = table.current_at(&lag, sampled_at + 500_000).unwrap();
        assert!(later >= Duration::from_millis(503), "{later:?}");
        let figures = table.figures(&lag);
        assert!(figures.max.unwrap() >= 3.0);
    }

    #[test]
    fn percentiles_cover_the_window() {
        let (table, lag) = table();
        for micros in 1..=1000u64 {
            lag.window.lock().unwrap().push_back((0, micros * 1000));
        }
        let figures = table.figures(&lag);
        assert_eq!(figures.p50, Some(500.0));
        assert_eq!(figures.p99, Some(990.0));
        assert_eq!(figures.p999, Some(999.0));
        assert_eq!(figures.max, Some(1000.0));
    }
}
