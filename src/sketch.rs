//! [`MaxSketch`]: per-key version maxima in fixed memory, each with its expiry, telling an exact
//! maximum from an estimate. The one structure behind the near cache's high-water floors
//! (`crate::near`, keyed by copy key) and the instance high-water (`crate::ops::HighWater`,
//! keyed by user key).
//!
//! A set-associative table: a key hashes (one keyed 64-bit hash) to one bucket of [`SLOTS`]
//! slots and a 64-bit tag. A slot holds one key's maximum version and expiry since it took
//! the slot. A bucket whose slots are all live and taken by other keys makes room by moving the
//! slot that expires first into the bucket's *overflow*, one (version, expiry) maximum of every
//! record it took. A query:
//! - the key's slot: its own maximum, **exact** — unless the key may have been moved out before
//!   it took the slot (the bucket's small filter of moved-out keys says so) while the overflow
//!   held more, when the overflow's version is the floor, as an estimate;
//! - no slot, a live overflow: the overflow's version, an **estimate** (it may over-state: it
//!   holds other keys' versions too);
//! - neither: `None`, no live record of the key.
//!
//! # Invariants
//! - **Never under-states.** Until its expiry, a recorded version is at most the floor returned
//!   for its key: a slot moves to the overflow, never away
//!   (`a_recorded_maximum_is_never_under_stated_before_its_expiry`).
//! - **Exact for the keys it holds.** A key with a slot of its own gets its own maximum, never
//!   another key's (`a_crowded_sketch_is_exact_for_the_keys_recorded_last`); only a key moved
//!   out, or never recorded, gets an estimate, and is told so.
//! - **Forgets after expiry**: a slot or an overflow whose expiry has passed is empty.
//! - **Reads take no lock.** A bucket carries a sequence number its writers bump around every
//!   change (a seqlock); readers retry while it moves. A record that the key's slot already
//!   covers (a hot key re-read at one version) writes nothing, keeping the cache line shared
//!   between cores; only a record that changes a bucket takes its mutex.

use std::hash::BuildHasher;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use quick_cache::DefaultHashBuilder;

use crate::key::Version;

/// Slots per bucket.
pub const SLOTS: usize = 4;

/// A floor the sketch holds for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxFloor {
    /// At least the highest live version recorded for the key.
    pub version: Version,
    /// Whether `version` is exactly that (the key's own slot), rather than an estimate that
    /// may over-state (the bucket's overflow).
    pub exact: bool,
}

/// One key's maximum.
#[derive(Debug, Default)]
struct Slot {
    /// The key's tag; 0: free.
    tag: AtomicU64,
    /// The highest version the key recorded since it took the slot.
    version: AtomicU64,
    /// The overflow's version when the key took the slot, if the key may have been moved out
    /// into it before (0 otherwise): its floor may be up to that much.
    carried: AtomicU64,
    /// The latest expiry recorded, Unix ms: at or past it the slot is free.
    expire_at_ms: AtomicU64,
}

/// [`SLOTS`] slots and their overflow.
#[derive(Debug, Default)]
struct Bucket {
    /// Odd while a writer changes the bucket.
    seq: AtomicU64,
    /// Held by a writer.
    write: Mutex<()>,
    /// The slots.
    slots: [Slot; SLOTS],
    /// The highest version moved out of a slot to make room.
    overflow_version: AtomicU64,
    /// The latest expiry moved out with it, Unix ms.
    overflow_expire_at_ms: AtomicU64,
    /// Which keys were moved into the live overflow: two bits of each one's tag (a Bloom
    /// filter of 64 bits, emptied with the overflow). A key whose bits are not both set was
    /// never moved out, so the overflow holds nothing of it.
    moved: AtomicU64,
}

/// The two bits of `tag` in a bucket's filter of moved-out keys.
fn moved_bits(tag: u64) -> u64 {
    (1 << (tag & 63)) | (1 << ((tag >> 6) & 63))
}

/// What a bucket says of a key at a moment.
#[derive(Debug, Clone, Copy)]
struct Look {
    /// The key's slot: (its version, what it carried, its expiry).
    slot: Option<(u64, u64, u64)>,
    /// The overflow, when live: (version, expiry).
    overflow: Option<(u64, u64)>,
}

impl Bucket {
    /// Reads what the bucket holds for `tag` at `now_ms`, without a lock (retrying while a
    /// writer changes it, then under the lock).
    fn look(&self, tag: u64, now_ms: u64) -> Look {
        for _ in 0..8 {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let look = self.look_unsynced(tag, now_ms);
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return look;
            }
        }
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        self.look_unsynced(tag, now_ms)
    }

    /// [`Bucket::look`]'s reads, which a concurrent writer may tear.
    fn look_unsynced(&self, tag: u64, now_ms: u64) -> Look {
        let slot = self.slots.iter().find_map(|slot| {
            let expiry = slot.expire_at_ms.load(Ordering::Acquire);
            (expiry > now_ms && slot.tag.load(Ordering::Acquire) == tag).then(|| {
                (
                    slot.version.load(Ordering::Acquire),
                    slot.carried.load(Ordering::Acquire),
                    expiry,
                )
            })
        });
        let overflow_expiry = self.overflow_expire_at_ms.load(Ordering::Acquire);
        let overflow = (overflow_expiry > now_ms).then(|| {
            (
                self.overflow_version.load(Ordering::Acquire),
                overflow_expiry,
            )
        });
        Look { slot, overflow }
    }

    /// Records `version` until `expire_at_ms` for `tag`; see the module documentation.
    fn record(&self, tag: u64, version: u64, expire_at_ms: u64, now_ms: u64) {
        if let Some((held, _, expiry)) = self.look(tag, now_ms).slot {
            if held >= version && expiry >= expire_at_ms {
                return;
            }
        }
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        self.seq.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::Release);
        self.record_locked(tag, version, expire_at_ms, now_ms);
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// [`Bucket::record`] under the lock, between the two sequence bumps.
    fn record_locked(&self, tag: u64, version: u64, expire_at_ms: u64, now_ms: u64) {
        let live = |slot: &Slot| slot.expire_at_ms.load(Ordering::Acquire) > now_ms;
        if let Some(slot) = self
            .slots
            .iter()
            .find(|slot| live(slot) && slot.tag.load(Ordering::Acquire) == tag)
        {
            slot.version.fetch_max(version, Ordering::AcqRel);
            slot.expire_at_ms.fetch_max(expire_at_ms, Ordering::AcqRel);
            return;
        }
        let slot = match self.slots.iter().find(|slot| !live(slot)) {
            Some(free) => free,
            None => {
                // Every slot is live: the one that expires first moves to the overflow.
                let Some(first) = self
                    .slots
                    .iter()
                    .min_by_key(|slot| slot.expire_at_ms.load(Ordering::Acquire))
                else {
                    return;
                };
                let moved_version = first
                    .version
                    .load(Ordering::Acquire)
                    .max(first.carried.load(Ordering::Acquire));
                let moved_expiry = first.expire_at_ms.load(Ordering::Acquire);
                let moved_tag = moved_bits(first.tag.load(Ordering::Acquire));
                if self.overflow_expire_at_ms.load(Ordering::Acquire) <= now_ms {
                    self.overflow_version
                        .store(moved_version, Ordering::Release);
                    self.moved.store(moved_tag, Ordering::Release);
                    self.overflow_expire_at_ms
                        .store(moved_expiry, Ordering::Release);
                } else {
                    self.moved.fetch_or(moved_tag, Ordering::AcqRel);
                    self.overflow_version
                        .fetch_max(moved_version, Ordering::AcqRel);
                    self.overflow_expire_at_ms
                        .fetch_max(moved_expiry, Ordering::AcqRel);
                }
                first
            }
        };
        let bits = moved_bits(tag);
        let carried = if self.overflow_expire_at_ms.load(Ordering::Acquire) > now_ms
            && self.moved.load(Ordering::Acquire) & bits == bits
        {
            self.overflow_version.load(Ordering::Acquire)
        } else {
            0
        };
        slot.tag.store(tag, Ordering::Release);
        slot.version.store(version, Ordering::Release);
        slot.carried.store(carried, Ordering::Release);
        slot.expire_at_ms.store(expire_at_ms, Ordering::Release);
    }
}

/// The bytes a bucket takes: its sequence, mutex, slots, overflow and filter.
pub const BUCKET_BYTES: u64 = std::mem::size_of::<Bucket>() as u64;

/// Per-key version maxima in fixed memory; see the module documentation.
#[derive(Debug)]
pub struct MaxSketch {
    /// The buckets.
    buckets: Box<[Bucket]>,
    /// Hashes keys to buckets and tags (randomly keyed per process, so a client cannot aim
    /// collisions at a key).
    hasher: DefaultHashBuilder,
}

impl MaxSketch {
    /// A sketch of about `bytes`, with at least `min_buckets` buckets.
    pub fn with_bytes(bytes: u64, min_buckets: usize) -> MaxSketch {
        let buckets = usize::try_from(bytes / BUCKET_BYTES)
            .unwrap_or(usize::MAX)
            .max(min_buckets)
            .max(1);
        MaxSketch {
            buckets: (0..buckets).map(|_| Bucket::default()).collect(),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The bytes its buckets take.
    pub fn bytes(&self) -> u64 {
        self.buckets.len() as u64 * BUCKET_BYTES
    }

    /// The slots it holds.
    pub fn slots(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// Records that `key` reached `version`, which holds until `expire_at_ms` (Unix ms); a
    /// record already expired at `now_ms` leaves nothing.
    pub fn record(&self, key: &str, version: Version, expire_at_ms: u64, now_ms: u64) {
        if expire_at_ms <= now_ms {
            return;
        }
        let (bucket, tag) = self.locate(key);
        bucket.record(tag, version.get(), expire_at_ms, now_ms);
    }

    /// The floor held for `key` at `now_ms` (see the module documentation); `None` when no
    /// live record of it can be held.
    pub fn floor(&self, key: &str, now_ms: u64) -> Option<MaxFloor> {
        let (bucket, tag) = self.locate(key);
        let look = bucket.look(tag, now_ms);
        let (version, exact) = match (look.slot, look.overflow) {
            (Some((own, carried, _)), _) if own >= carried => (own, true),
            (Some((own, carried, _)), _) => (own.max(carried), false),
            (None, Some((overflow, _))) => (overflow, false),
            (None, None) => return None,
        };
        Some(MaxFloor {
            version: Version::new(version).ok()?,
            exact,
        })
    }

    /// When the floor of `key` ends if nothing more is recorded, `None` when it has no floor
    /// now.
    pub fn floor_until(&self, key: &str, now_ms: u64) -> Option<u64> {
        let (bucket, tag) = self.locate(key);
        let look = bucket.look(tag, now_ms);
        match (look.slot, look.overflow) {
            (Some((_, _, slot)), Some((_, overflow))) => Some(slot.max(overflow)),
            (Some((_, _, expiry)), None) | (None, Some((_, expiry))) => Some(expiry),
            (None, None) => None,
        }
    }

    /// `key`'s bucket and tag.
    fn locate(&self, key: &str) -> (&Bucket, u64) {
        let hash = self.hasher.hash_one(key);
        let count = self.buckets.len() as u64;
        // The bucket from the high bits; the tag is the whole hash (never 0).
        let at = usize::try_from((hash >> 32).wrapping_mul(count) >> 32).unwrap_or(0);
        (&self.buckets[at.min(self.buckets.len() - 1)], hash | 1)
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
        // The smallest sketch, far over-filled: every key collides in every row.
        let sketch = MaxSketch::with_bytes(0, 1);
        let now = 1_000_000;
        for n in 0..10_000u64 {
            sketch.record(&format!("k{n}#0"), v(n % 97 + 1), now + 60_000, now);
        }
        sketch.record("hot#0", v(50), now + 60_000, now);
        sketch.record("hot#0", v(7), now + 60_000, now);
        for n in 0..10_000u64 {
            let key = format!("k{n}#0");
            let floor = sketch
                .floor(&key, now + 1)
                .expect("a recorded key has a floor");
            assert!(floor.version >= v(n % 97 + 1), "{key}: {floor:?}");
        }
        assert!(sketch.floor("hot#0", now + 59_999).unwrap().version >= v(50));
    }

    #[test]
    fn a_crowded_sketch_is_exact_for_the_keys_recorded_last() {
        // 40,000 keys at a million, then 1,000 at version 1 re-recorded (read again), in the
        // default 1 MiB (about 6,200 buckets, 25,000 slots): a key at version 1 has its own
        // slot and, unless the bucket's filter mistakes it for a moved-out key, its exact
        // floor; never a million as an exact one.
        let sketch = MaxSketch::with_bytes(1 << 20, 256);
        let now = 1_000_000;
        for n in 0..40_000u64 {
            sketch.record(&format!("high:{n}"), v(1_000_000), now + 60_000, now);
        }
        for n in 0..1_000u64 {
            sketch.record(&format!("low:{n}"), v(1), now + 90_000, now);
        }
        for n in 0..1_000u64 {
            let floor = sketch
                .floor(&format!("low:{n}"), now + 1)
                .expect("recorded");
            assert!(floor.version >= v(1));
            if floor.exact {
                assert_eq!(floor.version, v(1), "low:{n}");
            }
        }
        let exact = (0..1_000u64)
            .filter(|n| {
                sketch
                    .floor(&format!("low:{n}"), now + 1)
                    .is_some_and(|f| f.exact)
            })
            .count();
        // About 6 high keys were moved out of each bucket: two bits each in 64 mistake a low key
        // for one of them about 3 % of the time.
        assert!(exact > 900, "{exact} of 1,000 exact");
        // The high keys moved out are estimates, never below their version.
        for n in 0..40_000u64 {
            let floor = sketch
                .floor(&format!("high:{n}"), now + 1)
                .expect("recorded");
            assert!(floor.version >= v(1_000_000), "high:{n}");
        }
    }

    #[test]
    fn a_cell_forgets_only_after_the_expiry_of_what_it_holds() {
        let sketch = MaxSketch::with_bytes(1 << 20, 1);
        let now = 1_000_000;
        sketch.record("a#0", v(9), now + 100, now);
        sketch.record("a#0", v(3), now + 50, now);
        assert_eq!(
            sketch.floor("a#0", now + 99),
            Some(MaxFloor {
                version: v(9),
                exact: true
            })
        );
        assert_eq!(sketch.floor("a#0", now + 100), None, "past its exp");
        // Republished from a lower version after expiry: the old maximum is gone.
        sketch.record("a#0", v(2), now + 500, now + 200);
        assert_eq!(
            sketch.floor("a#0", now + 201).map(|f| f.version),
            Some(v(2))
        );
        // A later record with an earlier expiry does not shorten what the cell holds.
        sketch.record("a#0", v(3), now + 300, now + 201);
        assert_eq!(
            sketch.floor("a#0", now + 400).map(|f| f.version),
            Some(v(3))
        );
        assert_eq!(sketch.floor_until("a#0", now + 400), Some(now + 500));
        assert_eq!(sketch.floor("never#0", now), None);
        // An already expired record leaves nothing.
        sketch.record("c#0", v(5), now, now);
        assert_eq!(sketch.floor("c#0", now), None);
    }

    #[test]
    fn collisions_only_raise_a_floor_and_say_so() {
        let sketch = MaxSketch::with_bytes(0, 1);
        let now = 1_000_000;
        sketch.record("low#0", v(3), now + 60_000, now);
        for n in 0..5_000u64 {
            sketch.record(&format!("high{n}#0"), v(1_000), now + 60_000, now);
        }
        // One bucket of four slots: "low" was moved out to the overflow, which the high keys
        // moved out after it raised; it reads high, as an estimate.
        assert_eq!(
            sketch.floor("low#0", now + 1),
            Some(MaxFloor {
                version: v(1_000),
                exact: false
            })
        );
    }

    #[test]
    fn concurrent_records_never_leave_a_floor_below_what_was_recorded() {
        let sketch = std::sync::Arc::new(MaxSketch::with_bytes(0, 1));
        let now = 1_000_000;
        let threads: Vec<_> = (0..4u64)
            .map(|thread| {
                let sketch = sketch.clone();
                std::thread::spawn(move || {
                    for n in 0..5_000u64 {
                        let name = format!("k:{}", n % 500);
                        let version = v(thread * 10_000 + n + 1);
                        sketch.record(&name, version, now + 60_000, now);
                        let floor = sketch.floor(&name, now).expect("just recorded");
                        assert!(floor.version >= version, "{name}: {floor:?}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}
