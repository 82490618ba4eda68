//! The instance-wide per-key high-water: the highest version of each key this instance has
//! answered a read with or accepted in a publish (through any door), in fixed memory.
//!
//! The operations layer reads it as a floor for a read that carries no client identity of its
//! own (a pooled connection, [`crate::read::Caller::Pooled`]): consecutive commands of one
//! application request run on different connections, so only an instance-wide floor keeps such
//! a client from seeing a key go back, or missing a write published through this instance,
//! whichever connection it uses.
//!
//! It is a [`MaxSketch`] keyed by the user key, the same structure as the near cache's floors:
//! exact for the keys it holds a slot for (the ones answered or accepted most recently), an
//! estimate for the others. The two are used differently ([`Mark`]): an exact mark is a floor
//! like the reader's own `min_version`, never undercut (below it the read is refused); an
//! estimate may hold another key's version, so it is only *preferred* — a copy below it is
//! passed over while another consulted copy holds more, but when none does the newest is
//! served, as after a near-cache rollback, and never refused for it.
//!
//! # Invariants
//! - **Never under-states** (the sketch's): until the expiry recorded with it (the served
//!   copy's, or the last copy a publish applied or queued), a key's mark is at least every
//!   version recorded for it.
//! - **Another key's version never refuses a read**: only an exact mark is a hard floor
//!   (`hardening::a_pooled_read_is_never_refused_for_other_keys_versions`).
//! - **Forgets with the copies.** Once what it holds has expired it is gone, so a key whose
//!   copies all expired starts again from nothing.
//! - **Fixed memory**: `session.high_water_bytes` (default 1 MiB), allocated at startup. **Lost
//!   on restart**: a restarted instance holds no marks, so a pooled reader may, right after, be
//!   served an older version by a replica within its class's budget (a client id or a session
//!   token keeps its floors across restarts and instances).

use crate::key::{Key, Version};
use crate::sketch::{MaxFloor, MaxSketch};

/// The default size of the high-water, in bytes (`session.high_water_bytes`, whose default it
/// is: the constant lives with the config).
pub use crate::fleet::config::DEFAULT_HIGH_WATER_BYTES as DEFAULT_BYTES;

/// The fewest buckets, whatever the byte budget.
const MIN_BUCKETS: usize = 256;

/// The highest version of each key answered or accepted here: exact for the keys it holds, an
/// estimate that may over-state for the others.
#[derive(Debug)]
pub struct HighWater {
    /// The maxima, by user key.
    sketch: MaxSketch,
}

/// The floor the high-water gives a read of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A version this instance answered or accepted for this very key: a floor never undercut.
    Exact(Version),
    /// At least that, possibly more (shared with other keys): a floor preferred, never a
    /// refusal.
    Estimate(Version),
}

impl Mark {
    /// The version, exact or not.
    pub fn version(self) -> Version {
        match self {
            Mark::Exact(version) | Mark::Estimate(version) => version,
        }
    }
}

impl HighWater {
    /// A high-water of about `bytes` (at least 256 buckets).
    pub fn with_bytes(bytes: u64) -> HighWater {
        HighWater {
            sketch: MaxSketch::with_bytes(bytes, MIN_BUCKETS),
        }
    }

    /// The bytes it takes.
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
    /// expiry has not passed, exact or estimated; `None` when none holds.
    pub fn floor(&self, key: &Key, now_ms: u64) -> Option<Mark> {
        let MaxFloor { version, exact } = self.sketch.floor(key.as_str(), now_ms)?;
        Some(if exact {
            Mark::Exact(version)
        } else {
            Mark::Estimate(version)
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
                .expect("a recorded key has a floor")
                .version();
            assert!(floor >= v(*best), "{name}: {floor:?} < {best}");
        }
    }

    #[test]
    fn a_lower_version_never_lowers_the_floor_and_expiry_forgets_it() {
        let high = HighWater::default();
        let now = 1_000_000;
        high.record(&key("a"), v(9), now + 100, now);
        high.record(&key("a"), v(3), now + 50, now);
        assert_eq!(high.floor(&key("a"), now + 99), Some(Mark::Exact(v(9))));
        assert_eq!(high.floor(&key("a"), now + 100), None);
        assert_eq!(high.floor(&key("b"), now), None);
        assert!(high.bytes() <= DEFAULT_BYTES);
        // Emptied, then refilled lower: the old maximum is gone with its expiry.
        high.record(&key("a"), v(2), now + 500, now + 200);
        assert_eq!(high.floor(&key("a"), now + 201), Some(Mark::Exact(v(2))));
        // A covered record changes nothing; a longer one stretches the floor.
        high.record(&key("a"), v(1), now + 300, now + 201);
        assert_eq!(high.floor(&key("a"), now + 499), Some(Mark::Exact(v(2))));
        high.record(&key("a"), v(2), now + 900, now + 201);
        assert_eq!(high.floor(&key("a"), now + 899), Some(Mark::Exact(v(2))));
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
                        let floor = high
                            .floor(&key(&name), now)
                            .expect("just recorded")
                            .version();
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
