//! Hot keys found on the read path, not predicted: each instance samples the reads it answers,
//! keeps the most read keys of each window in a fixed-size top-K table, and says which keys
//! are hot.
//!
//! - **Where it counts.** [`crate::read::Reader::read`], the one read every door calls (HTTP
//!   and the Redis protocol alike, through [`crate::ops`]): every answered read is offered with
//!   whether it reached Redis (a near-cache hit costs Redis nothing; a miss, a refresh or a
//!   read with the near cache off does). Writes are not counted.
//! - **Sampled, fixed memory, a bounded lock rate.** A read is sampled with probability `1 / k`
//!   by a thread-local generator; only a sampled read takes the table's lock, and it counts as
//!   `k` reads. `k` follows the read rate so that about `hot_keys.samples_per_s` reads a second
//!   are sampled (at least one in `hot_keys.sample_every`): chosen at each window's close from
//!   that window's rate, and doubled within a window once it has sampled twice its share (a
//!   surge). So below that rate every read counts and the counts are exact (the top of a window
//!   is its true top, ties of one read included), and above it the lock is still taken about
//!   `samples_per_s` times a second, however fast the reads come. The table is Space-Saving
//!   ([`topk`]) with `hot_keys.capacity` counters: every key with more than a `1 / capacity`
//!   share of a window's reads holds one, and no count under-states its key.
//! - **Windows and rates.** Every `hot_keys.window` the table is swapped for an empty one and
//!   its counts become rates: `count / window seconds`, for what clients asked and for what
//!   reached Redis, with the key's share of the window's reads and the most its rate
//!   over-states (Space-Saving's inherited error).
//! - **Hot and cool, with hysteresis.** A key is hot once its guaranteed count (its count less
//!   the inherited error) proves a rate of `hot_keys.threshold`: at the sampled read that makes
//!   its count in the open window reach `threshold × window` (or `threshold ×` the time the
//!   window has counted, when it runs late), so a key that turns hot is found within about
//!   `threshold ÷ its rate` windows of turning, not at the next close; or at a window's close,
//!   by its rate over the window. It cools once its rate has stayed below `threshold ×
//!   cool_ratio` for `cool_down`. Each change is logged (INFO, with the key and its rate) and
//!   counted (`hotsplit_hot_key_changes_total{change}`); metric labels never carry key names. A
//!   key found hot in the open window is listed in [`Window::other_hot`] (or marked hot among
//!   [`Window::keys`]) at once.
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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use config::HotKeysConfig;
use config::MAX_SAMPLE_EVERY;
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
    /// One read in this many is sampled now.
    sample_every: Gauge,
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
    /// Keys hot now that are not among `keys` (cooling, below the listed ones, or found hot in
    /// the window still open).
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
    /// One read in this many is sampled now (see the module documentation).
    every: AtomicU32,
    /// This window's counts.
    table: Mutex<Table>,
    /// The hot set and the last window.
    state: Mutex<State>,
    /// Metrics.
    metrics: HotMetrics,
}

/// The open window's counts.
struct Table {
    /// The counts.
    counts: TopK,
    /// When the window opened.
    opened: Instant,
    /// Reads sampled since the sampling last changed (the surge guard).
    samples: u64,
}

impl Table {
    /// An empty table of `capacity` counters, opened at `opened`.
    fn new(capacity: usize, opened: Instant) -> Table {
        Table {
            counts: TopK::new(capacity),
            opened,
            samples: 0,
        }
    }
}

/// The detector's state between windows.
struct State {
    /// Keys hot now.
    hot: HashMap<String, Hot>,
    /// The last closed window.
    last: Window,
    /// Keys found hot in the open window, reported by the next close.
    found: Vec<Change>,
}

/// `mutex`'s guard, whether or not a holder panicked (the detector's figures stay usable).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HotKeys {
    /// A detector with `config`, its metrics registered in `metrics`.
    pub fn new(config: HotKeysConfig, metrics: &Metrics) -> Arc<HotKeys> {
        let hot_metrics = metrics.register_with(|registry| HotMetrics {
            sampled: register(
                registry,
                "hot_keys_sampled_reads",
                "Reads the hot-key detector sampled (one in hotsplit_hot_keys_sample_every)",
            ),
            sample_every: register(
                registry,
                "hot_keys_sample_every",
                "One read in this many is sampled now (at least hot_keys.sample_every; more while the read rate is above hot_keys.samples_per_s)",
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
        hot_metrics.sample_every.set(i64::from(config.sample_every));
        Arc::new(HotKeys {
            every: AtomicU32::new(config.sample_every),
            table: Mutex::new(Table::new(config.capacity, Instant::now())),
            state: Mutex::new(State {
                hot: HashMap::new(),
                last: Window::default(),
                found: Vec::new(),
            }),
            config,
            metrics: hot_metrics,
        })
    }

    /// One read in this many is sampled now.
    pub fn sample_every(&self) -> u32 {
        self.every.load(Ordering::Relaxed)
    }

    /// The config.
    pub fn config(&self) -> &HotKeysConfig {
        &self.config
    }

    /// Counts an answered read of `key`; `store` when it reached Redis. Takes a lock only when
    /// the read is sampled.
    #[inline]
    pub fn observe(&self, key: &str, store: bool) {
        if !self.config.enabled {
            return;
        }
        let every = self.every.load(Ordering::Relaxed);
        if !sampled(every) {
            return;
        }
        let found = self.offer(key, store, every);
        self.metrics.sampled.inc();
        if let Some(rate) = found {
            self.found_hot(key, rate);
        }
    }

    /// Offers a sampled read standing for `every` reads to the open window; the rate its count
    /// proves when that count has just made the key hot.
    fn offer(&self, key: &str, store: bool, every: u32) -> Option<f64> {
        let config = &self.config;
        let window = config.window.as_secs_f64();
        let mut table = lock(&self.table);
        let opened = table.opened;
        let counter = table.counts.offer(key, store, u64::from(every));
        let mut found = None;
        let guaranteed = counter.guaranteed() as f64;
        if !counter.found_hot && guaranteed >= config.threshold * window {
            // A window that runs past its length (a late tick) has counted longer: the count
            // must prove the rate over the time it counted.
            let seconds = Instant::now()
                .saturating_duration_since(opened)
                .as_secs_f64()
                .max(window);
            if guaranteed >= config.threshold * seconds {
                counter.found_hot = true;
                found = Some(guaranteed / seconds);
            }
        }
        table.samples += 1;
        let share = 2.0 * f64::from(config.samples_per_s) * window;
        if config.samples_per_s > 0 && table.samples as f64 >= share {
            // A surge within the window: sample half as often until it closes.
            table.samples = 0;
            let thinner = every.saturating_mul(2).min(MAX_SAMPLE_EVERY);
            if self.every.load(Ordering::Relaxed) < thinner {
                self.every.store(thinner, Ordering::Relaxed);
                self.metrics.sample_every.set(i64::from(thinner));
            }
        }
        found
    }

    /// Makes `key` hot now, its count in the open window having proved `rate`.
    fn found_hot(&self, key: &str, rate: f64) {
        let mut state = lock(&self.state);
        if state.hot.contains_key(key) || state.hot.len() >= self.config.capacity {
            return;
        }
        let since_ms = now_unix_ms();
        state.hot.insert(
            key.to_owned(),
            Hot {
                since_ms,
                below_since: None,
            },
        );
        let last = &mut state.last;
        match last.keys.iter_mut().find(|listed| listed.key == key) {
            Some(listed) => {
                listed.hot = true;
                listed.hot_since_ms = Some(since_ms);
            }
            None => {
                let at = last
                    .other_hot
                    .binary_search_by(|other| other.as_str().cmp(key))
                    .unwrap_or_else(|at| at);
                last.other_hot.insert(at, key.to_owned());
            }
        }
        let change = Change::Hot(key.to_owned(), rate);
        state.found.push(change.clone());
        self.metrics.hot.set(state.hot.len() as i64);
        drop(state);
        self.report(&change);
    }

    /// Logs and counts `change`.
    fn report(&self, change: &Change) {
        match change {
            Change::Hot(key, rate) => {
                tracing::info!(key = %key, rate = *rate as u64, threshold = self.config.threshold, "hot key: its read rate reached hot_keys.threshold");
                self.metrics
                    .changes
                    .get_or_create(&ChangeLabels { change: "hot" })
                    .inc();
            }
            Change::Cooled(key) => {
                tracing::info!(key = %key, cool_down = ?self.config.cool_down, "hot key cooled: its read rate stayed below threshold × cool_ratio for cool_down");
                self.metrics
                    .changes
                    .get_or_create(&ChangeLabels { change: "cooled" })
                    .inc();
            }
        }
    }

    /// Closes the current window at `now`: its counts become the last window's rates, and keys
    /// become hot or cool. Returns what changed since the last close: the keys found hot while
    /// the window was open (logged and counted then), then what the close changed (logged and
    /// counted now).
    pub fn close_window(&self, now: Instant) -> Vec<Change> {
        let table = std::mem::replace(
            &mut *lock(&self.table),
            Table::new(self.config.capacity, now),
        );
        let mut state = lock(&self.state);
        let found = std::mem::take(&mut state.found);
        let seconds = now
            .saturating_duration_since(table.opened)
            .as_secs_f64()
            .max(0.001);
        let scale = 1.0 / seconds;
        let total = table.counts.total();
        let ranked = table.counts.into_ranked();
        self.adapt_sampling(total as f64 * scale);
        let cooling_rate = self.config.threshold * self.config.cool_ratio;
        let mut changes = Vec::new();
        let mut rates: HashMap<&str, f64> = HashMap::with_capacity(ranked.len());
        let now_ms = now_unix_ms();
        for counter in &ranked {
            let guaranteed = counter.guaranteed() as f64 * scale;
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
            self.report(change);
        }
        let mut all = found;
        all.extend(changes);
        all
    }

    /// Samples one read in `every`, chosen so that `reads_per_s` gives about
    /// `samples_per_s` samples a second (never fewer than one in `sample_every`).
    fn adapt_sampling(&self, reads_per_s: f64) {
        if self.config.samples_per_s == 0 {
            return;
        }
        let wanted = (reads_per_s / f64::from(self.config.samples_per_s)).ceil();
        let every = if wanted >= f64::from(MAX_SAMPLE_EVERY) {
            MAX_SAMPLE_EVERY
        } else {
            (wanted as u32).max(self.config.sample_every)
        };
        self.every.store(every, Ordering::Relaxed);
        self.metrics.sample_every.set(i64::from(every));
    }

    /// The last closed window, with the keys found hot since it closed.
    pub fn last_window(&self) -> Window {
        lock(&self.state).last.clone()
    }

    /// Whether `key` is hot now.
    pub fn is_hot(&self, key: &str) -> bool {
        lock(&self.state).hot.contains_key(key)
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
