//! The instance-wide per-key high-water: the highest version of each key this instance has
//! answered a read with or accepted in a publish (through any door), in fixed memory.
//!
//! A door reads it as a version floor for a read that carries no client identity of its own
//! (the Redis-protocol door's pooled connections, `crate::resp`): consecutive commands of one
//! application request run on different connections, so only an instance-wide floor keeps such
//! a client from seeing a key go back, or missing a write published through this instance,
//! whichever connection it uses.
//!
//! It is the near cache's count-min sketch of maxima ([`crate::near::sketch::Sketch`]) keyed
//! by the user key instead of a copy key: each record takes the maximum of the version and of
//! the expiry into one cell per row, a query the minimum over the key's cells.
//!
//! # Invariants
//! - **Never under-states.** Until the expiry recorded with it (the served copy's, or the last
//!   copy a publish applied or queued), a key's floor is at least every version recorded for
//!   it. A collision can only raise a floor: the read then goes to a sibling or the primary,
//!   and fails with the below-floor error rather than answer older.
//! - **Forgets with the copies.** Once what a cell holds has expired the cell is empty, so a
//!   key whose copies all expired starts again from nothing.
//! - **Fixed memory**: `session.high_water_bytes` (default 1 MiB), allocated at startup.

use crate::key::{Key, Version};
use crate::near::sketch::Sketch;

/// The default size of the high-water, in bytes (`session.high_water_bytes`).
pub const DEFAULT_BYTES: u64 = 1 << 20;

/// The highest version of each key answered or accepted here, over-stated at worst.
#[derive(Debug)]
pub struct HighWater {
    /// The maxima.
    sketch: Sketch,
}

impl HighWater {
    /// A high-water of about `bytes` (at least the sketch's smallest size).
    pub fn with_bytes(bytes: u64) -> HighWater {
        HighWater {
            sketch: Sketch::with_bytes(bytes),
        }
    }

    /// The bytes its cells take.
    pub fn bytes(&self) -> u64 {
        self.sketch.bytes()
    }

    /// Records that `key` was answered or accepted at `version`, which holds until
    /// `expire_at_ms` (Unix ms).
    pub fn record(&self, key: &Key, version: Version, expire_at_ms: u64, now_ms: u64) {
        self.sketch
            .record(key.as_str(), version, expire_at_ms, now_ms);
    }

    /// The floor for `key` at `now_ms`: at least the highest version recorded for it whose
    /// expiry has not passed; `None` when none holds.
    pub fn floor(&self, key: &Key, now_ms: u64) -> Option<Version> {
        self.sketch.floor(key.as_str(), now_ms)
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
    }
}
