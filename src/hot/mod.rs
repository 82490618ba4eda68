//! Hot keys found on the read path, not predicted: each instance samples the reads it answers,
//! keeps the most read keys of each window in a fixed-size top-K table, and says which keys
//! are hot.
//!
//! - **Where it counts.** [`crate::read::Reader::read`], the one read every door calls (HTTP
//!   and the Redis protocol alike, through [`crate::ops`]): every answered read is offered with
//!   whether it reached Redis (a near-cache hit costs Redis nothing; a miss, a refresh or a
//!   read with the near cache off does). Writes are not counted.
//! - **Sampled, fixed memory, no shared lock on the hit path.** A read is sampled with
//!   probability `1 / hot_keys.sample_every` by a thread-local generator; only a sampled read
//!   takes the table's lock. The table is Space-Saving ([`topk`]) with `hot_keys.capacity`
//!   counters: every key with more than a `1 / capacity` share of a window's sampled reads holds
//!   one, and no count under-states its key.
//! - **Windows and rates.** Every `hot_keys.window` the table is swapped for an empty one and
//!   its counts become rates: `count × sample_every / window seconds`, for what clients asked
//!   and for what reached Redis, with the key's share of the window's reads and the most its
//!   rate over-states (Space-Saving's inherited error).
//! - **Hot and cool, with hysteresis.** A key is hot once its guaranteed rate (its count less
//!   the inherited error) reaches `hot_keys.threshold`; it cools once its rate has stayed below
//!   `threshold × cool_ratio` for `cool_down`. Each change is logged (INFO, with the key and
//!   its rate) and counted (`hotsplit_hot_key_changes_total{change}`); metric labels never
//!   carry key names.
//!
//! What a hot key leads to is the family's policy: without a `split` table, or with
//! `split.mode = "observe"`, it is detected and reported (`GET /v1/hot-keys`, with
//! `would_split`); with `mode = "split"` the [`crate::split`] driver, on every instance, reads
//! this detector's hot set and splits the key into copies of its own, and merges it once no
//! instance has seen it hot for the family's `split.cool_down`.

pub mod config;
pub mod topk;

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use config::HotKeysConfig;
use topk::TopK;

use crate::metrics::{register, Metrics};
use crate::store::now_unix_ms;

thread_local! {
    /// This thread's sampling generator (xorshift64; never zero).
    static SAMPLER: Cell<u64> = Cell::new(rand::random::<u64>() | 1);
}

/// Whether this read is sampled: with probability `1 / every`, from a thread-local generator
/// (no shared state).
#[inline]
fn sampled(every: u32) -> bool {
    if every <= 1 {
        return true;
    }
    SAMPLER.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        // The high 32 bits scaled to 0..every: 0 with probability 1/every.
        ((x >> 32) * u64::from(every)) >> 32 == 0
    })
}

/// Labels of `hotsplit_hot_key_changes_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ChangeLabels {
    /// `hot` or `cooled`.
    change: &'static str,
}

/// The detector's metrics.
struct HotMetrics {
    /// Reads offered to the table.
    sampled: Counter,
    /// Keys hot now.
    hot: Gauge,
    /// Keys that became hot or cooled.
    changes: Family<ChangeLabels, Counter>,
    /// The most read key's share of the last window's reads, in parts per million.
    top_share: Gauge<i64, std::sync::atomic::AtomicI64>,
}

/// One key's figures over the last closed window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KeyRate {
    /// The key.
    pub key: String,
    /// Reads per second clients asked of this instance (estimated from the samples; may
    /// over-state by `rate_error`).
    pub rate: f64,
    /// Of those, reads per second that reached Redis.
    pub store_rate: f64,
    /// The most `rate` over-states (what its counter inherited).
    pub rate_error: f64,
    /// Its share of the window's reads, 0.0..=1.0.
    pub share: f64,
    /// Whether the key is hot now.
    pub hot: bool,
    /// Since when it is hot, Unix ms.
    pub hot_since_ms: Option<u64>,
}

/// The last closed window.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Window {
    /// When it closed, Unix ms (0 before the first window closed).
    pub closed_at_ms: u64,
    /// How long it counted, seconds.
    pub seconds: f64,
    /// Reads per second this instance answered, estimated from the samples.
    pub reads_per_s: f64,
    /// Its keys, most read first, at most `hot_keys.list`.
    pub keys: Vec<KeyRate>,
    /// Keys hot now that are not among `keys` (cooling, or below the listed ones).
    pub other_hot: Vec<String>,
}

/// A key that is hot now.
#[derive(Debug, Clone)]
struct Hot {
    /// Since when, Unix ms.
    since_ms: u64,
    /// Since when its rate is below the cooling rate; `None` while above.
    below_since: Option<Instant>,
}

/// What a window's close changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The key became hot at this guaranteed rate.
    Hot(String, f64),
    /// The key cooled.
    Cooled(String),
}

/// The detector of one instance; see the module documentation.
pub struct HotKeys {
    /// The config.
    config: HotKeysConfig,
    /// This window's counts.
    table: Mutex<TopK>,
    /// The hot set and the last window.
    state: Mutex<State>,
    /// Metrics.
    metrics: HotMetrics,
}

/// The detector's state between windows.
struct State {
    /// When the current window opened.
    opened: Instant,
    /// Keys hot now.
    hot: HashMap<String, Hot>,
    /// The last closed window.
    last: Window,
}

impl HotKeys {
    /// A detector with `config`, its metrics registered in `metrics`.
    pub fn new(config: HotKeysConfig, metrics: &Metrics) -> Arc<HotKeys> {
        let hot_metrics = metrics.register_with(|registry| HotMetrics {
            sampled: register(
                registry,
                "hot_keys_sampled_reads",
                "Reads the hot-key detector sampled (one in hot_keys.sample_every)",
            ),
            hot: register(
                registry,
                "hot_keys",
                "Keys this instance finds hot now (rate at or above hot_keys.threshold, not yet cooled)",
            ),
            changes: register(
                registry,
                "hot_key_changes",
                "Keys that became hot (change=hot) or cooled (change=cooled)",
            ),
            top_share: register(
                registry,
                "hot_keys_top_share_ppm",
                "The most read key's share of the last window's reads, in parts per million",
            ),
        });
        Arc::new(HotKeys {
            table: Mutex::new(TopK::new(config.capacity)),
            state: Mutex::new(State {
                opened: Instant::now(),
                hot: HashMap::new(),
                last: Window::default(),
            }),
            config,
            metrics: hot_metrics,
        })
    }

    /// The config.
    pub fn config(&self) -> &HotKeysConfig {
        &self.config
    }

    /// Counts an answered read of `key`; `store` when it reached Redis. Takes a lock only when
    /// the read is sampled.
    #[inline]
    pub fn observe(&self, key: &str, store: bool) {
        if !self.config.enabled || !sampled(self.config.sample_every) {
            return;
        }
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .offer(key, store);
        self.metrics.sampled.inc();
    }

    /// Closes the current window at `now`: its counts become the last window's rates, and keys
    /// become hot or cool. Returns what changed (also logged and counted).
    pub fn close_window(&self, now: Instant) -> Vec<Change> {
        let table = std::mem::replace(
            &mut *self.table.lock().unwrap_or_else(PoisonError::into_inner),
            TopK::new(self.config.capacity),
        );
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let seconds = now
            .saturating_duration_since(state.opened)
            .as_secs_f64()
            .max(0.001);
        state.opened = now;
        let scale = f64::from(self.config.sample_every) / seconds;
        let total = table.total();
        let ranked = table.into_ranked();
        let cooling_rate = self.config.threshold * self.config.cool_ratio;
        let mut changes = Vec::new();
        let mut rates: HashMap<&str, f64> = HashMap::with_capacity(ranked.len());
        let now_ms = now_unix_ms();
        for counter in &ranked {
            let guaranteed = (counter.asked - counter.error) as f64 * scale;
            rates.insert(&counter.key, counter.asked as f64 * scale);
            if guaranteed >= self.config.threshold
                && !state.hot.contains_key(&*counter.key)
                && state.hot.len() < self.config.capacity
            {
                state.hot.insert(
                    counter.key.to_string(),
                    Hot {
                        since_ms: now_ms,
                        below_since: None,
                    },
                );
                changes.push(Change::Hot(counter.key.to_string(), guaranteed));
            }
        }
        let cool_down = self.config.cool_down;
        state.hot.retain(|key, hot| {
            let rate = rates.get(key.as_str()).copied().unwrap_or(0.0);
            if rate >= cooling_rate {
                hot.below_since = None;
                return true;
            }
            let below = *hot.below_since.get_or_insert(now);
            if now.saturating_duration_since(below) >= cool_down {
                changes.push(Change::Cooled(key.clone()));
                return false;
            }
            true
        });
        let keys: Vec<KeyRate> = ranked
            .iter()
            .take(self.config.list)
            .map(|counter| {
                let hot = state.hot.get(&*counter.key);
                KeyRate {
                    key: counter.key.to_string(),
                    rate: counter.asked as f64 * scale,
                    store_rate: counter.store as f64 * scale,
                    rate_error: counter.error as f64 * scale,
                    share: if total == 0 {
                        0.0
                    } else {
                        counter.asked as f64 / total as f64
                    },
                    hot: hot.is_some(),
                    hot_since_ms: hot.map(|hot| hot.since_ms),
                }
            })
            .collect();
        let mut other_hot: Vec<String> = state
            .hot
            .keys()
            .filter(|key| !keys.iter().any(|listed| &listed.key == *key))
            .cloned()
            .collect();
        other_hot.sort();
        self.metrics
            .top_share
            .set(keys.first().map_or(0, |top| (top.share * 1e6) as i64));
        self.metrics.hot.set(state.hot.len() as i64);
        state.last = Window {
            closed_at_ms: now_ms,
            seconds,
            reads_per_s: total as f64 * scale,
            keys,
            other_hot,
        };
        drop(state);
        for change in &changes {
            match change {
                Change::Hot(key, rate) => {
                    tracing::info!(key = %key, rate = *rate as u64, threshold = self.config.threshold, "hot key: its read rate reached hot_keys.threshold");
                    self.metrics
                        .changes
                        .get_or_create(&ChangeLabels { change: "hot" })
                        .inc();
                }
                Change::Cooled(key) => {
                    tracing::info!(key = %key, cool_down = ?cool_down, "hot key cooled: its read rate stayed below threshold × cool_ratio for cool_down");
                    self.metrics
                        .changes
                        .get_or_create(&ChangeLabels { change: "cooled" })
                        .inc();
                }
            }
        }
        changes
    }

    /// The last closed window.
    pub fn last_window(&self) -> Window {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last
            .clone()
    }

    /// Whether `key` is hot now.
    pub fn is_hot(&self, key: &str) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .hot
            .contains_key(key)
    }

    /// Closes a window every `hot_keys.window` until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        if !self.config.enabled {
            return;
        }
        let mut ticks = tokio::time::interval(self.config.window);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {
                    self.close_window(Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
