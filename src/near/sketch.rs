//! The high-water sketch: per-copy version maxima in fixed memory, kept beside the exact
//! high-water records so that a copy's floor survives the eviction of both its entry and its
//! record.
//!
//! A count-min sketch of maxima: [`ROWS`] rows of cells, each cell a (version, `exp`) pair;
//! a copy key hashes (one keyed hash, split into a row index per row) to one cell per row.
//! Recording takes the maximum of the version and of the expiry into each of the copy's cells;
//! a query takes the minimum version over the copy's cells, and a cell whose expiry has passed
//! reads as empty (so does the query, then).
//!
//! # Invariants
//! - **Never under-states.** Every cell of a copy holds at least the copy's recorded version
//!   with at least its expiry, until that expiry: a cell is reset only once its own expiry,
//!   the largest it took, has passed. A collision can only raise a floor, which sends the
//!   reader to the primary or a sibling (a read elsewhere), never to an older answer.
//! - **Forgets after expiry.** Once every copy recorded into a cell is past its `exp`, the cell
//!   is empty, so a key republished from a lower version is not held on primaries beyond the
//!   life of what the cell held.
//! - **No shared lock.** Each cell is its own small mutex; only fills and evictions touch the
//!   sketch, never a hit.

use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

use quick_cache::DefaultHashBuilder;

use crate::key::Version;

/// The rows of the sketch: a floor is over-stated only when the copy collides in every row.
pub const ROWS: usize = 4;

/// The bytes a cell is counted for: its version, its expiry and its mutex, padded.
pub const CELL_BYTES: u64 = 24;

/// The fewest cells per row, whatever the byte budget.
const MIN_COLUMNS: usize = 64;

/// One cell: the maximum version and expiry recorded into it since it was last empty.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    /// The highest version recorded (0: empty).
    version: u64,
    /// The latest `exp` recorded, in Unix milliseconds: past it, the cell is empty.
    expire_at_ms: u64,
}

/// Per-copy version maxima in fixed memory.
#[derive(Debug)]
pub struct Sketch {
    /// `ROWS × columns` cells, row by row.
    cells: Box<[Mutex<Cell>]>,
    /// Cells per row.
    columns: usize,
    /// Hashes copy keys to cells (randomly keyed per process, so a reader cannot aim
    /// collisions at a copy).
    hasher: DefaultHashBuilder,
}

impl Sketch {
    /// A sketch of at most `bytes` (at least [`ROWS`] × 64 cells).
    pub fn with_bytes(bytes: u64) -> Sketch {
        let cells = usize::try_from(bytes / CELL_BYTES).unwrap_or(usize::MAX);
        let columns = (cells / ROWS).max(MIN_COLUMNS);
        Sketch {
            cells: (0..ROWS * columns)
                .map(|_| Mutex::new(Cell::default()))
                .collect(),
            columns,
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The bytes the cells take.
    pub fn bytes(&self) -> u64 {
        self.cells.len() as u64 * CELL_BYTES
    }

    /// Records that `copy_key` reached `version`, valid until `expire_at_ms`.
    pub fn record(&self, copy_key: &str, version: Version, expire_at_ms: u64, now_ms: u64) {
        for at in self.cells_of(copy_key) {
            let mut cell = self.cells[at]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if cell.expire_at_ms <= now_ms {
                *cell = Cell::default();
            }
            cell.version = cell.version.max(version.get());
            cell.expire_at_ms = cell.expire_at_ms.max(expire_at_ms);
        }
    }

    /// The floor recorded for `copy_key` at `now_ms`, if every one of its cells holds one:
    /// at least the highest version recorded for it whose expiry has not passed.
    pub fn floor(&self, copy_key: &str, now_ms: u64) -> Option<Version> {
        let cells = self.live_cells(copy_key, now_ms)?;
        Version::new(cells.iter().map(|cell| cell.version).min()?).ok()
    }

    /// When the floor of `copy_key` ends if nothing more is recorded: the latest expiry of its
    /// cells, `None` when it has no floor now.
    pub fn floor_until(&self, copy_key: &str, now_ms: u64) -> Option<u64> {
        let cells = self.live_cells(copy_key, now_ms)?;
        cells.iter().map(|cell| cell.expire_at_ms).max()
    }

    /// The cells of `copy_key` as they are at `now_ms`, `None` when any of them has expired
    /// (the copy then has no floor here).
    fn live_cells(&self, copy_key: &str, now_ms: u64) -> Option<[Cell; ROWS]> {
        let mut cells = [Cell::default(); ROWS];
        for (slot, at) in cells.iter_mut().zip(self.cells_of(copy_key)) {
            *slot = *self.cells[at]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if slot.expire_at_ms <= now_ms {
                return None;
            }
        }
        Some(cells)
    }

    /// The index of `copy_key`'s cell in each row (double hashing of one 64-bit hash).
    fn cells_of(&self, copy_key: &str) -> impl Iterator<Item = usize> {
        let hash = self.hasher.hash_one(copy_key);
        let (low, high) = (hash & 0xffff_ffff, (hash >> 32) | 1);
        let width = self.columns;
        let columns = width as u64;
        (0..ROWS).map(move |row| {
            let column = low.wrapping_add((row as u64).wrapping_mul(high)) % columns;
            row * width + usize::try_from(column).unwrap_or(0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version::new(n).unwrap()
    }

    #[test]
    fn a_recorded_maximum_is_never_under_stated_before_its_expiry() {
        // The smallest sketch, far over-filled: every copy collides in every row.
        let sketch = Sketch::with_bytes(0);
        let now = 1_000_000;
        for n in 0..10_000u64 {
            let key = format!("k{n}#0");
            sketch.record(&key, v(n % 97 + 1), now + 60_000, now);
        }
        sketch.record("hot#0", v(50), now + 60_000, now);
        sketch.record("hot#0", v(7), now + 60_000, now);
        for n in 0..10_000u64 {
            let key = format!("k{n}#0");
            let floor = sketch
                .floor(&key, now + 1)
                .expect("a recorded copy has a floor");
            assert!(floor >= v(n % 97 + 1), "{key}: {floor:?}");
        }
        assert!(sketch.floor("hot#0", now + 59_999).unwrap() >= v(50));
    }

    #[test]
    fn a_cell_forgets_only_after_the_expiry_of_what_it_holds() {
        let sketch = Sketch::with_bytes(1 << 20);
        let now = 1_000_000;
        sketch.record("a#0", v(9), now + 100, now);
        assert_eq!(sketch.floor("a#0", now + 99), Some(v(9)));
        assert_eq!(sketch.floor("a#0", now + 100), None, "past its exp");
        // Republished from a lower version after expiry: the old maximum is gone.
        sketch.record("a#0", v(2), now + 500, now + 200);
        assert_eq!(sketch.floor("a#0", now + 201), Some(v(2)));
        // A later record with an earlier expiry does not shorten what the cell holds.
        sketch.record("a#0", v(3), now + 300, now + 201);
        assert_eq!(sketch.floor("a#0", now + 400), Some(v(3)));
        assert_eq!(sketch.floor("never#0", now), None);
    }

    #[test]
    fn collisions_only_raise_a_floor() {
        let sketch = Sketch::with_bytes(0);
        let now = 1_000_000;
        sketch.record("low#0", v(3), now + 60_000, now);
        for n in 0..5_000u64 {
            sketch.record(&format!("high{n}#0"), v(1_000), now + 60_000, now);
        }
        // Every row of the smallest sketch is covered by 5,000 copies: "low" now reads high,
        // which costs a read elsewhere, never an older answer.
        assert_eq!(sketch.floor("low#0", now + 1), Some(v(1_000)));
        // A copy never recorded but colliding everywhere reads the colliders' floor, never less
        // than what any of them recorded.
        assert_eq!(sketch.floor("other#0", now + 1), Some(v(1_000)));
    }
}
