//! The near cache: recent copies held in this instance's memory, served within each read
//! class's measured age bound, never going backwards.
//!
//! An entry is one copy `K#i` (per copy, not per key, because the affine invariant is per
//! copy): its record (version, value or tombstone, absolute expiry `exp`), the node that served
//! it and why, and `as_of`, the instant the copy was at least that new on its primary: the
//! instant its Redis read began, minus the measured lag of the replica it came from (0 for a
//! primary). An entry's *age bound* at `now` is `now - as_of`, so the lag at fill and the age
//! since are one number, and a read of a class may be answered from the entry only while that
//! bound is within the class's `near_cache_max_age` (never above the class's staleness budget,
//! see `route::classes`).
//!
//! # Invariants
//! - **An entry only moves forward.** An offer replaces the entry of its copy only with a
//!   newer version, a tombstone of the same version, or the same version known new at a later
//!   instant. A compare-and-replace runs under one of [`STRIPES`] mutexes chosen by the copy key.
//! - **A copy never goes back below what this instance served.** When the byte bound evicts an
//!   entry, its version stays as a high-water record (bounded too, by an eighth of
//!   `near_cache.max_bytes`) and is recorded into the high-water sketch ([`crate::sketch::MaxSketch`]: fixed
//!   memory, a thirty-second of `near_cache.max_bytes`, never evicted, only over-states). The
//!   floor of a copy is its entry's version, else its record's, else the sketch's; a fill below
//!   it is not cached, and the reader re-reads the primary or a sibling (`read::near`). All
//!   three expire with the copy's `exp`, after which versions may start lower again (an expired
//!   tombstone or counter). A rollback (every copy found below the floor) leaves a record that
//!   says "no floor" over the sketch's, until the copy is cached again.
//! - **Writes through this instance are seen at once.** A publish or invalidate offers every
//!   copy it applied (an invalidation offers a tombstone entry rather than removing one), so an
//!   older read still in flight cannot put the older value back.
//! - **Never served after `exp`**, whatever the class's max age.
//!
//! # Layout
//! - `config`: [`NearCacheConfig`], `[near_cache]`.
//! - `flight`: single-flight fills, spawned on the service's task tracker.
//! - `metrics`: [`NearMetrics`].

pub mod config;
pub mod flight;
pub mod metrics;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};
use serde::Serialize;
use tokio_util::task::TaskTracker;

use crate::sketch::MaxSketch;
pub use config::NearCacheConfig;
use flight::Flights;
pub use flight::{Filled, Filling, Flight};
pub use metrics::{EvictionCause, NearMetrics};

use crate::key::{CopyKey, Version};
use crate::route::{ReadClass, RouteReason};
use crate::store::{now_unix_ms, CopyRecord, Payload, ServedBy};

/// One reading of both clocks a read decides by: the wall clock (expiries and floors, in Unix
/// milliseconds) and the monotonic one (an entry's age). A read takes one at its start; the
/// Redis door's hits answered inline one after another share one (`crate::resp`'s `conn`).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// The wall clock, Unix milliseconds.
    pub unix_ms: u64,
    /// The monotonic clock.
    pub instant: Instant,
}

impl Now {
    /// Reads both clocks.
    pub fn read() -> Now {
        Now {
            unix_ms: now_unix_ms(),
            instant: Instant::now(),
        }
    }
}

/// How many mutexes serialise compare-and-replace offers (by copy key hash). Offers come from
/// fills and writes, not hits, so a few dozen keep unrelated copies apart.
pub const STRIPES: usize = 64;

/// The bytes an entry is counted for besides its copy key and value: the record, the `Arc`,
/// the served-by label's reference, the key's and the value's own allocations, the cache's slot
/// and table, and the allocator's share after churn. Measured, not summed from type sizes: a
/// flood of 300,000 distinct 64-byte values through a 32 MiB cache (section 2b of
/// `scripts/bench-side-by-side.sh`) grew the process by 542 bytes per entry held while 160 was
/// counted, so RSS went past `max_bytes` + 64 MiB (102.7 MiB); counted at 448, the same flood
/// held 63,928 entries and RSS stayed at 73.4 MiB, under that bound.
const ENTRY_OVERHEAD: u64 = 448;

/// The bytes a high-water record is counted for besides its copy key.
const MARK_OVERHEAD: u64 = 64;

/// One copy held in memory.
#[derive(Debug)]
pub struct Entry {
    /// What the copy held.
    pub record: CopyRecord,
    /// The node that served it.
    pub served_by: ServedBy,
    /// Why that node served it.
    pub reason: RouteReason,
    /// The copy was at least this new on its primary at this instant: the start of the read
    /// that filled it, minus the source's measured lag.
    pub as_of: Instant,
    /// How long the Redis read that filled the entry took (zero when not known: an entry a
    /// write through this instance offered, with no earlier fill of the copy to go by). A
    /// refresh starts this long before the entry ages out, up to `near_cache.refresh_lead_max`
    /// of the max age.
    pub fill_time: Duration,
    /// Reads answered from this copy's entries, carried over when an entry is replaced: the
    /// "hottest copies" of `GET /v1/near-cache`.
    hits: AtomicU64,
    /// The bytes counted for the entry (fixed: the cache requires a constant weight).
    weight: u64,
}

impl Entry {
    /// The entry's age bound at `now`: the source's lag at fill plus the time since.
    pub fn age_bound(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.as_of)
    }

    /// Whether this entry, as a replacement, comes after `held`: a newer version, a tombstone
    /// over a value of its version (tombstones win ties, as in the compare-and-set), or the same
    /// version and kind known new at a later instant.
    fn supersedes(&self, held: &Entry) -> bool {
        let (new, old) = (&self.record, &held.record);
        if new.version != old.version {
            return new.version > old.version;
        }
        match (&new.payload, &old.payload) {
            (Payload::Tombstone, Payload::Value(_)) => true,
            (Payload::Value(_), Payload::Tombstone) => false,
            _ => self.as_of > held.as_of,
        }
    }
}

/// The version a copy reached here, kept after its entry was evicted.
#[derive(Debug, Clone, Copy)]
struct Mark {
    /// The highest version held; `None` after a rollback, so the sketch's floor (which cannot
    /// be lowered) is not consulted for the copy until it is cached again.
    version: Option<Version>,
    /// The copy's `exp`: past it, the record is void.
    expire_at_ms: u64,
}

/// Counts an entry's bytes.
#[derive(Debug, Clone, Copy)]
struct EntryWeight;

impl Weighter<String, Arc<Entry>> for EntryWeight {
    fn weight(&self, _key: &String, entry: &Arc<Entry>) -> u64 {
        entry.weight
    }
}

/// Counts a high-water record's bytes.
#[derive(Debug, Clone, Copy)]
struct MarkWeight;

impl Weighter<String, Mark> for MarkWeight {
    fn weight(&self, key: &String, _mark: &Mark) -> u64 {
        key.len() as u64 + MARK_OVERHEAD
    }
}

/// The high-water records.
type Marks = Cache<String, Mark, MarkWeight, DefaultHashBuilder, OnMarkEvict>;

/// Counts high-water records pushed out by their bound.
#[derive(Debug, Clone)]
struct OnMarkEvict {
    /// The metrics.
    metrics: NearMetrics,
}

impl Lifecycle<String, Mark> for OnMarkEvict {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), _key: String, _mark: Mark) {
        self.metrics.evicted(EvictionCause::HighWater);
    }
}

/// Keeps an evicted entry's version as a high-water record and in the sketch.
#[derive(Debug, Clone)]
struct OnEntryEvict {
    /// Where the record goes.
    marks: Arc<Marks>,
    /// Where the version goes too, to outlive the record.
    sketch: Arc<MaxSketch>,
    /// The metrics.
    metrics: NearMetrics,
}

impl Lifecycle<String, Arc<Entry>> for OnEntryEvict {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), key: String, entry: Arc<Entry>) {
        // Runs under the entry cache's shard lock; the record cache has locks of its own and
        // never calls back, so the two never wait on each other in opposite orders.
        self.metrics.evicted(EvictionCause::Capacity);
        keep_mark(&self.marks, &self.sketch, key, &entry);
    }
}

/// Keeps the version of `entry`, leaving the cache under `key`, as a high-water record and in
/// the sketch (until its copy expires): a later fill never goes below it.
fn keep_mark(marks: &Marks, sketch: &MaxSketch, key: String, entry: &Entry) {
    let now_ms = now_unix_ms();
    if entry.record.expire_at_ms > now_ms {
        sketch.record(
            &key,
            entry.record.version,
            entry.record.expire_at_ms,
            now_ms,
        );
        marks.insert(
            key,
            Mark {
                version: Some(entry.record.version),
                expire_at_ms: entry.record.expire_at_ms,
            },
        );
    }
}

/// What a lookup found for a read of one class.
#[derive(Debug)]
pub enum Lookup {
    /// An entry young enough for the class, with its age bound now.
    Fresh(Arc<Entry>, Duration),
    /// No entry, or one past its `exp` or older than the class accepts.
    Stale,
}

/// One of the hottest copies, as `GET /v1/near-cache` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HotCopy {
    /// The copy key, `K#i`.
    pub copy_key: String,
    /// Reads answered from this copy's entries since it entered the cache.
    pub hits: u64,
    /// The version held.
    #[schema(value_type = u64)]
    pub version: Version,
    /// Whether the entry is a tombstone.
    pub tombstone: bool,
    /// The entry's age bound now, in milliseconds.
    pub age_ms: u64,
    /// The node that served the fill (`host:port;role=…`).
    pub served_by: String,
}

/// `GET /v1/near-cache`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NearCacheView {
    /// Whether reads use the near cache (off on the embedded store or by config).
    pub enabled: bool,
    /// Entries held.
    pub entries: u64,
    /// Bytes counted for the entries.
    pub bytes: u64,
    /// The entries' byte bound, `near_cache.max_bytes`.
    pub max_bytes: u64,
    /// High-water records of evicted entries held.
    pub high_water_records: u64,
    /// The bytes of the high-water sketch (fixed: a thirty-second of `max_bytes`).
    pub high_water_sketch_bytes: u64,
    /// Floors the sketch gave a copy that had neither entry nor record (each one may have sent
    /// a read to the primary or a sibling).
    pub high_water_sketch_floors: u64,
    /// Reads answered from the cache.
    pub hits: u64,
    /// Reads that started a fill.
    pub misses: u64,
    /// Reads that waited for a fill another read started.
    pub coalesced: u64,
    /// Reads whose floor the entry did not meet, sent to Redis.
    pub floor_reads: u64,
    /// hits / (hits + misses + coalesced + floor_reads), 0 before any read.
    pub hit_ratio: f64,
    /// The copies with the most hits, most first: which keys are hot right now.
    pub hottest: Vec<HotCopy>,
}

impl NearCacheView {
    /// The view of an instance whose reads use no near cache.
    pub fn off() -> NearCacheView {
        NearCacheView {
            enabled: false,
            entries: 0,
            bytes: 0,
            max_bytes: 0,
            high_water_records: 0,
            high_water_sketch_bytes: 0,
            high_water_sketch_floors: 0,
            hits: 0,
            misses: 0,
            coalesced: 0,
            floor_reads: 0,
            hit_ratio: 0.0,
            hottest: Vec::new(),
        }
    }
}

/// The near cache of one instance. Shared by the reader and the publisher.
pub struct NearCache {
    /// Copy key → its entry, bounded by bytes.
    entries: Cache<String, Arc<Entry>, EntryWeight, DefaultHashBuilder, OnEntryEvict>,
    /// Copy key → the version of an evicted entry.
    marks: Arc<Marks>,
    /// The versions of evicted entries in fixed memory, for when their records are gone too.
    sketch: Arc<MaxSketch>,
    /// Floors the sketch gave (`high_water_sketch_floors`).
    sketch_floors: AtomicU64,
    /// Serialises the compare-and-replace of one copy's entry.
    stripes: Box<[Mutex<()>]>,
    /// Hashes copy keys to stripes.
    stripe_hasher: DefaultHashBuilder,
    /// Fills in flight, on the service's task tracker.
    flights: Flights,
    /// Refresh-ahead's largest lead, as a share of a class's max age (0: no refresh-ahead).
    refresh_lead_max: f64,
    /// The entries' byte bound.
    max_bytes: u64,
    /// Counters.
    metrics: NearMetrics,
}

impl std::fmt::Debug for NearCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NearCache")
            .field("entries", &self.entries.len())
            .field("bytes", &self.entries.weight())
            .finish_non_exhaustive()
    }
}

/// What a read (or a write) found of one copy, offered to the cache ([`NearCache::offer`]).
#[derive(Debug, Clone)]
pub struct Offer {
    /// The copy's record.
    pub record: CopyRecord,
    /// Who served it.
    pub served_by: ServedBy,
    /// Why the read went there.
    pub reason: RouteReason,
    /// The moment the record is known to have been current.
    pub as_of: Instant,
    /// How long the read took; `None` for a write's record (the entry keeps the held entry's
    /// fill time).
    pub fill_time: Option<Duration>,
}

impl NearCache {
    /// An empty cache bounded by `config.max_bytes`, running fills on `tracker`.
    pub fn new(config: &NearCacheConfig, metrics: NearMetrics, tracker: TaskTracker) -> NearCache {
        let mark_bytes = (config.max_bytes / 8).max(1);
        let marks = Arc::new(Marks::with(
            usize::try_from(mark_bytes / 128)
                .unwrap_or(usize::MAX)
                .max(64),
            mark_bytes,
            MarkWeight,
            DefaultHashBuilder::default(),
            OnMarkEvict {
                metrics: metrics.clone(),
            },
        ));
        let sketch = Arc::new(MaxSketch::with_bytes(config.max_bytes / 32, 64));
        let entries = Cache::with(
            usize::try_from(config.max_bytes / 512)
                .unwrap_or(usize::MAX)
                .max(64),
            config.max_bytes,
            EntryWeight,
            DefaultHashBuilder::default(),
            OnEntryEvict {
                marks: marks.clone(),
                sketch: sketch.clone(),
                metrics: metrics.clone(),
            },
        );
        if let Some(share) = config.refresh_ahead {
            tracing::warn!(
                refresh_ahead = share,
                refresh_lead_max = config.refresh_lead_max,
                "near_cache.refresh_ahead is no longer used and is ignored: refresh-ahead starts one fill time before an entry ages out, capped by near_cache.refresh_lead_max; remove the field"
            );
        }
        NearCache {
            entries,
            marks,
            sketch,
            sketch_floors: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            stripe_hasher: DefaultHashBuilder::default(),
            flights: Flights::new(tracker),
            refresh_lead_max: config.refresh_lead_max,
            max_bytes: config.max_bytes,
            metrics,
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &NearMetrics {
        &self.metrics
    }

    /// The entry of `copy_key` if a read accepting `max_age` may be answered from it now.
    pub fn lookup(&self, copy_key: &CopyKey, max_age: Duration) -> Lookup {
        self.lookup_text(copy_key.as_str(), max_age)
    }

    /// [`NearCache::lookup`] by the copy key's text (`K#i`), for a caller that has no
    /// [`CopyKey`] at hand.
    pub fn lookup_text(&self, copy_key: &str, max_age: Duration) -> Lookup {
        self.lookup_text_at(copy_key, max_age, Now::read())
    }

    /// [`NearCache::lookup_text`] as of `now`: the entry's expiry and age by that clock.
    pub fn lookup_text_at(&self, copy_key: &str, max_age: Duration, now: Now) -> Lookup {
        let Some(entry) = self.entries.get(copy_key) else {
            return Lookup::Stale;
        };
        if entry.record.expire_at_ms <= now.unix_ms {
            return Lookup::Stale;
        }
        let age = entry.age_bound(now.instant);
        if age > max_age {
            return Lookup::Stale;
        }
        Lookup::Fresh(entry, age)
    }

    /// Counts a read of `class` answered from `entry` with age bound `age`.
    pub fn served(&self, entry: &Entry, class: ReadClass, age: Duration) {
        entry.hits.fetch_add(1, Ordering::Relaxed);
        self.metrics.served(class, age);
    }

    /// Whether a hit of `entry` at age bound `age`, for a class accepting `max_age`, should
    /// refresh the entry in the background: once the entry is within its lead of ageing out,
    /// the lead being its own fill time capped at `near_cache.refresh_lead_max` of `max_age`.
    /// The refresh then lands about when the entry ages out, and the copy is re-read at most
    /// once per `max_age − lag − lead` (an entry with no known fill time is not refreshed
    /// ahead: the first read after it ages out fills it).
    pub fn refresh_due(&self, entry: &Entry, age: Duration, max_age: Duration) -> bool {
        let lead = entry.fill_time.min(max_age.mul_f64(self.refresh_lead_max));
        !lead.is_zero() && age.saturating_add(lead) >= max_age
    }

    /// The highest version this instance holds or held for `copy_key` whose `exp` has not
    /// passed, or more (the sketch's floor, when entry and record are both gone): a fill below
    /// it would send a reader back.
    pub fn high_water(&self, copy_key: &CopyKey) -> Option<Version> {
        let now_ms = now_unix_ms();
        let key = copy_key.as_str();
        if let Some(entry) = self.entries.peek(key) {
            if entry.record.expire_at_ms > now_ms {
                return Some(entry.record.version);
            }
        }
        if let Some(mark) = self.marks.peek(key) {
            if mark.expire_at_ms > now_ms {
                return mark.version;
            }
        }
        let floor = self.sketch.floor(key, now_ms).map(|floor| floor.version);
        if floor.is_some() {
            self.sketch_floors.fetch_add(1, Ordering::Relaxed);
        }
        floor
    }

    /// Offers what a read of `copy_key` found, as of `as_of`, and how long the read took
    /// (`None` for a write's record: the entry keeps the held entry's fill time): it becomes the
    /// entry unless the entry held comes after it or it is below the copy's high-water record.
    /// Returns whether it was taken.
    pub fn offer(&self, copy_key: &CopyKey, offer: Offer) -> bool {
        let Offer {
            record,
            served_by,
            reason,
            as_of,
            fill_time,
        } = offer;
        let now_ms = now_unix_ms();
        if record.expire_at_ms <= now_ms {
            return false;
        }
        let key = copy_key.as_str();
        let value_bytes = match &record.payload {
            Payload::Value(value) => value.len() as u64,
            Payload::Tombstone => 0,
        };
        let mut entry = Entry {
            record,
            served_by,
            reason,
            as_of,
            fill_time: fill_time.unwrap_or_default(),
            hits: AtomicU64::new(0),
            weight: key.len() as u64 + value_bytes + ENTRY_OVERHEAD,
        };
        let stripe = self.stripe(key);
        let guard = stripe.lock().unwrap_or_else(PoisonError::into_inner);
        match self.entries.peek(key) {
            Some(held) if held.record.expire_at_ms > now_ms => {
                if !entry.supersedes(&held) {
                    return false;
                }
                entry.hits = AtomicU64::new(held.hits.load(Ordering::Relaxed));
                if fill_time.is_none() {
                    entry.fill_time = held.fill_time;
                }
            }
            _ => {
                if let Some(mark) = self.marks.peek(key) {
                    if mark.expire_at_ms > now_ms
                        && mark.version.is_some_and(|mark| entry.record.version < mark)
                    {
                        return false;
                    }
                    self.marks.remove(key);
                }
            }
        }
        self.entries.insert(key.to_owned(), Arc::new(entry));
        drop(guard);
        self.update_gauges();
        true
    }

    /// Drops the entry and high-water record of `copy_key`, after a read found every copy below
    /// them (a rollback): the next fill takes what the copies hold now. While the sketch still
    /// holds a floor for the copy, a record saying "no floor" stands in front of it.
    pub fn forget(&self, copy_key: &CopyKey) {
        let key = copy_key.as_str();
        let stripe = self.stripe(key);
        let guard = stripe.lock().unwrap_or_else(PoisonError::into_inner);
        self.entries.remove(key);
        match self.sketch.floor_until(key, now_unix_ms()) {
            Some(expire_at_ms) => self.marks.insert(
                key.to_owned(),
                Mark {
                    version: None,
                    expire_at_ms,
                },
            ),
            None => {
                self.marks.remove(key);
            }
        }
        drop(guard);
        self.metrics.rollbacks.inc();
        self.metrics.evicted(EvictionCause::Rollback);
        self.update_gauges();
    }

    /// Drops the entry of `copy_key` (the invalidation feed said the copy changed), keeping its
    /// version as a high-water record, as an eviction does: the next fill never goes below it.
    pub fn drop_entry(&self, copy_key: &str) {
        let stripe = self.stripe(copy_key);
        let guard = stripe.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((key, entry)) = self.entries.remove(copy_key) {
            keep_mark(&self.marks, &self.sketch, key, &entry);
        }
        drop(guard);
        self.update_gauges();
    }

    /// Drops every entry (the feed cannot vouch for any), keeping each one's version as a
    /// high-water record; answers how many.
    pub fn drop_all(&self) -> usize {
        let keys: Vec<String> = self.entries.iter().map(|(key, _)| key).collect();
        for key in &keys {
            self.drop_entry(key);
        }
        keys.len()
    }

    /// The fill of `copy_key` from `source` in flight; else, for a miss of a read accepting
    /// `max_age`, the entry a fill that just ended left (looked up again under the fills'
    /// lock, so a miss racing a fill's end makes no second Redis read); else a new fill from
    /// `start`. A refresh, which fills a fresh entry on purpose, passes `None`.
    pub fn fill(
        &self,
        copy_key: &CopyKey,
        source: &crate::store::NodeLabel,
        max_age: Option<Duration>,
        start: impl FnOnce() -> BoxFuture<'static, Filled>,
    ) -> Flight<(Arc<Entry>, Duration)> {
        let landed = || match self.lookup(copy_key, max_age?) {
            Lookup::Fresh(entry, age) => Some((entry, age)),
            Lookup::Stale => None,
        };
        self.flights
            .join_or_start(copy_key.as_str(), source, landed, start)
    }

    /// Whether a fill of `copy_key` from `source` is in flight.
    pub fn filling(&self, copy_key: &CopyKey, source: &crate::store::NodeLabel) -> bool {
        self.flights.in_flight(copy_key.as_str(), source)
    }

    /// The summary `GET /v1/near-cache` shows, with the `top` hottest copies.
    pub fn view(&self, top: usize) -> NearCacheView {
        let now = Instant::now();
        let mut heap: BinaryHeap<Reverse<(u64, String)>> = BinaryHeap::with_capacity(top + 1);
        for (key, entry) in self.entries.iter() {
            let hits = entry.hits.load(Ordering::Relaxed);
            if hits == 0 {
                continue;
            }
            heap.push(Reverse((hits, key)));
            if heap.len() > top {
                heap.pop();
            }
        }
        let mut hottest: Vec<HotCopy> = heap
            .into_iter()
            .filter_map(|Reverse((hits, key))| {
                let entry = self.entries.peek(key.as_str())?;
                Some(HotCopy {
                    hits,
                    version: entry.record.version,
                    tombstone: matches!(entry.record.payload, Payload::Tombstone),
                    age_ms: u64::try_from(entry.age_bound(now).as_millis()).unwrap_or(u64::MAX),
                    served_by: entry.served_by.to_string(),
                    copy_key: key,
                })
            })
            .collect();
        hottest.sort_by(|a, b| {
            b.hits
                .cmp(&a.hits)
                .then_with(|| a.copy_key.cmp(&b.copy_key))
        });
        let metrics = &self.metrics;
        let (hits, misses, coalesced, floor_reads) = (
            metrics.hits.get(),
            metrics.misses.get(),
            metrics.coalesced.get(),
            metrics.floor_reads.get(),
        );
        let total = hits + misses + coalesced + floor_reads;
        NearCacheView {
            enabled: true,
            entries: self.entries.len() as u64,
            bytes: self.entries.weight(),
            max_bytes: self.max_bytes,
            high_water_records: self.marks.len() as u64,
            high_water_sketch_bytes: self.sketch.bytes(),
            high_water_sketch_floors: self.sketch_floors.load(Ordering::Relaxed),
            hits,
            misses,
            coalesced,
            floor_reads,
            hit_ratio: if total == 0 {
                0.0
            } else {
                hits as f64 / total as f64
            },
            hottest,
        }
    }

    /// The stripe mutex of `key`.
    fn stripe(&self, key: &str) -> &Mutex<()> {
        let at = usize::try_from(self.stripe_hasher.hash_one(key) % STRIPES as u64).unwrap_or(0);
        &self.stripes[at]
    }

    fn update_gauges(&self) {
        let bytes = self.entries.weight() + self.marks.weight();
        self.metrics
            .bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics
            .entries
            .set(i64::try_from(self.entries.len()).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    use crate::key::Key;
    use crate::route::Classes;
    use crate::store::NodeLabel;

    fn cache(max_bytes: u64) -> NearCache {
        let classes = Classes::from_config(&Default::default()).unwrap();
        NearCache::new(
            &NearCacheConfig {
                max_bytes,
                ..NearCacheConfig::default()
            },
            NearMetrics::detached(&classes),
            TaskTracker::new(),
        )
    }

    fn v(n: u64) -> Version {
        Version::new(n).unwrap()
    }

    fn record(n: u64, payload: Option<&'static str>) -> CopyRecord {
        CopyRecord {
            version: v(n),
            payload: payload.map_or(Payload::Tombstone, |value| {
                Payload::Value(Bytes::from_static(value.as_bytes()))
            }),
            expire_at_ms: now_unix_ms() + 60_000,
        }
    }

    fn offer(cache: &NearCache, key: &CopyKey, record: CopyRecord, as_of: Instant) -> bool {
        cache.offer(
            key,
            Offer {
                record,
                served_by: ServedBy::primary(NodeLabel::new("p:1")),
                reason: RouteReason::Class,
                as_of,
                fill_time: Some(Duration::from_millis(1)),
            },
        )
    }

    fn held(cache: &NearCache, key: &CopyKey) -> Option<(u64, bool)> {
        match cache.lookup(key, Duration::from_secs(3600)) {
            Lookup::Fresh(entry, _) => Some((
                entry.record.version.get(),
                matches!(entry.record.payload, Payload::Tombstone),
            )),
            Lookup::Stale => None,
        }
    }

    #[test]
    fn an_entry_is_replaced_only_by_what_comes_after_it() {
        let cache = cache(1 << 20);
        let key = Key::parse("k")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        let now = Instant::now();
        assert!(offer(&cache, &key, record(5, Some("five")), now));
        assert!(!offer(&cache, &key, record(4, Some("four")), now), "older");
        assert_eq!(held(&cache, &key), Some((5, false)));
        // The same version known new later refreshes the entry; known new earlier does not.
        let earlier = now.checked_sub(Duration::from_millis(10)).unwrap();
        assert!(!offer(&cache, &key, record(5, Some("five")), earlier));
        assert!(offer(
            &cache,
            &key,
            record(5, Some("five")),
            now + Duration::from_millis(1)
        ));
        // A tombstone wins its version's tie; a value never replaces it at that version.
        assert!(offer(&cache, &key, record(5, None), now));
        assert!(!offer(
            &cache,
            &key,
            record(5, Some("five")),
            now + Duration::from_secs(1)
        ));
        assert_eq!(held(&cache, &key), Some((5, true)));
        assert!(offer(&cache, &key, record(6, Some("six")), now));
        assert_eq!(held(&cache, &key), Some((6, false)));
    }

    #[test]
    fn an_entry_is_not_served_past_its_exp_nor_older_than_the_class_accepts() {
        let cache = cache(1 << 20);
        let key = Key::parse("k")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        // Filled from a replica 40 ms behind, 20 ms ago: its age bound is at least 60 ms.
        let as_of = Instant::now()
            .checked_sub(Duration::from_millis(60))
            .unwrap();
        assert!(offer(&cache, &key, record(5, Some("five")), as_of));
        assert!(matches!(
            cache.lookup(&key, Duration::from_millis(50)),
            Lookup::Stale
        ));
        assert!(matches!(
            cache.lookup(&key, Duration::from_secs(1)),
            Lookup::Fresh(_, age) if age >= Duration::from_millis(60)
        ));
        // A record whose exp has passed is never taken, nor served.
        let mut expired = record(6, Some("six"));
        expired.expire_at_ms = now_unix_ms() - 1;
        assert!(!offer(&cache, &key, expired, Instant::now()));
        let other = Key::parse("j")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        let mut expiring = record(1, Some("one"));
        expiring.expire_at_ms = now_unix_ms() + 30;
        assert!(offer(&cache, &other, expiring, Instant::now()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while held(&cache, &other).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(held(&cache, &other), None, "served after its exp");
        assert_eq!(
            cache.high_water(&other),
            None,
            "the record expires with the copy"
        );
    }

    #[test]
    fn an_evicted_entry_leaves_its_version_and_a_lower_fill_is_refused() {
        let max = 64 * 1024;
        let cache = cache(max);
        let now = Instant::now();
        // A flood of distinct keys with 64-byte values, far over the bound.
        let value: &'static str = "x".repeat(64).leak();
        let keys: Vec<CopyKey> = (0..5_000)
            .map(|n| {
                Key::parse(&format!("flood-{n}"))
                    .unwrap()
                    .copy_key(0, crate::key::Placement::Suffix)
            })
            .collect();
        for key in &keys {
            offer(&cache, key, record(9, Some(value)), now);
            assert!(cache.entries.weight() <= max, "{}", cache.entries.weight());
        }
        let evicted = keys
            .iter()
            .find(|key| cache.entries.peek(key.as_str()).is_none())
            .expect("the flood evicted nothing");
        assert_eq!(cache.high_water(evicted), Some(v(9)));
        assert!(!offer(&cache, evicted, record(8, Some("eight")), now));
        assert!(offer(&cache, evicted, record(9, Some("nine")), now));
        assert_eq!(held(&cache, evicted), Some((9, false)));
        let view = cache.view(1);
        assert!(view.bytes <= max);
    }

    #[test]
    fn a_churn_that_evicts_the_entry_and_its_record_leaves_the_floor_in_the_sketch() {
        let cache = cache(65_536);
        let now = Instant::now();
        let hot = Key::parse("nc:hot")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        offer(&cache, &hot, record(1, Some("one")), now);
        offer(&cache, &hot, record(2, Some("two")), now);
        cache.lookup(&hot, Duration::from_secs(3600));
        // Distinct copies, each replaced once and hit twice, until the hot copy's entry is
        // evicted (which leaves its record and its sketch cells). Whether the cache then lets
        // the record go too is its own hashed choice, so the test drops the record itself.
        let mut n = 0;
        while cache.entries.peek(hot.as_str()).is_some() && n < 30_000 {
            let key = Key::parse(&format!("nc:churn-{n}"))
                .unwrap()
                .copy_key(0, crate::key::Placement::Suffix);
            offer(&cache, &key, record(1, Some("c")), now);
            offer(&cache, &key, record(2, Some("c")), now);
            cache.lookup(&key, Duration::from_secs(3600));
            cache.lookup(&key, Duration::from_secs(3600));
            n += 1;
        }
        assert!(
            cache.entries.peek(hot.as_str()).is_none(),
            "the entry stayed"
        );
        cache.marks.remove(hot.as_str());
        assert!(
            cache.marks.peek(hot.as_str()).is_none(),
            "the record stayed"
        );
        assert!(cache.high_water(&hot) >= Some(v(2)), "the floor went");
        assert!(cache.view(0).high_water_sketch_floors >= 1);
        // A rollback puts "no floor" in front of the sketch's.
        cache.forget(&hot);
        assert_eq!(cache.high_water(&hot), None);
        assert!(offer(&cache, &hot, record(1, Some("one")), now));
    }

    #[test]
    fn a_scan_of_cold_keys_does_not_flush_a_hot_one() {
        let cache = cache(256 * 1024);
        let hot = Key::parse("hot")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        let now = Instant::now();
        assert!(offer(&cache, &hot, record(1, Some("hot value")), now));
        let value: &'static str = "y".repeat(64).leak();
        for n in 0..20_000 {
            // The hot copy is read between every cold fill, as a hot key is.
            assert!(held(&cache, &hot).is_some(), "flushed after {n} cold keys");
            let key = Key::parse(&format!("cold-{n}"))
                .unwrap()
                .copy_key(0, crate::key::Placement::Suffix);
            offer(&cache, &key, record(1, Some(value)), now);
        }
    }

    #[test]
    fn a_refresh_starts_one_fill_time_before_the_entry_ages_out_capped_by_the_share() {
        let cache = cache(1 << 20);
        let max_age = Duration::from_secs(1);
        let ms = Duration::from_millis;
        let due = |key: &CopyKey, age: u64| {
            let Lookup::Fresh(entry, _) = cache.lookup(key, Duration::from_secs(3600)) else {
                panic!("no entry");
            };
            cache.refresh_due(&entry, ms(age), max_age)
        };
        let fill = |key: &CopyKey, version: u64, fill_time: Option<Duration>| {
            cache.offer(
                key,
                Offer {
                    record: record(version, Some("v")),
                    served_by: ServedBy::primary(NodeLabel::new("p:1")),
                    reason: RouteReason::Class,
                    as_of: Instant::now(),
                    fill_time,
                },
            )
        };
        // Filled in 2 ms: refreshed from 998 ms of its 1 s, not before.
        let quick = Key::parse("quick")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        assert!(fill(&quick, 1, Some(ms(2))));
        assert!(!due(&quick, 0));
        assert!(!due(&quick, 997));
        assert!(due(&quick, 998));
        assert!(due(&quick, 1000));
        // Filled in 50 ms: the lead is capped at 1% of the max age (the default), 10 ms.
        let slow = Key::parse("slow")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        assert!(fill(&slow, 1, Some(ms(50))));
        assert!(!due(&slow, 989));
        assert!(due(&slow, 990));
        // An entry a write offered, with no fill before it: no refresh ahead.
        let written = Key::parse("written")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        assert!(fill(&written, 1, None));
        assert!(!due(&written, 999));
        // A write over a filled entry keeps the fill time it knew.
        assert!(fill(&quick, 2, None));
        assert!(!due(&quick, 997));
        assert!(due(&quick, 998));
        // A share of 0 turns refresh-ahead off.
        let classes = Classes::from_config(&Default::default()).unwrap();
        let off = NearCache::new(
            &NearCacheConfig {
                refresh_lead_max: 0.0,
                ..NearCacheConfig::default()
            },
            NearMetrics::detached(&classes),
            TaskTracker::new(),
        );
        assert!(off.offer(
            &quick,
            Offer {
                record: record(1, Some("v")),
                served_by: ServedBy::primary(NodeLabel::new("p:1")),
                reason: RouteReason::Class,
                as_of: Instant::now(),
                fill_time: Some(ms(2))
            }
        ));
        let Lookup::Fresh(entry, _) = off.lookup(&quick, max_age) else {
            panic!("no entry");
        };
        assert!(!off.refresh_due(&entry, max_age, max_age));
    }

    #[test]
    fn forgetting_a_copy_drops_its_entry_and_record() {
        let cache = cache(1 << 20);
        let key = Key::parse("k")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        assert!(offer(
            &cache,
            &key,
            record(7, Some("seven")),
            Instant::now()
        ));
        cache.forget(&key);
        assert_eq!(cache.high_water(&key), None);
        assert!(offer(
            &cache,
            &key,
            record(3, Some("three")),
            Instant::now()
        ));
        assert_eq!(cache.metrics().rollbacks.get(), 1);
    }

    #[test]
    fn the_view_lists_the_hottest_copies() {
        let cache = cache(1 << 20);
        let classes = Classes::from_config(&Default::default()).unwrap();
        let class = classes.by_name("advisory").unwrap();
        for (n, hits) in [(0, 3), (1, 7), (2, 0)] {
            let key = Key::parse("k")
                .unwrap()
                .copy_key(n, crate::key::Placement::Suffix);
            offer(&cache, &key, record(1, Some("v")), Instant::now());
            if let Lookup::Fresh(entry, age) = cache.lookup(&key, Duration::from_secs(1)) {
                for _ in 0..hits {
                    cache.served(&entry, class, age);
                }
            }
        }
        let view = cache.view(20);
        assert_eq!(view.entries, 3);
        assert_eq!(view.hits, 10);
        let hottest: Vec<(&str, u64)> = view
            .hottest
            .iter()
            .map(|hot| (hot.copy_key.as_str(), hot.hits))
            .collect();
        assert_eq!(hottest, vec![("k#1", 7), ("k#0", 3)]);
    }

    /// Fails if a miss whose lookup ran before a fill ended and whose join came after it
    /// starts a second fill: it must find the fill's entry under the fills' lock.
    #[tokio::test]
    async fn a_miss_racing_a_fills_end_is_answered_by_the_fills_entry() {
        use futures_util::FutureExt;

        let tracker = TaskTracker::new();
        let classes = Classes::from_config(&Default::default()).unwrap();
        let cache = Arc::new(NearCache::new(
            &NearCacheConfig::default(),
            NearMetrics::detached(&classes),
            tracker.clone(),
        ));
        let key = Key::parse("k")
            .unwrap()
            .copy_key(0, crate::key::Placement::Suffix);
        let source = NodeLabel::new("p:1");
        let max_age = Some(Duration::from_secs(60));
        // The miss's lookup: nothing yet.
        assert_eq!(held(&cache, &key), None);
        // Meanwhile a fill runs to its end: it offers its read, then leaves the table.
        let filler = cache.clone();
        let filled_key = key.clone();
        let Flight::Started(filling) = cache.fill(&key, &source, max_age, move || {
            async move {
                offer(
                    &filler,
                    &filled_key,
                    record(3, Some("three")),
                    Instant::now(),
                );
                Filled {
                    read: crate::store::CopyRead {
                        served_by: ServedBy::primary(NodeLabel::new("p:1")),
                        record: Ok(Some(record(3, Some("three")))),
                    },
                    reason: RouteReason::Class,
                }
            }
            .boxed()
        }) else {
            panic!("the first miss starts a fill");
        };
        assert!(filling.await.is_some());
        tracker.close();
        tracker.wait().await;
        assert!(
            !cache.filling(&key, &source),
            "the ended fill left the table"
        );
        // The miss joins now: it is answered by the entry, and starts no read.
        match cache.fill(&key, &source, max_age, || panic!("a second fill started")) {
            Flight::Landed((entry, _)) => assert_eq!(entry.record.version, v(3)),
            Flight::Joined(_) | Flight::Started(_) => panic!("no entry found"),
        }
        // A refresh (no max age) does start one.
        let refresh = cache.fill(&key, &source, None, || {
            async {
                Filled {
                    read: crate::store::CopyRead {
                        served_by: ServedBy::primary(NodeLabel::new("p:1")),
                        record: Ok(None),
                    },
                    reason: RouteReason::Class,
                }
            }
            .boxed()
        });
        assert!(matches!(refresh, Flight::Started(_)));
    }
}
