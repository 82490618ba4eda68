//! The instance-wide per-key high-water: the highest version of each key this instance has
//! answered a read with or accepted in a publish (through any door), in fixed memory.
//!
//! A door reads it as a version floor for a read that carries no client identity of its own
//! (the Redis-protocol door's pooled connections, `crate::resp`): consecutive commands of one
//! application request run on different connections, so only an instance-wide floor keeps such
//! a client from seeing a key go back, or missing a write published through this instance,
//! whichever connection it uses.
//!
//! It is a count-min sketch of maxima, as the near cache's ([`crate::near::sketch`]), keyed by
//! the user key instead of a copy key: [`ROWS`] rows of cells, each a (version, expiry) pair;
//! a key hashes to one cell per row; a record takes the maximum of the version and of the
//! expiry into each of its cells (an expired cell is emptied first), a query the minimum
//! version over its cells.
//!
//! Unlike the near cache's sketch, which only fills and evictions touch, this one is recorded
//! on every read answer, and a hot key's reads all land on the same few cells: so a cell is
//! two atomics read without a lock, and a record that the cell already covers (its version and
//! its expiry at least the record's, the common case for a hot key re-read at one version)
//! writes nothing, keeping the cache line shared between cores. Only a record that raises a
//! cell takes the cell's mutex.
//!
//! # Invariants
//! - **Never under-states.** Until the expiry recorded with it (the served copy's, or the last
//!   copy a publish applied or queued), a key's floor is at least every version recorded for
//!   it: a cell is emptied only once its own expiry, the largest it took, has passed. A
//!   collision can only raise a floor: the read then goes to a sibling or the primary, and
//!   fails with the below-floor error rather than answer older.
//! - **Forgets with the copies.** Once what a cell holds has expired the cell is empty, so a
//!   key whose copies all expired starts again from nothing.
//! - **Fixed memory**: `session.high_water_bytes` (default 1 MiB), allocated at startup.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use quick_cache::DefaultHashBuilder;

use crate::key::{Key, Version};

/// The default size of the high-water, in bytes (`session.high_water_bytes`, whose default it
/// is: the constant lives with the config).
pub use crate::fleet::config::DEFAULT_HIGH_WATER_BYTES as DEFAULT_BYTES;

/// The rows: a floor is over-stated only when the key collides in every row.
pub const ROWS: usize = 4;

/// The bytes a cell is counted for: its version, its expiry and its mutex, padded.
pub const CELL_BYTES: u64 = 24;

/// The fewest cells per row, whatever the byte budget.
const MIN_COLUMNS: usize = 256;

/// One cell: the maximum version and expiry recorded into it since it was last empty.
#[derive(Debug, Default)]
struct Cell {
    /// The highest version recorded (0: empty). Written before `expire_at_ms` when the cell is
    /// emptied and refilled, so a reader that sees the new expiry sees the new version.
    version: AtomicU64,
    /// The latest expiry recorded, Unix ms: at or past it the cell is empty.
    expire_at_ms: AtomicU64,
    /// Held by a record that changes the cell (readers take no lock).
    write: Mutex<()>,
}

impl Cell {
    /// The cell's version at `now_ms`, 0 when it is empty.
    fn version_at(&self, now_ms: u64) -> u64 {
        if self.expire_at_ms.load(Ordering::Acquire) <= now_ms {
            return 0;
        }
        self.version.load(Ordering::Acquire)
    }

    /// Whether the cell already holds at least `version` until at least `expire_at_ms`.
    fn covers(&self, version: u64, expire_at_ms: u64, now_ms: u64) -> bool {
        let expiry = self.expire_at_ms.load(Ordering::Acquire);
        expiry > now_ms && expiry >= expire_at_ms && self.version.load(Ordering::Acquire) >= version
    }

    /// Takes the maximum of `version` and `expire_at_ms` into the cell, emptying it first when
    /// it has expired.
    fn record(&self, version: u64, expire_at_ms: u64, now_ms: u64) {
        if self.covers(version, expire_at_ms, now_ms) {
            return;
        }
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        if self.expire_at_ms.load(Ordering::Acquire) <= now_ms {
            // Empty: what it held has expired. The version first, then the expiry that makes
            // it visible.
            self.version.store(version, Ordering::Release);
            self.expire_at_ms.store(expire_at_ms, Ordering::Release);
        } else {
            self.version.fetch_max(version, Ordering::AcqRel);
            self.expire_at_ms.fetch_max(expire_at_ms, Ordering::AcqRel);
        }
    }
}

/// The highest version of each key answered or accepted here, over-stated at worst.
#[derive(Debug)]
pub struct HighWater {
    /// `ROWS × columns` cells, row by row.
    cells: Box<[Cell]>,
    /// Cells per row.
    columns: usize,
    /// Hashes keys to cells (randomly keyed per process, so a client cannot aim collisions at
    /// a key).
    hasher: DefaultHashBuilder,
}

impl HighWater {
    /// A high-water of about `bytes` (at least [`ROWS`] × 256 cells).
    pub fn with_bytes(bytes: u64) -> HighWater {
        let cells = usize::try_from(bytes / CELL_BYTES).unwrap_or(usize::MAX);
        let columns = (cells / ROWS).max(MIN_COLUMNS);
        HighWater {
            cells: (0..ROWS * columns).map(|_| Cell::default()).collect(),
            columns,
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The bytes its cells take.
    pub fn bytes(&self) -> u64 {
        self.cells.len() as u64 * CELL_BYTES
    }

    /// Records that `key` was answered or accepted at `version`, which holds until
    /// `expire_at_ms` (Unix ms).
    pub fn record(&self, key: &Key, version: Version, expire_at_ms: u64, now_ms: u64) {
        if expire_at_ms <= now_ms {
            return;
        }
        for at in self.cells_of(key) {
            self.cells[at].record(version.get(), expire_at_ms, now_ms);
        }
    }

    /// The floor for `key` at `now_ms`: at least the highest version recorded for it whose
    /// expiry has not passed; `None` when none holds.
    pub fn floor(&self, key: &Key, now_ms: u64) -> Option<Version> {
        let lowest = self
            .cells_of(key)
            .map(|at| self.cells[at].version_at(now_ms))
            .min()?;
        Version::new(lowest).ok()
    }

    /// The index of `key`'s cell in each row (double hashing of one 64-bit hash).
    fn cells_of(&self, key: &Key) -> impl Iterator<Item = usize> {
        let hash = self.hasher.hash_one(key.as_str());
        let (low, high) = (hash & 0xffff_ffff, (hash >> 32) | 1);
        let width = self.columns;
        let columns = width as u64;
        (0..ROWS).map(move |row| {
            let column = low.wrapping_add((row as u64).wrapping_mul(high)) % columns;
            row * width + usize::try_from(column).unwrap_or(0)
        })
    }
}

impl Default for HighWater {
    fn default() -> HighWater {
        HighWater::with_bytes(DEFAULT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version::new(n).unwrap()
    }

    fn key(name: &str) -> Key {
        Key::parse(name).unwrap()
    }

    #[test]
    fn a_crowded_high_water_never_under_states_a_live_version() {
        // The smallest high-water, far over-filled: keys collide in every row.
        let high = HighWater::with_bytes(0);
        let now = 1_000_000;
        let mut expected = std::collections::HashMap::new();
        for round in 0..3u64 {
            for n in 0..20_000u64 {
                let version = (n * 7 + round * 13) % 1_000 + 1;
                let name = format!("k:{n}");
                high.record(&key(&name), v(version), now + 60_000, now);
                let best = expected.entry(name).or_insert(0);
                *best = version.max(*best);
            }
        }
        for (name, best) in &expected {
            let floor = high
                .floor(&key(name), now + 1)
                .expect("a recorded key has a floor");
            assert!(floor >= v(*best), "{name}: {floor:?} < {best}");
        }
    }

    #[test]
    fn a_lower_version_never_lowers_the_floor_and_expiry_forgets_it() {
        let high = HighWater::default();
        let now = 1_000_000;
        high.record(&key("a"), v(9), now + 100, now);
        high.record(&key("a"), v(3), now + 50, now);
        assert_eq!(high.floor(&key("a"), now + 99), Some(v(9)));
        assert_eq!(high.floor(&key("a"), now + 100), None);
        assert_eq!(high.floor(&key("b"), now), None);
        assert!(high.bytes() <= DEFAULT_BYTES);
        // Emptied, then refilled lower: the old maximum is gone with its expiry.
        high.record(&key("a"), v(2), now + 500, now + 200);
        assert_eq!(high.floor(&key("a"), now + 201), Some(v(2)));
        // A covered record changes nothing; a longer one stretches the floor.
        high.record(&key("a"), v(1), now + 300, now + 201);
        assert_eq!(high.floor(&key("a"), now + 499), Some(v(2)));
        high.record(&key("a"), v(2), now + 900, now + 201);
        assert_eq!(high.floor(&key("a"), now + 899), Some(v(2)));
        // An already expired record leaves nothing.
        high.record(&key("c"), v(5), now, now);
        assert_eq!(high.floor(&key("c"), now), None);
    }

    #[test]
    fn concurrent_records_never_leave_a_floor_below_what_was_recorded() {
        let high = std::sync::Arc::new(HighWater::with_bytes(0));
        let now = 1_000_000;
        let threads: Vec<_> = (0..4u64)
            .map(|thread| {
                let high = high.clone();
                std::thread::spawn(move || {
                    for n in 0..5_000u64 {
                        let name = format!("k:{}", n % 500);
                        high.record(&key(&name), v(thread * 10_000 + n + 1), now + 60_000, now);
                        let floor = high.floor(&key(&name), now).expect("just recorded");
                        assert!(floor >= v(thread * 10_000 + n + 1), "{name}: {floor:?}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}
